"""The console as an ASGI application (Starlette): ``standalone_app`` assembles its
database, sessions, templates and routes for ``relay console``, and ``create_app`` for a
host application (``Mount("/outbox", app=create_app(...))``: its links and cookies follow
the mount's path; any mode but proxy's).

Every response carries a Content-Security-Policy that lets the page load only the console's
own script and stylesheet (nothing inline, nothing from elsewhere), is never framed and
never cached.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from relay.console import changes, letters, login, pages, times
from relay.console.access import Refused, check_csrf, form_of, session_of
from relay.console.limiter import HashGate, LoginLimiter
from relay.console.oidc import OidcClient
from relay.console.sessions import Sessions, Signer
from relay.console.state import Console
from relay.console.users_file import UsersFile
from relay.console_constants import (
    CONSOLE_FORM_BODY_MAX,
    CONSOLE_LOGIN_HASHES,
    CONSOLE_LOGIN_WINDOW_S,
)
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.errors import BrokerError, ConfigError, InputError, StoreError
from relay.metrics import ConsoleMetrics
from relay.settings import ConsoleSettings, Settings

log = logging.getLogger(__name__)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
Handler = Callable[[Console, Request], Awaitable[Response]]


def load_console(
    settings: Settings,
    config: ConsoleSettings,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> Console:
    """The console's shared state; ``ConfigError`` (exit 2) for settings it cannot start
    with, before anything listens."""
    if (problem := config.problem()) is not None:
        raise ConfigError(problem)
    users = None
    if config.console_auth == "users":
        assert config.console_users_file is not None  # problem() said so
        users = UsersFile(Path(config.console_users_file))
    templates = Environment(
        loader=PackageLoader("relay.console", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
    )
    templates.filters["when"] = times.when
    secret = config.console_session_secret
    return Console(
        settings=settings,
        config=config,
        reads=ConsoleReads(settings.database_url),
        actions=ConsoleActions(settings.database_url),
        sessions=Sessions(secret, config.console_session_idle, config.console_session_lifetime),
        login_signer=Signer(secret, "login"),
        templates=templates,
        metrics=ConsoleMetrics(registry),
        limiter=LoginLimiter(config.console_login_attempts, CONSOLE_LOGIN_WINDOW_S),
        hashing=HashGate(CONSOLE_LOGIN_HASHES),
        users=users,
        oidc=OidcClient(config) if config.console_auth == "oidc" else None,
        clock=clock,
    )


def create_app(console: Console) -> Starlette:
    """The console to mount in a host application: in any mode but ``proxy``, which believes
    the identity headers of requests from the proxy's own addresses. Mounted, the console
    cannot tell the transport peer's address from one a forwarded header gave (uvicorn's
    default ``proxy_headers`` put a client's ``X-Forwarded-For`` there: an outside review
    was admin from anywhere), so proxy mode is ``relay console``'s own server's only
    (``standalone_app``)."""
    if console.config.console_auth == "proxy":
        raise ConfigError(
            "RELAY_CONSOLE_AUTH=proxy is for `relay console` only: mounted in a host "
            "application, the console cannot see the transport peer's address (a proxy "
            "headers middleware may have put a forwarded one in its place); use oidc or users"
        )
    return standalone_app(console)


def standalone_app(console: Console) -> Starlette:
    """The console as ``relay console`` serves it: with uvicorn's ``proxy_headers`` off, the
    request's client is the transport peer, the one address proxy mode may believe."""

    def route(path: str, handler: Handler, methods: list[str], name: str) -> Route:
        async def endpoint(request: Request) -> Response:
            return await handler(console, request)

        return Route(path, endpoint, methods=methods, name=name)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        console.reads.close()
        console.actions.close()

    routes = [
        route("/", pages.overview, ["GET"], "overview"),
        route("/rows", pages.rows, ["GET"], "rows"),
        route("/rows/{row_id:int}", pages.row, ["GET"], "row"),
        route("/rows/{row_id:int}/edit", changes.edit, ["POST"], "edit"),
        route("/rows/{row_id:int}/payload", pages.payload, ["GET"], "payload"),
        route("/archive", pages.archive, ["GET"], "archive"),
        route("/audit", pages.audit, ["GET"], "audit"),
        route("/inbox/{queue:path}", letters.inbox, ["GET"], "inbox"),
        route("/dead-letter", letters.letter, ["GET"], "dead_letter"),
        route("/dead-letter/payload", letters.payload, ["GET"], "dead_letter_payload"),
        route("/confirm", changes.confirm, ["POST"], "confirm"),
        route("/act", changes.act, ["POST"], "act"),
        route("/login", login.login_page, ["GET"], "login"),
        route("/login", login.login_form, ["POST"], "login_form"),
        route("/auth/callback", login.callback, ["GET"], "callback"),
        route("/logout", _logout, ["POST"], "logout"),
        route("/healthz", _alive, ["GET"], "healthz"),
        route("/readyz", _ready, ["GET"], "readyz"),
        Mount(
            "/static",
            StaticFiles(directory=str(resources.files("relay.console") / "static")),
            name="static",
        ),
    ]
    middleware = [Middleware(BaseHTTPMiddleware, dispatch=functools.partial(_guard, console))]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    # No redirect of /rows/ to /rows: Starlette builds it absolute, from the request's Host
    # header, which anyone can set.
    app.router.redirect_slashes = False
    return app


async def _alive(console: Console, request: Request) -> Response:
    """Liveness: the process answers (nothing about the outbox: no login needed, none shown)."""
    return PlainTextResponse("ok")


async def _ready(console: Console, request: Request) -> Response:
    """Readiness: the database answers."""
    await run_in_threadpool(console.reads.now)
    return PlainTextResponse("ok")


async def _logout(console: Console, request: Request) -> Response:
    session = await session_of(console, request)
    if session is not None:
        check_csrf(console, session, await form_of(request, CONSOLE_FORM_BODY_MAX))
    return await login.logout(console, request, session)


async def _guard(
    console: Console, request: Request, call_next: RequestResponseEndpoint
) -> Response:
    """Security headers on every response, refusals and bad input as pages, metrics."""
    started = time.perf_counter()
    route = "other"
    for candidate in request.app.routes:
        match, _scope = candidate.matches(request.scope)
        if match.value == 2:  # Match.FULL
            route = getattr(candidate, "name", "other") or "other"
            break
    try:
        response = await call_next(request)
    except Refused as refused:
        response = _error(console, request, refused.status, refused.reason)
    except InputError as exc:
        response = _error(console, request, 400, str(exc))
    except StoreError as exc:
        log.warning("console: %s", exc, extra={"action": "console_store_error"})
        response = _error(console, request, 503, "the database did not answer; try again")
    except BrokerError as exc:
        log.warning("console: %s", exc, extra={"action": "console_broker_error"})
        response = _error(console, request, 503, "the broker did not answer; try again")
    except Exception:
        # Answered here, not by the server's default 500, so that it too carries the
        # security headers.
        log.exception(
            "console: %s %s failed", request.method, route, extra={"action": "console_error"}
        )
        response = _error(console, request, 500, "the console failed; the log says why")
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    console.metrics.requests.labels(route, request.method, str(response.status_code)).inc()
    console.metrics.request_seconds.labels(route).observe(time.perf_counter() - started)
    return response


def _error(console: Console, request: Request, status: int, reason: str) -> Response:
    return console.page(request, "error.html", None, status=status, code=status, reason=reason)
