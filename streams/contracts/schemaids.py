"""Schema ids kept honest (issue 18): which schema each registry id meant when memstream used it,
and whether the registry still says the same. Pure: no Kafka, no registry, no files.

A Confluent-framed value names its writer schema only by a registry id. A registry that lost its
storage hands ids out again, first come first served, so an old id can come to mean another
schema: reading with it would misread or dead-letter valid records. The worker keeps what every id
it used meant (`KnownIds`, saved in its data dir) and compares it with the registry
(`mismatches`); on any difference it stops consuming instead of reading with the wrong schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownSchema:
    """What a schema id names: the record's full name and its CRC-64-AVRO fingerprint (hex)."""

    name: str
    fingerprint: str

    def __str__(self) -> str:
        return f"{self.name} (fingerprint {self.fingerprint})"


@dataclass(frozen=True)
class IdMismatch:
    schema_id: int
    expected: KnownSchema
    found: KnownSchema | None  # None: the registry has no schema under that id any more

    def __str__(self) -> str:
        now = f"now names {self.found}" if self.found else "is not in the registry any more"
        return f"schema id {self.schema_id} named {self.expected} and {now}"


def mismatches(known: Mapping[int, KnownSchema], now: Mapping[int, KnownSchema | None]) -> list[IdMismatch]:
    """Every known id the registry (`now`, asked about those ids) maps differently, by id."""
    return [IdMismatch(i, known[i], now[i]) for i in sorted(known) if i in now and now[i] != known[i]]


@dataclass(frozen=True)
class KnownIds:
    """The ids one worker used, for one Kafka cluster (the registry keeps its storage there: a new
    cluster means a new registry, and ids known for another cluster say nothing about it)."""

    cluster_id: str
    ids: Mapping[int, KnownSchema]

    def learn(self, learned: Mapping[int, KnownSchema], limit: int) -> KnownIds:
        """These ids added (an id already known keeps what it meant: a different meaning is a
        mismatch, never an update); at most `limit` ids, the most recently learned kept."""
        ids = dict(self.ids)
        for schema_id, schema in learned.items():
            ids.setdefault(schema_id, schema)
        if len(ids) > limit:
            ids = dict(list(ids.items())[len(ids) - limit:])
        return KnownIds(self.cluster_id, ids)

    def for_cluster(self, cluster_id: str) -> KnownIds:
        """Itself for the same cluster; nothing known for another one."""
        return self if cluster_id == self.cluster_id else KnownIds(cluster_id, {})

    def to_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id,
                           "ids": {str(i): {"name": s.name, "fingerprint": s.fingerprint} for i, s in self.ids.items()}},
                          indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, limit: int) -> KnownIds:
        """Parsed back; raises ValueError on anything that is not what `to_json` writes."""
        try:
            doc = json.loads(text)
            ids = {int(k): KnownSchema(str(v["name"]), str(v["fingerprint"])) for k, v in doc["ids"].items()}
            cluster_id = str(doc["cluster_id"])
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a known-schema-ids document: {exc}") from None
        return cls(cluster_id, {}).learn(ids, limit)
