"""The decoded rows of tables written only by updates, kept from one batch to the next.

An update (`Checkpoint.update`) reads its row, changes it and writes it back. For a RocksDB
table that read decodes the JSON the store holds; the analytics table's rows (one per user: its
open windows and recent ids, ~5 KB in the bench) are read and rewritten in almost every batch
that touches the user: their decoding was ~5% of the samples of a caught-up worker's profile with
900 users, and keeping them saved ~2.5% of its CPU per record (with 300 users: within the noise;
bench/RESULTS.md, "Issue 14, stop 20"). The row a batch writes is exactly what the next update of the key would
decode, so the runtime keeps it here once it is in the store (`Runtime.write_rows`) and the next
read *takes* it (`Runtime.read_row`): the entry leaves the cache, the reader owns the object and
may change it. Whatever happens to that reader's batch, the cache never holds a row the store
does not: a batch that fails before its rows are written leaves the key absent (read from the
store again), one that writes them puts its rows back.

Bounded by the rows' encoded size (`MEMSTREAM_ROW_CACHE_BYTES`, least recently written first
out); emptied whenever partitions move (a standby's or a recovery's writes bypass it).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

#: what `take` returns for a key it does not hold (a row may be None)
MISSING: Any = object()


class DecodedRows:
    """Rows by (table name, partition, key), each with its encoded size; at most `max_bytes` in all."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._rows: OrderedDict[tuple[str, int, str], tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def take(self, table: str, partition: int, key: str) -> Any:
        """The row kept for the key, removed from the cache (the caller owns it), else MISSING."""
        entry = self._rows.pop((table, partition, key), None)
        if entry is None:
            return MISSING
        self.bytes -= entry[1]
        return entry[0]

    def put(self, table: str, partition: int, key: str, row: Any, size: int) -> None:
        """Keep `row` (just written to the store, `size` bytes encoded); the least recently
        written rows leave until the cache fits. A row larger than the whole cache is not kept."""
        self.drop(table, partition, key)
        if size > self.max_bytes:
            return
        self._rows[(table, partition, key)] = (row, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _key, (_row, dropped) = self._rows.popitem(last=False)
            self.bytes -= dropped

    def drop(self, table: str, partition: int, key: str) -> None:
        """Forget the key (its row was removed, or written some other way)."""
        entry = self._rows.pop((table, partition, key), None)
        if entry is not None:
            self.bytes -= entry[1]

    def clear(self) -> None:
        self._rows.clear()
        self.bytes = 0
