"""The relay view for sync peers (streams/core/redaction.py, SPEC §2, §4.4, §4.6)."""

import json
from pathlib import Path

import pytest
from fastavro import parse_schema
from fastavro.validation import validate
from hypothesis import given, settings, strategies as st

from streams.core import UserMemory, process_event
from streams.core.nodes import content_fingerprint
from streams.core.redaction import (
    passes,
    relay_events,
    threshold_for,
    tombstone_for,
)

from .factories import event, formed

LEVELS = ["none", "personal", "medical", "financial", "secret"]  # the spec's order, restated
RANK = {lvl: i for i, lvl in enumerate(LEVELS)}
SCHEMA = parse_schema(json.loads((Path(__file__).resolve().parents[2] / "schemas" / "memory_event.avsc").read_text()))


def _formed(node_id="n1", content="User likes tea", sensitivity="personal", **payload):
    return formed(node_id, content, sensitivity=sensitivity, payload_extra=payload)


# --------------------------------------------------------------------------- thresholds ----


def test_default_threshold_passes_none_and_personal_only():
    for lvl in LEVELS:
        [out] = relay_events(_formed(content=f"c-{lvl}", sensitivity=lvl))
        if lvl in ("none", "personal"):
            assert out["payload"]["content"] == f"c-{lvl}" and out["payload"]["redacted"] is None
        else:
            assert out["payload"] == {
                "node_id": "n1", "content": "[REDACTED]", "sensitivity": lvl, "source": None, "redacted": True,
                "redacted_sensitivity": lvl, "redacted_reason": None, "valid_from": None, "valid_until": None,
            }


@pytest.mark.parametrize("threshold", LEVELS)
@pytest.mark.parametrize("level", LEVELS)
def test_content_passes_iff_not_above_threshold(threshold, level):
    [out] = relay_events(_formed(content="payload text", sensitivity=level), threshold)
    assert (out["payload"]["content"] == "payload text") == (RANK[level] <= RANK[threshold])
    assert passes(level, threshold) == (RANK[level] <= RANK[threshold])


@pytest.mark.parametrize("bad", [None, "", "SECRET", "classified", 3])
def test_missing_or_unknown_sensitivity_never_passes_content(bad):
    ev = _formed(content="my blood type is 0-")
    ev["payload"]["sensitivity"] = bad
    [out] = relay_events(ev, "secret")  # even under the most permissive threshold
    assert out["payload"]["content"] == "[REDACTED]" and out["payload"]["redacted"] is True
    assert out["payload"]["sensitivity"] == "secret" and validate(out, SCHEMA, strict=True)
    del ev["payload"]["sensitivity"]
    assert relay_events(ev, "secret")[0]["payload"]["content"] == "[REDACTED]"
    assert not passes(bad, "secret")


def test_threshold_for_overrides_and_fails_closed():
    overrides = {"alice": "medical", "bob": "bogus", "carol": None}
    assert threshold_for("alice", overrides) == "medical"
    assert threshold_for("dave", overrides) == "personal"
    assert threshold_for("dave", overrides, "financial") == "financial"
    assert threshold_for("bob", overrides) == "none"  # an invalid override never widens
    assert threshold_for("carol", overrides) == "none"
    assert threshold_for("dave", None, "nonsense") == "none"
    assert threshold_for("alice", {"alice": "secret"}) == "secret"
    assert threshold_for("alice", {}) == "personal"  # no override (or a removed one): the default


def test_invalid_threshold_argument_reads_as_none():
    assert relay_events(_formed(sensitivity="personal"), "everything")[0]["payload"]["content"] == "[REDACTED]"
    assert relay_events(_formed(sensitivity="none"), "everything")[0]["payload"]["content"] == "User likes tea"


# ---------------------------------------------------------------------------- deletion ----


def test_deletion_forwards_the_deletion_and_a_tombstone():
    ev = event("memory_deleted", {"node_id": "n1"}, event_id="del-1", timestamp=500, version_clock=9)
    deletion, tomb = relay_events(ev)
    assert deletion == {**ev, "payload": {"node_id": "n1"}}
    assert tomb["event_type"] == "memory_formed" and tomb["timestamp"] == 500 and tomb["version_clock"] == 9
    assert tomb["payload"]["content"] == "[REDACTED]" and tomb["payload"]["redacted"] is True
    assert tomb["payload"]["redacted_reason"] == "deleted" and tomb["payload"]["node_id"] == "n1"
    # deterministic id: same for a replay, different per node and per user
    assert tomb["event_id"] == tombstone_for("n1", "u1", {**ev, "timestamp": 999})["event_id"]
    assert tomb["event_id"] != tombstone_for("n2", "u1", ev)["event_id"] != tombstone_for("n1", "u2", ev)["event_id"]
    assert validate(deletion, SCHEMA, strict=True) and validate(tomb, SCHEMA, strict=True)


