"""The publisher: pika's asynchronous API on a confirm-mode channel.

Why asyncio: pika's ``AsyncioConnection`` runs on the relay's event loop, so confirms,
returns, heartbeats and the confirm tracker all live on one thread and need no locks; the
database work runs in worker threads (see ``relay.db.claims``) and never stalls this I/O loop.

Every publish is ``mandatory`` (an unroutable message comes back as ``basic.return``) and
persistent (``delivery_mode=2``), carries the row's stable ``message_id`` for consumer-side
de-duplication, and is streamed: the caller keeps up to ``window`` confirms outstanding.
pika's exceptions never leave the broker package; they become ``BrokerError`` or row
outcomes.
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
from relay.broker.blame import CLOSED_BY_BROKER, blame
from relay.broker.confirms import RELEASED, ConfirmWindow
from relay.broker.connection import (
    Connector,
    GatheringConnection,
    announced,
    drop_if_open,
    resolve,
    root_cause,
)
from relay.broker.destinations import Admission, Destinations, display
from relay.broker.quarantine import Quarantine
from relay.broker.topology import Topology, declare
from relay.constants import DESTINATION_PROBE_INITIAL_S, DESTINATION_PROBE_MAX_S, HALF_OPEN_CLOSE_S
from relay.errors import BrokerError
from relay.lease import LEASE_SHORT, Lease
from relay.message import Limits, Unpublishable, build
from relay.records import BrokerNode, OutboxRow, Outcome, Settlement
from relay.settings import TlsOptions
from relay.tracing import NoTracing, Tracing

log = logging.getLogger(__name__)

_HELD_SUSPECT = f"not published again yet: a suspect since a {CLOSED_BY_BROKER}"


class _EncodedProperties(pika.BasicProperties):  # type: ignore[misc]
    """Basic properties already encoded by ``relay.message`` (pika 1.3 cannot encode a double
    in a header table). pika asks a content header's properties only for ``encode()``."""

    def __init__(self, encoded: bytes) -> None:
        super().__init__()
        self._encoded = encoded

    def encode(self) -> list[bytes]:
        return [self._encoded]


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
    ) -> None:
        super().__init__(window, confirm_timeout)
        self._lease = lease
        self._tracing = tracing or NoTracing()
        self._connector = Connector(urls, name, tls, confirm_timeout, reconnect)
        self._topology = topology
        self._on_state = on_state
        self._on_destination = on_destination
        self._connection: GatheringConnection | None = None
        self._channel: Any = None
        self._channel_open = False  # the confirm channel; reopened after a channel error
        self.connected = False
        self.blocked = False
        self._limits = Limits()
        self._quarantine = Quarantine()
        probe = Backoff(DESTINATION_PROBE_INITIAL_S, DESTINATION_PROBE_MAX_S)
        self._destinations = Destinations(probe.delay)
        self._trials: dict[str, OutboxRow] = {}  # exchange -> its trial row, out alone
        self._tasks: set[asyncio.Task[None]] = set()  # channel reopens and probes
        self._setup_failure = ""  # why the broker closed the channel while we connected
        self._closing = False
        self._session_closed: asyncio.Future[str] | None = None
        self._session_opened: asyncio.Future[None] | None = None
        self._wake: Callable[[], None] = lambda: None  # the loop's, while ``run`` runs

    @property
    def _where(self) -> str:
        return self._connector.where

    @property
    def can_publish(self) -> bool:
        return self.connected and self._channel_open and not self.blocked

    @property
    def in_flight(self) -> int:
        return self.tracker.in_flight + len(self._trials)

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
        for row in rows:
            if not (self.connected and self._channel_open):
                self._lose(row, "no channel to publish on")
                continue
            admission = self._destinations.admit(row.exchange, now)
            if admission is Admission.HOLD:
                self.tracker.fail(row, self._destinations.held_reason(row.exchange))
                held.add(row.exchange)
            elif admission is Admission.TRIAL:
                self._trials[row.exchange] = row
                self._spawn(self._trial(row))
                self._sent.append(row)
            elif self._quarantine.admit(row) and self._send(self._channel, row):
                self.sent(row, now)
        if held:
            broken = self._destinations.broken()
            for exchange in held:
                self._on_destination(exchange, broken[exchange][1])
        self._release_suspect()
        if self.tracker.answered:  # rows settled at once (rejected, held, lost)
            self._wake()

    def _send(self, channel: Any, row: OutboxRow) -> bool:
        """Publish one row on ``channel``; any failure becomes its outcome. True when it went
        out (the caller records it). Nothing goes out once the relay's lease runs short
        (``relay.lease``): not a row held back since it was claimed (a suspect, a trial)."""
        if not self._lease.holds():
            self.tracker.lose([row], LEASE_SHORT)  # a suspect stays one (``relay.settle``)
            return False
        try:
            trace = self._tracing.start(
                row, (self._connector.params.host, self._connector.params.port)
            )
            message = build(row, self._limits, trace)
            channel.basic_publish(
                message.exchange,
                message.routing_key,
                # pika slices the body into frames: slices of a view copy nothing.
                memoryview(message.body),
                _EncodedProperties(message.properties),
                mandatory=True,
            )
        except Unpublishable as exc:
            self.tracker.reject(row, str(exc))
            return False
        except (pika.exceptions.ChannelWrongStateError, pika.exceptions.ConnectionWrongStateError):
            self._lose(row, "the channel closed as the row was published")
            return False
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
            self.tracker.fail(row, f"publish failed: {exc!r}")
            return False
        return True

    def _lose(self, row: OutboxRow, reason: str) -> None:
        """Due again at once; a suspect stays one (a LOST outcome keeps the mark, see
        ``relay.settle``), and its reason says why it waits."""
        self.tracker.lose([row], _HELD_SUSPECT if row.suspect else reason)

    def _release_suspect(self) -> None:
        """Publish the next suspect if nothing else is in flight."""
        while self.can_publish and (row := self._quarantine.next_alone(self.tracker.in_flight)):
            if self._send(self._channel, row):
                self.sent(row, time.monotonic())
                return
            self._quarantine.answered()  # not sent: its outcome is recorded

    async def run(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        watch = asyncio.create_task(self._watch_forever())
        try:
            await self._connector.run(self._connect_node, lambda: self._closing)
        finally:
            watch.cancel()
            for task in list(self._tasks):
                task.cancel()

    async def close(self) -> None:
        """Close the connection; outstanding rows are LOST (due again at once)."""
        self._closing = True
        if self._session_opened is not None:
            # pika cannot abort a connection that is still opening: its workflow then fails
            # an assertion in a callback (pika#970). Let the opening end first; pika bounds
            # it with its own socket and handshake timeouts.
            await asyncio.wait({self._session_opened})
        connection = self._connection
        if connection is not None and not (connection.is_closed or connection.is_closing):
            connection.close()
        if self._session_closed is not None:
            await asyncio.shield(self._session_closed)

    async def _connect_node(self, params: pika.URLParameters) -> asyncio.Future[str]:
        """Open a connection and a confirm channel to the node ``params`` names and declare
        the topology; the future says why the session ended, once it has."""
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        closed: asyncio.Future[str] = loop.create_future()
        self._session_closed = closed
        self._session_opened = opened
        self._setup_failure = ""

        def on_open(_conn: Any) -> None:
            resolve(opened, None)

        def on_open_error(_conn: Any, exc: BaseException) -> None:
            if not opened.done():
                why = root_cause(exc)
                opened.set_exception(BrokerError(f"cannot connect to {self._where}: {why}"))
            resolve(closed, repr(exc))

        def on_close(_conn: Any, exc: BaseException) -> None:
            self._session_lost(f"connection closed: {exc!r}")
            resolve(closed, repr(exc))

        self._connection = GatheringConnection(
            params, on_open, on_open_error, on_close, custom_ioloop=loop
        )
        self._connection.add_on_connection_blocked_callback(self._on_blocked)
        self._connection.add_on_connection_unblocked_callback(self._on_unblocked)
        await opened
        try:
            await self._open_channel()
            await declare(self._topology, self._channel, self._rpc)
        except BrokerError:
            self._connection.close()
            await closed
            raise
        self.blocked = False
        self.connected = True
        node = announced(self._where, self._connection)
        self._limits = dataclasses.replace(self._limits, frame_max=node.frame_max)
        self._on_state(node)
        log.info(
            "connected to broker node %s: %s %s, cluster %r, frame_max %d",
            node.address,
            node.product,
            node.version,
            node.cluster_name,
            node.frame_max,
            extra={
                "action": "broker_connected",
                "broker": node.address,
                "broker_version": node.version,
                "broker_cluster": node.cluster_name,
            },
        )
        self._wake()
        return closed

    async def _open_channel(self) -> None:
        """Open the confirm channel on the connection."""
        assert self._connection is not None
        self._channel = await self._rpc(self._connection.channel, "on_open_callback")
        self._channel.add_on_close_callback(self._on_channel_closed)
        self._channel.add_on_return_callback(self._on_return)
        await self._rpc(self._channel.confirm_delivery, "callback", self._on_confirm)
        self._channel_open = True

    async def _reopen_channel(self) -> None:
        try:
            await self._open_channel()
        except BrokerError as exc:
            connection = self._connection
            if connection is not None and connection.is_open:
                log.warning(
                    "cannot open a channel: %s; reconnecting",
                    exc,
                    extra={"action": "channel_failed", "broker": self._where},
                )
                connection.close()
            return
        self._wake()

    async def _rpc(
        self, method: Callable[..., Any], callback_name: str, *args: Any, **kwargs: Any
    ) -> Any:
        """Call a pika method that answers through a callback; fail if the session closes."""
        assert self._session_closed is not None
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        kwargs[callback_name] = lambda result: resolve(done, result)
        try:
            method(*args, **kwargs)
        except pika.exceptions.AMQPError as exc:
            raise BrokerError(f"{getattr(method, '__name__', method)} failed: {exc!r}") from exc
        await asyncio.wait({done, self._session_closed}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            why = self._setup_failure or self._session_closed.result()
            raise BrokerError(f"broker closed the session during setup: {why}")
        return done.result()

    def _on_confirm(self, frame: Any) -> None:
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
        self._wake()

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        self.tracker.on_return(properties.message_id, _returned(method))

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        if channel is not self._channel:
            return  # an earlier channel's late news
        self._channel_open = False
        code = getattr(reason, "reply_code", 0)
        text = str(getattr(reason, "reply_text", reason))
        if not isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self._session_lost(f"channel closed: {code} {text}")  # with its connection
            return
        if not self.connected:
            # While connecting (declaring the topology): the connect fails with this reason.
            self._setup_failure = f"channel closed: {code} {text}"
            if self._connection is not None and self._connection.is_open:
                self._connection.close()
            return
        # A channel error: something we sent broke one of the broker's rules.
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
                extra={"action": "channel_closed", "broker": self._where, "reply_code": code},
            )
        self._spawn(self._reopen_channel())
        self._wake()

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

    async def _side_channel(self, closed: asyncio.Future[Any]) -> Any:
        """A channel of its own on the connection, for a probe: whatever it does cannot
        close the confirm channel. Its close (the reason) resolves ``closed``."""
        assert self._connection is not None
        channel = await self._rpc(self._connection.channel, "on_open_callback")
        channel.add_on_close_callback(lambda _ch, why: resolve(closed, why))
        return channel

    async def _declare_passively(self, exchange: str) -> None:
        """Probe a missing exchange: a passive declare on a channel of its own."""
        loop = asyncio.get_running_loop()
        declared: asyncio.Future[Any] = loop.create_future()
        closed: asyncio.Future[BaseException] = loop.create_future()
        channel: Any = None
        try:
            async with asyncio.timeout(self.tracker.confirm_timeout):
                channel = await self._side_channel(closed)
                channel.exchange_declare(
                    exchange, passive=True, callback=lambda f: resolve(declared, f)
                )
                await asyncio.wait({declared, closed}, return_when=asyncio.FIRST_COMPLETED)
        except (BrokerError, TimeoutError, pika.exceptions.AMQPError):
            if channel is not None and channel.is_open:
                channel.close()
            self._destinations.failed(exchange, None, time.monotonic())
            return
        if declared.done():
            channel.close()
            self._back(exchange, "a passive declare found it")
            return
        why = closed.result()
        if isinstance(why, pika.exceptions.ChannelClosedByBroker):
            reason = f"{why.reply_code} {why.reply_text}"
            self._destinations.failed(exchange, reason, time.monotonic())
        else:
            self._destinations.abandoned(exchange)

    async def _trial(self, row: OutboxRow) -> None:
        """Publish one row of a refused exchange alone, on a channel of its own: an answer
        means the exchange takes messages again, a close that it still does not."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()  # a confirm frame or a close
        returned: list[str] = []
        published_at: float | None = None
        channel: Any = None
        try:
            async with asyncio.timeout(self.tracker.confirm_timeout):
                channel = await self._side_channel(answer)
                channel.add_on_return_callback(
                    lambda _ch, method, _props, _body: returned.append(_returned(method))
                )
                await self._rpc(
                    channel.confirm_delivery, "callback", lambda frame: resolve(answer, frame)
                )
                if not self._send(channel, row):  # its outcome is recorded
                    self._trials.pop(row.exchange, None)
                    self._destinations.abandoned(row.exchange)
                    return
                published_at = time.monotonic()
                await asyncio.shield(answer)
        except (BrokerError, pika.exceptions.AMQPError) as exc:
            # The connection is going: lost with it (unless its end recorded that first).
            self._judge(row, Settlement(row, Outcome.LOST, f"no channel for a trial: {exc}"))
            self._destinations.abandoned(row.exchange)
            return
        except TimeoutError:
            if channel is not None and channel.is_open:
                channel.close()
            if published_at is None:  # the channel did not open in time
                self._judge(row, Settlement(row, Outcome.LOST, "no channel for a trial"))
                self._destinations.abandoned(row.exchange)
                return
            self._judge(row, Settlement(row, Outcome.TIMED_OUT, "no confirm for a trial"))
            self._destinations.failed(row.exchange, None, time.monotonic())
            return
        why = answer.result()
        if isinstance(why, pika.exceptions.ChannelClosedByBroker):
            verdict = blame(why.reply_code, why.reply_text, row)
            blamed = Settlement(row, Outcome.FAILED, verdict.culprit_reason, None, verdict.suspects)
            self._judge(row, blamed)
            reason = f"{why.reply_code} {why.reply_text}"
            self._destinations.failed(row.exchange, reason, time.monotonic())
            return
        if isinstance(why, BaseException):
            return  # closed with the connection: lost with it (_session_lost)
        channel.close()
        assert published_at is not None  # answered
        latency = time.monotonic() - published_at
        if isinstance(why.method, pika.spec.Basic.Nack):
            settled = Settlement(row, Outcome.NACKED, "basic.nack: the broker refused the message")
        elif returned:
            settled = Settlement(row, Outcome.RETURNED, returned[0])
        else:
            settled = Settlement(row, Outcome.ACKED, "", latency)
        self._judge(row, settled)
        self._back(row.exchange, "a row tried alone was accepted")

    def _judge(self, row: OutboxRow, settled: Settlement) -> None:
        """Record a trial's outcome, unless the session's end recorded it first."""
        if self._trials.get(row.exchange) is row:
            del self._trials[row.exchange]
            self.tracker.record(settled)
            self._wake()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _requeue_suspects(self) -> None:
        """Suspects that never went out: due again, and still suspects."""
        self.tracker.lose(self._quarantine.release(), _HELD_SUSPECT)

    def _session_lost(self, reason: str) -> None:
        if self.connected:
            self.connected = False
            self._on_state(None)
        self._channel_open = False
        self.tracker.channel_lost(reason)
        self._requeue_suspects()
        for exchange, row in self._trials.items():
            self.tracker.record(Settlement(row, Outcome.LOST, reason))
            self._destinations.abandoned(exchange)
        self._trials.clear()
        self._wake()

    def _on_blocked(self, _conn: Any, frame: Any) -> None:
        self.blocked = True
        log.warning(
            "broker blocked publishing: %s",
            getattr(frame.method, "reason", ""),
            extra={"action": "broker_blocked", "broker": self._where},
        )

    def _on_unblocked(self, _conn: Any, _frame: Any) -> None:
        self.blocked = False
        self.tracker.restart_clocks(time.monotonic())
        log.info("broker unblocked publishing", extra={"action": "broker_unblocked"})
        self._wake()

    async def _watch_forever(self) -> None:
        """Time out overdue confirms; declare missing exchanges whose probe is due."""
        period = min(1.0, self.tracker.confirm_timeout / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            if self.can_publish:
                for exchange in self._destinations.declares_due(now):
                    self._spawn(self._declare_passively(exchange))
            if not self.blocked and self.tracker.expire(now):
                self._wake()
                # An overdue confirm means a half-open link or a stuck broker, which the
                # heartbeat notices only later: publishing on would only stack up more
                # unconfirmable messages (each a duplicate later). Start afresh instead;
                # the reconnect waits until the broker answers again.
                connection = self._connection
                if connection is not None and connection.is_open:
                    where = {"action": "confirm_timeout", "broker": self._where}
                    log.warning("confirms overdue: reconnecting", extra=where)
                    connection.close()
                    # On a half-open link the broker's close-ok never comes either: drop
                    # the socket if the close has not completed by then.
                    asyncio.get_running_loop().call_later(
                        min(HALF_OPEN_CLOSE_S, self.tracker.confirm_timeout),
                        drop_if_open,
                        connection,
                    )


def _returned(method: Any) -> str:
    return (
        f"basic.return {method.reply_code} {method.reply_text} "
        f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
    )
