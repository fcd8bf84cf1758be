"""Private RabbitMQ, PostgreSQL and MariaDB servers on loopback, in a directory of their own.

For the demo, the tests and the benchmark; not shipped, and the relay never imports it. Each
server gets free ports, its own data directory and logs, and stops when asked, leaving the
machine's own services (if any) alone. Debian's packages provide the binaries.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pika
import pika.exceptions
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from devtools import debian13

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
# A hang guard for one run of a RabbitMQ CLI tool (rabbitmqctl, rabbitmq-upgrade...), not a
# window: each run starts an Erlang VM, which took more than the former 60 s on two cores
# at a load of 20 to 35 (a suite's four processes beside other sessions' work), and the test
# that asked failed while the node was fine.
CLI_TIMEOUT_S = 300.0
# A hang guard for a server's boot (a RabbitMQ node, a cluster, MariaDB), not a window: a
# server that cannot boot exits, and its start fails then; beside the CPU hog a RabbitMQ
# boot took up to 70 s.
BOOT_TIMEOUT_S = 300.0
# Boots of a node whose distribution port was taken under it (``RabbitNode.start``).
DIST_PORT_TRIES = 3


class ServerError(RuntimeError):
    """A private server could not be started or controlled; the message says where to look."""


# Where the private servers' ports are chosen: below the kernel's ephemeral range, from
# which connect() takes its source ports. A port the kernel handed out free and that was let
# go of until the server bound it could meanwhile be an outgoing connection's: a RabbitMQ
# node, seconds into its boot beside the CPU hog, stopped on eaddrinuse.
PORTS_FROM = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class _DistPortTaken(ServerError):
    """A node exited at boot: its distribution port was taken after it was chosen."""


def free_port() -> int:
    """A port of 127.0.0.1 free now, below the ephemeral range where there is room."""
    try:
        below = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = PORTS_FROM
    while True:
        # Not the random module: Hypothesis seeds it alike in every process running a test.
        port = PORTS_FROM + secrets.randbelow(below - PORTS_FROM) if below > PORTS_FROM else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, *, poll: float = 0.05
) -> None:
    """Until ``condition()``; fails once a look begun after ``timeout`` seconds finds it
    false: a look that itself takes long (a CLI's boot beside a busy machine) is not what
    the bound is for."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        if condition():
            return
        if began > deadline:
            raise ServerError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def wait_while_progressing(
    left: Callable[[], int], stall: float, what: str, *, poll: float = 0.2
) -> None:
    """Until ``left()`` is 0, however long that takes while it keeps going down: fails
    only once it has not gone down for ``stall`` seconds. For work whose speed is the
    machine's (a backlog drained beside other work), where a deadline would measure the
    machine, not the code."""
    lowest = left()
    since = time.monotonic()
    while lowest > 0:
        time.sleep(poll)
        now = left()
        if now < lowest:
            lowest, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            raise ServerError(f"{what}: {lowest} left, none done for {stall:g}s")


class RabbitNode:
    """A rabbitmq-server node named ``<name>-<pid>@127.0.0.1`` listening on 127.0.0.1.

    By default the machine's own RabbitMQ (Debian 12: 3.10). With ``root``, the one installed
    in that Debian root (``devtools.debian13``: 4.0), run there through chroot with ``base``
    at the same path inside.
    """

    def __init__(
        self,
        base: Path,
        name: str = "relay",
        port: int | None = None,
        config: str = "",
        root: Path | None = None,
        *,
        management: bool = False,
    ) -> None:
        """``config``: extra ``rabbitmq.conf`` lines (for example a TLS listener);
        ``management``: with the management plugin's HTTP API (``api``), on a port of its own
        on 127.0.0.1."""
        if not ((root or Path("/")) / RABBITMQ_BIN.relative_to("/") / "rabbitmq-server").exists():
            raise ServerError(
                "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"
            )
        self.root = root
        self.base = base.absolute()
        self.name = f"{name}-{os.getpid()}@127.0.0.1"
        self.port = port or free_port()
        self.dist_port = free_port()
        self.home = self.base / "home"
        self.log_path = self.base / "log" / "console.log"
        self.config = config
        self.management_port = free_port() if management else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def _command(self, program: str, *args: str) -> tuple[list[str], dict[str, str] | None]:
        """(argv, environment) for one of RabbitMQ's programs, run for this node."""
        argv = [str(RABBITMQ_BIN / program), *args]
        if self.root is None:
            return argv, {**os.environ, **self.env()}
        return debian13.command(self.root, argv, self.env(), self.base), None

    def env(self) -> dict[str, str]:
        """The node's own variables."""
        return {
            "HOME": str(self.home),
            "RABBITMQ_NODENAME": self.name,
            # A long name on the loopback address: no host name to resolve (a minimal
            # machine or container may have no /etc/hosts entry for localhost).
            "RABBITMQ_USE_LONGNAME": "true",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_PID_FILE": str(self.base / "rabbit.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq"),
        }

    def start(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        """Boot the node. Its distribution port was free when it was chosen, and another
        node (a test beside this one) may have taken it since: the node exits at once, and
        boots again on another (seen once in a suite run on two workers)."""
        for _ in range(DIST_PORT_TRIES - 1):
            try:
                return self._boot(timeout)
            except _DistPortTaken:
                self.dist_port = free_port()
        return self._boot(timeout)

    def _boot(self, timeout: float) -> None:
        for d in (self.home, self.base / "log", self.base / "mnesia"):
            d.mkdir(parents=True, exist_ok=True)
        plugins = "rabbitmq_management" if self.management_port else ""
        (self.base / "enabled_plugins").write_text(f"[{plugins}].\n")
        config = self.base / "rabbitmq.conf"
        if not config.exists():
            management = (
                f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {self.management_port}\n"
                if self.management_port
                else ""
            )
            config.write_text(
                "log.console = false\nlog.file.level = warning\n" + management + self.config
            )
        log = self.log_path.open("ab")
        logged = log.tell()
        argv, env = self._command("rabbitmq-server")
        process = self._process = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        try:
            wait_until(
                lambda: process.poll() is not None or self._answers(),
                timeout,
                f"RabbitMQ node {self.name} answering on port {self.port} (log: {self.log_path})",
            )
            if self.management_port:  # a plugin: its listener may open after AMQP's
                wait_until(
                    lambda: (
                        process.poll() is not None
                        or port_open("127.0.0.1", self.management_port or 0)
                    ),
                    timeout,
                    f"RabbitMQ node {self.name}'s management API (log: {self.log_path})",
                )
            if process.poll() is not None:
                with self.log_path.open("rb") as said:
                    said.seek(logged)
                    if b"dist_port_already_used" in said.read():
                        raise _DistPortTaken(f"{self.name}: port {self.dist_port} taken")
                raise ServerError(f"RabbitMQ node {self.name} exited; see {self.log_path}")
        except Exception:
            self.kill()
            raise

    def _answers(self) -> bool:
        """Whether the node has booted: it answers an AMQP handshake (its listeners open
        last of its boot steps). A refused login is an answer too (a test may take the
        guest user's rights away). Not ``rabbitmqctl await_startup``: a CLI run costs about
        0.7 s of CPU, and on two cores at a load of 20 (the suite beside the CPU hog) one
        took 35 to 50 s of wall time, where a handshake takes milliseconds."""
        if not port_open("127.0.0.1", self.port):
            return False
        try:
            pika.BlockingConnection(pika.URLParameters(self.url)).close()
        except (
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.AuthenticationError,
            pika.exceptions.ConnectionClosedByBroker,
        ):
            return True
        except (pika.exceptions.AMQPConnectionError, AMQPConnectorException, OSError):
            return False  # not yet (a handshake a busy node did not finish in time, too)
        return True

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def api(self, method: str, path: str, body: object = None) -> None:
        """A call to the management plugin's HTTP API (a node started with ``management``):
        milliseconds, where a CLI run boots an Erlang VM (tens of seconds on a loaded
        machine). ``path`` after ``/api``; ``body`` sent as JSON."""
        assert self.management_port, "a node started without its management API"
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.management_port}/api{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=CLI_TIMEOUT_S):
                pass
        except urllib.error.HTTPError as exc:
            with exc:
                raise ServerError(f"{method} /api{path}: {exc.code} {exc.read()!r}") from exc

    def ctl(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> str:
        return self.tool("rabbitmqctl", *args, timeout=timeout)

    def tool(self, program: str, *args: str, timeout: float = CLI_TIMEOUT_S) -> str:
        """The output of one of RabbitMQ's command-line tools (``rabbitmqctl``,
        ``rabbitmq-queues``, ``rabbitmq-upgrade``...) run against this node."""
        argv, env = self._command(program, "-n", self.name, *args)
        result = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise ServerError(f"{program} {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def beam_pid(self) -> int:
        return int((self.base / "rabbit.pid").read_text().strip())

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.beam_pid(), sig)

    def stop(self) -> None:
        """Stop gracefully: SIGTERM, which the node takes as ``rabbitmqctl stop`` (it closes
        its connections, 320 CONNECTION_FORCED, and stops its applications), without the
        CLI's cost (``_answers``); kill if that fails."""
        if self._process is None:
            return
        if self._process.poll() is None:
            try:
                self.signal(signal.SIGTERM)
                self._process.wait(timeout=60)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.kill()
        self._process = None

    def kill(self) -> None:
        """SIGKILL the whole node (the beam process and its helpers)."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(self.beam_pid(), signal.SIGKILL)
        self._process.wait(timeout=30)
        self._process = None


class RabbitCluster:
    """``size`` RabbitMQ nodes on loopback, clustered: one Erlang cookie in every node's home,
    and every node listed in every node's configuration (classic peer discovery), so that
    they form the cluster as they boot, side by side. Joining each to the first afterwards
    (``stop_app``, ``join_cluster``, ``start_app``) took RabbitMQ 4.0 a minute or two per
    node: its join waits out a retry loop ("Mnesia->Khepri fallback handling: Mnesia
    function failed 99 times"); formed at boot, the cluster is up in the time a node takes.
    A node stopped or killed later rejoins by itself when started again: its data directory
    remembers the cluster (peer discovery runs on a blank node only)."""

    def __init__(
        self,
        base: Path,
        name: str = "cluster",
        size: int = 3,
        config: str = "",
        root: Path | None = None,
    ) -> None:
        self.nodes = [
            RabbitNode(base / f"{name}{n}", name=f"{name}{n}", config=config, root=root)
            for n in range(1, size + 1)
        ]
        peers = "cluster_formation.peer_discovery_backend = classic_config\n" + "".join(
            f"cluster_formation.classic_config.nodes.{n} = {node.name}\n"
            for n, node in enumerate(self.nodes, 1)
        )
        for node in self.nodes:
            node.config += peers

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated, as ``RELAY_AMQP_URL`` takes them."""
        return ",".join(node.url for node in self.nodes)

    def start(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        cookie = uuid.uuid4().hex
        for node in self.nodes:
            node.home.mkdir(parents=True, exist_ok=True)
            path = node.home / ".erlang.cookie"
            path.write_text(cookie)
            path.chmod(0o400)  # Erlang refuses a cookie others can read
        # The nodes boot in parallel (each takes several seconds) and find each other.
        errors: list[BaseException] = []

        def boot(node: RabbitNode) -> None:
            try:
                node.start(timeout)
            except BaseException as exc:  # reported below, on the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=boot, args=(node,)) for node in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            if errors:
                raise errors[0]
            # Each node's start waits for its own boot, which includes its join: the first
            # sees the others too, or the nodes formed more than one cluster.
            self.nodes[0].ctl("await_online_nodes", str(len(self.nodes)), timeout=timeout)
        except BaseException:
            self.kill()
            raise

    def node_at(self, address: str) -> RabbitNode:
        """The node listening at ``address`` (``host:port``, as the relay reports it)."""
        return next(node for node in self.nodes if address == f"127.0.0.1:{node.port}")

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


class PostgresServer:
    """A PostgreSQL cluster in ``base``, on 127.0.0.1, trust authentication for ``postgres``.

    As root, ``initdb`` and ``pg_ctl`` run as the ``postgres`` user, who must own the data
    directory: PostgreSQL refuses to run as root.
    """

    def __init__(
        self,
        base: Path,
        port: int | None = None,
        tuned_for_tests: bool = False,
        settings: Sequence[str] = (),
    ) -> None:
        """``settings``: more server settings, as ``name=value``."""
        self.bin = _postgres_bin()
        self.base = base
        self.data = base / "data"
        self.port = port or free_port()
        self.log_path = base / "postgres.log"
        options = [f"-p {self.port}", f"-k {base}", "-c listen_addresses=127.0.0.1"]
        if tuned_for_tests:
            # Durability is not under test against a crashed PostgreSQL here; speed is welcome.
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        options += [f"-c {setting}" for setting in settings]
        self._options = " ".join(options)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            # Temporary parents are private to root; postgres must be able to walk to base.
            for parent in self.base.parents:
                if parent == Path("/"):
                    break
                parent.chmod(parent.stat().st_mode | 0o011)
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "-D", str(self.data))
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            self._options,
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def pid(self) -> int:
        """The postmaster's process id (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def create_database(self, name: str) -> None:
        self.psql(f"CREATE DATABASE {name}")

    def psql(self, sql: str, database: str = "postgres") -> str:
        return self._run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-qAtc",
            sql,
        )

    def _run(self, tool: str, *args: str) -> str:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise ServerError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip()} "
                f"(log: {self.log_path})"
            )
        return result.stdout


class MariaDBServer:
    """A MariaDB server in ``base``, on 127.0.0.1, ``root`` without a password.

    ``--no-defaults`` first, so that the machine's ``/etc/mysql`` is not read; utf8mb4, as the
    outbox wants (the server's own default is latin1). As root, mariadbd must be told to run
    as root (it refuses otherwise); the data directory is root's then.
    """

    def __init__(
        self,
        base: Path,
        port: int | None = None,
        tuned_for_tests: bool = False,
        more: Sequence[str] = (),
    ) -> None:
        """``more``: more server options (``--name=value``)."""
        self.base = base
        self.data = base / "data"
        self.port = port or free_port()
        self.socket = base / "mariadb.sock"
        self.log_path = base / "mariadbd.err"
        self.pid_file = base / "mariadbd.pid"
        # Its temporary files in a folder of its own, not the machine's /tmp: servers
        # bootstrapping at once there (test processes side by side, other sessions on the
        # machine) lost each other's temporary tables ("Could not remove temporary table
        # '/tmp/#sql-temptable-...'", and mariadb-install-db failed).
        self.tmp = base / "tmp"
        user = ["--user=root"] if os.geteuid() == 0 else []
        self._common = [
            "--no-defaults",
            f"--datadir={self.data}",
            f"--tmpdir={self.tmp}",
            "--innodb-log-file-size=64M",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_unicode_ci",
            *user,
        ]
        # A payload as large as the broker takes (RabbitMQ 3.10: 128 MiB) travels in one
        # packet, with room for the rest of its row.
        options = ["--max-allowed-packet=256M", "--skip-name-resolve"]
        if tuned_for_tests:
            # Durability is not under test against a crashed server here; speed is welcome.
            options += ["--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0"]
        self._options = options + list(more)
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, database: str = "mysql") -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        if not (self.data / "mysql").exists():
            self._run(
                _mariadb_tool("mariadb-install-db"),
                *self._common,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                # Without it the script looks up the machine's name and "localhost" first,
                # and stops (exit 1, on stdout) where neither resolves: a machine without
                # /etc/hosts. The server runs --skip-name-resolve, on 127.0.0.1.
                "--force",
            )
        server = _mariadb_tool("mariadbd")
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    server,
                    *self._common,
                    *self._options,
                    f"--socket={self.socket}",
                    f"--port={self.port}",
                    "--bind-address=127.0.0.1",
                    f"--pid-file={self.pid_file}",
                    f"--log-error={self.log_path}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def ready() -> bool:
            if self._process is not None and self._process.poll() is not None:
                raise ServerError(f"mariadbd exited at start (log: {self.log_path})")
            return port_open("127.0.0.1", self.port)

        wait_until(ready, timeout, f"MariaDB on port {self.port} (log: {self.log_path})")

    def pid(self) -> int:
        return int(self.pid_file.read_text().split()[0])

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 60.0) -> None:
        """Stop the server (SIGTERM: a clean shutdown; SIGKILL: a crash) and wait for it."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(sig)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self.pid_file.unlink(missing_ok=True)

    def create_database(self, name: str) -> None:
        self.sql(f"CREATE DATABASE {name}")

    def sql(self, statement: str, database: str = "mysql") -> str:
        """Run ``statement`` with the ``mariadb`` client; its output, tab-separated."""
        return self._run(
            _mariadb_tool("mariadb"),
            "--no-defaults",
            "--protocol=TCP",
            "-h127.0.0.1",
            f"-P{self.port}",
            "-uroot",
            "-N",
            "-B",
            database,
            "-e",
            statement,
        )

    def _run(self, *command: str) -> str:
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            # mariadb-install-db says why on stdout.
            said = result.stderr.strip() or result.stdout.strip()[-2000:]
            name = Path(command[0]).name
            raise ServerError(f"{name} failed ({result.returncode}): {said} (log: {self.log_path})")
        return result.stdout


def _mariadb_tool(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin"):
        if (path := Path(folder) / name).exists():
            return str(path)
    raise ServerError(
        f"{name} not found: MariaDB is not installed (Debian: apt-get install mariadb-server)"
    )


def _postgres_bin() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=_version_key)
    if not versions:
        raise ServerError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return versions[-1].parent


def _version_key(path: Path) -> int:
    return int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0
