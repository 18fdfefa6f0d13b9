"""Every dead-letter `error_class` the code can produce is documented in docs/contract.md.

The classes are collected from the code itself: the rule codes passed to the pure core's
rejections (`Invalid`, `Rejection`, `_reject`, `GraphEventError`, `LimitExceeded`,
`NegotiatorError`), the rule ids the agents raise (`Rejected(..., "<code>")`), the prefixed ids
(`memory.*`, `graph.*`, `ship.*`, `session.*`), the families built with f-strings
(`missing_<field>`, `invalid_<field>`, `limit.<name>`, `ship.<kind>`), every `WireFormatError`
class (decode stage: its class name is the error class), the session rule ids and the graph-log
parse kinds.
"""

from __future__ import annotations

import re
from pathlib import Path

from streams.contracts import wire
from streams.runtime import app
from streams.sessions.lifecycle import RULES

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "contract.md").read_text()
SOURCES = {p: p.read_text() for p in sorted((ROOT / "streams").rglob("*.py"))}

_CALL = re.compile(r'(?:Invalid|Rejection|_reject|GraphEventError|LimitExceeded|NegotiatorError)\(\s*"([a-z_.]+)"')
_AGENT = re.compile(r'Rejected\([^\n]*,\s*"([a-z_.]+)"')
_PREFIXED = re.compile(r'"((?:memory|graph|ship|session)\.[a-z_]+)"')
_FAMILY = re.compile(r'f"(missing_|invalid_|limit\.|ship\.)\{')


def documented(error_class: str) -> bool:
    return f"`{error_class}`" in CONTRACT


def literal_classes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path, text in SOURCES.items():
        for rx in (_CALL, _AGENT, _PREFIXED):
            for m in rx.finditer(text):
                found.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_collector_finds_the_known_families():
    found = literal_classes()
    assert {"missing_sensitivity", "memory.key_mismatch", "graph.key_mismatch", "ship.too_large",
            "session.seq_reused", "deleted_content", "invalid_time"} <= set(found)


def test_every_literal_error_class_in_the_code_is_documented():
    missing = {code: sorted(where) for code, where in literal_classes().items() if not documented(code)}
    assert not missing, f"error classes raised in code but not in docs/contract.md: {missing}"


def test_every_error_class_family_built_at_run_time_is_documented():
    families = {m.group(1) for text in SOURCES.values() for m in _FAMILY.finditer(text)}
    assert families  # the code builds some
    spelled = {"missing_": "missing_<field>", "invalid_": "invalid_<field>", "limit.": "limit.<name>",
               "ship.": "ship.<kind>"}
    for family in families:
        assert documented(spelled[family]), family


def test_every_decode_error_class_is_documented():
    def subclasses(cls: type) -> set[type]:
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    names = {c.__name__ for c in subclasses(wire.WireFormatError) if c.__module__ in (wire.__name__, app.__name__)}
    assert {"UnknownMagicByteError", "ApicurioHeaderError", "_NullValue"} <= names
    assert [n for n in sorted(names - {"WireFormatError"}) if not documented(n)] == []


def test_every_session_rule_and_parse_kind_is_documented():
    assert [rule for rule in RULES if not documented(rule)] == []
    kinds = set(re.findall(r'ParseError\("([a-z_]+)"', (ROOT / "streams/graphs/paths.py").read_text()))
    assert {"corrupt_json", "empty", "wrong_type"} <= kinds
    section = CONTRACT[CONTRACT.index("`ship.<kind>`"):].split("\n", 1)[0]
    assert [k for k in sorted(kinds) if f"`{k}`" not in section] == []
