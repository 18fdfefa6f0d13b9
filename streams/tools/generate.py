"""`memstream generate`: a deterministic, realistic stream of every input record type.

Seeded (`--seed`), so the demo, the tests and the benchmarks see the same stream each run.
What it contains, per user: candidate memories with paraphrases and near-duplicates (→ merge),
contradictions that should supersede (explicit `supersedes` and implicit), content at every
sensitivity level (incl. secrets → reject), instruction-form entries (feedback type and v2 header
hints; some user-stated, some not → quarantine), a candidate missing its sensitivity (→ DLQ),
memory events from devices (formed, accessed, pinned, deleted), duplicate event ids and
out-of-order events, user turns for the missed-memory audit, negotiator remember/forget
requests; sessions with compactions (valid and rule-breaking); graph runs.

Each item is `{"topic", "key", "value"}` with `value` a record dict of the topic's schema.
"""

from __future__ import annotations

import base64
import random
import uuid
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from streams.contracts import catalog

EPOCH_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z: the sample stream's clock starts here
MINUTE = 60_000
NS = uuid.UUID("6f1d2c7e-4a8b-5c3d-9e0f-112233445566")

USERS = ["mb-ada", "mb-bo", "mb-chen", "mb-dara", "mb-eli", "mb-fay", "mb-gus", "mb-hana"]

# (topic, sensitivity, memory_type, [paraphrases...], contradiction or None)
FACTS: list[tuple[str, str, str, list[str], str | None]] = [
    ("coffee", "none", "semantic",
     ["The user prefers oat milk in their coffee.",
      "User prefers oat milk in coffee.",
      "the user prefers oat milk in their coffee"],
     "The user now takes their coffee black, no milk."),
    ("city", "personal", "semantic",
     ["The user lives in Berlin, in the Kreuzberg district.",
      "User lives in Berlin (Kreuzberg district)."],
     "The user moved from Berlin to Munich in October."),
    ("diet", "personal", "semantic",
     ["The user is vegetarian and avoids fish.",
      "The user is a vegetarian who avoids fish."],
     None),
    ("allergy", "medical", "semantic",
     ["The user is allergic to penicillin.",
      "User is allergic to penicillin."],
     None),
    ("meds", "medical", "episodic",
     ["The user started taking 20mg of atorvastatin this week."],
     "The user stopped taking atorvastatin after the doctor's visit."),
    ("salary", "financial", "semantic",
     ["The user's salary is 85,000 EUR per year.",
      "The user earns 85,000 EUR a year."],
     "The user's salary was raised to 92,000 EUR per year."),
    ("bank", "financial", "semantic",
     ["The user banks with N26 and keeps savings at ING."],
     None),
    ("password", "secret", "semantic",
     ["The user's email password is hunter2-correct-horse."],
     None),
    ("meeting", "none", "episodic",
     ["The user has a design review with Priya on Thursday at 10am.",
      "Design review with Priya on Thursday at 10am."],
     None),
    ("language", "none", "semantic",
     ["The user is learning Japanese and practises every morning.",
      "The user is learning Japanese, practising each morning."],
     None),
    ("kids", "personal", "semantic",
     ["The user has two children, Mia (7) and Leo (4)."],
     None),
    ("editor", "none", "semantic",
     ["The user writes code in Neovim with the gruvbox theme.",
      "The user codes in Neovim using the gruvbox theme."],
     "The user switched from Neovim to VS Code."),
]

# Instruction-form entries: (content, frontmatter_type, extra lines, source)
INSTRUCTIONS: list[tuple[str, str | None, list[str], str]] = [
    ("Always answer in British English.", "feedback", [], "user_stated"),
    ("Run the test suite before proposing a commit.", None, ["triggers: commit, git push", "last-confirmed: 2026-10-02"], "agent_inferred"),
    ("Summarise long emails in three bullet points.", None, ["applies-when: the user forwards an email"], "peer_agent"),
    ("Never schedule meetings before 9am.", None, ["pinned: true"], "user_stated"),
    ("Escalate anything mentioning 'refund' to a human.", None, ["pinned: yes", "pinned: true"], "tool_derived"),
    ("Use metric units.", None, ["triggers:", "applies-when:   ", "last-confirmed: soon"], "agent_inferred"),
]

