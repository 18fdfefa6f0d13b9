"""File-position bookkeeping for the ``tail -F`` style graph-event shipper (SPEC §4.9). File I/O
only — no Kafka here; the Kafka side (transactions, the positions topic) lives in
streams/tools/shipper.py.

Pieces
------
- a **position** per log file: the inode it had and the byte offset just past the last complete
  line shipped. The shipper commits positions to the compacted topic ``shipper.positions.v1`` in
  the *same Kafka transaction* as the lines they cover (``position_key`` / ``position_record`` /
  ``position_from_record`` below are that record's shape), so a line and the position past it
  become visible together or not at all;
- ``poll_file(path, stored)`` returns only *complete* lines (ending in ``\\n``) after the stored
  position and the position just past the last one: a half-written last line is withheld until
  its newline lands. If the inode differs from the stored one (the path now names a different
  file) or the file shrank (truncated), reading restarts at 0. Lines still
  unread in a rotated-away file are not recovered (the graph recorder never rotates; this only
  keeps a replaced file from being read at a stale offset);
- ``line_id(name, start, data)``: a deterministic id of one line (SHA-256 of file name, byte
  offset and bytes) — the same line at the same place always gets the same id;
- ``load_offsets(path)``: reads the JSON offsets file that versions before the transactional
  shipper kept (``{"version": 1, "files": {name: {"inode", "offset"}}}``), so an upgraded shipper
  can import those positions once instead of re-shipping every file.

How the shipper uses this (exactly once on the topic)
-----------------------------------------------------
::

    positions = <committed positions, read back with isolation.level=read_committed>
    for path in list_event_files(directory):
        batch = poll_file(path, positions.get(os.path.basename(path)))
        if batch is None:                                  # vanished between listing and open
            continue
        begin transaction
        for line in batch.lines:                           # complete lines only
            produce(key=graphId or file name, value=...,   # corrupt lines -> DLQ, with the raw bytes
                    headers={HEADER_LINE_ID: line_id(batch.name, line.start, line.data), ...})
        produce(shipper.positions.v1, position_key(shipper, batch.name), position_record(...))
        commit transaction                                 # lines and position, atomically

A crash anywhere before the commit leaves an open transaction that the restarted shipper's
``init_transactions`` aborts: its lines are never seen by a read_committed reader, and the
committed position is still the one before them, so they are shipped once more, in a transaction
that commits.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from .paths import FILE_RE

OFFSETS_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 20
# Suggested Kafka record header names.
HEADER_LINE_ID = "memstream.event_id"  # what streams/agents/graphs.py reads as apply(event_id=)
HEADER_SOURCE_FILE = "memstream.source.file"
HEADER_SOURCE_OFFSET = "memstream.source.offset"


class OffsetsFileError(ValueError):
    """The offsets file exists but cannot be read as an offsets file."""


@dataclass(frozen=True)
class Position:
    inode: int
    offset: int


@dataclass(frozen=True)
class Line:
    start: int  # byte offset of the line's first byte
    end: int  # byte offset just past its "\n"
    data: bytes  # the line without its "\n"

    @property
    def is_blank(self) -> bool:
        return not self.data.strip()


@dataclass(frozen=True)
class Batch:
    name: str  # base name of the file (the offsets-file key)
    inode: int
    start_offset: int  # where reading began (0 after a restart)
    end_offset: int  # just past the last complete line returned
    lines: list[Line] = field(default_factory=list)
    restarted: bool = False  # truncation or rotation detected: reading began at 0
    reason: str | None = None  # "truncated" | "rotated" | None

    @property
    def position(self) -> Position:
        """What to commit once every line of the batch is acknowledged."""
        return Position(self.inode, self.end_offset)


# --------------------------------------------------------------------------------------------
# positions: the legacy offsets file, the positions topic's records


def load_offsets(path: str | os.PathLike[str]) -> dict[str, Position]:
    """Read an offsets file of an earlier shipper version (to import its positions); a missing file
    is an empty mapping. A present but unreadable file raises ``OffsetsFileError`` (its writer
    never tore it, so it was damaged externally: an operator decides, rather than silently
    re-shipping everything)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw.decode("utf-8"))
        files = doc["files"]
        if doc.get("version") != OFFSETS_VERSION or not isinstance(files, dict):
            raise ValueError(f"unsupported offsets file version {doc.get('version')!r}")
        out = {}
        for name, pos in files.items():
            inode, offset = pos["inode"], pos["offset"]
            if not (isinstance(inode, int) and isinstance(offset, int)) or offset < 0:
                raise ValueError(f"bad position for {name!r}: {pos!r}")
            out[name] = Position(inode, offset)
        return out
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise OffsetsFileError(f"{os.fspath(path)}: not a valid offsets file: {e}") from e


