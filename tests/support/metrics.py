"""Reading the relay's (or an inbox's) metrics the way a scraper does: through the registry's
public API."""

from __future__ import annotations

from relay.metrics import InboxMetrics, Metrics


def sample_value(metrics: Metrics | InboxMetrics, name: str, **labels: str) -> float:
    """The value of one sample; a sample that is not exported fails the test."""
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels or ''} is not exported"
    return value
