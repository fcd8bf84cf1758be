"""A page of an inbox queue's dead letters, as the console shows it: the letters after a
given one, read from the queue's head (a queue has no other way in) without taking any, and
what the read could not see.

A page follows a letter named by its digest (``Position``), not a count from the head:
letters leave a queue from anywhere (a requeue, a purge) and arrive at its end, so the
letters after a given one are the same page however many left before it. When the letter a
page follows has left, the page starts at the position it had, and says so. Every read is
bounded (``limit`` letters, ``budget_s`` seconds), and says where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pika

from relay.broker.deadletters import (
    DeadLetter,
    Reader,
    connected,
    depth_of,
    describe,
    digest,
    look,
    put_back,
)
from relay.broker.queue_kind import unreadable
from relay.settings import TlsOptions


@dataclass(frozen=True)
class Position:
    """Where a page starts: after the letter of ``after`` (a digest; "" for the head), which
    was at ``at`` (from 0) when it was shown; at the letter of ``then``, which followed it,
    when that one has left."""

    after: str = ""
    at: int = -1
    then: str = ""


@dataclass(frozen=True)
class Bounds:
    """How much a read may read: ``size`` letters shown, ``limit`` letters read in all,
    ``budget_s`` seconds."""

    size: int
    limit: int
    budget_s: float


@dataclass(frozen=True)
class LetterPage:
    """A page of letters, each with its position in the queue as read (from 0)."""

    letters: list[tuple[int, DeadLetter]]
    depth: int  # ready letters as the read began (those another reader held: not counted)
    unreadable: str = ""  # why the queue is not read at all (``relay.broker.queue_kind``)
    read: int = 0  # letters read to draw it
    stopped: str = ""  # ``Reader.stopped``
    more: bool = False  # a letter follows the page
    following: str = ""  # its digest
    lost: bool = False  # the letter the page follows has left the queue
    found: bool = True  # the read reached the letter the page follows
    missed: int = 0  # ready letters as the read began that it did not see
    depth_after: int = 0  # ready letters once the read put its own back
    # Other consumers of the queue as the read began or ended (another view's read, `relay
    # inbox`): each may hold letters no read sees.
    readers: int = 0

    @property
    def short(self) -> bool:
        """The read stopped at its bound before the page was drawn whole."""
        return self.stopped in ("limit", "budget") and not self.more

    @property
    def partial(self) -> bool:
        """Letters the read may not have seen: another reader (a view elsewhere, ``relay
        inbox``, a requeue) was attached or took letters while it read, or letters came back
        (or arrived) meanwhile. A reader that holds letters by ``basic.get`` from before the
        read to after it leaves no trace a read can see: the count leaves its letters out
        too."""
        return not self.unreadable and (
            self.missed > 0 or self.depth_after > self.depth or self.readers > 0
        )


def letter_page(
    urls: Sequence[str],
    name: str,
    tls: TlsOptions | None,
    dead_queue: str,
    *,
    position: Position,
    bounds: Bounds,
) -> LetterPage:
    """The page of ``dead_queue`` at ``position``; read only when reading loses or
    reorders no letter (a classic queue without a delivery limit: others, their depth and
    why)."""
    with connected(urls, name, tls, dead_queue) as connection:
        depth, readers = look(connection, dead_queue)
        why = unreadable(connection, dead_queue)
        if why:
            return LetterPage([], depth, why)
        channel = connection.channel()
        # The letters through the page and one more, with a page's margin for letters come
        # back before the one it follows: a reader is sent as many as it may read, and
        # each sent beyond those read goes back by a separate reject.
        need = bounds.size + 1 + (position.at + 1 + bounds.size if position.after else 0)
        reader = Reader(channel, dead_queue, depth, min(bounds.limit, need), bounds.budget_s)
        found = not position.after
        shown: list[tuple[int, DeadLetter]] = []
        # In case the letter the page follows has left: the page from its position.
        instead: list[tuple[int, DeadLetter]] = []
        following = ""
        lost = more_instead = False
        # Closed at once when the page is full: its consumer cancelled before the look below.
        delivered = iter(reader)
        for index, (_tag, properties, body) in enumerate(delivered):
            # Described only when shown: most letters a deep page reads are passed over.
            mark = digest(properties, body)
            if found and len(shown) == bounds.size:
                following = mark
                break
            if found:
                shown.append((index, describe(properties, body)))
            elif mark == position.after:
                found = True
            elif position.then and mark == position.then:
                # The letter it followed has left; the one after it has not.
                found = lost = True
                shown.append((index, describe(properties, body)))
            elif index > position.at:
                if len(instead) < bounds.size:
                    instead.append((index, describe(properties, body)))
                else:
                    more_instead = True
        delivered.close()
        ended = reader.stopped in ("end", "idle")
        # Neither is there: the page starts at the place the letter it followed had.
        lost = lost or (not found and ended)
        # Ready while this read holds its own: when it ran dry before the depth, fewer than
        # the depth less what it read means another reader took some meanwhile.
        held, others = look(connection, dead_queue)
        after = put_back(connection, channel, dead_queue, held + reader.read)
    return LetterPage(
        shown if found else instead if lost else [],
        depth,
        read=reader.read,
        stopped=reader.stopped,
        more=bool(following) if found else more_instead and lost,
        following=following,
        lost=lost,
        found=found,
        missed=max(0, depth - reader.read - held) if reader.stopped == "idle" else 0,
        depth_after=after,
        readers=max(readers, others),
    )


def find_letter(
    urls: Sequence[str],
    name: str,
    tls: TlsOptions | None,
    dead_queue: str,
    *,
    wanted: str,
    bounds: Bounds,
) -> tuple[DeadLetter, pika.BasicProperties, bytes] | None:
    """The letter of digest ``wanted``, its properties and payload, when a read within
    ``bounds`` finds it (a classic queue's only); every letter put back."""
    with connected(urls, name, tls, dead_queue) as connection:
        depth = depth_of(connection, dead_queue)
        if unreadable(connection, dead_queue):
            return None
        channel = connection.channel()
        reader = Reader(channel, dead_queue, depth, bounds.limit, bounds.budget_s)
        hit = None
        for _tag, properties, body in reader:
            if digest(properties, body) == wanted:
                hit = (describe(properties, body), properties, body)
                break
        put_back(connection, channel, dead_queue, depth)
        return hit


@dataclass(frozen=True)
class LetterTally:
    """How many letters a choice matches: ``matched`` of the ``read`` letters a bounded read
    saw, of ``depth`` ready as it began; ``stopped`` as ``Reader.stopped``."""

    matched: int
    read: int
    depth: int
    stopped: str
    unreadable: str = ""


def tally(
    urls: Sequence[str],
    name: str,
    tls: TlsOptions | None,
    dead_queue: str,
    *,
    choose: Callable[[DeadLetter], bool],
    bounds: Bounds,
) -> LetterTally:
    """The letters of ``dead_queue`` that ``choose`` picks, counted by a read within
    ``bounds`` (a classic queue's only); every letter put back."""
    with connected(urls, name, tls, dead_queue) as connection:
        depth = depth_of(connection, dead_queue)
        if why := unreadable(connection, dead_queue):
            return LetterTally(0, 0, depth, "", why)
        channel = connection.channel()
        reader = Reader(channel, dead_queue, depth, bounds.limit, bounds.budget_s)
        matched = sum(1 for _tag, p, b in reader if choose(describe(p, b)))
        put_back(connection, channel, dead_queue, depth)
        return LetterTally(matched, reader.read, depth, reader.stopped)
