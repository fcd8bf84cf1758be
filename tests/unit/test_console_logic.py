"""The console's pure pieces: causes, password hashes, signed sessions and their CSRF tokens,
the login limiter, a proxy's addresses and groups, form fields, payload previews, the users
file and the settings' refusals."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pika
import pytest

from relay.broker.deadletter_pages import Position
from relay.causes import UNSORTED, cause_of, grouped, stored_cause
from relay.console import forms
from relay.console.forms import (
    archive_filter,
    audit_filter,
    cursor,
    edited,
    ids,
    instant,
    parked_filter,
    preview,
)
from relay.console.identity import from_proxy, groups_of, role_of
from relay.console.limiter import HashGate, LoginLimiter
from relay.console.oidc import party_problem
from relay.console.passwords import hash_password, hash_problem, verify_password
from relay.console.sessions import Sessions, Signer
from relay.console.users import parse_users
from relay.console.users_file import UsersFile
from relay.console_constants import CONSOLE_LOGIN_ADDRESS_SHARE, CONSOLE_LOGIN_NAME_SHARE
from relay.console_records import ActionResult, Actor, Counted, ParkedFilter, Tally
from relay.constants import CAUSE_MAX_CHARS
from relay.errors import ConfigError, InputError
from relay.settings import ConsoleSettings
from relay.settings.console import networks

SECRET = secrets.token_urlsafe(48)  # made at each run: one written here is published


@pytest.mark.parametrize(
    "error, cause",
    [
        ("returned: 312 NO_ROUTE", "returned: 312 NO_ROUTE"),
        (
            "failed: 404 NOT_FOUND - no exchange 'orders-7' in vhost '/'",
            "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'",
        ),
        ("nacked", "nacked"),
        ("TimeoutError: took 5.3 s on row 8d3f2a1b9c", "TimeoutError: took # s on row #"),
        ("KeyError: 'order 5b1f2c3a-0d4e-4f5a-9b8c-7d6e5f4a3b2c'", "KeyError: '…'"),
        ('rejected: header "x-id" is not text', "rejected: header '…' is not text"),
        ("  spaces   inside  ", "spaces inside"),
        ("", "(no error)"),
        ("<script>alert(1)</script>", "<script>alert(#)</script>"),
        ("rejected: payload of 512 bytes", "rejected: payload of # bytes"),
        (
            "failed: 406 PRECONDITION_FAILED - inequivalent arg",
            "failed: 406 PRECONDITION_FAILED - inequivalent arg",
        ),
        ("nacked: 312 times", "nacked: # times"),
    ],
)
def test_a_cause_is_the_class_and_the_stable_part_of_the_message(error: str, cause: str) -> None:
    assert cause_of(error) == cause


@pytest.mark.parametrize(
    "counted, shown",
    [
        (Counted(70008), "70008"),
        (Counted(10000, exact=False, more=True), "more than 10000"),
        (Counted(12, exact=False), "at least 12"),
        (Counted(2) + Counted(3), "5"),
        (Counted(2) + Counted(3, exact=False), "at least 5"),
        (Counted(2, exact=False) + Counted(3, exact=False, more=True), "more than 5"),
    ],
)
def test_a_count_says_exactly_what_was_counted(counted: Counted, shown: str) -> None:
    assert str(counted) == shown


AT = datetime(2026, 11, 29, tzinfo=UTC)
MISSING = "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'"
NO_ROUTE = "returned: 312 NO_ROUTE"


def tally(rows: int) -> Tally:
    return Tally(rows, AT, AT + timedelta(seconds=rows))


def test_a_cause_is_stored_from_the_whole_error() -> None:
    """600 tenants' exchanges are 600 texts and one cause; and one error naming 600 tenants
    is one cause whichever it names: read from its first 200 characters, a cut inside a
    quoted name made 335 causes of one (an outside review)."""
    one = "failed: 404 NOT_FOUND - no exchange 'tenant-{}' in vhost '/'"
    assert {stored_cause(one.format(i)) for i in range(600)} == {MISSING}
    named = "failed: 404 NOT_FOUND - no exchanges {} in vhost '/'"
    errors = [
        named.format(", ".join(f"'tenant-{i + shift}'" for i in range(600)))
        for shift in (0, 7, 1000)
    ]
    assert len({error[:200] for error in errors}) == 3
    assert len({stored_cause(error) for error in errors}) == 1
    assert len(stored_cause(errors[0])) <= CAUSE_MAX_CHARS


@pytest.mark.parametrize(
    "tallies, found, listed, shown, other",
    [
        ({}, ([], True), 50, [], (Counted(0), Counted(0))),
        (
            {MISSING: tally(1200), NO_ROUTE: tally(5)},
            ([MISSING, NO_ROUTE], True),
            1,
            [(MISSING, "1200")],
            (Counted(5), Counted(1)),
        ),
        # Rows parked by a relay of the release before, not sorted yet: a line of their own.
        (
            {None: tally(7), NO_ROUTE: tally(5)},
            ([NO_ROUTE], True),
            50,
            [(UNSORTED, "7"), (NO_ROUTE, "5")],
            (Counted(0), Counted(0)),
        ),
        (
            {f"Err{i}: no": tally(i + 1) for i in range(10_000)},
            ([], True),
            2,
            [("Err9999: no", "10000"), ("Err9998: no", "9999")],
            (Counted(sum(range(1, 9_999))), Counted(9_998)),
        ),
        # The index of causes walked up to its cap: more causes than it counted.
        (
            {NO_ROUTE: tally(5)},
            ([NO_ROUTE, "rare: x"], False),
            1,
            [(NO_ROUTE, "5")],
            (Counted(0, exact=False, more=True), Counted(1, exact=False, more=True)),
        ),
    ],
)
def test_every_cause_is_listed_or_counted_on_the_other_line(
    tallies: dict[str | None, Tally],
    found: tuple[list[str], bool],
    listed: int,
    shown: list[tuple[str, str]],
    other: tuple[Counted, Counted],
) -> None:
    causes = grouped(tallies, True, None, found=found[0], found_all=found[1], listed=listed)
    assert [(g.cause, str(g.rows)) for g in causes.listed] == shown
    assert (causes.other_rows, causes.other_causes) == other
    assert causes.parked == Counted(sum(t.rows for t in tallies.values()))


def test_no_error_takes_the_unsorted_rows_line() -> None:
    """An error reading as the unsorted rows' label had its cause: the two lines were one,
    and a row counted on none (an outside review)."""
    assert stored_cause(UNSORTED) != UNSORTED
    causes = grouped({None: tally(3), stored_cause(UNSORTED): tally(1)}, True, None)
    assert sorted(str(g.rows) for g in causes.listed) == ["1", "3"]
    assert sum(g.rows.rows for g in causes.listed) == causes.parked.rows == 4


def test_rows_without_a_cause_the_walk_did_not_reach_keep_their_line() -> None:
    causes = grouped({NO_ROUTE: tally(5)}, False, AT, found=[NO_ROUTE, None])
    assert [(g.cause, str(g.rows)) for g in causes.listed] == [
        (NO_ROUTE, "at least 5"),
        (UNSORTED, "more than 0"),
    ]


def test_a_cause_counted_by_a_walk_that_stopped_is_at_least_what_it_read() -> None:
    """And a cause the index of causes has that the walk did not reach is listed too."""
    causes = grouped({MISSING: tally(6)}, False, AT, found=[MISSING, "rare: x"])
    assert [(g.cause, str(g.rows)) for g in causes.listed] == [
        (MISSING, "at least 6"),
        ("rare: x", "more than 0"),
    ]
    assert str(causes.parked) == "more than 6"
    assert (causes.listed[0].first_parked, causes.listed[0].last_parked) == (
        AT,
        AT + timedelta(seconds=6),
    )
    assert causes.unread_before == AT


def test_a_password_hash_is_salted_and_verifies_only_its_password() -> None:
    first, second = hash_password("pw"), hash_password("pw")
    assert first != second and first.startswith("scrypt$32768$8$1$")
    assert verify_password("pw", first) and not verify_password("pW", first)
    assert hash_problem(first) is None


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "plain",
        "bcrypt$1$2$3$4$5",
        "scrypt$3$8$1$AA==$AA==",
        "scrypt$x$8$1$AA==$AA==",
        "scrypt$4$8$1$!!$AA==",
    ],
)
def test_a_malformed_hash_is_named_and_never_verifies(stored: str) -> None:
    assert hash_problem(stored) is not None and not verify_password("", stored)


def test_a_session_ends_after_its_idle_time_and_a_tampered_one_is_refused() -> None:
    sessions = Sessions(SECRET, idle=60, lifetime=3600)
    cookie = sessions.issue("otto", "operator", now=1000)
    session = sessions.read(cookie, now=1059)
    assert session is not None and (session.user, session.role) == ("otto", "operator")
    assert sessions.read(cookie, now=1061) is None
    renewed = sessions.renewed(session, now=1059)
    assert sessions.read(renewed, now=1110) == session  # its idle time started again
    body, mac = cookie.split(".")
    assert sessions.read(body[:-2] + "xx." + mac, now=1001) is None
    assert Sessions("t" * 40, idle=60, lifetime=3600).read(cookie, now=1001) is None  # another key
    assert Signer(SECRET, "login").unsign(cookie, 60, 1001) is None  # another purpose


def test_a_session_ends_at_its_lifetime_however_often_it_is_renewed() -> None:
    sessions = Sessions(SECRET, idle=60, lifetime=300)
    cookie = sessions.issue("otto", "operator", now=1000)
    for now in range(1050, 1300, 50):  # used every 50 s, never idle
        session = sessions.read(cookie, now)
        assert session is not None and session.began == 1000
        cookie = sessions.renewed(session, now)
    assert sessions.read(cookie, now=1300) is not None
    assert sessions.read(cookie, now=1301) is None
    assert session is not None and sessions.ends_at(session) == 1300


def test_a_csrf_token_is_its_sessions_own() -> None:
    sessions = Sessions(SECRET, idle=60, lifetime=3600)
    one = sessions.read(sessions.issue("a", "operator", 0), 0)
    two = sessions.read(sessions.issue("a", "operator", 0), 0)
    assert one is not None and two is not None
    assert sessions.csrf_ok(one, sessions.csrf(one))
    assert not sessions.csrf_ok(one, sessions.csrf(two))
    assert not sessions.csrf_ok(one, None) and not sessions.csrf_ok(one, "")


def test_failed_logins_lock_a_name_out_from_its_address_only_until_the_window_passes() -> None:
    limiter = LoginLimiter(attempts=3, window=300)
    for t in range(3):
        assert limiter.reserve("otto", "10.0.0.1", t) is not None  # each a failure
    assert limiter.reserve("otto", "10.0.0.1", 10) is None
    # A guesser at 10.0.0.1 does not lock otto out at his own address, nor ada at theirs.
    assert limiter.reserve("otto", "10.0.0.2", 10) is not None
    assert limiter.reserve("ada", "10.0.0.1", 10) is not None
    assert limiter.reserve("otto", "10.0.0.1", 300.5) is not None


def test_an_address_failing_with_many_names_is_refused() -> None:
    limiter = LoginLimiter(attempts=3, window=300)
    allowed = [limiter.reserve(f"name-{n}", "10.0.0.1", 1) for n in range(100)]
    assert sum(a is not None for a in allowed) == 3 * CONSOLE_LOGIN_ADDRESS_SHARE
    assert limiter.reserve("otto", "10.0.0.2", 1) is not None


def test_a_name_failing_from_many_addresses_is_refused_from_all() -> None:
    """Addresses made up (a host application believing ``X-Forwarded-For``) or spread: one
    name's failures are bounded in the window, whatever addresses they came from."""
    limiter = LoginLimiter(attempts=3, window=300)
    allowed = [limiter.reserve("otto", f"10.0.{n}.1", 1) for n in range(100)]
    assert sum(a is not None for a in allowed) == 3 * CONSOLE_LOGIN_NAME_SHARE
    assert limiter.reserve("ada", "10.0.200.1", 1) is not None
    assert limiter.reserve("otto", "10.0.200.1", 301) is not None


