"""The example inbox consumer (examples/inbox_consumer.py) as the fault tests run it:

    python -m tests.faults.inbox_consumer HOLD_ID MARKER

Its handler also records each message it processes in ``processed`` (no unique key: a
message processed twice shows twice), and the first time it handles ``HOLD_ID`` it writes
``MARKER`` and sleeps inside its transaction, so that a test can kill it there. Nothing of
this is in the example."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from examples import inbox_consumer
from relay.db.engine import create_engine
from relay.inbox import Delivery, Settings, Transaction

processed = sa.Table(
    "processed", sa.MetaData(), sa.Column("message_id", sa.String(255), nullable=False)
)
HOLD_S = 600.0


def main() -> int:
    hold, marker = sys.argv[1], Path(sys.argv[2])
    engine = create_engine(Settings.load(os.environ).database_url)
    processed.create(engine, checkfirst=True)
    engine.dispose()

    def handle(delivery: Delivery, tx: Transaction) -> None:
        inbox_consumer.handle(delivery, tx)
        tx.execute(processed.insert(), {"message_id": delivery.key})
        if delivery.key == hold and not marker.exists():
            marker.write_text("held")
            time.sleep(HOLD_S)

    return inbox_consumer.main(handle)


if __name__ == "__main__":
    sys.exit(main())
