"""``UserMemory``: the partition-local state of one user (one ``motebit_id``).

Durable state is two records, both plain dicts the shell keeps in Faust tables:

* the **node records** (``memory.nodes.v1``, key ``motebit_id/node_id``) — live and closed
  (superseded) nodes;
* one **aux record** per user (:meth:`UserMemory.aux_record`) — what node records cannot carry:
  fingerprints and ids of deleted nodes (so deleted content is never re-formed and a late
  ``memory_formed`` of a deleted id never resurrects it), the de-duplication window,
  the Lamport clock of derived events and the latest ``memory_pinned`` per node (also for
  nodes not formed yet, so a pin that overtakes its node still applies).
  It holds no content (fingerprints are SHA-256 of normalized text).

Everything else — the similarity index in particular — is derived and rebuilt by
:meth:`UserMemory.from_nodes`; a rebuilt state decides exactly like the one it replaces.

History (closed, superseded nodes) is not held in memory: :class:`History` holds the ids of a
user's closed nodes, and their records only while they are not yet durable (closed since the
state was built, or handed to :meth:`UserMemory.from_nodes` because the shell cannot read them
back); any other is read on demand through a :class:`HistoryReader` the shell supplies (as-of
queries, supersession chains, retention sweeps, erasure). On a stream where most new facts
supersede an older one, a user's history grows with its records while its live nodes do not, so
a state that held its history would cost, to build and to keep, what the user ever said.

Mutation discipline: node dicts are never changed in place; an update builds a new dict and
:meth:`put_node` swaps it in. So a shallow copy of the maps is a safe snapshot and a node
dict handed to the shell (an upsert) never changes afterwards.

Bounds: ``deleted_fingerprints`` and ``deleted_node_ids`` are kept for ever (they are the
guarantee; ~100 bytes per deleted node, no content), and ``pins`` holds one entry per pinned
node id. Kept in the aux record these would grow it without bound, so the compact aux record
leaves them out, as it leaves out the sealed chunks of the de-duplication window (bounded:
:class:`~streams.core.ingest.DedupWindow`): the state reports what changed in each
(:meth:`UserMemory.side_changes`, :meth:`UserMemory.seen_changes`) and takes them back apart
(the keyword arguments of :meth:`UserMemory.from_nodes`), so the shell can keep each entry in a
small record of its own. How those are named and stored — table keys, rows, a redo log of a
partly written batch — is the shell's business (``streams.agents.user_cache``), not the state's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .ingest import DedupWindow
from .nodes import as_of, complete_node, is_open
from .similarity import IndexConfig, SimilarityIndex

PinKey = tuple[int, int, str]
#: latest memory_pinned per node: (timestamp, version_clock, event_id, pinned)
Pin = tuple[int, int, str, bool]


def as_pin(value: Any) -> Pin:
    """A :data:`Pin` from its stored form (a list or tuple of its four fields)."""
    return (int(value[0]), int(value[1]), str(value[2]), bool(value[3]))


class HistoryReader(Protocol):
    """How :class:`History` reads a closed node that it does not hold (the shell's store)."""

    def get(self, node_id: str) -> Any:
        """The closed node ``node_id`` as stored, or None when the store has no such node."""

    def all(self) -> Iterable[tuple[str, Any]]:
        """``(node_id, stored row)`` of every closed node the store holds for this user."""

    def lost(self, node_id: str, why: str) -> None:
        """Told before :class:`MissingHistory` is raised: a known closed node the store has not,
        or holds unreadable (the shell contains the user, as for any row it cannot read)."""


class MissingHistory(LookupError):
    """A closed node whose id the state knows cannot be read from the store (rows lost or
    changed by hand): the record that needed it fails rather than deciding on a partial history."""

    def __init__(self, motebit_id: str, node_id: str, why: str = "not in the store") -> None:
        super().__init__(f"closed node {node_id[:200]!r} of {motebit_id[:200]!r}: {why}")


class History(Mapping[str, dict[str, Any]]):
    """A user's closed (superseded) nodes: every id, and the records of those *held*; any other
    record is read through the reader when asked for. Held: the nodes closed or changed since
    the state was built (until :meth:`release`, once the shell has made them durable), and the
    nodes given at construction (:meth:`hold`: the shell cannot read them back, e.g. rows of an
    earlier layout or of a redo log not rewritten yet). Without a reader every node is held."""

    def __init__(self, motebit_id: str, reader: HistoryReader | None = None) -> None:
        self.motebit_id = motebit_id
        self.reader = reader
        self._ids: set[str] = set()
        self._held: dict[str, dict[str, Any]] = {}
        self._kept: set[str] = set()  #: held for good (not released): see the class doc

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __getitem__(self, node_id: str) -> dict[str, Any]:
        node = self.get(node_id)
        if node is None:
            raise KeyError(node_id)
        return node

    def get(self, node_id: str, default: Any = None) -> Any:
        if node_id not in self._ids:
            return default
        node = self._held.get(node_id)
        if node is None:
            node = self._readable(node_id, self.reader.get(node_id) if self.reader is not None else None)
        return node

    def _readable(self, node_id: str, row: Any) -> dict[str, Any]:
        """A stored row of ``node_id``, checked: a node of this user with that id, else
        :class:`MissingHistory` (the reader told first)."""
        if row is None:
            self._lost(node_id, "not in the memory state store")
        if not (isinstance(row, dict) and row.get("node_id") == node_id and row.get("motebit_id") == self.motebit_id):
            self._lost(node_id, "its stored row is not a node of this user with this id")
        return row

    def _lost(self, node_id: str, why: str) -> None:
        if self.reader is not None:
            self.reader.lost(node_id, why)
        raise MissingHistory(self.motebit_id, node_id, why)

    @property
    def held(self) -> int:
        """How many closed nodes are held in memory."""
        return len(self._held)

    def records(self) -> list[dict[str, Any]]:
        """Every closed node (held ones as held, the others read in one pass), in node_id order."""
        out = dict(self._held)
        if len(out) < len(self._ids) and self.reader is not None:
            for nid, row in self.reader.all():
                if nid in self._ids and nid not in out:
                    out[nid] = self._readable(nid, row)
        missing = self._ids - out.keys()
        if missing:
            self._lost(min(missing), "not in the memory state store")
        return [out[nid] for nid in sorted(out)]

    def know(self, node_id: str) -> None:
        """A closed node the store holds (its id only)."""
        self._ids.add(node_id)

    def hold(self, node: dict[str, Any], keep: bool = False) -> None:
        """A closed node held in memory: ``keep`` until the state is dropped (the shell cannot
        read it back), else until :meth:`release`."""
        nid = node["node_id"]
        self._ids.add(nid)
        self._held[nid] = node
        if keep:
            self._kept.add(nid)

    def pop(self, node_id: str, default: Any = None) -> Any:
        """Remove a closed node; returns its record (read when not held), or ``default``."""
        if node_id not in self._ids:
            return default
        node = self.get(node_id)
        self.discard(node_id)
        return node

    def discard(self, node_id: str) -> None:
        """Remove a closed node without reading it."""
        self._ids.discard(node_id)
        self._held.pop(node_id, None)
        self._kept.discard(node_id)

    def release(self) -> int:
        """Drop the held records the store now has (the shell made them durable); returns how
        many. Those given with ``keep`` stay; without a reader nothing is dropped."""
        if self.reader is None:
            return 0
        drop = [nid for nid in self._held if nid not in self._kept]
        for nid in drop:
            del self._held[nid]
        return len(drop)


@dataclass
class SideChanges:
    """What :meth:`UserMemory.side_changes` reports: the entries the compact aux record leaves
    out, changed since the last call. Deleted ids and fingerprints are only ever added; a pin
    is set (its :data:`Pin`) or gone (None: its node was deleted). Each in sorted order."""

    deleted_node_ids: list[str] = field(default_factory=list)
    deleted_fingerprints: list[str] = field(default_factory=list)
    pins: dict[str, Pin | None] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.deleted_node_ids) + len(self.deleted_fingerprints) + len(self.pins)