def position_key(shipper: str, name: str) -> str:
    """Key of a file's record on the positions topic: ``<shipper id>/<file name>``. A file name
    never contains ``/``, so the last ``/`` separates the two whatever the shipper id holds."""
    return f"{shipper}/{name}"


def position_record(shipper: str, name: str, position: Position, now_ms: int) -> dict:
    """The ShipperPosition record (schemas/shipper_position.avsc) for one file."""
    return {"shipper": shipper, "file": name, "inode": position.inode, "offset": position.offset,
            "committed_at": now_ms}


def position_from_record(record: dict) -> tuple[str, str, Position]:
    """(shipper id, file name, position) of a ShipperPosition record."""
    return record["shipper"], record["file"], Position(int(record["inode"]), int(record["offset"]))


# --------------------------------------------------------------------------------------------
# reading


def _read_complete(f, offset: int, max_bytes: int) -> tuple[list[Line], int]:  # type: ignore[no-untyped-def]
    f.seek(offset)
    buf = b""
    while True:
        chunk = f.read(max_bytes)
        if not chunk:
            break
        buf += chunk
        if b"\n" in chunk:
            break  # at least one complete line: enough for this batch
    cut = buf.rfind(b"\n")
    if cut < 0:
        return [], offset  # nothing complete yet (maybe a half-written line)
    lines = []
    pos = offset
    for piece in buf[:cut].split(b"\n"):
        end = pos + len(piece) + 1
        lines.append(Line(pos, end, piece))
        pos = end
    return lines, pos



def poll_file(path: str | os.PathLike[str], stored: Position | None, max_bytes: int = DEFAULT_MAX_BYTES) -> Batch | None:
    """Read what is new in ``path`` relative to its stored position, detecting truncation and
    rotation (inode change). None if the file does not exist."""
    name = os.path.basename(os.fspath(path))
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return None
    with f:
        st = os.fstat(f.fileno())
        offset, reason = 0, None
        if stored is not None:
            if stored.inode != st.st_ino:
                reason = "rotated"
            elif st.st_size < stored.offset:
                reason = "truncated"
            else:
                offset = stored.offset
        lines, end = _read_complete(f, offset, max_bytes)
        return Batch(name, st.st_ino, offset, end, lines, reason is not None, reason)


def line_id(name: str, start: int, data: bytes) -> str:
    """Deterministic id of one line: the same bytes at the same offset of the same file name
    always give the same id (a re-shipped line is recognisable downstream)."""
    h = hashlib.sha256()
    h.update(name.encode("utf-8"))
    h.update(b"\0")
    h.update(str(start).encode("ascii"))
    h.update(b"\0")
    h.update(data)
    return h.hexdigest()[:32]


def list_event_files(directory: str | os.PathLike[str]) -> list[str]:
    """Paths of the ``graph-events-{hash}.ndjson`` files in ``directory``, sorted by name."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [os.path.join(os.fspath(directory), n) for n in sorted(names) if FILE_RE.match(n)]
