"""Which MySQL-family servers can hold the outbox, by the version string they announce."""

from __future__ import annotations

import pytest

from relay.db.dialects.mysql import server_version_problem


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ("10.11.19-MariaDB-0+deb12u1", None),  # Debian 12
        ("10.6.0-MariaDB", None),
        ("11.4.2-MariaDB-ubu2404", None),
        # MariaDB before 11 announced itself behind a "5.5.5-" prefix to old clients.
        ("5.5.5-10.11.6-MariaDB-0+deb12u1", None),
        (
            "10.5.23-MariaDB-0+deb11u1",
            "MariaDB 10.5.23 cannot hold the outbox: it needs MariaDB 10.6",
        ),
        ("10.3.39-MariaDB", "MariaDB 10.3.39 cannot hold"),
        ("8.0.13", None),
        ("8.4.3", None),
        ("9.1.0", None),
        ("8.0.12", "MySQL 8.0.12 cannot hold the outbox: it needs MySQL 8.0.13"),
        ("5.7.44-log", "MySQL 5.7.44 cannot hold"),
        ("TiDB-v7", "is not one of MySQL or MariaDB's"),
    ],
)
def test_the_version_floor(server: str, problem: str | None) -> None:
    found = server_version_problem(server)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
