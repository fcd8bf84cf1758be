"""The log of parked rows: a line per row, until rows park by the hundred for one reason.

A parked row needs an operator (``relay replay``), so each one is logged, with its id and the
reason. But when a whole destination is broken, thousands of rows park within seconds with
the same reason, and a line for each would bury everything else in the log. So the first row
parked for a reason gets its own line, and rows parked for that reason in the next
``interval`` seconds get one line together, with how many and the first ids; the metric
``relay_parked_total`` and ``relay status`` count every one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from relay.records import RowChange

log = logging.getLogger(__name__)

# Ids named in a line for many parked rows; `relay status` and the table give the rest.
IDS_PER_LINE = 20


@dataclass(slots=True)
class _Reason:
    logged_at: float  # the last line for this reason
    rows: int = 0  # parked since, not logged yet
    ids: list[int] = field(default_factory=list)  # the first of them


class ParkedLog:
    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._reasons: dict[str, _Reason] = {}

    def parked(self, changes: Sequence[RowChange], fields: Mapping[int, Mapping[str, Any]]) -> None:
        """Rows just parked; ``fields``: extra log fields by row id (a row's trace)."""
        now = self._clock()
        for change in changes:
            seen = self._reasons.get(change.last_error)
            if seen is None or (not seen.rows and now - seen.logged_at >= self._interval):
                self._reasons[change.last_error] = _Reason(now)
                log.warning(
                    "row %d parked after %d attempts: %s",
                    change.id,
                    change.attempts,
                    change.last_error,
                    extra={"action": "row_parked", "row_id": change.id, **fields[change.id]},
                )
            else:
                seen.rows += 1
                if len(seen.ids) < IDS_PER_LINE:
                    seen.ids.append(change.id)
        self.flush(now)

    def flush(self, now: float | None = None, *, every: bool = False) -> None:
        """Log what waited its interval (``every``: all that waits, at a stop), and forget
        reasons quiet for an interval."""
        now = self._clock() if now is None else now
        for reason, seen in list(self._reasons.items()):
            due = now - seen.logged_at >= self._interval
            if seen.rows and (due or every):
                more = ", ..." if seen.rows > len(seen.ids) else ""
                log.warning(
                    "%d more rows parked after their attempts: %s (ids %s%s)",
                    seen.rows,
                    reason,
                    ", ".join(map(str, seen.ids)),
                    more,
                    extra={"action": "rows_parked", "rows": seen.rows, "row_ids": seen.ids},
                )
                self._reasons[reason] = _Reason(now)
            elif due and not seen.rows:
                del self._reasons[reason]
