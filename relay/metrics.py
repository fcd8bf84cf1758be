"""Prometheus metrics (base units: seconds, totals) and the /metrics /healthz /readyz server.

Each ``Metrics`` owns its registry, so several relays in one process (tests) do not share
counters and nothing lives in module globals.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from relay.broker.destinations import display
from relay.constants import BACKLOG_EXACT_ROWS
from relay.records import BrokerNode, Outcome, Settlement

log = logging.getLogger(__name__)

# Persistent messages are confirmed after the broker's batched fsync: typically a few to a
# few hundred milliseconds, seconds when the broker struggles.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.published = Counter(
            "relay_published_total", "Messages published to the broker.", registry=r
        )
        self.republished = Counter(
            "relay_republished_total",
            "Publishes of rows whose earlier publish had failed or gone unconfirmed.",
            registry=r,
        )
        self.outcomes = Counter(
            "relay_outcomes_total",
            "Published rows by what became of them: acked, nacked, returned, timed_out, "
            "failed (channel closed because of the row), lost (connection lost or shutdown "
            "before the confirm), rejected (malformed row), duplicate (its message id was "
            "in the sent log: sent before, written again; dropped, never published).",
            ["outcome"],
            registry=r,
        )
        for outcome in Outcome:
            self.outcomes.labels(outcome.value)
        self.parked = Counter(
            "relay_parked_total", "Rows parked after their last allowed attempt.", registry=r
        )
        self.in_flight = Gauge(
            "relay_in_flight", "Published messages awaiting a confirm.", registry=r
        )
        self.fenced = Gauge(
            "relay_fenced",
            "1 while this relay takes no bucket because relays of another protocol (an older "
            "or a newer release) stand in the way; 0 otherwise.",
            registry=r,
        )
        self.held_bytes = Gauge(
            "relay_held_bytes",
            "Payload bytes of the rows this relay holds: claimed, published and awaiting a "
            "confirm, or awaiting their settle. Claims pause at relay_held_bytes_limit.",
            registry=r,
        )
        self.held_bytes_limit = Gauge(
            "relay_held_bytes_limit",
            "The byte budget (RELAY_MAX_INFLIGHT_BYTES); a row larger than it goes out alone.",
            registry=r,
        )
        self.due_rows = Gauge(
            "relay_due_rows",
            "Pending rows whose next attempt time has come, those in flight among them: exact "
            f"up to {BACKLOG_EXACT_ROWS}; "
            f"beyond, the planner's estimate (at least {BACKLOG_EXACT_ROWS + 1}), "
            f"{BACKLOG_EXACT_ROWS + 1} on SQLite.",
            registry=r,
        )
        self.oldest_due_age = Gauge(
            "relay_oldest_due_age_seconds",
            "How long the longest-waiting due row (in flight or not) has been due.",
            registry=r,
        )
        self.sent_log_complete = Gauge(
            "relay_sent_log_complete",
            "1 while the sent log is whole, as a look made since this relay's last failed "
            "database call found it; 0 otherwise: rebuilt from its journal after a crash or "
            "a failover emptied it (PostgreSQL), not looked at since a call failed, or not "
            "yet. Meanwhile this relay claims no row.",
            registry=r,
        )
        self.sent_log_recovering = Gauge(
            "relay_sent_log_recovering",
            "1 while the sent log holds the journal's latest entries only (after a crash or "
            "a failover) and claims look the rest up in its runs, while the whole journal is "
            "copied back; 0 otherwise.",
            registry=r,
        )
        self.sent_log_unsealed = Gauge(
            "relay_sent_log_unsealed_seconds",
            "How far back the sent log's journal is not sealed into runs (PostgreSQL): what a "
            "crash would have to copy back before claims go on; about 5 to 8 minutes while "
            "the runs' upkeep works. 0 elsewhere.",
            registry=r,
        )
        self.ready = Gauge(
            "relay_ready",
            "1 while /readyz answers 200 (the relay can work); 0 while it gives a reason why not.",
            registry=r,
        )
        self.broker_connected = Gauge(
            "relay_broker_connected", "1 while a confirm channel is open.", registry=r
        )
        self.broker_connections = Counter(
            "relay_broker_connections_total",
            "Broker connections opened (the first connect and every reconnect).",
            registry=r,
        )
        self.broker_node = Gauge(
            "relay_broker_node_info",
            "1 for the broker node the confirm channel is open on, labelled with its address "
            "and what it announced (product, version, cluster); no series while disconnected.",
            ["address", "product", "version", "cluster"],
            registry=r,
        )
        self.destination_broken = Gauge(
            "relay_destination_broken",
            "1 for each exchange the broker refuses (404 or 403 on a publish): its rows are "
            "charged their attempts without being published until a probe finds it again. "
            "The series goes when it is back.",
            ["exchange"],
            registry=r,
        )
        self.destination_held = Gauge(
            "relay_destination_held_rows",
            "Rows of a broken exchange charged an attempt without being published, since it "
            "broke. The series goes when it is back.",
            ["exchange"],
            registry=r,
        )
        self.database_connected = Gauge(
            "relay_database_connected",
            "1 while the database calls work: 0 while one kind (claims, settles, turns) fails.",
            registry=r,
        )
        self.store_errors = Counter(
            "relay_database_errors_total",
            "Database calls that failed (and were retried).",
            registry=r,
        )
        self.confirm_latency = BatchHistogram(
            "relay_confirm_latency_seconds",
            "Seconds from publish to basic.ack.",
            LATENCY_BUCKETS,
            registry=r,
        )

    def broker_state(self, node: BrokerNode | None) -> None:
        """Connected to ``node``, or (None) disconnected."""
        self.broker_connected.set(0 if node is None else 1)
        self.broker_node.clear()
        if node is not None:
            self.broker_connections.inc()
            labels = (node.address, node.product, node.version, node.cluster_name)
            self.broker_node.labels(*labels).set(1)

    def destination(self, exchange: str, held: int | None) -> None:
        """``exchange`` is broken, with ``held`` rows held so far, or (None) back."""
        name = display(exchange)
        if held is None:
            self.destination_broken.remove(name)
            self.destination_held.remove(name)
            return
        self.destination_broken.labels(name).set(1)
        self.destination_held.labels(name).set(held)

    def settled(self, settlements: Sequence[Settlement], parked: int) -> None:
        self.confirm_latency.observe_all([s.latency for s in settlements if s.latency is not None])
        # Counted per outcome first: a label lookup per row cost 1.4% of the relay's CPU.
        for outcome, count in collections.Counter(s.outcome for s in settlements).items():
            self.outcomes.labels(outcome.value).inc(count)
        self.parked.inc(parked)


class BatchHistogram(Collector):
    """A histogram observed a batch at a time (a settle's confirm latencies): prometheus_client's
    ``Histogram.observe`` takes a lock and walks the buckets for each value, 0.7 us a row
    published; here a batch takes the lock once and each value is one bisection. Exposed as
    ``Histogram`` exposes it (``_bucket``, ``_count``, ``_sum``), without ``_created``."""

    def __init__(
        self, name: str, documentation: str, bounds: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = sorted(bounds)
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe_all(self, values: Sequence[float]) -> None:
        bounds, counts = self._bounds, self._counts
        with self._lock:
            for value in values:
                counts[bisect.bisect_left(bounds, value)] += 1  # le: value <= bound
                self._sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative = list(itertools.accumulate(counts))
        bounds = [*map(floatToGoString, self._bounds), "+Inf"]
        yield HistogramMetricFamily(
            self._name,
            self._documentation,
            buckets=list(zip(bounds, cumulative, strict=True)),
            sum_value=total,
        )


# A handler's transaction: milliseconds for a row or two, seconds when it calls out.
HANDLER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
INBOX_FAILURES = ("retried", "dead_lettered")


class InboxMetrics:
    """An inbox consumer's metrics (``relay.inbox``), labelled with the consumer's name."""

    def __init__(self, consumer: str, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.processed = Counter(
            "inbox_processed_total",
            "Deliveries whose handler ran and committed.",
            ["consumer"],
            registry=r,
        ).labels(consumer)
        self.duplicates = Counter(
            "inbox_duplicates_total",
            "Deliveries of a message processed before (its id in the inbox): acked, not handled.",
            ["consumer"],
            registry=r,
        ).labels(consumer)
        failures = Counter(
            "inbox_failures_total",
            "Deliveries whose handler (or its commit) failed, by what became of them: retried "
            "(requeued), dead_lettered (rejected after the last attempt, or without an id).",
            ["consumer", "outcome"],
            registry=r,
        )
        self.retried, self.dead_lettered = (failures.labels(consumer, o) for o in INBOX_FAILURES)
        self.handler_seconds = Histogram(
            "inbox_handler_seconds",
            "Seconds from a delivery's key insert to its commit, for those that committed.",
            ["consumer"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        ).labels(consumer)
        self.database_errors = Counter(
            "inbox_database_errors_total",
            "Deliveries not handled because the inbox's own statements failed (requeued or held).",
            ["consumer"],
            registry=r,
        ).labels(consumer)
        self.internal_errors = Counter(
            "inbox_internal_errors_total",
            "Deliveries the inbox itself failed on (a fault of its own, or of its drivers): "
            "counted as failed attempts, or requeued uncounted where they could not be.",
            ["consumer"],
            registry=r,
        ).labels(consumer)
        self.copies_refused = Counter(
            "inbox_copies_refused_total",
            "Copies of deliveries (a retry's, a dead letter's) the broker refused (nacked or "
            "returned): each delivery went back to its queue, uncounted.",
            ["consumer"],
            registry=r,
        ).labels(consumer)


class ConsoleMetrics:
    """The operator console's (``relay console``): its requests and the changes made through
    it, in a registry of its own (or a host application's)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "console_requests_total",
            "Requests the console answered, by route, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "console_request_seconds",
            "Seconds the console took to answer a request, by route.",
            ["route"],
            registry=r,
        )
        self.actions = Counter(
            "console_actions_total",
            "Changes made through the console (replay, discard, restore, edit_and_replay, "
            "requeue_dead_letters), by result: done, refused (a role, a CSRF token) or failed.",
            ["action", "result"],
            registry=r,
        )
        self.rows_changed = Counter(
            "console_rows_changed_total",
            "Rows (or dead letters) the console's changes changed, by action.",
            ["action"],
            registry=r,
        )
        self.login_failures = Counter(
            "console_login_failures_total",
            "Failed or refused logins, by why: password, limited (too many failures), "
            "provider (the identity provider's answer refused), no_role, proxy (identity "
            "headers from an address that is not the proxy's).",
            ["reason"],
            registry=r,
        )


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would drown the relay's own log."""


class HealthServer:
    """Serves /metrics, /healthz (the loop is alive) and /readyz (the relay can work: 503
    with the reason why not, which ``unready`` gives)."""

    def __init__(
        self,
        metrics: Metrics,
        host: str,
        port: int,
        alive: Callable[[], bool],
        unready: Callable[[], str | None],
    ) -> None:
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._alive = alive
        self._unready = unready
        self._server = make_server(
            host, port, self._app, server_class=_ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self.port = self._server.server_port
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="relay-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/healthz", "/readyz"):
            why = (
                (None if self._alive() else "not alive") if path == "/healthz" else self._unready()
            )
            status = "200 OK" if why is None else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n" if why is None else f"unavailable: {why}\n".encode()]
        if path == "/metrics":
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]