def test_attempts_sent_at_once_are_counted_before_their_passwords_are_checked() -> None:
    limiter = LoginLimiter(attempts=5, window=300)
    # 100 attempts reserved before any password check has finished: 5 may be checked.
    attempts = [limiter.reserve("ada", "10.0.0.1", 1) for _ in range(100)]
    checked = [a for a in attempts if a is not None]
    assert len(checked) == 5
    limiter.succeeded(checked[0])  # the right password gives its attempt back
    assert limiter.reserve("ada", "10.0.0.1", 2) is not None
    assert limiter.reserve("ada", "10.0.0.1", 2) is None


def test_the_limiter_forgets_names_whose_failures_left_the_window() -> None:
    limiter = LoginLimiter(attempts=3, window=300)
    for n in range(100):
        limiter.reserve(f"guess-{n}", f"10.0.{n}.1", now=n)
    limiter.forget_before(now=350)
    assert len(limiter) == 3 * 49  # the failures at 51 to 99 (a pair, an address, a name)


def test_password_checks_at_once_are_bounded() -> None:
    gate = HashGate(2)
    assert gate.enter() and gate.enter()
    assert not gate.enter()
    gate.leave()
    assert gate.enter()


@pytest.mark.parametrize(
    "address, trusted",
    [
        ("10.0.0.7", True),
        ("10.0.0.8", False),
        ("10.1.2.3", True),
        ("::1", False),
        ("x", False),
        (None, False),
    ],
)
def test_proxy_headers_are_believed_from_the_proxys_addresses_only(
    address: str | None, trusted: bool
) -> None:
    assert from_proxy(address, networks("10.0.0.7, 10.1.0.0/16")) is trusted


