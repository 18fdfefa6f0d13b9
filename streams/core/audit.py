"""Missed-memory audit (SPEC §4.6, seed memory-events ``MemoryAuditPayload``).

From one UserTurn (``memory.turns.v1``) find memory-worthy statements the model did not tag,
and describe them in a ``memory_audit`` event (local-only: the relay never forwards it).

Detection (:func:`detect_untagged_patterns`) — regex heuristics, case-insensitive, applied
per *sentence* (split after ``.``, ``!``, ``?``, ``…`` or at line breaks):

============== ================================================================================
label          the sentence contains (user message)
============== ================================================================================
preference     "I prefer / like / love / hate / dislike / enjoy / always / never / can't stand /
               don't like …", "my favo(u)rite …"
personal_fact  "my name is", "I live in", "I work as/at/for/in", "I'm a/an …", "I am a/an …",
               "I'm from", "I was born", "my wife/husband/son/daughter/… is/'s …", "I have a …"
goal           "I want to", "my goal is", "I'm trying to", "I plan to", "I'm planning to",
               "I hope to", "I intend to", "I aim to", "my plan is"
correction     a sentence starting "actually", "no, I meant", "I meant", "that's wrong / not
               right / incorrect", "not X but Y", "X, not Y"
============== ================================================================================

plus **preference** in the agent's reply: "you prefer / like / love / hate / enjoy …"
(optionally "you seem to / really / usually / always / tend to …"), "your favo(u)rite".

Questions (a sentence ending in ``?``) are never findings: they ask, they do not state.

Coverage: a finding is dropped when every match of it is *covered* by a memory tagged in
the turn. The text compared is the clause around the match (the sentence cut at ``,`` ``;``
``:`` and " and / but / so "), so "My name is Ada and I work as a nurse" with the name tagged
still reports the job. A clause is covered by a tagged memory when their polarity agrees
(both or neither negated, :func:`~streams.core.similarity.has_negation`) and either

* content-word overlap: ``|A ∩ B| / min(|A|, |B|) >= overlap_threshold`` (0.75) with at least
  ``min(2, |A|, |B|)`` shared words — A, B = the content words (stop words, pronouns and
  "user" dropped, a plural/3rd-person ``s`` stripped) — this matches "I prefer window seats"
  with "The user prefers window seats"; or
* ``text_similarity`` (the consolidation measure, :mod:`streams.core.similarity`)
  ``>= similarity_threshold`` (0.6).

Output format: ``label: "excerpt"`` exactly — the label, a colon, one space, the excerpt in
double quotes. The excerpt is the matching sentence, whitespace-trimmed and collapsed, any
``"`` in it replaced by ``'`` (so the quoting stays unambiguous), capped at
:data:`EXCERPT_MAX_CHARS`. One finding per (label, sentence); order: user-message findings in
sentence order (labels in the order preference, personal_fact, goal, correction), then reply
findings; duplicates removed.

Lengths: ``turn_message`` is the first 200 *code points* of the user message (Python ``str``
indexing), not UTF-16 code units as a JavaScript ``slice`` would count: a message with
astral characters (emoji) keeps up to 200 of them here, fewer in the reference emitter. A
grapheme cluster (e.g. a ZWJ emoji sequence) may be cut; no code point is ever split.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ids import TURN, event_id_for, input_reference
from .similarity import has_negation, normalize_text, text_similarity

TURN_MESSAGE_MAX_CHARS = 200
EXCERPT_MAX_CHARS = 200
LABELS: tuple[str, ...] = ("preference", "personal_fact", "goal", "correction")

_F = re.IGNORECASE
_I = r"(?<!\bwhat\s)(?<!\bif\s)\bI"  # the pronoun "I" as a word (not "what I like", "if I want")
_ADV = r"(?:\s+(?:really|truly|usually|generally|always|also|still|just|absolutely|definitely|do|actually))?"

_USER_PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "preference": (
        re.compile(
            _I + _ADV + r"\s+(?:prefer|like|love|hate|dislike|enjoy|adore|detest|always|never|can'?t\s+stand|"
            r"don'?t\s+like|do\s+not\s+like|don'?t\s+want|do\s+not\s+want)\b",
            _F,
        ),
        re.compile(r"\bmy\s+fav(?:ou)?rite\b", _F),
    ),
    "personal_fact": (
        re.compile(r"\bmy\s+name\s+is\b", _F),
        re.compile(_I + r"\s+(?:live|lived)\s+in\b", _F),
        re.compile(_I + r"\s+work\s+(?:as|at|for|in)\b", _F),
        re.compile(r"\b(?:I'?m|I\s+am)\s+(?:an?|the)\s+(?!bit\b|little\b|lot\b|fan\b)\w", _F),
        re.compile(r"\b(?:I'?m|I\s+am)\s+from\b|" + _I + r"\s+was\s+born\b", _F),
        re.compile(
            r"\bmy\s+(?:wife|husband|partner|son|daughter|kids?|children|sister|brother|mother|father|mom|mum|dad|"
            r"parents?|dog|cat|birthday|age|address|email|phone)(?:'s)?\b(?:\s+(?:is|are|was|name\s+is|lives?|works?))?",
            _F,
        ),
        re.compile(
            _I + r"\s+have\s+(?:a|an|one|two|three|four|\d+)\s+(?:\w+\s+)?(?:sons?|daughters?|kids?|children|"
            r"brothers?|sisters?|dogs?|cats?|allerg\w*)\b|\b(?:I'?m|I\s+am)\s+allergic\b",
            _F,
        ),
    ),
    "goal": (
        re.compile(
            _I + r"\s+(?:want|plan|hope|intend|aim)\s+to\b|\b(?:I'?m|I\s+am)\s+(?:trying|planning|hoping|aiming)\s+to\b",
            _F,
        ),
        re.compile(r"\bmy\s+(?:goal|plan|aim|dream|resolution)\s+is\b", _F),
    ),
    "correction": (
        re.compile(r"^\W*actually\b", _F),
        re.compile(r"\b(?:no,?\s+)?I\s+meant\b", _F),
        re.compile(r"\bthat(?:'s|\s+is|\s+was)\s+(?:wrong|not\s+right|not\s+correct|incorrect|not\s+true)\b", _F),
        re.compile(r"\bnot\s+[^.!?;,]{1,60}?,?\s+but\s+\w", _F),
        re.compile(r",\s*not\s+(?:the\s+|a\s+|an\s+)?\w[^,;]*$", _F),
        re.compile(r"^\W*(?:no|nope),\s", _F),
    ),
}

_REPLY_PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "preference": (
        re.compile(
            r"(?<!\bif\s)(?<!\bas\s)(?<!whatever\s)(?<!anything\s)(?<!what\s)\byou"
            r"(?:\s+(?:seem\s+to|tend\s+to|really|usually|generally|always|also|still|clearly|do|don'?t|mostly))?"
            r"\s+(?:prefer|like|love|hate|dislike|enjoy)\b",
            _F,
        ),
        re.compile(r"\byour\s+fav(?:ou)?rite\b", _F),
    ),
}

_SENTENCE = re.compile(r"[^.!?…\n]+(?:[.!?…]+|\n|$)")
_CLAUSE_SPLIT = re.compile(r"[,;:]|\s(?:and|but|so|because)\s", re.IGNORECASE)
_APOSTROPHE = re.compile(r"[\u2019\u2018\u02bc`\u00b4]")

_STOP = frozenset(
    """a an the and or but so of to in on at for with from by as is are was were be been being am
    i im ive id me my mine you your youre yours he she it its we our they them their theirs this that
    these those there here do does did have has had will would shall should can could may might must
    user users the user about into than then just also very really not no yes to up out if when while
    what which who whom whose where how why""".split()
) - {"not", "no"}


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """Normalized content words (stop words dropped, a trailing ``s`` stripped)."""
    return {_stem(w) for w in normalize_text(text).split() if w not in _STOP}


@dataclass(frozen=True)
class AuditPolicy:
    overlap_threshold: float = 0.75
    similarity_threshold: float = 0.6
    excerpt_max_chars: int = EXCERPT_MAX_CHARS
    turn_message_max_chars: int = TURN_MESSAGE_MAX_CHARS


_DEFAULT_POLICY = AuditPolicy()


def sentences(text: str) -> list[str]:
    """The sentences of ``text`` (each with its end punctuation, untrimmed)."""
    if not text:
        return []
    return [m.group(0) for m in _SENTENCE.finditer(text) if m.group(0).strip()]


def _clause_at(sentence: str, pos: int) -> str:
    start, end = 0, len(sentence)
    for m in _CLAUSE_SPLIT.finditer(sentence):
        if m.end() <= pos:
            start = m.end()
        elif m.start() >= pos:
            end = m.start()
            break
    return sentence[start:end]


def covered_by(clause: str, tagged: str, policy: AuditPolicy = _DEFAULT_POLICY) -> bool:
    """True when the tagged memory ``tagged`` already says what ``clause`` says (see the
    module doc)."""
    if has_negation(clause) != has_negation(tagged):
        return False
    a, b = content_words(clause), content_words(tagged)
    if a and b:
        inter = len(a & b)
        if inter >= min(2, len(a), len(b)) and inter / min(len(a), len(b)) >= policy.overlap_threshold:
            return True
    return text_similarity(clause, tagged) >= policy.similarity_threshold


def excerpt_of(sentence: str, max_chars: int = EXCERPT_MAX_CHARS) -> str:
    text = " ".join(sentence.split()).replace('"', "'")
    return text[:max_chars].rstrip()


def format_finding(label: str, excerpt: str) -> str:
    """``label: "excerpt"`` — exactly the seed's ``<label>: "<excerpt>"``."""
    return f'{label}: "{excerpt}"'


