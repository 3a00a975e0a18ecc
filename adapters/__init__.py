"""Platform edges: each turns platform updates into `Inbound` values and renders `Event`s."""
