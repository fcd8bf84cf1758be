"""The inbox's three front ends side by side, for its model (``tests.support.inbox_model``):
each a consumer process (``tests.model.consumer``, a forkserver's child) of a queue of its
own bound to one exchange, reaching the broker, and PostgreSQL, through proxies a run can
cut; restarted as a supervisor would when it dies. What each did is read back from the
database (effects, attempts), its dead-letter queue (read without taking), its runs' log
and its own log."""

from __future__ import annotations

import collections
import contextlib
import json
import multiprocessing
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

import pika
import pika.exceptions
import sqlalchemy as sa

from devtools.servers import RabbitNode, ServerError, wait_until
from relay.broker.copies import retry_queue
from relay.broker.deadletters import DeadLetter, dead_letters
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.schema import inbox_attempts
from relay.inbox.policy import RetrySchedule
from tests.model.consumer import Where, effects, metadata, serve
from tests.support.inbox import topology
from tests.support.inbox_model import FLAVOURS, Fate
from tests.support.proxy import TcpProxy

# The consumers' settings: few attempts, short delays (retries, back-off), a prefetch that
# holds several deliveries when a consumer stops.
MAX_ATTEMPTS = 3
RETRIES = (1, 0.05, 0.2)  # immediate retries, the first delay, the longest (seconds)
CONSUMER_SETTINGS = {
    "RELAY_INBOX_IMMEDIATE_RETRIES": str(RETRIES[0]),
    "RELAY_INBOX_RETRY_DELAY": str(RETRIES[1]),
    "RELAY_INBOX_RETRY_DELAY_MAX": str(RETRIES[2]),
    "RELAY_BACKOFF_INITIAL": "0.05",
    "RELAY_RECONNECT_MAX": "0.5",
    "RELAY_LOG_LEVEL": "INFO",
}
PREFETCH = 4
# How long a cut database refuses connections: longer than a statement's round trip, short
# enough that a consumer's back-off finds it again at once.
DATABASE_AWAY_S = 0.5


