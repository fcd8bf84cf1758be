"""Every fixed tunable that is not a setting, in one place, each with the reason for its value.

Settings (``relay.settings``) are what an operator chooses per deployment; these are what the
code needs to behave well anywhere, and changing one is a code change with its own test run.
"""

from __future__ import annotations

# --- Database ------------------------------------------------------------------------------
# A connect that hangs (a black-holed database host) fails after this and is retried with
# back-off, instead of stalling the loop's worker thread.
DB_CONNECT_TIMEOUT_S = 5
# No statement of the relay's runs longer than this (a claim behind LOCK TABLE, a stuck
# migration): it fails, is logged, and is retried after a back-off. Milliseconds.
DB_STATEMENT_TIMEOUT_MS = 30_000
# No statement of the relay's waits longer than this for a lock: the relays' own statements
# skip each other's locked rows (SKIP LOCKED), so a wait is someone else's lock (an operator's,
# a migration's), and the statement is retried after a back-off. Milliseconds.
DB_LOCK_TIMEOUT_MS = 5_000
# The database ends a transaction of the relay's that sat idle this long between two of its
# statements (PostgreSQL's idle_in_transaction_session_timeout, MariaDB's
# idle_transaction_timeout): its statements follow each other within milliseconds, so only a
# relay frozen inside one (SIGSTOP, a VM paused) leaves it idle, and its locks (its presence,
# its buckets) must not outlive a lease. Seconds; MySQL has no such setting.
DB_IDLE_IN_TRANSACTION_S = 5
# TCP keepalives on the relay's database connections: a connection whose peer went silent (a
# host gone, a partition) is found dead after IDLE + COUNT x INTERVAL seconds of silence, and
# one whose sent data goes unacknowledged after USER_TIMEOUT, instead of the kernel's hours;
# the call fails and is retried on a new connection. The server keeps them too (PostgreSQL's
# tcp_keepalives_*), and so ends the session of a relay host gone.
DB_KEEPALIVE_IDLE_S = 5
DB_KEEPALIVE_INTERVAL_S = 2
DB_KEEPALIVE_COUNT = 3
DB_TCP_USER_TIMEOUT_S = DB_KEEPALIVE_IDLE_S + DB_KEEPALIVE_COUNT * DB_KEEPALIVE_INTERVAL_S
# While every claim comes back full (a sustained backlog), claims read on from where the last
# one stopped (``relay.held``); at least this often (seconds) one reads from the start again
# instead, for a row that committed behind that place (its transaction began before the rows
# the claims passed). A claim from the start steps over the rows in flight again: once a
# second, among dozens of claims, costs little.
READ_ON_MAX_S = 1.0
# An ordered claim (``RELAY_ORDERING``) takes each key's earliest pending row only. A backlog
# on few keys is then mostly rows waiting behind their key's earlier ones, and a claim that
# read the due rows until it found enough read all of them: behind 50,000 rows of 300 keys,
# 0.3 to 0.4 s of MariaDB a claim (seconds beside other work), so the deeper the backlog, the
# slower the relays drained it. So an ordered claim looks at the first ORDERED_LOOK_PER_ROW
# due rows not held (of every relay's buckets: with three relays, about five of its own) per
# row it asks for: each key's earliest rows are the oldest, at the front (37 to 43 ms there).
# A key's first row deeper than that (a new key's, or a row without a key behind a long run
# of others) is found by a claim that looks at every due row, made at least every
# ORDERED_LOOK_ALL_S, and no more than ORDERED_LOOK_ALL_SHARE of the time (a look at all of
# a deep backlog is long).
ORDERED_LOOK_PER_ROW = 16
ORDERED_LOOK_ALL_S = 1.0
ORDERED_LOOK_ALL_SHARE = 0.2
# Seconds between looks for due rows when idle (``poll_interval``'s default). New rows are
# found by the probe (below) within milliseconds; the poll finds the rest: rows due again
# after a back-off, and a row that committed after a later one (``relay.db.probe``).
POLL_INTERVAL_S = 0.5
# Seconds between looks at the outbox's newest id (``probe_interval``'s default,
# ``relay.db.probe``): what a new row of a steady stream waits at most before a claim looks
# for it. At 1,000 rows/s: p99 commit-to-ack 26.4 ms with 5 ms, 28.4 ms with 10 ms
# (bench.latency; NOTIFY gave 26.3 ms).
PROBE_INTERVAL_S = 0.005
# Seconds a relay gathers before a claim that follows a short one, and before a settle of
# fewer than a batch of outcomes (``linger``'s default, ``relay.pacing``, ``relay.batching``):
# each claim and each settle costs the database and the relay a round trip, a wake-up of a
# backend and of a worker thread, and a plan, whatever its size. Chasing every new row of a
# steady stream (2,000 rows/s over two relays) took about 900 of those a second, of 5 to 10
# rows each: 10 times the relays' CPU per row of a backlog drain, and 4 times the database's
# CPU of the writers' INSERTs. 50 ms caps them at 20 claims and 20 settles a second a relay,
# whatever the rate, and adds at most that to a row's commit-to-ack time (bench.soak).
LINGER_S = 0.05
# While the newest id stays the same, the probe's interval doubles up to this many times
# ``probe_interval``: each look wakes a database backend (about 150 us of PostgreSQL's CPU
# here, whatever the query), so looking every 5 ms cost an idle database 1.5% of a core,
# every 40 ms about 0.4%.
PROBE_IDLE_BACKOFF = 8
# The oldest servers of the MySQL family the outbox runs on: FOR UPDATE SKIP LOCKED (the
# bucket hand-over), JSON_TABLE (a settle's row changes as one parameter), expression column
# defaults (a row's times and message id).
MARIADB_MIN_VERSION = (10, 6)
MYSQL_MIN_VERSION = (8, 0, 13)
# `relay migrate` runs one at a time on a database (every new pod of the Deployment runs one
# before it starts): the next waits this long for the one before (seconds; a migration that
# rewrites a big table can take minutes), then fails and is run again by its pod. The lock's
# key on PostgreSQL (its advisory locks are a database's own): "outbox migrate" in ASCII.
MIGRATION_LOCK_WAIT_S = 600
MIGRATION_LOCK_KEY = 0x6F7574626F786D
# A migration's DDL waits at most this long for a table's lock (milliseconds; PostgreSQL):
# every writer's INSERT and every relay's settle queue behind a DDL statement that waits for
# its lock, so an application's long transaction on the outbox would stop them all for as
# long as it stays open. Timed out, the migration's transaction is rolled back (writers go
# on) and tried again after a back-off, for up to ``MIGRATION_LOCK_WAIT_S``.
MIGRATION_DDL_LOCK_TIMEOUT_MS = 2_000
MIGRATION_RETRY_MAX_S = 15.0
# SQLite has one writer at a time: others queue for up to this long instead of failing at once
# with "database is locked" (milliseconds; the same value for Spark's JDBC writer).
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Ids per statement: keeps every statement's parameter count far below SQLite's and
# PostgreSQL's limits.
IDS_PER_STATEMENT = 1000
# A row's last_error is for operators; a broker's close text can be long, the column need not be.
LAST_ERROR_MAX_CHARS = 2000
# A row's cause (``relay.causes``), written beside its last error: an index's key (the
# console's causes), so it is cut; a cause is the error's stable words, names and numbers
# out, and its first 200 characters tell causes apart.
CAUSE_MAX_CHARS = 200
# A relay sorts parked rows that have no cause yet (parked by relays of a release before
# migration 0018) this many a chunk, a short transaction each, at most this many chunks
# every interval (seconds): a million such rows are sorted within minutes of an upgrade.
CAUSE_SORT_CHUNK = 1000
CAUSE_SORT_CHUNKS = 100
CAUSE_SORT_INTERVAL_S = 60.0
# The backlog gauge counts due rows up to this many, and estimates beyond (relay.db.claims):
# a count costs a read of every row it counts, and an operator needs the exact number only
# while it is small.
BACKLOG_EXACT_ROWS = 10_000
# `relay status` reports the latency (created to sent) of the messages sent in this many last
# seconds: a window short enough that reading its rows stays cheap at any rate.
RECENT_SENT_S = 10.0
# Sent rows deleted per transaction by `relay purge` and the relay's retention: small enough
# that no transaction holds locks for long, large enough that a million rows is 200 commits.
PURGE_CHUNK = 5000
# Seconds between a relay's looks at whether the sent log is complete (claims take nothing
# until it is: a crash's rebuild starts this long after the relay is connected again, at
# most), and between its tries while another relay rebuilds it.
SENT_LOG_CHECK_S = 5.0
# Seconds before a relay looks again after a look at the sent log failed: after a crash of
# the database the first look fails on a connection the crash closed, and the next finds the
# log empty; waiting SENT_LOG_CHECK_S added 5 s to every crash's pause.
SENT_LOG_RETRY_S = 1.0
# Memory the sent log's rebuild (``relay.db.sentlog``) may sort its entries in, in key
# order, before it spills to temporary files: a session setting of its one transaction, not
# the server's. 60 million entries sort in passes over about 3 GB of temporary files.
SENT_LOG_REBUILD_WORK_MEM = "64MB"
# How often the database checks, during the rebuild's one long statement, that its relay is
# still connected (PostgreSQL 14's client_connection_check_interval, ms): a relay killed
# mid-rebuild otherwise left its backend copying to the end (or waiting on a lock for ever),
# holding the state row's lock, and the next relay waited that long before starting again
# (twice the pause: 2 million entries copied on for 3.8 s after the kill, 0.5 s with it).
SENT_LOG_REBUILD_CLIENT_CHECK_MS = 1000