def test_a_role_is_the_highest_of_the_users_groups() -> None:
    settings = ConsoleSettings.load(
        {"RELAY_CONSOLE_VIEWER_GROUPS": "staff", "RELAY_CONSOLE_ADMIN_GROUPS": "leads"}
    )
    assert role_of(groups_of("staff, leads"), settings) == "admin"
    assert role_of(groups_of("staff"), settings) == "viewer"
    assert role_of(groups_of("others"), settings) is None
    assert Actor("a", "admin").may("operator") and not Actor("v", "viewer").may("operator")


def test_form_fields_are_checked() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    chosen = parked_filter({"exchange": "' OR 1=1 --", "parked_for": "2h"}, now)
    assert chosen.exchange == "' OR 1=1 --" and chosen.parked_before == now - timedelta(hours=2)
    # A cause with no row (any more) selects none: its page is empty, its count 0.
    assert parked_filter({"cause": "gone"}, now) == ParkedFilter(cause="gone")
    # The rows being sorted leave a change's filter as it runs: no change by them.
    assert forms.change_filter({"cause": NO_ROUTE}, now) == ParkedFilter(cause=NO_ROUTE)
    with pytest.raises(InputError, match="giving these rows their causes"):
        forms.change_filter({"cause": UNSORTED}, now)
    for bad in (
        {"message_id": "a\x00b"},
        {"parked_for": "soon"},
        {"exchange": "x" * 1001},
        # The calendar's ends: each was a 500 or a 503 from an overflow (outside review).
        {"parked_for": "999999d"},
        {"parked_before": "0001-01-01T00:00+14:00"},
        {"parked_before": "9999-12-31T23:59:59-14:00"},
    ):
        with pytest.raises(InputError):
            parked_filter(bad, now)
    for field, value in (("since", "0001-01-01T00:00:00"), ("until", "9999-12-31T23:59")):
        with pytest.raises(InputError):
            audit_filter({field: value})
        with pytest.raises(InputError):
            archive_filter({field: value})
    with pytest.raises(InputError):
        instant({"bound": "0001-01-01T00:00:10+00:00"}, "bound")
    with pytest.raises(InputError):
        cursor({"after_t": "0001-01-01T00:00+14:00", "after_id": "3"})
    assert cursor({}) is None
    with pytest.raises(InputError):
        cursor({"after_id": "3"})
    with pytest.raises(InputError):
        ids(["1", "x"])
    assert ids(["3", "1", "3"]) == [1, 3]


