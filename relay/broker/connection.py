"""The connection to the broker: pika's parameters from the settings, the connection that
gathers its frames, and the way through the broker's nodes (``Connector``)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pika
import tenacity
from pika.adapters.asyncio_connection import AsyncioConnection

from relay.backoff import Backoff, log_before_retry
from relay.constants import (
    GATHER_MAX_BYTES,
    MIN_CONNECT_TIMEOUT_S,
    PIKA_DEFAULT_CONNECT_TIMEOUT_S,
    SHORT_SESSION_S,
)
from relay.errors import BrokerError, ConfigError
from relay.records import BrokerNode
from relay.redact import redact_url
from relay.settings import TlsOptions

log = logging.getLogger(__name__)

# Opens a session (a connection, its confirm channel, the topology) to the node given; the
# future resolves with why the session ended. Raises BrokerError when the node refuses.
Session = Callable[[pika.URLParameters], Awaitable["asyncio.Future[str]"]]


class Connector:
    """The broker's nodes, one session at a time. A connect tries every node in turn, from
    the one after the node last lost (it may be down, and trying it first could wait out a
    connect timeout); all failing is one failure, retried with back-off. Sessions that end as
    soon as they open back off too: whatever the cause, a reconnect storm costs every other
    client of the broker."""

    def __init__(
        self,
        urls: Sequence[str],
        name: str,
        tls: TlsOptions | None,
        confirm_timeout: float,
        reconnect: Backoff,
    ) -> None:
        self._nodes = [connection_parameters(url, name, tls) for url in urls]
        for params in self._nodes:
            # A connect attempt made while the link was black-holed hangs until this timeout
            # (pika's default: 15 s) even after the link is back; no longer than the confirm
            # timeout, so that recovery is as quick as the detection.
            params.stack_timeout = min(
                params.stack_timeout or PIKA_DEFAULT_CONNECT_TIMEOUT_S,
                max(MIN_CONNECT_TIMEOUT_S, confirm_timeout),
            )
            if len(self._nodes) > 1 and params.blocked_connection_timeout is None:
                # A node that stays blocked (its memory or disk alarm) longer than a confirm
                # may take is left for the next one: pika closes the connection.
                params.blocked_connection_timeout = confirm_timeout
        self._node = 0  # index of the node in use, or of the one to try first
        self._reconnect = reconnect
        self._log_retry = log_before_retry(
            log, "broker unavailable", "broker_retry", broker=",".join(map(address, self._nodes))
        )

    @property
    def params(self) -> pika.URLParameters:
        """The node in use, or the one to try first."""
        return self._nodes[self._node]

    @property
    def where(self) -> str:
        return address(self.params)

    async def run(self, session: Session, closing: Callable[[], bool]) -> None:
        """Open sessions, one after another, until ``closing`` says to stop."""
        short_sessions = 0
        while not closing():
            if short_sessions:
                await asyncio.sleep(self._reconnect.delay(short_sessions))
            retrying = tenacity.AsyncRetrying(
                wait=self._reconnect.wait,
                retry=tenacity.retry_if_exception_type(BrokerError),
                stop=lambda _state: closing(),
                before_sleep=self._log_retry,
                reraise=True,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        ended = await self._connect(session)
            except BrokerError:
                return  # closing while still unable to connect
            started = time.monotonic()
            reason = await ended
            lost = self.where
            self._node = (self._node + 1) % len(self._nodes)
            short = time.monotonic() - started < SHORT_SESSION_S
            short_sessions = short_sessions + 1 if short else 0
            if not closing():
                log.warning(
                    "broker connection lost: %s",
                    reason,
                    extra={"action": "broker_disconnected", "broker": lost},
                )

    async def _connect(self, session: Session) -> asyncio.Future[str]:
        """A session on the first node, from the current one on, that takes one."""
        failures = []
        for _ in self._nodes:
            try:
                return await session(self.params)
            except BrokerError as exc:
                failures.append(str(exc))
                if len(failures) < len(self._nodes):
                    log.warning(
                        "%s; trying the next node",
                        exc,
                        extra={"action": "broker_node_failed", "broker": self.where},
                    )
                self._node = (self._node + 1) % len(self._nodes)
        raise BrokerError("; ".join(failures))


class GatheringConnection(AsyncioConnection):  # type: ignore[misc]
    """pika's asyncio connection, writing what one event-loop turn produced in one send.

    pika 1.3 hands every frame to its transport as a buffer of its own and sends the buffers
    one ``send()`` each: a publish is three frames (method, header, body), so a batch of 500
    rows was 1,500 system calls, the relay's largest single cost (18% of its CPU samples in
    ``bench.run --profile``). Frames are gathered here and handed over once the loop turn that
    produced them ends (``call_soon``), in the order pika produced them.

    ``_adapter_emit_data`` is the method pika's adapters implement to write (pika's own
    ``BaseConnection`` is one such adapter); pika is pinned to 1.3.x for it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._gathered: list[bytes] = []
        super().__init__(*args, **kwargs)

    def _adapter_emit_data(self, data: bytes) -> None:
        self._gather([data])

    def send_frames(self, frames: list[bytes]) -> None:
        """Write frames encoded elsewhere (``relay.broker.frames``), gathered with pika's own,
        counted as pika's output counts them (its heartbeat checker watches ``bytes_sent``)."""
        self.bytes_sent += sum(map(len, frames))
        self.frames_sent += len(frames)
        self._gather(frames)

    def _gather(self, pieces: list[bytes]) -> None:
        """Keep ``pieces`` to write when this loop turn ends, after what it wrote before."""
        if not self._gathered:
            asyncio.get_running_loop().call_soon(self._emit_gathered)
        self._gathered += pieces

    def _emit_gathered(self) -> None:
        pieces, self._gathered = self._gathered, []
        if self.is_closed:  # a dropped connection has no transport left to write to
            return
        # Big messages' frames are written as they are: joined, they would be one more copy
        # of every byte in flight (the byte budget's worth, for a while).
        if sum(map(len, pieces)) < GATHER_MAX_BYTES:
            pieces = [b"".join(pieces)]
        for piece in pieces:
            super()._adapter_emit_data(piece)


