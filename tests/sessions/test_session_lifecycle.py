"""The per-session compaction lifecycle checker and ledger reducer: every rule broken and kept."""

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.sessions import lifecycle
from streams.sessions.lifecycle import RULES, new_state, replay, step, to_record
from streams.sessions.tokens import price_message, text_block, tool_call_block

LEDGER_FIELDS = {"sessionId", "lastSeq", "openCompactionId", "compactions", "tokensRemoved", "tokensAdded",
                 "tokensSaved", "violationCount", "errorCount"}
COMPACTION_FIELDS = {"compactionId", "sourceCommandId", "turn", "startSeq", "summarySeq", "endSeq", "shadowedRange",
                     "shadowedSeqs", "shadowedTokenCount", "summaryTokens", "provider", "model", "maxTokens", "usage",
                     "durationMs", "error", "status", "crossing"}


class Log:
    """Builds a session log with consecutive seqs and ts = 1000 * seq."""

    def __init__(self, sid="s-1"):
        self.sid = sid
        self.events = []

    @property
    def next_seq(self):
        return len(self.events) + 1

    def ev(self, type_, data, ignorable=False, **over):
        seq = self.next_seq
        e = {"sessionId": self.sid, "seq": seq, "type": type_, "ts": 1000 * seq, "ignorable": ignorable, "data": data}
        e.update(over)
        self.events.append(e)
        return seq

    def msg(self, role="user", text="hello there", turn=None, type_=None):
        return self.ev(type_ or f"{role}/message", {"role": role, "content": [text_block(text)], "surfaceOp": "append",
                                                    "sourceEventSeqs": [], "turn": turn})

    def replace(self, seqs, text="summary", role="user", turn=None):
        return self.ev("user/message", {"role": role, "content": [text_block(text)], "surfaceOp": "replace",
                                        "sourceEventSeqs": list(seqs), "turn": turn})

    def turn_start(self, n):
        return self.ev("turn/start", {"json": json.dumps({"turn": n})})

    def turn_end(self, n):
        return self.ev("turn/end", {"json": json.dumps({"turn": n})})

    def start(self, cid, turn=None, cmd=None):
        return self.ev("compaction/start", {"compactionId": cid, "sourceCommandId": cmd, "turn": turn})

    def end(self, cid, turn=None, cmd=None, error=None):
        return self.ev("compaction/end", {"compactionId": cid, "sourceCommandId": cmd, "turn": turn, "error": error})

    def summary(self, cid, seqs, count=100, rng=None, cmd=None, **over):
        data = {
            "compactionId": cid, "sourceCommandId": cmd, "summary": [text_block("summary")],
            "shadowedRange": rng or {"start": seqs[0], "end": seqs[-1]}, "shadowedSeqs": list(seqs),
            "shadowedTokenCount": count, "provider": "anthropic", "model": "claude-sonnet-4", "maxTokens": 2048,
            "usage": {"inputTokens": 900, "outputTokens": 80, "totalTokens": 980},
            "rawOutput": [text_block("<summary>summary</summary>")], "llmStreamCall": True,
        }
        data.update(over)
        return self.ev("compaction/summary", data)

    def prune(self, seqs, count=50, rng=None):
        return self.ev("compaction/prune", {"shadowedRange": rng or {"start": seqs[0], "end": seqs[-1]},
                                            "shadowedSeqs": list(seqs), "shadowedTokenCount": count})

    def conversation(self, n=4, turn=None):
        return [self.msg("user" if k % 2 == 0 else "assistant", f"message number {k}", turn=turn) for k in range(n)]

    def run(self):
        return replay(self.events)


def rules(violations):
    return sorted(v.rule for v in violations)


def full_compaction(log, cid, seqs, turn=None, count=100, text="summary", cmd=None):
    log.start(cid, turn=turn, cmd=cmd)
    log.summary(cid, seqs, count=count, cmd=cmd)
    log.replace(seqs, text=text, turn=turn)
    log.end(cid, turn=turn, cmd=cmd)


# ----------------------------------------------------------------------------------------------
# the happy path


