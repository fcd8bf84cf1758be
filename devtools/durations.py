"""The suite's measured test lengths, for its schedule (tests/support/schedule.py).

    .venv/bin/pytest -n 4 --dist loadgroup --durations=150 -q | tee /tmp/run.txt
    .venv/bin/python -m devtools.durations /tmp/run.txt > tests/support/durations.txt

reads the ``--durations`` report of a run (``12.34s call     tests/...::test[...]``) and
writes each test's setup, call and teardown added up, longest first, from a second up.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$")
SHORTEST_S = 1.0  # below it a test's place in the schedule changes nothing


def lengths(report: str) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for line in report.splitlines():
        found = LINE.match(line)
        if found:
            nodeid = found.group(3)
            at = nodeid.rfind("@")
            if at > nodeid.rfind("]"):  # the group --dist loadgroup appends
                nodeid = nodeid[:at]
            seconds[nodeid] += float(found.group(1))
    return seconds


def main(argv: list[str]) -> int:
    (path,) = argv
    seconds = lengths(Path(path).read_text(errors="replace"))
    print(f"# seconds per test in a measured run ({Path(__file__).name}): its schedule's order")
    for nodeid, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if value >= SHORTEST_S:
            print(f"{value:.1f} {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
