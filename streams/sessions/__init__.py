"""Session compaction: the reference token estimator, the per-session lifecycle checker and
ledger reducer, and deterministic sample streams.

Pure functional core: nothing here imports Kafka or Faust.
"""
