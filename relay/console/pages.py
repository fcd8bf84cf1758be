"""The console's pages (GET): the overview, parked rows by filter, one row, the archive and
the audit log (an inbox queue's dead letters: ``relay.console.letters``). Each reads through
``relay.db.console`` in the thread pool; every value reaches the browser escaped by the
templates."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from relay.causes import CAUSES_LISTED
from relay.console import forms
from relay.console.access import Refused, keep_session, require
from relay.console.audit_view import target_text
from relay.console.payloads import download_type, file_name, pretty_json
from relay.console.sessions import Session
from relay.console.state import Console
from relay.console_constants import CONSOLE_CAUSES_FOUND
from relay.console_records import VIEWER
from relay.db.console_audit_log import AUDITED
from relay.errors import InputError

# What a page shows: its template's values, read for a viewer's session.
Reads = Callable[[Console, Request, Session], Awaitable[dict[str, Any]]]


def page(template: str) -> Callable[[Reads], Callable[[Console, Request], Awaitable[Response]]]:
    """A page of ``template`` for a viewer or above, drawn with what the function reads; the
    session's cookie renewed."""

    def drawn(reads: Reads) -> Callable[[Console, Request], Awaitable[Response]]:
        @functools.wraps(reads)
        async def handler(console: Console, request: Request) -> Response:
            session = await require(console, request, VIEWER)
            if isinstance(session, Response):
                return session
            values = await reads(console, request, session)
            response = console.page(request, template, session, **values)
            root = str(request.scope.get("root_path", ""))
            return keep_session(console, response, session, root)

        return handler

    return drawn


@page("overview.html")
async def overview(console: Console, request: Request, _session: Session) -> dict[str, Any]:
    # ``?causes=all``: every cause found on the page (the "other causes" line's link).
    every = request.query_params.get("causes") == "all"
    listed = CONSOLE_CAUSES_FOUND if every else CAUSES_LISTED
    found = await run_in_threadpool(console.reads.overview, listed)
    return {
        "overview": found,
        "queues": console.config.console_inbox_queues,
        "drawn_at": found.drawn_at,
    }


@page("rows.html")
async def rows(console: Console, request: Request, _session: Session) -> dict[str, Any]:
    fields = dict(request.query_params)
    causes, every_cause = await run_in_threadpool(console.reads.cause_names)
    drawn_at = await run_in_threadpool(console.reads.now)
    chosen = forms.parked_filter(fields, drawn_at)
    after = forms.cursor(fields)
    found, following = await run_in_threadpool(
        console.reads.page, chosen, after, console.config.console_page_rows
    )
    shown = {
        name: fields.get(name, "") for name in (*forms.FILTER_FIELDS, "parked_for", "parked_before")
    }
    return {
        "rows": found,
        "row_of_id": _row_id_or_none(chosen.message_prefix),
        "following": following,
        "filters": shown,
        "causes": causes,
        "every_cause": every_cause,
        "drawn_at": drawn_at,
    }


def _row_id_or_none(given: str) -> int | None:
    """The row id a search's text is, if it is one: ids are numbers, and a number's prefix
    is no set an operator means (12 would be 12, 120-129, 1200-1299... one row in nine), so
    only the whole id finds its row."""
    try:
        return forms.row_id(given) if given else None
    except InputError:
        return None


@page("row.html")
async def row(console: Console, request: Request, session: Session) -> dict[str, Any]:
    row_id = forms.row_id(request.path_params["row_id"])
    found = await run_in_threadpool(
        console.reads.row, row_id, console.config.console_payload_preview
    )
    if found is None:
        raise Refused(404, f"no row {row_id} in the outbox or its archive")
    may_see = _may_see_payloads(console, session)
    kind, shown = forms.preview(found.payload, found.payload_size) if may_see else ("", "")
    whole = len(found.payload) == found.payload_size
    pretty = pretty_json(found.payload, whole, found.content_type) if may_see else None
    drawn_at = await run_in_threadpool(console.reads.now)
    return {
        "row": found,
        "payload_kind": "json" if pretty is not None else kind,
        "payload": shown,  # as stored: the edit form's, which is compared with the row's
        "payload_shown": shown if pretty is None else pretty,
        "payload_hidden": not may_see,
        "drawn_at": drawn_at,
    }


def _may_see_payloads(console: Console, session: Session) -> bool:
    return session.role != VIEWER or console.config.console_viewers_see_payloads


async def payload(console: Console, request: Request) -> Response:
    """A row's payload as a file: its bytes whole, an attachment (never drawn as a page), its
    content type but for markup a browser would run (``relay.console.payloads``)."""
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    if not _may_see_payloads(console, session):
        raise Refused(403, "payloads are not shown to viewers here")
    row_id = forms.row_id(request.path_params["row_id"])
    found = await run_in_threadpool(console.reads.payload, row_id)
    if found is None:
        raise Refused(404, f"no row {row_id} in the outbox or its archive")
    content_type, body = found
    served_as = download_type(content_type)
    name = file_name(row_id, served_as)
    response = Response(
        body,
        media_type=served_as,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
    return keep_session(console, response, session, str(request.scope.get("root_path", "")))


@page("archive.html")
async def archive(console: Console, request: Request, _session: Session) -> dict[str, Any]:
    """Discarded rows by filter, the last discarded first, a page at a time (keyset on the
    id); from here an operator restores the rows chosen, or every row the filter matches."""
    fields = dict(request.query_params)
    chosen = forms.archive_filter(fields)
    after = fields.get("after", "")
    listed = await run_in_threadpool(
        console.reads.archived,
        chosen,
        forms.row_id(after, "after") if after else None,
        console.config.console_page_rows,
    )
    shown = {name: fields.get(name, "") for name in forms.ARCHIVE_FIELDS}
    return {
        "rows": listed,
        "filters": shown,
        "filtered": any(shown.values()),
        "next": urlencode({**shown, "after": listed[-1].id}) if listed else "",
        "drawn_at": await run_in_threadpool(console.reads.now),
    }


@page("audit.html")
async def audit(console: Console, request: Request, _session: Session) -> dict[str, Any]:
    """The audit log filtered by user, action and time, a page at a time (keyset on the
    entry's id), each target in words."""
    fields = dict(request.query_params)
    chosen = forms.audit_filter(fields)
    after = fields.get("after", "")
    limit = console.config.console_page_rows
    entries = await run_in_threadpool(
        console.reads.audit, chosen, forms.row_id(after, "after") if after else None, limit + 1
    )
    shown = {name: fields.get(name, "") for name in ("user", "action", "since", "until")}
    return {
        "entries": entries[:limit],
        "targets": [target_text(e.target) for e in entries[:limit]],
        "older": urlencode({**shown, "after": entries[limit - 1].id})
        if len(entries) > limit
        else "",
        "filters": shown,
        "actions": AUDITED,
        "drawn_at": await run_in_threadpool(console.reads.now),
    }
