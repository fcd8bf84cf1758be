"""The purge of a consumer's expired keys and attempts, in slices between its deliveries
(``purge_slice``): steps of the inbox's flow (``relay.inbox.steps``) that the blocking and the
asyncio inboxes drive alike."""

from __future__ import annotations

import logging
import time

from relay.constants import INBOX_PURGE_CHUNK, INBOX_PURGE_SLICE_S
from relay.errors import StoreError
from relay.inbox.flow import Flow
from relay.inbox.steps import Steps, call

log = logging.getLogger(__name__)


def purge_slice(flow: Flow) -> Steps[bool]:
    """A slice of the purge of ``flow``'s consumer's ids older than its dedupe window: chunks
    of ``INBOX_PURGE_CHUNK``, each a short transaction, for at most ``INBOX_PURGE_SLICE_S``, so
    that the consumer's connection is serviced between slices. Whether more is left."""
    deleted, full = 0, True
    until = time.monotonic() + INBOX_PURGE_SLICE_S
    window = flow.inbox.inbox_dedupe_window
    while full and time.monotonic() < until:
        try:
            count = yield call(
                "purging the inbox", flow.statements.purge_one, window, INBOX_PURGE_CHUNK
            )
        except StoreError as exc:
            log.warning(
                "inbox purge failed: %s", flow.describe(exc), extra={"action": "inbox_purge_failed"}
            )
            return False
        deleted += count
        full = count == INBOX_PURGE_CHUNK
    if deleted:
        log.info(
            "purged %d expired ids", deleted, extra={"action": "inbox_purged", "rows": deleted}
        )
    return full
