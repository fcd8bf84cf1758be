"""The wheel carries the migrations, so `relay migrate` works from an installed package."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_package_and_its_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("outbox_relay-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("relay/cli.py", "relay/migrations/env.py", "relay/migrations/script.py.mako",
                     "relay/migrations/versions/0001_outbox.py"):  # fmt: skip
        assert expected in names
    assert not any(n.startswith(("tests/", "bench/", "examples/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "relay = relay.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
