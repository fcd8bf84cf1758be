"""The wheel carries the migrations, so `relay migrate` works from an installed package, and
nothing of the development tooling (private server launchers, test helpers)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_package_and_its_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("outbox_relay-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every module of every subpackage (a package missing from pyproject's list is not).
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "relay").rglob("*.py")}
    assert modules - names == set()
    for expected in ("relay/db/migrations/script.py.mako", "relay/broker/publisher.py"):
        assert expected in names
    assert not any(n.startswith(("tests/", "bench/", "examples/", "devtools/")) for n in names)
    # No launcher of private servers is shipped: nothing in the wheel runs rabbitmq-server,
    # initdb or pg_ctl.
    sources = [zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".py")]
    assert not [s for s in sources if "rabbitmq-server" in s or "pg_ctl" in s or "initdb" in s]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "relay = relay.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_environment_has_the_locked_versions() -> None:
    """scripts/bootstrap installs from requirements/*.txt: what runs here is what is locked."""
    from importlib import metadata

    from packaging.requirements import Requirement

    lock = (ROOT / "requirements" / "test.txt").read_text()
    pinned = [
        Requirement(line.rstrip(" \\"))
        for line in lock.splitlines()
        if line and not line.startswith((" ", "#"))
    ]
    assert len(pinned) > 20
    wrong = {
        str(r): metadata.version(r.name)
        for r in pinned
        if (r.marker is None or r.marker.evaluate()) and metadata.version(r.name) not in r.specifier
    }
    assert wrong == {}


# The optional extras' packages, which the relay and the blocking inbox must do without.
EXTRAS_ONLY = ("greenlet", "aio_pika", "aiormq", "pamqp", "faststream", "aiosqlite", "aiomysql")


def test_the_relay_and_the_blocking_inbox_import_without_the_asyncio_extras() -> None:
    """The container image installs the relay without the ``asyncio`` extra: importing
    SQLAlchemy's asyncio module at the top of the engine's module would fail there."""
    blocked = f"""
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_ONLY!r}:
            raise ImportError(f"{{name}} is not installed")
sys.meta_path.insert(0, Blocked())
import relay.cli, relay.daemon, relay.inbox, relay.db.engine
relay.cli.main(["--help"])
"""
    done = subprocess.run(
        [sys.executable, "-c", blocked],
        check=False,  # its output says why
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert "usage" in done.stdout, done.stderr
