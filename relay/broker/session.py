"""The broker session: one connection at a time to the broker's nodes, and its confirm channel.

It connects (through ``relay.broker.connection.Connector``: node after node, with back-off),
opens a confirm channel, declares the topology, opens a new confirm channel after a channel
error, follows the broker's blocked and unblocked notices, opens side channels for probes,
and drops a connection whose close never completes (a half-open link). What the broker says
about publishes (confirms, returns, channel errors) goes to the ``Events`` the session was
given: the publisher (``relay.broker.publisher``), which owns the rows.

Why asyncio: pika's ``AsyncioConnection`` runs on the relay's event loop, so confirms,
returns, heartbeats and the confirm tracker all live on one thread and need no locks; the
database work runs in worker threads and never stalls this I/O loop. pika's exceptions never
leave the broker package: they become ``BrokerError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import pika
import pika.exceptions

from relay.broker.connection import (
    Connector,
    GatheringConnection,
    announced,
    drop_if_open,
    resolve,
    root_cause,
)
from relay.broker.topology import Topology, declare
from relay.constants import HALF_OPEN_CLOSE_S
from relay.errors import BrokerError
from relay.records import BrokerNode

log = logging.getLogger(__name__)


class Events(Protocol):
    """What the session tells the publisher, on the event loop's thread."""

    def opened(self, node: BrokerNode) -> None:
        """Connected: a confirm channel is open and the topology declared."""

    def lost(self, reason: str, was_connected: bool) -> None:
        """The confirm channel is gone, with its connection; ``was_connected``: the session
        had opened (``opened`` was told), not failed while connecting."""

    def channel_error(self, code: int, text: str) -> None:
        """The broker closed the confirm channel (a new one is being opened)."""

    def channel_reopened(self) -> None: ...

    def confirmed(self, frame: Any) -> None:
        """A ``basic.ack`` or ``basic.nack`` on the confirm channel."""

    def returned(self, message_id: str | None, reason: str) -> None:
        """A ``basic.return`` on the confirm channel."""

    def unblocked(self) -> None: ...


