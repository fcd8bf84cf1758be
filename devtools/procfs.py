"""What Linux's /proc says about a process: CPU time, of itself or of its whole tree, and
resident memory. Each reader returns 0 for a process that is gone."""

from __future__ import annotations

import os
from pathlib import Path

# stat(5) fields 14-17 (utime, stime, cutime, cstime) and 4 (ppid), counted from field 3,
# the first one after the command name's closing parenthesis.
_UTIME, _STIME, _CUTIME, _CSTIME, _PPID = 11, 12, 13, 14, 1


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _ticks(fields: list[str], *columns: int) -> float:
    return sum(int(fields[c]) for c in columns) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time process ``pid`` has used so far."""
    fields = _stat(pid)
    return 0.0 if fields is None else _ticks(fields, _UTIME, _STIME)


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """User and system CPU time each living thread of process ``pid`` has used so far, by
    thread id (the main thread's is ``pid``)."""
    try:
        tids = [int(entry.name) for entry in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return {}
    seconds = {}
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        seconds[tid] = _ticks(fields, _UTIME, _STIME)
    return seconds


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and every descendant, living or already reaped: a server that
    forks a process per connection (PostgreSQL) or runs helpers (RabbitMQ's Erlang VM) is
    measured whole. A reaped child's time sits in its parent's cutime/cstime, and a living
    one's in its own utime/stime, so each second is counted once."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[_PPID]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if current in stats:
            total += _ticks(stats[current], _UTIME, _STIME, _CUTIME, _CSTIME)
        todo.extend(children.get(current, ()))
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB."""
    return _status_mb(pid, "VmRSS")


def peak_rss_mb(pid: int) -> float:
    """The most resident memory process ``pid`` has had so far (its high-water mark), MiB."""
    return _status_mb(pid, "VmHWM")


def _status_mb(pid: int, field: str) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0
