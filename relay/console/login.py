"""Logging in and out: the users file's form (rate-limited), OpenID Connect's round trip to
the identity provider, and logout. Behind a trusted proxy there is no login: the proxy's
headers say who it is (``relay.console.access``)."""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from relay.console import forms
from relay.console.access import Refused, form_of, keep_session
from relay.console.identity import role_of
from relay.console.oidc import Login
from relay.console.passwords import verify_password
from relay.console.sessions import Session
from relay.console.state import COOKIE, LOGIN_COOKIE, Console
from relay.console_constants import (
    CONSOLE_LOGIN_BODY_MAX,
    CONSOLE_LOGIN_STATE_S,
    CONSOLE_NAME_MAX,
    CONSOLE_PASSWORD_MAX,
)
from relay.errors import InputError

log = logging.getLogger(__name__)


def _failed(console: Console, reason: str, address: str, name: str | None) -> None:
    """A login refused, counted and logged: the name only where the users file lists it (a
    password typed into the name field is never logged)."""
    console.metrics.login_failures.labels(reason).inc()
    log.warning(
        "console login refused (%s) for %s from %s",
        reason,
        name or "a name nobody has",
        address,
        extra={"action": "console_login_failed", "reason": reason, "address": address},
    )


def _logged_in(name: str, role: str, address: str) -> None:
    log.info(
        "console login: %s (%s) from %s",
        name,
        role,
        address,
        extra={"action": "console_login", "user": name, "role": role, "address": address},
    )


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def _state_cookie(console: Console, response: Response, value: str, root: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE,
        value,
        max_age=CONSOLE_LOGIN_STATE_S,
        path=root or "/",
        secure=True,
        httponly=True,
        samesite="lax",
    )


async def login_page(console: Console, request: Request) -> Response:
    mode = console.config.console_auth
    if mode == "proxy":
        return RedirectResponse(_root(request) + "/", 303)
    if mode == "oidc":
        assert console.oidc is not None
        url, login = await run_in_threadpool(console.oidc.start)
        redirect: Response = RedirectResponse(url, 303)
        state = {"s": login.state, "n": login.nonce, "v": login.verifier}
        _state_cookie(
            console, redirect, console.login_signer.sign(state, console.clock()), _root(request)
        )
        return redirect
    nonce = secrets.token_urlsafe(16)
    token = console.login_signer.sign({"n": nonce}, console.clock())
    response = console.page(
        request, "login.html", None, login_csrf=console.login_signer.token(nonce), error=""
    )
    _state_cookie(console, response, token, _root(request))
    return response


async def login_form(console: Console, request: Request) -> Response:
    """The users file's login: the form's token checked against its state cookie, then the
    name and password; failures limited per name and address and per address
    (``relay.console.limiter``), password checks at once bounded."""
    if console.config.console_auth != "users":
        raise Refused(404, "this console logs in elsewhere")
    fields = dict(await form_of(request, CONSOLE_LOGIN_BODY_MAX))
    now = console.clock()
    state = console.login_signer.unsign(
        request.cookies.get(LOGIN_COOKIE), CONSOLE_LOGIN_STATE_S, now
    )
    if state is None or not console.login_signer.token_ok(str(state.get("n")), fields.get("csrf")):
        raise Refused(403, "the login form's CSRF token is missing or stale: load it again")
    name = forms.text(fields, "name", CONSOLE_NAME_MAX)
    password = forms.text(fields, "password", CONSOLE_PASSWORD_MAX)
    address = request.client.host if request.client else "unknown"
    assert console.users is not None  # the users mode has its file
    user = console.users.current().get(name)
    known = user.name if user else None
    # The gate first: a login turned away busy has spent none of its attempts.
    if not console.hashing.enter():
        _failed(console, "busy", address, known)
        raise Refused(503, "too many logins at once: try again in a moment")
    try:
        attempt = console.limiter.reserve(name, address, now)
        if attempt is None:
            _failed(console, "limited", address, known)
            raise Refused(429, "too many failed logins: wait a few minutes")
        stored = user.password_hash if user else _NOBODY
        ok = await run_in_threadpool(verify_password, password, stored)
    finally:
        console.hashing.leave()
    if user is None or not ok:
        _failed(console, "password", address, known)
        return console.page(
            request,
            "login.html",
            None,
            status=401,
            login_csrf=fields.get("csrf", ""),
            error="wrong name or password",
        )
    console.limiter.succeeded(attempt)
    _logged_in(user.name, user.role, address)
    issued = console.sessions.issue(user.name, user.role, now, entry=user.entry)
    session = console.sessions.read(issued, now)
    assert session is not None
    response = RedirectResponse(_root(request) + "/", 303)
    response.delete_cookie(LOGIN_COOKIE, path=_root(request) or "/")
    return keep_session(console, response, session, _root(request))


async def callback(console: Console, request: Request) -> Response:
    """The identity provider's answer: the code exchanged, the ID token checked, the role
    taken from its groups."""
    if console.oidc is None:
        raise Refused(404, "this console does not log in with OpenID Connect")
    now = console.clock()
    state = console.login_signer.unsign(
        request.cookies.get(LOGIN_COOKIE), CONSOLE_LOGIN_STATE_S, now
    )
    if state is None:
        raise Refused(400, "no login under way (or it took too long): log in again")
    login = Login(str(state.get("s")), str(state.get("n")), str(state.get("v")))
    address = request.client.host if request.client else "unknown"
    try:
        claims = await run_in_threadpool(console.oidc.finish, str(request.url), login)
    except InputError as exc:
        _failed(console, "provider", address, None)
        raise Refused(401, str(exc)) from None
    name, groups = console.oidc.user(claims)
    role = role_of(groups, console.config)
    if role is None:
        _failed(console, "no_role", address, name)
        raise Refused(403, f"{name} is in none of the console's groups")
    _logged_in(name, role, address)
    session = console.sessions.read(console.sessions.issue(name, role, now), now)
    assert session is not None
    response = RedirectResponse(_root(request) + "/", 303)
    response.delete_cookie(LOGIN_COOKIE, path=_root(request) or "/")
    return keep_session(console, response, session, _root(request))


async def logout(console: Console, request: Request, session: Session | None) -> Response:
    """The session ended: its cookie deleted, and its id kept by the server until its
    lifetime is over (the cookie, signed, would otherwise work again wherever it was kept)."""
    if session is not None:
        ends_at = datetime.fromtimestamp(console.sessions.ends_at(session), UTC)
        await run_in_threadpool(console.actions.end_session, session.id, ends_at)
    response = RedirectResponse(_root(request) + "/login", 303)
    response.delete_cookie(COOKIE, path=_root(request) or "/")
    return response


# Checked against when the name is unknown, so that an unknown name takes as long as a wrong
# password (the time does not tell which names exist).
_NOBODY = "scrypt$32768$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
