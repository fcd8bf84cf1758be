"""What an inbox consumer decides without I/O: whether a delivery can be keyed, what a failed
attempt leads to, what a dead letter says of why, and whether the dedupe window outlasts the
relay's memory of a message."""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType

from relay.constants import INBOX_KEY_MAX_BYTES, LAST_ERROR_MAX_CHARS
from relay.db.inbox_transaction import TransactionEnded
from relay.errors import RelayError, StoreError
from relay.records import (
    DEAD_ATTEMPTS,
    DEAD_CONSUMER,
    DEAD_ERROR,
    DEAD_FIRST_FAILURE,
    DEAD_LAST_FAILURE,
    DEAD_QUEUE,
    Answer,
    Delivery,
    Verdict,
)
from relay.settings import InboxSettings


def key_problem(delivery: Delivery) -> str | None:
    """Why the inbox cannot remember ``delivery`` (and so dead-letters it), or None. The
    broker carries any bytes in a message id or a header: pika hands a message id that is
    not UTF-8 over as bytes, and the databases refuse a NUL in text (PostgreSQL) or keep it
    where the others do not: none of those is a key, on every database alike."""
    name, raw = _raw_key(delivery)
    if raw is None:
        return "the message has neither a message_id nor a ce-id header: it cannot be deduplicated"
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            byte = raw[exc.start]
            return f"its {name} is not UTF-8 text (byte 0x{byte:02x} at {exc.start})"
    if not isinstance(raw, str):
        return f"its {name} is not text but {type(raw).__name__}"
    if "\x00" in raw:
        return f"its {name} holds a NUL character (at {raw.index(chr(0))})"
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > INBOX_KEY_MAX_BYTES:
        return f"its {name} is {size} bytes; the inbox keeps ids of at most {INBOX_KEY_MAX_BYTES}"
    return None


def _raw_key(delivery: Delivery) -> tuple[str, object]:
    """The value the inbox keys ``delivery`` on, as the broker gave it, and its name: the
    message id, else the ``ce-id`` header (a CloudEvents producer that sets no message id;
    ``relay.records.key_of`` gives it as text)."""
    if delivery.message_id:
        return "message_id", delivery.message_id
    ce_id = delivery.headers.get("ce-id")
    if ce_id is None or ce_id in ("", b""):  # a tuple: a header may be unhashable
        return "ce-id", None
    return "ce-id", ce_id


# A database error's facts that name no value: its SQLSTATE or error number, and the names of
# the constraint, table and column it concerns (``relay.db.dialects``'s ``error_facts``);
# None for an error that is not a database driver's.
Facts = Callable[[BaseException], list[str] | None]
# Code a handler runs through that is not its own: the standard library, this package, and
# the drivers and frameworks the inbox calls it through (a handler's own frames are the ones
# an operator needs; an application installed as a package is its own all the same).
_STDLIB = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_FRAMEWORKS = frozenset(
    [
        "relay",
        "sqlalchemy",
        "psycopg",
        "psycopg_pool",
        "MySQLdb",
        "pymysql",
        "aiomysql",
        "aiosqlite",
        "sqlite3",
        "greenlet",
        "pika",
        "aio_pika",
        "aiormq",
        "pamqp",
        "faststream",
        "fast_depends",
        "anyio",
        "pydantic",
        "pydantic_core",
    ]
)


def describe(error: BaseException, facts: Facts, *, messages: bool = False) -> str:
    """What an attempt's failure is recorded as (``x-inbox-error``, ``inbox_attempts``, the
    logs): the exception's type and where the handler raised it, with the types it was
    raised from, and a database error's facts (``Facts``). Never a message that may hold a
    payload or a statement's parameters: a database's message quotes values (PostgreSQL's
    ``DETAIL: Key (pan)=(4111...)``, MySQL's ``Duplicate entry '4111...'``), SQLAlchemy's
    lists the parameters, and ``int(text)``'s or a validation error's quote the input. Only
    with ``messages`` (``RELAY_INBOX_ERROR_MESSAGES``) is a non-database exception's own
    message kept. This package's own errors say what happened in words of its own, always
    (a database error's words excepted)."""
    parts = [_one(error, facts, messages)]
    place = _raised_at(error.__traceback__)
    if place:
        parts.append(f"at {place}")
    seen = {id(error)}
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen and len(seen) < _CAUSES_SHOWN:
        seen.add(id(cause))
        parts.append(f"from {_one(cause, facts, messages)}")
        cause = cause.__cause__ or cause.__context__
    return " ".join(parts)[:LAST_ERROR_MAX_CHARS]