def test_valid_compaction_is_metered_and_recorded():
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(4, turn=1)
    s_start = log.start("c1", turn=1)
    s_sum = log.summary("c1", seqs, count=120)
    log.replace(seqs, text="abcdefgh", turn=1)
    s_end = log.end("c1", turn=1)
    log.turn_end(1)
    state, vs = log.run()
    assert vs == []
    rec = to_record(state)
    assert set(rec) == LEDGER_FIELDS
    replacement = price_message("user", [text_block("abcdefgh")])  # 4 + (2 + 4) = 10
    assert replacement == 10
    assert rec["tokensRemoved"] == 120
    assert rec["tokensAdded"] == 10
    assert rec["tokensSaved"] == 110
    assert rec["lastSeq"] == len(log.events)
    assert rec["openCompactionId"] is None
    assert rec["violationCount"] == 0 and rec["errorCount"] == 0
    (c,) = rec["compactions"]
    assert set(c) == COMPACTION_FIELDS
    assert c["status"] == "succeeded"
    assert (c["startSeq"], c["summarySeq"], c["endSeq"]) == (s_start, s_sum, s_end)
    assert c["turn"] == 1
    assert c["shadowedSeqs"] == seqs and c["shadowedRange"] == {"start": seqs[0], "end": seqs[-1]}
    assert c["shadowedTokenCount"] == 120 and c["summaryTokens"] == 10
    assert (c["provider"], c["model"], c["maxTokens"]) == ("anthropic", "claude-sonnet-4", 2048)
    assert c["usage"] == {"inputTokens": 900, "outputTokens": 80, "totalTokens": 980}
    assert c["durationMs"] == 1000 * (s_end - s_start)
    json.dumps(state)  # the whole state is JSON-able for the Faust table


def test_replacement_price_uses_utf16_and_tool_calls():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs, count=200)
    content = [text_block("\U0001F600" * 3), tool_call_block("read_file", '{"path":"a"}')]
    log.ev("user/message", {"role": "user", "content": content, "surfaceOp": "replace", "sourceEventSeqs": seqs, "turn": None})
    log.end("c1")
    state, vs = log.run()
    assert vs == []
    # role 4 + emoji text (6 units -> 2 + 4) + tool call (3 + 3 + 4)
    assert state["record"]["tokensAdded"] == 4 + 6 + 10
    assert state["record"]["tokensSaved"] == 200 - 20


def test_failed_compaction_needs_no_summary_and_counts_an_error():
    log = Log()
    log.conversation(3)
    log.start("c1")
    log.end("c1", error="summarizer timed out")
    state, vs = log.run()
    assert vs == []
    rec = to_record(state)
    assert rec["errorCount"] == 1
    assert rec["compactions"][0]["status"] == "failed"
    assert rec["compactions"][0]["error"] == "summarizer timed out"


def test_shadowed_range_start_may_exceed_end_after_an_earlier_replace():
    # surface positions: after replacing [1,2] by seq 5, the surface is [5, 3, 4]; shadowing it all
    # gives the range (5 .. 4): start > end, valid because it matches shadowedSeqs' first/last.
    log = Log()
    a = log.conversation(4)
    full_compaction(log, "c1", a[:2])  # seqs 5..8: start, summary, replace(=7), end
    replaced = 7
    assert log.events[replaced - 1]["data"]["surfaceOp"] == "replace"
    full_compaction(log, "c2", [replaced, a[2], a[3]])
    state, vs = log.run()
    assert vs == []
    assert state["record"]["compactions"][1]["shadowedRange"] == {"start": 7, "end": 4}


def test_prune_settles_without_a_compaction():
    log = Log()
    seqs = log.conversation(3)
    log.prune([seqs[1]], count=37)
    log.ev("tool/result", {"role": "tool", "content": [text_block("[pruned]")], "surfaceOp": "replace",
                           "sourceEventSeqs": [seqs[1]], "turn": None})
    state, vs = log.run()
    assert vs == []
    rec = state["record"]
    assert rec["tokensRemoved"] == 37
    assert rec["tokensAdded"] == price_message("tool", [text_block("[pruned]")]) == 4 + 2 + 4
    assert rec["tokensSaved"] == 37 - 10
    assert rec["compactions"] == []


