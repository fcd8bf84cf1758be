"""`relay run` that freezes itself (SIGSTOP) at a chosen point, as a relay paused by its host
(a VM migrated, a container throttled to nothing) at that moment would; SIGCONT resumes it.
Run from the repository root:

    python -m tests.faults.frozen turn S    in its first turn S seconds after it started,
                                           after the turn's statements and before its
                                           commit: its presence and its buckets locked by
                                           an open transaction
    python -m tests.faults.frozen claim S   after its first claim S seconds after it started
                                           that found rows, before the loop has them: rows
                                           claimed, none published

Nothing of this is in the shipped relay: the wrapper replaces the store's function before
the relay starts."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import relay.db.claims
from relay.cli import main


def _freezing(call: Callable[..., Any], after: float, counts: Callable[[Any], bool]) -> Any:
    """``call``, which freezes the process once, after the first call ``after`` seconds from
    now whose result ``counts``."""
    due = time.monotonic() + after
    frozen = False

    def call_then_freeze(*args: Any, **kwargs: Any) -> Any:
        nonlocal frozen
        result = call(*args, **kwargs)
        if not frozen and time.monotonic() >= due and counts(result):
            frozen = True
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    return call_then_freeze


def freeze_in(point: str, at: float) -> None:
    if point == "turn":
        names = vars(relay.db.claims)  # the turn's function, as the store calls it
        names["refresh"] = _freezing(names["refresh"], at, lambda _buckets: True)
    elif point == "claim":
        store = relay.db.claims.ClaimStore
        store.claim = _freezing(store.claim, at, bool)  # type: ignore[method-assign]
    else:
        raise SystemExit(f"freeze in a turn or a claim, not {point!r}")


if __name__ == "__main__":
    freeze_in(sys.argv[1], float(sys.argv[2]))
    sys.exit(main(["run"]))
