"""memstream: stream processing on Apache Kafka for the long-term memory of AI agents."""

__version__ = "0.1.0"
