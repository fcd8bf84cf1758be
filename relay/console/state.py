"""What every handler of the console shares: its settings, database, broker access, sessions,
templates and metrics (built once by ``relay.console.app.create_app``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jinja2 import Environment
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from relay.console.limiter import HashGate, LoginLimiter
from relay.console.oidc import OidcClient
from relay.console.sessions import Session, Sessions, Signer
from relay.console.users_file import UsersFile
from relay.console_records import Actor
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.metrics import ConsoleMetrics
from relay.settings import ConsoleSettings, Settings

COOKIE = "relay_console"
LOGIN_COOKIE = "relay_console_login"


@dataclass
class Console:
    settings: Settings
    config: ConsoleSettings
    reads: ConsoleReads
    actions: ConsoleActions
    sessions: Sessions
    login_signer: Signer
    templates: Environment
    metrics: ConsoleMetrics
    limiter: LoginLimiter
    hashing: HashGate
    users: UsersFile | None = None  # with RELAY_CONSOLE_AUTH=users
    oidc: OidcClient | None = None
    clock: Callable[[], float] = time.time
    _letter_locks: dict[str, threading.Lock] = field(default_factory=dict)

    def dead_letter_lock(self, queue: str) -> threading.Lock:
        """The lock of ``queue``'s dead letters: one reader (a view, a requeue) at a time."""
        return self._letter_locks.setdefault(queue, threading.Lock())

    def page(
        self,
        request: Request,
        name: str,
        session: Session | None,
        status: int = 200,
        **values: Any,
    ) -> Response:
        """A page from its template, every value escaped (autoescape), with the session's
        user, role and CSRF token for its forms."""
        html = self.templates.get_template(name).render(
            root=request.scope.get("root_path", ""),
            session=session,
            actor=Actor(session.user, session.role) if session else None,
            csrf=self.sessions.csrf(session) if session else "",
            **values,
        )
        return HTMLResponse(html, status_code=status)
