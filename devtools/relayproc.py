"""`relay` as users run it: one-off commands and `relay run` subprocesses, each with exactly
the RELAY_* settings given (none inherited from the caller's environment)."""

from __future__ import annotations

import functools
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from devtools.broker import names, simple_topology, write_topology
from devtools.outbox import owners
from devtools.scrape import answers_ok
from devtools.servers import wait_until
from relay.buckets import fair_share
from relay.constants import OUTBOX_BUCKETS
from relay.settings import ENV_PREFIX

RELAY = [sys.executable, "-m", "relay"]


def relay_env(**variables: str) -> dict[str, str]:
    """This process's environment without its RELAY_* variables, plus ``variables``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env.update(variables)
    return env


def relay_on_new_queue(
    directory: Path, prefix: str, database_url: str, amqp_url: str, **variables: str
) -> tuple[str, str, dict[str, str]]:
    """(exchange, queue, env): a topic exchange bound to a queue for every routing key, both
    newly named from ``prefix``, in a topology file written to ``directory``; and the
    environment of a relay on that topology, ``database_url`` and ``amqp_url``, with the
    other RELAY_* ``variables`` given."""
    exchange, queue = names(prefix)
    topology = write_topology(directory / "topology.toml", simple_topology(exchange, queue))
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=amqp_url,
        RELAY_TOPOLOGY_FILE=str(topology),
        **variables,
    )
    return exchange, queue, env


def skewed(env: dict[str, str], offset: str) -> dict[str, str]:
    """``env`` with this host's wall clock ``offset`` away for the process (Debian's
    libfaketime, ``"+10m"``, ``"-10m"``), as a drifted NTP would leave it: the monotonic
    clock is left alone. Python's ``time.sleep`` then fails (libfaketime 0.9.10's
    ``clock_nanosleep`` answers EINVAL for a real monotonic clock); `relay run` never calls
    it. See ``skew_unavailable``."""
    return {
        **env,
        "LD_PRELOAD": _faketime_library() or "",
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def skew_unavailable() -> str | None:
    """Why ``skewed`` cannot work here (no libfaketime, a Python it does not reach), or None."""
    if _faketime_library() is None:
        return "libfaketime is not installed (Debian package faketime)"
    probe = "import time; print(time.time() - float(input()), time.monotonic())"
    try:
        before = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", probe],
            env=skewed(dict(os.environ), "+1h"),
            input=f"{time.time()}\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        ahead, monotonic = float(out[0]), float(out[1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        return f"a process under libfaketime did not run: {exc}"
    if not 3500 < ahead < 3700:
        return f"LD_PRELOAD of libfaketime did not move the clock (off by {ahead:.0f} s)"
    if not before <= monotonic < time.monotonic() + 1:
        return "libfaketime moved the monotonic clock too"
    return None


def _faketime_library() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def relay_from(checkout: Path) -> list[str]:
    """`relay run` of another checkout (a git worktree), on this environment's packages: its
    ``relay`` package first on the path, before this one's (installed editable)."""
    start = (
        f"import sys; sys.path.insert(0, {str(checkout.resolve())!r}); from relay.cli import main"
    )
    return [sys.executable, "-c", f"{start}; sys.exit(main())", "run"]


# A subprocess's ResourceWarnings (a socket or a file collected unclosed) are printed to its
# stderr, each time: the tests' filter, which makes them errors, stops at their process, and
# a plain interpreter shows none. Every `relay` subprocess here runs with it, and its end
# fails on one (``no_leaks``).
SUBPROCESS_WARNINGS = "always::ResourceWarning"


def with_warnings(env: dict[str, str]) -> dict[str, str]:
    return {"PYTHONWARNINGS": SUBPROCESS_WARNINGS, **env}


def no_leaks(command: Sequence[str], stderr: str) -> None:
    """An AssertionError if ``stderr`` shows a ResourceWarning: ``command`` left a socket or
    a file to the collector."""
    leaks = [line for line in stderr.splitlines() if "ResourceWarning" in line]
    assert not leaks, f"{list(command)} left resources unclosed: {leaks}"


def relay(
    *args: str, env: dict[str, str], input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run one `relay` command to its end; its output as text (``no_leaks``)."""
    done = subprocess.run(
        [*RELAY, *args],
        env=with_warnings(env),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    no_leaks(done.args, done.stderr)
    return done


class RelayProcess:
    """One `relay run` subprocess; its stderr goes to ``log_path`` (or is inherited).
    ``command``: what runs it (`relay run` itself, or a test's wrapper around it)."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path | None = None,
        command: Sequence[str] = (*RELAY, "run"),
    ) -> None:
        self.env = env
        self.log_path = log_path
        self.command = list(command)
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False

    def start(self) -> Self:
        env = with_warnings(self.env)
        if self.log_path is None:
            self.proc = subprocess.Popen(self.command, env=env)
        else:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(self.command, env=env, stderr=log)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; the exit code (killed, and TimeoutExpired raised, if it hangs).
        An AssertionError if its log shows a ResourceWarning (``no_leaks``)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.end()  # the hang is the failure to report, whatever its log says
                raise
        no_leaks(self.command, self.log())
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL and wait: a crash, so nothing is collected at its end, but what it left
        unclosed while running shows in its log (``no_leaks``)."""
        self.end()
        no_leaks(self.command, self.log())

    def end(self) -> None:
        """SIGKILL and wait, whatever its log says: a test that failed is ending it."""
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
            self.end()


def wait_sharing(database_url: str, ports: Sequence[int], timeout: float = 60) -> None:
    """Until the relays serving /metrics on ``ports`` (on 127.0.0.1) are ready and share the
    outbox's buckets out, a fair share each: before that, the first one up may hold them all."""
    for port in ports:
        ready = f"http://127.0.0.1:{port}/readyz"
        wait_until(functools.partial(answers_ok, ready), timeout, "a relay ready")
    share = fair_share(len(ports))
    fair = sorted([share] * (len(ports) - 1) + [OUTBOX_BUCKETS - share * (len(ports) - 1)])
    shared = lambda: sorted(owners(database_url).values()) == fair  # noqa: E731
    wait_until(shared, timeout, "the buckets shared out")


def run_relay_until(
    env: dict[str, str], log_path: Path, done: Callable[[], bool], what: str, timeout: float = 60
) -> int:
    """`relay run` until ``done()`` (at most ``timeout`` seconds), then SIGTERM; its exit code."""
    with RelayProcess(env, log_path) as proc:
        wait_until(done, timeout, what)
        return proc.stop()
