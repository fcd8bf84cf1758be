"""Pure: failed logins, limited per (user name, address) pair, per address and per name;
and the password checks running at once, bounded.

After ``attempts`` failures of one name from one address within ``window`` seconds, that
name is refused from that address until the oldest failure leaves the window; an address
is refused past ``attempts * CONSOLE_LOGIN_ADDRESS_SHARE`` failures of any names, and a
name past ``attempts * CONSOLE_LOGIN_NAME_SHARE`` failures from any addresses. A guesser
elsewhere cannot lock the real user out with a few tries (the user's own address keeps its
attempts); a guesser spread over many addresses, or who makes its address up (a host
application that believes ``X-Forwarded-For``: an outside review tried 40 passwords of one
name, one made-up address each, unlimited), gets ``attempts * CONSOLE_LOGIN_NAME_SHARE``
tries of a name in a window, and can keep that name out meanwhile: the price of a bound.
A success does not clear failures (a guesser who finds one password still spent them).

An attempt is counted before its password is checked (``reserve``) and given back only when
the password was right (``succeeded``): logins sent at once all see the ones before them,
so no more than ``attempts`` are checked however many arrive together. Kept per process:
each replica limits on its own.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from relay.console_constants import (
    CONSOLE_LOGIN_ADDRESS_SHARE,
    CONSOLE_LOGIN_KEYS_KEPT,
    CONSOLE_LOGIN_NAME_SHARE,
)

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Attempt:
    """A login attempt counted (as failed until ``LoginLimiter.succeeded``)."""

    keys: tuple[Key, ...]
    at: float


class LoginLimiter:
    def __init__(self, attempts: int, window: float) -> None:
        self.attempts = attempts
        self.window = window
        self._failures: dict[Key, collections.deque[float]] = {}

    def _limits(self, name: str, address: str) -> list[tuple[Key, int]]:
        return [
            (("pair", name, address), self.attempts),
            (("address", address), self.attempts * CONSOLE_LOGIN_ADDRESS_SHARE),
            (("name", name), self.attempts * CONSOLE_LOGIN_NAME_SHARE),
        ]

    def _recent(self, key: Key, now: float) -> int:
        times = self._failures.get(key)
        if times is None:
            return 0
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._failures[key]
        return len(times)

    def reserve(self, name: str, address: str, now: float) -> Attempt | None:
        """The attempt of ``name`` from ``address``, counted as failed; None when refused."""
        limits = self._limits(name, address)
        if any(self._recent(key, now) >= limit for key, limit in limits):
            return None
        if len(self._failures) >= CONSOLE_LOGIN_KEYS_KEPT:
            self.forget_before(now)
        for key, _limit in limits:
            self._failures.setdefault(key, collections.deque()).append(now)
        return Attempt(tuple(key for key, _limit in limits), now)

    def succeeded(self, attempt: Attempt) -> None:
        """``attempt``'s password was right: it is not a failure."""
        for key in attempt.keys:
            times = self._failures.get(key)
            if times is not None and attempt.at in times:
                times.remove(attempt.at)
                if not times:
                    del self._failures[key]

    def forget_before(self, now: float) -> None:
        """Every key whose failures have all left the window, forgotten: a guesser trying
        many names does not grow the table for ever."""
        for key in list(self._failures):
            self._recent(key, now)

    def __len__(self) -> int:
        return len(self._failures)


class HashGate:
    """At most ``limit`` password checks at once: each scrypt check holds 32 MiB, so a burst
    of logins would otherwise take the process's memory with it. One past the limit is
    answered at once (busy), never queued. Used from the event loop's one thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    def enter(self) -> bool:
        if self.running >= self.limit:
            return False
        self.running += 1
        return True

    def leave(self) -> None:
        self.running -= 1
