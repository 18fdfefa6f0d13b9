"""Keeps README.md's generated tables (topic catalog, settings) equal to the code.

`python -m streams.readme` rewrites them in place; `tests/test_docs.py` fails when they differ.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import catalog
from .settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"


def settings_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var, default, doc in Settings.documentation():
        rows.append(f"| `{var}` | `{default}` | {doc} |")
    return "\n".join(rows)


SECTIONS = {"catalog": lambda: catalog.markdown_table(Settings()), "settings": settings_table}


def render(text: str) -> str:
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
    print(f"updated {README}")
