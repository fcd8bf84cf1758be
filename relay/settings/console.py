"""The operator console's settings (``relay console``, ``relay.console``); its database and
broker are the relay's settings of the same names (``RELAY_DATABASE_URL``, ``RELAY_AMQP_URL``).

Closed by default: without an authentication mode the console refuses to start
(``ConsoleSettings.problem``), and nothing in these defaults opens it.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from relay.console_constants import (
    CONSOLE_LOGIN_ADDRESS_SHARE,
    CONSOLE_LOGIN_ATTEMPTS,
    CONSOLE_LOGIN_WINDOW_S,
    CONSOLE_PAGE_ROWS,
    CONSOLE_PAYLOAD_PREVIEW_BYTES,
    CONSOLE_SESSION_IDLE_S,
    CONSOLE_SESSION_LIFETIME_S,
    CONSOLE_SESSION_SECRET_BITS,
    CONSOLE_SESSION_SECRET_MIN,
)
from relay.settings.keys import key_problem
from relay.settings.parse import (
    FromEnvironment,
    byte_size,
    choice,
    env_name,
    flag,
    optional_path,
    port,
    positive_float,
    positive_int,
    setting,
)

AUTH_MODES = ("oidc", "proxy", "users")
_NETWORKS = ipaddress.IPv4Network | ipaddress.IPv6Network


def _auth_mode(text: str) -> str:
    return choice("", *AUTH_MODES)(text)


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names (groups, queues), blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def networks(text: str) -> tuple[_NETWORKS, ...]:
    """Comma-separated addresses or networks (``10.0.0.7``, ``10.1.0.0/16``, ``::1``)."""
    found = []
    for part in names(text):
        try:
            found.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{part!r} is not an address or network such as 10.0.0.7/32") from None
    return tuple(found)


@dataclass(frozen=True)
class ConsoleSettings(FromEnvironment):
    """``relay console``'s own settings."""

    console_auth: str = setting(
        "",
        _auth_mode,
        "How users log in to the console: oidc (your identity provider), proxy (a trusted "
        "reverse proxy's identity headers) or users (a file of salted password hashes). "
        "Required: the console refuses to start without one.",
        see="console.md#logging-in",
    )
    console_host: str = setting("127.0.0.1", str, "Address the console listens on.")
    console_port: int = setting(8090, port, "Port the console listens on.")
    console_metrics_port: int = setting(
        9465, port, "Port of the console's /metrics (Prometheus), on its host (0: none)."
    )
    console_session_secret: str = setting(
        "",
        str,
        f"Key that signs the console's session cookies (at least {CONSOLE_SESSION_SECRET_MIN} "
        f"characters and {CONSOLE_SESSION_SECRET_BITS} bits of randomness, no placeholder: "
        "`openssl rand -base64 48`; the same on every replica).",
        secret=True,
    )
    console_session_idle: float = setting(
        CONSOLE_SESSION_IDLE_S,
        positive_float,
        "Seconds of inactivity after which a console session ends.",
    )
    console_session_lifetime: float = setting(
        CONSOLE_SESSION_LIFETIME_S,
        positive_float,
        "Seconds after a login at which its console session ends, however often it is used.",
    )
    console_users_file: Path | None = setting(
        None,
        optional_path,
        "With RELAY_CONSOLE_AUTH=users: the file of users, a `name:role:hash` line each "
        "(`relay console hash-password` makes a hash).",
    )
    console_oidc_issuer: str = setting(
        "", str, "With oidc: the identity provider's issuer URL (its discovery document)."
    )
    console_oidc_client_id: str = setting("", str, "With oidc: the console's client id.")
    console_oidc_client_secret: str = setting(
        "", str, "With oidc: the console's client secret.", secret=True
    )
    console_url: str = setting(
        "",
        str,
        "The console's external URL, as users' browsers reach it (the OIDC redirect goes to "
        "its /auth/callback).",
    )
    console_oidc_roles_claim: str = setting(
        "groups", str, "With oidc: the ID token's claim that lists the user's groups."
    )
    console_proxy_addresses: tuple[_NETWORKS, ...] = setting(
        (),
        networks,
        "With proxy: the proxy's addresses or networks, comma-separated; identity headers "
        "from any other address are refused.",
        shown="",
    )
    console_proxy_user_header: str = setting(
        "X-Forwarded-User", str, "With proxy: the header naming the user."
    )
    console_proxy_groups_header: str = setting(
        "X-Forwarded-Groups", str, "With proxy: the header listing the user's groups."
    )
    console_viewer_groups: tuple[str, ...] = setting(
        (), names, "Groups (OIDC or proxy) whose members may look.", shown=""
    )
    console_operator_groups: tuple[str, ...] = setting(
        (),
        names,
        "Groups whose members may also replay, discard, restore and requeue.",
        shown="",
    )
    console_admin_groups: tuple[str, ...] = setting(
        (), names, "Groups whose members may also edit a row and replay the copy.", shown=""
    )
    console_viewers_see_payloads: bool = setting(
        False, flag, "Show payloads to viewers (operators and admins always see them)."
    )
    console_payload_preview: int = setting(
        CONSOLE_PAYLOAD_PREVIEW_BYTES,
        byte_size,
        "Bytes of a payload shown on a row's page.",
        shown=f"{CONSOLE_PAYLOAD_PREVIEW_BYTES // 1024}KiB",
    )
    console_page_rows: int = setting(CONSOLE_PAGE_ROWS, positive_int, "Rows on a page.")
    console_login_attempts: int = setting(
        CONSOLE_LOGIN_ATTEMPTS,
        positive_int,
        f"Failed logins per user name from one address in {CONSOLE_LOGIN_WINDOW_S // 60} "
        "minutes, after which that name is refused from that address until the window has "
        f"passed (an address may fail {CONSOLE_LOGIN_ADDRESS_SHARE} times as many, with any "
        "names).",
    )
    console_inbox_queues: tuple[str, ...] = setting(
        (),
        names,
        "Queues consumed through the inbox whose dead letters the console shows (comma-separated).",
        shown="",
    )

    def problem(self) -> str | None:
        """Why the console must not start with these settings, or None."""
        auth = env_name("console_auth")
        if not self.console_auth:
            return f"{auth} is not set: the console needs one of {', '.join(AUTH_MODES)}"
        weak = key_problem(self.console_session_secret)
        if weak is not None:
            return f"{env_name('console_session_secret')} {weak}"
        needs = {
            "users": ["console_users_file"],
            "proxy": ["console_proxy_addresses"],
            "oidc": [
                "console_oidc_issuer",
                "console_oidc_client_id",
                "console_oidc_client_secret",
                "console_url",
            ],
        }[self.console_auth]
        missing = [env_name(name) for name in needs if not getattr(self, name)]
        if missing:
            return f"{auth}={self.console_auth} needs {', '.join(missing)}"
        return None