def test_two_sequential_compactions_and_a_manual_one_between_turns():
    log = Log()
    log.turn_start(1)
    a = log.conversation(4, turn=1)
    full_compaction(log, "c1", a[:2], turn=1)
    log.turn_end(1)
    full_compaction(log, "c2", a[2:], turn=None, cmd="cmd-7")
    log.turn_start(2)
    log.msg(turn=2)
    state, vs = log.run()
    assert vs == []
    assert [c["status"] for c in state["record"]["compactions"]] == ["succeeded", "succeeded"]
    assert state["record"]["compactions"][1]["sourceCommandId"] == "cmd-7"


# ----------------------------------------------------------------------------------------------
# the lock


def test_second_start_while_open_is_a_violation_and_the_lock_passes():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.start("c2")
    log.summary("c2", seqs)
    log.replace(seqs)
    log.end("c2")
    log.end("c1")  # c1 was abandoned: no longer open
    state, vs = log.run()
    assert rules(vs) == ["lock.end_not_open", "lock.second_start"]
    c1, c2 = state["record"]["compactions"]
    assert c1["status"] == "failed" and c1["error"].startswith("abandoned")
    assert c2["status"] == "succeeded"
    assert state["record"]["openCompactionId"] is None
    assert state["record"]["violationCount"] == 2
    assert state["record"]["errorCount"] == 0


def test_reused_compaction_id():
    log = Log()
    seqs = log.conversation(4)
    full_compaction(log, "c1", seqs[:2])
    full_compaction(log, "c1", seqs[2:])
    _, vs = log.run()
    assert rules(vs) == ["lock.reused_id"]


@pytest.mark.parametrize("case", ["unknown", "already_closed", "other_open"])
def test_end_of_a_compaction_that_is_not_open(case):
    log = Log()
    seqs = log.conversation(3)
    if case == "unknown":
        log.end("ghost")
    elif case == "already_closed":
        full_compaction(log, "c1", seqs)
        log.end("c1")
    else:
        log.start("c1")
        log.end("c9")
    state, vs = log.run()
    assert rules(vs) == ["lock.end_not_open"]
    if case == "other_open":
        assert state["record"]["openCompactionId"] == "c1"  # a stray end does not release the lock


@pytest.mark.parametrize("end_kw", [{"turn": 2}, {"turn": None}, {"turn": 1, "cmd": "cmd-x"}])
def test_end_owner_must_match_start(end_kw):
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(3, turn=1)
    log.start("c1", turn=1)
    log.summary("c1", seqs)
    log.replace(seqs, turn=1)
    log.end("c1", **end_kw)
    _, vs = log.run()
    assert rules(vs) == ["lock.owner_mismatch"]


# ----------------------------------------------------------------------------------------------
# turns


def test_numbered_owner_must_be_the_open_turn():
    log = Log()
    log.turn_start(3)
    seqs = log.conversation(3, turn=3)
    full_compaction(log, "c1", seqs, turn=4)
    _, vs = log.run()
    assert rules(vs) == ["turn.not_open"]


def test_numbered_owner_with_no_turn_open():
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(3, turn=1)
    log.turn_end(1)
    full_compaction(log, "c1", seqs, turn=1)
    _, vs = log.run()
    assert rules(vs) == ["turn.not_open"]


def test_turn_inferred_from_surface_events_without_explicit_boundaries():
    log = Log()
    seqs = log.conversation(3, turn=5)
    full_compaction(log, "c1", seqs, turn=5)
    _, vs = log.run()
    assert vs == []
    log2 = Log()
    seqs = log2.conversation(3, turn=5)
    full_compaction(log2, "c1", seqs, turn=4)
    _, vs = log2.run()
    assert rules(vs) == ["turn.not_open"]


def test_null_turn_inside_an_open_turn():
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(3, turn=1)
    full_compaction(log, "c1", seqs, turn=None)
    _, vs = log.run()
    assert rules(vs) == ["turn.null_inside_turn"]


def test_null_turn_between_turns_is_fine():
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(3, turn=1)
    log.turn_end(1)
    full_compaction(log, "c1", seqs, turn=None, cmd="cmd-1")
    _, vs = log.run()
    assert vs == []


def test_null_turn_not_enforced_without_explicit_turn_boundaries():
    # without turn/start / turn/end the checker cannot tell that turn 1 is over: no guess
    log = Log()
    seqs = log.conversation(3, turn=1)
    full_compaction(log, "c1", seqs, turn=None)
    state, vs = log.run()
    assert vs == []
    assert state["internal"]["turnBoundaries"] is False


