"""`memstream status`: the consumer group `MEMSTREAM_APP_ID` and its workers.

It describes the group (confluent-kafka AdminClient): its members (workers) and the partitions
each owns, the lag of every input partition (group committed offset vs high watermark), and each
worker's `/health`. A worker's web URL is not in Kafka's group description, but Faust puts its
`canonical_url` in the consumer protocol user data of every member
(faust/assignor/client_assignment.py `ClientMetadata`, JSON); `status` reads the raw member
metadata with aiokafka's DescribeGroups and decodes it. `--workers URL,...` replaces the decoded
URLs (e.g. when workers advertise an address this machine cannot reach).

The pure parts (decoding, matching, formatting) are tested without a broker (tests/tools/test_status.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

from streams.contracts import catalog
from streams.settings import Settings
from streams.tools.kafkatools import KAFKA_TIMEOUT_S, kafka_error

HEALTH_TIMEOUT_S = 5.0


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    partitions: list[tuple[str, int]]  # the Kafka assignment (actives and changelog standbys)
    url: str | None = None  # Faust canonical URL, from the member's protocol user data
    actives: list[tuple[str, int]] | None = None
    standbys: list[tuple[str, int]] | None = None
    health: dict[str, Any] | None = None

    @property
    def ready(self) -> bool:
        return bool(self.health) and self.health.get("status") == "ready"  # type: ignore[union-attr]


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    committed: int | None
    end: int
    start: int
    owner: str | None

    @property
    def lag(self) -> int:
        base = self.committed if self.committed is not None and self.committed >= 0 else self.start
        return max(self.end - base, 0)


def decode_faust_metadata(member_metadata: bytes | None, member_assignment: bytes | None) -> dict[str, Any]:
    """The worker URL (and its active/standby partitions) Faust put in a member's protocol user
    data: metadata user data = ClientMetadata JSON; assignment user data = zlib(ClientMetadata JSON)."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

    out: dict[str, Any] = {}
    if member_metadata:
        meta = ConsumerProtocolMemberMetadata.decode(member_metadata)
        if meta.user_data:
            out["url"] = json.loads(meta.user_data).get("url")
    if member_assignment:
        assigned = ConsumerProtocolMemberAssignment.decode(member_assignment)
        if assigned.user_data:
            data = json.loads(zlib.decompress(assigned.user_data))
            out["url"] = out.get("url") or data.get("url")
            a = data.get("assignment") or {}
            for kind in ("actives", "standbys"):
                out[kind] = sorted((t, p) for t, ps in (a.get(kind) or {}).items() for p in ps)
    return out


async def _raw_members(settings: Settings, group: str) -> dict[str, dict[str, Any]]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.broker, request_timeout_ms=int(KAFKA_TIMEOUT_S * 1000))
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    out = {}
    for resp in responses:
        for g in resp.to_object()["groups"]:
            for m in g["members"]:
                try:
                    out[m["member_id"]] = decode_faust_metadata(m["member_metadata"], m["member_assignment"])
                except Exception:  # noqa: BLE001 - not a Faust member (or a newer format): no URL
                    out[m["member_id"]] = {}
    return out


def get_health(url: str, timeout: float = HEALTH_TIMEOUT_S) -> dict[str, Any]:
    """GET <url>/health; a worker that does not answer is reported as such, not raised."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return json.loads(e.read())
        except ValueError:
            return {"status": "error", "reason": f"HTTP {e.code}"}
    except (OSError, ValueError) as exc:
        return {"status": "unreachable", "reason": f"{url}/health: {getattr(exc, 'reason', exc)}"}


def _match_workers(members: list[Member], answers: dict[str, dict[str, Any]], notes: list[str]) -> None:
    """Give each member the /health answer of the --workers URL that is that worker: the answer's
    canonical `url` equals the member's decoded URL, or (URL unknown) the source partitions the
    worker reports are the member's."""
    left = dict(answers)
    for m in members:
        for url, a in list(left.items()):
            same_url = m.url is not None and a.get("url") == m.url
            mine = {f"{t}[{p}]" for t, p in m.partitions}
            same_tps = m.url is None and bool(a.get("sources")) and set(a["sources"]) <= mine
            if same_url or same_tps:
                m.url = m.url or a.get("url") or url
                m.health = a
                del left[url]
                break
    if left:
        notes.append(f"--workers URLs that match no group member: {', '.join(left)}")


def _input_topics() -> list[str]:
    return [t.name for t in catalog.topics() if t.direction == "in"]


@dataclass
class GroupStatus:
    group: str
    state: str
    members: list[Member]
    partitions: list[PartitionStatus]
    notes: list[str] = field(default_factory=list)

    @property
    def unassigned(self) -> list[PartitionStatus]:
        return [p for p in self.partitions if p.owner is None]

    @property
    def ok(self) -> bool:
        return bool(self.members) and not self.unassigned and all(m.ready for m in self.members)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group, "state": self.state, "ok": self.ok, "notes": self.notes,
            "members": [{"member_id": m.member_id, "client_id": m.client_id, "host": m.host, "url": m.url,
                         "partitions": [f"{t}[{p}]" for t, p in m.partitions],
                         "actives": None if m.actives is None else [f"{t}[{p}]" for t, p in m.actives],
                         "standbys": None if m.standbys is None else [f"{t}[{p}]" for t, p in m.standbys],
                         "ready": m.ready, "health": m.health} for m in self.members],
            "partitions": [{"topic": p.topic, "partition": p.partition, "committed": p.committed, "end": p.end,
                            "lag": p.lag, "owner": p.owner} for p in self.partitions],
            "unassigned": [f"{p.topic}[{p.partition}]" for p in self.unassigned],
            "total_lag": sum(p.lag for p in self.partitions),
        }


