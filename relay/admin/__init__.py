"""The operator's commands over the outbox (``relay status``, ``replay``, ``purge``,
``show``...): ``commands`` runs them, ``records`` holds what they read and select."""
