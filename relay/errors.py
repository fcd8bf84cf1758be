"""One exception root. Adapters chain the driver's exception (``raise ... from exc``)."""


class RelayError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(RelayError):
    """A setting, option or topology file is invalid. The message names the setting."""


class StoreError(RelayError):
    """The outbox database failed a call; the call may be retried. ``summary``: the message
    without the driver's own words, which may quote a value (what failed, on which database),
    for a record that must not hold one (``relay.inbox.policy.describe``)."""

    def __init__(self, message: str, *, summary: str | None = None) -> None:
        super().__init__(message)
        self.summary = summary


class SchemaMissingError(StoreError):
    """The outbox table is not there: ``relay migrate`` has not run on this database."""


class MigrationRefusedError(RelayError):
    """``relay migrate`` would change the schema under live relays it concerns
    (``relay.upgrade.blockers``), or a migration cannot change the database as it stands
    (the message says what to do first); nothing was changed."""


class RetiredError(RelayError):
    """The schema admits relays of a newer protocol only (``relay.buckets.Fence.RETIRED``):
    this relay gave its buckets up; the message names the release to run."""


class BrokerError(RelayError):
    """The broker refused or lost the connection, or refused the topology."""


class InputError(RelayError):
    """An operator's input (for example a line given to ``relay enqueue``) is malformed."""
