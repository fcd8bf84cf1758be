"""What the inbox's guard judges (``relay.db.inbox_transaction``): the text a handler's
statement becomes once compiled with its connection's dialect, whatever construct carries
it (SQL text, DDL, a literal column, text in a CTE, driver-level SQL), table-driven over the
three databases' SQLAlchemy dialects; and the moves of the transaction's own (a commit, a
savepoint) refused unless they are the inbox's own. No I/O: the statements are compiled,
never sent."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.db.dialects import of
from relay.db.inbox_transaction import Guard, TransactionEnded, judged
from relay.db.schema import inbox_received

# The drivers' dialects the inbox runs on: their compilers make the text the driver gets.
DIALECTS: dict[str, sa.Dialect] = {
    name: sa.create_engine(url).dialect
    for name, url in (
        ("postgresql", "postgresql+psycopg://"),
        ("mysql", "mysql+mysqldb://"),
        ("sqlite", "sqlite://"),
    )
}
EVERY = tuple(DIALECTS)


def ddl(text: str) -> sa.DDL:
    return sa.DDL(text)  # type: ignore[no-untyped-call]  # SQLAlchemy's DDL is untyped


orders = sa.table("orders", sa.column("id"), sa.column("commit_id"), sa.column("note"))
commits = sa.Table(
    "commit",
    sa.MetaData(),
    sa.Column("commit", sa.String(10)),
    sa.Column("rollback", sa.Integer),
)


def cte_of_text() -> Any:
    rows = sa.text("SELECT 1 AS x; COMMIT; SELECT 1 AS x").columns(sa.column("x")).cte("c")
    return sa.select(rows.c.x)


def text_after_a_cte() -> Any:
    rows = sa.select(sa.literal_column("1").label("x")).cte("c")
    return sa.select(rows.c.x).where(sa.text("1 = 1; ROLLBACK"))


# (what a handler sends: a statement, or driver-level SQL as it is; where; what the guard
# finds there: None for nothing)
CASES: list[tuple[str, Callable[[], Any], tuple[str, ...], str | None]] = [
    ("text", lambda: sa.text("COMMIT"), EVERY, "COMMIT"),
    ("DDL", lambda: ddl("COMMIT"), EVERY, "COMMIT"),
    ("DDL, commented", lambda: ddl("/* settle */ commit"), EVERY, "COMMIT"),
    ("DDL.execute_if", lambda: ddl("COMMIT").execute_if(dialect="sqlite"), EVERY, "COMMIT"),
    ("a literal column", lambda: sa.select(sa.literal_column("1; COMMIT")), EVERY, "COMMIT"),
    ("text in a CTE", cte_of_text, EVERY, "COMMIT"),
    ("text beside a CTE", text_after_a_cte, EVERY, "ROLLBACK"),
    ("driver-level SQL", lambda: "ROLLBACK", EVERY, "ROLLBACK"),
    ("a DDL savepoint", lambda: ddl("SAVEPOINT s"), EVERY, "SAVEPOINT"),
    ("DDL of autocommit", lambda: ddl("SET autocommit = 1"), EVERY, "AUTOCOMMIT"),
    (
        "a DDL session setting",
        lambda: ddl("SET synchronous_commit = off"),
        ("postgresql",),
        "session",
    ),
    ("MySQL's implicit commit", lambda: sa.schema.CreateTable(commits), ("mysql",), "CREATE"),
    (
        "a table made in the transaction",
        lambda: sa.schema.CreateTable(commits),
        ("postgresql", "sqlite"),
        None,
    ),
    ("the inbox's table", lambda: sa.select(inbox_received.c.message_id), EVERY, "inbox_received"),
    # What ordinary handlers send: never refused.
    (
        "an insert with parameters",
        lambda: sa.insert(orders).values(id=1, note="COMMIT"),
        EVERY,
        None,
    ),
    ("an executemany insert", lambda: sa.insert(orders), EVERY, None),
    (
        "a select of a column named commit_id",
        lambda: sa.select(orders.c.commit_id).where(orders.c.note == "ROLLBACK"),
        EVERY,
        None,
    ),
    (
        "a value inlined",
        lambda: sa.select(orders.c.id).where(
            orders.c.note == sa.literal("x'; COMMIT; --", literal_execute=True)
        ),
        EVERY,
        None,
    ),
    (
        "a table and columns named commit and rollback",
        lambda: sa.update(commits).values({"commit": "x"}).where(commits.c.rollback == 1),
        EVERY,
        None,
    ),
    ("a comment", lambda: sa.text("/* COMMIT */ SELECT 1 -- ROLLBACK"), EVERY, None),
    ("a prefix comment", lambda: sa.select(orders.c.id).prefix_with("/* END */"), EVERY, None),
    ("SET LOCAL", lambda: ddl("SET LOCAL lock_timeout = '1s'"), ("postgresql",), None),
    (
        "an upsert",
        lambda: postgresql.insert(orders).values(id=1).on_conflict_do_nothing(),
        ("postgresql",),
        None,
    ),
]


def sent(make: Callable[[], Any], dialect: sa.Dialect) -> str:
    """The text the driver is given for what ``make`` makes (a string goes as it is:
    ``exec_driver_sql``), values a compiler inlines at execution rendered as they are then."""
    statement = make()
    if isinstance(statement, str):
        return statement
    kwargs = {"render_postcompile": True}
    return str(statement.compile(dialect=dialect, compile_kwargs=kwargs))


@pytest.mark.parametrize(
    ("make", "name", "found"),
    [(make, name, found) for _, make, where, found in CASES for name in where],
    ids=[f"{name}: {what}" for what, _, where, _ in CASES for name in where],
)
def test_the_guard_judges_the_text_the_driver_gets(
    make: Callable[[], Any], name: str, found: str | None
) -> None:
    why = judged(sent(make, DIALECTS[name]), of(name))
    if found is None:
        assert why is None
    else:
        assert why is not None and found.lower() in why.lower()


# name -> (a move of the connection's, as ``Guard.moved`` is told of it)
MOVES = ("commit", "rollback", "begin", "savepoint", "release_savepoint", "rollback_savepoint")


@pytest.mark.parametrize("move", MOVES)
def test_a_move_of_the_transactions_is_refused_and_remembered(move: str) -> None:
    guard = Guard(of("postgresql"))
    with pytest.raises(TransactionEnded, match=move.replace("_", " ")):
        guard.moved(move)
    assert isinstance(guard.refused, TransactionEnded)
    guard.statement("SELECT 1")  # the run is failed already; the next statement may go
    with pytest.raises(TransactionEnded):
        guard.statement("COMMIT")
    assert move.replace("_", " ") in str(guard.refused)  # the first refusal is the one kept


def test_the_inboxs_own_savepoint_goes_through() -> None:
    guard = Guard(of("sqlite"))
    with guard.own():
        guard.moved("savepoint")
        guard.statement("SAVEPOINT sa_savepoint_1")
        guard.moved("release_savepoint")
    assert guard.refused is None
    with pytest.raises(TransactionEnded):
        guard.statement("SAVEPOINT s")


def test_the_inboxs_own_move_lets_through_its_own_code_alone() -> None:
    """Another task (its context made before the inbox's move began) or thread sending on
    the connection meanwhile is judged."""
    guard = Guard(of("postgresql"))
    another_task = contextvars.copy_context()
    with guard.own():
        guard.statement("SAVEPOINT sa_savepoint_1")
        with pytest.raises(TransactionEnded):
            another_task.run(guard.statement, "COMMIT")
    assert guard.refused is not None


def test_a_text_judged_before_is_refused_again_and_a_long_one_is_not_kept() -> None:
    """The judgements are kept per engine (one dict for its runs' guards): a refused text is
    refused at every run; a long text (a many-row insert's) is judged each time, not kept."""
    kept: dict[str, str | None] = {}
    long_text = "INSERT INTO t VALUES " + ", ".join(["(?)"] * 2000) + "; COMMIT"
    for _run in range(2):
        guard = Guard(of("sqlite"), kept)
        guard.statement("INSERT INTO t VALUES (?)")
        for text in ("COMMIT", long_text):
            with pytest.raises(TransactionEnded):
                guard.statement(text)
    assert kept == {"INSERT INTO t VALUES (?)": None, "COMMIT": kept["COMMIT"]}
    assert kept["COMMIT"] is not None
