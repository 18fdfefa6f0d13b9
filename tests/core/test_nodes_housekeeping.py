import pytest
from hypothesis import given, strategies as st

from streams.core import HousekeepingPolicy, UserMemory, as_of, decayed_confidence, event_id_for, process_candidate, process_event, sweep_memory, valid_at
from streams.core.nodes import DAY_MS, complete_node, content_fingerprint, make_node

from .factories import candidate, event


def _node(**kw):
    base = dict(node_id="n", motebit_id="u1", content="x", sensitivity="none", memory_type="semantic",
                confidence=0.8, created_at=0, valid_from=0, origin_event_id="c")
    base.update(kw)
    return make_node(**base)


@given(st.integers(-10, 10), st.one_of(st.none(), st.integers(-10, 10)), st.integers(-20, 20))
def test_valid_at_is_half_open(vf, vu, t):
    n = _node(valid_from=vf, valid_until=vu)
    assert valid_at(n, t) == (vf <= t and (vu is None or t < vu))


def test_as_of_orders_and_filters():
    a = _node(node_id="a", valid_from=0, valid_until=10)
    b = _node(node_id="b", valid_from=10)
    assert [n["node_id"] for n in as_of([b, a], 9)] == ["a"]
    assert [n["node_id"] for n in as_of([b, a], 10)] == ["b"]


def test_fingerprint_is_stable_over_formatting():
    assert content_fingerprint("User likes Tea!") == content_fingerprint("  user LIKES tea ")
    assert content_fingerprint("User likes tea") != content_fingerprint("User likes coffee")
    assert content_fingerprint("x").startswith("sha256:")


def test_complete_node_fills_defaults_and_drops_unknown_fields():
    n = complete_node({"node_id": "n", "motebit_id": "u", "content": "c", "sensitivity": "none",
                       "confidence": 0.5, "created_at": 5, "junk": 1})
    assert "junk" not in n and n["valid_from"] == 5 and n["half_life_ms"] == 30 * DAY_MS
    assert n["content_fingerprint"] == content_fingerprint("c")


def test_decay_formula():
    n = _node(confidence=0.8, half_life_ms=10 * DAY_MS, created_at=0)
    assert decayed_confidence(n, 10 * DAY_MS) == pytest.approx(0.4)
    assert decayed_confidence(n, -5) == 0.8
    accessed = {**n, "last_accessed_at": 10 * DAY_MS}
    assert decayed_confidence(accessed, 10 * DAY_MS) == pytest.approx(0.8)  # access keeps it alive


def test_sweep_decay_retention_and_pinning():
    um = UserMemory("u1")
    t0 = 1_000_000
    fresh_ = process_candidate(um, candidate("User plays the violin", timestamp=t0, sensitivity="none")).node_upserts[0]["node_id"]
    episodic = process_candidate(um, candidate("went to the dentist today", timestamp=t0, memory_type="episodic", sensitivity="none")).node_upserts[0]["node_id"]
    medical = process_candidate(um, candidate("User has asthma", timestamp=t0, sensitivity="medical", confidence=1.0)).node_upserts[0]["node_id"]
    pinned = process_candidate(um, candidate("went to the zoo yesterday", timestamp=t0, memory_type="episodic", sensitivity="financial")).node_upserts[0]["node_id"]
    process_event(um, event("memory_pinned", {"node_id": pinned, "pinned": True}, timestamp=t0 + 1))
    # after 2 days: the episodic memory (3 d half-life, 0.7) decays to 0.44 < 0.5
    out = sweep_memory(um, t0 + 2 * DAY_MS)
    assert out.node_deletions == [episodic]
    assert out.ledger[0]["event_type"] == "memory_deleted" and out.ledger[0]["payload"] == {"node_id": episodic}
    assert out.ledger[0]["event_id"] == event_id_for("u1", episodic, "memory_deleted")
    assert um.node(episodic) is None and episodic in um.deleted_node_ids
    # after 91 days: medical retention (90 d) passed, even at confidence 1.0; semantic 0.7 decayed too
    out = sweep_memory(um, t0 + 91 * DAY_MS)
    assert sorted(out.node_deletions) == sorted([fresh_, medical])
    assert pinned in um.live  # pinned: exempt from decay and retention
    assert sweep_memory(um, t0 + 1000 * DAY_MS).node_deletions == []


def test_retention_policy_is_configurable():
    um = UserMemory("u1")
    nid = process_candidate(um, candidate("User likes tea", timestamp=0, sensitivity="none", confidence=1.0)).node_upserts[0]["node_id"]
    policy = HousekeepingPolicy(prune_below=0.0, retention_ms={"none": 1})
    assert sweep_memory(um, 2, policy).node_deletions == [nid]
