"""Decay, retention, access and pinning rules (streams/core/housekeeping.py, SPEC §4.4)."""

import io
import json
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.validation import validate
from hypothesis import given, strategies as st

from streams.core import UserMemory, process_candidate, process_event
from streams.core.housekeeping import (
    REASON_DECAYED,
    REASON_RETENTION,
    HousekeepingPolicy,
    deletion_event,
    half_life_for,
    is_cold,
    prune_reason,
    select_expired,
    sweep_memory,
)
from streams.core.ids import derive_id
from streams.core.nodes import DAY_MS, decayed_confidence, make_node

from .factories import candidate, event, formed

RETENTION_DAYS = {"personal": 365, "medical": 90, "financial": 90, "secret": 30}
LEVELS = ("none", "personal", "medical", "financial", "secret")


def _node(**kw):
    base = dict(node_id="n", motebit_id="u1", content="x", sensitivity="none", memory_type="semantic",
                confidence=1.0, created_at=0, valid_from=0, origin_event_id="c")
    extra = {k: kw.pop(k) for k in ("pinned", "last_accessed_at", "access_count", "updated_at", "superseded_by") if k in kw}
    base.update(kw)
    return {**make_node(**base), **extra}


def _accessed(node, times):
    """``node`` after one ``memory_accessed`` per time, delivered in that order (the event
    processor's rule: the one the memory agent applies)."""
    um = UserMemory(node["motebit_id"])
    um.put_node(node)
    for i, t in enumerate(times):
        out = process_event(um, event("memory_accessed", {"node_id": node["node_id"]}, timestamp=t, event_id=f"acc-{i}"))
        assert out.applied
    return um.node(node["node_id"])


# ----------------------------------------------------------------------------- decay ----


def test_half_life_grows_by_half_per_reinforcement_up_to_a_year():
    assert half_life_for("semantic") == 30 * DAY_MS
    assert half_life_for("episodic") == 3 * DAY_MS
    assert half_life_for("semantic", 1) == 45 * DAY_MS
    assert half_life_for("semantic", 2) == int(67.5 * DAY_MS)
    assert half_life_for("episodic", 3) == int(int(int(3 * DAY_MS * 1.5) * 1.5) * 1.5)
    assert half_life_for("semantic", 7) == 365 * DAY_MS  # 30 · 1.5^7 ≈ 512 d → capped
    assert half_life_for("episodic", 1000) == 365 * DAY_MS


@given(st.sampled_from(["semantic", "episodic"]), st.integers(0, 60))
def test_half_life_is_monotone_and_capped(memory_type, n):
    assert half_life_for(memory_type, n) <= half_life_for(memory_type, n + 1) <= 365 * DAY_MS


def test_decay_boundary_exactly_half_survives_and_one_ms_later_is_pruned():
    hl = 30 * DAY_MS
    n = _node(confidence=1.0, half_life_ms=hl)
    assert decayed_confidence(n, hl) == 0.5  # 0.5 ** 1.0 is exact
    assert prune_reason(n, hl) is None  # "falls under 0.5": 0.5 itself stays
    assert prune_reason(n, hl + 1) == REASON_DECAYED
    # a node formed at exactly 0.5 survives its first instant
    half = _node(confidence=0.5)
    assert prune_reason(half, 0) is None and prune_reason(half, 1) == REASON_DECAYED


def test_decay_threshold_is_policy():
    n = _node(confidence=0.8, half_life_ms=10 * DAY_MS)  # 0.4 after 10 d
    assert prune_reason(n, 10 * DAY_MS) == REASON_DECAYED
    assert prune_reason(n, 10 * DAY_MS, HousekeepingPolicy(prune_below=0.4)) is None
    assert prune_reason(n, 10 * DAY_MS + 1, HousekeepingPolicy(prune_below=0.4)) == REASON_DECAYED


def test_access_keeps_a_node_from_decaying():
    n = _node(confidence=0.8, half_life_ms=10 * DAY_MS)
    accessed = _accessed(n, [10 * DAY_MS])
    assert prune_reason(accessed, 10 * DAY_MS) is None
    assert prune_reason(accessed, 20 * DAY_MS) == REASON_DECAYED


def test_closed_nodes_do_not_decay_away_but_retention_applies():
    closed = _node(confidence=0.1, valid_until=5, superseded_by="n2", sensitivity="secret")
    assert prune_reason(closed, 30 * DAY_MS) is None  # history: kept for as-of queries
    assert prune_reason(closed, 30 * DAY_MS + 1) == REASON_RETENTION


# ------------------------------------------------------------------------- retention ----


@pytest.mark.parametrize("level,days", sorted(RETENTION_DAYS.items()))
def test_retention_boundary_both_sides(level, days):
    keep = days * DAY_MS
    # accessed "now": decay is out of the picture, only age (from created_at) counts
    at = _node(sensitivity=level, created_at=1000, last_accessed_at=1000 + keep)
    assert prune_reason(at, 1000 + keep) is None  # exactly at the boundary: survives
    after = _node(sensitivity=level, created_at=1000, last_accessed_at=1000 + keep + 1)
    assert prune_reason(after, 1000 + keep + 1) == REASON_RETENTION


