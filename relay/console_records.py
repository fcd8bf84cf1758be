"""The values the console's pages and actions pass between the web layer and the database
(``relay.db.console``, ``relay.db.console_actions``): no I/O, no web framework. Here, beside
``relay.records`` and below both layers, not in ``relay.console``: the database builds and
reads them, and imports nothing of the console (``tests/unit/test_layers.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from relay.console_constants import CONSOLE_NAMED_IDS

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)  # each may do what the ones before it may


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts, as the audit log records them."""

    name: str
    role: str

    def may(self, role: str) -> bool:
        """Whether this actor's role is ``role`` or above it."""
        return ROLES.index(self.role) >= ROLES.index(role)


@dataclass(frozen=True, slots=True)
class Counted:
    """How many rows: exactly ``rows`` when ``exact``; else ``rows`` were counted before a
    count's budget ran out, and more are known to exist (``more``: "more than") or may
    (a cause's rows among those not read: "at least"). Never an estimate."""

    rows: int
    exact: bool = True
    more: bool = False

    def __add__(self, other: Counted) -> Counted:
        return Counted(self.rows + other.rows, self.exact and other.exact, self.more or other.more)

    def __str__(self) -> str:
        if self.exact:
            return str(self.rows)
        return f"{'more than' if self.more else 'at least'} {self.rows}"


@dataclass(frozen=True, slots=True)
class ParkedFilter:
    """Which parked rows a list, a count or a bulk action covers (empty fields match all).
    ``cause``: the chosen cause (``relay.causes``; ``relay.causes.UNSORTED``: the rows not
    given one yet)."""

    reason: str = ""  # a part of the last error
    cause: str = ""
    exchange: str = ""
    routing_key: str = ""
    ordering_key: str = ""
    message_id: str = ""
    message_prefix: str = ""  # the message id starts with it (byte by byte)
    parked_before: datetime | None = None  # parked at or before this time (an age)

    def described(self) -> dict[str, str]:
        """The fields set, as text (the audit log's target, a page's summary)."""
        shown = {
            "reason": self.reason,
            "cause": self.cause,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "ordering_key": self.ordering_key,
            "message_id": self.message_id,
            "message_prefix": self.message_prefix,
            "parked_before": self.parked_before.isoformat() if self.parked_before else "",
        }
        return {name: value for name, value in shown.items() if value}


