"""Exponential back-off with jitter, shared by row retries and reconnects (tenacity's strategy)."""

from __future__ import annotations

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
