"""The reference fixed token estimator: UTF-16 lengths, per-block and per-role overheads."""

import math

from hypothesis import given
from hypothesis import strategies as st

from streams.sessions.tokens import (
    price_block,
    price_blocks,
    price_message,
    price_text,
    price_tool_call,
    text_block,
    tool_call_block,
    utf16_len,
)


def test_ascii_text_blocks():
    assert price_text("") == 4
    assert price_text(None) == 4
    assert price_text("abcd") == 1 + 4
    assert price_text("abcde") == 2 + 4
    assert price_text("a" * 400) == 100 + 4
    assert price_text("a" * 401) == 101 + 4


def test_bmp_non_ascii_counts_one_unit_each():
    # é, ß, CJK and U+2705 are inside the BMP: one UTF-16 unit each, like len()
    assert utf16_len("éßä中") == 4
    assert utf16_len("\u2705") == 1
    assert price_text("éßä中") == 1 + 4


def test_emoji_outside_bmp_count_two_units():
    grin = "\U0001F600"
    assert len(grin) == 1 and utf16_len(grin) == 2
    # three emoji: 6 UTF-16 units -> ceil(6/4)=2; counting code points would give ceil(3/4)=1
    assert price_text(grin * 3) == 2 + 4
    assert price_text("abc" + grin) == math.ceil(5 / 4) + 4  # 5 units -> 2
    assert price_text("ab" + grin) == 1 + 4  # exactly 4 units
    # a flag is two regional indicators, both outside the BMP: 4 units
    assert utf16_len("\U0001F1EB\U0001F1F7") == 4


def test_lone_surrogate_counts_one_like_javascript():
    assert utf16_len("\ud83d") == 1
    assert utf16_len("a\ud83db") == 3


def test_tool_call_block():
    # name 9 units -> 3, arguments 12 units -> 3, plus 4
    assert price_tool_call("read_file", '{"path":"a"}') == 3 + 3 + 4
    assert price_block(tool_call_block("read_file", '{"path":"a"}')) == 10
    assert price_tool_call("", "") == 4
    assert price_tool_call(None, None) == 4
    # UTF-16 in arguments too: one emoji = 2 units -> ceil(2/4)=1
    assert price_tool_call("x", "\U0001F600") == 1 + 1 + 4


def test_unknown_block_priced_like_text():
    assert price_block({"type": "unknown", "text": None, "name": None, "arguments": None}) == 4
    assert price_block({"type": "unknown", "text": "abcdefgh"}) == 2 + 4


def test_message_adds_four_for_its_role():
    blocks = [text_block("hello world!"), tool_call_block("search", '{"q":"kafka"}')]
    # text 12 -> 3+4 = 7; tool: name 6 -> 2, args 13 -> 4, +4 = 10; role 4
    assert price_blocks(blocks) == 17
    for role in ("user", "assistant", "tool", "system"):
        assert price_message(role, blocks) == 21
    assert price_message("user", []) == 4
    assert price_message("user", None) == 4


@given(st.text())
def test_utf16_len_matches_an_actual_utf16_encoding(s):
    assert utf16_len(s) == len(s.encode("utf-16-le", "surrogatepass")) // 2


@given(st.lists(st.text(max_size=50), max_size=8))
def test_blocks_price_is_additive(texts):
    blocks = [text_block(t) for t in texts]
    assert price_blocks(blocks) == sum(math.ceil(utf16_len(t) / 4) + 4 for t in texts)
    assert price_message("user", blocks) == price_blocks(blocks) + 4
