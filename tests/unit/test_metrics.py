"""Metrics: what the broker state looks like to a scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from relay.metrics import LATENCY_BUCKETS, BatchHistogram, Metrics
from relay.records import BrokerNode

NODE = BrokerNode("10.0.0.2:5672", "RabbitMQ", "4.0.5", "rabbit@n1", 131072)


def node_series(metrics: Metrics) -> list[tuple[dict[str, str], float]]:
    return [
        (sample.labels, sample.value)
        for family in metrics.registry.collect()
        if family.name == "relay_broker_node_info"
        for sample in family.samples
    ]


def test_the_connected_node_is_one_labelled_series_and_none_while_disconnected() -> None:
    metrics = Metrics()
    metrics.broker_state(NODE)
    labels = {"address": "10.0.0.2:5672", "product": "RabbitMQ", "version": "4.0.5"}
    assert node_series(metrics) == [({**labels, "cluster": "rabbit@n1"}, 1.0)]
    assert metrics.registry.get_sample_value("relay_broker_connected") == 1
    metrics.broker_state(None)
    assert node_series(metrics) == []
    assert metrics.registry.get_sample_value("relay_broker_connected") == 0
    metrics.broker_state(BrokerNode("10.0.0.3:5672", "RabbitMQ", "4.0.5", "rabbit@n1", 131072))
    assert [s[0]["address"] for s in node_series(metrics)] == ["10.0.0.3:5672"]
    assert metrics.registry.get_sample_value("relay_broker_connections_total") == 2


# Values on the bounds, between them, below the first and above the last, in batches.
LATENCIES = [[0.0, 0.005, 0.0051], [], [0.3, 1.0, 30.0, 31.0, 2.5], [0.01]]


def test_a_batch_histogram_is_exposed_as_prometheus_clients_histogram() -> None:
    theirs_registry = CollectorRegistry()
    theirs = Histogram("latency_seconds", "Doc.", buckets=LATENCY_BUCKETS, registry=theirs_registry)
    ours_registry = CollectorRegistry()
    ours = BatchHistogram("latency_seconds", "Doc.", LATENCY_BUCKETS, registry=ours_registry)
    for batch in LATENCIES:
        ours.observe_all(batch)
        for value in batch:
            theirs.observe(value)

    def exposed(registry: CollectorRegistry) -> list[str]:
        return [
            line
            for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line
        ]

    assert exposed(ours_registry) == exposed(theirs_registry)
    assert ours_registry.get_sample_value("latency_seconds_count") == 9