class Session:
    def __init__(self, connector: Connector, topology: Topology, events: Events) -> None:
        self._connector = connector
        self._topology = topology
        self._events = events
        self._connection: GatheringConnection | None = None
        self.channel: Any = None  # the confirm channel
        self.channel_open = False  # reopened after a channel error
        self.connected = False
        self.blocked = False
        self._tasks: set[asyncio.Task[None]] = set()  # channel reopens
        self._setup_failure = ""  # why the broker closed the channel while we connected
        self._closing = False
        self._closed: asyncio.Future[str] | None = None
        self._opened: asyncio.Future[None] | None = None

    @property
    def where(self) -> str:
        return self._connector.where

    @property
    def address(self) -> tuple[str, int]:
        """The node in use (or the next to try): host and port."""
        params = self._connector.params
        return params.host, params.port

    async def run(self) -> None:
        """Open sessions, one after another, until ``close``."""
        try:
            await self._connector.run(self._connect_node, lambda: self._closing)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def close(self) -> None:
        self._closing = True
        if self._opened is not None:
            # pika cannot abort a connection that is still opening: its workflow then fails
            # an assertion in a callback (pika#970). Let the opening end first; pika bounds
            # it with its own socket and handshake timeouts.
            await asyncio.wait({self._opened})
        connection = self._connection
        if connection is not None and not (connection.is_closed or connection.is_closing):
            connection.close()
        if self._closed is not None:
            await asyncio.shield(self._closed)

    def restart(self, timeout: float) -> None:
        """Close the connection to start afresh (the next one is opened as usual); drop the
        socket if the broker's close-ok has not come within ``timeout`` (a half-open link
        never answers)."""
        connection = self._connection
        if connection is not None and connection.is_open:
            connection.close()
            loop = asyncio.get_running_loop()
            loop.call_later(min(HALF_OPEN_CLOSE_S, timeout), drop_if_open, connection)

    async def _connect_node(self, params: pika.URLParameters) -> asyncio.Future[str]:
        """Open a connection and a confirm channel to the node ``params`` names and declare
        the topology; the future says why the session ended, once it has."""
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()
        closed: asyncio.Future[str] = loop.create_future()
        self._closed, self._opened = closed, opened
        self._setup_failure = ""

        def on_open(_conn: Any) -> None:
            resolve(opened, None)

        def on_open_error(_conn: Any, exc: BaseException) -> None:
            if not opened.done():
                why = root_cause(exc)
                opened.set_exception(BrokerError(f"cannot connect to {self.where}: {why}"))
            resolve(closed, repr(exc))

        def on_close(_conn: Any, exc: BaseException) -> None:
            self._lost(f"connection closed: {exc!r}")
            resolve(closed, repr(exc))

        self._connection = GatheringConnection(
            params, on_open, on_open_error, on_close, custom_ioloop=loop
        )
        self._connection.add_on_connection_blocked_callback(self._on_blocked)
        self._connection.add_on_connection_unblocked_callback(self._on_unblocked)
        await opened
        try:
            await self._open_channel()
            await declare(self._topology, self.channel, self.rpc)
        except BrokerError:
            self._connection.close()
            await closed
            raise
        self.blocked = False
        self.connected = True
        node = announced(self.where, self._connection)
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
        self._events.opened(node)
        return closed

    async def _open_channel(self) -> None:
        """Open the confirm channel on the connection."""
        assert self._connection is not None
        self.channel = await self.rpc(self._connection.channel, "on_open_callback")
        self.channel.add_on_close_callback(self._on_channel_closed)
        self.channel.add_on_return_callback(self._on_return)
        await self.rpc(self.channel.confirm_delivery, "callback", self._events.confirmed)
        self.channel_open = True

    async def _reopen_channel(self) -> None:
        try:
            await self._open_channel()
        except BrokerError as exc:
            connection = self._connection
            if connection is not None and connection.is_open:
                log.warning(
                    "cannot open a channel: %s; reconnecting",
                    exc,
                    extra={"action": "channel_failed", "broker": self.where},
                )
                connection.close()
            return
        self._events.channel_reopened()

    def send(self, channel: Any, frames: list[bytes]) -> bool:
        """Write publishes encoded by ``relay.broker.frames`` on ``channel``, after whatever
        pika wrote before; False, writing nothing, when the channel is not open (pika's
        ``basic_publish`` would raise)."""
        connection = self._connection
        if connection is None or connection.is_closed or not channel.is_open:
            return False
        if frames:
            connection.send_frames(frames)
        return True

    async def rpc(
        self, method: Callable[..., Any], callback_name: str, *args: Any, **kwargs: Any
    ) -> Any:
        """Call a pika method that answers through a callback; fail if the session closes."""
        assert self._closed is not None
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        kwargs[callback_name] = lambda result: resolve(done, result)
        try:
            method(*args, **kwargs)
        except pika.exceptions.AMQPError as exc:
            raise BrokerError(f"{getattr(method, '__name__', method)} failed: {exc!r}") from exc
        await asyncio.wait({done, self._closed}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            why = self._setup_failure or self._closed.result()
            raise BrokerError(f"broker closed the session during setup: {why}")
        return done.result()

    async def side_channel(self, closed: asyncio.Future[Any]) -> Any:
        """A channel of its own on the connection, for a probe: whatever it does cannot close
        the confirm channel. Its close (the reason) resolves ``closed``."""
        assert self._connection is not None
        channel = await self.rpc(self._connection.channel, "on_open_callback")
        channel.add_on_close_callback(lambda _ch, why: resolve(closed, why))
        return channel

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        self._events.returned(properties.message_id, returned(method))

    def _on_channel_closed(self, channel: Any, reason: BaseException) -> None:
        if channel is not self.channel:
            return  # an earlier channel's late news
        self.channel_open = False
        code = getattr(reason, "reply_code", 0)
        text = str(getattr(reason, "reply_text", reason))
        if not isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self._lost(f"channel closed: {code} {text}")  # with its connection
            return
        if not self.connected:
            # While connecting (declaring the topology): the connect fails with this reason.
            self._setup_failure = f"channel closed: {code} {text}"
            if self._connection is not None and self._connection.is_open:
                self._connection.close()
            return
        # A channel error: something we sent broke one of the broker's rules.
        self._events.channel_error(code, text)
        task = asyncio.get_running_loop().create_task(self._reopen_channel())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lost(self, reason: str) -> None:
        was_connected, self.connected, self.channel_open = self.connected, False, False
        self._events.lost(reason, was_connected)

    def _on_blocked(self, _conn: Any, frame: Any) -> None:
        self.blocked = True
        log.warning(
            "broker blocked publishing: %s",
            getattr(frame.method, "reason", ""),
            extra={"action": "broker_blocked", "broker": self.where},
        )

    def _on_unblocked(self, _conn: Any, _frame: Any) -> None:
        self.blocked = False
        log.info("broker unblocked publishing", extra={"action": "broker_unblocked"})
        self._events.unblocked()


def returned(method: Any) -> str:
    """A ``basic.return``'s outcome detail."""
    return (
        f"basic.return {method.reply_code} {method.reply_text} "
        f"(exchange {method.exchange!r}, routing key {method.routing_key!r})"
    )
