"""The publisher: the ``Publisher`` port (``relay.ports``) on RabbitMQ, through pika.

Every publish is ``mandatory`` (an unroutable message comes back as ``basic.return``) and
persistent (``delivery_mode=2``), carries the row's stable ``message_id`` for consumer-side
de-duplication, and is streamed: the caller keeps up to ``window`` confirms outstanding.

The jobs are split by module: the connection and its confirm channel are the session's
(``relay.broker.session``), what to do with each row handed over is decided once
(``relay.broker.admission``), every outcome is judged by a ``ConfirmTracker``
(``relay.broker.confirms``; a trial row's by one of its own), the probes of broken
destinations run on side channels (``relay.broker.probes``). This module sends the rows,
hears the broker through the session, and times out confirms. pika's exceptions never leave
the broker package; they become ``BrokerError`` or row outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions

from relay.backoff import Backoff
from relay.broker.admission import Decision, admit
from relay.broker.blame import CLOSED_BY_BROKER
from relay.broker.confirms import RELEASED, ConfirmTracker, ConfirmWindow
from relay.broker.connection import Connector
from relay.broker.destinations import Destinations, display
from relay.broker.frames import PublishFrames
from relay.broker.probes import Probes
from relay.broker.quarantine import Quarantine
from relay.broker.session import Session
from relay.broker.topology import Topology
from relay.constants import DESTINATION_PROBE_INITIAL_S, DESTINATION_PROBE_MAX_S
from relay.lease import LEASE_LAPSED, LEASE_SHORT, Lease, Waiting, watch_period
from relay.message import Limits, Unpublishable, build
from relay.records import BrokerNode, OutboxRow
from relay.settings import TlsOptions
from relay.tracing import NoTracing, Tracing

log = logging.getLogger(__name__)

_HELD_SUSPECT = f"not published again yet: a suspect since a {CLOSED_BY_BROKER}"


class PikaPublisher(ConfirmWindow):
    """The ``Publisher`` the loop sees (see ``relay.ports``), on RabbitMQ through pika.

    States, one word each: ``connected`` (a connection is open and the topology declared),
    ``blocked`` (the broker paused publishing: a resource alarm), and ``can_publish``
    (connected, a confirm channel open, and not blocked).

    A channel error costs a channel, never the connection: the broker closes the channel when
    a message breaks one of its rules, every unconfirmed publish on it is lost with it, and a
    new confirm channel is opened on the same connection. ``relay.broker.blame`` says which rows
    were the culprits (charged an attempt) and whether the close shows an exchange broken
    (``relay.broker.destinations``: its rows are then held, not published, until a probe on a
    channel of its own finds it again). When the close names no row, the lost rows become
    suspects and each is next published alone, with nothing else in flight: good rows are
    taken down with a bad one once at most (one window), never again on its later attempts.
    """

    def __init__(
        self,
        urls: Sequence[str],
        topology: Topology,
        *,
        window: int,
        confirm_timeout: float,
        reconnect: Backoff,
        lease: Lease,
        name: str = "outbox-relay",
        on_state: Callable[[BrokerNode | None], None] = lambda _node: None,
        on_destination: Callable[[str, int | None], None] = lambda _exchange, _held: None,
        tls: TlsOptions | None = None,
        tracing: Tracing | None = None,
        cloudevents_source: str | None = None,
    ) -> None:
        super().__init__(window, confirm_timeout)
        self._cloudevents_source = cloudevents_source
        self._lease = lease
        self._tracing = tracing or NoTracing()
        self._on_state = on_state
        self._on_destination = on_destination
        connector = Connector(urls, name, tls, confirm_timeout, reconnect)
        self._session = Session(connector, topology, self)
        self._limits = Limits()
        self._frames = PublishFrames()
        self._quarantine = Quarantine()
        # Rows that wait to go out (suspects, trials): a lease that lapses meanwhile drops them.
        self._waiting = Waiting(lease)
        probe = Backoff(DESTINATION_PROBE_INITIAL_S, DESTINATION_PROBE_MAX_S)
        self._destinations = Destinations(probe.delay)
        self._probes = Probes(
            self._session,
            self._destinations,
            confirm_timeout=confirm_timeout,
            send=self._send,
            record=self.tracker.record,
            back=self._back,
        )
        # The loop's, while ``run`` runs: ``_wake`` for news, ``_answered`` for confirms.
        self._wake: Callable[[], None] = lambda: None
        self._answered: Callable[[], None] = lambda: None

    @property
    def connected(self) -> bool:
        return self._session.connected

    @property
    def blocked(self) -> bool:
        return self._session.blocked

    @property
    def can_publish(self) -> bool:
        return self._session.connected and self._session.channel_open and not self.blocked

    @property
    def in_flight(self) -> int:
        return self.tracker.in_flight + self._probes.in_flight

    def capacity(self) -> int:
        return 0 if self._quarantine.closed else super().capacity()

    def release(self, rows: Sequence[OutboxRow], reason: str = RELEASED) -> None:
        for row in rows:
            self._lose(row, reason)

    def broken_exchanges(self) -> frozenset[str]:
        return self._destinations.names()

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        held: set[str] = set()
        now = time.monotonic()
        channel_open = self._session.connected and self._session.channel_open
        sending = []
        for row in rows:
            admitted = admit(row, channel_open, self._destinations, now)
            if admitted.decision is Decision.SEND:
                sending.append(row)
            elif admitted.decision is Decision.ALONE:
                self._waiting.wait(row)
                self._quarantine.admit(row)
            elif admitted.decision is Decision.TRIAL:
                self._waiting.wait(row)
                self._probes.trial(row)
                self._sent.append(row)
            elif admitted.decision is Decision.HOLD:
                self.tracker.fail(row, admitted.reason)
                held.add(row.exchange)
            else:
                self._lose(row, admitted.reason)
        self._sent += self._send(self._session.channel, sending, self.tracker)
        if held:
            broken = self._destinations.broken()
            for exchange in held:
                self._on_destination(exchange, broken[exchange][1])
        self._release_suspect()
        if self.tracker.answered:  # rows settled at once (rejected, held, lost)
            self._wake()

    def _send(
        self, channel: Any, rows: Sequence[OutboxRow], tracker: ConfirmTracker
    ) -> list[OutboxRow]:
        """Publish ``rows`` on ``channel``, in order, recording each, or what became of it
        instead, in ``tracker``: the one place rows go on the wire. Returns those that went
        out. Nothing goes out once the relay's lease runs short (``relay.lease``): not even a
        row that waited here since it was handed over (a suspect, a trial).

        The rows' frames are encoded here (``relay.broker.frames``) and handed to pika in one
        call: nothing runs between them, so the channel that is open for the first is open
        for the last."""
        if not rows:
            return []
        if not self._lease.holds():
            tracker.lose(rows, LEASE_SHORT)  # a suspect stays one (``relay.settle``)
            return []
        rows, lapsed = self._waiting.lapsed(rows)
        if lapsed:
            tracker.lose(lapsed, LEASE_LAPSED)
        frames, going = [], []
        number, address = channel.channel_number, self._session.address
        for row in rows:
            try:
                trace = self._tracing.start(row, address)
                message = build(row, self._limits, trace, self._cloudevents_source)
                frame = self._frames.encode(
                    number, message, mandatory=True, frame_max=self._limits.frame_max
                )
            except Unpublishable as exc:
                tracker.reject(row, str(exc))
                continue
            except Exception as exc:  # whatever one row does, the others go on
                log.warning(
                    "row %d could not be published: %r",
                    row.id,
                    exc,
                    extra={
                        "action": "publish_failed",
                        "row_id": row.id,
                        **self._tracing.log_fields(row),
                    },
                )
                tracker.fail(row, f"publish failed: {exc!r}")
                continue
            frames.append(frame)
            going.append(row)
        if not self._session.send(channel, frames):
            closed = "the channel closed as the row was published"
            for row in going:
                tracker.lose([row], _lost_reason(row, closed))
            return []
        now = time.monotonic()
        for row in going:
            tracker.published(row, now)
        return going

    def _lose(self, row: OutboxRow, reason: str) -> None:
        """Due again at once; a suspect stays one (a LOST outcome keeps the mark, see
        ``relay.settle``), and its reason says why it waits."""
        self.tracker.lose([row], _lost_reason(row, reason))

    def _release_suspect(self) -> None:
        """Publish the next suspect if nothing else is in flight."""
        while self.can_publish and (row := self._quarantine.next_alone(self.tracker.in_flight)):
            if sent := self._send(self._session.channel, [row], self.tracker):
                self._sent += sent
                return
            self._quarantine.answered()  # not sent: its outcome is recorded

    async def run(
        self, wake: Callable[[], None], answered: Callable[[], None] | None = None
    ) -> None:
        self._wake = wake
        self._answered = answered or wake
        watch = asyncio.create_task(self._watch_forever())
        try:
            await self._session.run()
        finally:
            watch.cancel()
            self._probes.cancel()

    async def close(self) -> None:
        """Close the connection; outstanding rows are LOST (due again at once)."""
        await self._session.close()

    # --- What the session hears from the broker (``relay.broker.session.Events``) ---------

    def opened(self, node: BrokerNode) -> None:
        self._limits = dataclasses.replace(self._limits, frame_max=node.frame_max)
        self._on_state(node)
        self._wake()

    def lost(self, reason: str, was_connected: bool) -> None:
        self._waiting.forget_all()  # the suspects are requeued and the trials lost, below
        if was_connected:
            self._on_state(None)
        self.tracker.channel_lost(reason)
        self._requeue_suspects()
        self._probes.lost(reason)
        self._wake()

    def channel_error(self, code: int, text: str) -> None:
        verdict = self._quarantine.judge(code, text)
        if verdict.max_message_size is not None:
            # Remembered for this relay's life: an oversized row is then refused before it
            # is sent, and takes no channel (and no good rows) down with it.
            limit = verdict.max_message_size
            self._limits = dataclasses.replace(self._limits, max_message_size=limit)
        lost = self.tracker.in_flight
        self.tracker.channel_lost(
            verdict.innocent_reason, verdict.culprit, verdict.culprit_reason, verdict.suspects
        )
        self._requeue_suspects()
        if verdict.exchange is not None:
            self._broke(verdict.exchange, f"{code} {text}", declarable=code == 404)
        else:
            log.warning(
                "the broker closed the channel: %d %s; %d unconfirmed rows are due again%s; "
                "publishing on a new channel",
                code,
                text,
                lost,
                ", each published alone" if verdict.culprit is None else "",
                extra={
                    "action": "channel_closed",
                    "broker": self._session.where,
                    "reply_code": code,
                },
            )
        self._wake()

    def channel_reopened(self) -> None:
        self._wake()

    def confirmed(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            self.tracker.on_ack(method.delivery_tag, method.multiple, time.monotonic())
        else:
            self.tracker.on_nack(method.delivery_tag, method.multiple, time.monotonic())
        if not self.tracker.in_flight:
            self._quarantine.answered()  # innocent (or nacked, which counts an attempt)
            # The next suspect goes out now, not a loop turn later: while suspects are
            # tried one by one, nothing else flows, so every round trip saved counts.
            self._release_suspect()
        self._answered()

    def returned(self, message_id: str | None, reason: str) -> None:
        self.tracker.on_return(message_id, reason)

    def unblocked(self) -> None:
        self.tracker.restart_clocks(time.monotonic())
        self._wake()

    # --- Broken destinations -----------------------------------------------------------------

    def _broke(self, exchange: str, reason: str, *, declarable: bool) -> None:
        if not self._destinations.broke(exchange, reason, time.monotonic(), declarable=declarable):
            return
        self._on_destination(exchange, 0)
        log.warning(
            "exchange %r is broken: %s; its rows are charged their attempts without being "
            "published until %s",
            display(exchange),
            reason,
            "it is declared again" if declarable else "one of them, tried alone, is accepted",
            extra={"action": "destination_broken", "exchange": exchange, "reply_text": reason},
        )

    def _back(self, exchange: str, how: str) -> None:
        held = self._destinations.passed(exchange)
        if held is None:
            return
        self._recovered.append(exchange)
        self._on_destination(exchange, None)
        log.info(
            "exchange %r is back (%s); its rows are due now (%d were held meanwhile)",
            display(exchange),
            how,
            held,
            extra={"action": "destination_back", "exchange": exchange, "held_rows": held},
        )
        self._wake()

    def _requeue_suspects(self) -> None:
        """Suspects that never went out: due again, and still suspects."""
        released = self._quarantine.release()
        self._waiting.forget(released)
        self.tracker.lose(released, _HELD_SUSPECT)

    async def _watch_forever(self) -> None:
        """Time out overdue confirms; declare missing exchanges whose probe is due."""
        period = watch_period(self.tracker.confirm_timeout)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if self.can_publish:
                self._probes.declare_due(now)
            if not self.blocked and self.tracker.expire(now):
                self._wake()
                # An overdue confirm means a half-open link or a stuck broker, which the
                # heartbeat notices only later: publishing on would only stack up more
                # unconfirmable messages (each a duplicate later). Start afresh instead;
                # the reconnect waits until the broker answers again.
                if self._session.connected:
                    where = {"action": "confirm_timeout", "broker": self._session.where}
                    log.warning("confirms overdue: reconnecting", extra=where)
                self._session.restart(self.tracker.confirm_timeout)


def _lost_reason(row: OutboxRow, reason: str) -> str:
    """A LOST row's detail: a suspect's says why it waits (it stays one)."""
    return _HELD_SUSPECT if row.suspect else reason