def forkserver() -> ForkServerContext:
    """The forkserver the consumers are forked from, the inbox and its drivers imported once."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.model.consumer"])
    return context


@dataclass
class Seen:
    """What became of one message at one front end."""

    full: int  # its effects committed with its key
    parts: int  # committed past tx
    runs: int  # its handler's runs
    letters: list[DeadLetter]
    last_error: str | None


class FrontEnd:
    """One front end's consumer: its queue, directory, proxies and process."""

    def __init__(
        self,
        flavour: str,
        queue: str,
        *,
        database_url: str,
        rabbit: RabbitNode,
        root: Path,
        max_attempts: int,
    ) -> None:
        self.flavour = flavour
        self.max_attempts = max_attempts
        self.queue = queue
        self.where = Where(root)
        self.where.runs.mkdir(parents=True)
        self.rabbit = rabbit
        self.broker = TcpProxy(rabbit.port, cut=self.where.broker_cut)
        url = sa.make_url(database_url)
        self.database: TcpProxy | None = None
        if url.port is not None:  # a server: reached through a proxy a run can cut
            self.database = TcpProxy(
                url.port, cut=self.where.database_cut, refuse_after_cut=DATABASE_AWAY_S
            )
            url = url.set(port=self.database.port)
        self.database_url = url.render_as_string(hide_password=False)
        self.engine = create_engine(database_url)
        self._process: BaseProcess | None = None
        self.restarts = 0

    def __enter__(self) -> FrontEnd:
        self.broker.__enter__()
        if self.database is not None:
            self.database.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.broker.__exit__()
        if self.database is not None:
            self.database.__exit__()
        self.engine.dispose()

    def start(self, context: ForkServerContext) -> None:
        # A cut asked for by a run of the consumer that died is no longer wanted: the
        # connections it was for are gone with it.
        self.where.broker_cut.unlink(missing_ok=True)
        self.where.database_cut.unlink(missing_ok=True)
        environ = {
            **CONSUMER_SETTINGS,
            "RELAY_INBOX_MAX_ATTEMPTS": str(self.max_attempts),
            "RELAY_DATABASE_URL": self.database_url,
            "RELAY_AMQP_URL": self.broker.url(),
            "RELAY_INBOX_QUEUE": self.queue,
            "RELAY_INBOX_PREFETCH": str(PREFETCH),
            "RELAY_NAME": f"model-{self.flavour}",
        }
        self._process = context.Process(
            target=serve, args=(self.flavour, environ, str(self.where.root), PREFETCH)
        )
        self._process.start()

    def died(self) -> bool:
        return self._process is not None and self._process.exitcode is not None

    def stop(self) -> None:
        """SIGTERM: the delivery under way is answered, the rest go back."""
        if self._process is not None and self._process.exitcode is None:
            self._process.terminate()
            self._process.join(30)
            assert self._process.exitcode is not None, f"{self.flavour} did not stop"

    def seen(self, key: str, letters: list[DeadLetter]) -> Seen:
        with self.engine.connect() as conn:
            notes = collections.Counter(
                conn.scalars(
                    sa.select(effects.c.note).where(
                        effects.c.consumer == self.queue, effects.c.message_id == key
                    )
                )
            )
            last_error = conn.scalar(
                sa.select(inbox_attempts.c.last_error).where(
                    inbox_attempts.c.consumer == self.queue, inbox_attempts.c.message_id == key
                )
            )
        log = self.where.runs / key
        runs = len(log.read_text().splitlines()) if log.exists() else 0
        return Seen(
            notes["full"], notes["part"], runs, [x for x in letters if x.key == key], last_error
        )

    def letters(self) -> list[DeadLetter]:
        """The dead letters, read without being taken."""
        return dead_letters([self.rabbit.url], "model", None, f"{self.queue}.dead-letters")

    def log(self) -> str:
        path = self.where.root / "consumer.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Inboxes:
    """The three front ends, fed the same messages through one exchange; a supervisor thread
    starts again any that died."""

    def __init__(
        self,
        rabbit: RabbitNode,
        database_urls: dict[str, str],
        root: Path,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.rabbit = rabbit
        self.exchange, queues, _dead = topology(rabbit.url, queues=len(FLAVOURS))
        self.context = forkserver()
        self.front_ends = [
            FrontEnd(
                flavour,
                queue,
                database_url=database_urls[flavour],
                rabbit=rabbit,
                root=root / flavour,
                max_attempts=max_attempts,
            )
            for flavour, queue in zip(FLAVOURS, queues, strict=True)
        ]
        self.published: dict[str, tuple[list[str], str]] = {}
        self.refusing: list[str] | None = None
        self._supervising = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)

    @contextmanager
    def running(self) -> Iterator[Inboxes]:
        with contextlib.ExitStack() as stack:
            for front_end in self.front_ends:
                stack.enter_context(front_end)
                front_end.start(self.context)
            self._supervisor.start()
            try:
                yield self
            finally:
                self._supervising.set()
                self._supervisor.join(10)
                self.accept_dead_letters()

    def _supervise(self) -> None:
        while not self._supervising.wait(0.05):
            for front_end in self.front_ends:
                if front_end.died():
                    front_end.restarts += 1
                    front_end.start(self.context)

    def publish(self, *scripts: list[str]) -> list[str]:
        """Each script's message, to every front end; their keys."""
        keys = []
        with pika.BlockingConnection(pika.URLParameters(self.rabbit.url)) as conn:
            channel = conn.channel()
            channel.confirm_delivery()
            for script in scripts:
                key = f"m-{len(self.published)}-{uuid.uuid4().hex[:6]}"
                card = f"4111{uuid.uuid4().int % 10**12:012d}"
                self.published[key] = (script, card)
                body = json.dumps({"script": script, "card": card}).encode()
                properties = pika.BasicProperties(message_id=key, delivery_mode=2)
                channel.basic_publish(self.exchange, "", body, properties)
                keys.append(key)
        return keys

    def restart(self) -> None:
        self._supervising.set()
        self._supervisor.join(10)
        for front_end in self.front_ends:
            front_end.stop()
            front_end.start(self.context)
        self._supervising = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def refuse_dead_letters(self) -> None:
        """The dead letters' queues at their length limit, refusing publishes: a limit of as
        many as each holds (a lower one would drop the oldest), so call it with no dead
        letter on its way (after a settling). Policies set through the management API: each
        ``rabbitmqctl`` run boots an Erlang VM, which beside the CPU hog took 35 to 50 s, and
        eight steps of three ran a sequence past its hang guard."""
        self.refusing = []
        with pika.BlockingConnection(pika.URLParameters(self.rabbit.url)) as conn:
            channel = conn.channel()
            for front_end in self.front_ends:
                name = f"model-full-{front_end.flavour}-{uuid.uuid4().hex[:6]}"
                dead = f"{front_end.queue}.dead-letters"
                held = channel.queue_declare(dead, passive=True).method.message_count
                policy = {
                    "pattern": f"^{dead.replace('.', '[.]')}$",
                    "definition": {"max-length": held, "overflow": "reject-publish"},
                    "apply-to": "queues",
                }
                self.rabbit.api("PUT", f"/policies/%2F/{name}", policy)
                self.refusing.append(name)

    def accept_dead_letters(self) -> None:
        for name in self.refusing or ():
            self.rabbit.api("DELETE", f"/policies/%2F/{name}")
        self.refusing = None

    def settled(self, front_end: FrontEnd, fates: dict[str, set[Fate]]) -> bool:
        """Whether every message published has met its fate at ``front_end`` (processed or
        dead-lettered, as far as the database and the dead letters say)."""
        letters = {letter.key for letter in front_end.letters()}
        with front_end.engine.connect() as conn:
            done = set(
                conn.scalars(
                    sa.select(effects.c.message_id).where(
                        effects.c.consumer == front_end.queue, effects.c.note == "full"
                    )
                )
            )
        return all(key in done or key in letters for key in fates)

    def left(self, held: bool = False) -> dict[str, str]:
        """The messages left in the front ends' queues (their retry queues too), by queue:
        those ready (passive declares); with ``held``, those held by a consumer too, which
        only the broker's listing shows: a ``rabbitmqctl`` run, an Erlang VM's boot (0.7 s
        of CPU; beside the CPU hog 35 to 50 s of wall time), so asked at a sequence's end."""
        if not held:
            return self._ready()
        listed = self.rabbit.ctl("list_queues", "name", "messages", "--quiet", "--no-table-headers")
        found = {}
        for line in listed.splitlines():
            name, _, count = line.rpartition("\t")
            ours = any(name.startswith(front_end.queue) for front_end in self.front_ends)
            if ours and not name.endswith(".dead-letters") and count != "0":
                found[name] = count
        return found

    def _ready(self) -> dict[str, str]:
        schedule = RetrySchedule(MAX_ATTEMPTS, *RETRIES)
        found = {}
        with pika.BlockingConnection(pika.URLParameters(self.rabbit.url)) as conn:
            for front_end in self.front_ends:
                retries = [retry_queue(front_end.queue, delay)[0] for delay in schedule.delays()]
                for queue in (front_end.queue, *retries):
                    channel = conn.channel()
                    try:
                        count = channel.queue_declare(queue, passive=True).method.message_count
                    except pika.exceptions.ChannelClosedByBroker:
                        continue  # a retry queue not declared yet (404): nothing in it
                    channel.close()
                    if count:
                        found[queue] = str(count)
        return found


