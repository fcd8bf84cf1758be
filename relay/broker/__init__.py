"""The broker side: everything that speaks AMQP 0-9-1 (pika is imported only here).

- ``publisher``: ``PikaPublisher``, the loop's ``Publisher`` port over a confirm-mode channel.
- ``connection``: pika's parameters, the connection, and the way through the nodes (failover).
- ``quarantine``: suspect rows, each published alone (pure).
- ``confirms``: the window of unconfirmed publishes and their outcomes (pure).
- ``blame``: which rows a channel the broker closed is blamed on (pure).
- ``destinations``: exchanges the broker refuses, held and probed (pure).
- ``topology``: the exchanges, queues and bindings declared at connect, from a TOML file.
"""
