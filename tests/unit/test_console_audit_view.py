"""The audit page's words for an entry's target, a refused attempt's target as kept, and the
audit page's filter as read from its query."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from relay.console.audit_view import target_text
from relay.console.forms import audit_filter
from relay.console.refusals import attempted
from relay.console_records import ArchiveFilter, ParkedFilter
from relay.db.console_audit_log import target_of
from relay.errors import InputError

BOUND = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_filters_target_reads_as_its_fields_and_its_bound() -> None:
    cause = "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'"
    target = target_of(None, ParkedFilter(cause=cause, exchange="orders"), BOUND)
    assert len(target) < 300  # the cause by its text, never its errors' texts
    assert target_text(target) == [
        f"filter: cause “{cause}”; exchange “orders”",
        "as the page drawn at 2026-11-29T12:00:00+00:00 showed",
    ]
    assert target_text(target_of(None, ParkedFilter(), BOUND))[0] == "filter: every parked row"


def test_ids_read_as_the_first_of_them_and_how_many_more() -> None:
    assert target_text(target_of(range(1, 31), None, BOUND))[0] == (
        "rows: ids " + ", ".join(map(str, range(1, 21))) + " and 10 more"
    )
    edit = json.dumps({"id": 7, "changed": ["exchange", "payload"]})
    assert target_text(edit) == ["row 7, its exchange, payload changed"]
    assert target_text("not json") == ["not json"]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"scope": "letters", "letters": ["d1", "d2"]}, "queue q: 2 letters: d1, d2"),
        (
            {"scope": "reason", "reason": "tenant-7 "},
            "queue q: letters whose reason contains “tenant-7 ”",
        ),
        ({"scope": "all"}, "queue q: every letter"),
        ({"message_ids": ["m1"]}, "queue q: 1 letters: m1"),  # an older release's entry
        ({}, "queue q"),
    ],
)
def test_a_dead_letter_changes_target_says_which_letters_it_took(
    fields: dict[str, object], said: str
) -> None:
    assert target_text(json.dumps({"queue": "q", **fields})) == [said]


def test_a_restores_filter_reads_as_the_archives_fields() -> None:
    chosen = ArchiveFilter(discarded_by="otto", since=BOUND, until=BOUND)
    assert target_text(target_of(None, chosen, BOUND))[0] == (
        "filter: discarded by “otto”; from “2026-11-29T12:00:00+00:00”; "
        "to “2026-11-29T12:00:00+00:00”"
    )


def test_a_refused_attempt_keeps_what_it_asked_for_cut_short() -> None:
    posted = [("csrf", "t"), ("action", "replay"), ("bound", "2100-01-01T00:00:00+00:00")]
    many = [("id", str(n)) for n in range(100)]
    kept = json.loads(attempted(posted + many))
    assert kept == {
        "ids": [str(n) for n in range(20)],
        "ids_posted": 100,
        "bound": "2100-01-01T00:00:00+00:00",
    }
    by_filter = json.loads(attempted([("scope", "filter"), ("exchange", "x" * 5000)]))
    assert by_filter == {"filter": {"exchange": "x" * 200}}
    assert "t" not in json.loads(attempted(posted)).values()  # never the CSRF token


def test_the_audit_filter_reads_a_browsers_times_as_utc() -> None:
    chosen = audit_filter({"user": " 3f2a ", "since": "2026-11-29T12:05", "until": ""})
    assert chosen.actor == "3f2a" and chosen.since == datetime(2026, 11, 29, 12, 5, tzinfo=UTC)
    with pytest.raises(InputError, match="since"):
        audit_filter({"since": "yesterday"})
    with pytest.raises(InputError, match="later than until"):
        audit_filter({"since": "2026-11-29T12:05", "until": "2026-11-29T12:00"})


def test_a_refused_edit_names_its_row_and_never_its_values() -> None:
    posted = [("id", "42"), ("csrf", "t"), ("exchange", "secret-x"), ("payload", "{}")]
    assert json.loads(attempted(posted)) == {"ids": ["42"], "ids_posted": 1}
