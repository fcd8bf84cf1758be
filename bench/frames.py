"""Benchmark: the CPU a publish's frames cost, encoded by pika's ``basic_publish`` or by the
relay (``relay.broker.frames``).

    .venv/bin/python -m bench.frames [--messages 100000] [--rounds 5] [--payload-bytes 200]

Builds the relay's messages (``relay.message.build``: a message id, a timestamp, persistent,
no headers) once, then in interleaved rounds encodes every one of them both ways, on a
channel of a connection that negotiated RabbitMQ's default frame_max, with no socket: pika's
output is a list (``devtools.pikawire``). Shows this process's CPU per message (medians) and
the ratio; the last line is one JSON object. By hand only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from devtools.pikawire import PikaWire
from relay.broker.frames import PublishFrames
from relay.message import Limits, Message, build
from relay.records import OutboxRow

FRAME_MAX = 131072
CHANNEL = 1


def messages(count: int, payload: bytes) -> list[Message]:
    created = datetime.now(UTC)
    rows = (
        OutboxRow(
            i, f"bench-{i:012d}", "bench", "bench", payload, "application/json", None, created, 0
        )
        for i in range(count)
    )
    return [build(row, Limits(frame_max=FRAME_MAX)) for row in rows]


def by_pika(batch: list[Message]) -> None:
    wire = PikaWire(CHANNEL, FRAME_MAX)
    for message in batch:
        wire.publish(message)


def by_relay(batch: list[Message]) -> None:
    frames = PublishFrames()
    for m in batch:
        frames.encode(CHANNEL, m, mandatory=True, frame_max=FRAME_MAX)


def per_message_us(encode: Callable[[list[Message]], None], batch: list[Message]) -> float:
    start = time.process_time()
    encode(batch)
    return (time.process_time() - start) * 1e6 / len(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--payload-bytes", type=int, default=200)
    args = parser.parse_args()
    batch = messages(args.messages, b"x" * args.payload_bytes)
    cases = {"pika_basic_publish": by_pika, "relay_frames": by_relay}
    rounds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, encode in cases.items():
            rounds[name].append(per_message_us(encode, batch))
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    for name, value in medians.items():
        print(f"{name:20s} {value:6.2f} us CPU per message")
    ratio = medians["relay_frames"] / medians["pika_basic_publish"]
    print(f"relay/pika {ratio:.2f} (medians of {args.rounds} interleaved rounds)")
    print(json.dumps({"us_per_message": medians, "rounds": rounds, "relay_over_pika": ratio}))


if __name__ == "__main__":
    main()
