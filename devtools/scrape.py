"""Reading a running relay's HTTP endpoints (/metrics, /healthz, /readyz) as a scraper does."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(url: str) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def answers_ok(url: str) -> bool:
    """True once ``url`` answers 200 (e.g. /readyz)."""
    return http_get(url)[0] == 200


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in a Prometheus text exposition."""
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample == name:
            return float(value)
    raise AssertionError(f"{name} not exported")