@pytest.mark.parametrize(
    "payload, size, kind, shown",
    [
        (b"<b>hi</b>", 9, "text", "<b>hi</b>"),
        (b"caf\xc3", 9, "text", "caf"),  # a character cut at the preview's end
        (b"\xff\x00", 2, "hex", f"00000000  {'ff 00':<47}  .."),
        (b"a\x00b", 3, "hex", f"00000000  {'61 00 62':<47}  a.b"),
        (b"", 0, "text", ""),
    ],
)
def test_a_preview_is_text_or_a_hex_dump(payload: bytes, size: int, kind: str, shown: str) -> None:
    assert preview(payload, size) == (kind, shown)


@pytest.mark.parametrize(
    "original, submitted, multiline, stored",
    [
        ('{"a":1}\n', '{"a":1}\r\n', True, None),  # unchanged: the row's bytes kept
        ("a\rb", "a\r\nb", True, None),
        ("\nhello", "\r\nhello", True, None),
        ("crlf\r\n", "crlf\r\n", True, None),
        ("x\ny", "x\r\nz", True, "x\nz"),  # changed: LF as the original had it
        ("x\r\ny", "x\r\nz", True, "x\r\nz"),  # the original had CRs: kept as posted
        (None, "new\r\n", True, "new\n"),
        ("orders", "orders", False, None),
        ("or\nders", "orders", False, None),  # an input drops line breaks
        ("orders", "billing", False, "billing"),
    ],
)
def test_an_edit_forms_field_is_stored_only_when_changed(
    original: str | None, submitted: str, multiline: bool, stored: str | None
) -> None:
    assert edited(original, submitted, multiline) == stored


