"""Event-time tumbling windows for memory analytics (SPEC §4.10) — pure.

No Kafka, no Faust, no wall clock (one opt-in exception, ``now_ms``, below). The state of one
*subject* (a ``motebit_id``, or a pseudo subject such as ``session:<id>`` — see
``streams/analytics/classify.py``) is a plain JSON-able dict that a Faust table can persist as
is; a JSON round trip of it (a table recovered from its changelog after a restart or a
rebalance) behaves exactly like the original.

Windows
-------
Two tumbling sizes, ``minute`` (60 000 ms) and ``hour`` (3 600 000 ms), the two symbols of the
``WindowSize`` enum in ``schemas/analytics_window.avsc``. An input at event time ``t`` lands in
``[start, start + size)`` with ``start = floor(t / size) * size`` for each size: an event exactly
at a boundary opens the *next* window. Event time is the input's own time (ledger event
``timestamp``, quarantine ``quarantined_at``, …), never the time it is processed.

Clock, watermark, lateness and expiry
-------------------------------------
``state["clock"]`` is the subject's event-time high-water mark: the greatest event time it has
counted, or a greater clock given to :func:`add` / :func:`expire` (``clock_ms``, e.g. the
partition's clock from :func:`partition_clock`). It never goes back. Per size, the watermark is
``clock - lateness[size]`` (:func:`is_expired`); :class:`WindowPolicy` holds the lateness
(default: minute windows 2 h, hour windows 2 days). A window is

* **open** while ``window_end > watermark``: late and out-of-order inputs still land in it;
* **expired** once ``window_end <= watermark`` (``window_end + lateness <= clock``): an input
  for it is *too late* — not counted, but never silently lost: :func:`add` returns it in
  ``AddResult.refused`` (reason ``too_late``) and ``state["too_late"][size]`` counts it. The shell
  counts them (worker stats, the summary's ``too_late``); it does not dead-letter them, because
  the input record itself was accepted by the pipeline (a dead letter means "not accepted").

The decision depends only on the clock, never on whether :func:`expire` already dropped the
window, so when sweeps run does not change what is counted. With ``clock_ms`` left out,
everything is a pure function of the subject's sequence of inputs: reprocessing the same inputs
after a restart yields identical states and records. The shell passes the partition clock to
:func:`expire` so that idle subjects' windows expire too; the price is that for a subject
lagging more than the lateness behind its partition, whether an input is too late can depend
on when a sweep ran — never whether a counted input is published.

Optional guard (the only wall-clock input): ``add(..., now_ms=wall_clock)`` refuses an input
more than ``policy.max_future_ms`` after ``now_ms`` (reason ``too_early``, counted in
``state["too_early"]``), so one producer with a broken clock (a timestamp in 2100) cannot move
the clock and expire everything. It can only differ between a run and its replay for such
bogus inputs.

Publication (idempotent) and expiry (after publication)
-------------------------------------------------------
Each window has ``rev`` (updates applied) and ``published`` (the ``rev`` last published).
:func:`due` lists the windows whose ``rev != published`` — open or expired — as snapshots;
each becomes one complete ``AnalyticsWindow`` record (:func:`to_record`: the full current
aggregate, never a delta), so publishing twice, or again after a crash, is harmless. After the
records are sent, :func:`mark_published` stores the snapshots' ``rev``; :func:`expire` then drops
expired windows **that are published** (an expired window with unpublished updates stays until
it is published). Nothing relies on Faust's window-close callback: a recovered state still has
its unpublished windows (published at the next sweep) and its expired ones (dropped at the next
sweep).

Duplicates (at-least-once)
--------------------------
An input may be replayed after a crash. ``add(..., id=...)`` with a deterministic id (the
classifiers build them from event ids, offsets, sequence numbers) skips an id already counted:
the state remembers a 64-bit digest of each id (``recent_ids``: the newest
``policy.recent_ids``, default 256: sized for one subject's inputs between two offset
commits, the window a crash can replay — raise it for subjects with bigger bursts) until every window of its event time has expired (pruned by :func:`expire`) — after
that a replay is refused as too late anyway.

State size: per subject, the windows that received inputs within the lateness (at most
``lateness / size + 1`` per size: 121 minute and 49 hour windows by default, ~150 bytes each)
plus the id digests (~35 bytes each).

Counters
--------
:data:`COUNTERS`: the schema's counter fields, except that graph spend is kept as integer
nano-dollars (``graph_cost_nanousd``) so that sums are exact and independent of arrival order;
:func:`to_record` writes ``graph_cost_usd = nanos / 1e9``. :func:`add` also accepts
``graph_cost_usd`` (float dollars, converted). ``compaction_tokens_saved`` and graph spend may
be negative (a settled compaction can cost more than it saved; a corrected budget snapshot):
the sum over windows then equals the ledger's own total.

Record key: RECOMMENDATION (for the lead to decide)
---------------------------------------------------
The catalog keys ``memory.analytics.v1`` by ``motebit_id`` with cleanup ``compact,delete``.
Under compaction Kafka keeps only the *latest record per key*, i.e. one window per user (the
last minute or hour window published); every earlier window of that user is eventually
removed, which defeats "activity over time" for a consumer reading the topic from the start.

Recommended: key each record by its window, ``<motebit_id>/<window>/<window_start>``
(e.g. ``u1/minute/1767225600000``; not done: the shell keys by the subject), exactly like ``memory.nodes.v1`` is keyed
``motebit_id/node_id``. Then compaction keeps exactly the final aggregate of every window, the
``delete`` half (30 d retention) ages old windows out, and every update of one window goes to
the same partition, so "last record wins" per key holds. The price: one user's windows spread
over partitions (ordering across windows is not needed — each record is self-contained and
carries ``motebit_id``, ``window`` and ``window_start`` in its value). The catalog row, the
schema doc ("key motebit_id") and the README table would change to this key.

If the key stays ``motebit_id``: drop ``compact`` (cleanup ``delete`` only, 30 d) and have
consumers keep the latest value per :func:`window_identity` (motebit_id, window, window_start);
the records are the same either way.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STATE_VERSION = 1

MINUTE = "minute"
HOUR = "hour"
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
#: Window size name (the WindowSize enum symbol) -> length in ms, smallest first.
SIZES: dict[str, int] = {MINUTE: MINUTE_MS, HOUR: HOUR_MS}

NANOS_PER_USD = 1_000_000_000
GRAPH_COST_NANOS = "graph_cost_nanousd"
GRAPH_COST_USD = "graph_cost_usd"
#: Counters kept per window (integers). Record fields are the same names, except
#: ``graph_cost_nanousd`` which is published as ``graph_cost_usd`` (double, dollars).
COUNTERS: tuple[str, ...] = (
    "formed", "accessed", "deleted", "merged", "superseded", "promoted", "redacted",
    "quarantined", "dead_lettered", "compaction_tokens_saved", GRAPH_COST_NANOS,
)
#: Counters that count inputs (one per input), as opposed to amounts (tokens, spend).
EVENT_COUNTERS: tuple[str, ...] = COUNTERS[:9]

TOO_LATE = "too_late"
TOO_EARLY = "too_early"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class WindowPolicy:
    """Lateness per window size (how long after its end, in event time, a window still takes
    late inputs and is kept), the de-duplication memory and the optional future guard."""

    minute_lateness_ms: int = 2 * HOUR_MS
    hour_lateness_ms: int = 2 * DAY_MS
    recent_ids: int = 256
    max_future_ms: int = DAY_MS

    def __post_init__(self) -> None:
        for name in ("minute_lateness_ms", "hour_lateness_ms", "recent_ids", "max_future_ms"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise ValueError(f"WindowPolicy.{name} must be a non-negative int, not {v!r}")

    def lateness(self, size: str) -> int:
        if size == MINUTE:
            return self.minute_lateness_ms
        if size == HOUR:
            return self.hour_lateness_ms
        raise ValueError(f"unknown window size {size!r}")


DEFAULT_POLICY = WindowPolicy()


@dataclass(frozen=True)
class Refused:
    """An input (or its part for one window size) that was not counted.

    ``reason`` is ``too_late`` (its ``window`` had expired: ``window_end + lateness <= clock``)
    or ``too_early`` (``event_time_ms > now_ms + max_future_ms``; then ``window`` is None and the
    input was counted nowhere)."""

    subject: str
    reason: str
    event_time_ms: int
    counters: Mapping[str, int]
    id: str | None
    clock_ms: int | None
    window: str | None = None
    window_start: int | None = None
    window_end: int | None = None


@dataclass
class AddResult:
    """What :func:`add` did: the windows it updated (``(size, window_start)``), what it refused,
    and whether the input was a duplicate (then nothing changed)."""

    counted: list[tuple[str, int]] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    duplicate: bool = False

    @property
    def too_late(self) -> list[Refused]:
        return [r for r in self.refused if r.reason == TOO_LATE]

    @property
    def changed(self) -> bool:
        return bool(self.counted)


# --------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------


def new_state(subject: str, clock_ms: int | None = None) -> dict[str, Any]:
    """An empty state. ``clock_ms`` seeds the clock (e.g. the partition clock) so that a state
    created after an earlier one was dropped still refuses inputs for long-expired windows."""
    if not isinstance(subject, str):
        raise TypeError("subject must be a str")
    if clock_ms is not None and not _is_int(clock_ms):
        raise TypeError("clock_ms must be an int or None")
    return {
        "v": STATE_VERSION,
        "subject": subject,
        "clock": clock_ms,
        "windows": {},
        "too_late": {size: 0 for size in SIZES},
        "too_early": 0,
        "duplicates": 0,
        "recent_ids": [],
    }


_STATE_INTS = ("too_early", "duplicates")
_WINDOW_INTS = ("start", "end", "updated_at", "rev", "published")


def state_problem(state: Any) -> str | None:
    """Why ``state`` (a row as stored: anything) is not a state the functions of this module can
    use, or None when it is one. The shell contains a subject whose row has a problem (neither
    counted into nor published) instead of failing on it; O(windows + ids)."""
    if not isinstance(state, dict):
        return f"not an object but {type(state).__name__}"
    for name in ("subject", "clock", "windows", "too_late", "too_early", "duplicates", "recent_ids"):
        if name not in state:
            return f"no {name!r}"
    if not isinstance(state["subject"], str):
        return "'subject' is not a string"
    if state["clock"] is not None and not _is_int(state["clock"]):
        return "'clock' is neither an integer nor null"
    for name in _STATE_INTS:
        if not _is_int(state[name]):
            return f"{name!r} is not an integer"
    too_late = state["too_late"]
    if not isinstance(too_late, dict) or any(not _is_int(too_late.get(size)) for size in SIZES):
        return f"'too_late' is not an integer per window size ({', '.join(SIZES)})"
    windows = state["windows"]
    if not isinstance(windows, dict):
        return "'windows' is not an object"
    for key, w in windows.items():
        why = _window_problem(w)
        if why is None and key != window_key(w["window"], w["start"]):
            why = f"it is kept under another key than {window_key(w['window'], w['start'])!r}"
        if why is not None:
            return f"window {str(key)[:80]!r}: {why}"
    ids = state["recent_ids"]
    if not isinstance(ids, list) or any(not isinstance(e, list) or len(e) != 2 or not _is_int(e[1]) for e in ids):
        return "'recent_ids' is not a list of [digest, event time] pairs"
    return None


def _window_problem(w: Any) -> str | None:
    if not isinstance(w, dict):
        return "not an object"
    if not isinstance(w.get("window"), str) or w["window"] not in SIZES:
        return f"'window' is not one of {', '.join(SIZES)}"
    for name in _WINDOW_INTS:
        if not _is_int(w.get(name)):
            return f"{name!r} is not an integer"
    if w["end"] != w["start"] + SIZES[w["window"]]:
        return "'end' is not 'start' plus the window's size"
    counters = w.get("counters")
    if not isinstance(counters, dict) or any(not isinstance(k, str) or not _is_int(v) for k, v in counters.items()):
        return "'counters' is not an object of integers"
    return None


def window_bounds(event_time_ms: int, size: str) -> tuple[int, int]:
    """``(start, end)`` of the ``size`` window holding ``event_time_ms`` (start inclusive, end
    exclusive; floor division, so negative times work too)."""
    ms = SIZES[size]
    start = (event_time_ms // ms) * ms
    return start, start + ms


def window_key(size: str, start: int) -> str:
    """The key of a window inside ``state["windows"]`` (JSON object keys are strings)."""
    return f"{size}/{start}"


def is_expired(size: str, start: int, clock: int | None, policy: WindowPolicy = DEFAULT_POLICY) -> bool:
    return clock is not None and start + SIZES[size] + policy.lateness(size) <= clock


def partition_clock(states: Iterable[Mapping[str, Any] | None]) -> int | None:
    """The greatest clock of the given states (one partition's subjects): pass it as
    ``clock_ms`` to :func:`expire` so idle subjects' windows expire too, and to
    :func:`new_state` for a subject first seen on that partition."""
    clocks = [s["clock"] for s in states if isinstance(s, Mapping) and _is_int(s.get("clock"))]
    return max(clocks) if clocks else None


def normalize_counters(counters: Mapping[str, Any]) -> dict[str, int]:
    """Validate and convert increments: known names, integer values (``graph_cost_usd`` may be
    a float and becomes ``graph_cost_nanousd``); zero entries dropped."""
    for name, value in counters.items():  # the usual input (known names, plain ints): one pass
        if type(value) is not int or name not in _COUNTER_NAMES:
            break
    else:
        return {name: value for name, value in counters.items() if value != 0}
    out: dict[str, int] = {}
    for name, value in counters.items():
        if name == GRAPH_COST_USD:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or value in (float("inf"), float("-inf")):
                raise ValueError(f"{GRAPH_COST_USD} must be a finite number, not {value!r}")
            name, value = GRAPH_COST_NANOS, usd_to_nanos(value)
        elif name not in COUNTERS:
            raise ValueError(f"unknown analytics counter {name!r} (known: {', '.join(COUNTERS)})")
        elif not _is_int(value):
            raise ValueError(f"counter {name} must be an int, not {value!r}")
        out[name] = out.get(name, 0) + value
    return {k: v for k, v in out.items() if v != 0}


_COUNTER_NAMES = frozenset(COUNTERS)


def usd_to_nanos(usd: float | int) -> int:
    return int(round(usd * NANOS_PER_USD))


def _sizes(policy: WindowPolicy) -> tuple[tuple[str, int, int], ...]:
    """``(size, length, lateness)`` per window size, smallest first."""
    if policy is DEFAULT_POLICY:
        return _DEFAULT_SIZES
    return tuple((size, ms, policy.lateness(size)) for size, ms in SIZES.items())


_DEFAULT_SIZES = tuple((size, ms, DEFAULT_POLICY.lateness(size)) for size, ms in SIZES.items())


def add(state: dict[str, Any], event_time_ms: int, counters: Mapping[str, Any], *,
        id: str | None = None, clock_ms: int | None = None, now_ms: int | None = None,
        policy: WindowPolicy = DEFAULT_POLICY) -> AddResult:
    """Count ``counters`` at ``event_time_ms`` in the minute and hour windows holding it.

    Mutates ``state`` in place (write it back to the table afterwards). An input whose
    counters are all zero changes nothing. A repeated ``id`` is a duplicate: nothing changes
    except ``state["duplicates"]``. Inputs are validated before anything is changed.

    (Written for speed — it runs for every classified output of the pipeline, ~2.6 per input
    record: the window bounds, expiry test and clock are inlined from :func:`window_bounds`,
    :func:`is_expired` and ``_max_clock``; tests/analytics/test_windows.py holds it to those.)"""
    if type(event_time_ms) is not int and not _is_int(event_time_ms):
        raise ValueError(f"event_time_ms must be an int, not {event_time_ms!r}")
    if clock_ms is not None and type(clock_ms) is not int and not _is_int(clock_ms):
        raise ValueError(f"clock_ms must be an int or None, not {clock_ms!r}")
    if now_ms is not None and type(now_ms) is not int and not _is_int(now_ms):
        raise ValueError(f"now_ms must be an int or None, not {now_ms!r}")
    if id is not None and not isinstance(id, str):
        raise ValueError(f"id must be a str or None, not {id!r}")
    incs = normalize_counters(counters)
    result = AddResult()
    if not incs:
        return result
    if id is not None:
        digest: str | None = _digest(id)
        recent = _recent_ids(state)
        if digest in recent.digests:
            state["duplicates"] += 1
            result.duplicate = True
            return result
    else:
        digest = None
    if now_ms is not None and event_time_ms > now_ms + policy.max_future_ms:
        state["too_early"] += 1
        result.refused.append(Refused(state["subject"], TOO_EARLY, event_time_ms, dict(incs), id, state["clock"]))
        return result
    clock = state["clock"]
    if clock is None or event_time_ms > clock:
        clock = event_time_ms
    if clock_ms is not None and clock_ms > clock:
        clock = clock_ms
    state["clock"] = clock
    windows = state["windows"]
    for size, ms, lateness in _sizes(policy):
        start = (event_time_ms // ms) * ms
        end = start + ms
        if end + lateness <= clock:
            state["too_late"][size] += 1
            result.refused.append(Refused(state["subject"], TOO_LATE, event_time_ms, dict(incs), id, clock,
                                          size, start, end))
            continue
        key = f"{size}/{start}"
        w = windows.get(key)
        if w is None:
            w = windows[key] = {"window": size, "start": start, "end": end, "counters": {},
                                "updated_at": event_time_ms, "rev": 0, "published": 0}
        wc = w["counters"]
        for name, value in incs.items():
            wc[name] = wc.get(name, 0) + value
        if event_time_ms > w["updated_at"]:
            w["updated_at"] = event_time_ms
        w["rev"] += 1
        result.counted.append((size, start))
    if digest is not None:
        recent.remember(digest, event_time_ms, policy.recent_ids)
    return result


class RecentIds(list):
    """A state's ``recent_ids`` (``[digest, event time]`` entries, oldest first) with a count of
    its digests, so that a duplicate is found without scanning up to ``policy.recent_ids``
    entries per input (a plain list, as it is persisted, is wrapped on its state's first `add`;
    JSON and copies see a list). An entry whose digest is not a str (a garbled row) is kept and
    never matches, as the scan it replaces never matched it."""

    def __init__(self, entries: Iterable[Any] = ()) -> None:
        super().__init__(entries)
        self.digests: dict[str, int] = {}
        for entry in self:
            self._count(entry[0], 1)

    def remember(self, digest: str, event_time_ms: int, keep: int) -> None:
        """Append an entry; keep the newest `keep`."""
        self.append([digest, event_time_ms])
        digests = self.digests  # `digest` is a str: `_count` inlined
        digests[digest] = digests.get(digest, 0) + 1
        if len(self) > keep:
            drop = len(self) - keep
            for entry in self[:drop]:
                self._count(entry[0], -1)
            del self[:drop]

    def _count(self, digest: Any, n: int) -> None:
        if isinstance(digest, str):
            left = self.digests.get(digest, 0) + n
            if left:
                self.digests[digest] = left
            else:
                del self.digests[digest]


def _recent_ids(state: dict[str, Any]) -> RecentIds:
    ids = state["recent_ids"]
    if type(ids) is not RecentIds:
        ids = state["recent_ids"] = RecentIds(ids)
    return ids


def add_increment(state: dict[str, Any], increment: Any, *, clock_ms: int | None = None,
                  now_ms: int | None = None, policy: WindowPolicy = DEFAULT_POLICY) -> AddResult:
    """:func:`add` of a :class:`~streams.analytics.classify.Increment` (its ``subject`` must be
    the state's)."""
    if increment.subject != state["subject"]:
        raise ValueError(f"increment for {increment.subject!r} given to the state of {state['subject']!r}")
    return add(state, increment.event_time_ms, increment.counters, id=increment.id,
               clock_ms=clock_ms, now_ms=now_ms, policy=policy)


def due(state: Mapping[str, Any], clock_ms: int | None = None, *, final_only: bool = False,
        policy: WindowPolicy = DEFAULT_POLICY) -> list[dict[str, Any]]:
    """Snapshots (deep copies) of the windows to (re)publish: every window with updates not yet
    published, oldest first (minute before hour at equal start). ``final_only=True`` keeps only
    expired ones (one record per window, published when it can no longer change; latency =
    size + lateness) instead of publishing provisional aggregates at every sweep."""
    clock = _max_clock(state.get("clock"), clock_ms)
    out = []
    for w in state["windows"].values():
        if w["rev"] == w["published"]:
            continue
        if final_only and not is_expired(w["window"], w["start"], clock, policy):
            continue
        out.append(copy.deepcopy(w))
    return sorted(out, key=_window_order)


def mark_published(state: dict[str, Any], windows: Iterable[Mapping[str, Any]]) -> None:
    """Record that the given :func:`due` snapshots were sent: each window's ``published`` becomes
    the snapshot's ``rev`` (updates counted after the snapshot keep the window due)."""
    for snap in windows:
        w = state["windows"].get(window_key(snap["window"], snap["start"]))
        if w is not None:
            w["published"] = min(w["rev"], max(w["published"], snap["rev"]))


def expire(state: dict[str, Any], clock_ms: int | None = None, *,
           policy: WindowPolicy = DEFAULT_POLICY) -> list[dict[str, Any]]:
    """Advance the clock to ``clock_ms`` (if later) and drop the expired windows that are
    published; return the dropped windows. Expired windows with unpublished updates are kept
    (they are :func:`due`)."""
    if clock_ms is not None and not _is_int(clock_ms):
        raise ValueError(f"clock_ms must be an int or None, not {clock_ms!r}")
    clock = _max_clock(state["clock"], clock_ms)
    state["clock"] = clock
    dropped = []
    for key in sorted(state["windows"], key=lambda k: _window_order(state["windows"][k])):
        w = state["windows"][key]
        if w["rev"] == w["published"] and is_expired(w["window"], w["start"], clock, policy):
            dropped.append(state["windows"].pop(key))
    _prune_ids(state, policy)
    return dropped


def windows_of(state: Mapping[str, Any], size: str | None = None) -> list[dict[str, Any]]:
    """The state's windows (copies), oldest first, optionally of one size."""
    return [copy.deepcopy(w) for w in sorted(state["windows"].values(), key=_window_order)
            if size is None or w["window"] == size]


def is_idle(state: Mapping[str, Any]) -> bool:
    """No windows left (everything published and expired). The shell may keep such a state (a
    few hundred bytes: clock, refusal counts) or drop it and later seed a new one with
    ``new_state(subject, partition_clock(...))``."""
    return not state["windows"]


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------


def to_record(motebit_id: str, window: Mapping[str, Any]) -> dict[str, Any]:
    """The ``memstream.memory.AnalyticsWindow`` record of one window (every field, schema
    order): the complete aggregate of the window, so publishing it is idempotent."""
    c = window["counters"]
    return {
        "motebit_id": motebit_id,
        "window": window["window"],
        "window_start": int(window["start"]),
        "window_end": int(window["end"]),
        "formed": int(c.get("formed", 0)),
        "accessed": int(c.get("accessed", 0)),
        "deleted": int(c.get("deleted", 0)),
        "merged": int(c.get("merged", 0)),
        "superseded": int(c.get("superseded", 0)),
        "promoted": int(c.get("promoted", 0)),
        "redacted": int(c.get("redacted", 0)),
        "quarantined": int(c.get("quarantined", 0)),
        "dead_lettered": int(c.get("dead_lettered", 0)),
        "compaction_tokens_saved": int(c.get("compaction_tokens_saved", 0)),
        "graph_cost_usd": c.get(GRAPH_COST_NANOS, 0) / NANOS_PER_USD,
        "updated_at": int(window["updated_at"]),
    }


def records_due(state: Mapping[str, Any], clock_ms: int | None = None, *, final_only: bool = False,
                policy: WindowPolicy = DEFAULT_POLICY) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(snapshot, record)`` pairs of :func:`due`: send each record, then
    ``mark_published(state, [snapshot, ...])``."""
    return [(w, to_record(state["subject"], w)) for w in due(state, clock_ms, final_only=final_only, policy=policy)]


def window_identity(record: Mapping[str, Any]) -> tuple[str, str, int]:
    """What identifies a window in a record's value: ``(motebit_id, window, window_start)``
    (the de-duplication key of a consumer when the Kafka key is only ``motebit_id``)."""
    return record["motebit_id"], record["window"], int(record["window_start"])


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _max_clock(*clocks: int | None) -> int | None:
    known = [c for c in clocks if c is not None]
    return max(known) if known else None


def _window_order(w: Mapping[str, Any]) -> tuple[int, int]:
    return int(w["start"]), SIZES[w["window"]]


def _digest(id: str) -> str:
    """A short stable digest of an input id (keeps the persisted state small)."""
    return hashlib.blake2b(id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _prune_ids(state: dict[str, Any], policy: WindowPolicy) -> None:
    """Forget ids whose every window has expired (a replay of them is too late anyway), then
    keep at most ``policy.recent_ids`` (the newest by arrival)."""
    clock = state["clock"]
    ids = state["recent_ids"]
    if clock is not None:
        ids = [e for e in ids
               if not all(is_expired(size, window_bounds(e[1], size)[0], clock, policy) for size in SIZES)]
    if len(ids) > policy.recent_ids:
        ids = ids[len(ids) - policy.recent_ids:]
    state["recent_ids"] = ids
