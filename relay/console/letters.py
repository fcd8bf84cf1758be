"""The console's pages of an inbox queue's dead letters (GET): a page of them, one letter
with its properties and payload, and its payload as a download. Each reads the queue from
its head within bounds (``relay.broker.deadletter_pages``): no view reads a queue of any
length whole. Views of one queue in one console process read one at a time: two reading at
once would each see only the letters the other did not hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from relay.broker.deadletter_pages import Bounds, LetterPage, find_letter, letter_page
from relay.broker.deadletters import DeadLetter
from relay.console import forms
from relay.console.access import Refused, keep_session, require
from relay.console.pages import page
from relay.console.sessions import Session
from relay.console.state import Console
from relay.console_constants import (
    CONSOLE_DEAD_LETTERS_BUDGET_S,
    CONSOLE_DEAD_LETTERS_PAGE,
    CONSOLE_DEAD_LETTERS_READ_MAX,
)
from relay.console_records import VIEWER
from relay.inbox.policy import dead_letter_queue

T = TypeVar("T")
BOUNDS = Bounds(
    CONSOLE_DEAD_LETTERS_PAGE, CONSOLE_DEAD_LETTERS_READ_MAX, CONSOLE_DEAD_LETTERS_BUDGET_S
)


def inbox_queue(console: Console, queue: str) -> str:
    """``queue`` when it is one of the console's inbox queues (404 otherwise)."""
    if queue not in console.config.console_inbox_queues:
        raise Refused(404, "not one of the console's inbox queues")
    return queue


def on_queue(console: Console, queue: str, does: Callable[..., T], **asked: Any) -> T:
    """``does`` to the dead-letter queue of ``queue``, alone among this process's readers
    of it: two reading at once would each see only the letters the other did not hold."""
    s = console.settings
    with console.dead_letter_lock(queue):
        return does(s.amqp_urls, s.name, s.amqp_tls, dead_letter_queue(queue), **asked)


@page("inbox.html")
async def inbox(console: Console, request: Request, _session: Session) -> dict[str, Any]:
    """A page of an inbox queue's dead letters, after the letter its position names, when
    its queue is one where reading loses and reorders none (a classic queue without a
    delivery limit); else its depth, and why not."""
    queue = inbox_queue(console, request.path_params["queue"])
    position = forms.letter_position(request.query_params)
    found: LetterPage = await run_in_threadpool(
        on_queue, console, queue, letter_page, position=position, bounds=BOUNDS
    )
    return {"queue": queue, "letters": found, "position": position, "bounds": BOUNDS}


@page("letter.html")
async def letter(console: Console, request: Request, session: Session) -> dict[str, Any]:
    """One dead letter: its properties, headers and a preview of its payload (viewers see
    payloads only when the settings say so)."""
    queue, properties, body, found = await _found(console, request)
    may_see = session.role != VIEWER or console.config.console_viewers_see_payloads
    preview = body[: console.config.console_payload_preview]
    kind, shown = forms.preview(preview, len(body)) if may_see else ("", "")
    return {
        "queue": queue,
        "letter": found,
        "properties": forms.letter_properties(properties),
        "payload_kind": kind,
        "payload": shown,
        "payload_hidden": not may_see,
        "preview_bytes": len(preview),
    }


async def payload(console: Console, request: Request) -> Response:
    """A dead letter's whole payload, as a download (never shown as a page)."""
    session = await require(console, request, VIEWER)
    if isinstance(session, Response):
        return session
    if session.role == VIEWER and not console.config.console_viewers_see_payloads:
        raise Refused(403, "payloads are not shown to viewers here")
    _queue, _properties, body, found = await _found(console, request)
    response = Response(
        body,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="dead-letter-{found.digest}.bin"'},
    )
    return keep_session(console, response, session, str(request.scope.get("root_path", "")))


async def _found(console: Console, request: Request) -> tuple[str, Any, bytes, DeadLetter]:
    """The queue, and the letter the query names: its properties (pika's, which only the
    broker's modules import), payload and description (404 when a bounded read does not
    find it)."""
    queue = inbox_queue(console, request.query_params.get("queue", ""))
    wanted = forms.letter_digest(request.query_params.get("letter", ""))
    hit: tuple[DeadLetter, Any, bytes] | None = await run_in_threadpool(
        on_queue, console, queue, find_letter, wanted=wanted, bounds=BOUNDS
    )
    if hit is None:
        raise Refused(
            404,
            f"no such letter among the first {BOUNDS.limit} of {queue}'s dead letters read within "
            f"{BOUNDS.budget_s:g} s (requeued or purged since, or further in)",
        )
    found, properties, body = hit
    return queue, properties, body, found
