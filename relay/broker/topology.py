"""The broker topology the relay declares on every connect, read from a TOML file.

Declaring on every connect makes a fresh or reset broker usable without a separate setup
step, and a mismatch (an existing queue with other arguments) fails loudly at connect time
instead of silently routing nowhere.

    [[exchange]]
    name = "orders"
    type = "topic"                        # direct, fanout, topic, headers
    alternate_exchange = "orders.unrouted" # optional: where unroutable messages go

    [[queue]]
    name = "orders.created"
    arguments = { "x-queue-type" = "quorum", "x-delivery-limit" = 20 }

    [[binding]]
    exchange = "orders"
    queue = "orders.created"
    routing_key = "order.created"
"""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relay.errors import ConfigError

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
QUEUE_TYPES = ("classic", "quorum", "stream")
# Replicated queues (quorum, stream) keep messages on several nodes, so they exist only as
# durable queues; the broker refuses anything else (PRECONDITION_FAILED at every connect).
REPLICATED = ("quorum", "stream")
# Queue arguments that must be whole numbers above zero, where the broker would refuse
# (or, for some, silently ignore) anything else.
POSITIVE_ARGUMENTS = ("x-delivery-limit", "x-quorum-initial-group-size", "x-max-length")
Arguments = dict[str, Any]


@dataclass(frozen=True)
class Exchange:
    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str | None = None
    arguments: Arguments = field(default_factory=dict)

    def declare_arguments(self) -> Arguments:
        args = dict(self.arguments)
        if self.alternate_exchange:
            args["alternate-exchange"] = self.alternate_exchange
        return args


@dataclass(frozen=True)
class Queue:
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: Arguments = field(default_factory=dict)


@dataclass(frozen=True)
class Binding:
    exchange: str
    queue: str
    routing_key: str = ""
    arguments: Arguments = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    exchanges: tuple[Exchange, ...] = ()
    queues: tuple[Queue, ...] = ()
    bindings: tuple[Binding, ...] = ()


_TYPES = {
    "name": str,
    "type": str,
    "durable": bool,
    "auto_delete": bool,
    "internal": bool,
    "alternate_exchange": str,
    "arguments": dict,
    "exchange": str,
    "queue": str,
    "routing_key": str,
}


# Calls a pika channel method that answers through the callback named, and awaits the answer.
Rpc = Callable[..., Awaitable[Any]]


async def declare(topology: Topology, ch: Any, rpc: Rpc) -> None:
    """Declare ``topology`` on the pika channel ``ch``, one answered call after another."""
    for e in topology.exchanges:
        await rpc(
            ch.exchange_declare,
            "callback",
            exchange=e.name,
            exchange_type=e.type,
            durable=e.durable,
            auto_delete=e.auto_delete,
            internal=e.internal,
            arguments=e.declare_arguments(),
        )
    for q in topology.queues:
        await rpc(
            ch.queue_declare,
            "callback",
            queue=q.name,
            durable=q.durable,
            auto_delete=q.auto_delete,
            arguments=q.arguments,
        )
    for b in topology.bindings:
        await rpc(
            ch.queue_bind,
            "callback",
            queue=b.queue,
            exchange=b.exchange,
            routing_key=b.routing_key,
            arguments=b.arguments,
        )


def load_topology(path: Path | None) -> Topology:
    if path is None:
        return Topology()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"RELAY_TOPOLOGY_FILE={path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"RELAY_TOPOLOGY_FILE={path}: not valid TOML: {exc}") from None
    return parse_topology(data, str(path))


def parse_topology(data: dict[str, Any], where: str) -> Topology:
    unknown = set(data) - {"exchange", "queue", "binding"}
    if unknown:
        raise ConfigError(
            f"{where}: unknown section {sorted(unknown)[0]!r} "
            "(expected [[exchange]], [[queue]], [[binding]])"
        )
    exchanges = tuple(
        _build(Exchange, item, f"{where}: exchange[{i}]")
        for i, item in enumerate(_tables(data, "exchange", where))
    )
    queues = tuple(
        _build(Queue, item, f"{where}: queue[{i}]")
        for i, item in enumerate(_tables(data, "queue", where))
    )
    bindings = tuple(
        _build(Binding, item, f"{where}: binding[{i}]")
        for i, item in enumerate(_tables(data, "binding", where))
    )
    for i, exchange in enumerate(exchanges):
        if exchange.type not in EXCHANGE_TYPES:
            raise ConfigError(
                f"{where}: exchange[{i}] {exchange.name!r}: type must be one of "
                f"{', '.join(EXCHANGE_TYPES)}"
            )
    for i, queue in enumerate(queues):
        _check_queue(queue, f"{where}: queue[{i}] {queue.name!r}")
    queue_names = {q.name for q in queues}
    exchange_names = {e.name for e in exchanges}
    for i, binding in enumerate(bindings):
        if binding.queue not in queue_names:
            raise ConfigError(f"{where}: binding[{i}]: queue {binding.queue!r} is not declared")
        if binding.exchange not in exchange_names:
            raise ConfigError(
                f"{where}: binding[{i}]: exchange {binding.exchange!r} is not declared"
            )
    return Topology(exchanges, queues, bindings)


def _check_queue(queue: Queue, where: str) -> None:
    """What RabbitMQ (3.10 and 4.x alike) would refuse at connect time, said at start-up."""
    kind = queue.arguments.get("x-queue-type", "classic")
    if kind not in QUEUE_TYPES:
        raise ConfigError(f"{where}: x-queue-type must be one of {', '.join(QUEUE_TYPES)}")
    if kind in REPLICATED and (not queue.durable or queue.auto_delete):
        raise ConfigError(f"{where}: a {kind} queue must be durable and not auto_delete")
    for name in POSITIVE_ARGUMENTS:
        value = queue.arguments.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ConfigError(f"{where}: {name} must be a whole number of at least 1")


def _tables(data: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ConfigError(f"{where}: {key} must be an array of tables ([[{key}]])")
    return items


def _build(cls: Any, item: dict[str, Any], where: str) -> Any:
    allowed = set(cls.__dataclass_fields__)
    for key, value in item.items():
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})"
            )
        if not isinstance(value, _TYPES[key]):
            raise ConfigError(f"{where}: {key} must be a {_TYPES[key].__name__}")
    for key in ("exchange", "queue") if cls is Binding else ("name",):
        if not item.get(key):
            raise ConfigError(f"{where}: {key} is required")
    return cls(**item)