def test_a_receiving_core_erases_on_the_tombstone_and_never_reforms():
    um = UserMemory("u1")
    process_event(um, _formed(content="User's PIN is 1234"))
    _, tomb = relay_events(event("memory_deleted", {"node_id": "n1"}))
    out = process_event(um, tomb)
    assert out.applied and out.node_deletions == ["n1"] and um.node("n1") is None


def test_formed_of_an_already_deleted_node_carries_no_content():
    ev = _formed(content="User lives at 1 Main St", sensitivity="none")
    [out] = relay_events(ev, "secret", {"n1"})
    assert out["payload"]["content"] == "[REDACTED]" and out["payload"]["redacted_reason"] == "deleted"
    assert out["event_id"] == tombstone_for("n1", "u1", ev)["event_id"]  # peers de-duplicate it
    [by_fp] = relay_events(_formed(node_id="n7", content="user lives at 1 main st!", sensitivity="none"), "secret",
                           deleted_fingerprints={content_fingerprint("User lives at 1 Main St")})
    assert by_fp["payload"]["content"] == "[REDACTED]" and by_fp["payload"]["redacted_reason"] == "deleted"


def test_an_incoming_tombstone_is_forwarded_without_whatever_content_it_holds():
    ev = _formed(content="leaked text", sensitivity="none", redacted=True, redacted_reason="deleted")
    [out] = relay_events(ev, "secret")
    assert out["payload"]["content"] == "[REDACTED]" and out["payload"]["redacted_reason"] == "deleted"
    um = UserMemory("u1")  # and the user's state (whose deleted ids the relay reads) remembers the id
    process_event(um, ev)
    assert um.deleted_node_ids == {"n1"}


def test_an_already_redacted_copy_stays_redacted():
    ev = _formed(content="not really redacted", sensitivity="none", redacted=True, redacted_sensitivity="medical")
    [out] = relay_events(ev, "secret")
    assert out["payload"]["content"] == "[REDACTED]" and out["payload"]["redacted_sensitivity"] == "medical"


# ---------------------------------------------------------------------- other event types ----


def test_free_text_reasons_are_blanked_and_audits_dropped():
    c = event("memory_consolidated", {"action": "merge", "existing_node_id": "n1", "new_node_id": None,
                                       "reason": "same as 'User has HIV'", "superseded_valid_until": None})
    p = event("memory_promoted", {"node_id": "n1", "from_confidence": 0.9, "to_confidence": 1.0,
                                   "reinforcement_count": 3, "reason": "User has HIV, said 3 times"})
    a = event("memory_audit", {"missed_patterns": ['personal_fact: "I have HIV"'], "turn_message": "I have HIV"})
    [relayed_c], [relayed_p] = relay_events(c), relay_events(p)
    assert relayed_c["payload"]["reason"] == "" and relayed_c["payload"]["action"] == "merge"
    assert relayed_p["payload"] == {"node_id": "n1", "from_confidence": 0.9, "to_confidence": 1.0,
                                    "reinforcement_count": 3, "reason": ""}
    assert relay_events(a, "secret") == []
    assert c["payload"]["reason"] and p["payload"]["reason"]  # inputs untouched


def test_ids_only_events_pass_and_unknown_types_and_local_only_are_dropped():
    for et, payload in [("memory_accessed", {"node_id": "n1"}), ("memory_pinned", {"node_id": "n1", "pinned": True}),
                        ("memory_decayed", {})]:
        ev = event(et, {**payload, "smuggled": "User has HIV"})
        [out] = relay_events(ev)
        assert out["payload"] == payload and out["event_type"] == et and validate(out, SCHEMA, strict=True)
    assert relay_events(event("memory_exploded", {"node_id": "n1"})) == []
    assert relay_events(event("memory_accessed", {"node_id": "n1"}), local_only={"memory_accessed"}) == []
    audit = event("memory_audit", {"missed_patterns": [], "turn_message": "I have HIV"})
    assert relay_events(audit, "secret", local_only={"memory_accessed"}) == []  # audits are local-only whatever the set


def test_extra_payload_and_envelope_keys_never_reach_the_relay():
    ev = _formed(sensitivity="medical")
    ev["payload"]["original_content"] = "User has asthma"
    ev["debug"] = "User has asthma"
    [out] = relay_events(ev)
    assert "User has asthma" not in json.dumps(out) and set(out) == {
        "event_id", "motebit_id", "device_id", "timestamp", "version_clock", "event_type", "payload"}


# ------------------------------------------------------------------ the property: streams ----

USERS = ["u1", "u2", "u3"]
SENS = st.sampled_from(LEVELS + [None, "bogus"])


