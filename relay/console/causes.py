"""Pure: a parked row's cause, from its last error: the error's class and the stable part
of its message, so that rows parked for one reason group together whatever ids, numbers or
names their messages carry.

The relay writes ``outcome: detail`` (``relay.settle``: ``returned: 312 NO_ROUTE``,
``failed: 404 NOT_FOUND - no exchange 'orders-7' in vhost '/'``); the inbox writes
``Type: message``. The class is the part before the first colon, when it is one word; in
the rest, quoted text becomes ``'…'`` and numbers, hex and UUIDs ``#``, except the
three-digit AMQP reply codes, which are the reason itself (312, 404, 406).
"""

from __future__ import annotations

import re

_CLASS = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*(.*)$", re.DOTALL)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_REPLY_CODE = re.compile(r"^\d{3}$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def _number(match: re.Match[str]) -> str:
    return match[0] if _REPLY_CODE.match(match[0]) else "#"


def cause_of(last_error: str) -> str:
    """``last_error``'s cause: ``class: stable message`` (or the stable message alone)."""
    found = _CLASS.match(last_error)
    kind, message = (found[1], found[2]) if found else ("", last_error)
    stable = _QUOTED.sub("'…'", message)
    stable = _UUID.sub("#", stable)
    stable = _HEX.sub("#", stable)
    stable = _NUMBER.sub(_number, stable)
    stable = _SPACES.sub(" ", stable).strip()
    if not kind:
        return stable or "(no error)"
    return f"{kind}: {stable}" if stable else kind