def test_turn_ending_while_its_compaction_holds_the_lock():
    log = Log()
    log.turn_start(1)
    seqs = log.conversation(3, turn=1)
    log.start("c1", turn=1)
    log.summary("c1", seqs)
    log.replace(seqs, turn=1)
    log.turn_end(1)
    log.turn_start(2)  # reported once per compaction, not again here
    log.end("c1", turn=1)
    _, vs = log.run()
    assert rules(vs) == ["turn.enclosure"]


def test_next_turn_message_while_compaction_open_breaks_enclosure():
    log = Log()
    seqs = log.conversation(3, turn=1)
    log.start("c1", turn=1)
    log.summary("c1", seqs)
    log.replace(seqs, turn=1)
    log.msg("user", "next question", turn=2)
    log.end("c1", turn=1)
    _, vs = log.run()
    assert rules(vs) == ["turn.enclosure"]


def test_replace_events_do_not_move_the_turn():
    log = Log()
    seqs = log.conversation(3, turn=1)
    log.start("c1", turn=1)
    log.summary("c1", seqs)
    log.replace(seqs, turn=None)
    log.end("c1", turn=1)
    _, vs = log.run()
    assert vs == []


# ----------------------------------------------------------------------------------------------
# summaries


def test_summary_for_a_compaction_that_is_not_open():
    log = Log()
    seqs = log.conversation(3)
    log.summary("c-orphan", seqs)
    log.replace(seqs)  # the claim is armed regardless, so the replacement itself is fine
    state, vs = log.run()
    assert rules(vs) == ["summary.not_open"]
    assert state["record"]["tokensRemoved"] == 100


def test_at_most_one_summary_per_compaction():
    log = Log()
    seqs = log.conversation(5)
    log.start("c1")
    log.summary("c1", seqs[:2], count=40)
    log.replace(seqs[:2])
    log.summary("c1", seqs[2:], count=60)
    log.replace(seqs[2:])
    log.end("c1")
    state, vs = log.run()
    assert rules(vs) == ["summary.duplicate"]
    c = state["record"]["compactions"][0]
    assert c["shadowedSeqs"] == seqs[:2]  # the first summary is the compaction's
    assert state["record"]["tokensRemoved"] == 100  # both replacements still metered


def test_llm_stream_call_requires_raw_output():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs, llmStreamCall=True, rawOutput=None)
    log.replace(seqs)
    log.end("c1")
    _, vs = log.run()
    assert rules(vs) == ["summary.raw_output_missing"]


@pytest.mark.parametrize("over", [{"llmStreamCall": None, "rawOutput": None},
                                  {"llmStreamCall": None, "rawOutput": [text_block("x")]},
                                  {"llmStreamCall": True, "rawOutput": []}])
def test_raw_output_rule_respected(over):
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs, **over)
    log.replace(seqs)
    log.end("c1")
    _, vs = log.run()
    assert vs == []


def test_successful_end_requires_a_summary():
    log = Log()
    log.conversation(3)
    log.start("c1")
    log.end("c1")
    state, vs = log.run()
    assert rules(vs) == ["end.missing_summary"]
    assert state["record"]["compactions"][0]["status"] == "succeeded"


# ----------------------------------------------------------------------------------------------
# metering events


@pytest.mark.parametrize("kind", ["summary", "prune"])
@pytest.mark.parametrize("rng", [{"start": 2, "end": 1}, {"start": 1, "end": 3}, {"start": 0, "end": 2}, None])
def test_shadowed_range_must_match_first_and_last_seq(kind, rng):
    log = Log()
    log.conversation(3)
    seqs = [1, 2]
    bad = rng if rng is not None else {"start": 1}
    if kind == "summary":
        log.start("c1")
        log.summary("c1", seqs, rng=bad)
        log.replace(seqs)
        log.end("c1")
    else:
        log.prune(seqs, rng=bad)
        log.replace(seqs)
    _, vs = log.run()
    assert rules(vs) == ["meter.range_mismatch"]


