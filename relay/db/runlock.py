"""An exclusive lock on a file beside an SQLite database, held around each of an inbox
consumer's deliveries: the consumers of one database on one host take their runs one at a
time (SQLite takes one writer at a time anyway). With one writer, a redelivered run is
marked before its key is inserted (the mark's own transaction cannot write beside the open
one), and without the lock another consumer's run, between that mark and that key, could
take the mark for one that died (``relay.inbox.flow``). A consumer that dies lets the lock
go with its process.

Where the platform has no ``flock`` (Windows), there is no lock: run one consumer process
per SQLite database there."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import TracebackType

from relay.constants import INBOX_RUN_LOCK_POLL_S

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]


class RunLock:
    """The lock on ``path`` (made if missing), blocking (``with``) or awaited (``held``)."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600) if fcntl else -1

    def __enter__(self) -> RunLock:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    async def acquire(self) -> None:
        """Taken without blocking the event loop: tried, then tried again a moment later."""
        while self._fd >= 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                await asyncio.sleep(INBOX_RUN_LOCK_POLL_S)
            else:
                return

    def release(self) -> None:
        self.__exit__(None, None, None)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
