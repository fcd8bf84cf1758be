"""The users file (``RELAY_CONSOLE_USERS_FILE``) as the console reads it on every request:
parsed again whenever it changes (its size, time or inode), so that a user removed from it
is logged out and a role changed in it applies at the user's next request. A file that can
no longer be read or parsed admits nobody until it is fixed (closed, never the last good
copy), and says why in the log. A file that lists nobody is refused at the start, and said in
the log when an edit empties it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from relay.console.users import User, parse_users
from relay.errors import ConfigError

log = logging.getLogger(__name__)


def _empty(path: Path) -> str:
    return (
        f"RELAY_CONSOLE_USERS_FILE={path}: lists no user, so nobody could log in "
        "(a line name:role:hash each; `relay console hash-password` makes the hash)"
    )


class UsersFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._users: dict[str, User] = {}
        self._load(strict=True)

    def _load(self, strict: bool) -> None:
        try:
            stat = os.stat(self.path)
            seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if seen == self._seen:
                return
            text = self.path.read_text(encoding="utf-8")
            users = parse_users(text, str(self.path))
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            if isinstance(exc, ConfigError):
                problem = str(exc)
            else:
                reason = getattr(exc, "strerror", None) or "not UTF-8 text"
                problem = f"RELAY_CONSOLE_USERS_FILE={self.path}: cannot read: {reason}"
            if strict:
                raise ConfigError(problem) from None
            if self._seen is not None:
                log.error(
                    "console: %s; nobody may log in until it is fixed",
                    problem,
                    extra={"action": "console_users_file"},
                )
            self._seen, self._users = None, {}
            return
        if not users:
            # Not closed: nobody is let in either way, but said, at the start as an error.
            if strict:
                raise ConfigError(_empty(self.path))
            if self._users:
                log.error("console: %s", _empty(self.path), extra={"action": "console_users_file"})
        self._seen, self._users = seen, users

    def current(self) -> dict[str, User]:
        """The file's users now (read again if it changed since the last look)."""
        self._load(strict=False)
        return self._users
