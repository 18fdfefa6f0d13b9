"""Builders and hypothesis strategies shared by the core tests."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import strategies as st

WORDS = (
    "coffee tea morning evening editor dark light mode berlin paris london tokyo dog cat named "
    "rex luna daughter son works engineer designer doctor teacher allergic peanuts shellfish "
    "gluten prefers likes hates window aisle seat vegetarian vegan marathon running swimming "
    "hiking guitar piano violin birthday march april june july spanish french german python "
    "rust golang meeting thursday friday monday budget invoice hotel flight garden tomatoes "
    "roses bicycle commute train office remote weekend brother sister mother father cousin "
    "project deadline launch review sushi pizza ramen cheese wine beer water yoga pilates "
    "chess poker novel poetry museum concert festival podcast camera lens printer laptop"
).split()

_counter = itertools.count(1)


def candidate(content: str = "User prefers dark mode in the editor", *, motebit_id: str = "u1", **kw: Any) -> dict[str, Any]:
    n = next(_counter)
    c = {
        "candidate_id": kw.pop("candidate_id", f"cand-{n}"),
        "motebit_id": motebit_id,
        "content": content,
        "sensitivity": "personal",
        "source": "user_stated",
        "memory_type": "semantic",
        "timestamp": kw.pop("timestamp", 1_700_000_000_000 + n),
    }
    c.update(kw)
    return c


def event(event_type: str, payload: dict[str, Any], *, motebit_id: str = "u1", **kw: Any) -> dict[str, Any]:
    n = next(_counter)
    e = {
        "event_id": kw.pop("event_id", f"ev-{n}"),
        "motebit_id": motebit_id,
        "device_id": kw.pop("device_id", "dev-1"),
        "timestamp": kw.pop("timestamp", 1_700_000_000_000 + n),
        "version_clock": kw.pop("version_clock", n),
        "event_type": event_type,
        "payload": payload,
    }
    e.update(kw)
    return e


def formed(node_id: str, content: str, **kw: Any) -> dict[str, Any]:
    payload = {"node_id": node_id, "content": content, "sensitivity": kw.pop("sensitivity", "personal")}
    payload.update(kw.pop("payload_extra", {}))
    return event("memory_formed", payload, **kw)


def sentence(rnd: random.Random, lo: int = 6, hi: int = 10) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(lo, hi)))


# ------------------------------------------------------------------------ strategies ----

words = st.sampled_from(WORDS)
sentences = st.lists(words, min_size=6, max_size=12).map(" ".join)


@st.composite
def light_paraphrases(draw: st.DrawFn, text: str) -> str:
    """Formatting changes + at most one typo inside a long word + optional filler word."""
    words_ = text.split()
    if draw(st.booleans()):
        words_ = [w.capitalize() if draw(st.booleans()) else w for w in words_]
    if draw(st.booleans()):
        long_ix = [i for i, w in enumerate(words_) if len(w) >= 6]
        if long_ix:
            i = draw(st.sampled_from(long_ix))
            w = words_[i]
            j = draw(st.integers(1, len(w) - 2))
            words_[i] = w[:j] + draw(st.sampled_from("aeiouxyz")) + w[j + 1 :]
    out = " ".join(words_)
    if draw(st.booleans()):
        out = out + draw(st.sampled_from([".", "!", " .", "?"]))
    if draw(st.booleans()):
        out = "  " + out.replace(" ", "  ", 1)
    return out


def one_word_edit(rnd: random.Random, text: str) -> str:
    w = text.split()
    i = rnd.randrange(len(w))
    op = rnd.choice(("replace", "insert", "delete")) if len(w) > 3 else "replace"
    if op == "replace":
        w[i] = rnd.choice([x for x in WORDS if x != w[i]])
    elif op == "insert":
        w.insert(i, rnd.choice(WORDS))
    else:
        del w[i]
    return " ".join(w)
