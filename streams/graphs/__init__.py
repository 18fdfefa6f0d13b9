"""Graph execution: event-log paths and line parsing, the per-graph state reducer, the shipper's
file-position bookkeeping, and deterministic sample runs.

Pure functional core: nothing here imports Kafka or Faust (``shipper_state`` does file I/O only).
"""
