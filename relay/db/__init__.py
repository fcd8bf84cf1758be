"""The outbox database: the only package that imports SQLAlchemy or a database driver.

Split by role, each with its own engine tuned for what it does:

- ``schema``: the outbox table, the one definition for Alembic, the relay and the Spark writer.
- ``engine``: engine creation, session tuning, error wrapping, ``migrate``.
- ``claims``: the relay's claim, settle, backlog and LISTEN (fast, non-durable sessions).
- ``outbox``: writers' inserts (durable sessions) and the operator's status, replay, purge.
- ``sink``: the Spark writer's inserts: per-task COPY or insert, atomic staging and merge.
- ``migrations``: Alembic's environment and versions.
"""