def test_empty_shadowed_seqs_is_a_range_mismatch():
    log = Log()
    log.conversation(2)
    log.ev("compaction/prune", {"shadowedRange": {"start": 1, "end": 1}, "shadowedSeqs": [], "shadowedTokenCount": 0})
    log.replace([])
    _, vs = log.run()
    assert rules(vs) == ["meter.range_mismatch"]


@pytest.mark.parametrize("count", [-1, 1.5, True, "10", None])
@pytest.mark.parametrize("kind", ["summary", "prune"])
def test_token_count_must_be_a_non_negative_integer(count, kind):
    log = Log()
    seqs = log.conversation(3)
    if kind == "summary":
        log.start("c1")
        log.summary("c1", seqs, count=count)
        log.replace(seqs)
        log.end("c1")
    else:
        log.prune(seqs, count=count)
        log.replace(seqs)
    state, vs = log.run()
    assert rules(vs) == ["meter.bad_token_count"]
    # the claim settles, but an unpriceable claim leaves the totals alone
    assert (state["record"]["tokensRemoved"], state["record"]["tokensAdded"], state["record"]["tokensSaved"]) == (0, 0, 0)


def test_zero_token_count_is_fine():
    log = Log()
    seqs = log.conversation(1)
    log.prune(seqs, count=0)
    log.replace(seqs, text="")
    state, vs = log.run()
    assert vs == []
    assert state["record"]["tokensSaved"] == -8  # a replacement can cost more than it saves


# ----------------------------------------------------------------------------------------------
# the shadow-price claim


def test_claim_expires_on_an_append_in_between():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs)
    log.msg("assistant", "interleaved")
    log.replace(seqs)
    log.end("c1")
    state, vs = log.run()
    assert rules(vs) == ["shadow.not_adjacent", "shadow.unclaimed_replace"]
    assert state["record"]["tokensRemoved"] == 0
    assert state["record"]["compactions"][0]["summaryTokens"] is None


def test_claim_expires_on_an_ignorable_event_in_between():
    log = Log()
    seqs = log.conversation(3)
    log.prune(seqs[:1])
    log.ev("ui/render", {"json": "{}"}, ignorable=True)
    log.replace(seqs[:1])
    _, vs = log.run()
    assert rules(vs) == ["shadow.not_adjacent", "shadow.unclaimed_replace"]


def test_claim_expires_when_the_compaction_ends_without_replacement():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs)
    log.end("c1")
    state, vs = log.run()
    assert rules(vs) == ["shadow.not_adjacent"]
    assert state["internal"]["claim"] is None


def test_replace_of_a_different_range_while_armed():
    log = Log()
    seqs = log.conversation(4)
    log.start("c1")
    log.summary("c1", seqs[:3])
    log.replace(seqs[1:3])
    log.end("c1")
    state, vs = log.run()
    assert rules(vs) == ["shadow.range_mismatch"]
    assert state["record"]["tokensRemoved"] == 0


def test_replace_in_another_order_is_a_different_range():
    log = Log()
    seqs = log.conversation(3)
    log.prune(seqs)
    log.replace(list(reversed(seqs)))
    _, vs = log.run()
    assert rules(vs) == ["shadow.range_mismatch"]


def test_replace_with_nothing_armed():
    log = Log()
    seqs = log.conversation(3)
    log.replace(seqs)
    _, vs = log.run()
    assert rules(vs) == ["shadow.unclaimed_replace"]


def test_a_claim_is_settled_only_once():
    log = Log()
    seqs = log.conversation(3)
    log.prune(seqs[:1])
    log.replace(seqs[:1])
    log.replace(seqs[:1])
    state, vs = log.run()
    assert rules(vs) == ["shadow.unclaimed_replace"]
    assert state["record"]["tokensRemoved"] == 50


# ----------------------------------------------------------------------------------------------
# other events, bad input, duplicates


def test_unknown_event_types():
    log = Log()
    log.conversation(1)
    log.ev("ui/render", {"json": "{}"}, ignorable=True)
    log.ev("session/meta", {"json": '{"title":"x"}'})
    state, vs = log.run()
    assert rules(vs) == ["event.unknown_type"]
    assert state["record"]["lastSeq"] == 3


