"""Which keys may sign the console's sessions (``relay.settings.keys``): none of the
placeholders examples publish (the example Secret's passed the length check: whoever read
it could sign an admin's cookie in OIDC mode), none typed by hand, every random one."""

from __future__ import annotations

import secrets

import pytest

from relay.console_constants import CONSOLE_SESSION_SECRET_BITS
from relay.settings.keys import estimated_bits, key_problem

# Keys as the documented commands make them (fixed here: the estimate must not depend on
# luck; published, so refused by ``key_problem``).
OPENSSL_BASE64_48 = "uJoVxd5BNOOAh858pzcxDxmrepE0rS9Z6xZD74I4Qp7b/r+/qUkY2g0OpMp0ZaRn"
OPENSSL_HEX_16 = "b471d17350e4abff1bd4da6f40510fde"
TOKEN_URLSAFE_32 = "bZEFLkxwNZWgUbxFjySw0R50lBbuuz0ofKxTdV10fmw"


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("short", "at least 32 characters"),
        ("change-me-to-32-or-more-random-characters", "'change'"),  # this project's example
        ("please-REPLACE-this-with-a-real-key-0000", "'replace'"),
        ("my-console-session-secret-for-production", "'secret'"),
        ("s" * 40, "bits of randomness"),
        ("aZ9!" * 8, "bits of randomness"),  # a pattern repeated
        ("abcdefghijklmnopqrstuvwxyz012345", "bits of randomness"),  # an alphabet
        ("0123456789" * 4, "bits of randomness"),
        # 384 bits, read as about 340: never near 100. Its id fixed, not the key: each test
        # process makes its own, and pytest-xdist refuses processes whose ids differ.
        pytest.param(secrets.token_urlsafe(48), None, id="a key made now"),
        # Published here, so refused: random-looking keys in a repository anyone reads (an
        # outside review signed an admin's cookie with one of the tests' keys).
        (OPENSSL_BASE64_48, "was published"),
        ("tK7pWq2xRz9LmN4vB8cY1hJ6dF3sG0aE5uQiOwPe", "was published"),
    ],
)
def test_a_key_is_refused_with_its_reason_or_taken(key: str, problem: str | None) -> None:
    found = key_problem(key)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


@pytest.mark.parametrize("key", [OPENSSL_BASE64_48, OPENSSL_HEX_16, TOKEN_URLSAFE_32])
def test_keys_as_the_documented_commands_make_them_read_as_random_enough(key: str) -> None:
    # 32 hex digits, 128 bits, read as about 110.
    assert estimated_bits(key) >= CONSOLE_SESSION_SECRET_BITS