# The causes named after an exception (a handler's error wrapping a database's, say).
_CAUSES_SHOWN = 3


def _one(error: BaseException, facts: Facts, messages: bool) -> str:
    name = type(error).__name__
    driver = getattr(error, "orig", None)  # SQLAlchemy's wrapper of the driver's error
    if isinstance(driver, BaseException):
        name = f"{name}: {type(driver).__name__}"
        known = facts(driver) or []
    else:
        found = facts(error)
        if found is None:
            return _described(error, name, messages)
        known = found
    return f"{name} ({', '.join(known)})" if known else name


def _described(error: BaseException, name: str, messages: bool) -> str:
    """An exception that is not a database's: its words where they are this package's own
    (or with ``messages``), else its name."""
    if isinstance(error, StoreError):
        return f"{name}: {error.summary}" if error.summary else name
    if not (isinstance(error, RelayError) or messages):
        return name
    try:
        text = str(error).strip()
    except Exception:  # an exception whose own str() fails: its name
        return name
    return f"{name}: {text.splitlines()[0]}" if text else name


def _raised_at(tb: TracebackType | None) -> str:
    """The innermost frame of the traceback in code of the handler's own (not the standard
    library's, an installed package's, or this package's), as ``module:line in function``;
    the innermost frame of all where there is none."""
    innermost, own = "", ""
    while tb is not None:
        code = tb.tb_frame.f_code
        module = tb.tb_frame.f_globals.get("__name__", code.co_filename)
        innermost = f"{module}:{tb.tb_lineno} in {code.co_name}"
        if not _library(module, code.co_filename):
            own = innermost
        tb = tb.tb_next
    return own or innermost


def _library(module: str, filename: str) -> bool:
    return (
        module.partition(".")[0] in _FRAMEWORKS
        or filename.startswith("<frozen")
        or os.path.abspath(filename).startswith(_STDLIB)
    )


@dataclass(frozen=True)
class RetrySchedule:
    """When a failed message is tried again: ``immediate`` failures at once, then after
    ``first_delay`` seconds doubling up to ``max_delay``; the ``max_attempts``-th failure
    dead-letters it."""

    max_attempts: int
    immediate: int
    first_delay: float
    max_delay: float

    @classmethod
    def of(cls, inbox: InboxSettings) -> RetrySchedule:
        return cls(
            inbox.inbox_max_attempts,
            inbox.inbox_immediate_retries,
            inbox.inbox_retry_delay,
            inbox.inbox_retry_delay_max,
        )

    def delays(self) -> list[float]:
        """Every delay the schedule can ask for, shortest first (a retry queue each)."""
        found = {self.after(n).delay for n in range(1, self.max_attempts)}
        return sorted(found - {0.0})

    def after(self, attempts: int) -> Answer:
        """What the ``attempts``-th failure leads to: again at once, again after a delay, or
        the dead-letter exchange when it was the last one allowed."""
        if attempts >= self.max_attempts:
            return Answer(Verdict.DEAD_LETTER)
        delayed = attempts - self.immediate
        if delayed <= 0:
            return Answer(Verdict.RETRY)
        # Doubling, in whole milliseconds (a retry queue's TTL), up to the longest.
        delay = min(self.first_delay * 2 ** min(delayed - 1, 62), self.max_delay)
        return Answer(Verdict.DELAY, round(delay, 3))


