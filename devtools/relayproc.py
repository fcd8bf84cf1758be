"""`relay` as users run it: one-off commands and `relay run` subprocesses, each with exactly
the RELAY_* settings given (none inherited from the caller's environment)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from devtools.servers import wait_until
from relay.settings import ENV_PREFIX

RELAY = [sys.executable, "-m", "relay"]


def relay_env(**variables: str) -> dict[str, str]:
    """This process's environment without its RELAY_* variables, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(variables)
    return env


def relay(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run one `relay` command to its end; its output as text."""
    return subprocess.run(
        [*RELAY, *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class RelayProcess:
    """One `relay run` subprocess; its stderr goes to ``log_path`` (or is inherited)."""

    def __init__(self, env: dict[str, str], log_path: Path | None = None) -> None:
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False

    def start(self) -> Self:
        if self.log_path is None:
            self.proc = subprocess.Popen([*RELAY, "run"], env=self.env)
        else:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen([*RELAY, "run"], env=self.env, stderr=log)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; the exit code (killed, and TimeoutExpired raised, if it hangs)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return self.proc.returncode

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.killed = True

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text()

    def tracebacks(self) -> list[str]:
        return [line for line in self.log().splitlines() if "Traceback" in line]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType
    ) -> None:
        """Whatever happened in the block, no relay is left running."""
        if self.running:
            self.kill()


def run_relay_until(
    env: dict[str, str], log_path: Path, done: Callable[[], bool], what: str, timeout: float = 60
) -> int:
    """`relay run` until ``done()`` (at most ``timeout`` seconds), then SIGTERM; its exit code."""
    with RelayProcess(env, log_path) as proc:
        wait_until(done, timeout, what)
        return proc.stop()
