"""Keeps the generated sections of the documentation equal to the code: README.md (the topology's
Mermaid diagram), docs/topics-and-records.md (topic catalog), docs/operations.md (settings),
docs/architecture.md (topology: diagram and listing) and docs/contract.md (limit error classes,
session rule ids). A section sits between `<!-- name:begin -->` and `<!-- name:end -->`.

`python -m streams.tools.readme` rewrites them in place; `tests/test_docs.py` fails when they differ.
"""

from __future__ import annotations

import re
from pathlib import Path

from streams.contracts import catalog
from streams.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"
CONTRACT = DOCS / "contract.md"
ARCHITECTURE = DOCS / "architecture.md"
TOPICS = DOCS / "topics-and-records.md"
OPERATIONS = DOCS / "operations.md"


def settings_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var, default, doc in Settings.documentation():
        rows.append(f"| `{var}` | `{default}` | {doc} |")
    return "\n".join(rows)


def limit_codes_table() -> str:
    """`limit.<name>` error classes with their settings (the skew limit's error class is `invalid_time`)."""
    from dataclasses import fields

    from streams.core.limits import Limits, setting_name

    rows = ["| error_class | setting | default |", "|---|---|---|"]
    for f in fields(Limits):
        if f.name.startswith("max_") and f.name != "max_future_skew_ms":
            rows.append(f"| `limit.{f.name[len('max_'):]}` | `{setting_name(f.name)}` | {f.default} |")
    return "\n".join(rows)


def session_rules_table() -> str:
    from streams.sessions.lifecycle import RULES

    rows = ["| error_class | meaning |", "|---|---|"]
    rows += [f"| `{rule}` | {meaning} |" for rule, meaning in RULES.items()]
    return "\n".join(rows)


def topology_section() -> str:
    from streams.tools import topology

    return topology.markdown()


def topology_diagram() -> str:
    """The Mermaid flowchart alone (README): GitHub draws it; the listing is in docs/architecture.md."""
    from streams.tools import topology

    return "\n".join(["```mermaid", topology.mermaid(topology.processors(), topology.producers()), "```"])


SECTIONS = {"topology-diagram": topology_diagram}
TOPICS_SECTIONS = {"catalog": lambda: catalog.markdown_table(Settings())}
OPERATIONS_SECTIONS = {"settings": settings_table}
CONTRACT_SECTIONS = {"limit-codes": limit_codes_table, "session-rules": session_rules_table}
ARCHITECTURE_SECTIONS = {"topology": topology_section}
#: every file with generated sections, and which
TARGETS = {README: SECTIONS, TOPICS: TOPICS_SECTIONS, OPERATIONS: OPERATIONS_SECTIONS,
           CONTRACT: CONTRACT_SECTIONS, ARCHITECTURE: ARCHITECTURE_SECTIONS}


def render(text: str, sections: dict = SECTIONS) -> str:
    for name, make in sections.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)  # noqa: B023 -- called in this iteration
    return text


def stale() -> list[Path]:
    """The targets whose generated sections differ from the code."""
    return [path for path, sections in TARGETS.items() if render(path.read_text(), sections) != path.read_text()]


if __name__ == "__main__":
    for path, sections in TARGETS.items():
        path.write_text(render(path.read_text(), sections))
    print("updated " + ", ".join(str(p.relative_to(README.parent)) for p in TARGETS))
