"""Fixtures of the core's tests: two model endpoints that can fail, hang or refuse (the
main model and its fallback)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.failing_model import FailingModel


@pytest.fixture
async def primary() -> AsyncIterator[FailingModel]:
    async with FailingModel() as server:
        yield server
    assert server.violations == []


@pytest.fixture
async def backup() -> AsyncIterator[FailingModel]:
    async with FailingModel() as server:
        yield server
    assert server.violations == []
