"""``relay console`` (serve the console) and ``relay console hash-password`` (a users file's
hash). The web stack (the ``console`` extra) is imported when the console starts, not with
the CLI: ``relay run`` and the admin commands do without it."""

from __future__ import annotations

import argparse
import getpass
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from prometheus_client import start_http_server

from relay.console.passwords import hash_password
from relay.errors import ConfigError, InputError
from relay.settings import ENV_FILE_VAR, ConsoleSettings, Settings, describe

log = logging.getLogger(__name__)

# The relay's settings the console reads: its database, and the broker for the dead letters.
RELAY_SETTINGS = (
    "database_url",
    "amqp_url",
    "amqp_ca_file",
    "amqp_cert_file",
    "amqp_key_file",
    "amqp_server_name",
    "name",
    "log_level",
    "log_format",
)


def add_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    add_settings: Callable[[argparse.ArgumentParser], None],
) -> None:
    console = sub.add_parser(
        "console",
        parents=[common],
        help="serve the operator console (the console extra)",
        description=serve.__doc__,
    )
    add_settings(console)
    group = console.add_argument_group("console settings")
    for name, env, default, help_text, _see in describe(ConsoleSettings):
        shown = f" (default: {default})" if default else ""
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest="set_" + name,
            metavar=name.split("_")[-1].upper(),
            help=f"{help_text}{shown} [{env}]".replace("%", "%%"),
        )
    console.set_defaults(command="console", handler=serve)
    commands = console.add_subparsers(title="commands")
    hashing = commands.add_parser(
        "hash-password",
        help="print a users file's hash of a password",
        description=hash_command.__doc__,
    )
    hashing.set_defaults(command="console hash-password", handler=hash_command)


def serve(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the operator console until SIGTERM or SIGINT. It refuses to start (exit 2)
    without an authentication mode (RELAY_CONSOLE_AUTH) and what that mode needs."""
    overrides = {
        name.removeprefix("set_"): value
        for name, value in vars(args).items()
        if name.startswith("set_console_") and value
    }
    env_file = args.env_file or args.environ.get(ENV_FILE_VAR)
    config = ConsoleSettings.load(args.environ, overrides, Path(env_file) if env_file else None)
    if (problem := config.problem()) is not None:
        raise ConfigError(problem)
    try:
        import uvicorn

        from relay.console.app import load_console, standalone_app
    except ImportError as exc:
        raise ConfigError(
            f"relay console needs the console extra (pip install 'outbox-relay[console]'): {exc}"
        ) from None
    console = load_console(settings, config)
    if config.console_metrics_port:
        start_http_server(
            config.console_metrics_port, config.console_host, registry=console.metrics.registry
        )
    log.info(
        "console serving on %s:%d (login: %s)",
        config.console_host,
        config.console_port,
        config.console_auth,
        extra={"action": "console_started", "auth": config.console_auth},
    )
    uvicorn.run(
        standalone_app(console),
        host=config.console_host,
        port=config.console_port,
        log_level="warning",
        proxy_headers=False,  # the peer's address is the one proxy mode checks
        server_header=False,
    )
    return 0


def hash_command(settings: Settings, args: argparse.Namespace) -> int:
    """Read a password (typed twice on a terminal, else the first line of standard input)
    and print its salted scrypt hash for a users file line: name:role:HASH."""
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise InputError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise InputError("an empty password")
    print(hash_password(password))
    return 0