# The sent log's runs (``relay.db.sentruns``): the journal's entries sealed into a run every
# this many seconds (after a crash, claims wait for the copy of the journal's unsealed tail:
# at most the margin, this and a check, 8 minutes, 960,000 entries at 2,000 acks a second,
# about 2.5 s at 400,000 a second; with 10 minutes here, 1.8 million took 43 s beside a
# load of 12, bench.failover), ...
SENT_RUN_SEAL_S = 120.0
# ... up to this many seconds ago: every ack that sent them has committed or failed by then
# (its statements are bounded by DB_STATEMENT_TIMEOUT_MS, its idle time by
# DB_IDLE_IN_TRANSACTION_S), so that no entry of a sealed span comes after its seal; by the
# database's clock and by the relay's monotonic one (``relay.sealing``: the database's may step).
SENT_RUN_MARGIN_S = 300.0
# After a crash, claims look ids up in the journal's unsealed tail themselves while it is
# copied back (``relay.db.sentruns.tail_sent``: a pass over the tail a claim, 0.4 to 1.5 s a
# million entries) only where the tail spans at most this many seconds of acks, from the
# latest run's end to its last entry (``relay.db.sentlog.claimable``): the seal's interval and
# margin, and the margin again that a relay just started waits before its first seal (a
# rolling restart's tail: 12 minutes, an outside review's). A longer tail (seals behind for
# days: an outside review's 40 million entries took 15.5 s a claim) is copied first.
SENT_TAIL_LOOKUP_MAX_S = 900.0
# Runs of one level merged into one of the next, once there are this many: a week's log is
# then at most about 15 runs of each level below the top (2 minutes, 32 minutes) and 20 at
# the top (8.5 hours), which a claim looks a key up in while the log is rebuilt; each entry
# is written once per level, about 25 bytes of WAL each.
SENT_RUN_FANIN = 16
SENT_RUN_TOP_LEVEL = 2
# Entries a merge writes a transaction, a range of keys at a time (``relay.db.sentmerge``).
SENT_RUN_MERGE_CHUNK = 1_000_000
# Keys of a run per block (one row): 64 keys and their sent times, about 1.6 KB, under
# PostgreSQL's TOAST threshold (2 KB), so that a lookup reads one heap page per run.
SENT_RUN_BLOCK = 64
# Seconds between a relay's looks at whether a run is due to be sealed or merged.
SENT_RUN_CHECK_S = 60.0