@st.composite
def streams(draw):
    overrides = draw(st.dictionaries(st.sampled_from(USERS), st.sampled_from(LEVELS + ["bogus"]), max_size=3))
    default = draw(st.sampled_from(LEVELS))
    n = draw(st.integers(1, 60))
    evs = []
    for i in range(n):
        user = draw(st.sampled_from(USERS))
        node = f"n{draw(st.integers(0, 5))}"
        kind = draw(st.sampled_from(["formed", "formed", "formed", "deleted", "audit", "consolidated",
                                     "promoted", "accessed", "pinned", "decayed", "tombstone"]))
        marker = f"CONTENT<{user}/{node}/{i}>"  # unique per formed event
        base = dict(motebit_id=user, event_id=f"e{i}", timestamp=i, version_clock=i)
        if kind == "formed":
            payload = {"node_id": node, "content": marker, "sensitivity": draw(SENS)}
            if draw(st.booleans()):
                payload["redacted"] = draw(st.sampled_from([True, None, False]))
            if draw(st.integers(0, 5)) == 0:
                payload["redacted_reason"] = draw(st.sampled_from(["deleted", "other", None]))
            evs.append(event("memory_formed", payload, **base))
        elif kind == "tombstone":
            evs.append(event("memory_formed", {"node_id": node, "content": marker, "sensitivity": draw(SENS),
                                               "redacted": True, "redacted_reason": "deleted"}, **base))
        elif kind == "deleted":
            evs.append(event("memory_deleted", {"node_id": node}, **base))
        elif kind == "audit":
            evs.append(event("memory_audit", {"missed_patterns": [f'goal: "{marker}"'], "turn_message": marker}, **base))
        elif kind == "consolidated":
            evs.append(event("memory_consolidated", {"action": "merge", "existing_node_id": node, "new_node_id": None,
                                                      "reason": f"matches {marker}", "superseded_valid_until": None}, **base))
        elif kind == "promoted":
            evs.append(event("memory_promoted", {"node_id": node, "from_confidence": 0.9, "to_confidence": 1.0,
                                                  "reinforcement_count": 3, "reason": marker}, **base))
        elif kind == "accessed":
            evs.append(event("memory_accessed", {"node_id": node}, **base))
        elif kind == "pinned":
            evs.append(event("memory_pinned", {"node_id": node, "pinned": draw(st.booleans())}, **base))
        else:
            evs.append(event("memory_decayed", {}, **base))
    return overrides, default, evs


@settings(max_examples=300, deadline=None)
@given(streams())
def test_relay_never_leaks_content_above_threshold_of_deleted_nodes_or_audits(stream):
    overrides, default, evs = stream
    states = {u: UserMemory(u) for u in USERS}  # whose deleted ids the memory agent relays with
    deleted = {u: set() for u in USERS}
    for ev in evs:
        user, p = ev["motebit_id"], ev["payload"]
        threshold = overrides.get(user, default)
        threshold = threshold if threshold in RANK else "none"
        node_deleted = p.get("node_id") in deleted[user]
        outs = relay_events(ev, threshold_for(user, overrides, default), deleted[user])
        # the one event whose content may appear: a formed event of a live node, known
        # sensitivity not above the user's threshold, not marked redacted / tombstone
        may_carry = (
            ev["event_type"] == "memory_formed"
            and not node_deleted
            and p.get("sensitivity") in RANK
            and RANK[p["sensitivity"]] <= RANK[threshold]
            and not p.get("redacted")
            and p.get("redacted_reason") != "deleted"
        )
        for out in outs:
            blob = json.dumps(out)
            assert out["event_type"] != "memory_audit"
            assert "CONTENT<" not in blob or (may_carry and out["payload"]["content"] == p["content"]), (ev, out)
            assert out["motebit_id"] == user
            if out["payload"].get("redacted_reason") == "deleted":
                assert out["payload"]["content"] == "[REDACTED]" and out["payload"]["redacted"] is True
            if out["event_type"] == "memory_formed" and out["payload"]["content"] != "[REDACTED]":
                assert out["payload"]["sensitivity"] in RANK and RANK[out["payload"]["sensitivity"]] <= RANK[threshold]
                assert out["payload"]["node_id"] not in deleted[user]
            assert validate(out, SCHEMA, strict=True)
        if ev["event_type"] == "memory_audit":
            assert outs == []
        if ev["event_type"] == "memory_deleted":
            assert [o["event_type"] for o in outs] == ["memory_deleted", "memory_formed"]
        if ev["event_type"] == "memory_formed" and node_deleted:
            assert outs[0]["payload"]["redacted_reason"] == "deleted"
        process_event(states[user], ev)
        deleted[user] = set(states[user].deleted_node_ids)