@pytest.mark.parametrize("bad", [
    {"seq": None},
    {"seq": "7"},
    {"type": None},
    {"data": "not an object"},
    {"data": {"json": "{not json"}},
])
def test_malformed_envelopes(bad):
    log = Log()
    log.conversation(1)
    e = {"sessionId": "s-1", "seq": 2, "type": "assistant/message", "ts": 2000, "ignorable": False,
         "data": {"role": "assistant", "content": [], "surfaceOp": "append", "sourceEventSeqs": [], "turn": None}}
    e.update(bad)
    log.events.append(e)
    log.msg("user", "still tracked")
    state, vs = log.run()
    assert rules(vs) == ["event.malformed"]
    assert state["record"]["violationCount"] == 1


@pytest.mark.parametrize("type_,data", [
    ("compaction/start", {"compactionId": None, "turn": None}),
    ("compaction/start", {"compactionId": "c1", "turn": "one"}),
    ("compaction/end", {"compactionId": 5}),
    ("compaction/summary", {"compactionId": "c1", "shadowedSeqs": "1-3"}),
    ("compaction/prune", {"shadowedSeqs": [1, "2"], "shadowedRange": {"start": 1, "end": 2}, "shadowedTokenCount": 1}),
    ("turn/start", {"json": '{"turn": null}'}),
])
def test_malformed_compaction_data(type_, data):
    log = Log()
    log.conversation(2)
    log.ev(type_, data)
    state, vs = log.run()
    assert rules(vs) == ["event.malformed"]
    assert state["record"]["openCompactionId"] is None


def test_compaction_events_as_generic_json_are_understood():
    log = Log()
    seqs = log.conversation(2)
    log.ev("compaction/start", {"json": json.dumps({"compactionId": "c1", "turn": None})})
    log.ev("compaction/summary", {"json": json.dumps({
        "compactionId": "c1", "summary": [text_block("s")], "shadowedRange": {"start": 1, "end": 2},
        "shadowedSeqs": seqs, "shadowedTokenCount": 30, "provider": "p", "model": "m"})})
    log.replace(seqs)
    log.ev("compaction/end", {"json": json.dumps({"compactionId": "c1", "turn": None})})
    state, vs = log.run()
    assert vs == []
    assert state["record"]["compactions"][0]["model"] == "m"


def test_event_of_another_session():
    log = Log()
    log.conversation(1)
    log.msg("user", "misrouted")
    log.events[-1]["sessionId"] = "s-other"
    state, vs = log.run()
    assert rules(vs) == ["event.session_mismatch"]
    assert state["record"]["lastSeq"] == 1


def test_duplicates_are_skipped_idempotently():
    log = Log()
    seqs = log.conversation(3)
    full_compaction(log, "c1", seqs)
    state, vs = log.run()
    assert vs == []
    for e in log.events:
        again, vs2 = step(state, e)
        assert again is state and vs2 == []
    # replaying the whole stream (a redelivery after a crash) changes nothing
    state2, vs2 = replay(log.events, state)
    assert state2 == state and vs2 == []


def test_step_does_not_mutate_its_input():
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs)
    log.replace(seqs)
    log.end("c1")
    state = None
    for e in log.events:
        before = copy.deepcopy(state)
        e_before = copy.deepcopy(e)
        new, _ = step(state, e)
        assert state == before and e == e_before
        state = new


def test_state_survives_a_json_round_trip_mid_compaction():
    """A Faust table persists the state as JSON: resuming from the stored copy gives the same result."""
    log = Log()
    seqs = log.conversation(3)
    log.start("c1")
    log.summary("c1", seqs)
    log.replace(seqs)
    log.end("c1")
    straight, _ = log.run()
    for cut in range(1, len(log.events)):
        mid, _ = replay(log.events[:cut])
        restored = json.loads(json.dumps(mid))
        resumed, vs = replay(log.events[cut:], restored)
        assert resumed == straight and vs == []


def test_old_closed_compactions_are_trimmed(monkeypatch):
    monkeypatch.setattr(lifecycle, "MAX_COMPACTIONS", 3)
    log = Log()
    for k in range(5):
        seqs = log.conversation(2)
        full_compaction(log, f"c{k}", seqs, count=10, text="")
    state, vs = log.run()
    assert vs == []
    rec = state["record"]
    assert [c["compactionId"] for c in rec["compactions"]] == ["c2", "c3", "c4"]
    assert state["internal"]["droppedCompactions"] == 2
    assert rec["tokensRemoved"] == 50  # totals stay cumulative


