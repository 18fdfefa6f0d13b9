"""Apicurio's header framing against the real Apicurio Registry and a real worker.

The schema is registered the way Apicurio's serde 2.x registers it (its own REST API v2, group
`default`, artifact `<topic>-value`-like id); the value is the raw Avro body and the schema
reference an 8-byte big-endian `apicurio.value.globalId` (the serde's default) or
`apicurio.value.contentId` header (see tests/contracts/test_wire_apicurio.py for the format's sources).
"""

from __future__ import annotations

import io
import json
import urllib.request

import pytest
from fastavro import schemaless_writer

from streams.contracts import catalog, schemas, wire
from streams.contracts.wire import CodecFactory
from tests.kafka_util import candidate, consume, produce, worker

pytestmark = pytest.mark.kafka


def register_like_apicurio_serde(registry_url: str, artifact_id: str, stem: str) -> dict:
    """POST the schema to Apicurio's v2 API as its serde does (ifExists=RETURN_OR_UPDATE); the
    answer carries the artifact version's globalId and its contentId."""
    api = wire.apicurio_api_url(registry_url)
    request = urllib.request.Request(
        f"{api}/groups/default/artifacts?ifExists=RETURN_OR_UPDATE", method="POST",
        data=schemas.default().get(stem).registry_text.encode(),
        headers={"Content-Type": "application/json", "X-Registry-ArtifactId": artifact_id,
                 "X-Registry-ArtifactType": "AVRO"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def raw_body(record: dict, stem: str) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, schemas.default().get(stem).parsed, record)
    return out.getvalue()


def id_header(name: str, value: int) -> tuple[str, bytes]:
    return name, value.to_bytes(8, "big", signed=True)


def test_global_and_content_id_headers_resolve_in_the_real_registry(stack, unique):
    # a second artifact with the same content: a new globalId, the same contentId
    first = register_like_apicurio_serde(stack.registry_url, f"apicurio-a-{unique}", "candidate_memory")
    second = register_like_apicurio_serde(stack.registry_url, f"apicurio-b-{unique}", "candidate_memory")
    assert second["globalId"] != first["globalId"] and second["contentId"] == first["contentId"]
    record = candidate(f"mb-{unique}", f"{unique}-c", 1_793_491_200_000, "The user prefers tea.")
    body = raw_body(record, "candidate_memory")
    codec = CodecFactory.from_url(stack.registry_url).codec("candidate_memory")  # a fresh process: no cache
    assert codec.decode_message(body, [id_header(wire.APICURIO_GLOBAL_ID, second["globalId"]),
                                       (wire.APICURIO_ENCODING, b"BINARY")]) == record
    assert codec.decode_message(body, [id_header(wire.APICURIO_CONTENT_ID, second["contentId"])]) == record
    with pytest.raises(wire.UnknownSchemaIdError, match="not in the registry"):
        codec.decode_message(body, [id_header(wire.APICURIO_GLOBAL_ID, 2**40)])


def test_worker_applies_records_written_with_apicurio_headers(stack, unique):
    user = f"mb-apicurio-{unique}"
    ids = register_like_apicurio_serde(stack.registry_url, f"{catalog.MEMORY_CANDIDATES}-value", "candidate_memory")
    by_global = candidate(user, f"{unique}-g", 1_793_491_200_000, "The user prefers green tea.")
    by_content = candidate(user, f"{unique}-c", 1_793_491_260_000, "The user lives in Lisbon.")
    env = {"MEMSTREAM_APP_ID": f"it-apicurio-{unique}"}
    with worker(stack, f"apicurio-{unique}", env=env):
        produce(stack, catalog.MEMORY_CANDIDATES, [(user, raw_body(by_global, "candidate_memory"))],
                headers=[id_header(wire.APICURIO_GLOBAL_ID, ids["globalId"]), (wire.APICURIO_ENCODING, b"BINARY")])
        produce(stack, catalog.MEMORY_CANDIDATES, [(user, raw_body(by_content, "candidate_memory"))],
                headers=[id_header(wire.APICURIO_CONTENT_ID, ids["contentId"])])
        ledger = consume(stack, catalog.MEMORY_LEDGER, lambda out: sum(
            1 for m in out if m["key"] == user and m["value"]["event_type"] == "memory_consolidated") == 2)
    decisions = [m["value"] for m in ledger if m["key"] == user and m["value"]["event_type"] == "memory_consolidated"]
    assert [d["payload"]["action"] for d in decisions] == ["accept", "accept"]
    # each output names its input (memory_event v2 `caused_by`)
    assert sorted(d["caused_by"]["id"] for d in decisions) == sorted([by_global["candidate_id"], by_content["candidate_id"]])
    assert {d["caused_by"]["kind"] for d in decisions} == {"candidate"}
    formed = sorted(m["value"]["payload"]["content"] for m in ledger
                    if m["key"] == user and m["value"]["event_type"] == "memory_formed")
    assert formed == sorted([by_global["content"], by_content["content"]])
