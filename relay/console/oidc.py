"""OpenID Connect login against the user's identity provider: the authorization code flow
with PKCE, a state and a nonce; the ID token's signature checked against the provider's keys
(JWKS) and its claims (issuer, audience, expiry, nonce) checked. Authlib builds the
authorization request and token request and parses the callback; joserfc (Authlib's JOSE
library) checks the token. Blocking HTTP: the console calls these from its thread pool.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from authlib.common.security import generate_token
from authlib.oauth2.rfc6749 import parameters
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from relay.errors import InputError
from relay.settings.console import ConsoleSettings

CALLBACK = "/auth/callback"
_TIMEOUT_S = 10
_SCOPE = "openid profile email"


@dataclass(frozen=True, slots=True)
class Login:
    """A login under way: the values its state cookie keeps until the callback."""

    state: str
    nonce: str
    verifier: str


class OidcClient:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.issuer = settings.console_oidc_issuer.rstrip("/")
        self.client_id = settings.console_oidc_client_id
        self._secret = settings.console_oidc_client_secret
        self.redirect_uri = settings.console_url.rstrip("/") + CALLBACK
        self.groups_claim = settings.console_oidc_roles_claim
        self._metadata: dict[str, Any] | None = None

    def _get(self, url: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
                found = json.load(response)
        except (OSError, ValueError) as exc:
            raise InputError(f"the identity provider did not answer {url}: {exc}") from exc
        if not isinstance(found, dict):
            raise InputError(f"the identity provider's {url} is not a JSON object")
        return found

    def metadata(self) -> dict[str, Any]:
        if self._metadata is None:
            found = self._get(self.issuer + "/.well-known/openid-configuration")
            if found.get("issuer", "").rstrip("/") != self.issuer:
                raise InputError("the identity provider's discovery names another issuer")
            self._metadata = found
        return self._metadata

    def start(self) -> tuple[str, Login]:
        """Where to send the browser, and what to keep until it comes back."""
        login = Login(generate_token(32), generate_token(32), generate_token(48))
        url = parameters.prepare_grant_uri(
            self.metadata()["authorization_endpoint"],
            self.client_id,
            "code",
            redirect_uri=self.redirect_uri,
            scope=_SCOPE,
            state=login.state,
            nonce=login.nonce,
            code_challenge=create_s256_code_challenge(login.verifier),
            code_challenge_method="S256",
        )
        return url, login

    def finish(self, callback_url: str, login: Login) -> dict[str, Any]:
        """The ID token's claims, from the provider's answer at the callback; InputError
        when anything fails its check."""
        try:
            answer = parameters.parse_authorization_code_response(callback_url, login.state)
        except Exception as exc:  # Authlib's own errors: a mismatched or missing state or code
            raise InputError(f"the login's answer was refused: {exc}") from None
        body = parameters.prepare_token_request(
            "authorization_code",
            code=answer["code"],
            redirect_uri=self.redirect_uri,
            client_id=self.client_id,
            client_secret=self._secret,
            code_verifier=login.verifier,
        )
        request = urllib.request.Request(
            self.metadata()["token_endpoint"],
            data=body.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                tokens = json.load(response)
        except (OSError, ValueError) as exc:
            raise InputError(f"the identity provider refused the code: {exc}") from None
        id_token = tokens.get("id_token") if isinstance(tokens, dict) else None
        if not isinstance(id_token, str):
            raise InputError("the identity provider sent no ID token")
        keys = KeySet.import_key_set(self._get(self.metadata()["jwks_uri"]))  # type: ignore[arg-type]
        try:
            token = jwt.decode(id_token, keys)
            jwt.JWTClaimsRegistry(
                iss={"essential": True, "value": self.issuer},
                aud={"essential": True, "value": self.client_id},
                nonce={"essential": True, "value": login.nonce},
                exp={"essential": True},
                sub={"essential": True},
            ).validate(token.claims)
        except (JoseError, ValueError) as exc:
            raise InputError(f"the ID token was refused: {exc}") from None
        if (problem := party_problem(token.claims, self.client_id)) is not None:
            raise InputError(f"the ID token was refused: {problem}")
        return dict(token.claims)

    def user(self, claims: dict[str, Any]) -> tuple[str, list[str]]:
        """The user's name and groups. The name, which the audit keeps as the actor, holds
        the provider's subject (``sub``), the one claim the user cannot edit and the provider
        never gives to another user (OpenID Connect Core 5.7): ``preferred_username`` or
        ``email`` beside it only to be read, as users may change either to anything."""
        subject = str(claims["sub"])
        shown = claims.get("preferred_username") or claims.get("email")
        name = subject if not shown or str(shown) == subject else f"{shown} ({subject})"
        groups = claims.get(self.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return name, [str(g) for g in groups if isinstance(g, str | int)]


def party_problem(claims: dict[str, Any], client_id: str) -> str | None:
    """Why an ID token is not this client's, its audience aside (OpenID Connect Core 3.1.3.7):
    a token for several audiences must name this client as its authorized party (``azp``),
    and any ``azp`` must be this client. None when it is this client's."""
    audience = claims.get("aud")
    party = claims.get("azp")
    if isinstance(audience, list) and len(audience) > 1 and party is None:
        return "it has several audiences and no authorized party (azp)"
    if party is not None and party != client_id:
        return f"its authorized party (azp) is not {client_id}"
    return None