def too_many_before(attempts: int, max_attempts: int) -> bool:
    """A delivery that comes again with ``attempts`` failures counted (its earlier runs that
    raised, or died inside the handler) is dead-lettered unhandled when they used up the
    allowance: a handler that kills its consumer is never seen to fail, only to come back."""
    return attempts >= max_attempts


def kept_key(last_error: str | None) -> bool:
    """Whether a message's last failure recorded (``inbox_attempts.last_error``) is a dead
    letter with its key kept (``relay.inbox.flow``'s ``_not_again``: one of
    ``KEPT_KEY_REASONS``, as ``describe`` words it)."""
    return last_error is not None and last_error.startswith(_KEPT_KEY_WORDS)


def window_problem(window: float, retention: float) -> str | None:
    """Why a dedupe window of ``window`` seconds lets a message the relay can still send
    again be processed twice, or None (0: forever, for both)."""
    if window == 0:
        return None
    if retention == 0:
        return (
            f"RELAY_INBOX_DEDUPE_WINDOW={window:g} s, while the relay keeps sent messages "
            "forever (RELAY_RETENTION=0): a message replayed after the window is processed again"
        )
    if window <= retention:
        return (
            f"RELAY_INBOX_DEDUPE_WINDOW={window:g} s is not longer than the relay's "
            f"RELAY_RETENTION={retention:g} s: a message replayed (relay replay --sent) or "
            "written again after the window is processed again"
        )
    return None


# Why a run is dead-lettered at once, never run again (``Flow._not_again``).
COMMITTED_IN_PART = (
    "the handler committed a part of its work past the inbox's transaction (the message's "
    "key with it), then failed: dead-lettered, not run again, since that part would be done "
    "twice"
)
ENDED_KEY_COMMITTED = (
    "the handler's transaction ended under it (past the inbox's transaction) and the "
    "message's key is committed: by the handler's own commit past it, or by another delivery "
    "of the message run meanwhile, which cannot be told apart here: dead-lettered, its key "
    "kept, not run again, since its work would be done twice"
)
NOT_UNDONE = (
    "the handler wrote to a table its database cannot roll back (MariaDB's and MySQL's "
    "MyISAM, Aria, MEMORY: the rollback warned so), then failed: what it wrote there stays, "
    "so the message is dead-lettered, its key kept, not run again"
)
WENT_ON = (
    "the handler's transaction was rolled back under it (past the inbox's transaction, or by "
    "a statement that rolls back as it fails) and its connection ran on after: what it did "
    "then may have been committed, so the message is dead-lettered, its key kept, not run "
    "again"
)


def dead_letter_headers(
    consumer: str,
    queue: str,
    error: str,
    attempts: int,
    *,
    first_failure: datetime | None = None,
    last_failure: datetime | None = None,
) -> dict[str, object]:
    """Why a message was dead-lettered, as its headers: the error (the exception's type and
    message, or why the message has no key: never a payload or a statement's parameters),
    the failed attempts, which consumer of which queue, and when it first and last failed
    (RFC 3339, UTC)."""
    headers: dict[str, object] = {
        DEAD_ERROR: error[:LAST_ERROR_MAX_CHARS],
        DEAD_ATTEMPTS: attempts,
        DEAD_CONSUMER: consumer,
        DEAD_QUEUE: queue,
    }
    for name, at in ((DEAD_FIRST_FAILURE, first_failure), (DEAD_LAST_FAILURE, last_failure)):
        if at is not None:
            headers[name] = at.astimezone(UTC).isoformat(timespec="milliseconds")
    return headers


def dead_letter_queue(queue: str) -> str:
    """The queue the inbox consuming ``queue`` dead-letters to, with the reasons."""
    return f"{queue}.dead-letters"


# Why a run is dead-lettered with its key kept: each such failure is recorded starting so.
KEPT_KEY_REASONS = (COMMITTED_IN_PART, ENDED_KEY_COMMITTED, NOT_UNDONE, WENT_ON)
_KEPT_KEY_WORDS = tuple(
    f"{TransactionEnded.__name__}: {reason}"[:LAST_ERROR_MAX_CHARS] for reason in KEPT_KEY_REASONS
)