# --- Messages ------------------------------------------------------------------------------
# The largest message (payload and headers, bytes) the relay reads and publishes, and the Spark
# writer accepts, by default (``max_message_size``; option maxPayloadBytes): RabbitMQ 4's default
# max_message_size. A larger row is parked unread: fetching it could exhaust the relay's memory.
MAX_MESSAGE_SIZE = 16 * 1024 * 1024

# --- Inbox ---------------------------------------------------------------------------------
# The inbox keeps a message's key and its consumer's name as AMQP short strings, at most
# this many bytes of UTF-8 (``relay.db.schema.inbox_received``: MariaDB's VARCHAR(255) would
# cut a longer value short where an INSERT IGNORE runs).
INBOX_KEY_MAX_BYTES = 255

# The inbox's defaults (``relay.inbox``). Attempts: enough for a handler's passing failure (a
# deadlock, a restart of a service it calls), few enough that a poison message reaches the
# dead-letter queue within seconds.
INBOX_MAX_ATTEMPTS = 5
# The inbox's retry schedule (``relay.inbox.policy.RetrySchedule``): a failed message is
# tried again at once this many times (a deadlock, a blip), then after delays held by the
# broker, doubling from the first to the longest: a downstream away for a minute or two
# costs a message a few attempts, not all of them within milliseconds (200 messages whose
# handler's downstream was away for 10 s were all dead-lettered in 0.5 s).
INBOX_IMMEDIATE_RETRIES = 1
INBOX_RETRY_DELAY_S = 5.0
INBOX_RETRY_DELAY_MAX_S = 300.0
# Deliveries on their way while one is handled: a round trip's worth at thousands a second,
# and few enough that a consumer that dies returns few to the queue.
INBOX_PREFETCH = 50
# Ids kept twice the relay's default retention (7 days), so that a replay of anything the
# relay still remembers is a duplicate here.
INBOX_DEDUPE_WINDOW_S = 14 * 24 * 3600.0
# Ids deleted per transaction by the inbox's purge: short transactions beside the handlers'.
INBOX_PURGE_CHUNK = 1000
# The inbox's connection lost under one message's run this many times in a row, the database
# answering in between: the message breaks it (too large a write, a statement that kills its
# backend) and is counted as failing, not taken for the database away for ever.
INBOX_LOST_AT_ONE_MESSAGE = 3
# How often an asyncio consumer looks again for the run lock of an SQLite database that
# another consumer holds (``relay.db.runlock``): a run takes milliseconds.
INBOX_RUN_LOCK_POLL_S = 0.005
# The longest the inbox's purge holds its consumer's connection at a time (seconds): chunks
# follow each other for this long, then the connection is serviced (heartbeats, deliveries)
# until the next tick. Far below any heartbeat timeout.
INBOX_PURGE_SLICE_S = 0.25
# Seconds between the consumer's looks at its periodic work (the purge, a stop) while
# deliveries come or not.
INBOX_TICK_S = 1.0

