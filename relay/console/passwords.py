"""Pure: the users file's password hashes: salted scrypt (hashlib, the standard library),
its parameters stored with each hash (``scrypt$n$r$p$salt$hash``, base64), compared in
constant time."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from relay.console_constants import CONSOLE_SCRYPT_N, CONSOLE_SCRYPT_P, CONSOLE_SCRYPT_R

SCHEME = "scrypt"
_SALT_BYTES = 16
_KEY_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=2 * 128 * r * n + 2**20,
        dklen=_KEY_BYTES,
    )


def hash_password(password: str) -> str:
    """A new salted hash of ``password``."""
    salt = secrets.token_bytes(_SALT_BYTES)
    n, r, p = CONSOLE_SCRYPT_N, CONSOLE_SCRYPT_R, CONSOLE_SCRYPT_P
    return f"{SCHEME}${n}${r}${p}${_b64(salt)}${_b64(_derive(password, salt, n, r, p))}"


def hash_problem(stored: str) -> str | None:
    """Why ``stored`` is not a hash this module made, or None."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        return f"not a {SCHEME} hash (make one with `relay console hash-password`)"
    try:
        n, r, p = (int(x) for x in parts[1:4])
        base64.b64decode(parts[4], validate=True)
        base64.b64decode(parts[5], validate=True)
    except ValueError:
        return "a malformed hash"
    if n < 2 or n & (n - 1) or r < 1 or p < 1:
        return "a hash with impossible parameters"
    return None


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` was made from."""
    if hash_problem(stored) is not None:
        return False
    _, n, r, p, salt, key = stored.split("$")
    derived = _derive(password, base64.b64decode(salt), int(n), int(r), int(p))
    return hmac.compare_digest(derived, base64.b64decode(key))