def test_rule_catalog_is_what_the_checker_uses():
    assert all(isinstance(k, str) and "." in k for k in RULES)
    v = lifecycle.Violation("lock.second_start", "m", "s", 3, "compaction/start")
    assert v.as_dict() == {"rule": "lock.second_start", "message": "m", "sessionId": "s", "seq": 3,
                           "eventType": "compaction/start"}
    assert str(v) == "lock.second_start: m"


def test_new_state_record_is_valid_ledger():
    rec = to_record(new_state("s-9"))
    assert set(rec) == LEDGER_FIELDS and rec["sessionId"] == "s-9" and rec["compactions"] == []


# ----------------------------------------------------------------------------------------------
# fuzz: never raises, always JSON-able, violationCount consistent

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 20), st.text(max_size=6))
_blocks = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_call", "unknown"]),
                                          "text": st.one_of(st.none(), st.text(max_size=10)),
                                          "name": st.one_of(st.none(), st.text(max_size=5)),
                                          "arguments": st.one_of(st.none(), st.text(max_size=5))}), max_size=3)
_seqs = st.lists(st.integers(0, 12), max_size=4)
_data = st.one_of(
    st.fixed_dictionaries({"compactionId": st.sampled_from(["a", "b", None]), "turn": st.one_of(st.none(), st.integers(0, 3)),
                           "error": st.one_of(st.none(), st.just("boom"))}),
    st.fixed_dictionaries({"compactionId": st.sampled_from(["a", "b"]), "shadowedSeqs": _seqs,
                           "shadowedRange": st.fixed_dictionaries({"start": st.integers(0, 12), "end": st.integers(0, 12)}),
                           "shadowedTokenCount": _json_leaf, "llmStreamCall": st.one_of(st.none(), st.booleans()),
                           "rawOutput": st.one_of(st.none(), _blocks), "provider": st.just("p"), "model": st.just("m")}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": _blocks,
                           "surfaceOp": st.sampled_from(["append", "replace"]), "sourceEventSeqs": _seqs,
                           "turn": st.one_of(st.none(), st.integers(0, 3))}),
    st.fixed_dictionaries({"json": st.one_of(st.just('{"turn": 1}'), st.just("{"), st.just("[]"))}),
    _json_leaf,
)
_event = st.fixed_dictionaries({
    "sessionId": st.sampled_from(["s", "s", "s", "t"]),
    "seq": st.one_of(st.integers(0, 40), st.none()),
    "type": st.sampled_from(["compaction/start", "compaction/summary", "compaction/end", "compaction/prune",
                             "turn/start", "turn/end", "user/message", "x/y", None]),
    "ts": st.one_of(st.integers(0, 10**6), st.none()),
    "ignorable": st.booleans(),
    "data": _data,
})


@settings(max_examples=300, deadline=None)
@given(st.lists(_event, max_size=30))
def test_arbitrary_events_never_raise(events):
    state = new_state("s")
    total = 0
    for e in events:
        state, vs = step(state, e)
        total += len(vs)
        assert all(v.rule in RULES for v in vs)
    json.dumps(state)
    assert state["record"]["violationCount"] == total
    rec = to_record(state)
    assert rec["tokensSaved"] == rec["tokensRemoved"] - rec["tokensAdded"]


# ----------------------------------------------------------------------------------------------
# seen seqs: a redelivery is a duplicate, a reused seq with other content is a violation


def _other_content(e):
    """The same seq with different content (never equal to ``e``)."""
    return {**e, "type": "user/message", "ts": (e.get("ts") or 0) + 1,
            "data": {"role": "user", "content": [text_block(f"not the event at seq {e['seq']}")], "surfaceOp": "append",
                     "sourceEventSeqs": [], "turn": None}}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_same_seq_same_content_is_a_duplicate_other_content_is_seq_reused(seed, data):
    from streams.sessions import samples

    s = samples.valid_session(seed)
    state, vs = replay(s.events)
    assert vs == []
    event = data.draw(st.sampled_from(s.events))
    # the same event again (a redelivery): skipped, same state object, no violation
    again, vs = step(state, copy.deepcopy(event))
    assert again is state and vs == []
    # the same seq with different content: a violation with its rule id and a readable reason
    reused = _other_content(event)
    after, vs = step(state, reused)
    assert rules(vs) == ["session.seq_reused"]
    assert f"seq {event['seq']} was already applied with different content" in str(vs[0])
    assert str(vs[0]).startswith("session.seq_reused: ") and vs[0].seq == event["seq"]
    # nothing else changes: the event is not part of the session's log
    assert after["record"] == {**state["record"], "violationCount": state["record"]["violationCount"] + 1}
    assert after["internal"] == state["internal"]


