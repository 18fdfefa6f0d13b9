from hypothesis import given
from hypothesis import strategies as st

from streams.core.hints import hints_record, is_instruction_entry, read_header_hints


def test_pinned_only_exact_literal_true():
    assert read_header_hints(["pinned: true"]) == {"pinned": True}
    assert read_header_hints(["pinned:true"]) == {"pinned": True}
    assert read_header_hints(["pinned:   true   "]) == {"pinned": True}
    for bad in ("pinned: True", "pinned: yes", "pinned: 1", "pinned: false", "pinned:", "pinned: true!", "pinned: tru e"):
        assert read_header_hints([bad]) == {}, bad


def test_triggers_split_trim_and_drop_empties():
    assert read_header_hints(["triggers: a, b ,c"]) == {"triggers": ["a", "b", "c"]}
    assert read_header_hints(["triggers: , deploy,, ,release notes ,"]) == {"triggers": ["deploy", "release notes"]}
    assert read_header_hints(["triggers:"]) == {}
    assert read_header_hints(["triggers: , ,  ,"]) == {}


def test_last_confirmed_needs_iso_date_shape_and_is_kept_raw():
    assert read_header_hints(["last-confirmed: 2024-05-01"]) == {"lastConfirmedAt": "2024-05-01"}
    assert read_header_hints(["last-confirmed: 2024-05-01T10:00:00Z (by hand)"]) == {
        "lastConfirmedAt": "2024-05-01T10:00:00Z (by hand)"
    }
    for bad in ("last-confirmed: yesterday", "last-confirmed: 24-05-01", "last-confirmed: 2024/05/01", "last-confirmed:", "last-confirmed: 2024-5-1"):
        assert read_header_hints([bad]) == {}, bad


def test_applies_when_non_empty_trimmed():
    assert read_header_hints(["applies-when:   writing SQL migrations  "]) == {"appliesWhen": "writing SQL migrations"}
    assert read_header_hints(["applies-when:    "]) == {}


def test_first_well_formed_line_of_each_key_wins():
    extra = [
        "pinned: yes",  # malformed: absent, does not block the next one
        "triggers: ,",  # malformed
        "pinned: true",
        "triggers: first",
        "triggers: second",
        "applies-when: one",
        "applies-when: two",
        "last-confirmed: nope",
        "last-confirmed: 2023-01-02",
        "last-confirmed: 2024-01-02",
    ]
    assert read_header_hints(extra) == {
        "pinned": True,
        "triggers": ["first"],
        "appliesWhen": "one",
        "lastConfirmedAt": "2023-01-02",
    }


def test_not_hint_lines_are_ignored():
    extra = ["  pinned: true", "Pinned: true", "pinned : true", "name: x", "", "#pinned: true", None, 42, b"pinned: true"]
    assert read_header_hints(extra) == {}
    assert read_header_hints(None) == {}
    assert read_header_hints("pinned: true") == {}  # a bare string is not a list of lines


def test_hints_record_has_every_field():
    assert hints_record(read_header_hints(["triggers: x"])) == {
        "pinned": None, "triggers": ["x"], "lastConfirmedAt": None, "appliesWhen": None,
    }


def test_instruction_predicate():
    assert is_instruction_entry("feedback", None)
    assert is_instruction_entry(None, ["pinned: true"])
    assert is_instruction_entry("user", ["triggers: deploy"])
    assert is_instruction_entry("project", ["applies-when: on call"])
    assert not is_instruction_entry(None, ["last-confirmed: 2024-01-01"])  # bookkeeping only
    assert not is_instruction_entry("user", ["pinned: false", "triggers: ,", "applies-when:"])
    assert not is_instruction_entry("Feedback", [])
    assert not is_instruction_entry(None, None)


line_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
keys = st.sampled_from(["pinned", "triggers", "last-confirmed", "applies-when", "other", "Pinned", " pinned"])
lines = st.one_of(line_text, st.builds(lambda k, v: f"{k}:{v}", keys, line_text), st.integers(), st.none())


@given(st.lists(lines, max_size=12))
def test_parser_is_total_and_well_typed(extra):
    hints = read_header_hints(extra)
    assert set(hints) <= {"pinned", "triggers", "lastConfirmedAt", "appliesWhen"}
    if "pinned" in hints:
        assert hints["pinned"] is True
    if "triggers" in hints:
        assert hints["triggers"] and all(t and t == t.strip() for t in hints["triggers"])
    if "appliesWhen" in hints:
        assert hints["appliesWhen"] and hints["appliesWhen"] == hints["appliesWhen"].strip()
    # the predicate is exactly "feedback or one of the three privileges"
    assert is_instruction_entry(None, extra) == bool({"pinned", "triggers", "appliesWhen"} & set(hints))


@given(st.text(max_size=20).filter(lambda v: v.strip() != "true"))
def test_any_other_pinned_value_is_absent(value):
    assert "pinned" not in read_header_hints([f"pinned: {value}"])


@given(st.lists(st.sampled_from(["pinned: true", "pinned: no", "triggers: a", "triggers: b, c"]), max_size=6))
def test_first_wins_is_order_sensitive_only_among_well_formed(extra):
    hints = read_header_hints(extra)
    good_triggers = [line for line in extra if line.startswith("triggers")]
    if good_triggers:
        assert hints["triggers"] == read_header_hints([good_triggers[0]])["triggers"]
    assert hints.get("pinned") == (True if "pinned: true" in extra else None)