def test_retention_is_measured_from_created_at_not_from_the_last_change():
    n = _node(sensitivity="secret", created_at=0, updated_at=29 * DAY_MS, last_accessed_at=30 * DAY_MS + 1)
    assert prune_reason(n, 30 * DAY_MS + 1) == REASON_RETENTION


@given(st.integers(0, 50 * 365 * DAY_MS))
def test_sensitivity_none_is_never_retention_pruned(age):
    n = _node(sensitivity="none", created_at=0, last_accessed_at=age)
    assert prune_reason(n, age) is None


def test_unknown_sensitivity_gets_the_secret_retention():
    n = _node(created_at=0, last_accessed_at=31 * DAY_MS)
    n["sensitivity"] = "top-secret"
    assert prune_reason(n, 30 * DAY_MS) is None
    assert prune_reason(n, 30 * DAY_MS + 1) == REASON_RETENTION
    del n["sensitivity"]
    assert prune_reason(n, 30 * DAY_MS + 1) == REASON_RETENTION


def test_retention_table_overlays_the_defaults_and_rejects_unknown_levels():
    p = HousekeepingPolicy(retention_ms={"none": 5, "personal": None})
    assert p.retention_ms == {"none": 5, "personal": None, "medical": 90 * DAY_MS, "financial": 90 * DAY_MS, "secret": 30 * DAY_MS}
    assert prune_reason(_node(sensitivity="none", last_accessed_at=6), 6, p) == REASON_RETENTION
    assert prune_reason(_node(sensitivity="personal", last_accessed_at=10**13), 10**13, p) is None
    with pytest.raises(ValueError):
        HousekeepingPolicy(retention_ms={"classified": 1})


@given(
    st.sampled_from(LEVELS),
    st.floats(0.0, 1.0),
    st.integers(0, 100 * 365 * DAY_MS),
    st.booleans(),
    st.sampled_from(["semantic", "episodic"]),
)
def test_pinned_nodes_survive_any_age_and_any_decay(level, confidence, age, closed, memory_type):
    n = _node(sensitivity=level, confidence=confidence, memory_type=memory_type, pinned=True,
              valid_until=1 if closed else None)
    assert prune_reason(n, age) is None
    assert select_expired([n], age) == []


# ----------------------------------------------------------------------------- sweep ----


def test_sweep_over_node_records_lists_reasons_in_node_order():
    nodes = [
        _node(node_id="c", sensitivity="medical", last_accessed_at=91 * DAY_MS),  # retention
        _node(node_id="a", confidence=0.6, memory_type="episodic"),  # decays fast
        _node(node_id="b", pinned=True, sensitivity="secret", confidence=0.0),  # exempt
        _node(node_id="d", sensitivity="none", last_accessed_at=91 * DAY_MS),  # fresh
    ]
    assert select_expired(nodes, 91 * DAY_MS) == [("a", REASON_DECAYED), ("c", REASON_RETENTION)]


def _memory_with_nodes():
    um = UserMemory("u1")
    t0 = 1_000_000
    ids = []
    for text, kw in [
        ("went to the dentist today", dict(memory_type="episodic", sensitivity="none")),
        ("User has asthma", dict(sensitivity="medical", confidence=1.0)),
        ("User plays the violin", dict(sensitivity="none", confidence=1.0)),
    ]:
        ids.append(process_candidate(um, candidate(text, timestamp=t0, **kw)).node_upserts[0]["node_id"])
    return um, t0, ids


def test_sweep_memory_erases_and_emits_deterministic_deletions():
    um, t0, (episodic, medical, violin) = _memory_with_nodes()
    out = sweep_memory(um, t0 + 2 * DAY_MS)
    assert out.node_deletions == [episodic]
    assert [e["event_type"] for e in out.ledger] == ["memory_deleted"]
    assert out.ledger[0]["payload"] == {"node_id": episodic}
    assert episodic in um.deleted_node_ids and um.node(episodic) is None
    out2 = sweep_memory(um, t0 + 91 * DAY_MS)  # medical: retention; violin (1.0, 30 d) decayed to 0.12
    assert sorted(out2.node_deletions) == sorted([medical, violin])


def test_a_sweep_repeated_after_a_crash_yields_the_same_event_ids():
    """The timer re-runs at another time after a restart: ids must not depend on it."""
    um, t0, _ = _memory_with_nodes()
    first, retry = um.clone(), um.clone()
    a = sweep_memory(first, t0 + 100 * DAY_MS)
    b = sweep_memory(retry, t0 + 100 * DAY_MS + 37 * 60_000)  # next bucket of any reasonable size
    assert [e["event_id"] for e in a.ledger] == [e["event_id"] for e in b.ledger]
    assert len(a.ledger) == 3
    assert {e["event_id"] for e in a.ledger} == {derive_id("u1", n, "memory_deleted") for n in a.node_deletions}
    # and once applied, a second sweep finds nothing left to delete
    assert sweep_memory(first, t0 + 200 * DAY_MS).ledger == []


