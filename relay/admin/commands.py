"""The operator's commands' arguments and output: ``relay status``, ``replay``, ``purge``.

Each works on PostgreSQL and SQLite through ``OutboxAdmin``; this module parses the
options, refuses unsafe input before touching anything, and prints what it found or did.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import datetime

from relay.admin_records import Selection
from relay.broker.destinations import display
from relay.constants import OUTBOX_BUCKETS, PURGE_CHUNK, RECENT_SENT_S, SPARK_STAGE_ABANDONED_S
from relay.db.outbox import OutboxAdmin
from relay.db.sink import OutboxSink
from relay.errors import InputError
from relay.records import OutboxRow
from relay.redact import redact_url
from relay.settings import Settings

EXIT_THRESHOLD = 3  # relay status: a --max-* threshold is exceeded
EXIT_NOT_KEPT = 4  # relay replay --sent: some selected messages are no longer kept whole

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SHOWN_ROWS = 20


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``7d``, ``1w`` -> seconds (positive)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive duration such as 90s, 15m, 2h or 7d"
        )
    return float(match[1]) * _UNITS[match[2] or "s"]


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def instant(text: str) -> datetime:
    """An ISO 8601 time with its offset: ``2026-11-24T10:00Z``, ``2026-11-24 11:00+01:00``."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time with its offset such as 2026-11-24T10:00Z"
        )
    return value


def _id_range(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not match or int(match[1]) > int(match[2]):
        raise argparse.ArgumentTypeError(f"{text!r} is not an id range such as 100-250")
    return int(match[1]), int(match[2])


def add_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    add_settings: Callable[[argparse.ArgumentParser], None],
) -> None:
    status = sub.add_parser(
        "status",
        parents=[common],
        help="show the outbox's state",
        description=status_command.__doc__,
    )
    add_settings(status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    over = f"exit {EXIT_THRESHOLD} when"
    status.add_argument(
        "--max-due", type=int, metavar="ROWS", help=f"{over} more rows than this are due"
    )
    status.add_argument(
        "--max-oldest-due",
        type=duration,
        metavar="AGE",
        help=f"{over} a row has been due longer than this (e.g. 5m)",
    )
    status.add_argument(
        "--max-parked", type=int, metavar="ROWS", help=f"{over} more rows than this are parked"
    )
    status.set_defaults(command="status", handler=status_command)

    replay = sub.add_parser(
        "replay",
        parents=[common],
        help="move parked (or sent) rows back to due",
        description=replay_command.__doc__,
    )
    add_settings(replay)
    replay.add_argument(
        "--id",
        type=_positive,
        action="append",
        default=[],
        dest="ids",
        metavar="ID",
        help="a row id (repeat)",
    )
    replay.add_argument(
        "--ids",
        type=_id_range,
        dest="id_range",
        metavar="FIRST-LAST",
        help="an inclusive range of row ids",
    )
    replay.add_argument("--reason", help="rows whose last error contains this text")
    replay.add_argument("--exchange", help="rows for this exchange")
    replay.add_argument(
        "--older-than",
        type=duration,
        metavar="AGE",
        help="rows created longer ago than this (e.g. 2h)",
    )
    replay.add_argument(
        "--sent",
        action="store_true",
        help="sent messages instead of parked rows (kept whole: RELAY_KEEP_SENT=messages)",
    )
    replay.add_argument(
        "--sent-since",
        type=instant,
        metavar="TIME",
        help="with --sent: messages sent at or after this time (e.g. 2026-11-24T10:00Z)",
    )
    replay.add_argument(
        "--sent-until",
        type=instant,
        metavar="TIME",
        help="with --sent: messages sent before this time",
    )
    replay.add_argument("--all", action="store_true", help="every parked (or sent) row")
    replay.add_argument("--dry-run", action="store_true", help="show the rows, change nothing")
    replay.set_defaults(command="replay", handler=replay_command)

    purge = sub.add_parser(
        "purge", parents=[common], help="delete old sent rows", description=purge_command.__doc__
    )
    add_settings(purge)
    purge.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="AGE",
        help="delete rows sent longer ago than this (e.g. 7d)",
    )
    purge.add_argument(
        "--chunk",
        type=_positive,
        default=PURGE_CHUNK,
        metavar="ROWS",
        help=f"rows deleted per transaction (default: {PURGE_CHUNK})",
    )
    purge.add_argument(
        "--stages-older-than",
        type=duration,
        default=float(SPARK_STAGE_ABANDONED_S),
        metavar="AGE",
        help="also drop the leftovers of killed atomic Spark writes: staging tables whose "
        "write_outbox is gone at once, others created longer ago than this "
        f"(default: {SPARK_STAGE_ABANDONED_S // 3600}h)",
    )
    purge.set_defaults(command="purge", handler=purge_command)