def test_any_field_difference_is_a_different_fingerprint():
    log = Log()
    log.conversation(2)
    e = log.events[0]
    fp = lifecycle.fingerprint(e)
    assert lifecycle.fingerprint(copy.deepcopy(e)) == fp
    assert lifecycle.fingerprint(dict(reversed(list(e.items())))) == fp  # key order does not matter
    for change in ({"ts": e["ts"] + 1}, {"ignorable": True}, {"type": "assistant/message"},
                   {"data": {**e["data"], "content": [text_block("hello there!")]}}):
        assert lifecycle.fingerprint({**e, **change}) != fp, change


def test_a_late_seq_that_was_never_applied_is_out_of_order():
    log = Log()
    log.conversation(3)
    log.events[1], log.events[2] = log.events[2], log.events[1]
    state, vs = log.run()
    assert rules(vs) == ["session.seq_out_of_order"] and vs[0].seq == 2
    assert state["record"]["lastSeq"] == 3


def test_fingerprints_are_bounded_and_older_seqs_are_unverifiable(monkeypatch):
    monkeypatch.setattr(lifecycle, "SEQ_WINDOW", 5)
    log = Log()
    log.conversation(12)
    state, vs = log.run()
    assert vs == []
    prints = state["internal"]["seqPrints"]
    assert list(prints) == ["8", "9", "10", "11", "12"] and state["internal"]["seqFloor"] == 8
    state = json.loads(json.dumps(state))  # as the table stores it
    assert step(state, log.events[7])[0] is state  # seq 8: still remembered, a duplicate
    _, vs = step(state, log.events[6])  # seq 7: forgotten
    assert rules(vs) == ["session.seq_unverifiable"] and "older than the remembered window" in str(vs[0])
    _, vs = step(state, _other_content(log.events[2]))
    assert rules(vs) == ["session.seq_unverifiable"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=80))
def test_window_stays_bounded_and_complete_above_its_floor(seqs):
    state = new_state("s")
    applied = set()
    for q in seqs:
        e = {"sessionId": "s", "seq": q, "type": "ui/render", "ts": q, "ignorable": True, "data": {"json": "{}"}}
        new, vs = step(state, e)
        if q > state["record"]["lastSeq"]:
            applied.add(q)
            assert vs == []
        else:
            assert (new is state) == (q in applied and str(q) in state["internal"]["seqPrints"])
        state = new
        prints, floor = state["internal"]["seqPrints"], state["internal"]["seqFloor"]
        assert len(prints) <= lifecycle.SEQ_WINDOW
        assert {int(k) for k in prints} == {a for a in applied if a >= floor}


def test_a_state_written_before_fingerprints_treats_older_seqs_as_unverifiable():
    log = Log()
    log.conversation(3)
    state, _ = replay(log.events[:2])
    legacy = copy.deepcopy(state)
    del legacy["internal"]["seqPrints"], legacy["internal"]["seqFloor"]
    _, vs = step(legacy, log.events[0])
    assert rules(vs) == ["session.seq_unverifiable"]
    resumed, vs = step(legacy, log.events[2])  # new seqs are fingerprinted from here on
    assert vs == [] and resumed["internal"]["seqFloor"] == 3 and list(resumed["internal"]["seqPrints"]) == ["3"]
    assert step(resumed, log.events[2])[0] is resumed
    assert rules(step(resumed, log.events[1])[1]) == ["session.seq_unverifiable"]


def test_an_event_of_another_session_is_reported_even_with_an_old_seq():
    log = Log()
    log.conversation(3)
    state, _ = log.run()
    stray = {**log.events[0], "sessionId": "s-other"}
    _, vs = step(state, stray)
    assert rules(vs) == ["event.session_mismatch"]
