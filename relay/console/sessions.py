"""Pure: the console's signed cookies (sessions, and a login's state) and CSRF tokens.

A cookie holds its values and their HMAC-SHA256 under ``RELAY_CONSOLE_SESSION_SECRET``
(``Signer``), so any replica with the key reads it and no server keeps sessions. A session
names its user, their role, when they logged in and when it was last used: unused for the
idle timeout, or older than its lifetime however used, it is refused; each request re-issues
it with the time of use renewed. A logout is kept by the server (``relay.db``'s ended
sessions), which the signature alone cannot say. Its CSRF token is an HMAC of its
random nonce: a form posted without the token of the session that drew it is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from typing import Any


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    def __init__(self, secret: str, purpose: str) -> None:
        # One key per purpose: a login's state cookie is never taken for a session.
        self._key = hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).digest()

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    def sign(self, values: dict[str, Any], now: float) -> str:
        body = _b64(json.dumps({**values, "t": int(now)}, separators=(",", ":")).encode())
        return f"{body}.{self._mac(body)}"

    def unsign(self, token: str | None, max_age: float, now: float) -> dict[str, Any] | None:
        """The values of ``token`` if it was signed here no more than ``max_age`` seconds
        before ``now``, else None."""
        if not token or token.count(".") != 1:
            return None
        body, mac = token.split(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            values = json.loads(_unb64(body))
        except ValueError:
            return None
        if not isinstance(values, dict) or not isinstance(values.get("t"), int):
            return None
        if not 0 <= now - values["t"] <= max_age:
            return None
        return values

    def token(self, nonce: str) -> str:
        """The CSRF token of a session's (or a login form's) nonce."""
        return self._mac("csrf:" + nonce)

    def token_ok(self, nonce: str, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.token(nonce), given or "")


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    role: str
    nonce: str  # the CSRF token is derived from it
    began: int  # when its user logged in (seconds since the epoch)
    entry: str = ""  # users mode: the user's entry it was issued for (``User.entry``)

    @property
    def id(self) -> str:
        """The session's id as the server keeps it (a logout): a hash of its nonce."""
        return hashlib.sha256(self.nonce.encode()).hexdigest()


class Sessions:
    """Sessions in signed cookies, ended by ``idle`` seconds of disuse and, however often
    they are used, ``lifetime`` seconds after their login."""

    def __init__(self, secret: str, idle: float, lifetime: float) -> None:
        self.signer = Signer(secret, "session")
        self.idle = idle
        self.lifetime = lifetime

    def issue(
        self, user: str, role: str, now: float, nonce: str | None = None, entry: str = ""
    ) -> str:
        nonce = nonce or secrets.token_urlsafe(16)
        return self._signed(Session(user, role, nonce, int(now), entry), now)

    def _signed(self, session: Session, now: float) -> str:
        values = {"u": session.user, "r": session.role, "n": session.nonce, "b": session.began}
        return self.signer.sign({**values, "e": session.entry}, now)

    def read(self, cookie: str | None, now: float) -> Session | None:
        values = self.signer.unsign(cookie, self.idle, now)
        if values is None:
            return None
        user, role, nonce = values.get("u"), values.get("r"), values.get("n")
        began, entry = values.get("b"), values.get("e", "")
        if not all(isinstance(v, str) and v for v in (user, role, nonce)):
            return None
        if not isinstance(entry, str):
            return None
        if not isinstance(began, int) or not 0 <= now - began <= self.lifetime:
            return None
        return Session(str(user), str(role), str(nonce), began, entry)

    def ends_at(self, session: Session) -> float:
        """When ``session`` ends whatever its use (seconds since the epoch)."""
        return session.began + self.lifetime

    def renewed(self, session: Session, now: float) -> str:
        return self._signed(session, now)

    def csrf(self, session: Session) -> str:
        return self.signer.token(session.nonce)

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return self.signer.token_ok(session.nonce, given)
