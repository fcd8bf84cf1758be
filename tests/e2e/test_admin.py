"""The admin commands (status, replay, purge) on SQLite and PostgreSQL, through the CLI."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.outbox import log_acked, rows
from relay.cli import main
from relay.db.schema import outbox, outbox_buckets

NOW = datetime.now(UTC)
DAY = timedelta(days=1)
HOUR = timedelta(hours=1)
# `relay status` rounds ages to milliseconds; SQLite's clock has milliseconds too.
AGE_RESOLUTION_S = 0.002


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() points the root logger at this test's captured stderr; put it back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def seed(url: str) -> None:
    """Ten sent rows (ids 1-10, sent an hour less than 1-10 days ago), four pending (two due
    for an hour, one in flight, one backing off after two attempts), five parked with two
    reasons on two exchanges. Relay r1 owns bucket 0 (every row's) for a day."""
    rows = [
        dict(status="sent", sent_at=NOW - i * DAY + HOUR, exchange="orders") for i in range(1, 11)
    ]
    refused = "failed: the broker refuses exchange 'billing': 404 NOT_FOUND"
    rows += [
        dict(status="pending", next_attempt_at=NOW - timedelta(hours=1), exchange="orders"),
        dict(status="pending", next_attempt_at=NOW - timedelta(minutes=1), exchange="orders"),
        dict(
            status="pending",
            next_attempt_at=NOW - timedelta(minutes=5),
            exchange="orders",
        ),
        dict(
            status="pending",
            next_attempt_at=NOW + DAY,
            exchange="billing",
            attempts=2,
            last_error=refused,
        ),
    ]
    rows += [
        dict(
            status="parked",
            exchange="orders",
            last_error="returned: NO_ROUTE",
            attempts=10,
            created_at=NOW - 3 * DAY,
        )
        for _ in range(3)
    ]
    rows += [
        dict(
            status="parked",
            exchange="audit",
            last_error="rejected: headers 50%_bad",
            attempts=1,
            created_at=NOW,
        )
        for _ in range(2)
    ]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for number, r in enumerate(rows, start=1):
            values = {
                "id": number,
                "message_id": f"m-{number}",
                "payload": b"p",
                "created_at": NOW - DAY,
                **r,
            }
            conn.execute(sa.insert(outbox).values(**values))
        owned = sa.update(outbox_buckets).where(outbox_buckets.c.bucket == 0)
        conn.execute(owned.values(owner="r1", lease_until=NOW + DAY))
    engine.dispose()


def run(url: str, *args: str) -> int:
    return main(list(args), {"RELAY_DATABASE_URL": url})


def table(url: str) -> dict[int, tuple[str, int]]:
    return {r.id: (r.status, r.attempts) for r in rows(url)}


def test_status_reports_counts_backlog_and_reasons(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    before = datetime.now(UTC)
    assert run(database_url, "status", "--json") == 0
    after = datetime.now(UTC)
    report = json.loads(capsys.readouterr().out)
    assert report["counts"] == {"pending": 4, "sent": 10, "parked": 5}
    assert (report["due"], report["relays"]) == (3, {"r1": 1})
    # Due for an hour when NOW was taken (at import: maybe minutes before this test ran), as
    # the database's clock read it during the command, rounded to milliseconds.
    low, high = ((HOUR + moment - NOW).total_seconds() for moment in (before, after))
    assert low - AGE_RESOLUTION_S <= report["oldest_due_age_seconds"] <= high + AGE_RESOLUTION_S
    assert report["parked_reasons"] == [
        {"reason": "returned: NO_ROUTE", "rows": 3},
        {"reason": "rejected: headers 50%_bad", "rows": 2},
    ]
    assert report["retrying"] == [
        {
            "exchange": "billing",
            "reason": "failed: the broker refuses exchange 'billing': 404 NOT_FOUND",
            "rows": 1,
        }
    ]
    assert report["exceeded"] == []

    assert run(database_url, "status") == 0
    human = capsys.readouterr().out
    assert "pending          4  (due 3, in flight among them)" in human
    assert "buckets owned by relay (64 in all): r1 1" in human
    assert "         3  returned: NO_ROUTE" in human
    assert "         1  billing: failed: the broker refuses exchange 'billing'" in human


@pytest.mark.parametrize(
    ("limits", "exceeded"),
    [
        (["--max-due", "3", "--max-parked", "5", "--max-oldest-due", "2h"], []),
        (["--max-due", "2"], ["due"]),
        (["--max-oldest-due", "30m", "--max-parked", "4"], ["oldest_due_age_seconds", "parked"]),
    ],
)
def test_status_thresholds_set_the_exit_code(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], limits: list[str], exceeded: list[str]
) -> None:
    seed(sqlite_url)
    assert run(sqlite_url, "status", "--json", *limits) == (3 if exceeded else 0)
    assert json.loads(capsys.readouterr().out)["exceeded"] == exceeded


def test_replay_dry_run_then_by_selection(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    before = table(database_url)
    assert run(database_url, "replay", "--reason", "NO_ROUTE", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would replay 3 parked rows" in out and "15  m-15  exchange='orders'" in out
    assert table(database_url) == before

    # LIKE wildcards in the reason are matched literally.
    assert run(database_url, "replay", "--reason", "50%_") == 0
    assert "replayed 2 parked rows" in capsys.readouterr().out
    assert [table(database_url)[i] for i in (18, 19)] == [("pending", 0)] * 2

    assert (
        run(database_url, "replay", "--exchange", "orders", "--older-than", "2d", "--ids", "1-15")
        == 0
    )
    assert "replayed 1 parked rows" in capsys.readouterr().out
    assert table(database_url)[15] == ("pending", 0)
    assert run(database_url, "replay", "--all") == 0
    assert "replayed 2 parked rows" in capsys.readouterr().out
    after = table(database_url)
    assert [s for s, _ in after.values()].count("parked") == 0
    assert {after[i] for i in range(1, 11)} == {("sent", 0)}  # sent rows are never replayed


def test_replay_sent_messages_kept_whole_and_say_which_are_not(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    # Two messages acked with RELAY_KEEP_SENT=ids: only their sent log entries are left.
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        for number in (30, 31):
            log_acked(conn, f"m-{number}", number, NOW - DAY, NOW - HOUR)
    engine.dispose()
    before = table(database_url)
    since = (NOW - 3 * DAY).isoformat()

    # Sent rows 1-3 were sent within three days; 30 and 31 too, but only their ids are kept.
    assert run(database_url, "replay", "--sent", "--sent-since", since, "--dry-run") == 4
    out, err = capsys.readouterr()
    assert "would replay 3 sent rows" in out and "1  m-1  exchange='orders'" in out
    assert "2 sent messages of the selection are no longer kept" in err
    assert table(database_url) == before

    until = (NOW - DAY).isoformat()  # sent before: rows 2-10, of which 2 and 3 since
    assert run(database_url, "replay", "--sent", "--sent-since", since, "--sent-until", until) == 0
    assert "replayed 2 sent rows" in capsys.readouterr().out
    assert run(database_url, "replay", "--sent", "--id", "10", "--exchange", "orders") == 0
    assert "replayed 1 sent rows" in capsys.readouterr().out
    after = table(database_url)
    assert [i for i in range(1, 11) if after[i] == ("pending", 0)] == [2, 3, 10]
    assert {after[i] for i in (1, *range(4, 10))} == {("sent", 0)}
    replayed = {r.id: r for r in rows(database_url) if r.id in (2, 3, 10)}
    assert all(r.sent_at is None and r.message_id == f"m-{i}" for i, r in replayed.items())

    assert run(database_url, "replay", "--sent", "--id", "31") == 4
    out, err = capsys.readouterr()
    assert "replayed 0 sent rows" in out and "1 sent messages of the selection" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay"], "say which parked rows to replay"),
        (["replay", "--sent"], "say which sent rows to replay"),
        (["replay", "--sent-since", "2026-11-24T10:00Z", "--all"], "add --sent"),
        (["replay", "--sent", "--reason", "NO_ROUTE"], "sent messages have none"),
        (
            ["replay", "--sent", "--sent-until", "2026-11-24T10:00"],
            "is not a time with its offset",
        ),
        (["replay", "--all", "--id", "3"], "say which parked rows to replay"),
        (["replay", "--ids", "9-3"], "'9-3' is not an id range"),
        (["replay", "--id", "-1"], "'-1' is not a positive whole number"),
        (["purge"], "the following arguments are required: --older-than"),
        (["purge", "--older-than", "0d"], "'0d' is not a positive duration"),
        (["purge", "--older-than", "7 days"], "'7 days' is not a positive duration"),
        (["purge", "--older-than", "7d", "--chunk", "0"], "'0' is not a positive whole number"),
    ],
)
def test_unsafe_input_is_refused_before_anything_changes(
    sqlite_url: str, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    seed(sqlite_url)
    before = table(sqlite_url)
    try:
        code = run(sqlite_url, *args)
    except SystemExit as exc:  # argparse refuses bad option values itself
        code = int(exc.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err
    assert table(sqlite_url) == before


def test_purge_deletes_only_old_sent_rows_in_chunks(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(database_url)
    assert run(database_url, "purge", "--older-than", "3d", "--chunk", "3") == 0
    assert "purged 7 sent rows" in capsys.readouterr().out
    left = table(database_url)
    assert sorted(i for i, (s, _) in left.items() if s == "sent") == [1, 2, 3]
    assert len(left) == 19 - 7  # every pending and parked row is still there
    assert run(database_url, "purge", "--older-than", "3d") == 0
    assert "purged 0 sent rows" in capsys.readouterr().out


def test_admin_on_an_unmigrated_database_says_to_run_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert run(url, "status") == 1
    assert "run `relay migrate`" in capsys.readouterr().err
