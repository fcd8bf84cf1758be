"""``relay run``'s composition root and its tasks: build the loop and its adapters from the
settings, serve /metrics, wake the loop on new rows, purge old rows, stop on a signal."""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import signal
import sys
import threading
from dataclasses import dataclass

from relay.backoff import Backoff
from relay.broker.connection import connection_parameters
from relay.broker.publisher import PikaPublisher
from relay.broker.topology import Topology, load_topology
from relay.constants import (
    CAUSE_SORT_CHUNK,
    CAUSE_SORT_CHUNKS,
    CAUSE_SORT_INTERVAL_S,
    PURGE_CHUNK,
    SWITCH_INTERVAL_S,
    TURN_INTERVAL_MAX_S,
    TURNS_PER_LEASE,
)
from relay.db.causes import CauseSorter
from relay.db.claims import ClaimStore
from relay.db.outbox import OutboxAdmin
from relay.db.probe import NewRowsProbe
from relay.errors import ConfigError, RelayError, StoreError
from relay.lease import Lease, margin_for
from relay.memory import return_big_buffers
from relay.metrics import HealthServer, Metrics
from relay.records import KEEP_IDS
from relay.relay import Relay
from relay.retrying import in_thread
from relay.sentlog import SentLogWatch
from relay.sentlog_tasks import keep_sent_runs, whole_sent_log
from relay.settings import Settings, TracingSettings
from relay.settle import SettlePolicy
from relay.tracing import NoTracing, Tracing
from relay.wakeup import Wakeup

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Assembled:
    relay: Relay
    store: ClaimStore
    metrics: Metrics
    sent_log: SentLogWatch
    sent_log_wanted: Wakeup  # a database call failed: look at the sent log at once


def assemble(settings: Settings, topology: Topology, tracing: Tracing) -> Assembled:
    """Build the relay and its adapters from settings (inside a running event loop)."""
    metrics = Metrics()
    metrics.held_bytes_limit.set(settings.max_inflight_bytes)
    backoff = Backoff(settings.backoff_initial, settings.backoff_max)
    reconnect = Backoff(
        min(settings.backoff_initial, settings.reconnect_max), settings.reconnect_max
    )
    # No row is published once its bucket's lease has less left than a publish may take
    # (``relay.lease``); nor is one claimed from such a bucket.
    lease = Lease(margin_for(settings.confirm_timeout))
    # A relay that cannot claim for longer than a lease is not ready (``relay.sentlog``).
    sent_log = SentLogWatch(settings.lease, lease.clock())
    sent_log_wanted = Wakeup()

    def database_failed() -> None:
        sent_log.failed(lease.clock())
        sent_log_wanted.set()

    store = ClaimStore(
        settings.database_url,
        settings.name,
        settings.lease,
        margin=lease.margin,
        max_message_size=settings.max_message_size,
        ordered=settings.ordering,
        keep_sent=settings.keep_sent,
    )
    publisher = PikaPublisher(
        settings.amqp_urls,
        topology,
        window=settings.window,
        confirm_timeout=settings.confirm_timeout,
        reconnect=reconnect,
        lease=lease,
        name=settings.name,
        on_state=metrics.broker_state,
        on_destination=metrics.destination,
        tls=settings.amqp_tls,
        tracing=tracing,
        cloudevents_source=settings.cloudevents_source if settings.cloudevents else None,
    )
    relay = Relay(
        store,
        publisher,
        SettlePolicy(settings.max_attempts, backoff),
        metrics,
        lease,
        batch_size=settings.batch_size,
        max_inflight_bytes=settings.max_inflight_bytes,
        poll_interval=settings.poll_interval,
        drain_timeout=settings.drain_timeout,
        linger=settings.linger,
        ordering=settings.ordering,
        turn_interval=turn_interval(settings.lease, lease.margin),
        retry=reconnect,
        tracing=tracing,
        database_failed=database_failed,
    )
    metrics.sent_log_complete.set_function(lambda: 1 if sent_log.complete else 0)
    metrics.sent_log_recovering.set_function(lambda: 1 if sent_log.recovering else 0)
    return Assembled(relay, store, metrics, sent_log, sent_log_wanted)


