"""A change refused is audited as an attempt: who (the session's user and role), what they
asked for (the action, the ids or the filter posted) and why it was refused (the role, the
CSRF token, a page drawn at a time still to come, a form the console cannot read...).

Only a session's attempts are written: a request without one names nobody, and anyone could
fill the log with them (it is answered 401 and logged). A change that began and failed is
its own entry's result (``relay.db.console_actions``), not a refusal.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from relay.console import forms
from relay.console.access import Refused, check_csrf, check_role, form_of, session_of
from relay.console.sessions import Session
from relay.console.state import Console
from relay.console_constants import CONSOLE_FORM_BODY_MAX, CONSOLE_NAMED_IDS
from relay.console_records import Actor
from relay.db.console_audit_log import UNKNOWN
from relay.errors import InputError

log = logging.getLogger(__name__)
# An attempt's posted values are kept this long each: a refusal names what was asked, it
# does not store what a forged form stuffed into it.
SHOWN_FIELD = 200


def attempted(fields: list[tuple[str, str]]) -> str:
    """A refused attempt's target, as the audit keeps a change's: the ids posted (the first
    ``CONSOLE_NAMED_IDS``, and how many), or the filter, and the page's bound."""
    given = dict(fields)
    target: dict[str, object] = {}
    ids = [value[:SHOWN_FIELD] for name, value in fields if name == "id"]
    if given.get("scope") == "filter":
        named = (*forms.FILTER_FIELDS, "parked_for", "parked_before")
        target["filter"] = {n: given[n][:SHOWN_FIELD] for n in named if given.get(n)}
    elif ids:
        target["ids"] = ids[:CONSOLE_NAMED_IDS]
        target["ids_posted"] = len(ids)
    for name in ("queue", "bound"):
        if given.get(name):
            target[name] = given[name][:SHOWN_FIELD]
    return json.dumps(target)


@contextlib.asynccontextmanager
async def audited(
    console: Console,
    session: Session,
    step: str,
    fields: list[tuple[str, str]],
    actions: tuple[str, ...],
) -> AsyncIterator[None]:
    """A refusal (``Refused``, ``InputError``) raised within, audited as the session's
    attempt at ``step`` (``confirm``, ``act``, ``edit``) of the posted action (one of
    ``actions``), then raised on."""
    try:
        yield
    except (Refused, InputError) as exc:
        status, reason = (exc.status, exc.reason) if isinstance(exc, Refused) else (400, str(exc))
        posted = dict(fields).get("action", "")
        action = actions[0] if len(actions) == 1 else posted if posted in actions else UNKNOWN
        console.metrics.actions.labels(action, "refused").inc()
        await run_in_threadpool(
            console.actions.record,
            Actor(session.user, session.role),
            action,
            attempted(fields),
            0,
            f"refused at {step} ({status}): {reason}",
        )
        raise


async def checked(
    console: Console,
    request: Request,
    role: str,
    step: str,
    actions: tuple[str, ...],
    *,
    named: tuple[tuple[str, str], ...] = (),
) -> tuple[Session, list[tuple[str, str]]]:
    """A change's session and form (after ``named``: what its path names, an edit's row
    id), its role and CSRF token checked, a refusal audited (``audited``); without a
    session, refused (401) and logged only."""
    session = await session_of(console, request)
    if session is None:
        client = request.client.host if request.client else "?"
        log.warning(
            "console: a change (%s) without a session from %s refused",
            step,
            client,
            extra={"action": "console_change_refused", "address": client},
        )
        raise Refused(401, "log in first")
    fields = list(named)
    async with audited(console, session, step, fields, actions):
        preview = console.config.console_payload_preview
        fields += await form_of(request, CONSOLE_FORM_BODY_MAX + 3 * preview)
        check_role(session, role)
        check_csrf(console, session, fields)
    return session, fields
