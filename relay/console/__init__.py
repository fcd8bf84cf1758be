"""The operator console (``relay console``): a web application over the outbox's parked rows
and the inbox's dead letters, for people (the ``console`` extra).

``relay.console.app.create_app`` builds the ASGI application, to run on its own (``relay
console``) or to mount in a host application. Nothing here imports SQLAlchemy or pika: the
database is ``relay.db.console``'s, the broker ``relay.broker.deadletters``'.
"""
