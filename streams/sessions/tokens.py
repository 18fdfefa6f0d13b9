"""The reference fixed token estimator (SPEC §4.8).

The reference implementation is JavaScript, so every length is a count of UTF-16 code units
(``String.length``): a character outside the Basic Multilingual Plane (most emoji, e.g. U+1F600)
is a surrogate pair and counts 2; a lone surrogate (possible in a Python ``str`` decoded from JSON
``"\\ud83d"``) counts 1, exactly as in JavaScript.

Prices:

- a ``text`` block: ``ceil(len(text) / 4) + 4``
- a ``tool_call`` block: ``ceil(len(name) / 4) + ceil(len(arguments) / 4) + 4``
- an ``unknown`` block (a block type the wire schema does not model): priced like a text block
  over whatever ``text`` it carries, so it costs at least the per-block overhead of 4. This is our
  choice; the reference estimator only ever sees its own block types.
- a message: ``4`` for its role + the sum of its blocks — except an ``assistant`` message with no
  blocks at all, which costs 0: the reference derives no model-visible message from it (it only
  hosts a max-tokens step's usage) and prices it as zero (deepseek-harness
  packages/core/session/src/surface.ts ``deriveEventMessage``; test "prices an empty assistant
  surface anchor as zero" in packages/llm/token-meter/tests/token-meter.spec.ts). An empty
  message of any other role still costs its role overhead, as in the reference.

A missing / ``None`` string counts as length 0. A ContentBlock is a dict
``{"type": "text"|"tool_call"|"unknown", "text": str?, "name": str?, "arguments": str?}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

BLOCK_OVERHEAD = 4
ROLE_OVERHEAD = 4


def utf16_len(s: str | None) -> int:
    """Length of ``s`` in UTF-16 code units, as JavaScript's ``String.length``."""
    if not s:
        return 0
    # Code points above U+FFFF take two code units; everything else (incl. lone surrogates) one.
    return len(s) + sum(1 for ch in s if ord(ch) > 0xFFFF)


def _ceil_div4(n: int) -> int:
    return -(-n // 4)


def price_text(text: str | None) -> int:
    """Price of one text block."""
    return _ceil_div4(utf16_len(text)) + BLOCK_OVERHEAD


def price_tool_call(name: str | None, arguments: str | None) -> int:
    """Price of one tool call block."""
    return _ceil_div4(utf16_len(name)) + _ceil_div4(utf16_len(arguments)) + BLOCK_OVERHEAD


def price_block(block: Mapping[str, Any]) -> int:
    """Price of one content block (see the module doc for the unknown-type rule)."""
    if block.get("type") == "tool_call":
        return price_tool_call(block.get("name"), block.get("arguments"))
    return price_text(block.get("text"))


def price_blocks(blocks: Iterable[Mapping[str, Any]] | None) -> int:
    """Sum of the block prices (no role overhead)."""
    return sum(price_block(b) for b in (blocks or ()))


def price_message(role: str | None, blocks: Iterable[Mapping[str, Any]] | None) -> int:
    """Price of a message: the role overhead (4, whatever the role) plus its blocks; an
    assistant message without blocks is no model-visible message and costs 0."""
    blocks = list(blocks or ())
    if role == "assistant" and not blocks:
        return 0
    return ROLE_OVERHEAD + price_blocks(blocks)


def text_block(text: str) -> dict[str, Any]:
    """A text ContentBlock with every wire field present."""
    return {"type": "text", "text": text, "name": None, "arguments": None}


def tool_call_block(name: str, arguments: str) -> dict[str, Any]:
    """A tool_call ContentBlock with every wire field present."""
    return {"type": "tool_call", "text": None, "name": name, "arguments": arguments}
