"""The console's changes (POST), each behind its role and its form's CSRF token: a change is
first shown with what it will change (``confirm``: the exact count, pinned to the ids or to
the filter and the bound the page was drawn at) and made once confirmed (``act``); an admin's
edited copy (``edit``). Every change is audited (``relay.db.console_actions``). Dead letters'
changes are ``relay.console.letter_changes``'."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from datetime import datetime
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relay.console import forms, letter_changes
from relay.console.access import Refused, keep_session
from relay.console.refusals import audited, checked
from relay.console.sessions import Session
from relay.console.state import Console
from relay.console_constants import CONSOLE_SETTLE_HORIZON_S
from relay.console_records import (
    ADMIN,
    OPERATOR,
    ActionResult,
    Actor,
    Counted,
    LeftAfter,
    ParkedFilter,
)
from relay.db.console_audit_log import DISCARD, EDIT, REPLAY, RESTORE
from relay.errors import InputError

ACTIONS = (REPLAY, DISCARD, RESTORE, *letter_changes.LETTER_ACTIONS)


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


class _Change:
    """A change as its form asks for it."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = dict(fields)
        self.action = self.fields.get("action", "")
        if self.action not in ACTIONS:
            raise InputError("action: not one of " + ", ".join(ACTIONS))
        self.ids = [v for name, v in fields if name == "id"]
        self.letters = [v for name, v in fields if name == "letter"]
        self.bound = forms.instant(self.fields, "bound")
        self.everything = self.fields.get("scope") == "filter"

    def hidden(self) -> list[tuple[str, str]]:
        """The fields the confirmation posts again, as they came (but the token)."""
        return [(name, value) for name, value in self._pairs() if name not in ("csrf", "confirmed")]

    def _pairs(self) -> list[tuple[str, str]]:
        pairs = [(n, v) for n, v in self.fields.items() if n not in ("id", "letter")]
        return pairs + [("id", v) for v in self.ids] + [("letter", v) for v in self.letters]


async def _bounded(console: Console, change: _Change) -> datetime:
    """A change of parked rows needs the time its page was drawn, and one that has come: a
    bound later than the database's time would sweep in rows parked after the page."""
    if change.bound is None:
        raise InputError("bound: a change needs the time its page was drawn")
    if change.bound > await run_in_threadpool(console.reads.now):
        raise InputError("bound: later than the database's time; draw the page again")
    return change.bound


async def _chosen(console: Console, change: _Change) -> ParkedFilter:
    """The filter of a change, its age counted back from the change's bound."""
    bound = await _bounded(console, change)
    return forms.change_filter(change.fields, bound)


async def confirm(console: Console, request: Request) -> Response:
    session, fields = await checked(console, request, OPERATOR, "confirm", ACTIONS)
    async with audited(console, session, "confirm", fields, ACTIONS):
        change = _Change(fields)
        if change.action in letter_changes.LETTER_ACTIONS:
            letters = letter_changes.LetterChange(console, change.fields, change.letters)
            letters.allowed(Actor(session.user, session.role))
            values = await run_in_threadpool(letter_changes.confirming, console, letters)
            response = console.page(
                request, "letters_confirm.html", session, hidden=change.hidden(), **values
            )
            return keep_session(console, response, session, _root(request))
        since = archived_since = LeftAfter(0, ())
        if change.everything and change.action == RESTORE:
            bound = await _bounded(console, change)
            within, archived_since = await run_in_threadpool(
                console.reads.count_archived, forms.archive_filter(change.fields), bound
            )
        elif change.everything:
            chosen = await _chosen(console, change)
            assert change.bound is not None  # _chosen refuses a change without one
            within = await run_in_threadpool(console.reads.count, chosen, change.bound)
            # The rows it would leave, named: read apart from the count, which may stop
            # before them on its budget (a count alone cannot name them).
            since = await run_in_threadpool(console.actions.left_after, chosen, change.bound)
        else:
            within = Counted(len(forms.ids(change.ids)))
    response = console.page(
        request,
        "confirm.html",
        session,
        horizon=int(CONSOLE_SETTLE_HORIZON_S),
        action=change.action,
        within=within,
        since=since,
        archived_since=archived_since,
        everything=change.everything,
        hidden=change.hidden(),
        described=change.fields,
    )
    return keep_session(console, response, session, _root(request))