# --- Broker --------------------------------------------------------------------------------
# pika's own connect timeout (``stack_timeout``) when the URL sets none.
PIKA_DEFAULT_CONNECT_TIMEOUT_S = 15.0
# The shortest connect timeout: a slow but healthy broker answers well within it.
MIN_CONNECT_TIMEOUT_S = 5.0
# A session that dies sooner than this after it opened counts as "short": repeated short
# sessions (a row the broker refuses in a way no row can be blamed for) back off.
SHORT_SESSION_S = 5.0
# After a close on a half-open link, how long to wait for the broker's close-ok before the
# socket is dropped (no longer than the confirm timeout).
HALF_OPEN_CLOSE_S = 5.0
# The publisher looks for overdue confirms every quarter of the confirm timeout, at least
# this often (seconds): part of what a lease must have left for a row to go out
# (``relay.lease.margin_for``).
WATCH_PERIOD_MAX_S = 1.0

# A broken destination (relay.broker.destinations) is probed this long after it broke, and the delay
# doubles with every failed probe up to the maximum: a probe costs a channel of its own and
# a line in the broker's log, and the maximum bounds how long a destination that is fixed
# waits to be found (its rows then become due at once).
DESTINATION_PROBE_INITIAL_S = 1.0
DESTINATION_PROBE_MAX_S = 10.0

