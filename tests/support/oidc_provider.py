"""A small OpenID Connect provider on loopback, for the console's login tests: discovery,
an authorization endpoint that signs in one configured user at once (no form), a token
endpoint that checks the code, the client's secret, the redirect and the PKCE verifier, and
its keys (JWKS). ID tokens are signed RS256 with joserfc, Authlib's JOSE library."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

CLIENT_ID = "relay-console"
CLIENT_SECRET = "provider-secret-for-tests"


@dataclass
class Provider:
    user: str
    groups: list[str]
    key: RSAKey = field(default_factory=lambda: RSAKey.generate_key(2048, parameters={"kid": "k1"}))
    issuer: str = ""
    codes: dict[str, dict[str, str]] = field(default_factory=dict)
    issued: int = 0  # ID tokens handed out

    def id_token(self, nonce: str) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": CLIENT_ID,
            "sub": f"sub-{self.user}",
            "preferred_username": self.user,
            "groups": self.groups,
            "nonce": nonce,
            "iat": now,
            "exp": now + 300,
        }
        self.issued += 1
        return jwt.encode({"alg": "RS256", "kid": "k1"}, claims, self.key)


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            return None

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/.well-known/openid-configuration":
                self._json(
                    200,
                    {
                        "issuer": provider.issuer,
                        "authorization_endpoint": provider.issuer + "/authorize",
                        "token_endpoint": provider.issuer + "/token",
                        "jwks_uri": provider.issuer + "/jwks",
                    },
                )
            elif url.path == "/jwks":
                self._json(200, dict(KeySet([provider.key]).as_dict(private=False)))
            elif url.path == "/authorize":
                if (
                    query.get("client_id") != CLIENT_ID
                    or query.get("code_challenge_method") != "S256"
                ):
                    self._json(400, {"error": "invalid_request"})
                    return
                code = secrets.token_urlsafe(16)
                provider.codes[code] = {
                    "nonce": query["nonce"],
                    "challenge": query["code_challenge"],
                    "redirect_uri": query["redirect_uri"],
                }
                back = (
                    query["redirect_uri"] + "?" + urlencode({"code": code, "state": query["state"]})
                )
                self.send_response(302)
                self.send_header("Location", back)
                self.end_headers()
            else:
                self._json(404, {"error": "not_found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}
            saved = provider.codes.pop(form.get("code", ""), None)
            ok = (
                saved is not None
                and form.get("client_id") == CLIENT_ID
                and form.get("client_secret") == CLIENT_SECRET
                and form.get("redirect_uri") == saved["redirect_uri"]
                and create_s256_code_challenge(form.get("code_verifier", "")) == saved["challenge"]
            )
            if not ok or saved is None:
                self._json(400, {"error": "invalid_grant"})
                return
            self._json(
                200,
                {
                    "access_token": "unused",
                    "token_type": "Bearer",
                    "id_token": provider.id_token(saved["nonce"]),
                },
            )

    return Handler


@contextmanager
def oidc_provider(user: str, groups: list[str]) -> Iterator[Provider]:
    provider = Provider(user, groups)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    provider.issuer = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
