"""Deterministic sample session event streams (for ``memstream generate``, the demo and tests).

Every stream comes from a seeded ``random.Random``: the same seed gives the same events. A
``SampleSession`` carries its events (SessionEvent dicts with every wire field present, ready for
the Avro serializer) and ``expected``: the sorted rule ids (with multiplicity) that
``lifecycle.replay`` must report for it — ``[]`` for a valid session.

The generator keeps a model of the session *surface* (the ordered list of visible nodes), so
compactions shadow real contiguous ranges, ``shadowedTokenCount`` is the estimator's price of
those nodes, and after an earlier replacement a later ``shadowedRange`` can have ``start > end``
exactly as the seed describes.

Every event is representable in the ``SessionEvent`` Avro schema (the faults are in the values,
not the types), so samples can be produced through the wire codec. Produce every event of a
sample with key ``SampleSession.session_id`` (the ``event.session_mismatch`` scenario holds one
event whose ``sessionId`` names another session: it is misrouted *by content*, not by key). The
``session.seq_*`` scenarios hold events whose ``seq`` is not above the last one (a redelivery, a
reused seq, a late seq): produce the events in list order.

Public API: ``valid_session(seed, ...)``, ``broken_session(scenario, seed)``, ``SCENARIOS``,
``sample_sessions(seed, count, broken_ratio)``, ``generate_sessions(seed, ...)``.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import lifecycle
from .tokens import price_message, text_block, tool_call_block

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

_TOPICS = [
    "the quarterly revenue report", "a flaky integration test", "the database migration plan",
    "the onboarding checklist", "a memory leak in the worker", "the Kafka partitioning scheme",
    "the holiday travel itinerary", "the API rate limits", "a customer escalation", "the release notes",
]
_USER = [
    "Can you look into {t}?", "I need a summary of {t} before the meeting.",
    "What changed in {t} since last week?", "Please draft a plan for {t}. \U0001F680",
    "Remind me what we decided about {t}.", "Compare the two options for {t}, briefly.",
]
_ASSISTANT = [
    "I looked at {t}. The main points are the timeline, the owners and the open risks.",
    "Here is a short plan for {t}: first gather the data, then review it with the team, then ship.",
    "The latest version of {t} changes three things; the biggest one is the retry policy.",
    "Done. I updated {t} and left comments where a decision is still needed \u2705.",
    "There are two viable options for {t}; the second is cheaper but slower to roll out \U0001F914.",
]
_TOOLS = [
    ("read_file", lambda r: json.dumps({"path": f"docs/{r.choice(['plan', 'notes', 'report'])}-{r.randint(1, 99)}.md"})),
    ("search", lambda r: json.dumps({"query": r.choice(_TOPICS), "limit": r.randint(3, 20)})),
    ("run_tests", lambda r: json.dumps({"target": f"tests/test_{r.choice(['api', 'db', 'worker'])}.py", "verbose": True})),
]
_PROVIDERS = [("anthropic", "claude-sonnet-4"), ("deepseek", "deepseek-chat"), ("openai", "gpt-4.1-mini"), ("local", "llama-3.1-8b")]


@dataclass
class SampleSession:
    session_id: str
    scenario: str  # "valid" or the name of the fault injected
    events: list[dict[str, Any]]
    expected: list[str] = field(default_factory=list)  # sorted rule ids, with multiplicity


class _Builder:
    def __init__(self, rng: random.Random, session_id: str, explicit_turns: bool):
        self.rng = rng
        self.sid = session_id
        self.explicit = explicit_turns
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self.ts = T0 + rng.randint(0, 30 * 86_400_000)
        self.surface: list[tuple[int, str, list[dict[str, Any]]]] = []  # (seq, role, content)
        self.turn = 0
        self.in_turn = False
        self.n_compactions = 0
        self.n_commands = 0

    # -- raw events -------------------------------------------------------------------------
    def emit(self, type_: str, data: dict[str, Any], ignorable: bool = False, session_id: str | None = None) -> int:
        self.seq += 1
        self.ts += self.rng.randint(20, 3000)
        self.events.append({
            "sessionId": session_id or self.sid, "seq": self.seq, "type": type_, "ts": self.ts,
            "ignorable": ignorable, "data": data,
        })
        return self.seq

    def surface_event(self, type_: str, role: str, content: list[dict[str, Any]], op: str = "append",
                      source: list[int] | None = None, turn: int | None = None) -> int:
        return self.emit(type_, {"role": role, "content": content, "surfaceOp": op,
                                 "sourceEventSeqs": list(source or []), "turn": turn})

    def generic(self, type_: str, payload: dict[str, Any], ignorable: bool = False) -> int:
        return self.emit(type_, {"json": json.dumps(payload, separators=(",", ":"))}, ignorable=ignorable)

    def append(self, type_: str, role: str, content: list[dict[str, Any]]) -> int:
        seq = self.surface_event(type_, role, content, turn=self.turn if self.in_turn else None)
        self.surface.append((seq, role, content))
        return seq

    # -- conversation ----------------------------------------------------------------------
    def text(self, pool: list[str]) -> str:
        return self.rng.choice(pool).format(t=self.rng.choice(_TOPICS))

    def begin_turn(self) -> None:
        self.turn += 1
        self.in_turn = True
        if self.explicit:
            self.generic("turn/start", {"turn": self.turn})
        self.append("user/message", "user", [text_block(self.text(_USER))])

    def reply(self) -> None:
        for _ in range(self.rng.randint(0, 2)):
            name, args = self.rng.choice(_TOOLS)
            self.append("assistant/message", "assistant", [text_block("Let me check."), tool_call_block(name, args(self.rng))])
            lines = [self.text(_ASSISTANT) for _ in range(self.rng.randint(2, 8))]
            self.append("tool/result", "tool", [text_block("\n".join(lines))])
        self.append("assistant/message", "assistant", [text_block(" ".join(self.text(_ASSISTANT) for _ in range(self.rng.randint(1, 3))))])

    def end_turn(self) -> None:
        if self.explicit:
            self.generic("turn/end", {"turn": self.turn})
        self.in_turn = False

    def telemetry(self) -> None:
        self.generic("ui/render", {"frame": self.rng.randint(1, 10_000)}, ignorable=True)

    # -- compaction ------------------------------------------------------------------------
    def pick_range(self, min_len: int = 2) -> tuple[int, int] | None:
        """A contiguous [i, j) slice of the surface, leaving the newest two nodes alone."""
        usable = len(self.surface) - 2
        if usable < min_len:
            return None
        length = self.rng.randint(min_len, min(usable, 8))
        i = self.rng.randint(0, usable - length)
        return i, i + length

    def priced(self, i: int, j: int) -> tuple[list[int], int]:
        nodes = self.surface[i:j]
        return [n[0] for n in nodes], sum(price_message(n[1], n[2]) for n in nodes)

    def replace(self, i: int, j: int, type_: str, role: str, content: list[dict[str, Any]],
                source: list[int] | None = None) -> int:
        seqs = [n[0] for n in self.surface[i:j]]
        seq = self.surface_event(type_, role, content, op="replace", source=source if source is not None else seqs,
                                 turn=self.turn if self.in_turn else None)
        self.surface[i:j] = [(seq, role, content)]
        return seq

    def new_cid(self) -> str:
        self.n_compactions += 1
        return f"cmp-{self.sid[-6:]}-{self.n_compactions:03d}"

    def summary_data(self, cid: str, command: str | None, seqs: list[int], price: int, **over: Any) -> dict[str, Any]:
        provider, model = self.rng.choice(_PROVIDERS)
        text = f"Summary of {len(seqs)} earlier messages: discussed {self.rng.choice(_TOPICS)}; next step agreed."
        summary = [text_block(text)]
        marked = self.rng.random() < 0.7
        inp = price + self.rng.randint(50, 400)
        out = self.rng.randint(20, 200)
        data = {
            "compactionId": cid, "sourceCommandId": command, "summary": summary,
            "shadowedRange": {"start": seqs[0], "end": seqs[-1]}, "shadowedSeqs": seqs,
            "shadowedTokenCount": price, "provider": provider, "model": model,
            "maxTokens": self.rng.choice([None, 1024, 2048, 4096]),
            "usage": {"inputTokens": inp, "outputTokens": out, "totalTokens": inp + out},
            "rawOutput": [text_block("<summary>" + text + "</summary>")] if marked else None,
            "llmStreamCall": True if marked else None,
        }
        data.update(over)
        return data

    def compaction(self, *, manual: bool = False, fail: bool = False, owner: Any = "auto",
                   end_owner: Any = "auto", summary_over: dict[str, Any] | None = None,
                   between: Callable[[], None] | None = None, replace_source: Callable[[list[int]], list[int]] | None = None,
                   skip_summary: bool = False, second_summary: bool = False, cid: str | None = None,
                   after_replace: Callable[[], None] | None = None) -> str:
        """One compaction: start, summary, replacement, end (or start, end(error))."""
        cid = cid or self.new_cid()
        command = None
        if manual:
            self.n_commands += 1
            command = f"cmd-{self.n_commands}"
        turn = None if manual else self.turn
        if owner != "auto":
            turn = owner
        self.emit("compaction/start", {"compactionId": cid, "sourceCommandId": command, "turn": turn})
        end_turn = turn if end_owner == "auto" else end_owner
        rng_ = self.pick_range()
        if fail or skip_summary or rng_ is None:
            err = "summarizer timed out" if fail else None if skip_summary else "nothing to compact"
            self.emit("compaction/end", {"compactionId": cid, "sourceCommandId": command, "turn": end_turn, "error": err})
            return cid
        for k in range(2 if second_summary else 1):
            if k == 1:
                rng_ = self.pick_range(min_len=1)
                assert rng_ is not None, "warm_up leaves room for two ranges"
            i, j = rng_
            seqs, price = self.priced(i, j)
            data = self.summary_data(cid, command, seqs, price, **(summary_over or {}))
            self.emit("compaction/summary", data)
            if between:
                between()
            source = replace_source(seqs) if replace_source else seqs
            self.replace(i, j, "user/message", "user", data["summary"], source=source)
        if after_replace:
            after_replace()
        self.emit("compaction/end", {"compactionId": cid, "sourceCommandId": command, "turn": end_turn, "error": None})
        return cid

    def prune(self, *, count_over: Any = None, between: Callable[[], None] | None = None, no_replace: bool = False) -> bool:
        idx = [k for k, n in enumerate(self.surface[:-2]) if n[1] == "tool"]
        if not idx:
            return False
        i = self.rng.choice(idx)
        seqs, price = self.priced(i, i + 1)
        count = price if count_over is None else count_over
        self.emit("compaction/prune", {"shadowedRange": {"start": seqs[0], "end": seqs[-1]}, "shadowedSeqs": seqs,
                                       "shadowedTokenCount": count})
        if between:
            between()
        if not no_replace:
            self.replace(i, i + 1, "tool/result", "tool", [text_block(f"[tool output pruned: {price} tokens]")])
        return True

    # -- whole turns -------------------------------------------------------------------------
    def normal_turn(self, compaction_p: float = 0.3, prune_p: float = 0.25) -> None:
        self.begin_turn()
        self.reply()
        if self.rng.random() < compaction_p:
            self.compaction(fail=self.rng.random() < 0.15)
        if self.rng.random() < prune_p:
            self.prune()
        if self.rng.random() < 0.3:
            self.append("user/message", "user", [text_block(self.text(_USER))])
            self.reply()
        self.end_turn()
        if self.rng.random() < 0.15:
            self.compaction(manual=True)
        if self.rng.random() < 0.2:
            self.telemetry()

    def warm_up(self, turns: int = 2) -> None:
        for _ in range(turns):
            self.normal_turn(compaction_p=0.0, prune_p=0.0)
        # make sure there is a tool node and room for ranges
        self.begin_turn()
        while not any(n[1] == "tool" for n in self.surface[:-2]):
            name, args = self.rng.choice(_TOOLS)
            self.append("assistant/message", "assistant", [tool_call_block(name, args(self.rng))])
            self.append("tool/result", "tool", [text_block(self.text(_ASSISTANT))])
        while len(self.surface) < 10:
            self.append("assistant/message", "assistant", [text_block(self.text(_ASSISTANT))])


def _session_id(rng: random.Random, prefix: str = "s") -> str:
    return f"{prefix}-{rng.getrandbits(48):012x}"


def valid_session(seed: int, turns: int | None = None, session_id: str | None = None) -> SampleSession:
    """A realistic session with summarizing compactions (in-turn and manual), failed attempts,
    prunes and ignorable telemetry — no rule broken."""
    rng = random.Random(seed)
    sid = session_id or _session_id(rng)
    b = _Builder(rng, sid, explicit_turns=rng.random() < 0.6)
    for k in range(turns if turns is not None else rng.randint(4, 12)):
        b.normal_turn(compaction_p=0.6 if k >= 2 else 0.0)
    return SampleSession(sid, "valid", b.events, [])


# --------------------------------------------------------------------------------------------
# fault injection: each scenario plays a valid prefix, the fault, then a valid suffix


def _fault(b: _Builder, name: str) -> list[str]:
    """Inject fault ``name`` into an open turn of builder ``b``; returns the expected rule ids."""
    r = b.rng
    if name == "lock.second_start":
        b.emit("compaction/start", {"compactionId": b.new_cid(), "sourceCommandId": None, "turn": b.turn})
        b.compaction()
        return ["lock.second_start"]
    if name == "lock.reused_id":
        cid = b.compaction()
        b.compaction(cid=cid)
        return ["lock.reused_id"]
    if name == "lock.end_not_open":
        b.emit("compaction/end", {"compactionId": "cmp-ghost", "sourceCommandId": None, "turn": b.turn, "error": None})
        return ["lock.end_not_open"]
    if name == "lock.end_twice":
        cid = b.compaction()
        b.emit("compaction/end", {"compactionId": cid, "sourceCommandId": None, "turn": b.turn, "error": None})
        return ["lock.end_not_open"]
    if name == "lock.owner_mismatch":
        b.compaction(end_owner=b.turn + 1)
        return ["lock.owner_mismatch"]
    if name == "turn.not_open":
        b.compaction(owner=b.turn + r.randint(1, 5) * r.choice([1, -1]))
        return ["turn.not_open"]
    if name == "turn.null_inside_turn":
        b.compaction(owner=None)
        return ["turn.null_inside_turn"]
    if name == "turn.enclosure":
        def close_turn() -> None:
            b.end_turn()
            b.begin_turn()
        owner = b.turn
        b.compaction(owner=owner, after_replace=close_turn)
        return ["turn.enclosure"]
    if name == "turn.crosses_standalone":
        # a manual (standalone) compaction between turns, and the next turn starts inside it
        b.end_turn()
        b.compaction(manual=True, after_replace=b.begin_turn)
        return ["turn.crosses_standalone"]
    if name == "lock.stale_after_end_seed":
        # an inherited compaction never ended; the resumed writer marks the end of the seed,
        # compacts again in the same turn (valid), and a late end of the stale id is refused
        stale = b.new_cid()
        b.emit("compaction/start", {"compactionId": stale, "sourceCommandId": None, "turn": b.turn})
        b.generic("session/end-seed", {})
        b.compaction()
        b.emit("compaction/end", {"compactionId": stale, "sourceCommandId": None, "turn": b.turn, "error": None})
        return ["lock.end_not_open"]
    if name == "turn.orphan_crossing_retracted":
        # an inherited compaction never ended: crash repair closes its turn (the crossing is
        # reported at that boundary), then the resumed writer's end-seed proves the compaction an
        # orphan (the report is retracted on its ledger entry) and the session goes on
        b.emit("compaction/start", {"compactionId": b.new_cid(), "sourceCommandId": None, "turn": b.turn})
        b.end_turn()
        b.generic("session/end-seed", {})
        b.begin_turn()
        return ["turn.enclosure"]
    if name == "event.empty_id":
        b.emit("compaction/start", {"compactionId": b.new_cid(), "sourceCommandId": "", "turn": b.turn})
        return ["event.empty_id"]
    if name == "summary.owner_mismatch":
        b.compaction(summary_over={"sourceCommandId": "cmd-elsewhere"})
        return ["summary.owner_mismatch"]
    if name == "summary.not_open":
        i, j = b.pick_range()  # type: ignore[misc]
        seqs, price = b.priced(i, j)
        b.emit("compaction/summary", b.summary_data("cmp-orphan", None, seqs, price))
        b.replace(i, j, "user/message", "user", [text_block("orphan summary")])
        return ["summary.not_open"]
    if name == "summary.duplicate":
        b.compaction(second_summary=True)
        return ["summary.duplicate"]
    if name == "summary.raw_output_missing":
        b.compaction(summary_over={"llmStreamCall": True, "rawOutput": None})
        return ["summary.raw_output_missing"]
    if name == "end.missing_summary":
        b.compaction(skip_summary=True)
        return ["end.missing_summary"]
    if name == "meter.range_mismatch":
        return _range_fault(b)
    if name == "meter.bad_token_count":
        b.compaction(summary_over={"shadowedTokenCount": -r.randint(1, 500)})
        return ["meter.bad_token_count"]
    if name == "meter.bad_prune_count":
        b.prune(count_over=-r.randint(1, 50))
        return ["meter.bad_token_count"]
    if name == "shadow.not_adjacent":
        b.compaction(between=b.telemetry)
        return ["shadow.not_adjacent", "shadow.unclaimed_replace"]
    if name == "shadow.prune_not_replaced":
        b.prune(no_replace=True)
        b.append("assistant/message", "assistant", [text_block(b.text(_ASSISTANT))])
        return ["shadow.not_adjacent"]
    if name == "shadow.range_mismatch":
        b.compaction(replace_source=lambda seqs: seqs[:-1])
        return ["shadow.range_mismatch"]
    if name == "shadow.unclaimed_replace":
        i, j = b.pick_range()  # type: ignore[misc]
        b.replace(i, j, "user/message", "user", [text_block("a replacement nobody metered")])
        return ["shadow.unclaimed_replace"]
    if name == "event.unknown_type":
        b.generic("mystery/event", {"x": r.randint(0, 9)})
        return ["event.unknown_type"]
    if name == "event.malformed":
        b.generic("turn/start", {"turn": "three"})  # Avro-representable, but not an integer turn
        return ["event.malformed"]
    if name == "event.session_mismatch":
        b.emit("assistant/message", {"role": "assistant", "content": [text_block("misrouted")], "surfaceOp": "append",
                                     "sourceEventSeqs": [], "turn": None}, session_id=b.sid + "-other")
        return ["event.session_mismatch"]
    if name == "session.seq_reused":
        own = [e for e in b.events if e["sessionId"] == b.sid]
        orig = r.choice(own)
        b.events.append(copy.deepcopy(orig))  # a redelivery of the same event: skipped, no violation
        reused = copy.deepcopy(orig)
        reused["type"] = "user/message"
        reused["data"] = {"role": "user", "content": [text_block(f"another message reusing seq {orig['seq']}")],
                          "surfaceOp": "append", "sourceEventSeqs": [], "turn": None}
        b.events.append(reused)
        return ["session.seq_reused"]
    if name == "session.seq_out_of_order":
        b.telemetry()
        b.telemetry()
        b.events[-2], b.events[-1] = b.events[-1], b.events[-2]  # seq n+2 arrives before seq n+1
        return ["session.seq_out_of_order"]
    if name == "session.seq_unverifiable":
        first = copy.deepcopy(b.events[0])
        for _ in range(lifecycle.SEQ_WINDOW):  # the first event's fingerprint leaves the window
            b.telemetry()
        b.events.append(first)
        return ["session.seq_unverifiable"]
    if name == "event.over_limit":  # a compaction id over MEMSTREAM_MAX_LABEL_CHARS (default 128)
        b.emit("compaction/start", {"compactionId": "cmp-" + "x" * 200, "sourceCommandId": None, "turn": b.turn})
        return ["event.over_limit"]
    raise KeyError(name)


def _range_fault(b: _Builder) -> list[str]:
    """A summary whose shadowedRange is not (first, last) of shadowedSeqs; replacement is correct."""
    orig = b.summary_data

    def bad(cid: str, command: str | None, seqs: list[int], price: int, **over: Any) -> dict[str, Any]:
        data = orig(cid, command, seqs, price, **over)
        data["shadowedRange"] = {"start": seqs[0], "end": seqs[-1] + 1}
        return data

    b.summary_data = bad  # type: ignore[method-assign]
    try:
        b.compaction()
    finally:
        b.summary_data = orig  # type: ignore[method-assign]
    return ["meter.range_mismatch"]


SCENARIOS: tuple[str, ...] = (
    "lock.second_start", "lock.reused_id", "lock.end_not_open", "lock.end_twice", "lock.owner_mismatch",
    "turn.not_open", "turn.null_inside_turn", "turn.enclosure", "turn.crosses_standalone",
    "lock.stale_after_end_seed", "event.empty_id", "summary.owner_mismatch",
    "summary.not_open", "summary.duplicate", "summary.raw_output_missing", "end.missing_summary",
    "meter.range_mismatch", "meter.bad_token_count", "meter.bad_prune_count",
    "shadow.not_adjacent", "shadow.prune_not_replaced", "shadow.range_mismatch", "shadow.unclaimed_replace",
    "event.unknown_type", "event.malformed", "event.session_mismatch", "event.over_limit",
    "session.seq_reused", "session.seq_out_of_order", "session.seq_unverifiable",
    "turn.orphan_crossing_retracted",
)


def broken_session(scenario: str, seed: int) -> SampleSession:
    """A realistic session with exactly one injected fault; ``expected`` lists the rule ids."""
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    rng = random.Random(f"{scenario}/{seed}")
    sid = _session_id(rng, "sx")
    # turn.null_inside_turn is only enforced once turn boundaries are explicit, and only an
    # explicit boundary is repair of an inherited orphan
    explicit = (True if scenario in ("turn.null_inside_turn", "turn.crosses_standalone", "turn.orphan_crossing_retracted")
                else rng.random() < 0.5)
    b = _Builder(rng, sid, explicit_turns=explicit)
    b.warm_up(rng.randint(1, 3))  # leaves a turn open, with tool nodes and room for ranges
    expected = _fault(b, scenario)
    b.reply()
    b.end_turn()
    for _ in range(rng.randint(1, 3)):  # the session keeps being tracked afterwards
        b.normal_turn(compaction_p=0.7)
    return SampleSession(sid, scenario, b.events, sorted(expected))


def sample_sessions(seed: int, count: int, broken_ratio: float = 0.25) -> list[SampleSession]:
    """``count`` sessions, about ``broken_ratio`` of them with one injected fault each."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        sub = rng.getrandbits(32)
        if rng.random() < broken_ratio:
            out.append(broken_session(rng.choice(SCENARIOS), sub))
        else:
            out.append(valid_session(sub))
    return out


def generate_sessions(seed: int, count: int = 8, broken_ratio: float = 0.25,
                      every_scenario: bool = False) -> list[SampleSession]:
    """The sessions ``memstream generate`` and the demo produce: ``count`` sessions mixed as in
    ``sample_sessions``; with ``every_scenario`` one broken session per scenario is appended."""
    out = sample_sessions(seed, count, broken_ratio)
    if every_scenario:
        out += [broken_session(sc, seed) for sc in SCENARIOS]
    return out