# A confirm tag times out when the channel answered nothing for the confirm timeout, or when
# it waited this many confirm timeouts while others were answered (relay.broker.confirms): less than
# a lease (RELAY_LEASE must be more than twice the lease margin, relay.lease.margin_for), so no
# other relay takes the row while this one still waits for its confirm.
CONFIRM_CEILING_FACTOR = 2

# Distinct (channel, exchange, routing key, mandatory) publish method frames the relay keeps
# encoded (``relay.broker.frames``); beyond, they are built again (a relay publishing to more
# destinations than this pays about 1 us a message more).
METHOD_FRAMES_KEPT = 1024

# --- Memory --------------------------------------------------------------------------------
# Allocations this large are mmapped, and so returned when freed (relay.memory): above any
# claim or write of small messages (500 rows of 200 bytes are 100 KB), below a big message.
MALLOC_MMAP_THRESHOLD_BYTES = 1024 * 1024
# Heaps for the relay's threads (the event loop's and the database workers'): fewer heaps
# hold less freed memory; two keep the event loop from contending with one worker.
MALLOC_ARENAS = 2
# A loop turn's frames are written in one system call when they add up to less than this
# (relay.broker.publisher); larger writes go frame by frame, without a copy of the whole.
GATHER_MAX_BYTES = 1024 * 1024

# --- Loop ----------------------------------------------------------------------------------
# Seconds without a loop turn after which /healthz fails (the loop is stuck, not just idle).
LIVENESS_LIMIT_S = 60.0
# The GIL switch interval while `relay run` serves: the event-loop thread (pika) and the
# database worker threads hand the GIL back and forth all the time, and with Python's default
# of 5 ms a worker whose query returned waits up to 5 ms to run again (measured: about 10%
# more rows/s at 1 ms).
SWITCH_INTERVAL_S = 0.001
# While other rows wait, a claim leaves out the rows of broken destinations (they are only
# charged an attempt, relay.pacing); at least this often, a claim takes them too.
HELD_CHARGE_INTERVAL_S = 1.0

# Rows parked for one reason within this many seconds of its last log line share one line
# (relay.parked): a broken destination parks thousands of rows within seconds.
PARKED_LOG_INTERVAL_S = 10.0

# --- Tracing -------------------------------------------------------------------------------
# The service name on the relay's spans when OTEL_SERVICE_NAME (or service.name in
# OTEL_RESOURCE_ATTRIBUTES) does not set one.
DEFAULT_SERVICE_NAME = "outbox-relay"
# Rows whose last failed attempt's span is remembered, so that the next attempt links to it:
# a bound on memory when the broker refuses everything for a while (a span context is about
# 200 bytes with its dict entry).
TRACE_LINKS_MAX = 100_000

