"""Silencing a process's TCP connections to a port, as when the host at the other end vanishes
(a crash that sends no reset, a failover that moves the address): every packet of those
connections is dropped by the kernel, both ways, while new connections get through. A proxy
cannot do this: its own kernel would still acknowledge what the relay sends.

Needs root and nftables (``nft``); the rules live in a table of their own, one per test
process (the suite runs in several), removed on exit (and by the next use in the same
process, if a run was killed before it could)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

TABLE = f"outbox_relay_faults_{os.getpid()}"


def unavailable() -> str | None:
    """Why connections cannot be silenced here, or None."""
    if shutil.which("nft") is None:
        return "nftables is not installed (Debian package nftables)"
    probe = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"nft cannot change this machine's rules: {probe.stderr.strip()}"
    return None


def connections(pid: int, port: int) -> list[int]:
    """The local ports of process ``pid``'s established TCP connections to ``port``."""
    listing = subprocess.run(
        ["ss", "-Htnp", "state", "established", "dport", f"= :{port}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for line in listing.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[2]  # recv-q, send-q, local address:port, peer ...
            found.append(int(local.rsplit(":", 1)[1]))
    return found


class Silenced:
    """``with Silenced(pid, port)``: ``pid``'s connections to ``port`` (those open now) hear
    nothing and are heard by no one, for the block."""

    def __init__(self, pid: int, port: int) -> None:
        self.ports = connections(pid, port)
        self._server_port = port

    def __enter__(self) -> Silenced:
        _nft("delete", "table", "inet", TABLE, check=False)
        _nft("add", "table", "inet", TABLE)
        _nft("add", "chain", "inet", TABLE, "input", "{ type filter hook input priority 0 ; }")
        for local in self.ports:
            for sport, dport in ((local, self._server_port), (self._server_port, local)):
                rule = ["tcp", "sport", str(sport), "tcp", "dport", str(dport), "drop"]
                _nft("add", "rule", "inet", TABLE, "input", *rule)
        return self

    def __exit__(self, *exc: object) -> None:
        _nft("delete", "table", "inet", TABLE, check=False)


def _nft(*args: str, check: bool = True) -> None:
    result = subprocess.run(["nft", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {result.stderr.strip()}")


def port_of(url: str) -> int:
    """The port in a database URL."""
    found = re.search(r"@[^/:]+:(\d+)/", url)
    assert found is not None, "a URL with a host and a port"
    return int(found[1])