def _scan(
    text: str | None,
    patterns: Mapping[str, Sequence[re.Pattern[str]]],
    tagged: Sequence[str],
    policy: AuditPolicy,
) -> list[str]:
    out: list[str] = []
    for sentence in sentences(text or ""):
        body = sentence.strip()
        if body.endswith("?"):
            continue  # a question states nothing
        probe = _APOSTROPHE.sub("'", body)  # same length: match positions are body positions
        for label in LABELS:
            matches = [m for rx in patterns.get(label, ()) for m in rx.finditer(probe)]
            if not matches:
                continue
            clauses = [_clause_at(body, m.start()) for m in matches]
            if tagged and all(any(covered_by(c, t, policy) for t in tagged) for c in clauses):
                continue
            excerpt = excerpt_of(body, policy.excerpt_max_chars)
            if excerpt:
                out.append(format_finding(label, excerpt))
    return out


def detect_untagged_patterns(
    user_message: str,
    agent_reply: str | None = None,
    tagged_memories: Iterable[str] = (),
    policy: AuditPolicy | None = None,
) -> list[str]:
    """``label: "excerpt"`` strings for the memory-worthy statements of the turn that no
    tagged memory covers (see the module doc for patterns, coverage and format)."""
    policy = policy or _DEFAULT_POLICY
    tagged = [t for t in tagged_memories if isinstance(t, str) and t.strip()]
    found = _scan(user_message, _USER_PATTERNS, tagged, policy) + _scan(agent_reply, _REPLY_PATTERNS, tagged, policy)
    seen: set[str] = set()
    unique = []
    for f in found:
        if f not in seen:
            seen.add(f)
            unique.append(f)
    return unique


