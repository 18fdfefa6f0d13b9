"""Reading one user's `memory-state` rows (and one partition's rows of any table: `partition_items`)
without reading the whole table, through Faust's store
internals (faust-streaming 0.15.3), reached only by the `rocksdb_*` functions of
`streams.runtime.faust_internals`.

Faust's RocksDB store (`faust/stores/rocksdb.py`) keeps one `rocksdict.Rdict` per table
partition (`Store._dbs[partition]`, opened in raw mode by `Store._db_for_partition`), with each
row stored under the bytes of the table's key serializer (here `utf8-key`: the key's UTF-8 bytes,
`streams.runtime.codecs`) and its value under the value serializer's bytes (JSON; decoded by
`Store._decode_value`). A user's rows are in the partition of the user (the changelog partition
of the event that wrote them: `Runtime.partition_of(user)`), under the keys `<user>` (the aux
row) and `<user>/<rest>`; RocksDB sorts keys bytewise, so `<user>/…` is one contiguous range
[`<user>/`, `<user>0`) (`0` follows `/` in ASCII) — a prefix scan (one more seek per other
partition: `user_rows`). Only partitions active on this worker are read (as the table's
`items()` does: `Store._dbs_for_actives`).

Any other store (memory://, or a table without a RocksDB `_dbs`) falls back to a scan of the
table's items: right, but it reads every row, so memory:// pays a full scan per user loaded
(it is for tests and development; production uses rocksdb://).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any

from faust.types import TP, TableT

from streams.runtime.faust_internals import (
    rocksdb_open_partitions,
    rocksdb_partition_db,
    rocksdb_store,
    rocksdb_value_decoder,
)

from .user_cache import HISTORY_KEY, KEY_SEP, group_rows

_SEP = KEY_SEP.encode()
_AFTER_SEP = bytes([_SEP[0] + 1])  # the first byte sorting after every `<user>/…` key
_HISTORY = HISTORY_KEY.encode()  # `~h/`
_AFTER_HISTORY = _HISTORY[:-1] + _AFTER_SEP  # `~h0`: after every `<user>/~h/…` key
#: the value `user_rows` gives a history row it did not read (`history=False`)
UNREAD = True


def _actives(store: Any, table: TableT) -> Callable[[int], bool]:
    """Whether a partition is active here, for one read: the table's own `items()` reads only
    those (`Store._dbs_for_actives`: a standby copy is not read). The assignor's set (built anew
    by every `assigned_actives()` call) and the changelog's name are taken once per read."""
    if table.is_global:
        return lambda partition: True
    topic, actives = table.changelog_topic_name, store.app.assignor.assigned_actives()  # type: ignore[attr-defined]
    return lambda partition: TP(topic=topic, partition=partition) in actives


def _active_db(store: Any, table: TableT, partition: int) -> Any | None:
    """The partition's Rdict when the partition is active here, else None (no rows)."""
    if not _actives(store, table)(partition):
        return None
    return rocksdb_partition_db(store, partition)  # opens it if Faust has not yet (as its own _get does)


def _user_dbs(store: Any, table: TableT, partition: int) -> list[Any]:
    """The Rdicts a user's rows are read from: its partition's, then every other active one's."""
    active = _actives(store, table)
    others = sorted(p for p in rocksdb_open_partitions(store) if p != partition and active(p))
    own = [partition] if active(partition) else []
    return [rocksdb_partition_db(store, p) for p in own + others]  # opened if Faust has not yet (as its own _get does)


def _range(db: Any, start: bytes, end: bytes, decode: Callable[[bytes], Any] | None, out: list) -> None:
    """Append the rows of [start, end) of `db`: `(key, decode(value))`, or `(key, UNREAD)`
    without `decode` (keys only: the values are not copied out of RocksDB)."""
    if decode is None:
        for key in db.keys(from_key=start):
            if key >= end:
                break
            out.append((key.decode(), UNREAD))
        return
    for key, value in db.items(from_key=start):
        if key >= end:
            break
        out.append((key.decode(), decode(value)))


def user_rows(table: TableT, user: str, partition: int, history: bool = True) -> list[tuple[str, Any]]:
    """Every row `(key, value)` of `user` (keys `<user>` and `<user>/…`), values decoded: the
    range of its partition `partition`, then the same range of every other active partition,
    which is empty unless a row was put there by hand (the worker writes a user's rows only in
    events of its partition); read so that such a row is seen, as a scan of the table would.
    `history=False`: the closed nodes' rows (`<user>/~h/…`) come with the value `UNREAD` (a
    user is loaded from their keys: `streams.agents.user_cache.load_user`)."""
    store = rocksdb_store(table)
    if store is None:
        prefix = user + KEY_SEP
        return [(k, v) for k, v in table.items() if k == user or k.startswith(prefix)]
    decode = rocksdb_value_decoder(store)
    head = user.encode()
    start, end = head + _SEP, head + _AFTER_SEP
    hist_start, hist_end = start + _HISTORY, start + _AFTER_HISTORY
    out: list[tuple[str, Any]] = []
    for db in _user_dbs(store, table, partition):
        aux = db.get(head)
        if aux is not None:
            out.append((user, decode(aux)))
        if history:
            _range(db, start, end, decode, out)
        else:
            _range(db, start, hist_start, decode, out)
            _range(db, hist_start, hist_end, None, out)
            _range(db, hist_end, end, decode, out)
    return out


