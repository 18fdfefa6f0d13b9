"""Re-partitioning a deployment from N to M partitions: where every row goes, what a move
writes, and the proof that nothing changed (`memstream repartition`, streams/tools/repartition.py).

A topic's partition count is fixed when it is created; raising it moves most keys to another
partition (murmur2 of the key modulo the count: `streams.core.partitioning`). The tables' state
lives in their changelog partitions, so it must follow its keys:

- **a table row** (a changelog record) belongs to the partition of its *owner*: the input key
  whose records write it (a user's node rows `<motebit_id>/<node id>` belong to `<motebit_id>`'s
  partition). Each table declares its owner rule next to the table (`streams.agents.table_owners`):
  a routing key (hashed), a fixed partition (an analytics subject `(unknown):<p>`), or None (a
  row no key owns stays where it is);
- **a row of a compacted output topic** (memory.nodes.v1, session.compactions.v1, ...) belongs to
  the partition of its own key, the one the workers write it to.

The proof: a table's live rows, as a multiset of (key, value), have the same count and
digest before and after, and every row sits in the partition its owner gives it.

Pure: no Kafka client; the shell reads and writes the topics.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from .partitioning import partition_for

#: Where a row belongs: a routing key (murmur2 of its UTF-8 bytes), a fixed partition, or None
#: (no key owns it: it stays in the partition that holds it).
Owner = str | int | None
OwnerRule = Callable[[str], Owner]

#: The header of a tombstone that a re-partition writes where a row of a compacted output topic
#: *was*: the row moved to the partition named by the value, it was not deleted. A reader that
#: keeps a key -> row map across partitions skips such a tombstone (docs/scaling-out.md).
MOVED_TO_HEADER = "memstream-moved-to"


class PlacementError(ValueError):
    """A row cannot be placed without losing another: the message names the table and the key."""


def own_key(key: str) -> Owner:
    """The default owner rule: the row's key is the input key that writes it."""
    return key


def destination(owner: Owner, current: int, partitions: int) -> int:
    """The partition among `partitions` of a row whose owner is `owner`, now in `current`."""
    if owner is None:
        return current
    if isinstance(owner, int):
        if not 0 <= owner < partitions:
            raise PlacementError(f"a row pinned to partition {owner} cannot be placed among {partitions} partitions")
        return owner
    return partition_for(owner.encode("utf-8"), partitions)


Rows = dict[tuple[int, bytes], bytes]  #: (partition, key) -> value of every live row


def live_rows(records: Iterable[tuple[int, bytes, bytes | None]]) -> Rows:
    """The live rows of a compacted topic read in offset order per partition: the latest value of
    each (partition, key), tombstones removed."""
    latest: dict[tuple[int, bytes], bytes | None] = {}
    for partition, key, value in records:
        latest[(partition, key)] = value
    return {pk: v for pk, v in latest.items() if v is not None}


class Digest:
    """How many live rows a table holds and a digest of them as a multiset of (key, value):
    independent of partitions and order (a sum of per-row SHA-256 values modulo 2**256), so it
    is built one partition at a time and compares a table before and after."""

    _MOD = 1 << 256

    def __init__(self) -> None:
        self.rows = 0
        self._sum = 0

    def add(self, key: bytes, value: bytes) -> None:
        h = hashlib.sha256(len(key).to_bytes(4, "big") + key + value).digest()
        self._sum = (self._sum + int.from_bytes(h, "big")) % self._MOD
        self.rows += 1

    def add_rows(self, rows: Rows) -> Digest:
        for (_p, key), value in rows.items():
            self.add(key, value)
        return self

    @property
    def sha256(self) -> str:
        return f"{self._sum:064x}"

    def as_dict(self) -> dict[str, int | str]:
        return {"rows": self.rows, "sha256": self.sha256}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Digest) and (self.rows, self._sum) == (other.rows, other._sum)

    def __hash__(self) -> int:
        return hash((self.rows, self._sum))

    def __repr__(self) -> str:
        return f"Digest(rows={self.rows}, sha256={self.sha256[:16]}…)"


def _owner(rule: OwnerRule, key: bytes) -> Owner:
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None  # not a key any input writes: it stays where it is
    return rule(text)


def split_visible(rows: Rows, rule: OwnerRule, partitions: int) -> tuple[Rows, Rows]:
    """A table's rows as workers see them among `partitions`, and the others: a worker reads a
    row only in its owner's partition (a user's rows by prefix in the user's partition; an
    analytics subject's in the subject's), so a row elsewhere (written there by an older version)
    is an orphan no worker reads. A re-partition carries the visible rows and leaves the orphans
    in the old changelog (counted in its report)."""
    visible: Rows = {}
    orphans: Rows = {}
    for (p, key), value in rows.items():
        home = destination(_owner(rule, key), p, partitions)
        (visible if home == p else orphans)[(p, key)] = value
    return visible, orphans