TURNS: list[tuple[str, str | None, list[str]]] = [
    ("I prefer window seats when I fly, and I always want vegetarian meals.", "Noted: window seat, vegetarian meal.", []),
    ("My name is Ada and I work as a nurse at the Charité.", "Nice to meet you, Ada!", ["The user's name is Ada."]),
    ("I want to run a half marathon next spring.", "Great goal — let's plan training.", []),
    ("Actually, my sister's birthday is on the 12th, not the 21st.", "Thanks for correcting me.", []),
    ("What's the weather tomorrow?", "Sunny, 14°C.", []),
    ("I'm trying to save 500 euros a month for a new car. " + "Some more context here. " * 12,
     "You seem to prefer aggressive saving plans.", []),
]

NEGOTIATOR: list[tuple[str, str | None, str | None]] = [
    ("remember", "disclosure_rule", "Never reveal my walk-away price before the third offer."),
    ("remember", "threshold", "Accept any offer above 42,000 EUR without asking me."),
    ("remember", "playbook", "Open 15% above the asking price for used cars."),
    ("remember", "playbook", "Open 10% below list price for furniture."),
    ("forget", None, "walk-away price"),
    ("forget", None, "Open"),  # ambiguous: two playbooks start with "Open"
    ("forget", None, "lottery numbers"),  # not_found
]


@dataclass(frozen=True)
class Item:
    topic: str
    key: str
    value: dict | bytes  # bytes: a deliberately undecodable record (bad-input samples)

    def as_json(self) -> dict:
        if isinstance(self.value, bytes):
            return {"topic": self.topic, "key": self.key, "raw_base64": base64.b64encode(self.value).decode()}
        return {"topic": self.topic, "key": self.key, "value": self.value}

    @classmethod
    def from_json(cls, obj: dict) -> Item:
        if "raw_base64" in obj:
            return cls(obj["topic"], obj["key"], base64.b64decode(obj["raw_base64"]))
        return cls(obj["topic"], obj["key"], obj["value"])


def _id(*parts: object) -> str:
    return str(uuid.uuid5(NS, "/".join(str(p) for p in parts)))


def _embedding(rng: random.Random, topic: str, jitter: float) -> list[float]:
    """A small embedding: one fixed direction per topic plus noise (paraphrases stay close)."""
    base = random.Random(f"emb:{topic}")
    return [round(base.gauss(0, 1) + rng.gauss(0, jitter), 4) for _ in range(16)]


def _candidate(user: str, cid: str, ts: int, content: str, sensitivity: str | None, memory_type: str,
               **extra: object) -> dict:
    rec = {
        "candidate_id": cid, "motebit_id": user, "content": content, "sensitivity": sensitivity,
        "source": extra.pop("source", "user_stated"), "memory_type": memory_type,
        "confidence": extra.pop("confidence", 0.7), "valid_from": extra.pop("valid_from", None),
        "timestamp": ts, "embedding": extra.pop("embedding", None),
        "frontmatter_type": extra.pop("frontmatter_type", None), "extra": extra.pop("extra", None),
        "supersedes": extra.pop("supersedes", None), "kind": extra.pop("kind", None),
        "session_id": extra.pop("session_id", None),
    }
    assert not extra, extra
    return rec


def _event(user: str, eid: str, ts: int, clock: int, event_type: str, payload: dict,
           device: str | None = "phone") -> dict:
    return {"event_id": eid, "motebit_id": user, "device_id": device, "timestamp": ts,
            "version_clock": clock, "event_type": event_type, "payload": payload}