def turn_interval(lease: float, margin: float) -> float:
    """Seconds between a relay's turns: ``TURNS_PER_LEASE`` times within the part of a lease
    it may publish in (the lease less the margin), and at least every
    ``TURN_INTERVAL_MAX_S``."""
    return min((lease - margin) / TURNS_PER_LEASE, TURN_INTERVAL_MAX_S)


def run(settings: Settings, tracing_settings: TracingSettings | None = None) -> bool:
    """Serve until SIGTERM or SIGINT, then drain; True when every outcome was recorded."""
    topology = load_topology(settings.topology_file)
    # Fail fast on a bad URL or unusable TLS files.
    for url in settings.amqp_urls:
        connection_parameters(url, settings.name, settings.amqp_tls)
    tracing_settings = tracing_settings or TracingSettings()
    tracing = start_tracing(tracing_settings)
    log.info(
        "starting",
        extra={
            "action": "start",
            "settings": settings.redacted(),
            "tracing": tracing_settings.exporter,
        },
    )
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return_big_buffers()
    try:
        return asyncio.run(serve(settings, topology, tracing))
    finally:
        tracing.shutdown()  # exports the spans still buffered


def start_tracing(settings: TracingSettings) -> Tracing:
    """OpenTelemetry tracing when an exporter is configured, else nothing at all."""
    if not settings.enabled:
        return NoTracing()
    try:
        # Imported here, not at the top: OpenTelemetry is an optional extra.
        tracing: Tracing = importlib.import_module("relay.otel").start(settings)
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={settings.exporter} (protocol {settings.protocol}) needs "
            f"the tracing extra: pip install 'outbox-relay[tracing]' ({exc})"
        ) from None
    return tracing


async def serve(settings: Settings, topology: Topology, tracing: Tracing) -> bool:
    parts = assemble(settings, topology, tracing)
    relay, store, metrics = parts.relay, parts.store, parts.metrics
    clock = relay.lease.clock

    def unready() -> str | None:
        return relay.unready() or parts.sent_log.unready(clock())

    metrics.ready.set_function(lambda: 0 if unready() else 1)
    server = None
    if settings.metrics_port:
        try:
            server = HealthServer(
                metrics, settings.metrics_host, settings.metrics_port, relay.alive, unready
            )
        except OSError as exc:
            raise ConfigError(
                f"RELAY_METRICS_PORT={settings.metrics_port}: cannot listen on "
                f"{settings.metrics_host}: {exc.strerror}"
            ) from None
        server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, functools.partial(_stop, relay, sig))
    helpers = [
        asyncio.create_task(
            _backlog_gauges(store, metrics, settings.stats_interval), name="backlog gauges"
        ),
        asyncio.create_task(
            whole_sent_log(
                settings.database_url,
                parts.sent_log,
                clock,
                parts.sent_log_wanted,
                relay.store.reached,
            ),
            name="sent log",
        ),
    ]
    if settings.retention:
        helpers.append(asyncio.create_task(_retention(settings), name="retention"))
    helpers.append(asyncio.create_task(_sort_causes(settings), name="causes"))
    if settings.keep_sent == KEEP_IDS:
        helpers.append(
            asyncio.create_task(
                keep_sent_runs(settings.database_url, metrics.sent_log_unsealed.set),
                name="sent log runs",
            )
        )
    if settings.probe_interval:
        helpers.append(asyncio.create_task(_wake_on_new_rows(relay, settings), name="probe"))
    ended: list[asyncio.Task[None]] = []

    def helper_ended(task: asyncio.Task[None]) -> None:
        # Each runs for as long as the relay, its errors retried: one that ended is a fault
        # no retry can mend (without the sent log's, claims could wait for ever, the relay
        # alive and ready); the relay drains and fails with it, for its supervisor to
        # restart it.
        if task.cancelled():
            return
        ended.append(task)
        log.error(
            "the relay's %s task ended: stopping",
            task.get_name(),
            extra={"action": "task_failed", "task": task.get_name()},
        )
        relay.stop()

    for task in helpers:
        task.add_done_callback(helper_ended)
    try:
        drained = await relay.run()
        for task in ended:
            task.result()  # its own error, if it raised one
            raise RelayError(f"the relay's {task.get_name()} task ended")
        return drained
    finally:
        for task in helpers:
            task.remove_done_callback(helper_ended)
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if server is not None:
            server.stop()
        store.close()