async def act(console: Console, request: Request) -> Response:
    session, fields = await checked(console, request, OPERATOR, "act", ACTIONS)
    actor = Actor(session.user, session.role)
    async with audited(console, session, "act", fields, ACTIONS):
        change = _Change(fields)
        if change.action in letter_changes.LETTER_ACTIONS:
            letters = letter_changes.LetterChange(console, change.fields, change.letters)
            letters.allowed(actor)
        else:
            change_it = await _prepared(console, change, actor)
    # Begun, a change is audited by its own entry, not as a refusal.
    if change.action in letter_changes.LETTER_ACTIONS:
        return await _act_on_letters(console, request, session, letters, actor)
    # A discard's time, for its done page's link to the rows it archived: no other change
    # reads it.
    began = await run_in_threadpool(console.reads.now) if change.action == DISCARD else None
    try:
        result = await run_in_threadpool(change_it)
    except Exception:
        console.metrics.actions.labels(change.action, "failed").inc()
        raise
    undo = ""
    if began is not None and result.changed:
        ended = await run_in_threadpool(console.reads.now)
        undo = urlencode({"discarded_by": actor.name, **forms.utc_range(began, ended)})
    console.metrics.actions.labels(change.action, "done").inc()
    console.metrics.rows_changed.labels(change.action).inc(result.changed)
    response = console.page(
        request,
        "done.html",
        session,
        action=change.action,
        result=result,
        undo=undo,
        horizon=int(CONSOLE_SETTLE_HORIZON_S),
    )
    return keep_session(console, response, session, _root(request))


async def _prepared(console: Console, change: _Change, actor: Actor) -> Callable[[], ActionResult]:
    """The change its form asks for, checked (ids, the bound), to be made in the thread
    pool: what is refused here was never begun (``act`` audits it as a refusal)."""
    actions = console.actions
    if change.action == RESTORE and change.everything:
        bound = await _bounded(console, change)
        chosen_rows = forms.archive_filter(change.fields)
        return functools.partial(actions.restore, actor, None, chosen_rows, bound)
    if change.action == RESTORE:
        return functools.partial(actions.restore, actor, forms.ids(change.ids))
    do = actions.replay if change.action == REPLAY else actions.discard
    if change.everything:
        chosen = await _chosen(console, change)
        return functools.partial(do, actor, None, chosen, change.bound)
    bound = await _bounded(console, change)
    return functools.partial(do, actor, forms.ids(change.ids), None, bound)


async def _act_on_letters(
    console: Console,
    request: Request,
    session: Session,
    letters: letter_changes.LetterChange,
    actor: Actor,
) -> Response:
    """A requeue or purge of dead letters, made and audited; its done page."""
    try:
        values = await run_in_threadpool(letter_changes.acting, console, letters, actor)
    except Exception:
        console.metrics.actions.labels(letters.action, "failed").inc()
        raise
    console.metrics.actions.labels(letters.action, "done").inc()
    console.metrics.rows_changed.labels(letters.action).inc(len(values["done"].moved))
    response = console.page(request, "letters_done.html", session, **values)
    return keep_session(console, response, session, _root(request))


async def edit(console: Console, request: Request) -> Response:
    """An admin's edited copy of a parked or discarded row, replayed as a new row."""
    path_id = ("id", str(request.path_params["row_id"]))
    session, fields = await checked(console, request, ADMIN, "edit", (EDIT,), named=(path_id,))
    given = dict(fields)
    async with audited(console, session, "edit", fields, (EDIT,)):
        row_id = forms.row_id(request.path_params["row_id"])
        changes = await _edits(console, row_id, given)
    actor = Actor(session.user, session.role)
    try:
        result = await run_in_threadpool(console.actions.edit, actor, row_id, changes)
    except Exception:
        console.metrics.actions.labels(EDIT, "failed").inc()
        raise
    console.metrics.actions.labels(EDIT, "done").inc()
    console.metrics.rows_changed.labels(EDIT).inc()
    response = RedirectResponse(f"{_root(request)}/rows/{result.new_ids[0]}", 303)
    return keep_session(console, response, session, _root(request))


async def _edits(console: Console, row_id: int, given: dict[str, str]) -> dict[str, object]:
    """The fields the admin changed, compared with the row as the browser posts it back: a
    field left as it was keeps the row's own bytes (a textarea posts line breaks as CRLF and
    an input drops them)."""
    row = await run_in_threadpool(console.reads.row, row_id, console.config.console_payload_preview)
    if row is None:
        raise Refused(404, f"no row {row_id} in the outbox or its archive")
    was: dict[str, str | None] = {
        "exchange": row.summary.exchange,
        "routing_key": row.summary.routing_key,
        "content_type": row.content_type,
        "headers": row.headers or "",
        "payload": None,  # shown only when whole and text: else any value is a change
    }
    if row.payload_size == len(row.payload):
        with contextlib.suppress(UnicodeDecodeError):
            was["payload"] = row.payload.decode("utf-8")
    changes: dict[str, object] = {}
    for name, original in was.items():
        if name not in given:
            continue
        value = given[name] if name == "payload" else forms.text(given, name)
        multiline = name in ("headers", "payload")
        if (changed := forms.edited(original, value, multiline)) is not None:
            changes[name] = changed
    if "headers" in changes:
        changes["headers"] = _headers(str(changes["headers"]))
    if "payload" in changes:
        changes["payload"] = str(changes["payload"]).encode("utf-8")
    return changes


def _headers(text: str) -> str | None:
    """Edited headers: a JSON object, or none (empty)."""
    if not text.strip():
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InputError("headers: not a JSON object")
    return text
