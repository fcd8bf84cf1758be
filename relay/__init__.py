"""outbox-relay: streams transactional-outbox rows to RabbitMQ with publisher confirms."""

__version__ = "0.1.0"