@pytest.mark.parametrize(
    "claims, problem",
    [
        ({"aud": "console"}, None),
        ({"aud": ["console"]}, None),
        ({"aud": ["console", "other"], "azp": "console"}, None),
        ({"aud": ["console", "other"]}, "it has several audiences and no authorized party (azp)"),
        (
            {"aud": ["console", "other"], "azp": "other"},
            "its authorized party (azp) is not console",
        ),
        ({"aud": "console", "azp": "other"}, "its authorized party (azp) is not console"),
    ],
)
def test_an_id_token_is_this_clients_only_when_its_authorized_party_says_so(
    claims: dict[str, object], problem: str | None
) -> None:
    assert party_problem(claims, "console") == problem


def test_the_users_file_names_its_bad_line_and_never_a_hash() -> None:
    good = hash_password("pw")
    users = parse_users(f"# ops\n\nada:admin:{good}\n", "users")
    assert users["ada"].role == "admin"
    for text, said in (
        ("ada:root:" + good, "users:1: role 'root'"),
        ("ada:admin", "users:1: expected name:role:hash"),
        ("ada:admin:nothash", "users:1: not a scrypt hash"),
        (f"ada:admin:{good}\nada:viewer:{good}", "users:2: user 'ada' is listed twice"),
    ):
        with pytest.raises(ConfigError) as refused:
            parse_users(text, "users")
        assert str(refused.value).startswith(said) and good not in str(refused.value)