# --- Spark writer --------------------------------------------------------------------------
# An atomic write's staging table that no write_outbox holds (format("outbox") used directly,
# SQLite) is taken for the leftover of a killed driver once older than this, and dropped by
# the next atomic write and by `relay purge` (seconds; option stageAbandonedSeconds). Longer
# than any one write should take.
SPARK_STAGE_ABANDONED_S = 24 * 3600
# The class of the advisory locks `write_outbox` holds on its staging tables (PostgreSQL's
# two-number form: this class, and a number from the table's name), while it writes: a held
# stage whose lock no one holds is abandoned at once, whatever its age. "ob" in ASCII.
# (MySQL's named locks take the table's name itself.)
SPARK_STAGE_LOCK_CLASS = 0x6F62
# MySQL's wait_timeout on the connection that holds a stage's named lock (seconds): the
# largest the server takes on Linux, a year, so that no write outlives its lock.
SPARK_STAGE_LOCK_WAIT_TIMEOUT_S = 31_536_000
# The atomic merge's sort budget on PostgreSQL: a big batch sorts in a few long runs (a million
# rows still spill to a temporary file), not in many short ones of the 4 MB default.
MERGE_WORK_MEM = "256MB"
# A task's default-mode append COPYs its chunks straight into the outbox in segments of about
# this many bytes, each in a savepoint: one COPY streams while the next chunk is converted,
# and a segment that meets a message id already there (a retry, a re-run) is rolled back and
# goes through a temporary table instead. The segment is kept in memory until then.
SPARK_SEGMENT_BYTES = 32 * 1024 * 1024
# Savepoints one task's transaction takes at most; the rest of a bigger partition goes through
# the temporary table. PostgreSQL caches 64 subtransactions per transaction (PGPROC_MAX_CACHED_
# SUBXIDS); past that, every other session's snapshot checks look up pg_subtrans, and the
# relay's claims slow down.
SPARK_SAVEPOINTS_MAX = 48

# --- Owned buckets (relay.buckets) ----------------------------------------------------------
# The outbox's rows fall in this many buckets, and each relay claims only from the buckets it
# owns: claims need no row lock and write nothing (issue 23's study, bench/claim_designs.py).
# Enough for dozens of relays to get a share each; few enough that a relay's set of buckets
# is one short array parameter.
OUTBOX_BUCKETS = 64
# The relays' protocol (``relay.buckets.fence``): how a row maps to a bucket and what the
# claim and the settle assume of each other. Raised by a release whose relays must not run
# beside the release before's; a relay's presence row says it (NULL: the releases before
# protocols existed, which count as 1). 3: claims ask whether the sent log is complete, and
# acks write its journal, and claims probe both sent logs (migration 0015).
PROTOCOL = 3
# The first release that speaks PROTOCOL: what a relay of an older one is told to run once
# the schema admits this protocol only (``relay.db.buckets.refresh`` raises it).
PROTOCOL_RELEASE = "the release of migration 0015"
PROTOCOL_BEFORE_FENCES = 1
# Consecutive ids share a bucket in runs this long, so that one claim's rows share heap pages
# (hashing each id apart had a 500-row claim read 290 buffers instead of 12 with runs of 1,024).
# Short enough that a steady stream's new ids move on to another bucket every fraction of a
# second (128 rows: 0.4 s at 300 rows/s), and so to another relay (BUCKET_STRIDE): with runs
# of 1,024, one relay published a whole stream of 300 rows/s while the others idled.
BUCKET_SPAN_ROWS = 128
# Consecutive runs go to buckets this far apart (run * stride, modulo OUTBOX_BUCKETS): 39 is
# about OUTBOX_BUCKETS over the golden ratio, so that any few consecutive runs land spread
# over all the buckets, and so over the relays, which own contiguous ranges of them (a
# relay takes the lowest free buckets). Odd: every bucket gets runs. Simulated over every
# window of 23 consecutive runs (10 s of a 300 rows/s stream): with 2 relays each gets 0.48
# to 0.52 of them, with 3 relays 0.30 to 0.35, with 4 relays 0.22 to 0.30.
BUCKET_STRIDE = 39
# A relay renews its buckets this many times a lease (``relay.turns``): a turn that
# failed or came late still leaves two more before the lease runs out.
TURNS_PER_LEASE = 3
# And at least this often (seconds), whatever the lease: a relay that starts beside others
# gets its share within two turns (the others give up theirs at one, it takes at the next).
# A turn is one short transaction on two tables of a few dozen rows.
TURN_INTERVAL_MAX_S = 5.0
