"""Union branches an outside producer's plain dict gets wrong (issue 15, "What outside teams
tripped on"): ``MemoryAccessedPayload`` and ``MemoryDeletedPayload`` have the same fields, so
plain fastavro writes a ``memory_deleted`` payload as ``MemoryAccessedPayload``. No compatible
schema change can tell a plain ``{"node_id": …}`` apart (fastavro picks the branch with the most
matching fields, the first on a tie; the seed pins both shapes), so docs/records.md documents the
ways to name the branch. These tests show the pitfall and each right way."""

import io
import itertools

import fastavro

from streams.contracts import schemas
from streams.contracts.wire import CodecFactory
from streams.core import UserMemory, process_candidate, process_event

DELETED = "memstream.memory.MemoryDeletedPayload"
ACCESSED = "memstream.memory.MemoryAccessedPayload"


def deleted_event(payload):
    return {"event_id": "e-del", "motebit_id": "u1", "device_id": None, "timestamp": 1_700_000_000_000,
            "version_clock": 2, "event_type": "memory_deleted", "payload": payload}


def plain_write(record) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schemas.parsed("memory_event"), record)
    return buf.getvalue()


def branch(body: bytes) -> str:
    rec = fastavro.schemaless_reader(io.BytesIO(body), schemas.parsed("memory_event"), return_record_name=True)
    return rec["payload"][0]


def test_plain_dict_is_written_as_the_wrong_branch():
    # the pitfall: a plain dict leaves the choice to fastavro, which takes the first of the tie
    assert branch(plain_write(deleted_event({"node_id": "n1"}))) == ACCESSED


def test_tuple_notation_names_the_branch():
    assert branch(plain_write(deleted_event((DELETED, {"node_id": "n1"})))) == DELETED


def test_type_key_names_the_branch():
    # fastavro's other notation: a "-type" key (not written: only schema fields are)
    assert branch(plain_write(deleted_event({"-type": DELETED, "node_id": "n1"}))) == DELETED


def test_memstream_codec_follows_event_type():
    # memstream's own encoder (streams.contracts.wire) picks the branch by memstream.branch_by
    data = CodecFactory().codec("memory_event").encode(deleted_event({"node_id": "n1"}))
    assert branch(data[10:]) == DELETED  # after the 10-byte single-object header


def test_look_alike_branches_are_exactly_the_known_pair():
    # why no compatible schema change helps: these records have identical field sets
    payload = next(f for f in schemas.parsed("memory_event")["fields"] if f["name"] == "payload")
    records = [b for b in payload["type"] if isinstance(b, dict)]
    alike = [(a["name"], b["name"]) for a, b in itertools.combinations(records, 2)
             if {f["name"] for f in a["fields"]} == {f["name"] for f in b["fields"]}]
    assert alike == [(ACCESSED, DELETED)]


def test_memstream_reads_the_event_by_event_type_whatever_the_branch():
    # a mis-branched memory_deleted still deletes in memstream (the core keys on event_type);
    # the wrong branch only misleads consumers that read the branch name (e.g. avsc in TypeScript)
    um = UserMemory("u1")
    nid = process_candidate(um, {"candidate_id": "c1", "motebit_id": "u1", "content": "User likes tea",
                                 "sensitivity": "none", "timestamp": 1_699_999_999_000}).node_upserts[0]["node_id"]
    decoded = fastavro.schemaless_reader(io.BytesIO(plain_write(deleted_event({"node_id": nid}))),
                                         schemas.parsed("memory_event"))
    out = process_event(um, decoded)
    assert out.node_deletions == [nid] and nid not in um.live


def test_compaction_end_without_error_key_is_written_as_a_start():
    # the same trap in SessionEvent.data: CompactionEnd's optional error left out ties with CompactionStart
    schema = schemas.parsed("session_event")
    base = {"sessionId": "s1", "seq": 3, "type": "compaction/end", "ts": 1, "ignorable": False}

    def written(data):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, {**base, "data": data})
        buf.seek(0)
        return fastavro.schemaless_reader(buf, schema, return_record_name=True)["data"][0]

    end = {"compactionId": "c1", "sourceCommandId": None, "turn": 1}
    assert written(end) == "memstream.session.CompactionStart"  # the pitfall
    assert written({**end, "error": None}) == "memstream.session.CompactionEnd"
    assert written(("memstream.session.CompactionEnd", end)) == "memstream.session.CompactionEnd"
