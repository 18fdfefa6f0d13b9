import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.ids import NAMESPACE, derive_id, event_id_for, node_id_for
from streams.core.vocabulary import (
    VocabularyError,
    max_sensitivity,
    normalize_action,
    normalize_source,
    sensitivity_rank,
    try_normalize_action,
)


def test_sensitivity_order():
    assert [sensitivity_rank(s) for s in ("none", "personal", "medical", "financial", "secret")] == [0, 1, 2, 3, 4]
    assert max_sensitivity("medical", "personal", "financial") == "financial"
    with pytest.raises(VocabularyError):
        sensitivity_rank("unknown")


def test_unknown_source_degrades_to_absent():
    assert normalize_source("user_stated") == "user_stated"
    assert normalize_source("consolidation_derived") == "consolidation_derived"
    for v in ("unknown", "USER_STATED", "admin", "", None, 3, ["user_stated"]):
        assert normalize_source(v) is None


def test_action_vocabularies():
    assert {a: normalize_action(a) for a in ("merge", "supersede", "reject", "accept", "add", "update", "reinforce", "noop")} == {
        "merge": "merge", "supersede": "supersede", "reject": "reject", "accept": "accept",
        "add": "accept", "update": "supersede", "reinforce": "merge", "noop": "merge",
    }
    for bad in ("unknown", "delete", "ADDED", " add", "", None, 1):
        with pytest.raises(VocabularyError):
            normalize_action(bad)
        assert try_normalize_action(bad) is None


def test_namespace_is_the_documented_constant():
    assert NAMESPACE == uuid.uuid5(uuid.NAMESPACE_URL, "https://memstream.dev/ns/derived-ids/v1")


@given(st.text(min_size=1), st.text(min_size=1), st.sampled_from(["memory_formed", "memory_consolidated", "node"]))
def test_derived_ids_are_deterministic_uuid5(user, source, role):
    a = derive_id(user, source, role)
    assert a == derive_id(user, source, role)
    u = uuid.UUID(a)
    assert u.version == 5
    assert a != derive_id(user + "x", source, role)
    assert a != derive_id(user, source + "x", role)
    assert a != derive_id(user, source, role + "x")


def test_helpers_are_roles_of_derive_id():
    assert node_id_for("u", "c1") == derive_id("u", "c1", "node")
    assert event_id_for("u", "c1", "memory_formed") == derive_id("u", "c1", "memory_formed")
    assert node_id_for("u", "c1") != event_id_for("u", "c1", "memory_formed")
    # the separator keeps ("a\x1fb", "c") and ("a", "b\x1fc") apart only if ids never contain it;
    # plain concatenation ambiguity ("ab","c") vs ("a","bc") is excluded:
    assert derive_id("ab", "c", "r") != derive_id("a", "bc", "r")


@pytest.mark.parametrize("spelling, wire", [("REINFORCE", "merge"), ("Noop", "merge"), ("ADD", "accept"),
                                            ("Update", "supersede"), ("MERGE", "merge"), ("Reject", "reject")])
def test_action_aliases_are_case_insensitive(spelling, wire):
    # motebit packages/memory-graph/src/consolidation.ts parseConsolidationResponse lower-cases
    # the decider's action before matching (its test suite: consolidation.test.ts)
    assert normalize_action(spelling) == wire
    assert try_normalize_action(spelling) == wire
