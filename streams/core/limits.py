"""Input limits and id rules (issue 12: every size bounded by design).

Kafka refuses a message over ~1 MB (``message.max.bytes``) and a Faust table row is one
changelog message: a row that outgrows it stops the worker that writes it, and then every
worker its partitions move to. So no input may be able to grow a row or an output without
bound. Every record is checked against :class:`Limits` before it touches state; a record over
a limit is rejected with a :class:`LimitExceeded` whose ``code`` is ``limit.<name>`` and whose
``detail`` names the limit and its setting, e.g.::

    limit.content_bytes: content is 20480 bytes; MEMSTREAM_MAX_CONTENT_BYTES is 16384

The shell dead-letters it (``pipeline.dlq.v1``). A reason never quotes more than
:data:`QUOTE_CHARS` characters of any input value (:func:`quote`).

Ids (:func:`check_id`): every id — ``motebit_id``/``user_id``, ``candidate_id``,
``event_id``, ``node_id``, ``session_id``, ``graph_id``, ``turn_id``, ``request_id``,
``device_id``, … — is 1..``max_id_chars`` characters from :data:`ID_CHARSET`, starting with a
letter or digit. Why this set: it holds UUIDs, ULIDs, slugs (``mb-ada``), e-mail-like
(``ada@example.com``) and URN-like (``urn:agent:42``) ids, every sample and seed id; it
excludes ``/`` (table keys are ``<user>`` and ``<user>/<node>``: a user ``victim/x`` would
collide with the rows of ``victim``), ``~`` (the shell names its internal rows ``<user>/~…``,
so no node id can name one), whitespace, control characters, ``%`` and ``?``/``#`` (ids appear in
HTTP paths), and anything outside ASCII (no look-alike or normalisation ambiguity between two
keys that render the same). The first character rules out ``.``/``..`` (path segments a URL
normalises away) and leading punctuation.

The core is pure: :class:`Limits` is a frozen dataclass with the documented defaults; the shell
builds it from the settings (``Settings.limits()``) and passes it the way it passes the
consolidation policy. Field names equal the settings' field names (``MEMSTREAM_`` + upper case).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

#: Characters an id may contain (see the module doc); the first must be a letter or a digit.
ID_CHARSET = "A-Za-z0-9._:@-"
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*\Z")
_BAD_CHAR_RE = re.compile(r"[^A-Za-z0-9._:@-]")

#: A reason quotes at most this many characters of an input value.
QUOTE_CHARS = 80

SETTING_PREFIX = "MEMSTREAM_"


@dataclass(frozen=True)
class Limits:
    """Every input size limit (defaults = the settings' defaults; see docs/records.md)."""

    max_content_bytes: int = 16 * 1024
    max_embedding_dims: int = 4096
    max_extra_entries: int = 32
    max_extra_entry_bytes: int = 1024
    max_id_chars: int = 128
    max_label_chars: int = 128
    max_text_bytes: int = 64 * 1024
    max_negotiator_content_bytes: int = 2 * 1024
    max_negotiator_memories: int = 100
    max_negotiator_forgotten: int = 1000
    max_graph_nodes: int = 500
    max_graph_labels: int = 64
    max_shadowed_seqs: int = 1024
    max_ledger_shadowed_seqs: int = 8192
    max_error_chars: int = 512
    max_json_depth: int = 64
    max_future_skew_ms: int = 24 * 60 * 60 * 1000

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


DEFAULT_LIMITS = Limits()


def setting_name(field_name: str) -> str:
    """``max_content_bytes`` → ``MEMSTREAM_MAX_CONTENT_BYTES``."""
    return SETTING_PREFIX + field_name.upper()


class LimitExceeded(ValueError):
    """A value over a limit or an id against the id rules; ``code`` is machine-readable."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters (a reason never carries a huge input)."""
    if isinstance(value, str) and len(value) > limit:
        return repr(value[:limit]) + f"… ({len(value)} chars)"
    if isinstance(value, (bytes, bytearray)) and len(value) > limit:
        return repr(bytes(value[:limit])) + f"… ({len(value)} bytes)"
    text = repr(value)
    if len(text) > limit:
        return text[:limit] + f"… ({len(text)} chars)"
    return text


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _over(name: str, what: str, size: int, unit: str, limit: int) -> LimitExceeded:
    short = name[len("max_"):] if name.startswith("max_") else name
    return LimitExceeded(f"limit.{short}", f"{what} is {size} {unit}; {setting_name(name)} is {limit}")


def check_bytes(what: str, text: str, limits: Limits, name: str) -> str:
    """``text`` (UTF-8) within ``limits.<name>`` bytes, else :class:`LimitExceeded`."""
    limit = getattr(limits, name)
    # a str of n code points is at least n and at most 4n bytes: skip the encode when it fits
    if len(text) * 4 > limit:
        size = utf8_len(text)
        if size > limit:
            raise _over(name, what, size, "bytes", limit)
    return text


#: a JSON string (escapes included) or one bracket: what nesting depth is counted from
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
#: the parser recurses once per level: a limit above this could reach Python's recursion limit
MAX_JSON_DEPTH_CEILING = 512


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text``, found without parsing it (brackets
    inside strings do not count). Never recurses, so a hostile 10,000-deep document costs one
    scan (`check_json_depth` skips it for a text with too few brackets to be too deep)."""
    depth = deepest = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token == "[" or token == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif token == "]" or token == "}":
            depth -= 1
    return deepest


def check_json_depth(what: str, text: str, limits: Limits) -> str:
    """``text`` if its arrays and objects nest at most ``limits.max_json_depth`` deep, else
    :class:`LimitExceeded` (``limit.json_depth``). Run it before ``json.loads`` on an input:
    the parser recurses per level and a deep enough document raises ``RecursionError``."""
    limit = limits.max_json_depth
    if text.count("[") + text.count("{") > limit and (depth := json_depth(text)) > limit:
        raise _over("max_json_depth", what, depth, "levels deep", limit)
    return text


def check_chars(what: str, text: str, limits: Limits, name: str) -> str:
    limit = getattr(limits, name)
    if len(text) > limit:
        raise _over(name, what, len(text), "characters", limit)
    return text


def check_count(what: str, n: int, limits: Limits, name: str, unit: str = "entries") -> int:
    limit = getattr(limits, name)
    if n > limit:
        raise _over(name, what, n, unit, limit)
    return n


def id_problem(value: Any, limits: Limits = DEFAULT_LIMITS) -> tuple[str, str] | None:
    """(code, what is wrong) when ``value`` is not a valid id, else None. Empty/missing ids
    are the callers' business (their own ``missing_<field>`` codes)."""
    if not isinstance(value, str):
        return "invalid_id", f"is not a string ({type(value).__name__})"
    if len(value) > limits.max_id_chars:
        return ("limit.id_chars",
                f"is {len(value)} characters; {setting_name('max_id_chars')} is {limits.max_id_chars}")
    if _ID_RE.match(value):
        return None
    if not value:
        return "invalid_id", "is empty"
    bad = _BAD_CHAR_RE.search(value)
    if bad is not None:
        return ("invalid_id",
                f"has {quote(bad.group())} at position {bad.start()}: ids use only [{ID_CHARSET}]")
    return "invalid_id", f"must start with a letter or a digit (ids use only [{ID_CHARSET}])"


def check_id(field: str, value: Any, limits: Limits = DEFAULT_LIMITS) -> str:
    """``value`` if it is a valid id (see the module doc), else :class:`LimitExceeded`
    naming ``field`` (the value is quoted at most :data:`QUOTE_CHARS` characters)."""
    problem = id_problem(value, limits)
    if problem is None:
        return value
    code, what = problem
    raise LimitExceeded(code, f"{field} {quote(value, 40)} {what}")


def is_valid_id(value: Any, limits: Limits = DEFAULT_LIMITS) -> bool:
    return id_problem(value, limits) is None
