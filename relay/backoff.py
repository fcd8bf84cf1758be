"""Exponential back-off with jitter, shared by row retries and reconnects (tenacity's strategy)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tenacity


class Backoff:
    """Delay after ``n`` failures: ``initial * 2**(n-1)`` capped at ``maximum``, plus up to
    ``initial`` of random jitter, so that rows (or relays) that failed together do not all come
    back in the same instant. ``wait`` is the same strategy for tenacity's retry loops."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.wait = tenacity.wait_exponential_jitter(
            multiplier=initial, max=maximum, jitter=initial
        )
        self._retrying = tenacity.Retrying()

    def delay(self, failures: int) -> float:
        state = tenacity.RetryCallState(self._retrying, None, (), {})
        state.attempt_number = max(1, failures)
        return float(self.wait(state))


def log_before_retry(
    logger: logging.Logger, what: str, action: str, **extra: Any
) -> Callable[[tenacity.RetryCallState], None]:
    """A tenacity ``before_sleep`` hook: one warning per failed attempt, with the wait."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "%s (attempt %d), retrying in %.1fs: %s",
            what,
            state.attempt_number,
            delay,
            exc,
            extra={"action": action, **extra},
        )

    return before_sleep
