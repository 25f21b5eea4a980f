"""One conformance suite of the queue-store contract (`queuestore.base`), run on SQLite and on Kafka."""

__all__: list[str] = []
