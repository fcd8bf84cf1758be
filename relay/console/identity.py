"""Pure: who a request is, as a trusted proxy or an identity provider says, and their role.

A role comes from groups: the highest of admin, operator and viewer whose groups
(``RELAY_CONSOLE_*_GROUPS``) the user is in; none, and the user may not use the console. A
proxy's headers are believed only from the proxy's own addresses
(``RELAY_CONSOLE_PROXY_ADDRESSES``): from anywhere else they are forged.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from relay.console_records import ADMIN, OPERATOR, VIEWER
from relay.settings.console import ConsoleSettings


def role_of(groups: Iterable[str], settings: ConsoleSettings) -> str | None:
    mine = set(groups)
    for role, named in (
        (ADMIN, settings.console_admin_groups),
        (OPERATOR, settings.console_operator_groups),
        (VIEWER, settings.console_viewer_groups),
    ):
        if mine & set(named):
            return role
    return None


def groups_of(header: str) -> list[str]:
    """A proxy's groups header: comma-separated (oauth2-proxy's ``X-Forwarded-Groups``)."""
    return [g.strip() for g in header.split(",") if g.strip()]


def from_proxy(
    address: str | None, proxies: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]
) -> bool:
    """Whether a request's peer address is one of the trusted proxies'."""
    if address is None:
        return False
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(peer in network for network in proxies)
