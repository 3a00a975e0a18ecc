"""Tandem's agent core: one hub, one reply loop, one store, identical for every platform."""

__version__ = "0.1.0"
