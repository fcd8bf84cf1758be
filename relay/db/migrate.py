"""``relay migrate``: the schema moved up or down with the migrations the package ships,
unless live relays stand in the way (``relay.upgrade``).

Before it moves, the live relays are read where they meet (their presence rows and the
buckets they lease): an upgrade through a migration that relays of older protocols cannot
run beside, and any downgrade, is refused while such a relay holds buckets, unless forced.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import TYPE_CHECKING, NamedTuple

import sqlalchemy as sa
import tenacity

from relay.backoff import Backoff, log_before_retry
from relay.constants import (
    MIGRATION_DDL_LOCK_TIMEOUT_MS,
    MIGRATION_LOCK_WAIT_S,
    MIGRATION_RETRY_MAX_S,
    PROTOCOL_BEFORE_FENCES,
    TURN_INTERVAL_MAX_S,
)
from relay.db.buckets import holders
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.engine import create_engine, transaction
from relay.db.schema import outbox_buckets, outbox_relays
from relay.errors import ConfigError, MigrationRefusedError, StoreError
from relay.redact import redact_url
from relay.upgrade import LiveRelay, blockers, least_protocol

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)


class Migrated(NamedTuple):
    """What ``migrate`` found: the live relays before it moved; and, when the schema was
    newer than this release's newest migration and left as it was, both revisions."""

    live: list[LiveRelay]
    ahead: tuple[str, str] | None = None  # the schema's revision, this release's newest


def migrate(
    url: str, revision: str = "head", *, downgrade: bool = False, force: bool = False
) -> Migrated:
    """Move the database to ``revision`` (down to it with ``downgrade``). Refused
    (``MigrationRefusedError``, nothing changed) while live relays stand in its way
    (``relay.upgrade.blockers``), unless ``force``. One at a time on a database: the next
    waits for the lock (``Dialect.lock_migrations``). A schema a later release migrated
    is left as it is by an upgrade to this release's newest (a rollback's pods run one
    before they start: the schema's least protocol says whether they may claim)."""
    # Alembic is imported here, not with the module: the CLI imports this module for every
    # command, and only `relay migrate` needs Alembic.
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("relay.db.migrations")))
    engine = create_engine(url)
    where = redact_url(url)

    def once() -> Migrated:
        with transaction(engine, "migrate", where) as conn:
            of(conn).lock_migrations(conn)
            of(conn).bound_ddl_locks(conn)
            live = live_relays(conn)
            if revision == "head" and not downgrade and (ahead := _ahead(config, conn)):
                return Migrated(live, ahead)
            least = least_protocol(_steps(config, conn, revision, downgrade))
            if (standing := blockers(live, least, downgrade)) and not force:
                raise MigrationRefusedError(_refusal(standing, least, downgrade))
            config.attributes["connection"] = conn
            (command.downgrade if downgrade else command.upgrade)(config, revision)
        return Migrated(live)

    def lock_timed_out(error: BaseException) -> bool:
        kind = of(engine).lock_timeout_error
        return (
            kind is not None
            and isinstance(error, StoreError)
            and isinstance(_driver_error(error), kind)
        )

    # A DDL statement's lock wait ran out (``Dialect.bound_ddl_locks``): the transaction
    # was rolled back whole, and the writers it held up went on meanwhile.
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lock_timed_out),
        wait=Backoff(MIGRATION_DDL_LOCK_TIMEOUT_MS / 1000, MIGRATION_RETRY_MAX_S).wait,
        stop=tenacity.stop_after_delay(MIGRATION_LOCK_WAIT_S),
        before_sleep=log_before_retry(
            log, "migrate: a table's lock was held past the migration's wait", "migrate_lock_wait"
        ),
        reraise=True,
    )
    try:
        return retrying(once)
    finally:
        engine.dispose()


def _driver_error(error: BaseException) -> BaseException | None:
    """The driver's error a StoreError chains (through SQLAlchemy's)."""
    cause = error.__cause__
    return getattr(cause, "orig", cause)


def live_relays(conn: sa.Connection) -> list[LiveRelay]:
    """The relays present (a presence row renewed within a turn's longest interval: those
    waiting renew theirs every turn) or holding buckets under a live lease, present or not
    (``relay.db.buckets.holders``, as the fence counts them), by name; none on a schema
    before owned buckets (0005). A relay of a release before protocols (or a schema before
    0012) speaks protocol 1."""
    inspector = sa.inspect(conn)
    if not inspector.has_table(outbox_buckets.name):
        return []
    columns = {column["name"] for column in inspector.get_columns(outbox_relays.name)}
    relay = outbox_relays.c
    protocol = relay.protocol if "protocol" in columns else sa.null()
    present = sa.select(relay.owner, protocol).where(
        relay.alive_until > database_time(-TURN_INTERVAL_MAX_S)
    )
    protocols = {owner: said or PROTOCOL_BEFORE_FENCES for owner, said in conn.execute(present)}
    held: dict[str, int] = {}
    for owner, said, buckets in conn.execute(holders(protocol)):
        protocols[owner], held[owner] = said, int(buckets)
    return [LiveRelay(owner, protocols[owner], held.get(owner, 0)) for owner in sorted(protocols)]


def _ahead(config: Config, conn: sa.Connection) -> tuple[str, str] | None:
    """The schema's revision and this release's newest, when this release's migrations do
    not know the schema's (a later release's); else None."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    current = MigrationContext.configure(conn).get_current_revision()
    script = ScriptDirectory.from_config(config)
    if current is None or current in {step.revision for step in script.walk_revisions()}:
        return None
    return current, str(script.get_current_head())


def _steps(config: Config, conn: sa.Connection, revision: str, downgrade: bool) -> list[int | None]:
    """The least protocol of each revision the move runs (its module's ``least_protocol``)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(config)
    current = MigrationContext.configure(conn).get_current_revision()
    upper, lower = (current, revision) if downgrade else (revision, current)
    if downgrade and current is None:
        return []
    try:
        return [step.module.least_protocol for step in script.iterate_revisions(upper, lower)]
    except (CommandError, RevisionError) as exc:
        where = "down" if downgrade else "up"
        raise ConfigError(
            f"--revision {revision}: cannot move {where} to it from {current}: {exc}"
        ) from None


def _refusal(standing: list[LiveRelay], least: int | None, downgrade: bool) -> str:
    names = ", ".join(
        f"{relay.owner} (protocol {relay.protocol}, {relay.buckets} buckets)" for relay in standing
    )
    if downgrade:
        why = f"a downgrade while relays hold buckets: {names}; stop every relay first"
    else:
        why = (
            f"this migration needs relays of protocol {least} or later, and relays of older "
            f"protocols hold buckets: {names}; stop them first"
        )
    return f"{why} (their leases run out within RELAY_LEASE), or pass --force"