def place(table: str, rows: Rows, rule: OwnerRule, partitions: int) -> Rows:
    """Every row of a table changelog at its owner's partition among `partitions` (same key,
    same value). Refuses (PlacementError) when two rows would land on one (partition, key):
    one of them would be lost."""
    out: Rows = {}
    for (p, key), value in rows.items():
        dest = destination(_owner(rule, key), p, partitions)
        if (dest, key) in out:
            raise PlacementError(f"table {table}: key {key[:80]!r} is live in two partitions that both belong on "
                                 f"partition {dest} of {partitions}; repair the table before re-partitioning")
        out[(dest, key)] = value
    return out


def misplaced(table: str, rows: Rows, rule: OwnerRule, partitions: int, limit: int = 10) -> list[str]:
    """Rows of a table that are not where their owner puts them among `partitions` (the check of
    a copy): one line per row, at most `limit`."""
    out = []
    for (p, key), _value in rows.items():
        dest = destination(_owner(rule, key), p, partitions)
        if dest != p:
            out.append(f"{table}: key {key[:80]!r} is on partition {p}, its owner's partition is {dest}")
            if len(out) == limit:
                break
    return out


# ------------------------------------------------------------------ compacted output topics ----
@dataclass(frozen=True)
class Move:
    """What moving the live rows of one partition of a compacted output topic writes: `puts` (each
    row at its key's partition) first, acknowledged, then `tombstones` (with `MOVED_TO_HEADER`)
    where the rows were. Written again after a crash it repeats some puts (the same value: a
    compacted topic keeps one) and the missing tombstones."""

    puts: list[tuple[int, bytes, bytes]]  # (partition, key, value)
    tombstones: list[tuple[int, bytes, int]]  # (partition, key, moved to)


Held = Mapping[bytes, Collection[int]]  #: key -> every partition holding a live row of it


def live_keys(records: Iterable[tuple[int, bytes, bytes | None]]) -> dict[bytes, set[int]]:
    """Which partitions hold a live row of each key (a compacted topic read in offset order per
    partition), without keeping the values: the first pass of a move, over the whole topic."""
    latest: dict[tuple[int, bytes], bool] = {}
    for partition, key, value in records:
        latest[(partition, key)] = value is not None
    held: dict[bytes, set[int]] = {}
    for (p, key), live in latest.items():
        if live:
            held.setdefault(key, set()).add(p)
    return held


def plan_move(rows: Rows, partitions: int, held: Held | None = None) -> Move:
    """The move of live rows of a compacted output topic to their key's partition among
    `partitions` (murmur2 of the key bytes: where the workers write it). `rows` may be one
    partition's; `held` then says where every key of the whole topic is live (default: `rows`
    are the whole topic). A row whose key is already live at its partition is not put again
    (that row is newer: written there since the count was raised, or put by an interrupted run),
    only tombstoned."""
    held = _held(rows) if held is None else held
    puts, tombstones = [], []
    for (p, key), value in sorted(rows.items()):
        dest = partition_for(key, partitions)
        if dest == p:
            continue
        if dest not in held[key]:
            puts.append((dest, key, value))
        tombstones.append((p, key, dest))
    return Move(puts, tombstones)


def after_move(rows: Rows, partitions: int, held: Held | None = None) -> Rows:
    """What `rows` contribute to the live rows of their topic once `plan_move(rows, partitions,
    held)` is written (the whole topic's, when `rows` are all of it)."""
    held = _held(rows) if held is None else held
    out: Rows = {}
    for (p, key), value in rows.items():
        dest = partition_for(key, partitions)
        if dest == p:
            out[(p, key)] = value
        elif dest not in held[key]:
            out[(dest, key)] = value
    return out


def _held(rows: Rows) -> dict[bytes, set[int]]:
    held: dict[bytes, set[int]] = {}
    for p, key in rows:
        held.setdefault(key, set()).add(p)
    return held


def is_move_tombstone(headers: Iterable[tuple[str, object]] | Mapping[str, object] | None) -> bool:
    """Whether a tombstone's headers say its row moved (a re-partition), not that it was deleted."""
    if isinstance(headers, Mapping):
        return MOVED_TO_HEADER in headers
    return any(name == MOVED_TO_HEADER for name, _v in headers or ())


def output_misplaced(topic: str, rows: Rows, partitions: int, limit: int = 10) -> list[str]:
    """Live rows of a compacted output topic not at their key's partition (at most `limit` lines)."""
    out = []
    for (p, key) in rows:
        dest = partition_for(key, partitions)
        if dest != p:
            out.append(f"{topic}: key {key[:80]!r} is live on partition {p}, it belongs on {dest}")
            if len(out) == limit:
                break
    return out


# ------------------------------------------------------------------------- input offsets ----
def new_group_offsets(captured: Mapping[tuple[str, int], int], low: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Where the new generation's consumer group starts on each input partition: where the old
    group stopped on the partitions it had (`captured`: nothing after it was read), the start
    (`low` watermark) on the partitions the re-partition added (everything there came after)."""
    return {tp: captured.get(tp, start) for tp, start in low.items()}
