"""The operator console's fixed tunables (``relay.console`` and the database's and broker's
reads for it), each with the reason for its value: beside ``relay.constants``, below the
console and the layers it reads through, as its records are (``relay.console_records``)."""

from __future__ import annotations

from relay.constants import DB_IDLE_IN_TRANSACTION_S, DB_STATEMENT_TIMEOUT_MS

# A session idle this long ends (seconds): an unattended browser does not keep the power to
# replay for a working day. Renewed by every request.
CONSOLE_SESSION_IDLE_S = 900.0
# A session ends this long after its login however often it is used (seconds): a working
# day. A signed cookie cannot be taken back, so an OIDC user removed at the provider, or a
# cookie copied elsewhere, keeps working until then at most (a logout ends it at once).
CONSOLE_SESSION_LIFETIME_S = 8 * 3600.0
# A signing key shorter than this is refused: 32 random characters are 190 bits or more.
CONSOLE_SESSION_SECRET_MIN = 32
# ... or of fewer bits of randomness as its characters tell (``relay.settings.keys``: 32 hex
# digits, 128 bits, read as about 110; a pattern repeated 64, an alphabet 7).
CONSOLE_SESSION_SECRET_BITS = 100
# A login (OIDC's round trip to the identity provider, or the login form) must finish
# within this (seconds); its state cookie expires then.
CONSOLE_LOGIN_STATE_S = 600
# Failed logins allowed per user name from one address in the window (seconds) before that
# name is refused from that address until it has passed: enough for typing mistakes, far too
# few to guess a password.
CONSOLE_LOGIN_ATTEMPTS = 5
CONSOLE_LOGIN_WINDOW_S = 300
# An address may fail this many times the per-name attempts (of any names) in the window: a
# guesser trying many names from one address is stopped, while a few users behind one
# address (an office's NAT) each keep their own attempts.
CONSOLE_LOGIN_ADDRESS_SHARE = 10
# A name may fail this many times the per-name attempts from all addresses together in the
# window: a guesser who spreads over addresses, or makes them up, is bounded too.
CONSOLE_LOGIN_NAME_SHARE = 4
# Names and addresses with failures the limiter keeps before it forgets those whose failures
# have left the window (each a few hundred bytes: a name is at most CONSOLE_NAME_MAX).
CONSOLE_LOGIN_KEYS_KEPT = 10_000
# Password checks running at once: each scrypt check holds 32 MiB (n * r * 128 bytes), so
# two stay far below the console's 256 MiB memory limit (deploy/kubernetes/console) and keep
# the 2 cores of a small host; a login beyond them is answered at once (503), not queued.
CONSOLE_LOGIN_HASHES = 2
# A login form's fields: a user name and a password longer than these are refused, and a
# login body longer than CONSOLE_LOGIN_BODY_MAX is refused before it is read (413): a
# guesser cannot make the limiter keep megabyte names, nor scrypt hash megabyte passwords.
CONSOLE_NAME_MAX = 256
CONSOLE_PASSWORD_MAX = 1024
CONSOLE_LOGIN_BODY_MAX = 4096
# A change's form (the rows or letters ticked on a page, a filter, a row's edit) longer than
# this and three times the payload a row's page shows (its percent-encoded bytes) is refused
# before it is read whole (413): a viewer's 20 MB form held the console's event loop 19 s
# and 1.5 GB while it was parsed, before its role was checked (an outside review).
CONSOLE_FORM_BODY_MAX = 256 * 1024
# Password hashes (hashlib.scrypt): n=2**15, r=8, p=1 take about 32 MiB and 50-100 ms here,
# the parameters RFC 7914 and OWASP name for interactive logins. Stored with each hash, so
# raising them later leaves old hashes valid.
CONSOLE_SCRYPT_N = 2**15
CONSOLE_SCRYPT_R = 8
CONSOLE_SCRYPT_P = 1
# A payload is shown as a preview of at most this many bytes: a megabyte payload is not
# sent to a browser for a look.
CONSOLE_PAYLOAD_PREVIEW_BYTES = 4096
# Rows on a page of the list; and the rows of a key held behind a parked row, shown on its
# page (the count beyond is said, not listed).
CONSOLE_PAGE_ROWS = 50
CONSOLE_HELD_ROWS = 20
# The rows a bulk change left are named by id, this many of each reason, on the done page
# and in the audit entry, and the rest counted: an entry of a change that left 100,000 rows
# stays a line an operator reads.
CONSOLE_NAMED_IDS = 20
# A bulk change moves this many rows per transaction: each transaction holds its row locks
# (of parked rows only, which no writer touches) for milliseconds, and the relays see the
# first chunks' rows while the rest are still moving.
CONSOLE_CHUNK_ROWS = 200
# After each chunk a bulk change pauses this share of the time the chunk took: writers get
# the database (and, on a small host, its cores) back between chunks. Without a pause, a
# 100,000-row replay raised four writers' p99 INSERT latency 1.33x on this 2-core machine
# (bench.console).
CONSOLE_CHUNK_PAUSE_SHARE = 1.0
# A bulk change by filter leaves the rows parked within this long before its page's bound
# (seconds), and reports them: the relay stamps a parked row's time when its parking
# statement starts, inside its settle transaction, and commits after it, so a row stamped
# before the bound may have been committed after the page was drawn, unseen. The parking
# statement is the settle's last, it ends within the statement timeout, and a transaction
# idle longer than DB_IDLE_IN_TRANSACTION_S is ended by the database (on PostgreSQL and
# MariaDB; MySQL has no such limit, and a relay frozen there between its statement and its
# commit could commit later still).
CONSOLE_SETTLE_HORIZON_S = DB_STATEMENT_TIMEOUT_MS / 1000 + DB_IDLE_IN_TRANSACTION_S
# Text the list and the causes show of a last error: the index on parked rows' errors holds
# this prefix (an entry of a B-tree must stay under a third of a page).
CONSOLE_REASON_PREFIX = 200
# Causes the overview finds in its index of causes (one step down it each: 10,000 took
# about a third of a second on PostgreSQL); past them, the other causes are "more than".
CONSOLE_CAUSES_FOUND = 10_000
# The part of an exchange the console's index of parked rows holds (characters): every name
# RabbitMQ takes has at most 255 bytes; a longer one a writer wrote is parked as malformed,
# and held whole it could pass a B-tree entry's limit and fail the parking statement.
CONSOLE_EXCHANGE_KEY = 255
# A list of rows shows this much of each text (characters); a row's own page, all of it.
CONSOLE_LISTED_CHARS = 1000
# An inbox queue's dead letters on the console: a page lists at most CONSOLE_DEAD_LETTERS_PAGE
# (one view listed 5,007 letters, 1.8 MB). A page is read from the queue's head (a queue has
# no other way in): the letters before it are read and put back too, at most
# CONSOLE_DEAD_LETTERS_READ_MAX of them (under AMQP's 16-bit prefetch count, which must cover
# every letter held) and for at most CONSOLE_DEAD_LETTERS_BUDGET_S (a consumer with that
# prefetch read 10,000 letters in 1.1 s on loopback; basic.get, a round trip each, took 13
# s), so that no view reads a queue unbounded; a page past either says so. A read waits
# CONSOLE_DEAD_LETTERS_IDLE_S for a letter before taking the queue's end as reached (letters
# another reader holds are not delivered).
CONSOLE_DEAD_LETTERS_PAGE = 100
CONSOLE_DEAD_LETTERS_READ_MAX = 50_000
CONSOLE_DEAD_LETTERS_BUDGET_S = 5.0
CONSOLE_DEAD_LETTERS_IDLE_S = 0.5
# How long a read waits, once it put its letters back, for the queue to count them ready
# again (``relay.broker.deadletters.put_back``: the next read must find them there). 10,000
# letters of 2 KB were counted back 0.3 to 0.5 s after their channel's close; 4,500 of
# them, read to reach a page, were not all back after 1 s in 3 of 50 reads.
CONSOLE_DEAD_LETTERS_RETURN_S = 5.0