def connection_parameters(url: str, name: str, tls: TlsOptions | None = None) -> pika.URLParameters:
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # pika raises ValueError, KeyError, ... for bad URLs
        raise ConfigError(f"RELAY_AMQP_URL={redact_url(url)}: {exc}") from None
    if tls is not None:
        params.ssl_options = pika.SSLOptions(
            tls_context(tls), server_hostname=tls.server_name or params.host
        )
    # One attempt per connect: tenacity owns the retry schedule and its logging.
    params.connection_attempts = 1
    params.client_properties = {"connection_name": name, "product": "outbox-relay"}
    return params


def tls_context(tls: TlsOptions) -> ssl.SSLContext:
    """Verify the broker's certificate and name (always); present a client certificate
    when one is configured. A file that cannot be used is a ConfigError naming the setting."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"RELAY_AMQP_CA_FILE={tls.ca_file}: cannot use: {exc}") from None
    if tls.cert_file is not None:
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"RELAY_AMQP_CERT_FILE={tls.cert_file}, RELAY_AMQP_KEY_FILE={tls.key_file}: "
                f"cannot use: {exc}"
            ) from None
    return context


def address(params: pika.URLParameters) -> str:
    return f"{params.host}:{params.port}"


def announced(address: str, connection: AsyncioConnection) -> BrokerNode:
    """The node as its connection.start announced it (text fields may arrive as bytes)."""
    props = connection.server_properties or {}

    def text(key: str) -> str:
        value = props.get(key, "")
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    return BrokerNode(
        address, text("product"), text("version"), text("cluster_name"), connection.params.frame_max
    )


def drop_if_open(connection: GatheringConnection) -> None:
    """Abort the socket of a connection whose close never completed (a half-open link).

    pika has no public way to do this: ``close()`` waits for the broker's close-ok, which
    never comes on a black-holed link, and only the heartbeat (minutes) would end it. This is
    the private call pika's own connection-level error handling uses to abort the transport,
    and it reports the loss through the usual ``on_close`` callback; pika is pinned to 1.3.x
    in pyproject.toml for it, and fault scenario 3b (black hole) fails if it stops working.
    """
    if not connection.is_closed:
        connection._adapter_disconnect_stream()


def root_cause(exc: BaseException) -> str:
    """pika wraps a refused socket three levels deep; operators want the innermost reason."""
    seen: BaseException | None = exc
    while seen is not None:
        inner = getattr(seen, "exceptions", None) or seen.args
        nested = [e for e in inner if isinstance(e, BaseException)]
        if not nested and isinstance(getattr(seen, "exception", None), BaseException):
            nested = [seen.exception]  # type: ignore[attr-defined]
        if not nested:
            return f"{type(seen).__name__}: {seen}" if str(seen) else type(seen).__name__
        seen = nested[-1]
    return repr(exc)


def resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)
