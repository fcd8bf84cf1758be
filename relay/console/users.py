"""Pure: the users file of small installs (``RELAY_CONSOLE_USERS_FILE``): a ``name:role:hash``
line per user, ``#`` comments and blank lines ignored. A malformed line stops the console at
start, naming its line (never its hash)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from relay.console.passwords import hash_problem
from relay.console_records import ROLES
from relay.errors import ConfigError


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: str
    password_hash: str

    @property
    def entry(self) -> str:
        """What a session of this user's is bound to: a digest of their role and hash (the
        hash's salt is new with each password), so that a new password, another role, or
        the user removed and put back with a new password ends the sessions of the entry
        before. A digest: the cookie is signed, not secret."""
        digest = hashlib.sha256(f"{self.role}:{self.password_hash}".encode()).digest()
        return base64.urlsafe_b64encode(digest[:16]).decode("ascii").rstrip("=")


def parse_users(text: str, where: str) -> dict[str, User]:
    users: dict[str, User] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(":")
        role, _, stored = rest.partition(":")
        at = f"{where}:{number}"
        if not name or not role or not stored:
            raise ConfigError(f"{at}: expected name:role:hash")
        if role not in ROLES:
            raise ConfigError(f"{at}: role {role!r} is not one of {', '.join(ROLES)}")
        if (problem := hash_problem(stored)) is not None:
            raise ConfigError(f"{at}: {problem}")
        if name in users:
            raise ConfigError(f"{at}: user {name!r} is listed twice")
        users[name] = User(name, role, stored)
    return users
