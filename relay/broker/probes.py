"""Probes of broken destinations (``relay.broker.destinations``), each on a channel of its own
of the session, so that whatever it does cannot close the confirm channel:

- a missing exchange (404) is declared passively, on a timer: a declare-ok means it exists;
- a refused exchange (403) gets a trial: one of its rows published alone. Its outcome is
  judged as every publish on the confirm channel is, by a ``ConfirmTracker`` (of its own),
  and the outcome says what became of the exchange: any answer (ack, nack, return) means it
  takes messages again, a close by the broker that it still does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions

from relay.broker.blame import blame
from relay.broker.confirms import ConfirmTracker
from relay.broker.connection import resolve
from relay.broker.destinations import Destinations
from relay.broker.session import Session, returned
from relay.errors import BrokerError
from relay.records import OutboxRow, Outcome, Settlement

# Sends rows on a channel, recording what became of each in a tracker; those that went out.
Send = Callable[[Any, Sequence[OutboxRow], ConfirmTracker], list[OutboxRow]]


class Probes:
    """``back(exchange, how)`` is called when a probe finds an exchange again; a trial row's
    outcome goes to ``record``."""

    def __init__(
        self,
        session: Session,
        destinations: Destinations,
        *,
        confirm_timeout: float,
        send: Send,
        record: Callable[[Settlement], None],
        back: Callable[[str, str], None],
    ) -> None:
        self._session = session
        self._destinations = destinations
        self._timeout = confirm_timeout
        self._send = send
        self._record = record
        self._back = back
        self._trials: dict[str, OutboxRow] = {}  # exchange -> its trial row, out alone
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._trials)

    def trial(self, row: OutboxRow) -> None:
        """Publish ``row``, of a refused exchange whose probe is due, alone."""
        self._trials[row.exchange] = row
        self._spawn(self._trial(row))

    def declare_due(self, now: float) -> None:
        """Declare passively the missing exchanges whose probe is due."""
        for exchange in self._destinations.declares_due(now):
            self._spawn(self._declare_passively(exchange))

    def lost(self, reason: str) -> None:
        """The connection is gone: the trials' rows with it (due again), the probes unsettled."""
        for exchange, row in self._trials.items():
            self._record(Settlement(row, Outcome.LOST, reason))
            self._destinations.abandoned(exchange)
        self._trials.clear()

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _declare_passively(self, exchange: str) -> None:
        loop = asyncio.get_running_loop()
        declared: asyncio.Future[Any] = loop.create_future()
        closed: asyncio.Future[BaseException] = loop.create_future()
        channel: Any = None
        try:
            async with asyncio.timeout(self._timeout):
                channel = await self._session.side_channel(closed)
                channel.exchange_declare(
                    exchange, passive=True, callback=lambda f: resolve(declared, f)
                )
                await asyncio.wait({declared, closed}, return_when=asyncio.FIRST_COMPLETED)
        except (BrokerError, TimeoutError, pika.exceptions.AMQPError):
            if channel is not None and channel.is_open:
                channel.close()
            self._destinations.failed(exchange, None, loop.time())
            return
        if declared.done():
            channel.close()
            self._back(exchange, "a passive declare found it")
            return
        why = closed.result()
        if isinstance(why, pika.exceptions.ChannelClosedByBroker):
            reason = f"{why.reply_code} {why.reply_text}"
            self._destinations.failed(exchange, reason, loop.time())
        else:
            self._destinations.abandoned(exchange)

    async def _trial(self, row: OutboxRow) -> None:
        loop = asyncio.get_running_loop()
        judge = ConfirmTracker(self._timeout)
        answered: asyncio.Future[Any] = loop.create_future()
        closed: asyncio.Future[Any] = loop.create_future()
        channel: Any = None

        def on_confirm(frame: Any) -> None:
            method = frame.method
            if isinstance(method, pika.spec.Basic.Ack):
                judge.on_ack(method.delivery_tag, method.multiple, loop.time())
            else:
                judge.on_nack(method.delivery_tag, method.multiple, loop.time())
            resolve(answered, None)

        sent, refusal = False, None
        try:
            async with asyncio.timeout(self._timeout):
                channel = await self._session.side_channel(closed)
                channel.add_on_return_callback(
                    lambda _ch, method, props, _body: judge.on_return(
                        props.message_id, returned(method)
                    )
                )
                await self._session.rpc(channel.confirm_delivery, "callback", on_confirm)
        except (BrokerError, TimeoutError, pika.exceptions.AMQPError) as exc:
            why = f": {exc}" if str(exc) else ""
            judge.lose([row], f"no channel for a trial{why}")
        else:
            sent = bool(self._send(channel, [row], judge))
            if sent:
                await asyncio.wait(
                    {answered, closed}, timeout=self._timeout, return_when=asyncio.FIRST_COMPLETED
                )
                refusal = _unanswered(judge, row, closed, loop.time())
        if channel is not None and channel.is_open:
            channel.close()
        (settled,) = judge.take_settled()
        if self._trials.get(row.exchange) is not row:
            return  # the session's end recorded it first
        del self._trials[row.exchange]
        self._record(settled)
        if not sent or settled.outcome is Outcome.LOST:
            self._destinations.abandoned(row.exchange)  # no verdict: the next may try at once
        elif settled.outcome in (Outcome.FAILED, Outcome.TIMED_OUT):
            self._destinations.failed(row.exchange, refusal, loop.time())
        else:  # acked, nacked or returned: an answer
            self._back(row.exchange, "a row tried alone was accepted")


def _unanswered(
    judge: ConfirmTracker, row: OutboxRow, closed: asyncio.Future[Any], now: float
) -> str | None:
    """Judge a trial row still unanswered: its channel closed (by the broker, for it: the
    broker's reason is returned; or with the connection), or the broker said nothing for the
    confirm timeout (``judge`` times it out)."""
    if not judge.in_flight:
        return None  # answered
    if not closed.done():
        judge.expire(now)
        return None
    why = closed.result()
    if not isinstance(why, pika.exceptions.ChannelClosedByBroker):
        judge.channel_lost(f"trial channel closed: {why!r}")
        return None
    verdict = blame(why.reply_code, why.reply_text, row)
    judge.channel_lost(
        verdict.innocent_reason, verdict.culprit, verdict.culprit_reason, verdict.suspects
    )
    return f"{why.reply_code} {why.reply_text}"
