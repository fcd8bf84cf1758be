"""The ``relay`` command: run, migrate, enqueue, the admin commands status, replay, purge, and
the operator console.

Options are generated from ``relay.settings``: every option shows its ``RELAY_*`` variable.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from relay import __version__, daemon, logs
from relay.admin import commands as admin
from relay.admin import inbox as inbox_admin
from relay.console import command as console_command
from relay.db.migrate import migrate
from relay.db.outbox import OutboxWriter
from relay.errors import ConfigError, InputError, RelayError
from relay.records import NewMessage
from relay.settings import ENV_FILE_VAR, Settings, TracingSettings, describe
from relay.tracing import given_context, with_context

EXIT_OK = 0
EXIT_FAILURE = 1  # a runtime failure: the database or broker refused, a drain left rows
EXIT_USAGE = 2  # a bad option, setting, topology file or input: nothing was touched

_DB_ONLY = ("database_url", "log_level", "log_format")
# ``relay inbox``: the broker's dead letters, and the inbox's attempts in the database.
_INBOX_ADMIN = (
    *_DB_ONLY,
    "amqp_url",
    "amqp_ca_file",
    "amqp_cert_file",
    "amqp_key_file",
    "amqp_server_name",
    "name",
)


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    environ = dict(os.environ if environ is None else environ)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        settings = _settings(args, environ)
        args.tracing = TracingSettings.load(environ)
        args.environ = environ
    except ConfigError as exc:
        print(f"relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_level, settings.log_format)
    try:
        code: int = args.handler(settings, args)
        return code
    except (ConfigError, InputError) as exc:
        print(f"relay: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RelayError as exc:
        print(f"relay: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _settings(args: argparse.Namespace, environ: dict[str, str]) -> Settings:
    overrides = {
        name.removeprefix("set_"): value
        for name, value in vars(args).items()
        if name.startswith("set_") and value
    }
    env_file = args.env_file or environ.pop(ENV_FILE_VAR, None)
    return Settings.load(environ, overrides, Path(env_file) if env_file else None)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay",
        description="Relay transactional-outbox rows to RabbitMQ with publisher confirms.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every setting can be given as an option or a RELAY_* environment variable;\n"
        "see `relay run --help` for all of them.",
    )
    parser.add_argument("--version", action="version", version=f"outbox-relay {__version__}")
    parser.set_defaults(command=None)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--env-file",
        metavar="PATH",
        help=f"read RELAY_* settings from this NAME=value file [{ENV_FILE_VAR}]",
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    run = sub.add_parser(
        "run", parents=[common], help="run the relay daemon", description=_run.__doc__
    )
    _add_settings(run, None)
    run.set_defaults(command="run", handler=_run)

    mig = sub.add_parser(
        "migrate",
        parents=[common],
        help="create or upgrade the outbox schema",
        description=_migrate.__doc__,
    )
    _add_settings(mig, _DB_ONLY)
    mig.add_argument("--revision", default="head", help="Alembic revision to move to")
    mig.add_argument(
        "--downgrade",
        action="store_true",
        help="move down to --revision (stop every relay and consumer first)",
    )
    mig.add_argument(
        "--force",
        action="store_true",
        help="move even while live relays stand in the way (they hold buckets, and their "
        "protocol is older than the migration needs, or it is a downgrade)",
    )
    mig.set_defaults(command="migrate", handler=_migrate)

    enq = sub.add_parser(
        "enqueue",
        parents=[common],
        help="insert messages into the outbox",
        description=_enqueue.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_settings(enq, _DB_ONLY)
    enq.add_argument("payload", nargs="?", help="message body (text); or use --file")
    enq.add_argument("--file", metavar="PATH", help="JSON-lines file of messages ('-': stdin)")
    enq.add_argument("--exchange", default="", help="exchange to publish to")
    enq.add_argument("--routing-key", default="", help="routing key")
    enq.add_argument("--content-type", default="text/plain", help="content type")
    enq.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="a header (repeat)"
    )
    enq.add_argument("--message-id", help="message id (default: a new UUID)")
    enq.add_argument("--ordering-key", help="rows with the same key are published in order")
    enq.add_argument(
        "--traceparent",
        metavar="TEXT",
        help='W3C trace context the messages continue (e.g. "$TRACEPARENT"), put in their '
        "headers unless a message has its own",
    )
    enq.add_argument("--tracestate", metavar="TEXT", help="W3C tracestate to go with it")
    enq.set_defaults(command="enqueue", handler=_enqueue)
    admin.add_commands(sub, common, lambda p: _add_settings(p, _DB_ONLY))
    inbox_admin.add_commands(sub, common, lambda p: _add_settings(p, _INBOX_ADMIN))
    console_command.add_commands(
        sub, common, lambda p: _add_settings(p, console_command.RELAY_SETTINGS)
    )
    return parser


def _add_settings(parser: argparse.ArgumentParser, only: Iterable[str] | None) -> None:
    group = parser.add_argument_group("settings")
    for name, env, default, help_text, _see in describe(Settings):
        if only is not None and name not in only:
            continue
        shown = f" (default: {default})" if default else ""
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest="set_" + name,
            metavar=name.split("_")[-1].upper(),
            help=f"{help_text}{shown} [{env}]".replace("%", "%%"),
        )


def _run(settings: Settings, args: argparse.Namespace) -> int:
    """Run the relay until SIGTERM or SIGINT, then drain outstanding confirms and exit."""
    return EXIT_OK if daemon.run(settings, args.tracing) else EXIT_FAILURE


def _migrate(settings: Settings, args: argparse.Namespace) -> int:
    """Create or upgrade the outbox table to the newest schema (Alembic upgrade), or with
    --downgrade move it down to --revision. Lists the live relays first, and refuses while
    relays of a protocol the migration does not admit hold buckets (any relay holding
    buckets, for a downgrade), unless --force."""
    migrated = migrate(
        settings.database_url, args.revision, downgrade=args.downgrade, force=args.force
    )
    for relay in migrated.live:
        print(f"live relay {relay.owner}: protocol {relay.protocol}, {relay.buckets} buckets")
    if migrated.ahead is not None:
        schema, newest = migrated.ahead
        print(
            f"outbox schema is at revision {schema}, newer than this release's ({newest}): "
            "left as it is (a relay of this release runs on it while the schema admits its "
            "protocol)"
        )
    else:
        print(f"outbox schema is at revision {args.revision}")
    return EXIT_OK


def _enqueue(settings: Settings, args: argparse.Namespace) -> int:
    """Insert messages into the outbox, all in one transaction: one message from the
    arguments, or one per line of a JSON-lines file. A line looks like

      {"exchange": "orders", "routing_key": "order.created", "payload": "...",
       "content_type": "application/json", "headers": {"tenant": "a"}, "message_id": "..."}

    where payload is text, a JSON object (serialised), or given as payload_base64 for bytes.
    A malformed line is reported with its number and nothing is inserted."""
    if (args.file is None) == (args.payload is None):
        raise InputError("give either a payload argument or --file")
    if args.file is not None:
        if args.file == "-":
            messages = list(_read_jsonl(sys.stdin, "<stdin>"))
        else:
            try:
                with open(args.file, encoding="utf-8") as f:
                    messages = list(_read_jsonl(f, args.file))
            except OSError as exc:
                raise InputError(f"--file {args.file}: {exc.strerror}") from None
    else:
        headers = {}
        for item in args.header:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise InputError(f"--header {item!r}: expected NAME=VALUE")
            headers[name] = value
        messages = [
            NewMessage(
                payload=args.payload.encode(),
                exchange=args.exchange,
                routing_key=args.routing_key,
                content_type=args.content_type,
                headers=json.dumps(headers) if headers else None,
                message_id=args.message_id,
                ordering_key=args.ordering_key,
            )
        ]
    try:
        context = given_context(args.traceparent, args.tracestate)
    except ValueError as exc:
        raise InputError(f"--traceparent/--tracestate: {exc}") from None
    if context:
        messages = [replace(m, headers=with_context(m.headers, context)) for m in messages]
    writer = OutboxWriter(settings.database_url)
    try:
        ids = writer.enqueue(messages)
    finally:
        writer.close()
    for message_id in ids:
        print(message_id)
    return EXIT_OK


_LINE_KEYS = {
    "exchange",
    "routing_key",
    "payload",
    "payload_base64",
    "content_type",
    "headers",
    "message_id",
    "ordering_key",
}


def _read_jsonl(lines: TextIO, name: str) -> Iterable[NewMessage]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON: {exc}") from None
        yield message_from_json(item, where)


def message_from_json(item: Any, where: str) -> NewMessage:
    if not isinstance(item, dict):
        raise InputError(f"{where}: expected a JSON object")
    unknown = set(item) - _LINE_KEYS
    if unknown:
        raise InputError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    for key in (
        "exchange",
        "routing_key",
        "content_type",
        "message_id",
        "payload_base64",
        "ordering_key",
    ):
        if key in item and not isinstance(item[key], str):
            raise InputError(f"{where}: {key} must be a string")
    if ("payload" in item) == ("payload_base64" in item):
        raise InputError(f"{where}: give exactly one of payload and payload_base64")
    if "payload_base64" in item:
        try:
            payload = base64.b64decode(item["payload_base64"], validate=True)
        except ValueError:
            raise InputError(f"{where}: payload_base64 is not valid base64") from None
        default_type = "application/octet-stream"
    elif isinstance(item["payload"], str):
        payload, default_type = item["payload"].encode(), "text/plain"
    else:
        payload, default_type = json.dumps(item["payload"]).encode(), "application/json"
    headers = item.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise InputError(f"{where}: headers must be a JSON object")
    return NewMessage(
        payload=payload,
        exchange=item.get("exchange", ""),
        routing_key=item.get("routing_key", ""),
        content_type=item.get("content_type", default_type),
        headers=json.dumps(headers) if headers else None,
        message_id=item.get("message_id"),
        ordering_key=item.get("ordering_key"),
    )
