"""py-spy sampling one process for the benchmarks, and what its samples say."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path


class Profiler:
    """py-spy sampling one process (every thread, native code excluded) into a raw file."""

    def __init__(self, pid: int, out: Path) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            raise SystemExit("--profile needs py-spy: pip install py-spy")
        self.out = out
        self.proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--output",
                str(out),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> list[tuple[str, float, float]]:
        """(function, % of samples on top of the stack, % anywhere in it), the 20 first."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        own: Counter[str] = Counter()
        anywhere: Counter[str] = Counter()
        total = 0
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [
                f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0] + ")"
                for f in stack.split(";")[1:]
            ]  # the first is the thread
            if not frames:
                continue
            total += int(count)
            own[frames[-1]] += int(count)
            for frame in set(frames):
                anywhere[frame] += int(count)
        return [(f, 100 * n / total, 100 * anywhere[f] / total) for f, n in own.most_common(20)]
