"""Pure: failed logins, limited per user name and per address. After ``attempts`` failures
within ``window`` seconds, logins for that name or from that address are refused until the
oldest failure leaves the window (a success does not clear them: a guesser who finds one
password still spent the attempts). Kept per process: each replica limits on its own."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from relay.constants import CONSOLE_LOGIN_KEYS_KEPT


class LoginLimiter:
    def __init__(self, attempts: int, window: float) -> None:
        self.attempts = attempts
        self.window = window
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, key: str, now: float) -> collections.deque[float]:
        times = self._failures.setdefault(key, collections.deque())
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._failures[key]
            return collections.deque()
        return times

    def refused(self, keys: Iterable[str], now: float) -> bool:
        """Whether a login for these keys (``user:NAME``, ``address:IP``) is refused now."""
        return any(len(self._recent(key, now)) >= self.attempts for key in keys)

    def failed(self, keys: Iterable[str], now: float) -> None:
        if len(self._failures) >= CONSOLE_LOGIN_KEYS_KEPT:
            self.forget_before(now)
        for key in keys:
            self._recent(key, now)
            self._failures.setdefault(key, collections.deque()).append(now)

    def forget_before(self, now: float) -> None:
        """Every name and address whose failures have all left the window, forgotten: a
        guesser trying many names does not grow the table for ever."""
        for key in list(self._failures):
            self._recent(key, now)

    def __len__(self) -> int:
        return len(self._failures)
