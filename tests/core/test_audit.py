"""Missed-memory audit (streams/core/audit.py, SPEC §4.6)."""

import json
import re
from pathlib import Path

import pytest
from fastavro import parse_schema
from fastavro.validation import validate
from hypothesis import given, strategies as st

from streams.core import UserMemory, process_event
from streams.core.audit import audit_event, audit_turn, covered_by, detect_untagged_patterns
from streams.core.ids import derive_id
from streams.core.redaction import relay_events
from streams.tools.generate import TURNS

FORMAT = re.compile(r'^(preference|personal_fact|goal|correction): "([^"]*)"$')
SCHEMA = parse_schema(json.loads((Path(__file__).resolve().parents[2] / "schemas" / "memory_event.avsc").read_text()))


def _turn(msg, reply=None, tagged=(), turn_id="t1", ts=1_700_000_000_000):
    return {"turn_id": turn_id, "motebit_id": "u1", "timestamp": ts, "user_message": msg,
            "agent_reply": reply, "tagged_memories": list(tagged)}


@pytest.mark.parametrize(
    "label,message",
    [
        ("preference", "I prefer window seats."),
        ("preference", "I really like jazz"),
        ("preference", "I love sushi!"),
        ("preference", "I hate waiting in line."),
        ("preference", "I always take the stairs."),
        ("preference", "I never drink coffee after 4pm."),
        ("preference", "My favourite colour is teal."),
        ("personal_fact", "My name is Ada."),
        ("personal_fact", "I live in Lisbon."),
        ("personal_fact", "I work as a nurse."),
        ("personal_fact", "I'm a vegetarian."),
        ("personal_fact", "I am an architect."),
        ("personal_fact", "I’m allergic to peanuts."),
        ("goal", "I want to run a marathon."),
        ("goal", "My goal is to learn Spanish."),
        ("goal", "I'm trying to save money."),
        ("goal", "I plan to move to Berlin next year."),
        ("correction", "Actually, the meeting is on Friday."),
        ("correction", "No, I meant the other restaurant."),
        ("correction", "That's wrong, it was Tuesday."),
        ("correction", "It's not blue but green."),
        ("correction", "The party is on the 12th, not the 21st."),
    ],
)
def test_each_label_is_detected_with_the_exact_format(label, message):
    found = detect_untagged_patterns(message, None, [])
    assert f'{label}: "{message}"' in found
    assert all(FORMAT.match(f) for f in found)


def test_preference_in_the_agent_reply():
    found = detect_untagged_patterns("Book me a flight to Oslo.", "Done. I know you prefer aisle seats, so I picked 12C.", [])
    assert found == ['preference: "I know you prefer aisle seats, so I picked 12C."']
    assert detect_untagged_patterns("ok", "You seem to prefer aggressive saving plans.", []) == [
        'preference: "You seem to prefer aggressive saving plans."']
    # reply phrases that are not statements about the user
    assert detect_untagged_patterns("ok", "We can meet on Monday if you like.", []) == []
    assert detect_untagged_patterns("ok", "Do you like sushi?", []) == []


@pytest.mark.parametrize(
    "message",
    [
        "What's the weather tomorrow?",
        "Can you tell me what I like?",
        "Do I prefer tea or coffee?",
        "Is my name spelled right?",
        "What do I want to eat tonight?",
        "Could you summarize this article for me",
        "Thanks, that works.",
        "I have a question about my order.",
        "I'm a bit tired today.",
        "I would like to book a table for two.",
        "Please send the invoice to the client.",
        "",
    ],
)
def test_no_false_positive_on_plain_questions_and_requests(message):
    assert detect_untagged_patterns(message, None, []) == []
    assert audit_turn(_turn(message)) is None


def test_tagged_memories_drop_what_they_cover():
    msg = "I prefer window seats when I fly."
    assert detect_untagged_patterns(msg, None, []) == [f'preference: "{msg}"']
    assert detect_untagged_patterns(msg, None, ["The user prefers window seats when flying."]) == []
    assert detect_untagged_patterns(msg, None, ["User prefers window seats"]) == []
    # a different fact on the same topic does not cover it; nor does the opposite polarity
    assert detect_untagged_patterns(msg, None, ["User prefers aisle seats"]) == [f'preference: "{msg}"']
    assert detect_untagged_patterns(msg, None, ["User never wants window seats"]) == [f'preference: "{msg}"']
    assert covered_by("I want to run a marathon", "User wants to run a marathon next spring")
    assert not covered_by("I want to run a marathon", "User likes tea")