def test_a_deleted_node_is_never_re_formed_after_housekeeping():
    um, t0, (episodic, _, _) = _memory_with_nodes()
    sweep_memory(um, t0 + 2 * DAY_MS)
    again = process_candidate(um, candidate("went to the dentist today", memory_type="episodic", sensitivity="none"))
    assert again.decision.code == "deleted_content"


def test_deletion_event_matches_the_memory_event_schema():
    schema = parse_schema(json.loads((Path(__file__).resolve().parents[2] / "schemas" / "memory_event.avsc").read_text()))
    e = deletion_event("u1", "n1", 123, 7)
    assert validate(e, schema, strict=True)
    schemaless_writer(io.BytesIO(), schema, e)
    assert e["event_id"] == deletion_event("u1", "n1", 999, 8)["event_id"]
    assert e["event_id"] != deletion_event("u2", "n1", 123, 7)["event_id"]


# ---------------------------------------------------------------------------- access ----


@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=12), st.randoms())
def test_access_is_order_insensitive(times, rnd):
    n = _node()
    shuffled = list(times)
    rnd.shuffle(shuffled)
    a, b = _accessed(n, times), _accessed(n, shuffled)
    assert a == b
    assert a["last_accessed_at"] == max(times) and a["access_count"] == len(times)
    assert n["access_count"] == 0 and n["last_accessed_at"] is None  # input untouched


def test_cold_after_boundary():
    n = _node(created_at=100)
    assert not is_cold(n, 100 + 30 * DAY_MS)  # default 30 d, exactly at the boundary: live
    assert is_cold(n, 100 + 30 * DAY_MS + 1)
    warm = _accessed(n, [100 + 30 * DAY_MS])
    assert not is_cold(warm, 100 + 30 * DAY_MS + 1)
    assert is_cold(warm, 200 + 30 * DAY_MS, cold_after_ms=50)


# ---------------------------------------------------------------------------- pinning ----

pins = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()),
    min_size=1, max_size=10, unique_by=lambda p: (p[0], p[1]),
)


def _pin(pinned, ts, vc):
    return event("memory_pinned", {"node_id": "n1", "pinned": pinned}, timestamp=ts, version_clock=vc, event_id=f"e{ts}-{vc}")


@given(pins, st.randoms(), st.integers(0, 10))
def test_latest_pin_wins_regardless_of_arrival_order(pin_list, rnd, form_at):
    """Pins arrive shuffled; the node may form in the middle of them (a pin overtaking its
    node is kept and applied). The end state is the pinned value of the greatest
    (timestamp, version_clock)."""
    arrivals = list(pin_list)
    rnd.shuffle(arrivals)
    um = UserMemory("u1")
    for i, (ts, vc, pinned) in enumerate(arrivals):
        if i == form_at:
            process_event(um, formed("n1", "User likes tea"))
        process_event(um, _pin(pinned, ts, vc))
    if um.node("n1") is None:
        process_event(um, formed("n1", "User likes tea"))
    top = max(pin_list, key=lambda p: (p[0], p[1]))
    assert um.node("n1")["pinned"] is top[2]
    assert um.pins["n1"] == (top[0], top[1], f"e{top[0]}-{top[1]}", top[2])


def test_a_pin_keeps_its_ordering_key_and_older_pins_lose():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User likes tea", timestamp=10, version_clock=0))
    before = um.node("n1")
    out = process_event(um, _pin(True, 200, 1))
    assert out.node_upserts[0]["pinned"] is True and um.pins["n1"] == (200, 1, "e200-1", True)
    out = process_event(um, _pin(False, 100, 9))  # older timestamp: loses
    assert not out.node_upserts and um.node("n1")["pinned"] is True and um.pins["n1"] == (200, 1, "e200-1", True)
    out = process_event(um, _pin(False, 200, 2))  # same ts, higher clock: wins
    assert out.node_upserts[0]["pinned"] is False and um.pins["n1"] == (200, 2, "e200-2", False)
    assert before["pinned"] is False and before is not um.node("n1")  # never in place


def test_pinning_a_deleted_node_is_a_no_op():
    um = UserMemory("u1")
    process_event(um, formed("n1", "User likes tea"))
    process_event(um, _pin(False, 5, 0))  # a pin kept for the node ...
    process_event(um, event("memory_deleted", {"node_id": "n1"}))  # ... goes with it
    assert "n1" not in um.pins
    out = process_event(um, event("memory_pinned", {"node_id": "n1", "pinned": True}))
    assert out.applied and not out.node_upserts and "n1" not in um.pins and um.node("n1") is None
    # also for a node id deleted before it ever formed
    process_event(um, event("memory_deleted", {"node_id": "n2"}))
    out = process_event(um, event("memory_pinned", {"node_id": "n2", "pinned": True}))
    assert not out.node_upserts and "n2" not in um.pins
