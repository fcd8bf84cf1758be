"""``python without_relay.py -m MODULE ARGS...``: ``python -m MODULE ARGS...`` in a Python that
cannot import this package, as a Spark worker's Python where outbox-relay was never
installed (the tests point PYSPARK_PYTHON at a script running this)."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

PACKAGE = "relay"


class Uninstalled(MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == PACKAGE or fullname.startswith(f"{PACKAGE}."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if __name__ == "__main__":
    if sys.argv[1:2] != ["-m"]:
        raise SystemExit(f"usage: {sys.argv[0]} -m MODULE [ARGS...]")
    sys.meta_path.insert(0, Uninstalled())
    sys.argv = [sys.argv[2], *sys.argv[3:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
