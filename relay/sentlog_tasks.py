"""The relay's tasks that keep the sent log (``relay.db.sentlog``, ``relay.db.sentruns``): its
looks and copies after a crash emptied it, and its runs' upkeep. Composed by ``relay run``
(``relay.daemon``); each retries its own failures, and runs until cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from relay.constants import SENT_LOG_CHECK_S, SENT_LOG_RETRY_S, SENT_RUN_CHECK_S
from relay.db.sentlog import SentLogRebuild
from relay.db.sentruns import SentRuns
from relay.errors import RelayError
from relay.retrying import in_thread
from relay.sentlog import SentLogState, SentLogWatch
from relay.wakeup import Wakeup

log = logging.getLogger(__name__)


async def whole_sent_log(
    url: str,
    watch: SentLogWatch,
    clock: Callable[[], float],
    woken: Wakeup,
    reached: Callable[[], None],
) -> None:
    """Look every ``SENT_LOG_CHECK_S`` at the sent log's state, and at once when ``woken``
    (another database call of the relay failed: a crash is first seen so, and the look
    that finds the log emptied is the pause's start). Incomplete (a crash or a
    failover emptied PostgreSQL's, ``relay.db.sentlog``, or its state row was deleted):
    copy the journal's tail back (seconds), after which claims go on, looking the rest up
    in the runs (``relay.db.sentruns``); recovering: copy the whole journal back, unless
    another relay is. ``watch`` keeps what the looks found (``relay.sentlog``: the gauges,
    readiness); a failed look is tried again at once (its pooled connection may be one the
    crash closed), then every ``SENT_LOG_RETRY_S``; a look that worked tells ``reached`` (the
    relay's calls waiting to try the database again try at once). A stop cancels a copy
    under way."""
    rebuild = SentLogRebuild(url)
    warned = False  # once per emptied log, not at each look while another relay copies it
    failures = 0  # looks failed in a row
    # The whole journal's copy, beside the looks: it takes minutes at a week's log, and a
    # look must go on saying what holds meanwhile (a call that failed during the copy made
    # the relay unready for the rest of it).
    copying: asyncio.Task[SentLogState | None] | None = None
    try:
        while True:
            if copying is not None and copying.done():
                if copying.result() is SentLogState.COMPLETE and warned:
                    log.info("the sent log is complete", extra={"action": "sent_log_complete"})
                    warned = False
                copying = None
            began = clock()
            try:
                found = await in_thread(rebuild.state)
                watch.looked(found, began, clock())
                reached()
                if found is not SentLogState.COMPLETE and not warned:
                    log.warning(
                        "the sent log is not complete (a crash or a failover emptied it, or "
                        "its state row was deleted): rebuilding it from its journal",
                        extra={"action": "sent_log_rebuild", "state": found.value},
                    )
                warned = warned or found is not SentLogState.COMPLETE
                state: SentLogState | None = found
                if state is SentLogState.INCOMPLETE:
                    state = await _copied(
                        rebuild, rebuild.recover, "sent_log_recovered", watch, clock
                    )
                if state is SentLogState.RECOVERING and copying is None:
                    copying = asyncio.create_task(_whole_copy(rebuild, watch, clock))
                if state is SentLogState.COMPLETE and warned:
                    log.info(
                        "the sent log is complete",
                        extra={"action": "sent_log_complete"},
                    )
                    warned = False
            except RelayError as exc:
                watch.failed(clock())
                log.warning("%s", exc, extra={"action": "sent_log_failed"})
                failures += 1
                await asyncio.sleep(0 if failures == 1 else SENT_LOG_RETRY_S)
                continue
            failures = 0
            await woken.wait(SENT_LOG_CHECK_S)
    finally:
        if copying is not None:
            copying.cancel()
            await asyncio.gather(copying, return_exceptions=True)
        rebuild.close()


async def _whole_copy(
    rebuild: SentLogRebuild, watch: SentLogWatch, clock: Callable[[], float]
) -> SentLogState | None:
    """Copy the whole journal back (``SentLogRebuild.rebuild``): the state it left. A
    failure is logged, and the next look starts it again."""
    try:
        return await _copied(rebuild, rebuild.rebuild, "sent_log_rebuilt", watch, clock)
    except RelayError as exc:
        watch.failed(clock())
        log.warning("%s", exc, extra={"action": "sent_log_failed"})
        return None


async def _copied(
    rebuild: SentLogRebuild,
    copy: Callable[[], int | None],
    action: str,
    watch: SentLogWatch,
    clock: Callable[[], float],
) -> SentLogState | None:
    """Run one of the log's copies (``recover``, ``rebuild``) unless another relay holds the
    state row: the state it left, else None (look again later)."""
    started = clock()
    copied = await in_thread(copy, on_cancel=rebuild.cancel)
    if copied is None:
        return None
    state = await in_thread(rebuild.state)
    watch.looked(state, started, clock())
    log.info(
        "the sent log's entries copied back: claiming (%s)",
        state.value,
        extra={"action": action, "entries": copied, "seconds": round(clock() - started, 1)},
    )
    return state


async def keep_sent_runs(url: str, unsealed: Callable[[float], None]) -> None:
    """Seal the sent log's journal into runs and merge them (``relay.db.sentruns``): a step
    every ``SENT_RUN_CHECK_S``, or at once while more is due (a merge's next range of keys),
    telling ``unsealed`` how far back the journal's tail reaches after each. A failure is
    tried again at once, the first time (its pooled connection may be one a crash closed:
    the tail would otherwise grow a minute more), then logged and tried again at the next
    look."""
    runs = SentRuns(url)
    failures = 0
    try:
        while True:
            try:
                upkeep = await in_thread(runs.step)
                unsealed(await in_thread(runs.unsealed_seconds))
                failures = 0
                if upkeep.more:
                    continue
            except RelayError as exc:
                failures += 1
                if failures == 1:
                    continue
                log.warning("sent log runs not kept: %s", exc, extra={"action": "sent_run_failed"})
            await asyncio.sleep(SENT_RUN_CHECK_S)
    finally:
        runs.close()
