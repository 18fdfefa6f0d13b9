import json
import os
import random
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st

from streams.core import IndexConfig, UserMemory, process_candidate, process_event, sweep_memory
from streams.core.state import SideChanges

from .factories import candidate, event, one_word_edit, sentence

ROOT = Path(__file__).resolve().parents[2]


def _stream(seed: int, n: int):
    """A mixed, realistic stream: candidates (new, paraphrased, contradicting, secret,
    instruction-form, superseding), and agent events (formed, accessed, pinned, deleted,
    consolidated, promoted) referring to nodes the stream created."""
    rnd = random.Random(seed)
    texts: list[str] = []
    ops = []
    t = 1_700_000_000_000
    for i in range(n):
        t += rnd.randint(0, 5_000)
        r = rnd.random()
        if r < 0.55 or not texts:
            if texts and rnd.random() < 0.5:
                text = rnd.choice(texts)
                text = text if rnd.random() < 0.5 else one_word_edit(rnd, text)
            else:
                text = sentence(rnd)
            texts.append(text)
            kw = {
                "candidate_id": f"c{i}", "timestamp": t,
                "memory_type": rnd.choice(["semantic", "semantic", "episodic"]),
                "sensitivity": rnd.choice(["none", "personal", "medical", "financial", "secret"]),
                "source": rnd.choice(["user_stated", "agent_inferred", None, "weird"]),
            }
            if rnd.random() < 0.1:
                kw["extra"] = [rnd.choice(["pinned: true", "triggers: a, b", "pinned: nope", "last-confirmed: 2024-02-02"])]
            if rnd.random() < 0.3:
                kw["embedding"] = [rnd.gauss(0, 1) for _ in range(4)]
            if rnd.random() < 0.05:
                kw["supersedes"] = f"formed-{rnd.randrange(max(1, i))}"
            if rnd.random() < 0.2:
                kw["confidence"] = round(rnd.random(), 3)
            ops.append(("candidate", candidate(text, **kw)))
        else:
            kind = rnd.choice(["formed", "accessed", "pinned", "deleted", "consolidated", "promoted"])
            nid = f"formed-{rnd.randrange(max(1, i))}"
            ts = t - rnd.randint(0, 20_000)  # some are late
            common = {"timestamp": ts, "version_clock": rnd.randint(0, 50), "event_id": f"e{i}"}
            if kind == "formed":
                text = rnd.choice(texts) if rnd.random() < 0.3 else sentence(rnd)
                ops.append(("event", event("memory_formed", {"node_id": f"formed-{i}", "content": text, "sensitivity": "personal"}, **common)))
            elif kind == "accessed":
                ops.append(("event", event("memory_accessed", {"node_id": nid}, **common)))
            elif kind == "pinned":
                ops.append(("event", event("memory_pinned", {"node_id": nid, "pinned": rnd.random() < 0.5}, **common)))
            elif kind == "deleted":
                ops.append(("event", event("memory_deleted", {"node_id": nid}, **common)))
            elif kind == "consolidated":
                ops.append(("event", event("memory_consolidated", {"action": rnd.choice(["update", "add", "noop"]), "existing_node_id": nid, "new_node_id": None, "reason": "agent"}, **common)))
            else:
                ops.append(("event", event("memory_promoted", {"node_id": nid, "from_confidence": 0.5, "to_confidence": 0.9, "reinforcement_count": 3, "reason": "agent"}, **common)))
        if rnd.random() < 0.1 and ops:
            ops.append(ops[rnd.randrange(len(ops))])  # a re-delivery
    return ops, t


def _run(um, ops):
    outs = []
    for kind, rec in ops:
        outs.append(process_candidate(um, rec) if kind == "candidate" else process_event(um, rec))
    return outs


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 80), st.booleans())
def test_same_input_same_state_same_outcome(seed, n, force_lsh):
    cfg = IndexConfig(exact_scan_below=0) if force_lsh else IndexConfig()
    ops, _ = _stream(seed, n)
    a, b = UserMemory("u1", index_config=cfg), UserMemory("u1", index_config=cfg)
    assert _run(a, ops) == _run(b, ops)
    assert list(a.nodes()) == list(b.nodes()) and a.aux_record() == b.aux_record()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.integers(2, 80), st.data())
def test_restart_from_durable_state_converges(seed, n, data):
    """A worker that rebuilds UserMemory from node records + aux record mid-stream (a
    restart / rebalance) produces exactly the outcomes of the one that never stopped, and
    replaying the input after the cut (at-least-once re-delivery) changes nothing."""
    cfg = IndexConfig(exact_scan_below=0)
    ops, end = _stream(seed, n)
    cut = data.draw(st.integers(0, len(ops)))
    steady = UserMemory("u1", index_config=cfg)
    _run(steady, ops[:cut])
    restarted = UserMemory.from_nodes("u1", list(steady.clone().nodes())[::-1], steady.aux_record(), index_config=cfg)
    assert _run(restarted, ops[cut:]) == _run(steady, ops[cut:])
    assert list(restarted.nodes()) == list(steady.nodes())
    # re-delivery of everything already applied: all duplicates, state unchanged
    snapshot = (list(steady.nodes()), steady.aux_record()["deleted_fingerprints"])
    redelivered = _run(steady, ops[max(0, cut - 5):])
    assert all(o.duplicate or o.dead_letters for o in redelivered)
    assert (list(steady.nodes()), steady.aux_record()["deleted_fingerprints"]) == snapshot
    # housekeeping is deterministic too
    s1, s2 = steady.clone(), steady.clone()
    assert sweep_memory(s1, end + 40 * 86_400_000) == sweep_memory(s2, end + 40 * 86_400_000)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 60), st.data())
