"""The compaction lifecycle held against the reference implementation (issue 15, "Behaviour to
align"): deepseek-harness, packages/compaction (invariant, checkpoint, estimator) and the
dsh-session surface helpers. Each test names the reference file and test it mirrors; the
behaviour is re-derived here, not copied."""

import copy
import json

import pytest

from streams.sessions.lifecycle import END_SEED, RULES, replay, step
from streams.sessions.tokens import price_message, text_block

from .test_session_lifecycle import Log, full_compaction, rules

INVARIANT_SPEC = "deepseek-harness packages/compaction/compaction/tests/invariant.spec.ts"


def end_seed(log):
    return log.ev(END_SEED, {"json": json.dumps({})})


def compaction(state, cid):
    return next(c for c in state["record"]["compactions"] if c["compactionId"] == cid)


def turn_one():
    """A log with turn 1 open and three messages in it."""
    log = Log()
    log.turn_start(1)
    return log, log.conversation(3, turn=1)


def summarized(count=100):
    """Turn 1 with three messages, compaction c1 started and its summary armed."""
    log, seqs = turn_one()
    log.start("c1", turn=1)
    log.summary("c1", seqs, count=count)
    return log, seqs


# ----------------------------------------------------------------------------------------------
# session/end-seed releases an inherited orphan


def test_end_seed_releases_a_standalone_orphan_and_a_new_start_is_valid():
    # INVARIANT_SPEC: "clears an inherited open compaction trace at end-seed during replay"
    log = Log()
    log.start("stale", turn=None)
    end_seed(log)
    log.start("next", turn=None)
    log.end("next", turn=None, error="new attempt failed")
    state, vs = log.run()
    assert vs == []
    stale = compaction(state, "stale")
    assert stale["status"] == "failed" and stale["error"].startswith("orphaned:")
    assert state["record"]["errorCount"] == 1  # the orphan's release is not an error end
    assert state["record"]["openCompactionId"] is None


def test_after_end_seed_the_stale_id_can_be_neither_summarized_nor_ended():
    log, seqs = turn_one()
    log.start("stale", turn=1)
    end_seed(log)
    full_compaction(log, "fresh", seqs, turn=1)  # a new start in the same turn: valid
    log.summary("stale", seqs)
    log.replace(seqs, turn=1)
    log.end("stale", turn=1)
    state, vs = log.run()
    assert rules(vs) == ["lock.end_not_open", "summary.not_open"]
    assert compaction(state, "fresh")["status"] == "succeeded"
    assert compaction(state, "stale")["status"] == "failed"


def test_repair_turn_end_after_end_seed_of_a_numbered_orphan():
    # INVARIANT_SPEC: "allows repair turn boundaries after end-seed clears a seeded numbered orphan"
    log = Log()
    log.turn_start(1)
    log.start("stale", turn=1)
    end_seed(log)
    log.turn_end(1)
    _, vs = log.run()
    assert vs == []


@pytest.mark.parametrize("owner", [None, 1])
def test_repair_boundary_inside_an_orphan_is_reported_live_then_retracted_at_end_seed(owner):
    # INVARIANT_SPEC: "accepts inherited repair boundaries before the end-seed that clears a
    # standalone orphan" (and the numbered twin: crash repair closes the turn of a dead writer).
    # Live, the reference refuses the boundary (validateTurnBoundary); on replay it skips it once a
    # later end-seed proves the bracket stale (inheritedOrphanStartSeqs). A stream consumer cannot
    # wait for a maybe: memstream reports at the boundary and retracts on the ledger at the end-seed.
    log = Log()
    if owner is None:
        log.start("stale", turn=None)
        crossing = log.turn_start(1)
        log.turn_end(1)  # the same bracket: not reported again
        rule = "turn.crosses_standalone"
    else:
        log.turn_start(1)
        log.start("stale", turn=1)
        crossing = log.turn_end(1)
        rule = "turn.enclosure"
    state, vs = log.run()
    assert [(v.rule, v.seq) for v in vs] == [(rule, crossing)]
    assert compaction(state, "stale")["crossing"] == {"seq": crossing, "rule": rule, "retracted": False}
    seed = end_seed(log)
    log.turn_start(2)
    log.turn_end(2)
    state, vs_after = replay(log.events[len(log.events) - 3:], state)
    assert vs_after == []  # the end-seed and the next turn add nothing
    stale = compaction(state, "stale")
    assert stale["crossing"] == {"seq": crossing, "rule": rule, "retracted": True}
    assert stale["status"] == "failed"
    assert f"released by {END_SEED} at seq {seed}" in stale["error"]
    assert f"seq {crossing}" in stale["error"] and f"{rule} report is retracted" in stale["error"]
    assert state["record"]["violationCount"] == 1  # it was dead-lettered: the count keeps it
    assert state["record"]["errorCount"] == 0


