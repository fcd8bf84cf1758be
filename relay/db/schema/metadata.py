"""The metadata every table of the schema is declared in (``relay.db.schema``)."""

import sqlalchemy as sa

metadata = sa.MetaData()
