"""Reading the relay's metrics the way a scraper does: through the registry's public API."""

from __future__ import annotations

from relay.metrics import Metrics


def sample_value(metrics: Metrics, name: str, **labels: str) -> float | None:
    """The value of one sample (None when it is not exported)."""
    return metrics.registry.get_sample_value(name, labels)