def test_end_seed_with_nothing_open_changes_nothing_but_lastseq():
    log = Log()
    log.turn_start(1)
    before, _ = replay(log.events)
    end_seed(log)
    after, vs = log.run()
    assert vs == []
    assert after["record"] == {**before["record"], "lastSeq": before["record"]["lastSeq"] + 1}


# ----------------------------------------------------------------------------------------------
# a standalone compaction sits between turns


def crossing_of(vs):
    return [(v.rule, v.seq, v.event_type) for v in vs]


@pytest.mark.parametrize("boundary", ["start", "end"])
@pytest.mark.parametrize("closes", [True, False])
def test_turn_boundary_inside_a_live_standalone_bracket_is_reported_at_the_boundary(boundary, closes):
    # INVARIANT_SPEC: "rejects turn boundaries that cross live standalone or numbered compaction
    # brackets" (/turn\/start cannot cross an open standalone compaction/): refused at the boundary,
    # whether or not the bracket ever closes
    log = Log()
    if boundary == "end":
        log.turn_start(1)
        log.turn_end(1)
    log.start("c1", turn=None)
    crossing = log.turn_start(2) if boundary == "start" else log.turn_end(1)
    before, vs = log.run()
    assert crossing_of(vs) == [("turn.crosses_standalone", crossing, f"turn/{boundary}")]
    assert ("turn/start of turn 2" if boundary == "start" else "turn/end") in vs[0].message
    assert compaction(before, "c1")["crossing"] == {"seq": crossing, "rule": "turn.crosses_standalone", "retracted": False}
    if closes:
        log.end("c1", turn=None, error="cancelled")
        after, more = replay(log.events[-1:], before)
        assert more == []  # the close adds nothing: the crossing was reported when it happened
        assert compaction(after, "c1")["crossing"]["retracted"] is False


def test_a_bracket_that_never_closes_is_reported_by_the_step_of_its_boundary():
    # the stuck lock: an operator learns of it at the first turn that crosses it
    log = Log()
    log.turn_start(1)
    log.start("stuck", turn=1)
    state, _ = log.run()
    crossing = log.turn_end(1)
    state, vs = step(state, log.events[-1])
    assert crossing_of(vs) == [("turn.enclosure", crossing, "turn/end")]
    assert "crossed compaction 'stuck' of turn 1" in vs[0].message
    assert state["record"]["openCompactionId"] == "stuck"
    for n in (2, 3):  # later turns inside the same bracket: once per bracket
        log.turn_start(n)
        log.turn_end(n)
    state, vs = replay(log.events[-4:], state)
    assert vs == [] and state["record"]["violationCount"] == 1


def test_turn_after_a_closed_standalone_bracket_is_fine():
    # INVARIANT_SPEC: same test, second half: once the bracket is closed a turn may start
    log = Log()
    log.start("c1", turn=None)
    log.end("c1", turn=None, error="cancelled")
    log.turn_start(1)
    log.turn_end(1)
    state, vs = log.run()
    assert vs == []
    assert compaction(state, "c1")["crossing"] is None


@pytest.mark.parametrize("then_end_seed", [False, True])
def test_closed_standalone_bracket_containing_a_turn_is_a_violation(then_end_seed):
    # INVARIANT_SPEC: "rejects a closed standalone bracket that contains a turn before end-seed"
    # (an end-seed after the bracket closed does not excuse it: the bracket was not an orphan)
    log = Log()
    log.start("c1", turn=None)
    crossing = log.turn_start(1)
    log.turn_end(1)
    log.end("c1", turn=None, error="failed after crossing turn")
    if then_end_seed:
        end_seed(log)
    state, vs = log.run()
    assert crossing_of(vs) == [("turn.crosses_standalone", crossing, "turn/start")]
    assert compaction(state, "c1")["crossing"]["retracted"] is False


