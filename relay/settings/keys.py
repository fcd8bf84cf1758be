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
import hashlib
import itertools
import math
import string
from collections.abc import Sequence

from relay.console_constants import CONSOLE_SESSION_SECRET_BITS, CONSOLE_SESSION_SECRET_MIN

# The keys this project's repository published (its tests' keys before they were made at
# each run), by their SHA-256: random-looking, they passed every other check, and whoever read
# them could sign an admin's cookie (an outside review did, in OIDC mode).
PUBLISHED_KEY_DIGESTS = frozenset(
    {
        "8d682b4b18936a6c78cc366ec67369d51bdee91adecfe0cf45f5b4b1e3670eba",
        "fe93e141e897e3ff79729674738744c4989c8ae56a435bdbc1685d37bf84a9c5",
        "96836a490afb9929d135b696b41f9f7731dcc19e120c1059ccffeee52cef5740",
        "b8b7a461bc21a4e7521861c5bf4011e8869fd45007341d627ddaa6d20d809750",
        # tests/unit/test_session_keys.py's, kept there to check the randomness estimate
        "143f8170d064a972d0b0d981e6f0e7247db99c58f79370a302a3d0d4fbd9323f",
        "18a2a5bfb8928952d5ab8dd2e06ac5eeeee0ecdd93cafc828ecdce5fe427b22e",
        "5bda0a43ba8c9fd844afd49049011edcc68a4fd8093d2db21664b6f684c81cad",
    }
)
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
    if hashlib.sha256(key.encode()).hexdigest() in PUBLISHED_KEY_DIGESTS:
        return "was published in outbox-relay's repository: `openssl rand -base64 48` makes one"
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
