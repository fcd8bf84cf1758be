"""A loopback TCP proxy between a client (a relay, a consumer) and its server (the broker,
the database) that misbehaves on request: passes traffic, delays it, black-holes it (a
half-open link: both sockets stay open, nothing arrives), or resets every connection; and,
asked by another process through a file (``cut``), resets every connection at the client's
next bytes, which it drops, then refuses connections for a while. An asyncio forwarder in a
thread of its own."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path


class TcpProxy:
    def __init__(
        self, target_port: int, cut: Path | None = None, refuse_after_cut: float = 0.0
    ) -> None:
        """``cut``: a file another process makes to have the connections cut (removed once
        they are), and then new ones refused for ``refuse_after_cut`` seconds."""
        self.target_port = target_port
        # Its port bound now, the kernel's choice: a port found free and bound later was
        # taken meanwhile by another test process's server (four of them start servers at
        # once), and the proxy's thread died on "address already in use".
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.mode = "pass"  # or "blackhole"
        self.delay = 0.0
        self.cut = cut
        self.cuts = 0
        self._refuse_after_cut = refuse_after_cut
        self._refusing_until = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy's thread did not start listening")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def reset(self) -> None:
        """Abort every connection through the proxy, both sides (RST)."""

        def abort_all() -> None:
            for writer in list(self._writers):
                writer.transport.abort()

        self._loop.call_soon_threadsafe(abort_all)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, sock=self._listener)
        )
        self._started.set()
        self._loop.run_forever()
        # Stopped: close the listener and every connection, let the pumps end, then the loop.
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        pending = asyncio.all_tasks(self._loop)  # the pumps end on their aborted sockets
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=5))
        self._loop.run_until_complete(server.wait_closed())
        self._loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refusing_until:
            client_w.transport.abort()
            return
        try:
            broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._writers |= {client_w, broker_w}
        await asyncio.gather(
            self._pump(client_r, broker_w, upstream=True),
            self._pump(broker_r, client_w),
            return_exceptions=True,
        )
        self._writers -= {client_w, broker_w}
        client_w.transport.abort()
        broker_w.transport.abort()

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, upstream: bool = False
    ) -> None:
        """Forward ``source`` to ``sink`` until either side goes; then the other side is cut
        too, however this one went (a client SIGKILLed resets its socket: the read raises),
        or the server's side stayed open under a dead client (PostgreSQL kept its
        transaction, and the key it held, for good)."""
        try:
            while data := await source.read(65536):
                if upstream and self.cut is not None and self.cut.exists():
                    # Whatever the client sent after asking (an ack, a statement) is lost
                    # with every connection.
                    self.cuts += 1
                    self._refusing_until = time.monotonic() + self._refuse_after_cut
                    for writer in list(self._writers):
                        writer.transport.abort()
                    self.cut.unlink()
                    return
                if self.mode == "blackhole":
                    continue
                if self.delay:
                    await asyncio.sleep(self.delay)
                sink.write(data)
                await sink.drain()
        finally:
            sink.transport.abort()
