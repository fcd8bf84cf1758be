"""The operator's commands over the outbox (``relay status``, ``replay``, ``purge``,
``show``...): ``commands`` runs them; what they read and select is ``relay.admin_records``,
below both the commands and the database that fills it."""
