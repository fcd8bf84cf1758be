"""The console's pages (GET): the overview, parked rows by filter, one row, the archive, the
audit log and an inbox queue's dead letters. Each reads through ``relay.db.console`` in the
thread pool; every value reaches the browser escaped by the templates."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from relay.broker.deadletters import Listing, listing
from relay.console import forms
from relay.console.access import Refused, keep_session, require
from relay.console.records import VIEWER
from relay.console.state import Console
from relay.inbox.policy import dead_letter_queue


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


async def overview(console: Console, request: Request) -> Response:
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    found = await run_in_threadpool(console.reads.overview)
    response = console.page(
        request,
        "overview.html",
        session,
        overview=found,
        queues=console.config.console_inbox_queues,
    )
    return keep_session(console, response, session, _root(request))


async def rows(console: Console, request: Request) -> Response:
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    fields = dict(request.query_params)
    causes = await run_in_threadpool(console.reads.causes)
    by_cause = {group.cause: group.prefixes for group in causes}
    drawn_at = await run_in_threadpool(console.reads.now)
    chosen = forms.parked_filter(fields, by_cause, drawn_at)
    after = forms.cursor(fields)
    page, following = await run_in_threadpool(
        console.reads.page, chosen, after, console.config.console_page_rows
    )
    shown = {name: fields.get(name, "") for name in (*forms.FILTER_FIELDS, "parked_for")}
    response = console.page(
        request,
        "rows.html",
        session,
        rows=page,
        following=following,
        filters=shown,
        causes=causes,
        drawn_at=drawn_at,
    )
    return keep_session(console, response, session, _root(request))


async def row(console: Console, request: Request) -> Response:
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    row_id = int(request.path_params["row_id"])
    found = await run_in_threadpool(
        console.reads.row, row_id, console.config.console_payload_preview
    )
    if found is None:
        raise Refused(404, f"no row {row_id} in the outbox or its archive")
    may_see = session.role != VIEWER or console.config.console_viewers_see_payloads
    kind, shown = forms.preview(found.payload, found.payload_size) if may_see else ("", "")
    drawn_at = await run_in_threadpool(console.reads.now)
    response = console.page(
        request,
        "row.html",
        session,
        row=found,
        payload_kind=kind,
        payload=shown,
        payload_hidden=not may_see,
        drawn_at=drawn_at,
    )
    return keep_session(console, response, session, _root(request))


async def archive(console: Console, request: Request) -> Response:
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    after = request.query_params.get("after", "")
    listed = await run_in_threadpool(
        console.reads.archived,
        int(after) if after.isdigit() else None,
        console.config.console_page_rows,
    )
    response = console.page(request, "archive.html", session, rows=listed)
    return keep_session(console, response, session, _root(request))


async def audit(console: Console, request: Request) -> Response:
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    after = request.query_params.get("after", "")
    entries = await run_in_threadpool(
        console.reads.audit,
        int(after) if after.isdigit() else None,
        console.config.console_page_rows,
    )
    response = console.page(request, "audit.html", session, entries=entries)
    return keep_session(console, response, session, _root(request))


async def inbox(console: Console, request: Request) -> Response:
    """An inbox queue's dead letters, every one read and put back in its order
    (``relay.broker.deadletters``), when its queue is one where reading loses and reorders
    none (a classic queue without a delivery limit); else its depth, and why not."""
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    queue = request.path_params["queue"]
    if queue not in console.config.console_inbox_queues:
        raise Refused(404, "not one of the console's inbox queues")
    s = console.settings

    def read() -> Listing:
        # One reader at a time per queue in this process: two views reading at once would
        # each see only the letters the other did not hold.
        with console.dead_letter_lock(queue):
            return listing(s.amqp_urls, s.name, s.amqp_tls, dead_letter_queue(queue))

    found = await run_in_threadpool(read)
    response = console.page(request, "inbox.html", session, queue=queue, listing=found)
    return keep_session(console, response, session, _root(request))