def user_history(table: TableT, user: str, partition: int) -> list[tuple[str, Any]]:
    """The rows `(key, node)` of `user`'s closed nodes (`<user>/~h/…`), read as `user_rows` reads."""
    prefix = user + KEY_SEP + HISTORY_KEY
    store = rocksdb_store(table)
    if store is None:
        return [(k, v) for k, v in table.items() if k.startswith(prefix) and v is not None]
    decode = rocksdb_value_decoder(store)
    start = prefix.encode()
    end = start[:-1] + _AFTER_SEP
    out: list[tuple[str, Any]] = []
    for db in _user_dbs(store, table, partition):
        _range(db, start, end, decode, out)
    return [(k, v) for k, v in out if v is not None]


def user_row(table: TableT, key: str, partition: int) -> Any | None:
    """One row of a user (`key` is `<user>/…`), decoded, or None: its partition first, as
    `user_rows` reads."""
    store = rocksdb_store(table)
    if store is None:
        return table.get(key)
    raw = key.encode()
    for db in _user_dbs(store, table, partition):
        value = db.get(raw)
        if value is not None:
            return rocksdb_value_decoder(store)(value)
    return None


def partition_users(table: TableT, partition: int, partition_of, limit: int | None = None) -> list[str]:
    """The users of `partition` (`partition_of(user) == partition`) with rows in it, in key order.
    RocksDB: a skip scan that reads one key per user (an aux row key, or the first key of a
    `<user>/…` range, after which it seeks past the range), not the user's rows. With `limit`,
    the scan stops once it has found that many users (the first ones in key order)."""
    store = rocksdb_store(table)
    if store is None:
        found = sorted({k.partition(KEY_SEP)[0] for k in table.keys() if partition_of(k.partition(KEY_SEP)[0]) == partition})
        return found if limit is None else found[:max(limit, 0)]
    db = _active_db(store, table, partition)
    if db is None:
        return []
    offset_key = store.offset_key
    users: dict[str, None] = {}
    it = db.iter()
    it.seek_to_first()
    while it.valid() and (limit is None or len(users) < limit):
        key = it.key()
        if key == offset_key:
            it.next()
            continue
        head, sep, _rest = key.partition(_SEP)
        user = head.decode()
        if partition_of(user) == partition:
            users[user] = None
        if sep:
            it.seek(head + _AFTER_SEP)  # past this user's `<user>/…` range
        else:
            it.next()  # an aux row: its range (if any) follows, maybe after other users' keys
    return list(users)


def partition_items(table: TableT, partition: int, owned: Callable[[str], bool],
                    unreadable: Callable[[str, Exception], None] | None = None) -> list[tuple[str, Any]]:
    """Every row `(key, value)` of one partition's store, values decoded (None values skipped).
    RocksDB: the partition's own database only (when it is active here), not every active
    partition's as the table's `items()` reads them; any other store: the table's items whose
    key is `owned`. A partition-local timer that read the whole table at each of its ticks read
    it once per owned partition per interval: a cost that grows with the square of the
    partitions a worker owns (issue 34, bench/RESULTS.md). `unreadable(key, error)`: told of a
    RocksDB row whose value does not decode, which is then left out (without it, the error is
    raised)."""
    store = rocksdb_store(table)
    if store is None:
        return [(k, v) for k, v in table.items() if v is not None and owned(k)]
    db = _active_db(store, table, partition)
    if db is None:
        return []
    offset_key, decode = store.offset_key, rocksdb_value_decoder(store)
    out = []
    for key, value in db.items():
        if key == offset_key:
            continue
        try:
            row = decode(value)
        except Exception as exc:  # noqa: BLE001 - whatever the table's value serializer raises
            if unreadable is None:
                raise
            unreadable(key.decode(errors="replace"), exc)
            continue
        if row is not None:
            out.append((key.decode(), row))
    return out


def table_items(table: TableT, unreadable: Callable[[str, Exception], None]) -> list[tuple[str, Any]]:
    """Every row `(key, value)` of the table's active partitions, as its `items()` reads them, but
    a RocksDB row whose value does not decode is told to `unreadable(key, error)` and left out
    (the table's `items()` would stop at it)."""
    store = rocksdb_store(table)
    if store is None:
        return [(k, v) for k, v in table.items() if v is not None]
    active = _actives(store, table)
    out: list[tuple[str, Any]] = []
    for partition in sorted(p for p in rocksdb_open_partitions(store) if active(p)):
        out.extend(partition_items(table, partition, lambda _key: True, unreadable))
    return out


def users_rows(table: TableT, partition: int, partition_of, after: str | None = None,
               users: list[str] | None = None) -> Iterator[tuple[str, Callable[[], list]]]:
    """`(user, rows)` for every user of `partition` in user-id order (after `after`, when given:
    where a sweep in slices resumes), one user at a time, `rows()` reading that user's rows when
    called: RocksDB reads each user's range then; another store is read once and grouped.
    `users`: the partition's users as listed before (sorted; `SweepSlices.users`), instead of
    listing them again (a skip scan that seeks once per user of the partition)."""
    if rocksdb_store(table) is None:
        grouped = group_rows((k, v) for k, v in table.items() if partition_of(k.partition(KEY_SEP)[0]) == partition)
        for user in sorted(grouped) if users is None else [u for u in users if u in grouped]:
            rows = grouped.pop(user)
            if after is None or user > after:
                yield user, (lambda rows=rows: rows)  # type: ignore[misc]
        return
    listed = sorted(partition_users(table, partition, partition_of)) if users is None else users
    for user in listed[0 if after is None else bisect.bisect_right(listed, after):]:
        yield user, (lambda user=user: user_rows(table, user, partition))  # type: ignore[misc]
