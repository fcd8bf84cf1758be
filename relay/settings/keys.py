"""Whether a signing key is fit to sign the console's session cookies: long enough, not a
placeholder this project (or any example) publishes, and not of too little randomness.

Why: in OIDC mode the signed cookie carries the role, so that whoever knows the key signs
themselves an admin's cookie. The example Secret's placeholder passed the length check (an
outside review; Apache Superset's default ``SECRET_KEY``, CVE-2023-27524, is the same
class). The randomness is estimated from the key's own characters (``estimated_bits``): it
refuses placeholders and keys typed by hand, not every weak key (a random-looking key that
is published somewhere passes); ``openssl rand -base64 48`` makes a fit one.
"""

from __future__ import annotations

import collections
import itertools
import math
import string
from collections.abc import Sequence

from relay.console_constants import CONSOLE_SESSION_SECRET_BITS, CONSOLE_SESSION_SECRET_MIN

# Words of the placeholders examples publish, this project's among them (``change-me``).
PLACEHOLDER_WORDS = ("change", "replace", "example", "placeholder", "secret", "password")
_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def _shannon(symbols: Sequence[object]) -> float:
    """Bits a symbol of ``symbols``' own distribution."""
    counts = collections.Counter(symbols)
    return -sum(n / len(symbols) * math.log2(n / len(symbols)) for n in counts.values())


def estimated_bits(key: str) -> float:
    """The key's randomness in bits, estimated from its characters: the Shannon entropy a
    character of the characters and of the steps between neighbours (``abcd...`` and
    ``0123...`` step by one: a run typed by hand), the lower, at most the log of the
    alphabet its character classes span, times its length."""
    if len(key) < 2:
        return 0.0
    steps = [ord(b) - ord(a) for a, b in itertools.pairwise(key)]
    alphabet = sum(len(c) for c in _CLASSES if any(ch in c for ch in key))
    if any(not any(ch in c for c in _CLASSES) for ch in key):
        alphabet += len(string.punctuation)
    per_character = min(_shannon(key), _shannon(steps), math.log2(max(alphabet, 2)))
    return max(0.0, len(key) * per_character)


def key_problem(key: str) -> str | None:
    """Why ``key`` must not sign sessions (to follow the setting's name), or None."""
    if len(key) < CONSOLE_SESSION_SECRET_MIN:
        return f"must be at least {CONSOLE_SESSION_SECRET_MIN} characters"
    lowered = key.lower()
    for word in PLACEHOLDER_WORDS:
        if word in lowered:
            return f"holds {word!r}: a placeholder, not a key (`openssl rand -base64 48` makes one)"
    bits = estimated_bits(key)
    if bits < CONSOLE_SESSION_SECRET_BITS:
        return (
            f"has about {bits:.0f} bits of randomness, fewer than {CONSOLE_SESSION_SECRET_BITS} "
            "as estimated (`openssl rand -base64 48` makes a key of 48 random bytes)"
        )
    return None
