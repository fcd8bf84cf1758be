"""RabbitMQ 4.0 for the tests and benchmarks: Debian 13's package, in a Debian 13 root.

RabbitMQ 4.0.5 (Debian 13's ``rabbitmq-server``) needs Erlang 27 and Debian 13's C library,
so it cannot be installed next to Debian 12's 3.10. A minimal Debian 13 root, made once with
``debootstrap`` into a cache folder (about a minute and 500 MB), holds it; its nodes run
there through ``chroot`` and share the host's network, so clients reach them on loopback as
usual. Building the root and entering it need root; ``unavailable`` says why they cannot be
used on a machine.

Inside the root, RabbitMQ reads ``/proc`` (its memory monitor), and a node keeps its files
in a directory of the host (a test's temporary directory). Every command therefore runs in a
mount namespace of its own (``unshare --mount``) with ``/proc`` mounted and that directory
bound at the same path inside the root: the mounts go away with the command, the host is
never left with a mount inside the cache, and paths mean the same inside and out.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

SUITE = "trixie"  # Debian 13
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("rabbitmq-server",)
ROOT_ENV = "OUTBOX_RELAY_DEBIAN13_ROOT"  # where the root is kept, instead of the cache folder
# What is installed when the root is ready: the last thing built, so a half-built root (an
# interrupted build) is never taken for a ready one.
READY_MARK = "outbox-relay-ready"
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
BUILD_TIMEOUT_S = 900
# Enter the root given as $0 with /proc mounted and the host directory $1 bound at the same
# path, and run the rest with only the environment given on the command line (env -i): the
# host's variables mean nothing inside.
_ENTER = (
    'root=$0 dir=$1; shift; mount -t proc proc "$root/proc" && mkdir -p "$root$dir" && '
    'mount --bind "$dir" "$root$dir" && exec chroot "$root" /usr/bin/env -i "$@"'
)


class RootError(RuntimeError):
    """The Debian 13 root could not be built; the message says what failed and where."""


def default_root() -> Path:
    if ROOT_ENV in os.environ:
        return Path(os.environ[ROOT_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "outbox-relay" / f"debian-{SUITE}"


def unavailable() -> str | None:
    """Why RabbitMQ 4.0 cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot and a mount namespace for the Debian 13 root)"
    for tool in ("debootstrap", "unshare", "chroot"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian: apt-get install debootstrap util-linux coreutils)"
    return None


def command(root: Path, argv: Sequence[str], env: Mapping[str, str], shared: Path) -> list[str]:
    """The host command line that runs ``argv`` inside ``root`` with exactly ``env``, and
    the host's directory ``shared`` (absolute) at the same path."""
    variables = [f"{k}={v}" for k, v in {"PATH": PATH, **env}.items()]
    enter = ["unshare", "--mount", "--propagation", _propagation(), "sh", "-c", _ENTER]
    return [*enter, str(root), str(shared), *variables, *argv]


@functools.cache
def _propagation() -> str:
    """How the namespace's mounts are kept from the host's: ``private``. Inside a chroot
    (a minimal test machine is one) unshare cannot make "/" private, as it is no mount point
    there; if no mount on the machine propagates (``shared:`` in mountinfo), "unchanged" is
    as good. Otherwise the mounts could leak into the host: refused."""
    probe = ["unshare", "--mount", "--propagation", "private", "true"]
    if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return "private"
    if "shared:" not in Path("/proc/self/mountinfo").read_text():
        return "unchanged"
    raise RootError("cannot make a private mount namespace here (unshare --propagation private)")


def ensure_root(root: Path | None = None) -> Path:
    """The Debian 13 root with RabbitMQ installed, built first if it is not there yet.
    Several processes may ask at once: one builds, the others wait for it."""
    root = root or default_root()
    if (root / READY_MARK).exists():
        return root
    reason = unavailable()
    if reason is not None:
        raise RootError(f"cannot build the Debian 13 root in {root}: {reason}")
    root.parent.mkdir(parents=True, exist_ok=True)
    with _locked(root.parent / f".{root.name}.lock"):
        if not (root / READY_MARK).exists():
            _build(root)
    return root


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(root: Path) -> None:
    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    log = root.with_name(root.name + ".log")
    with log.open("w") as out:
        bootstrap = ["debootstrap", "--variant=minbase", "--include=ca-certificates", SUITE]
        _run([*bootstrap, str(building), MIRROR], out, log)
        shutil.copyfile("/etc/resolv.conf", building / "etc" / "resolv.conf")
        # Packages must not try to start their services in the root (there is no init).
        policy = building / "usr" / "sbin" / "policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        install = "apt-get update -q && apt-get install -y -q --no-install-recommends " + " ".join(
            PACKAGES
        )
        env = {"DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
        argv = ["sh", "-c", install + " && apt-get clean"]
        _run(command(building, argv, env, building / "tmp"), out, log)
    (building / READY_MARK).write_text(f"{SUITE}: {' '.join(PACKAGES)}\n")
    shutil.rmtree(root, ignore_errors=True)
    building.rename(root)


def _run(argv: list[str], out: IO[str], log: Path) -> None:
    try:
        subprocess.run(
            argv, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=True
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise RootError(f"building the Debian 13 root failed ({exc}); see {log}") from exc
