"""Confirm tracking: delivery tag -> row, and what each broker answer means for the row.

Pure logic, no I/O and no pika: the publisher feeds it broker events, the loop takes the
settlements. The protocol facts it encodes (RabbitMQ's publisher-confirm documentation):

- After ``confirm.select`` both sides number publishes from 1, per channel; a new channel
  starts again at 1, so a lost channel ends every outstanding tag (``channel_lost``).
- ``basic.ack``/``basic.nack`` with ``multiple`` settle every outstanding tag up to and
  including ``delivery_tag``.
- An unroutable ``mandatory`` message gets ``basic.return`` *before* its ``basic.ack``: the ack
  then means "handled", not "delivered", so the row is RETURNED, never ACKED.
- The broker promises no confirm time. A time-out means no progress on the channel, not a
  slow window: a tag is TIMED_OUT when the broker answered nothing (no ack, no nack) for
  ``confirm_timeout`` since it was published, or when it waited ``CONFIRM_CEILING_FACTOR``
  times that while others were answered. Big messages are slow to confirm but the answers
  keep coming: 1,000 messages of 1.5 MiB outlived a 30 s timeout per message, and the
  relay published the window again (524 duplicates of 600 rows). A timed-out tag is
  forgotten; a late answer for it is ignored (the row is already due again, and the
  consumer drops the duplicate by ``message_id``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from relay.constants import CONFIRM_CEILING_FACTOR
from relay.records import Answers, OutboxRow, Outcome, PublisherState, Settlement

# Why a row claimed for publishing is due again without having been published.
RELEASED = "claimed, not published: publishing paused or the relay stopped"


@dataclass(slots=True)
class _Entry:
    row: OutboxRow
    published_at: float
    returned: str | None = None


class ConfirmTracker:
    def __init__(self, confirm_timeout: float) -> None:
        self.confirm_timeout = confirm_timeout
        # Insertion order is sequence order is publish-time order: multiple acks and
        # expiry both pop from the front.
        self._outstanding: OrderedDict[int, _Entry] = OrderedDict()
        self._seq_of_message: dict[str, int] = {}
        self._next_seq = 1
        self._settled: list[Settlement] = []
        self._answered_at = float("-inf")  # the broker's last ack or nack on this channel

    @property
    def in_flight(self) -> int:
        return len(self._outstanding)

    def published(self, row: OutboxRow, now: float) -> int:
        """Record a ``basic.publish`` on the confirm channel; returns its sequence number."""
        seq = self._next_seq
        self._next_seq += 1
        self._outstanding[seq] = _Entry(row, now)
        self._seq_of_message[row.message_id] = seq
        return seq

    def reject(self, row: OutboxRow, reason: str) -> None:
        """A row that cannot be published as stored; it never got a sequence number."""
        self._settled.append(Settlement(row, Outcome.REJECTED, reason))

    def fail(self, row: OutboxRow, reason: str) -> None:
        """A row whose publish failed in a way that may pass (an attempt counts)."""
        self._settled.append(Settlement(row, Outcome.FAILED, reason))

    def lose(self, rows: Iterable[OutboxRow], reason: str) -> None:
        """Rows handed over but never published (no channel): due again at once."""
        self._settled.extend(Settlement(row, Outcome.LOST, reason) for row in rows)

    def record(self, settlement: Settlement) -> None:
        """The outcome of a row published elsewhere (a channel of its own)."""
        self._settled.append(settlement)

    @property
    def answered(self) -> bool:
        """Outcomes wait to be taken."""
        return bool(self._settled)

    def on_ack(self, delivery_tag: int, multiple: bool, now: float) -> None:
        self._answered_at = now
        for _, entry in self._take(delivery_tag, multiple):
            if entry.returned is not None:
                self._settled.append(Settlement(entry.row, Outcome.RETURNED, entry.returned))
            else:
                latency = max(0.0, now - entry.published_at)
                self._settled.append(Settlement(entry.row, Outcome.ACKED, "", latency))

    def on_nack(self, delivery_tag: int, multiple: bool, now: float) -> None:
        self._answered_at = now
        for _, entry in self._take(delivery_tag, multiple):
            self._settled.append(
                Settlement(entry.row, Outcome.NACKED, "basic.nack: the broker refused the message")
            )

    def on_return(self, message_id: str | None, reason: str) -> None:
        seq = self._seq_of_message.get(message_id or "")
        entry = self._outstanding.get(seq) if seq is not None else None
        if entry is not None:
            entry.returned = reason

    def expire(self, now: float) -> int:
        """Time out every tag that got no answer while the channel made no progress for
        ``confirm_timeout``, or that waited ``CONFIRM_CEILING_FACTOR`` times as long in all
        (the module docstring); returns how many."""
        expired = 0
        ceiling = CONFIRM_CEILING_FACTOR * self.confirm_timeout
        while self._outstanding:
            seq, entry = next(iter(self._outstanding.items()))
            quiet = now - max(entry.published_at, self._answered_at) >= self.confirm_timeout
            if not quiet and now - entry.published_at < ceiling:
                break  # the oldest tag is not due: no later one is
            self._pop(seq)
            waited = (
                f"no confirm within {self.confirm_timeout:g}s"
                if quiet
                else f"no confirm within {ceiling:g}s while later messages were confirmed"
            )
            self._settled.append(Settlement(entry.row, Outcome.TIMED_OUT, waited))
            expired += 1
        return expired

    def restart_clocks(self, now: float) -> None:
        """Give every outstanding tag a full ``confirm_timeout`` from now.

        Used when the broker unblocks the connection: while blocked it reads nothing, so the
        time spent blocked says nothing about these messages.
        """
        for entry in self._outstanding.values():
            entry.published_at = now

    def channel_lost(
        self,
        reason: str,
        culprit: Callable[[OutboxRow], bool] | None = None,
        culprit_reason: str = "",
        suspects: bool = False,
    ) -> None:
        """The channel (and its numbering) is gone: every outstanding row is due again.

        When the broker closed the channel because of certain rows (``404 NOT_FOUND - no
        exchange 'x'``: the rows for x), those FAILED: they count an attempt, so they are
        parked in the end instead of closing every future channel. The others are LOST.
        With ``suspects``, the rows blamed become suspects (``relay.broker.quarantine``): the
        culprits, or, with none, every row lost.
        """
        for entry in self._outstanding.values():
            row = entry.row
            if culprit is not None and culprit(row):
                self._settled.append(
                    Settlement(row, Outcome.FAILED, culprit_reason, None, suspects)
                )
            else:
                blamed = suspects and culprit is None
                self._settled.append(Settlement(row, Outcome.LOST, reason, None, blamed))
        self._outstanding.clear()
        self._seq_of_message.clear()
        self._next_seq = 1

    def take_settled(self) -> list[Settlement]:
        settled, self._settled = self._settled, []
        return settled

    def _take(self, delivery_tag: int, multiple: bool) -> list[tuple[int, _Entry]]:
        if not multiple:
            entry = self._pop(delivery_tag)
            return [] if entry is None else [(delivery_tag, entry)]
        taken = []
        while self._outstanding:
            seq = next(iter(self._outstanding))
            if seq > delivery_tag:
                break
            entry = self._pop(seq)
            assert entry is not None
            taken.append((seq, entry))
        return taken

    def _pop(self, seq: int) -> _Entry | None:
        entry = self._outstanding.pop(seq, None)
        if entry is not None and self._seq_of_message.get(entry.row.message_id) == seq:
            del self._seq_of_message[entry.row.message_id]
        return entry


class ConfirmWindow:
    """The part of a publisher the loop counts on (``relay.ports.Publisher``, but for
    ``publish``, ``run`` and ``close``): a window of unconfirmed publishes kept by a
    ``ConfirmTracker``, and what the loop takes from it. Real and fake publishers share it;
    each says when it is connected and can publish."""

    def __init__(self, window: int, confirm_timeout: float) -> None:
        self.window = window
        self.tracker = ConfirmTracker(confirm_timeout)
        self._sent: list[OutboxRow] = []  # published since the last take
        self._recovered: list[str] = []  # exchanges found again since the last take

    @property
    def connected(self) -> bool:
        raise NotImplementedError

    @property
    def can_publish(self) -> bool:
        raise NotImplementedError

    @property
    def in_flight(self) -> int:
        return self.tracker.in_flight

    def capacity(self) -> int:
        return max(0, self.window - self.tracker.in_flight) if self.can_publish else 0

    def broken_exchanges(self) -> frozenset[str]:
        return frozenset()

    def state(self) -> PublisherState:
        return PublisherState(
            self.connected,
            self.can_publish,
            self.in_flight,
            self.capacity(),
            self.broken_exchanges(),
        )

    def release(self, rows: Sequence[OutboxRow], reason: str = RELEASED) -> None:
        self.tracker.lose(rows, reason)

    def take(self) -> Answers:
        sent, self._sent = self._sent, []
        recovered, self._recovered = self._recovered, []
        return Answers(sent, self.tracker.take_settled(), recovered)

    def sent(self, row: OutboxRow, now: float) -> int:
        """``row`` went out on the confirm channel; its sequence number."""
        self._sent.append(row)
        return self.tracker.published(row, now)
