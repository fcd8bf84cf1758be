"""The order the suite's tests are handed to its processes: the slowest first.

``scripts/test`` runs the suite in four processes with ``--dist loadgroup``: each test (or
each group of modules of ``ONE_PROCESS``, kept on one process) is a unit handed to whichever process
is free, in the collection's order. Started last, a test of minutes stretched the run by its whole
length while the other processes idled; started first, the short ones fill in around it.
The lengths come from a measured run (``durations.txt`` beside this file, written by
``python -m devtools.durations``); a test not listed there (a new one) is taken as short,
in its collection order.

What is moved is a unit of the order: a group of ``ONE_PROCESS``, or the tests of a module that
share a fixture of the module's (or a class's) scope, kept together so that each process
sets that fixture up once (pytest tears it down when a process's next test is another
module's), or else a test. A unit's tests keep their order: pytest has already ordered them
so that a parametrized fixture of a wider scope is set up once per value.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

DURATIONS = Path(__file__).with_name("durations.txt")
# Modules whose tests all run in one process, by group. The RabbitMQ cluster, a server long
# to start. Spark's: the local SparkSession (a JVM of a gigabyte, 20 to 40 s of CPU to start
# and warm, which every process that drew one of these tests paid), and the drivers,
# clusters and Spark Connect server the others start, JVMs as heavy: handed out slowest
# first, four of them started at once on two cores, and under CI's load drivers missed their
# 180 s (a CI run of the previous stop: three Spark tests failed so). Not xdist_group marks:
# xdist (3.8) groups by a suffix it writes into each test's id, which pytest 9.2 no longer
# reads.
ONE_PROCESS = {
    "tests/cluster/test_rabbitmq_cluster.py": "rabbitmq-cluster",
    **dict.fromkeys(
        (
            "tests/spark/test_writer.py",
            "tests/spark/test_connect.py",
            "tests/spark/test_jdbc.py",
            "tests/spark/test_streams.py",
            "tests/spark/test_broken.py",
            "tests/spark/test_demo.py",
            "tests/cluster/test_spark_cluster.py",
        ),
        "spark",
    ),
}


def measured(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test id (setup, call and teardown), from ``path``'s ``seconds id`` lines."""
    if not path.exists():
        return {}
    seconds: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            value, nodeid = line.split(maxsplit=1)
            seconds[nodeid] = float(value)
    return seconds


def plain_id(item: pytest.Item) -> str:
    """The test's id without the group xdist appends under ``--dist loadgroup`` (``@name``)."""
    nodeid = item.nodeid
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


WIDER_SCOPES = {"class", "module", "package"}


def one_process(nodeid: str) -> str | None:
    """The group of ``ONE_PROCESS`` that ``nodeid``'s module is in, if any."""
    return ONE_PROCESS.get(nodeid.split("::", 1)[0])


def unit_of(item: pytest.Item) -> str:
    group = one_process(item.nodeid)
    if group is not None:
        return "group " + group
    if isinstance(item, pytest.Function) and any(
        definitions[-1].scope in WIDER_SCOPES
        for definitions in item._fixtureinfo.name2fixturedefs.values()
    ):
        return "module " + item.nodeid.split("::", 1)[0]
    return plain_id(item)


class SlowestFirst:
    """A plugin: after every other plugin has ordered the items, the units by their measured
    length, longest first (a stable sort: equal units keep the collection's order)."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        units: dict[str, list[pytest.Item]] = defaultdict(list)
        for item in items:
            units[unit_of(item)].append(item)

        def length(unit: list[pytest.Item]) -> float:
            return sum(self.seconds.get(plain_id(item), 0.0) for item in unit)

        ordered = sorted(units.values(), key=length, reverse=True)
        items[:] = [item for unit in ordered for item in unit]


class OneProcessModules(LoadGroupScheduling):  # type: ignore[misc]  # xdist has no types
    """``--dist loadgroup`` whose groups are those of ``ONE_PROCESS``: each other test
    is a unit of its own, handed out in the collection's order (the one above)."""

    def _split_scope(self, nodeid: str) -> str:
        return one_process(nodeid) or nodeid
