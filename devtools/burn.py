"""A CPU hog: processes that spin until stopped, to load the machine as other work beside the
suite does (CI's outside run saw a load of 6 to 12 on two cores). A test that fails only
beside it waits on a wall-clock window, or the product starves under load: either is a
finding. By hand, from the repository root:

    python -m devtools.burn            three spinners per core, until Ctrl-C
    python -m devtools.burn 8          eight
"""

from __future__ import annotations

import multiprocessing
import os
import sys

# Spinners per core: a load of three times the cores, the middle of what CI's run saw.
PER_CORE = 3


def spin() -> None:
    while True:
        pass


def main(argv: list[str]) -> None:
    count = int(argv[0]) if argv else PER_CORE * (os.cpu_count() or 1)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    print(f"{count} spinners (pids {' '.join(str(s.pid) for s in spinners)}); Ctrl-C stops them")
    try:
        for spinner in spinners:
            spinner.join()
    except KeyboardInterrupt:
        pass
    finally:
        for spinner in spinners:
            spinner.terminate()


if __name__ == "__main__":
    main(sys.argv[1:])