@pytest.mark.parametrize(
    "environ, problem",
    [
        ({}, "RELAY_CONSOLE_AUTH is not set"),
        ({"RELAY_CONSOLE_AUTH": "users", "RELAY_CONSOLE_SESSION_SECRET": "short"}, "at least 32"),
        (
            {"RELAY_CONSOLE_AUTH": "users", "RELAY_CONSOLE_SESSION_SECRET": SECRET},
            "RELAY_CONSOLE_USERS_FILE",
        ),
        (
            {"RELAY_CONSOLE_AUTH": "proxy", "RELAY_CONSOLE_SESSION_SECRET": SECRET},
            "PROXY_ADDRESSES",
        ),
        ({"RELAY_CONSOLE_AUTH": "oidc", "RELAY_CONSOLE_SESSION_SECRET": SECRET}, "OIDC_ISSUER"),
    ],
)
def test_the_console_is_closed_by_default(environ: dict[str, str], problem: str) -> None:
    found = ConsoleSettings.load(environ).problem()
    assert found is not None and problem in found


def test_a_bad_console_setting_names_itself() -> None:
    with pytest.raises(ConfigError, match="RELAY_CONSOLE_AUTH"):
        ConsoleSettings.load({"RELAY_CONSOLE_AUTH": "none"})
    with pytest.raises(ConfigError, match="RELAY_CONSOLE_PROXY_ADDRESSES"):
        ConsoleSettings.load({"RELAY_CONSOLE_PROXY_ADDRESSES": "proxy.local"})


@pytest.mark.parametrize(
    "result, audited",
    [
        (ActionResult(5), "done"),
        (ActionResult(0), "done"),
        (ActionResult(3, left=2), "done; left 2 no longer as the page showed them"),
        (ActionResult(3, parked_since=1), "done; left 1 parked after the bound"),
        (
            ActionResult(3, left=2, parked_since=1),
            "done; left 2 no longer as the page showed them; left 1 parked after the bound",
        ),
        (
            ActionResult(3, left=2, parked_since=30, left_ids=(7, 9), since_ids=tuple(range(20))),
            "done; left 2 no longer as the page showed them: ids 7, 9; left 30 parked after"
            f" the bound: ids {', '.join(map(str, range(20)))} and 10 more",
        ),
    ],
)
def test_a_changes_audited_result_names_what_it_left_and_why(
    result: ActionResult, audited: str
) -> None:
    assert result.audited() == audited


def test_a_users_file_that_lists_nobody_is_refused_at_the_start_and_said_when_emptied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "users"
    for text in ("", "# nobody yet\n\n"):
        path.write_text(text)
        with pytest.raises(ConfigError, match="lists no user, so nobody could log in"):
            UsersFile(path)
    path.write_text(f"ada:admin:{hash_password('pw')}\n")
    users = UsersFile(path)
    assert list(users.current()) == ["ada"]
    path.write_text("# ada left\n")
    assert users.current() == {}
    said = [r for r in caplog.records if getattr(r, "action", None) == "console_users_file"]
    assert len(said) == 1 and "lists no user" in said[0].getMessage()


@pytest.mark.parametrize("value", ["", "zz", "6" * 31, "A" * 32, "0" * 33, "../" + "0" * 29])
def test_a_letter_no_page_named_is_bad_input(value: str) -> None:
    with pytest.raises(InputError, match="letter: not a dead letter as the page named it"):
        forms.letter_digest(value)


@pytest.mark.parametrize("at", ["", "-1", "1e3", "\u0663", "9" * 13])
def test_a_page_position_that_is_no_position_is_bad_input(at: str) -> None:
    with pytest.raises(InputError, match="at: not a position"):
        forms.letter_position({"after": "0" * 32, "at": at})


def test_a_page_position_names_the_letter_it_follows_and_where_it_was() -> None:
    assert forms.letter_position({}) == Position()
    assert forms.letter_position({"after": "ab" * 16, "at": "99"}) == Position("ab" * 16, 99)


def test_a_letters_properties_are_shown_as_text_whatever_their_bytes() -> None:
    properties = pika.BasicProperties(
        content_type="application/json",
        message_id="order-\x004",
        delivery_mode=2,
        headers={"x-inbox-error": b"bad \xff", "tenant": "a"},
    )
    assert forms.letter_properties(properties) == [
        ("content_type", "application/json"),
        ("delivery_mode", "2"),
        ("message_id", "order-\x004"),
        ("header x-inbox-error", "bad \ufffd"),
        ("header tenant", "a"),
    ]
