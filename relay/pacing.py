"""Claim pacing: when the relay loop (``relay.relay``) claims, and how many rows. Pure: a clock
reading and the loop's counts in, a decision out; the loop tells it when each claim began
(``began``) and what it found (``claimed``).

A claim is made when rows may be due and the window and the budget have room for a useful
batch (``decide``). Rows may be due when someone says so (``asked``: the probe saw new rows
that may lie in this relay's buckets, a settle made rows due again, a turn took buckets, the
relay stops), after a full claim (more wait), and at each poll (``poll_interval`` after a
claim began: rows due again after a back-off, a row that committed after a later one).

Once the relay has caught up (a claim came back short, and not because the byte budget cut
it), the next claim waits until ``linger`` after that one began, however soon it is asked
for: a steady stream is claimed a few times a second, not once per new row. While claims
find rows (one did within a poll interval: the relay ``streams``), the next one comes then
unasked, and the probe of new rows (``relay.db.probe``) does not look (``listening``): the
claims look for the stream themselves, a linger apart. Not at the first claim that finds
nothing: with several relays, a stream's runs of ids reach each relay's buckets with gaps
longer than a linger, and probing in each gap cost more than the claims it saved. Without a
linger no claim comes unasked, and the probe always looks: each new row is claimed when the
probe says it came (a claim "a linger later" was one at every turn of the loop: a row's
confirm and its settle each turned it, three claims a row, two of them empty).

A claim takes up to a batch more than the window has room for (``ahead``: rows ready when
confirms free the window, instead of a claim's round trip later; at most a window, since with
a small window a batch ahead would be most of what a channel loss loses); nothing while the
broker cannot take rows or the lease runs short, while a window's worth of outcomes waits to
be settled, or while the byte budget is spent (memory stays bounded); and less than a quarter
batch only when nothing else is under way (each claim costs a query).
"""

from __future__ import annotations

from typing import NamedTuple

from relay.constants import HELD_CHARGE_INTERVAL_S


class Counts(NamedTuple):
    """The loop's state as a claim's size is decided."""

    can_publish: bool  # the broker takes rows and the lease holds
    capacity: int  # rows the window takes now
    in_flight: int  # rows published, awaiting the broker's answer
    ready: int  # rows claimed, waiting for room in the window
    unsettled: int  # outcomes waiting to be settled
    budget_waits: bool  # claims wait for room a settle frees (``relay.budget.ByteBudget.waits``)


class Decision(NamedTuple):
    rows: int  # how many rows to claim now; 0: none
    wait: float  # seconds until the next claim may come unasked (a poll interval at most)


class ClaimPacing:
    def __init__(
        self, linger: float, poll_interval: float, batch_size: int, window: int, now: float
    ) -> None:
        self.linger = linger
        self.poll_interval = poll_interval
        self.batch_size = batch_size
        self.window = window
        self._ahead = min(batch_size, window)
        self._min_claim = max(1, batch_size // 4)
        self._maybe_due = True  # asked for, or the last claim was full
        self._next_poll = now
        self._not_before = now  # a linger after a short claim began
        self._found_at = float("-inf")  # when a claim last found rows
        # The last claim was full: other rows wait, and the rows of broken exchanges (which
        # are only charged an attempt) are left for later (``skip``).
        self.backlog = False
        self._charge_held_at = now
        self.listening = True  # the probe of new rows looks (see the module docstring)

    def asked(self) -> None:
        """Rows may be due that no claim has looked for: claim once the linger allows."""
        self._maybe_due = True

    def decide(self, now: float, counts: Counts) -> Decision:
        """Whether to claim now, how many rows, and how long to wait otherwise."""
        due = now >= self._not_before and (self._maybe_due or now >= self._next_poll)
        return Decision(self._size(counts) if due else 0, self.until(now))

    def until(self, now: float) -> float:
        """Seconds to the next claim that may find rows; a whole interval once it is past
        (while claiming cannot go on, the loop must not spin: answers still wake it)."""
        due = max(self._not_before, now if self._maybe_due else self._next_poll)
        left = due - now
        return left if 0 < left < self.poll_interval else self.poll_interval

    def _size(self, counts: Counts) -> int:
        if not counts.can_publish or counts.unsettled >= self.window or counts.budget_waits:
            return 0
        room = counts.capacity + self._ahead - counts.ready
        wanted = min(self.batch_size, room)
        if wanted >= self._min_claim or (wanted > 0 and not counts.in_flight and not counts.ready):
            return wanted
        return 0

    def skip(self, now: float, broken: frozenset[str]) -> frozenset[str]:
        """The exchanges this claim leaves out: the broken ones (``relay.broker.destinations``),
        while other rows wait. Their rows are only charged an attempt, and claimed with the
        rest they halved the rate of the good rows (6,000 of each, interleaved: 0.47x the
        rate without them; 0.92x left out). So they are claimed when the backlog of the
        others is drained, and at least every ``HELD_CHARGE_INTERVAL_S`` (their due entries
        must not pile up at the front of the due index, where every claim steps over them)."""
        if not broken or not self.backlog or now >= self._charge_held_at:
            self._charge_held_at = now + HELD_CHARGE_INTERVAL_S
            return frozenset()
        return broken

    def began(self, now: float) -> None:
        """A claim begins. Rows asked for meanwhile are for the next one."""
        self._maybe_due = False
        self._next_poll = now + self.poll_interval

    def claimed(self, began: float, wanted: int, got: int, kept: int, cut: bool) -> None:
        """The claim that ``began`` for ``wanted`` rows got ``got``, of which the loop kept
        ``kept`` (it drops those claimed under a lease that lapsed meanwhile); ``cut``: the
        byte budget, not the outbox running dry, ended it short."""
        self.backlog = got == wanted
        if kept:
            self._found_at = began
        streaming = self.linger > 0 and began - self._found_at < self.poll_interval
        self.listening = not streaming
        if kept == wanted or cut:
            # More may be due: a full claim is followed by the next at once; one the budget
            # cut, by the next once a settle frees room (the settle turns the loop).
            self._maybe_due = True
        else:
            self._not_before = began + self.linger
            if streaming:
                self._next_poll = self._not_before
