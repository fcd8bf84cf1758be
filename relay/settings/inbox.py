"""An inbox consumer's settings (``relay.inbox``)."""

from __future__ import annotations

from dataclasses import dataclass

from relay.constants import (
    INBOX_DEDUPE_WINDOW_S,
    INBOX_IMMEDIATE_RETRIES,
    INBOX_KEY_MAX_BYTES,
    INBOX_MAX_ATTEMPTS,
    INBOX_PREFETCH,
    INBOX_RETRY_DELAY_MAX_S,
    INBOX_RETRY_DELAY_S,
)
from relay.errors import ConfigError
from relay.settings.parse import (
    FromEnvironment,
    env_name,
    flag,
    non_negative_int,
    positive_float,
    positive_int,
    seconds_or_zero,
    setting,
)


@dataclass(frozen=True)
class InboxSettings(FromEnvironment):
    """An inbox consumer's own settings (``relay.inbox``); its database, broker and TLS are
    the relay's settings of the same names (``RELAY_DATABASE_URL``, ``RELAY_AMQP_URL``, ...)."""

    inbox_queue: str = setting(
        "", str, "Queue the inbox consumer consumes (it must exist: declare it in the topology)."
    )
    inbox_consumer: str = setting(
        "",
        str,
        "Name of the consumer, part of every key it keeps: consumers that share a database "
        "each process every message once under their own name (default: the queue's name). "
        "At most 255 bytes of UTF-8.",
    )
    inbox_max_attempts: int = setting(
        INBOX_MAX_ATTEMPTS,
        positive_int,
        "Failed attempts at a message (its handler raised, or its consumer died while "
        "handling it) after which it is rejected without requeue, to the queue's dead-letter "
        "exchange.",
    )
    inbox_immediate_retries: int = setting(
        INBOX_IMMEDIATE_RETRIES,
        non_negative_int,
        "Failed attempts at a message retried at once (requeued) before the delayed ones.",
        see="inbox.md#retries",
    )
    inbox_retry_delay: float = setting(
        INBOX_RETRY_DELAY_S,
        positive_float,
        "Seconds before the first delayed retry of a failed message, doubling for each "
        "retry after it: the message waits in a retry queue of the broker's, not in the "
        "consumer.",
        see="inbox.md#retries",
    )
    inbox_retry_delay_max: float = setting(
        INBOX_RETRY_DELAY_MAX_S,
        positive_float,
        "Longest delay in seconds before a retry of a failed message.",
        see="inbox.md#retries",
    )
    inbox_prefetch: int = setting(
        INBOX_PREFETCH,
        positive_int,
        "Deliveries the broker sends ahead of the one being handled (basic.qos).",
    )
    inbox_dedupe_window: float = setting(
        INBOX_DEDUPE_WINDOW_S,
        seconds_or_zero,
        "Seconds a processed message's id is kept: a copy that comes within it is acked "
        "unprocessed, one that comes later is processed again. It must outlast every way a "
        "message can come again: the relay's RELAY_RETENTION (replays), and the broker's "
        "longest queueing (0 keeps ids forever).",
        shown="1209600 (14 days)",
        see="inbox.md#the-dedupe-window",
    )
    inbox_error_messages: bool = setting(
        False,
        flag,
        "Keep a failed handler's exception message, not only its type and where it was "
        "raised, in its dead letter's x-inbox-error, its attempts and the logs: only for "
        "handlers whose exceptions never quote a payload or a value (a database error's "
        "message is never kept: it quotes values).",
        see="inbox.md#what-a-failure-is-recorded-as",
    )
    inbox_purge_interval: float = setting(
        600.0, positive_float, "Seconds between the consumer's purges of expired ids."
    )

    def __post_init__(self) -> None:
        if not self.inbox_queue:
            raise ConfigError(f"{env_name('inbox_queue')} must name the queue to consume")
        if not self.inbox_consumer:
            object.__setattr__(self, "inbox_consumer", self.inbox_queue)
        name = self.inbox_consumer
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > INBOX_KEY_MAX_BYTES or "\x00" in name:
            # Two names alike in their first 255 bytes were one consumer's on MariaDB (its
            # column cut them short): one's messages acked as the other's duplicates.
            raise ConfigError(
                f"{env_name('inbox_consumer')} (or {env_name('inbox_queue')}, its default) must "
                f"be at most {INBOX_KEY_MAX_BYTES} bytes of UTF-8 without a NUL, not {size}"
            )
        if self.inbox_retry_delay_max < self.inbox_retry_delay:
            raise ConfigError(
                f"{env_name('inbox_retry_delay_max')}={self.inbox_retry_delay_max:g} must be at "
                f"least {env_name('inbox_retry_delay')}={self.inbox_retry_delay:g}"
            )
