"""Passwords out of URLs before they are shown: in logs, errors and ``relay show-config``.
Every package that names a server imports this, and nothing else of the settings."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit


def redact_url(value: Any) -> Any:
    """Replace the password of a URL by ``***``; other values pass through. A URL too broken
    to find its password in shows only its scheme. A comma-separated list of URLs (the
    nodes of a cluster) has each one's password replaced."""
    if not isinstance(value, str) or "://" not in value:
        return value
    if "," in value:
        return ",".join(redact_url(piece) for piece in value.split(","))
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return value.split("://", 1)[0] + "://(not shown: not a valid URL)"
    if password is None:
        return value
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))