@pytest.mark.parametrize("closes", [True, False])
def test_numbered_bracket_crossed_by_its_turn_end_is_reported_at_the_turn_end(closes):
    # INVARIANT_SPEC: "rejects turn boundaries that cross live standalone or numbered compaction
    # brackets" (/turn\/end cannot cross an open compaction for turn 1/)
    log = Log()
    log.turn_start(1)
    log.start("c1", turn=1)
    crossing = log.turn_end(1)
    if closes:
        log.end("c1", turn=1, error="cancelled")
        log.turn_end(1)  # INVARIANT_SPEC, same test: after the close the turn may end
    _, vs = log.run()
    assert crossing_of(vs) == [("turn.enclosure", crossing, "turn/end")]


def test_restarting_the_owning_turn_crosses_its_numbered_bracket():
    # invariant.ts validateTurnBoundary: any turn/start or turn/end while a compaction is open
    # fails, the owner's own turn number included
    log = Log()
    log.turn_start(1)
    log.start("c1", turn=1)
    crossing = log.turn_start(1)
    _, vs = log.run()
    assert crossing_of(vs) == [("turn.enclosure", crossing, "turn/start")]


def test_crossing_of_an_abandoned_standalone_bracket_is_reported_before_the_second_start():
    log = Log()
    log.start("c1", turn=None)
    crossing = log.turn_start(1)
    second = log.start("c2", turn=1)
    _, vs = log.run()
    assert [(v.rule, v.seq) for v in vs] == [("turn.crosses_standalone", crossing), ("lock.second_start", second)]


def test_a_crossing_an_earlier_version_held_back_is_still_reported_when_the_bracket_closes():
    # states written before crossings were reported live kept them in internal.pendingCrossing
    # until the bracket closed: an upgrade must neither lose nor repeat them
    log = Log()
    log.turn_start(1)
    log.start("c1", turn=1)
    log.turn_end(1)
    state, _ = log.run()
    legacy = copy.deepcopy(state)
    legacy["internal"]["pendingCrossing"] = ["turn.enclosure", "turn 1 ended at seq 3 while its compaction 'c1' still held the lock"]
    for e in legacy["record"]["compactions"]:
        e.pop("crossing")  # that version's entries had no crossing field
    closing = log.end("c1", turn=1, error="cancelled")
    closed, vs = step(legacy, log.events[-1])
    assert [(v.rule, v.seq) for v in vs] == [("turn.enclosure", closing)]
    assert "pendingCrossing" not in closed["internal"]
    excused, vs = step(legacy, {**log.events[-1], "type": END_SEED, "data": {"json": "{}"}})
    assert vs == [] and "pendingCrossing" not in excused["internal"]  # an orphan: excused, as then


def test_standalone_bracket_is_not_crossed_by_surface_appends():
    # only explicit turn/start / turn/end are boundaries of a standalone bracket (the reference
    # checks exactly those two event types)
    log = Log()
    seqs = log.conversation(3, turn=None)
    log.start("c1", turn=None)
    log.summary("c1", seqs)
    log.replace(seqs)
    log.msg("user", "typed while compacting", turn=None)
    log.end("c1", turn=None)
    _, vs = log.run()
    assert vs == []


# ----------------------------------------------------------------------------------------------
# ids


@pytest.mark.parametrize("where", ["start id", "start command", "summary id", "summary command", "end command"])
def test_empty_compaction_and_command_ids_are_refused(where):
    # INVARIANT_SPEC: "rejects empty start id", "rejects empty start source command id",
    # "rejects empty end source command id" (validateId: a non-empty string when present)
    log, seqs = turn_one()
    start_cid = "" if where == "start id" else "c1"
    start_cmd = "" if where == "start command" else "cmd-1"
    log.start(start_cid, turn=1, cmd=start_cmd)
    if where.startswith("summary"):
        log.summary("" if where == "summary id" else "c1", seqs, cmd="" if where == "summary command" else "cmd-1")
    if where == "end command":
        log.end("c1", turn=1, cmd="", error="failed")
    state, vs = log.run()
    assert rules(vs) == ["event.empty_id"]
    comps = state["record"]["compactions"]
    if where.startswith("start"):
        assert comps == [] and state["record"]["openCompactionId"] is None  # not applied
    else:
        assert state["record"]["openCompactionId"] == "c1"  # the refused event changed nothing
        assert comps[0]["summarySeq"] is None and comps[0]["endSeq"] is None