@dataclass(frozen=True, slots=True)
class ArchiveFilter:
    """Which discarded rows the archive's page lists, counts and restores (empty fields
    match all): who discarded them (as the audit log names them), when (``since`` and
    ``until``, both included), their exchange, and a part of their last error. A bulk
    discard's done page links to the rows it archived, so that it can be undone whole."""

    discarded_by: str = ""
    exchange: str = ""
    reason: str = ""
    since: datetime | None = None
    until: datetime | None = None

    def described(self) -> dict[str, str]:
        """The fields set, as text (the audit log's target, a page's links)."""
        shown = {
            "discarded_by": self.discarded_by,
            "exchange": self.exchange,
            "reason": self.reason,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
        }
        return {name: value for name, value in shown.items() if value}


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page of parked rows ends: the next page's rows come before it, most recently
    parked first (a parked row's time is when it was parked)."""

    parked_at: datetime
    id: int


@dataclass(frozen=True, slots=True)
class RowSummary:
    id: int
    message_id: str
    exchange: str
    routing_key: str
    ordering_key: str | None
    attempts: int
    last_error: str
    parked_at: datetime
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RowDetail:
    summary: RowSummary
    status: str  # pending, parked, sent, or "discarded" for an archived row
    content_type: str
    headers: str | None
    payload: bytes  # at most the preview's size
    payload_size: int
    held: list[RowSummary] = field(default_factory=list)  # its key's pending rows behind it
    held_more: Counted = Counted(0)  # how many more than those listed
    edited_from: int | None = None
    edited_into: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Tally:
    """Parked rows of one key (a reason's prefix) that a count read: how many, and when the
    first and the last of them were parked."""

    rows: int
    first: datetime | None
    last: datetime | None


@dataclass(frozen=True, slots=True)
class CauseGroup:
    """Parked rows of one cause: its class and the stable part of its message."""

    cause: str
    rows: Counted
    first_parked: datetime | None
    last_parked: datetime | None


@dataclass(frozen=True, slots=True)
class Causes:
    """Parked rows by cause (``relay.causes.grouped``): the biggest causes listed, the rest
    summed on one line (their number, counted up to the index's walk's cap); and, when the
    count's budget ran out, the time at or before which parked rows were not read."""

    listed: list[CauseGroup]
    other_rows: Counted
    other_causes: Counted
    parked: Counted
    unread_before: datetime | None


@dataclass(frozen=True, slots=True)
class RelayPresence:
    owner: str
    protocol: int
    buckets: int
    fence: str  # "" when free to claim, else relay.buckets.Fence's value


@dataclass(frozen=True, slots=True)
class Overview:
    database: str
    pending: Counted
    due: Counted
    oldest_due_age: float
    sent_last_minute: Counted
    causes: Causes  # and the parked rows' count
    relays: list[RelayPresence]
    least_protocol: int
    archived: Counted
    drawn_at: datetime  # the database's time when it was read: the bound of its actions


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which audit entries a page lists (empty fields match all). ``actor``: the user as
    the entry names them, or an OpenID Connect user's subject alone (the entry names them
    ``preferred_username (sub)``, and the username is theirs to edit: the subject finds
    every entry of theirs, whatever it was). ``since``/``until``: the entry's time, both
    included."""

    actor: str = ""
    action: str = ""
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    rows: int
    result: str


def named(ids: Sequence[int | str], total: int) -> str:
    """Rows a change left, as its done page and its audit entry name them: the first ids
    (at most ``CONSOLE_NAMED_IDS``), and how many more of the ``total``."""
    shown = ", ".join(str(i) for i in ids[:CONSOLE_NAMED_IDS])
    rest = total - min(len(ids), CONSOLE_NAMED_IDS)
    return f"ids {shown}{f' and {rest} more' if rest > 0 else ''}" if shown else ""


# Why a change left rows it was given (``ActionResult.left_as``): a replay's or a discard's
# were no longer parked as the page showed them; a restore's were restored meanwhile, or
# their message id is in the outbox again (written anew).
LEFT_AS_SHOWN = "no longer as the page showed them"
LEFT_BY_RESTORE = "whose message id the outbox holds again, or restored meanwhile"


@dataclass(frozen=True, slots=True)
class LeftAfter:
    """Rows a change by filter leaves because they came after its bound (parked, or
    archived): how many, and the first ids (at most ``CONSOLE_NAMED_IDS``), which it names
    as left."""

    rows: int
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What a change did: rows changed; the rows named or matched that it left because
    they were no longer as the page showed them when their chunk came (another change took
    them meanwhile); and the rows its filter matches that were parked after its bound. Of
    each kind left, the first ids (``left_ids``, ``since_ids``: at most
    ``CONSOLE_NAMED_IDS``), so that the operator can look at them."""

    changed: int
    left: int = 0
    parked_since: int = 0
    new_ids: tuple[int, ...] = ()
    left_ids: tuple[int, ...] = ()
    since_ids: tuple[int, ...] = ()
    # What the rows left after the bound were then: parked, or archived (a restore's).
    since_as: str = "parked"
    # Why the rows given were left (``LEFT_AS_SHOWN``, ``LEFT_BY_RESTORE``).
    left_as: str = LEFT_AS_SHOWN

    def audited(self) -> str:
        """The change's result as its audit entry ends with it: ``done``, and what it left,
        named, and why."""
        why = []
        if self.left:
            why.append(
                f"left {self.left} {self.left_as}"
                + (f": {named(self.left_ids, self.left)}" if self.left_ids else "")
            )
        if self.parked_since:
            why.append(
                f"left {self.parked_since} {self.since_as} after the bound"
                + (f": {named(self.since_ids, self.parked_since)}" if self.since_ids else "")
            )
        return "; ".join(["done", *why])
