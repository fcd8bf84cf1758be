"""The operator's commands for an inbox's dead letters: ``relay inbox list`` (by reason) and
``relay inbox requeue`` (back to their queue, with their attempts forgotten), as ``relay
replay`` does for the outbox's parked rows."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from collections.abc import Callable

from relay.broker.deadletters import DeadLetter, Moved, dead_letters, move_letters
from relay.db.inbox import InboxStore
from relay.errors import InputError
from relay.inbox.policy import dead_letter_queue
from relay.settings import Settings

_SHOWN = 20


def add_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    add_settings: Callable[[argparse.ArgumentParser], None],
) -> None:
    inbox = sub.add_parser("inbox", help="an inbox consumer's dead letters")
    inbox.set_defaults(command=None)
    commands = inbox.add_subparsers(title="commands")
    for name, handler, help_text in (
        ("list", list_command, "dead letters by reason"),
        ("requeue", requeue_command, "move dead letters back to their queue"),
    ):
        parser = commands.add_parser(
            name, parents=[common], help=help_text, description=handler.__doc__
        )
        add_settings(parser)
        parser.add_argument(
            "--queue",
            required=True,
            help="the queue the inbox consumes (its dead letters are in <queue>.dead-letters)",
        )
        parser.set_defaults(command=f"inbox {name}", handler=handler)
        if name == "list":
            parser.add_argument("--json", action="store_true", help="one JSON object a letter")
            continue
        parser.add_argument("--reason", help="letters whose error contains this text")
        parser.add_argument(
            "--id",
            action="append",
            default=[],
            dest="ids",
            metavar="KEY",
            help="a message id, or the ce-id of a message keyed by it (repeat)",
        )
        parser.add_argument("--all", action="store_true", help="every dead letter")
        parser.add_argument("--dry-run", action="store_true", help="show the letters, move nothing")


def list_command(settings: Settings, args: argparse.Namespace) -> int:
    """Show the inbox's dead letters of --queue by reason (the error its handler raised, or
    why the message could not be kept), with how many and the ids of the first few. The
    letters stay where they are."""
    letters = _letters(settings, args.queue)
    if args.json:
        for letter in letters:
            print(json.dumps(dataclasses.asdict(letter)))
        return 0
    by_reason: dict[str, list[DeadLetter]] = collections.defaultdict(list)
    for letter in letters:
        by_reason[letter.error].append(letter)
    print(f"{len(letters)} dead letters in {dead_letter_queue(args.queue)}")
    counted = max((letter.deliveries for letter in letters), default=0)
    if counted:
        print(
            f"warning: this queue counts deliveries (a quorum queue; up to {counted} so far): "
            "each read spends one, and at its delivery limit the broker drops the letter. "
            "Make it a classic queue, or its delivery limit -1 (none)"
        )
    for reason, group in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        ids = ", ".join(str(letter.key or letter.message_id) for letter in group[:_SHOWN])
        more = f", and {len(group) - _SHOWN} more" if len(group) > _SHOWN else ""
        print(f"{len(group):>8}  {reason}\n          {ids}{more}")
    return 0


def requeue_command(settings: Settings, args: argparse.Namespace) -> int:
    """Move dead letters of --queue back to the queue they came from, once their cause is
    fixed: selected by --reason (a part of the error) and --id (together they narrow the
    selection), or --all. Their failed attempts are forgotten, so each has its whole retry
    schedule again. --dry-run only shows them."""
    if bool(args.reason or args.ids) == args.all:
        raise InputError("say which dead letters to requeue: --reason or --id, or --all (not both)")
    wanted = set(args.ids)

    def chosen(letter: DeadLetter) -> bool:
        if args.reason and args.reason not in letter.error:
            return False
        return not wanted or letter.key in wanted

    if args.dry_run:
        done = Moved([letter for letter in _letters(settings, args.queue) if chosen(letter)])
    else:
        done = requeue(settings, args.queue, chosen)
    verb = "would move" if args.dry_run else "moved"
    print(f"{verb} {len(done.moved)} dead letters back to their queue")
    for letter in done.moved[:_SHOWN]:
        print(f"  {letter.key}  ({letter.attempts} attempts: {letter.error})")
    for letter, why in done.left[:_SHOWN]:
        print(f"  left {letter.key}: {why}")
    return 0


def requeue(
    settings: Settings,
    queue: str,
    chosen: Callable[[DeadLetter], bool],
    *,
    readable_only: bool = False,
    most: int | None = None,
) -> Moved:
    """The dead letters of the inbox of ``queue`` that ``chosen`` picks, back to their queue,
    their failed attempts forgotten first (``relay inbox requeue``, the console's, which
    passes ``readable_only``: a queue a read could drop or reorder letters of is refused,
    and ``most``: ``move_letters``'); those moved, and those chosen but left, and why."""
    return move_letters(
        settings.amqp_urls,
        settings.name,
        settings.amqp_tls,
        dead_letter_queue(queue),
        chosen,
        before_moving=lambda letters: _forget_attempts(settings, letters),
        readable_only=readable_only,
        most=most,
    )


def _letters(settings: Settings, queue: str) -> list[DeadLetter]:
    return dead_letters(
        settings.amqp_urls, settings.name, settings.amqp_tls, dead_letter_queue(queue)
    )


def _forget_attempts(settings: Settings, moving: list[DeadLetter]) -> None:
    """The failed attempts of the letters about to move, deleted from their consumers'
    inboxes (before they move: a letter moved first could fail again, and be dead-lettered
    again, on its old count)."""
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    for letter in moving:
        # A key holding a NUL was never one the inbox kept (``key_problem``): it has no
        # attempts to forget, and PostgreSQL would refuse to be asked for it.
        if letter.consumer and letter.key and "\x00" not in letter.key:
            consumers[letter.consumer].append(letter.key)
    for consumer, keys in consumers.items():
        store = InboxStore(settings.database_url, consumer)
        try:
            store.forget_attempts(keys)
        finally:
            store.close()