def collect_status(settings: Settings, workers: list[str] | None = None) -> GroupStatus:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from streams.runtime import generation

    admin = AdminClient({"bootstrap.servers": settings.broker, "log_level": 0})
    try:
        md = admin.list_topics(timeout=KAFKA_TIMEOUT_S)
        gen = generation.read(settings, set(md.topics))
        group = settings.app_id if gen is None else gen.group  # a re-partitioned deployment's current group
        desc = admin.describe_consumer_groups([group], request_timeout=KAFKA_TIMEOUT_S)[group].result()
        committed_tps = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=KAFKA_TIMEOUT_S)[group].result().topic_partitions
    except KafkaException as exc:
        raise kafka_error(settings, exc) from None
    notes: list[str] = []
    members = [Member(m.member_id, m.client_id, m.host,
                      sorted((tp.topic, tp.partition) for tp in (m.assignment.topic_partitions if m.assignment else [])))
               for m in desc.members]
    members.sort(key=lambda m: (m.host, m.member_id))
    if members:
        try:
            raw = asyncio.run(_raw_members(settings, group))
        except Exception as exc:  # noqa: BLE001 - the URLs are a bonus; --workers is the fallback
            raw = {}
            notes.append(f"could not read the workers' Faust metadata ({type(exc).__name__}: {exc}); "
                         "pass --workers URL,...")
        for m in members:
            info = raw.get(m.member_id, {})
            m.url, m.actives, m.standbys = info.get("url"), info.get("actives"), info.get("standbys")
    if workers:
        _match_workers(members, {url: get_health(url) for url in workers}, notes)
    for m in members:
        if m.health is None:
            m.health = get_health(m.url) if m.url else {
                "status": "unknown", "reason": "web URL unknown (not in the member metadata): pass --workers URL,..."}

    owner: dict[tuple[str, int], str] = {}
    for m in members:
        for tp in (m.actives if m.actives is not None else m.partitions):
            owner[tp] = m.url or m.member_id
    tps = [(t, p) for t in _input_topics() if t in md.topics for p in sorted(md.topics[t].partitions)]
    missing_topics = [t for t in _input_topics() if t not in md.topics]
    if missing_topics:
        notes.append(f"input topics missing: {', '.join(missing_topics)} (run `memstream topics apply`)")
    committed = {(tp.topic, tp.partition): tp.offset for tp in committed_tps}
    parts: list[PartitionStatus] = []
    if tps:
        try:
            ends = {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(
                {TopicPartition(t, p): OffsetSpec.latest() for t, p in tps}, request_timeout=KAFKA_TIMEOUT_S).items()}
            starts = {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(
                {TopicPartition(t, p): OffsetSpec.earliest() for t, p in tps}, request_timeout=KAFKA_TIMEOUT_S).items()}
        except KafkaException as exc:
            raise kafka_error(settings, exc) from None
        for t, p in tps:
            c = committed.get((t, p))
            parts.append(PartitionStatus(t, p, c if c is not None and c >= 0 else None, ends[(t, p)],
                                         starts[(t, p)], owner.get((t, p))))
    state = getattr(desc.state, "name", str(desc.state))
    return GroupStatus(group, state, members, parts, notes)


def format_status(st: GroupStatus) -> str:
    lines = []
    total_lag = sum(p.lag for p in st.partitions)
    assigned = len(st.partitions) - len(st.unassigned)
    lines.append(f"group {st.group}: {st.state}, {len(st.members)} worker(s), "
                 f"{assigned}/{len(st.partitions)} input partitions assigned, total lag {total_lag}")
    for m in st.members:
        h = m.health or {}
        lines.append(f"worker {m.url or '(url unknown)'}  member={m.member_id}  host={m.host}  "
                     f"{h.get('status', 'unknown')}: {h.get('reason', '')}")
        tps = m.actives if m.actives is not None else m.partitions
        sources = [tp for tp in tps if is_source_topic(tp[0])]
        lines.append("  owns: " + _group_tps(sources))
        lines.append(f"  tables: {len(tps) - len(sources)} active changelog partitions"
                     + (f", {len(m.standbys)} standby" if m.standbys is not None else ""))
    if st.partitions:
        lines.append("lag:")
        width = max(len(p.topic) for p in st.partitions)
        for p in st.partitions:
            committed = "-" if p.committed is None else str(p.committed)
            lines.append(f"  {p.topic:<{width}} {p.partition:>3}  committed {committed:>8}  end {p.end:>8}  "
                         f"lag {p.lag:>6}  {p.owner or 'UNASSIGNED'}")
    for note in st.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def is_source_topic(topic: str) -> bool:
    """A topic workers consume as a stream (not a table changelog, not Faust's leader topic)."""
    return not topic.endswith("-changelog") and not topic.endswith("-__assignor-__leader")


def _group_tps(tps: Iterable[tuple[str, int]]) -> str:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(tps):
        by_topic.setdefault(t, []).append(p)
    return "  ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in by_topic.items()) or "(nothing)"


def status(settings: Settings, *, workers: list[str] | None, as_json: bool, out: TextIO = sys.stdout) -> int:
    """Exit 0 when the group has members, every input partition is assigned and every worker
    answers ready; 1 otherwise."""
    st = collect_status(settings, workers)
    if as_json:
        print(json.dumps(st.to_json(), indent=2, sort_keys=True), file=out)
    else:
        if not st.members:
            st.notes.insert(0, f"consumer group {st.group} has no members: no worker is running "
                            f"(MEMSTREAM_APP_ID={st.group})")
        print(format_status(st), file=out)
    return 0 if st.ok else 1