def test_the_reported_changes_rebuild_the_state_from_a_compact_aux_record(seed, n, data):
    """What the state reports after each batch — node upserts and deletions, the sealed and
    dropped de-duplication chunks (`seen_changes`), the deleted ids, fingerprints and pins
    (`side_changes`) — kept apart from the compact aux record, rebuild the same state,
    whatever the batches. (How the shell stores them, and completes a partly written batch, is
    tested with the shell: tests/test_user_cache.py.)"""
    cfg = IndexConfig(exact_scan_below=0)
    ops, _ = _stream(seed, n)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ops)), max_size=4)))
    um = UserMemory("u1", index_config=cfg, dedup_max_ids=data.draw(st.integers(5, 50)))
    nodes: dict = {}
    chunks: dict = {}
    deleted_ids: set = set()
    deleted_fps: set = set()
    pins: dict = {}
    for start, stop in zip([0, *cuts], [*cuts, len(ops)]):
        for out in _run(um, ops[start:stop]):
            nodes.update({node["node_id"]: node for node in out.node_upserts})
            for node_id in out.node_deletions:
                nodes.pop(node_id, None)
        sealed, dropped = um.seen_changes()
        chunks.update(sealed)
        for k in dropped:
            chunks.pop(k, None)
        side = um.side_changes()
        deleted_ids.update(side.deleted_node_ids)
        deleted_fps.update(side.deleted_fingerprints)
        for node_id, pin in side.pins.items():
            if pin is None:
                pins.pop(node_id, None)
            else:
                pins[node_id] = list(pin)  # as stored (JSON)
    rebuilt = UserMemory.from_nodes("u1", nodes.values(), um.aux_record(compact=True), index_config=cfg,
                                    seen_chunks=chunks, deleted_node_ids=deleted_ids, deleted_fingerprints=deleted_fps,
                                    pins=pins, dedup_max_ids=um.seen.max_ids)
    assert list(rebuilt.nodes()) == list(um.nodes())
    assert rebuilt.aux_record() == um.aux_record()
    assert um.aux_record(compact=True).keys().isdisjoint({"deleted_node_ids", "deleted_fingerprints", "pins"})


_SCRIPT = """
import hashlib, json, sys
sys.path.insert(0, {root!r})
from tests.core.test_determinism import _stream, _run
from streams.core import IndexConfig, UserMemory
ops, _ = _stream(12345, 400)
um = UserMemory("u1", index_config=IndexConfig(exact_scan_below=0))
outs = _run(um, ops)
blob = json.dumps([[o.ledger, o.node_upserts, o.node_deletions, o.quarantined, [r.code for r in o.rejections], o.duplicate,
                    o.decision.action if o.decision else None] for o in outs], sort_keys=True)
print(hashlib.sha256(blob.encode()).hexdigest())
"""


def test_outcomes_do_not_depend_on_hash_randomization():
    """Set iteration order changes with PYTHONHASHSEED; decisions and ids must not."""
    digests = set()
    for hs in ("1", "2", "987"):
        env = {**os.environ, "PYTHONHASHSEED": hs}
        r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], env=env, capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        digests.add(r.stdout.strip())
    assert len(digests) == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 80))
def test_the_stored_aux_record_does_not_grow_with_deletions_or_pins(seed, n):
    """Deleted ids and fingerprints and pins are side rows: the compact aux record the shell
    stores stays the same size however many nodes a user deletes or pins."""
    um = UserMemory("u1", dedup_max_ids=10)
    _run(um, _stream(seed, n)[0])
    base = len(json.dumps(um.aux_record(compact=True)))
    for i in range(200):
        um.erase_node(f"gone-{i}")
        um.forget_content(f"{i:064x}")
        um.set_pin(f"pinned-{i}", (i, i, f"e{i}", True))
    assert len(json.dumps(um.aux_record(compact=True))) <= base + 40  # the clock and stats only
    side = um.side_changes()
    assert {f"gone-{i}" for i in range(200)} <= set(side.deleted_node_ids)
    assert {f"{i:064x}" for i in range(200)} <= set(side.deleted_fingerprints)
    assert {f"pinned-{i}" for i in range(200)} <= set(side.pins) and side.pins["pinned-7"] == (7, 7, "e7", True)
    assert not um.side_changes()  # reported once


def test_an_aux_record_of_the_earlier_layout_reports_its_entries_to_keep_apart():
    """State written by the version that kept deleted ids, fingerprints and pins in the aux
    record is read as is; the next `side_changes` reports them, so the next write keeps them
    apart from the aux record."""
    legacy = {"motebit_id": "u1", "deleted_node_ids": ["n1"], "deleted_fingerprints": ["f" * 64],
              "pins": {"n2": [5, 1, "e", True]}, "seen": {"tail": [], "first": 0}, "clock": 3,
              "last_event_key": None, "stats": {"late": 0}}
    um = UserMemory.from_nodes("u1", [], legacy)
    assert um.deleted_node_ids == {"n1"} and um.is_deleted_content("f" * 64) and um.pins["n2"][3] is True
    side = um.side_changes()
    assert side == SideChanges(["n1"], ["f" * 64], {"n2": (5, 1, "e", True)})
    again = UserMemory.from_nodes("u1", [], um.aux_record(compact=True), deleted_node_ids=side.deleted_node_ids,
                                  deleted_fingerprints=side.deleted_fingerprints, pins=side.pins)
    assert again.aux_record() == um.aux_record()