def memory_items(rng: random.Random, users: list[str], epoch_ms: int = EPOCH_MS) -> Iterator[Item]:
    cand_topic = catalog.MEMORY_CANDIDATES
    for u_index, user in enumerate(users):
        ts = epoch_ms + u_index * 7 * MINUTE
        facts = rng.sample(FACTS, k=min(len(FACTS), 8 + u_index % 4))
        for fact_no, (topic, sens, mtype, variants, contradiction) in enumerate(facts):
            use_embedding = fact_no % 3 == 0
            for v_no, text in enumerate(variants):
                ts += rng.randint(1, 5) * MINUTE
                yield Item(cand_topic, user, _candidate(
                    user, _id(user, topic, "v", v_no), ts, text, sens, mtype,
                    confidence=round(0.6 + 0.1 * v_no, 2),
                    embedding=_embedding(rng, topic, 0.02) if use_embedding else None))
            # the first phrasing once more: an exact repeat reinforces
            ts += MINUTE
            yield Item(cand_topic, user, _candidate(
                user, _id(user, topic, "repeat"), ts, variants[0], sens, mtype, confidence=0.9,
                embedding=_embedding(rng, topic, 0.02) if use_embedding else None))
            if contradiction:
                ts += rng.randint(30, 90) * MINUTE
                explicit = fact_no % 2 == 0
                yield Item(cand_topic, user, _candidate(
                    user, _id(user, topic, "contradiction"), ts, contradiction, sens, mtype,
                    confidence=0.8, valid_from=ts - 10 * MINUTE,
                    # explicit supersession names the node the pipeline formed for variant 0
                    supersedes=node_id_for(user, _id(user, topic, "v", 0)) if explicit else None,
                    embedding=_embedding(rng, topic, 0.25) if use_embedding else None))
        for i_no, (content, ftype, extra, source) in enumerate(INSTRUCTIONS):
            if (i_no + u_index) % 2:
                continue
            ts += MINUTE
            yield Item(cand_topic, user, _candidate(
                user, _id(user, "instruction", i_no), ts, content, "none", "semantic",
                frontmatter_type=ftype, extra=extra or None, source=source))
        # bad input: a candidate with no sensitivity (fail closed → dead letter)
        ts += MINUTE
        yield Item(cand_topic, user, _candidate(
            user, _id(user, "no-sensitivity"), ts, "The user's passport number is X1234567.", None, "semantic"))
        yield from _device_events(rng, user, ts)
        yield from _turns(user, ts)


def node_id_for(user: str, candidate_id: str) -> str:
    """The node id the pipeline derives for an accepted candidate (see streams/core/ids.py)."""
    from streams.core import ids

    return ids.node_id_for(user, candidate_id)


def _device_events(rng: random.Random, user: str, ts: int) -> Iterator[Item]:
    """Memory events written directly by a device: formed, accessed, pinned, deleted; with a
    duplicate event id and two events delivered out of order."""
    topic = catalog.MEMORY_EVENTS
    n1, n2 = _id(user, "device-node", 1), _id(user, "device-node", 2)
    clock = 1
    events = []
    for node, text, sens in ((n1, "The user's bike is a green Brompton.", "none"),
                             (n2, "The user's therapist is Dr. Okafor.", "medical")):
        ts += MINUTE
        events.append(_event(user, _id(user, "formed", node), ts, clock, "memory_formed",
                             {"node_id": node, "content": text, "sensitivity": sens, "source": "user_stated"}))
        clock += 1
    for k in range(3):
        ts += MINUTE
        events.append(_event(user, _id(user, "accessed", n1, k), ts, clock, "memory_accessed", {"node_id": n1}))
        clock += 1
    ts += MINUTE
    events.append(_event(user, _id(user, "pinned", n1), ts, clock, "memory_pinned", {"node_id": n1, "pinned": True}))
    clock += 1
    ts += MINUTE
    events.append(_event(user, _id(user, "deleted", n2), ts, clock, "memory_deleted", {"node_id": n2}))
    clock += 1
    # a peer re-sends the deleted node's content: must never re-form it
    ts += MINUTE
    events.append(_event(user, _id(user, "reformed", n2), ts, clock, "memory_formed",
                         {"node_id": _id(user, "device-node", 3), "content": "The user's therapist is Dr. Okafor.",
                          "sensitivity": "medical", "source": "peer_agent"}))
    clock += 1
    duplicate = dict(events[2])  # the first access again, same event id: dropped and counted
    events.append(duplicate)
    # out of order: swap the pin and the last access in delivery order
    events[4], events[5] = events[5], events[4]
    for ev in events:
        yield Item(topic, user, ev)


def _turns(user: str, ts: int) -> Iterator[Item]:
    for t_no, (msg, reply, tagged) in enumerate(TURNS):
        ts += MINUTE
        yield Item(catalog.MEMORY_TURNS, user, {
            "turn_id": _id(user, "turn", t_no), "motebit_id": user, "timestamp": ts,
            "user_message": msg, "agent_reply": reply, "tagged_memories": tagged})