def test_a_tagged_memory_covers_only_its_own_clause():
    msg = "My name is Ada and I work as a nurse at the Charité."
    assert detect_untagged_patterns(msg, None, ["The user's name is Ada."]) == [f'personal_fact: "{msg}"']
    both = ["The user's name is Ada.", "User works as a nurse at the Charité."]
    assert detect_untagged_patterns(msg, None, both) == []


def test_generator_turns():
    results = [detect_untagged_patterns(m, r, t) for m, r, t in TURNS]
    assert results[0] == ['preference: "I prefer window seats when I fly, and I always want vegetarian meals."']
    assert results[2] == ['goal: "I want to run a half marathon next spring."']
    assert 'correction: "Actually, my sister\'s birthday is on the 12th, not the 21st."' in results[3]
    assert results[4] == []
    assert results[5] == ['goal: "I\'m trying to save 500 euros a month for a new car."',
                          'preference: "You seem to prefer aggressive saving plans."']


def test_excerpt_is_the_trimmed_sentence_with_quotes_kept_unambiguous():
    found = detect_untagged_patterns('Hello there.   I  love "The Wire"\n and jazz!  What now?', None, [])
    assert found == ["preference: \"I love 'The Wire'\""]
    assert FORMAT.match(found[0])


def test_one_finding_per_label_and_sentence_and_no_duplicates():
    found = detect_untagged_patterns("I love tea and I love coffee. I love tea and I love coffee.", None, [])
    assert found == ['preference: "I love tea and I love coffee."']


def test_turn_message_is_capped_at_200_code_points():
    msg = "I want to learn the violin. " + "x" * 500
    ev = audit_turn(_turn(msg))
    assert ev["payload"]["turn_message"] == msg[:200] and len(ev["payload"]["turn_message"]) == 200
    emoji = "I love 🎻 music. " + "🎻" * 300  # astral code points: counted once each
    ev = audit_turn(_turn(emoji))
    assert ev["payload"]["turn_message"] == emoji[:200] and len(ev["payload"]["turn_message"]) == 200
    short = audit_turn(_turn("I love jazz."))
    assert short["payload"]["turn_message"] == "I love jazz."


def test_audit_event_shape_id_and_schema():
    turn = _turn("I want to run a marathon.", turn_id="turn-42")
    ev = audit_turn(turn, version_clock=5)
    assert ev["event_type"] == "memory_audit" and ev["event_id"] == derive_id("u1", "turn-42", "memory_audit")
    assert ev["timestamp"] == turn["timestamp"] and ev["version_clock"] == 5
    assert ev["payload"] == {"missed_patterns": ['goal: "I want to run a marathon."'], "turn_message": "I want to run a marathon."}
    assert audit_turn(turn)["event_id"] == ev["event_id"]  # re-processing the turn: same id
    assert audit_turn({**turn, "turn_id": "turn-43"})["event_id"] != ev["event_id"]
    assert validate(ev, SCHEMA, strict=True)
    assert audit_event(turn, []) is None
    # the core accepts it as a ledger event, and the relay never forwards it
    out = process_event(UserMemory("u1"), ev)
    assert out.applied and out.ledger[0]["event_type"] == "memory_audit"
    assert relay_events(ev, "secret") == []


_pieces = list("abcdefghij IiMmYy'’\",.!?\n") + ["I like ", "my name is ", "actually, ", "I want to ", "you prefer ", "🎻"]
texts = st.lists(st.sampled_from(_pieces), max_size=80).map("".join)


@given(texts, st.one_of(st.none(), texts), st.lists(texts, max_size=3))
def test_findings_always_have_the_exact_format_and_the_message_is_a_capped_prefix(msg, reply, tagged):
    found = detect_untagged_patterns(msg, reply, tagged)
    assert len(found) == len(set(found))
    for f in found:
        m = FORMAT.match(f)
        assert m and m.group(2) == m.group(2).strip() and m.group(2)
    ev = audit_turn(_turn(msg, reply, tagged))
    assert (ev is None) == (not found)
    if ev is not None:
        assert ev["payload"]["missed_patterns"] == found
        assert msg.startswith(ev["payload"]["turn_message"]) and len(ev["payload"]["turn_message"]) <= 200