def cap_turn_message(message: str, max_chars: int = TURN_MESSAGE_MAX_CHARS) -> str:
    """The first ``max_chars`` code points of the message (see the module doc)."""
    return message[:max_chars]


def audit_event_id(motebit_id: str, turn_id: str) -> str:
    """One audit per turn: re-processing the turn after a crash yields the same id."""
    return event_id_for(motebit_id, turn_id, "memory_audit")


def audit_event(
    turn: Mapping[str, Any],
    findings: Sequence[str],
    *,
    version_clock: int = 0,
    policy: AuditPolicy | None = None,
) -> dict[str, Any] | None:
    """The ``memory_audit`` MemoryEvent for ``turn`` (a UserTurn dict), or None when there
    are no findings. Timestamp = the turn's; ``version_clock`` as the caller orders it
    (e.g. ``UserMemory.next_clock()``)."""
    if not findings:
        return None
    policy = policy or _DEFAULT_POLICY
    user = turn["motebit_id"]
    return {
        "event_id": audit_event_id(user, turn["turn_id"]),
        "motebit_id": user,
        "device_id": None,
        "timestamp": int(turn["timestamp"]),
        "version_clock": int(version_clock),
        "event_type": "memory_audit",
        "payload": {
            "missed_patterns": list(findings),
            "turn_message": cap_turn_message(turn.get("user_message") or "", policy.turn_message_max_chars),
        },
        "caused_by": input_reference(TURN, turn["turn_id"]),
    }


def audit_turn(
    turn: Mapping[str, Any], *, version_clock: int = 0, policy: AuditPolicy | None = None
) -> dict[str, Any] | None:
    """Detect + build: the ``memory_audit`` event of a UserTurn, or None."""
    findings = detect_untagged_patterns(
        turn.get("user_message") or "", turn.get("agent_reply"), turn.get("tagged_memories") or (), policy
    )
    return audit_event(turn, findings, version_clock=version_clock, policy=policy)
