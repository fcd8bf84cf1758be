"""The quarantine: suspect rows go out one at a time, each with nothing else in flight.

A suspect (``OutboxRow.suspect``) was unconfirmed on a channel the broker closed without
naming the row it closed it for (``relay.broker.blame``). Published among others, a suspect
that is the culprit would take them all down again, on every later attempt; published
alone, a close can only be its fault. So good rows are taken down with a bad one once at
most (one window). Pure: the publisher asks, sends, and reports the answers.
"""

from __future__ import annotations

from collections import deque

from relay.broker.blame import Verdict, blame
from relay.records import OutboxRow


class Quarantine:
    def __init__(self) -> None:
        self._waiting: deque[OutboxRow] = deque()
        self._alone: OutboxRow | None = None  # the suspect out by itself, until answered

    @property
    def closed(self) -> bool:
        """Nothing else may join the window: a suspect waits, or one is out alone."""
        return bool(self._waiting) or self._alone is not None

    def admit(self, row: OutboxRow) -> bool:
        """True: publish the row with the others. False: a suspect, kept to go out alone."""
        if row.suspect:
            self._waiting.append(row)
            return False
        return True

    def next_alone(self, in_flight: int) -> OutboxRow | None:
        """The suspect to publish now: the next one, once nothing is in flight."""
        if in_flight or self._alone is not None or not self._waiting:
            return None
        self._alone = self._waiting.popleft()
        return self._alone

    def answered(self) -> None:
        """The row out alone was answered (or never went out): innocent of any close."""
        self._alone = None

    def judge(self, code: int, text: str) -> Verdict:
        """The broker closed the channel: the verdict (``relay.broker.blame.blame``), with the
        row out alone, if one was, the culprit for certain."""
        verdict = blame(code, text, self._alone)
        self._alone = None
        return verdict

    def release(self) -> list[OutboxRow]:
        """The channel is gone: the suspects that never went out, to be due again (still
        suspects)."""
        waiting = list(self._waiting)
        self._waiting.clear()
        self._alone = None
        return waiting