def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Wait for ``predicate`` to hold, at most ``timeout`` seconds (``wait_until``): a bound
    for a broken inbox, not a window the test's outcome depends on; an AssertionError."""
    try:
        wait_until(lambda: bool(predicate()), timeout, what)
    except ServerError as exc:
        raise AssertionError(str(exc)) from None


def databases(kind: str, base_url: str | None, root: Path) -> dict[str, str]:
    """A database for each front end: SQLite files of their own (one writer at a time, three
    processes would wait on each other), or one PostgreSQL database for all (the consumers'
    names keep their rows apart); the model's tables in each."""
    if kind == "sqlite":
        urls = {}
        for flavour in FLAVOURS:
            url = f"sqlite:///{root / f'{flavour}.db'}"
            migrate(url)
            urls[flavour] = url
    else:
        assert base_url is not None
        urls = dict.fromkeys(FLAVOURS, base_url)
    for url in set(urls.values()):
        engine = create_engine(url)
        metadata.create_all(engine)
        engine.dispose()
    return urls


def kill(front_end: FrontEnd) -> None:
    """SIGKILL, wherever the consumer is; returns once the supervisor started it again."""
    process, restarts = front_end._process, front_end.restarts
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    until(lambda: front_end.restarts > restarts, 30, f"{front_end.flavour} started again")


def processed(front_end: FrontEnd) -> int:
    """Messages whose effects committed at ``front_end``."""
    with front_end.engine.connect() as conn:
        return int(
            conn.scalar(
                sa.select(sa.func.count()).where(
                    effects.c.consumer == front_end.queue, effects.c.note == "full"
                )
            )
            or 0
        )