def _stop(relay: Relay, sig: signal.Signals) -> None:
    log.info("%s received: stopping", sig.name, extra={"action": "stop"})
    relay.stop()


async def _backlog_gauges(store: ClaimStore, metrics: Metrics, interval: float) -> None:
    """The backlog gauges, every ``interval``; also the first to tell, even while the broker
    is still down, that the database is unreachable or not migrated (once per failure, not
    every time)."""
    last_error = None
    while True:
        try:
            stats = await in_thread(store.backlog)
        except StoreError as exc:
            if str(exc) != last_error:
                log.warning("%s", exc, extra={"action": "backlog_stats_failed"})
            last_error = str(exc)
        else:
            last_error = None
            metrics.due_rows.set(stats.due)
            metrics.oldest_due_age.set(stats.oldest_due_age)
        await asyncio.sleep(interval)


async def _wake_on_new_rows(relay: Relay, settings: Settings) -> None:
    """Wake the relay when the outbox's newest id changes (``relay.db.probe``), so that a row
    is published when it commits rather than at the next poll; polling stays as the
    fallback, and covers the probe's outages. The probe looks only while the relay is idle
    (``Relay.idle``): while a stream flows, the relay's own claims look for it."""
    loop = asyncio.get_running_loop()
    probe = NewRowsProbe(settings.database_url)
    stopped = threading.Event()
    backoff = Backoff(min(1.0, settings.reconnect_max), settings.reconnect_max)
    failures = 0

    def changed(after: int | None, newest: int | None) -> None:  # in the probe's thread
        nonlocal failures
        failures = 0
        loop.call_soon_threadsafe(relay.new_rows, after, newest)

    watch = functools.partial(
        probe.watch, changed, settings.probe_interval, stopped, relay.idle, settings.linger
    )

    def stop() -> None:
        stopped.set()
        relay.idle.set()  # a probe paused while the relay streamed sees the stop

    try:
        while True:
            try:
                await in_thread(watch, stop)
            except RelayError as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "not probing for new rows (polling meanwhile): %s",
                        exc,
                        extra={"action": "probe_failed"},
                    )
                await asyncio.sleep(backoff.delay(failures))
    finally:
        probe.close()


async def _sort_causes(settings: Settings) -> None:
    """Give parked rows without a cause theirs (``relay.db.causes``), up to
    ``CAUSE_SORT_CHUNKS`` chunks every ``CAUSE_SORT_INTERVAL_S``; a failure is logged and
    tried again at the next interval (it never stops the relay)."""
    sorter = CauseSorter(settings.database_url)
    sort = functools.partial(sorter.sort, CAUSE_SORT_CHUNK)
    try:
        while True:
            sorted_rows = 0
            try:
                for _ in range(CAUSE_SORT_CHUNKS):
                    read = await in_thread(sort)
                    sorted_rows += read
                    if read < CAUSE_SORT_CHUNK:
                        break
            except RelayError as exc:
                log.warning(
                    "sorting parked rows by cause failed: %s",
                    exc,
                    extra={"action": "cause_sort_failed"},
                )
            if sorted_rows:
                log.info(
                    "sorted %d parked rows by cause", sorted_rows, extra={"action": "cause_sort"}
                )
            await asyncio.sleep(CAUSE_SORT_INTERVAL_S)
    finally:
        sorter.close()


async def _retention(settings: Settings) -> None:
    """Delete sent rows older than the retention period, every purge interval; a failed
    purge is logged and tried again at the next interval (it never stops the relay)."""
    purger = OutboxAdmin(settings.database_url, relay_session=True)
    stopped = threading.Event()
    try:
        while True:
            purge = functools.partial(purger.purge, settings.retention, PURGE_CHUNK, stop=stopped)
            try:
                deleted = await in_thread(purge, stopped.set)
            except RelayError as exc:
                log.warning("purge failed: %s", exc, extra={"action": "purge_failed"})
            else:
                log.info("purged %d sent rows", deleted, extra={"action": "purge"})
            await asyncio.sleep(settings.purge_interval)
    finally:
        purger.close()