def negotiator_items(users: list[str], epoch_ms: int = EPOCH_MS) -> Iterator[Item]:
    for u_index, user in enumerate(users[:2]):
        ts = epoch_ms + 3 * 60 * MINUTE + u_index * MINUTE
        for r_no, (op, kind, text) in enumerate(NEGOTIATOR):
            ts += MINUTE
            yield Item(catalog.NEGOTIATOR_REQUESTS, user, {
                "request_id": _id(user, "negotiator", r_no), "user_id": user, "op": op,
                "kind": kind, "content": text if op == "remember" else None,
                "sessionId": f"chat-{user}" if op == "remember" else None,
                "memoryId": None, "description": text if op == "forget" else None, "timestamp": ts})


def session_items(seed: int) -> Iterator[Item]:
    from streams.sessions import samples

    for session in samples.generate_sessions(seed):
        for ev in session.events:  # keyed by the session, even the event whose content names another
            yield Item(catalog.SESSION_EVENTS, session.session_id, ev)


def graph_items(seed: int) -> Iterator[Item]:
    from streams.graphs import samples

    for run in samples.generate_graph_runs(seed):
        for ev in run.events:
            yield Item(catalog.GRAPH_EVENTS, ev["graphId"], ev)


def garbage_items(users: list[str]) -> Iterator[Item]:
    """Records no schema can read: JSON where Avro is expected, a truncated frame, random bytes."""
    user = users[0]
    yield Item(catalog.MEMORY_CANDIDATES, user, b'{"candidate_id": "json-not-avro", "content": "hi"}')
    yield Item(catalog.MEMORY_EVENTS, user, b"\xc3\x01\x00\x01")  # single-object header cut short
    yield Item(catalog.GRAPH_EVENTS, "g-garbage", bytes(range(7, 40)))


KINDS = ("memory", "negotiator", "sessions", "graphs", "garbage")


def generate(seed: int = 7, users: int = 5, kinds: tuple[str, ...] = KINDS, epoch_ms: int = EPOCH_MS) -> list[Item]:
    """The sample stream; memory and negotiator timestamps start at `epoch_ms`."""
    rng = random.Random(seed)
    chosen = (USERS * (users // len(USERS) + 1))[:users]
    chosen = [u if i < len(USERS) else f"{u}-{i // len(USERS)}" for i, u in enumerate(chosen)]
    items: list[Item] = []
    if "memory" in kinds:
        items += memory_items(rng, chosen, epoch_ms)
    if "negotiator" in kinds:
        items += negotiator_items(chosen, epoch_ms)
    if "sessions" in kinds:
        items += session_items(seed)
    if "graphs" in kinds:
        items += graph_items(seed)
    if "garbage" in kinds:
        items += garbage_items(chosen)
    return items


def interleave(items: Iterable[Item]) -> list[Item]:
    """Round-robin over keys (many users at once), each key's records in their order (how the
    e2e bench sends the stream; the golden-output test of the core replays it the same way)."""
    lanes: dict[str, deque[Item]] = defaultdict(deque)
    for item in items:
        lanes[item.key].append(item)
    queues, out = list(lanes.values()), []
    while queues:
        out += [q.popleft() for q in queues]
        queues = [q for q in queues if q]
    return out


def write_jsonl(items: list[Item], path: str) -> None:
    import orjson

    with open(path, "wb") as f:
        for item in items:
            f.write(orjson.dumps(item.as_json()) + b"\n")


def read_jsonl(path: str) -> list[Item]:
    import orjson

    with open(path, "rb") as f:
        return [Item.from_json(orjson.loads(line)) for line in f if line.strip()]


def produce(items: list[Item], settings, progress: bool = True) -> int:
    """Produce items into their topics (murmur2 partitioning, the configured wire format)."""
    from confluent_kafka import Producer

    from streams.contracts.wire import CodecFactory, encode_key
    from streams.tools.progress import Progress

    factory = CodecFactory.from_url(settings.registry_url)
    factory.register(sorted({i.topic for i in items}))
    producer = Producer({"bootstrap.servers": settings.broker, "partitioner": "murmur2_random",
                         "linger.ms": 20, "enable.idempotence": True, "log_level": 0})
    bar = Progress(len(items), "records produced") if progress else None
    failures: list[str] = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    for item in items:
        value = item.value if isinstance(item.value, bytes) else \
            factory.codec(catalog.topic(item.topic).value_schema).encode(item.value)
        while True:
            try:
                producer.produce(item.topic, key=encode_key(item.key), value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        if bar:
            bar.advance()
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining + len(failures)} record(s) not delivered: {failures[:3]}")
    return len(items)