@pytest.mark.parametrize("start_cmd, summary_cmd", [("cmd-1", "cmd-2"), ("cmd-1", None), (None, "cmd-1")])
def test_summary_command_must_match_its_start(start_cmd, summary_cmd):
    # INVARIANT_SPEC: "rejects summary for another source command" (validateSourceCommandId:
    # a differing or omitted sourceCommandId does not match the start's)
    log, seqs = turn_one()
    log.start("c1", turn=1, cmd=start_cmd)
    log.summary("c1", seqs, cmd=summary_cmd)
    log.replace(seqs, turn=1)
    log.end("c1", turn=1, cmd=start_cmd)
    state, vs = log.run()
    assert rules(vs) == ["summary.owner_mismatch"]
    assert compaction(state, "c1")["status"] == "succeeded"  # reported, still metered (like lock.owner_mismatch)


def test_matching_summary_command_is_fine():
    log, seqs = turn_one()
    full_compaction(log, "c1", seqs, turn=1, cmd="cmd-1")
    _, vs = log.run()
    assert vs == []


# ----------------------------------------------------------------------------------------------
# an error end right after the summary owes no replacement


def test_error_end_after_summary_needs_no_replacement():
    # deepseek-harness packages/compaction/compaction-basic/src/region.ts: the checkpoint append
    # after the summary fails -> compaction/end with error, no checkpoint
    # (tests/manual-compaction.spec.ts "classifies a commit-body failure and still releases admission")
    log, _ = summarized()
    log.end("c1", turn=1, error="checkpoint rejected")
    state, vs = log.run()
    assert vs == []
    rec = state["record"]
    assert (rec["tokensRemoved"], rec["tokensAdded"], rec["tokensSaved"]) == (0, 0, 0)  # nothing settled
    assert rec["errorCount"] == 1 and compaction(state, "c1")["status"] == "failed"
    assert state["internal"]["claim"] is None


def test_successful_end_after_summary_still_owes_the_replacement():
    # SPEC §4.8: the replacement must immediately follow its summary; only a failed compaction is excused
    log, _ = summarized()
    log.end("c1", turn=1)
    _, vs = log.run()
    assert rules(vs) == ["shadow.not_adjacent"]


def test_end_seed_after_an_armed_summary_still_expires_the_claim():
    # SPEC §4.8 is explicit (any other event in between expires the claim): a writer that died
    # between its summary and its replacement left a claim nobody settles; reported, then released
    log, _ = summarized()
    end_seed(log)
    state, vs = log.run()
    assert rules(vs) == ["shadow.not_adjacent"]
    assert state["record"]["openCompactionId"] is None


# ----------------------------------------------------------------------------------------------
# the estimator prices an empty assistant message as zero


def test_empty_assistant_message_costs_nothing():
    # deepseek-harness packages/llm/token-meter/tests/token-meter.spec.ts
    # "prices an empty assistant surface anchor as zero" (surface.ts deriveEventMessage: no message)
    assert price_message("assistant", []) == 0
    assert price_message("assistant", None) == 0
    assert price_message("user", []) == 4  # other roles keep the role overhead
    assert price_message("assistant", [text_block("")]) == 8  # one (empty) block is a message


def test_empty_assistant_replacement_adds_no_tokens():
    log, seqs = summarized(count=60)
    log.ev("assistant/message", {"role": "assistant", "content": [], "surfaceOp": "replace",
                                 "sourceEventSeqs": list(seqs), "turn": 1})
    log.end("c1", turn=1)
    state, vs = log.run()
    assert vs == []
    assert (state["record"]["tokensAdded"], state["record"]["tokensSaved"]) == (0, 60)


def test_new_rules_are_documented():
    for rule in ("turn.crosses_standalone", "event.empty_id", "summary.owner_mismatch"):
        assert RULES[rule]
    state, vs = step(None, {"sessionId": "s", "seq": 1, "type": END_SEED, "ts": 1, "ignorable": False, "data": None})
    assert vs == [] and state["record"]["lastSeq"] == 1  # end-seed is a known event, not event.unknown_type
