"""Keeps the generated tables of README.md (topic catalog, settings, topology), docs/contract.md
(limit error classes, session rule ids) and docs/architecture.md (topology) equal to the code.

`python -m streams.tools.readme` rewrites them in place; `tests/test_docs.py` fails when they differ.
"""

from __future__ import annotations

import re
from pathlib import Path

from streams.contracts import catalog
from streams.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
CONTRACT = README.parent / "docs" / "contract.md"
ARCHITECTURE = README.parent / "docs" / "architecture.md"


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


SECTIONS = {"catalog": lambda: catalog.markdown_table(Settings()), "settings": settings_table,
            "topology": topology_section}
CONTRACT_SECTIONS = {"limit-codes": limit_codes_table, "session-rules": session_rules_table}
ARCHITECTURE_SECTIONS = {"topology": topology_section}


def render(text: str, sections: dict = SECTIONS) -> str:
    for name, make in sections.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
    CONTRACT.write_text(render(CONTRACT.read_text(), CONTRACT_SECTIONS))
    ARCHITECTURE.write_text(render(ARCHITECTURE.read_text(), ARCHITECTURE_SECTIONS))
    print(f"updated {README}, {CONTRACT} and {ARCHITECTURE}")
