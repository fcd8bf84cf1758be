"""in_list on every database: a list of ids bound as one parameter selects exactly those ids,
however long (none, one, many, the largest bigint) and whatever its order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from relay.db.dialects import of
from relay.db.engine import create_engine

IDS = [0, 1, 2**63 - 1, -5, *range(10, 2010, 3)]
PROBE = sa.Table(
    "id_list_probe",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
)


@pytest.fixture
def probe(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine(database_url)
    PROBE.create(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(PROBE), [{"id": i} for i in IDS])
    yield engine
    PROBE.drop(engine)
    engine.dispose()


@pytest.mark.parametrize("ids", [[], [7], IDS, IDS[::-1]], ids=["none", "one", "many", "reversed"])
def test_the_ids_bound_are_the_ids_selected(probe: sa.Engine, ids: list[int]) -> None:
    chosen = sa.select(PROBE.c.id).where(of(probe).id_in(PROBE.c.id))
    with probe.connect() as conn:
        assert sorted(conn.execute(chosen, {"ids": ids}).scalars()) == sorted(set(ids) & set(IDS))
