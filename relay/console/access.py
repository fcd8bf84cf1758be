"""Who may do what: each request's session (from its cookie, or a trusted proxy's headers),
its role checked against what the route needs, and a change's CSRF token checked. Closed by
default: no session, no page (the login page aside); a forged proxy header, a role too low
or a form without its token, refused."""

from __future__ import annotations

import hmac
from datetime import UTC, datetime
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relay.console.identity import from_proxy, groups_of, role_of
from relay.console.sessions import Session
from relay.console.state import COOKIE, Console
from relay.console_records import Actor


class Refused(Exception):
    """A request refused: its status and the one line the page says."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def session_of(console: Console, request: Request) -> Session | None:
    """The request's session: a live signed cookie, not logged out, its user and role as
    the users file says now (users mode); behind a trusted proxy, the proxy's identity (a
    cookie kept for its CSRF nonce while it names the same user and role)."""
    now = console.clock()
    found = console.sessions.read(request.cookies.get(COOKIE), now)
    if found is not None and await run_in_threadpool(console.reads.session_ended, found.id):
        found = None
    if console.config.console_auth == "users":
        return await _as_listed(console, found)
    if console.config.console_auth != "proxy":
        return found
    peer = request.client.host if request.client else None
    if not from_proxy(peer, console.config.console_proxy_addresses):
        console.metrics.login_failures.labels("proxy").inc()
        raise Refused(403, "identity headers are believed from the configured proxy only")
    user_header = console.config.console_proxy_user_header
    groups_header = console.config.console_proxy_groups_header
    if any(len(request.headers.getlist(name)) > 1 for name in (user_header, groups_header)):
        # Which one the proxy set, and which one came from the browser through it?
        raise Refused(400, "an identity header sent more than once")
    user = request.headers.get(user_header, "").strip()
    if not user:
        raise Refused(401, "the proxy sent no user")
    groups = groups_of(request.headers.get(groups_header, ""))
    role = role_of(groups, console.config)
    if role is None:
        console.metrics.login_failures.labels("no_role").inc()
        raise Refused(403, f"{user} is in none of the console's groups")
    if found is not None and found.user == user and found.role == role:
        return found
    token = console.sessions.issue(user, role, now)
    return console.sessions.read(token, now)


async def _as_listed(console: Console, session: Session | None) -> Session | None:
    """``session`` while its user's entry in the users file is the one it was issued for;
    None once the user is no longer in it, or has a new password or another role (an
    outside review: the old session went on working after either), and ended for good, as
    a logout ends it: the entry put back as it was made the old cookie work again."""
    if session is None:
        return None
    assert console.users is not None  # the users mode has its file
    user = console.users.current().get(session.user)
    if user is None or not hmac.compare_digest(user.entry, session.entry):
        ends_at = datetime.fromtimestamp(console.sessions.ends_at(session), UTC)
        await run_in_threadpool(console.actions.end_session, session.id, ends_at)
        return None
    return session


async def require(console: Console, request: Request, role: str) -> Session | Response:
    """The session if its role is ``role`` or above; else where to log in (a page) or a
    refusal (``Refused``)."""
    session = await session_of(console, request)
    if session is None:
        if request.method == "GET":
            return RedirectResponse(request.scope.get("root_path", "") + "/login", 303)
        raise Refused(401, "log in first")
    check_role(session, role)
    return session


def check_role(session: Session, role: str) -> None:
    """Refused (403) unless the session's role is ``role`` or above."""
    if not Actor(session.user, session.role).may(role):
        raise Refused(403, f"this needs the {role} role; {session.user} is a {session.role}")


async def form_of(request: Request, limit: int | None = None) -> list[tuple[str, str]]:
    """A posted form's fields (``application/x-www-form-urlencoded``), in their order; with
    ``limit``, a body longer than ``limit`` bytes is refused (413) as soon as that is known
    (its declared length, or as it arrives), never read whole."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        raise Refused(415, "forms only")
    if limit is None:
        body = await request.body()
    else:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise Refused(413, f"a form of more than {limit} bytes")
        received = bytearray()
        async for part in request.stream():
            received += part
            if len(received) > limit:
                raise Refused(413, f"a form of more than {limit} bytes")
        body = bytes(received)
    return parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)


def check_csrf(console: Console, session: Session, fields: list[tuple[str, str]]) -> None:
    given = [value for name, value in fields if name == "csrf"]
    if len(given) != 1 or not console.sessions.csrf_ok(session, given[0]):
        raise Refused(403, "the form's CSRF token is missing or not this session's")


def keep_session(console: Console, response: Response, session: Session, root: str) -> Response:
    """The session's cookie renewed (its idle time starts again)."""
    response.set_cookie(
        COOKIE,
        console.sessions.renewed(session, console.clock()),
        max_age=int(console.config.console_session_idle),
        path=root or "/",
        secure=True,
        httponly=True,
        samesite="lax",
    )
    return response
