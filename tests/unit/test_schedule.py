"""The suite's own schedule (tests/support/schedule.py): the slowest units first, a group's
tests together and in their order, lengths read from a run's ``--durations`` report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from devtools.durations import lengths
from tests.support.schedule import ONE_PROCESS, SlowestFirst, one_process


@dataclass
class Item:
    nodeid: str


def ordered(items: list[Item], seconds: dict[str, float]) -> list[str]:
    as_items = cast(list[pytest.Item], items)
    SlowestFirst(seconds).pytest_collection_modifyitems(as_items)
    return [item.nodeid for item in as_items]


def test_the_longest_first_and_the_unmeasured_last_in_their_order() -> None:
    items = [Item("a"), Item("b"), Item("c"), Item("d"), Item("e")]
    seconds = {"b": 5.0, "d": 50.0, "e": 1.0}
    assert ordered(items, seconds) == ["d", "b", "e", "a", "c"]


def modules_of(group: str) -> list[str]:
    return [module for module, named in ONE_PROCESS.items() if named == group]


def test_a_group_of_one_process_moves_whole_by_its_sum_and_keeps_its_order() -> None:
    writer, jdbc, *_others = modules_of("spark")
    c1, c2 = f"{writer}::test_c1", f"{writer}::test_c2"
    c3 = f"{jdbc}::test_c3"
    items = [Item("x"), Item(c1), Item("y"), Item(c2), Item(c3)]
    # The group: 3 + 3 + 3 = 9 s across two modules, more than y's 8 s though each of its
    # tests is shorter.
    seconds = {"x": 1.0, "y": 8.0, c1: 3.0, c2: 3.0, c3: 3.0}
    assert ordered(items, seconds) == [c1, c2, c3, "y", "x"]


@pytest.mark.parametrize(
    ("nodeid", "group"),
    [
        ("tests/cluster/test_rabbitmq_cluster.py::test_c1[rabbitmq4.0]", "rabbitmq-cluster"),
        ("tests/spark/test_writer.py::test_rows[sqlite]", "spark"),
        ("tests/spark/test_jdbc.py::test_append", "spark"),
        ("tests/spark/test_streams.py::test_a_file_stream", "spark"),  # drivers of its own
        ("tests/cluster/test_spark_cluster.py::test_a_worker_killed", "spark"),
        ("tests/unit/test_schedule.py::test_x", None),
        ("tests/e2e/test_spark_like.py::test_x", None),
    ],
)
def test_the_process_group_of_a_test_is_its_modules(nodeid: str, group: str | None) -> None:
    assert one_process(nodeid) == group


def test_lengths_add_up_a_tests_phases_and_drop_the_group_suffix() -> None:
    report = """
============================= slowest 80 durations =============================
203.12s setup    tests/cluster/test_rabbitmq_cluster.py::test_c1_kill@rabbitmq-cluster
61.50s call     tests/cluster/test_rabbitmq_cluster.py::test_c1_kill@rabbitmq-cluster
12.00s call     tests/spark/test_writer.py::test_rows[a@b]
0.50s teardown tests/spark/test_writer.py::test_rows[a@b]
1 passed in 300.00s
"""
    assert lengths(report) == {
        "tests/cluster/test_rabbitmq_cluster.py::test_c1_kill": pytest.approx(264.62),
        "tests/spark/test_writer.py::test_rows[a@b]": pytest.approx(12.5),
    }