class UserMemory:
    def __init__(
        self,
        motebit_id: str,
        *,
        index_config: IndexConfig | None = None,
        dedup_max_ids: int = 10_000,
        dedup_horizon_ms: int = 7 * 24 * 60 * 60 * 1000,
    ) -> None:
        self.motebit_id = motebit_id
        self.live: dict[str, dict[str, Any]] = {}
        self.closed = History(motebit_id)
        self.index = SimilarityIndex(index_config)
        self.deleted_fingerprints: set[str] = set()
        self.deleted_node_ids: set[str] = set()
        self.seen = DedupWindow(dedup_max_ids, dedup_horizon_ms)
        self.clock = 0
        self.pins: dict[str, Pin] = {}
        #: newest (timestamp, version_clock, id) applied from memory.events (late detection)
        self.last_event_key: PinKey | None = None
        self.stats: dict[str, int] = {"late": 0}
        # changed since `side_changes`: deleted ids, deleted fingerprints, pinned node ids
        self._new_deleted_ids: set[str] = set()
        self._new_deleted_fps: set[str] = set()
        self._changed_pins: set[str] = set()

    # ------------------------------------------------------------------ construction ----
    @classmethod
    def from_nodes(
        cls,
        motebit_id: str,
        nodes: Iterable[Mapping[str, Any]],
        aux: Mapping[str, Any] | None = None,
        *,
        index_config: IndexConfig | None = None,
        dedup_max_ids: int = 10_000,
        dedup_horizon_ms: int = 7 * 24 * 60 * 60 * 1000,
        seen_chunks: Mapping[int, list] | None = None,
        deleted_node_ids: Iterable[str] = (),
        deleted_fingerprints: Iterable[str] = (),
        pins: Mapping[str, Any] | None = None,
        history_ids: Iterable[str] = (),
        history: HistoryReader | None = None,
    ) -> UserMemory:
        """Rebuild from the durable state: node records (any order), the aux record and, when
        the aux record is compact (``aux_record(compact=True)``), what it leaves out: the sealed
        chunks of its de-duplication window (``seen_chunks``: chunk number → its rows, as
        ``seen_changes`` reported them) and the deleted ids, deleted fingerprints and pins (as
        ``side_changes`` reported them; a pin in its stored form, see :func:`as_pin`).

        An aux record of the earlier layout (with the deleted ids, fingerprints and pins in it)
        is read too, and its entries are then reported by the next ``side_changes`` so that the
        shell keeps them apart from then on.

        ``history_ids``: the closed nodes the store holds, read on demand through ``history``
        (a :class:`HistoryReader`); a closed node among ``nodes`` is held in memory for as long
        as this state lives. An id both live in ``nodes`` and in ``history_ids`` is closed (a
        node never reopens: its closing was the later write)."""
        um = cls(motebit_id, index_config=index_config, dedup_max_ids=dedup_max_ids, dedup_horizon_ms=dedup_horizon_ms)
        um.closed.reader = history
        closed_ids = set(history_ids)
        for rec in sorted((complete_node(n) for n in nodes), key=lambda n: n["node_id"]):
            if rec["motebit_id"] != motebit_id:
                raise ValueError(f"node {rec['node_id']} belongs to {rec['motebit_id']!r}, not {motebit_id!r}")
            if is_open(rec):
                if rec["node_id"] not in closed_ids:
                    um.put_node(rec)
            else:
                um.closed.hold(rec, keep=True)
        for nid in closed_ids:
            um.closed.know(nid)
        um.deleted_node_ids.update(deleted_node_ids)
        um.deleted_fingerprints.update(deleted_fingerprints)
        um.pins.update((node_id, as_pin(pin)) for node_id, pin in (pins or {}).items())
        if aux:
            legacy_ids, legacy_fps = aux.get("deleted_node_ids") or (), aux.get("deleted_fingerprints") or ()
            legacy_pins = aux.get("pins") or {}
            um.deleted_node_ids.update(legacy_ids)
            um.deleted_fingerprints.update(legacy_fps)
            for k, v in legacy_pins.items():
                um.pins.setdefault(k, as_pin(v))
            um._new_deleted_ids.update(legacy_ids)
            um._new_deleted_fps.update(legacy_fps)
            um._changed_pins.update(legacy_pins)
            seen = aux.get("seen") or {}
            um.seen = (DedupWindow.from_tail_record(seen, seen_chunks or {}, dedup_max_ids, dedup_horizon_ms) if "tail" in seen
                       else DedupWindow.from_record(seen, dedup_max_ids, dedup_horizon_ms))
            um.clock = int(aux.get("clock") or 0)
            lk = aux.get("last_event_key")
            um.last_event_key = (int(lk[0]), int(lk[1]), str(lk[2])) if lk else None
            um.stats = dict(aux.get("stats") or {"late": 0})
        return um

    def aux_record(self, compact: bool = False) -> dict[str, Any]:
        """The non-node durable state (JSON-serializable, deterministic ordering). Compact: the
        de-duplication window's tail only; its sealed chunks are kept apart (`seen_changes`)."""
        if compact:  # deleted ids and fingerprints and pins live in side rows (`side_changes`)
            return {
                "motebit_id": self.motebit_id,
                "seen": self.seen.to_tail_record(),
                "clock": self.clock,
                "last_event_key": list(self.last_event_key) if self.last_event_key else None,
                "stats": dict(sorted(self.stats.items())),
            }
        return {
            "motebit_id": self.motebit_id,
            "deleted_fingerprints": sorted(self.deleted_fingerprints),
            "deleted_node_ids": sorted(self.deleted_node_ids),
            "seen": self.seen.to_record(),
            "clock": self.clock,
            "pins": {k: list(v) for k, v in sorted(self.pins.items())},
            "last_event_key": list(self.last_event_key) if self.last_event_key else None,
            "stats": dict(sorted(self.stats.items())),
        }

    def side_changes(self) -> SideChanges:
        """The deleted ids, deleted fingerprints and pins changed since the last call (what the
        compact aux record leaves out, besides the de-duplication chunks: `seen_changes`)."""
        out = SideChanges(sorted(self._new_deleted_ids), sorted(self._new_deleted_fps),
                          {nid: self.pins.get(nid) for nid in sorted(self._changed_pins)})
        self._new_deleted_ids.clear()
        self._new_deleted_fps.clear()
        self._changed_pins.clear()
        return out

    # --------------------------------------------------------- side-row collections ----
    def forget_content(self, fingerprint: str) -> None:
        """Remember a deleted fingerprint: that content never forms a node again."""
        if fingerprint not in self.deleted_fingerprints:
            self.deleted_fingerprints.add(fingerprint)
            self._new_deleted_fps.add(fingerprint)

    def set_pin(self, node_id: str, pin: Pin) -> None:
        self.pins[node_id] = pin
        self._changed_pins.add(node_id)

    def seen_changes(self) -> tuple[dict[int, list], list[int]]:
        """Chunks of the de-duplication window sealed since the last call (chunk number → its
        rows) and those now wholly out of the window — what a compact aux record leaves out of
        its window (``seen_chunks`` of :meth:`from_nodes`)."""
        return self.seen.take_changes()

    def clone(self) -> UserMemory:
        """An independent copy (rebuilt from the durable state, as after a restart)."""
        copy = UserMemory.from_nodes(
            self.motebit_id,
            self.nodes(),
            self.aux_record(),
            index_config=self.index.config,
            dedup_max_ids=self.seen.max_ids,
            dedup_horizon_ms=self.seen.horizon_ms,
        )
        copy._new_deleted_ids = set(self._new_deleted_ids)
        copy._new_deleted_fps = set(self._new_deleted_fps)
        copy._changed_pins = set(self._changed_pins)
        return copy

    # ------------------------------------------------------------------------ reads ----
    def node(self, node_id: str) -> dict[str, Any] | None:
        n = self.live.get(node_id)
        return n if n is not None else self.closed.get(node_id)

    def nodes(self) -> Iterator[dict[str, Any]]:
        """Every node (live then closed), in node_id order within each group (the closed ones
        read from the store: a pass over the user's history)."""
        for nid in sorted(self.live):
            yield self.live[nid]
        yield from self.closed.records()

    def live_nodes(self) -> Iterator[dict[str, Any]]:
        return iter(self.live.values())

    def as_of(self, t: int) -> list[Mapping[str, Any]]:
        """The nodes valid at time ``t`` (bi-temporal query over live and closed nodes)."""
        return as_of(list(self.live.values()) + self.closed.records(), t)

    def knows(self, node_id: str) -> bool:
        return node_id in self.live or node_id in self.closed or node_id in self.deleted_node_ids

    def is_deleted_content(self, fingerprint: str) -> bool:
        return fingerprint in self.deleted_fingerprints

    def head_of(self, node_id: str) -> dict[str, Any] | None:
        """Follow ``superseded_by`` from ``node_id`` to the live node that replaced it
        (the node itself when live); None when the chain ends in a deleted/unknown node."""
        seen: set[str] = set()
        cur = node_id
        while cur not in seen:
            seen.add(cur)
            n = self.live.get(cur)
            if n is not None:
                return n
            n = self.closed.get(cur)
            if n is None or not n.get("superseded_by"):
                return None
            cur = n["superseded_by"]
        return None

    # -------------------------------------------------------------------- mutation ----
    def put_node(self, node: dict[str, Any]) -> None:
        """Insert or replace a node; keeps the live/closed split and the index in step."""
        nid = node["node_id"]
        old = self.live.get(nid)
        if is_open(node):
            self.closed.discard(nid)
            self.live[nid] = node
            if old is None or old["content"] != node["content"] or old.get("embedding") != node.get("embedding"):
                self.index.add(nid, node["content"], node.get("embedding"))
        else:
            if old is not None:
                del self.live[nid]
                self.index.remove(nid)
            self.closed.hold(node)

    def erase_node(self, node_id: str) -> dict[str, Any] | None:
        """Delete a node for good: remove it and its index entry, remember its fingerprint
        and id. Returns the erased node (None if it was not there)."""
        node = self.live.pop(node_id, None)
        if node is not None:
            self.index.remove(node_id)
        else:
            node = self.closed.pop(node_id, None)
        if node_id not in self.deleted_node_ids:
            self.deleted_node_ids.add(node_id)
            self._new_deleted_ids.add(node_id)
        if self.pins.pop(node_id, None) is not None:
            self._changed_pins.add(node_id)
        if node is not None:
            self.forget_content(node["content_fingerprint"])
        return node

    def next_clock(self) -> int:
        """Lamport clock for derived events: strictly above everything seen so far."""
        self.clock += 1
        return self.clock

    def observe_clock(self, version_clock: int) -> None:
        self.clock = max(self.clock, int(version_clock))

    def __len__(self) -> int:
        return len(self.live) + len(self.closed)