def status_command(settings: Settings, args: argparse.Namespace) -> int:
    """Show rows by status, the due backlog and its oldest row's age, pending rows that
    failed before by exchange and reason, and parked rows by reason. With --max-* thresholds,
    exit 3 when one is exceeded (for scripts and checks)."""
    admin = OutboxAdmin(settings.database_url)
    try:
        report = admin.status()
    finally:
        admin.close()
    limits = [
        ("due", report.due, args.max_due),
        ("oldest_due_age_seconds", report.oldest_due_age, args.max_oldest_due),
        ("parked", report.counts["parked"], args.max_parked),
    ]
    exceeded = [name for name, value, limit in limits if limit is not None and value > limit]
    recent = report.recent
    if args.json:
        print(
            json.dumps(
                {
                    "counts": report.counts,
                    "due": report.due,
                    "relays": report.relays,
                    "oldest_due_age_seconds": round(report.oldest_due_age, 3),
                    "parked_reasons": [{"reason": r, "rows": n} for r, n in report.parked_reasons],
                    "retrying": [
                        {"exchange": e, "reason": r, "rows": n} for e, r, n in report.retrying
                    ],
                    "recent": {
                        "seconds": RECENT_SENT_S,
                        "messages": recent.messages,
                        "latency_mean_seconds": round(recent.latency_mean, 3),
                        "latency_max_seconds": round(recent.latency_max, 3),
                    },
                    "duplicates_dropped": report.duplicates,
                    "exceeded": exceeded,
                }
            )
        )
    else:
        c = report.counts
        print(f"outbox at {redact_url(settings.database_url)}")
        print(f"  pending {c['pending']:>10}  (due {report.due}, in flight among them)")
        print(f"  sent    {c['sent']:>10}")
        print(f"  parked  {c['parked']:>10}")
        print(f"  dropped {report.duplicates:>10}  (written again after they were sent)")
        print(f"  oldest due row: due for {report.oldest_due_age:.1f} s")
        owners = ", ".join(f"{name} {n}" for name, n in report.relays.items())
        print(f"  buckets owned by relay ({OUTBOX_BUCKETS} in all): {owners or 'none'}")
        print(
            f"  sent in the last {RECENT_SENT_S:g} s: {recent.messages}, created to sent "
            f"{recent.latency_mean:.3f} s on average, {recent.latency_max:.3f} s at most"
        )
        if report.retrying:
            print("pending rows that failed before, by exchange and last error:")
            for exchange, reason, rows in report.retrying:
                print(f"  {rows:>10}  {display(exchange)}: {reason}")
        if report.parked_reasons:
            print("parked rows by last error:")
            for reason, rows in report.parked_reasons:
                print(f"  {rows:>10}  {reason}")
        for name in exceeded:
            print(f"threshold exceeded: {name}", file=sys.stderr)
    return EXIT_THRESHOLD if exceeded else 0


def replay_command(settings: Settings, args: argparse.Namespace) -> int:
    """Move parked rows back to pending, due now, with their attempt count reset, so the
    relays publish them again. Select rows with --id, --ids, --reason, --exchange and
    --older-than (together they narrow the selection), or --all. --dry-run only shows them.

    With --sent, sent messages are published again instead, with the same message ids,
    selected by the same options and by --sent-since and --sent-until. Only messages kept
    whole (RELAY_KEEP_SENT=messages) can be: of a message acked with RELAY_KEEP_SENT=ids
    only its id is kept (the dedupe horizon), and the command says how many of those the
    selection found and exits with 4."""
    first, last = args.id_range or (None, None)
    selection = Selection(
        tuple(args.ids),
        first,
        last,
        args.reason,
        args.exchange,
        args.older_than,
        args.sent_since,
        args.sent_until,
    )
    kind = "sent" if args.sent else "parked"
    if not args.sent and (args.sent_since or args.sent_until):
        raise InputError("--sent-since and --sent-until select sent messages: add --sent")
    if args.sent and args.reason:
        raise InputError("--reason selects parked rows by their error: sent messages have none")
    if bool(selection) == args.all:
        raise InputError(
            f"say which {kind} rows to replay: --id, --ids, --exchange, --older-than, "
            + ("--sent-since or --sent-until" if args.sent else "or --reason")
            + ", or --all for every one (not both)"
        )
    admin = OutboxAdmin(settings.database_url)
    try:
        count, shown = admin.replay(selection, args.dry_run, args.sent, _SHOWN_ROWS)
        not_kept = admin.not_kept(selection) if args.sent else 0
    finally:
        admin.close()
    for row in shown:
        print(_describe(row))
    if count > len(shown):
        print(f"... and {count - len(shown)} more")
    verb = "would replay" if args.dry_run else "replayed"
    print(f"{verb} {count} {kind} rows")
    if not_kept:
        print(
            f"{not_kept} sent messages of the selection are no longer kept: only their ids "
            "are, in the sent log (RELAY_KEEP_SENT=ids), so they cannot be replayed. To send "
            "one again, write it with a new message id.",
            file=sys.stderr,
        )
        return EXIT_NOT_KEPT
    return 0


def _describe(row: OutboxRow) -> str:
    where = f"exchange={row.exchange!r} routing_key={row.routing_key!r}"
    return f"{row.id}  {row.message_id}  {where}  attempts={row.attempts}  {row.last_error}"


def purge_command(settings: Settings, args: argparse.Namespace) -> int:
    """Delete sent rows older than --older-than, in chunks of their own transactions (no
    table lock, no long transaction), showing progress on a terminal. Pending and parked
    rows are never deleted. Also drops the Spark writer's abandoned staging tables."""
    show = sys.stderr.isatty()

    def progress(deleted: int) -> None:
        if show:
            print(f"\rpurged {deleted} rows ...", end="", file=sys.stderr, flush=True)

    admin = OutboxAdmin(settings.database_url)
    try:
        deleted = admin.purge(args.older_than, args.chunk, progress)
    finally:
        admin.close()
    if show and deleted:
        print(file=sys.stderr)
    print(f"purged {deleted} sent rows sent more than {args.older_than:g} s ago")
    sink = OutboxSink(settings.database_url)
    try:
        for table in sink.drop_abandoned_stages(args.stages_older_than):
            print(f"dropped abandoned staging table {table}")
    finally:
        sink.close()
    return 0
