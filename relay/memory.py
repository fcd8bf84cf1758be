"""The C allocator's settings for `relay run`: big payloads' memory goes back to the system.

A relay holding big messages allocates buffers of megabytes (a claim's driver result, pika's
frames, the socket's write buffer) and frees them a moment later. glibc serves an allocation
that large from a fresh mmap at first, but raises that threshold each time one is freed, up
to 32 MiB; from then on such buffers come from heaps, one per thread that allocated (the
database calls run in several worker threads), which keep freed memory. A relay passing
messages of 4 MiB one at a time had 59 MiB more resident at its peak than at rest; with the
threshold fixed and two heaps, 32 MiB (tests/integration/test_big_messages.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from relay.constants import MALLOC_ARENAS, MALLOC_MMAP_THRESHOLD_BYTES

log = logging.getLogger(__name__)

# glibc's mallopt(3) parameters.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def return_big_buffers() -> bool:
    """Serve allocations of MALLOC_MMAP_THRESHOLD_BYTES or more by mmap (returned on free)
    and cap the heaps at MALLOC_ARENAS; True where the C library is glibc and took both.
    Call before the worker threads start."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to tune
        log.debug("no mallopt in %s", name, extra={"action": "malloc_untuned"})
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES)
        and mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
    )
