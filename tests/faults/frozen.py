"""`relay run` that freezes itself (SIGSTOP) at a chosen point, as a relay paused by its host
(a VM migrated, a container throttled to nothing) at that moment would; SIGCONT resumes it.
Run from the repository root:

    python -m tests.faults.frozen turn FILE    in its first turn once FILE exists, after
                                              the turn's statements and before its commit:
                                              its presence and its buckets locked by an
                                              open transaction
    python -m tests.faults.frozen claim FILE   after its first claim that found rows once
                                              FILE exists, before the loop has them: rows
                                              claimed, none published

The test creates FILE when what it measures before the freeze has happened (rows flowing, a
rate): a delay counted from the relay's start was spent, on a busy machine, starting the
relays and the writers, and the freeze came before the rows flowed.

Nothing of this is in the shipped relay: the wrapper replaces the store's function before
the relay starts."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import relay.db.claims
from relay.cli import main


def _freezing(call: Callable[..., Any], armed: Path, counts: Callable[[Any], bool]) -> Any:
    """``call``, which freezes the process once, after the first call once ``armed`` exists
    whose result ``counts``."""
    frozen = False

    def call_then_freeze(*args: Any, **kwargs: Any) -> Any:
        nonlocal frozen
        result = call(*args, **kwargs)
        if not frozen and counts(result) and armed.exists():
            frozen = True
            os.kill(os.getpid(), signal.SIGSTOP)
        return result

    return call_then_freeze


def freeze_in(point: str, armed: Path) -> None:
    if point == "turn":
        names = vars(relay.db.claims)  # the turn's function, as the store calls it
        names["refresh"] = _freezing(names["refresh"], armed, lambda _buckets: True)
    elif point == "claim":
        store = relay.db.claims.ClaimStore
        store.claim = _freezing(store.claim, armed, bool)  # type: ignore[method-assign]
    else:
        raise SystemExit(f"freeze in a turn or a claim, not {point!r}")


if __name__ == "__main__":
    freeze_in(sys.argv[1], Path(sys.argv[2]))
    sys.exit(main(["run"]))
