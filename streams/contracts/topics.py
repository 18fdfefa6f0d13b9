"""`memstream topics apply`: create the catalog's topics and report drift.

Topics are created by the project (never by broker auto-creation) with the partitions,
replication factor and configuration from `streams/contracts/catalog.py`. An existing topic whose
partition count or cleanup policy differs from the catalog is reported, never silently altered
(shrinking partitions is impossible and re-keying a live topic is an operator's decision).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from streams.contracts import catalog
from streams.settings import Settings


class TopicError(RuntimeError):
    """The broker refused or could not be reached; the message names the topic."""


@dataclass(frozen=True)
class Drift:
    topic: str
    what: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.what} is {self.actual}, catalog says {self.expected}"


COMPATIBILITY = "FULL_TRANSITIVE"  # why: README "Records and wire format"


@dataclass
class ApplyReport:
    created: list[str]
    existing: list[str]
    drift: list[Drift]
    subjects: dict[str, int] = field(default_factory=dict)  # subject -> schema id

    @property
    def ok(self) -> bool:
        return not self.drift


def admin_client(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.broker, "log_level": 0})


def apply(settings: Settings, admin: AdminClient | None = None, timeout: float = 30.0) -> ApplyReport:
    admin = admin or admin_client(settings)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 -- KafkaException: broker unreachable
        raise TopicError(f"cannot reach Kafka at {settings.broker} ({exc}); is the stack up? try `memstream dev up`") from None
    missing = [t for t in catalog.topics() if t.name not in md.topics]
    existing = [t for t in catalog.topics() if t.name in md.topics]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(
            [NewTopic(t.name, t.partitions(settings), t.replication(settings), config=t.config()) for t in missing],
            operation_timeout=timeout,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except Exception as exc:  # noqa: BLE001
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    existing.append(catalog.topic(name))
                    continue
                raise TopicError(f"could not create {name}: {exc}") from None
    drift = _drift(settings, admin, existing, timeout)
    subjects = apply_registry(settings) if settings.registry_url else {}
    return ApplyReport(created=created, existing=[t.name for t in existing], drift=drift, subjects=subjects)


def apply_registry(settings: Settings) -> dict[str, int]:
    """Set every memstream subject (`<topic>-value`) to FULL_TRANSITIVE, then register the current
    schema under it: the registry itself then refuses any later incompatible version."""
    from streams.contracts.wire import CodecFactory, RegistryError

    factory = CodecFactory.from_url(settings.registry_url)
    out: dict[str, int] = {}
    for spec in catalog.topics():
        subject = f"{spec.name}-value"
        try:
            factory.registry.set_compatibility(subject_name=subject, level=COMPATIBILITY)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - registry unreachable or refusing
            raise TopicError(f"could not set {COMPATIBILITY} on subject {subject} at {settings.registry_url}: {exc}") from None
        try:
            out[subject] = factory.register([spec.name])[spec.name]
        except RegistryError as exc:
            raise TopicError(f"{exc}; the schema in schemas/{spec.value_schema}.avsc is not {COMPATIBILITY} "
                             "with what the registry holds") from None
    return out


def _drift(settings: Settings, admin: AdminClient, specs: list[catalog.TopicSpec], timeout: float) -> list[Drift]:
    if not specs:
        return []
    md = admin.list_topics(timeout=timeout)
    out: list[Drift] = []
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t.name) for t in specs]
    configs = admin.describe_configs(resources, request_timeout=timeout)
    for spec, res in zip(specs, resources, strict=True):
        actual_parts = len(md.topics[spec.name].partitions)
        if actual_parts != spec.partitions(settings):
            out.append(Drift(spec.name, "partition count", str(spec.partitions(settings)), str(actual_parts)))
        entries = configs[res].result(timeout=timeout)
        policy = entries["cleanup.policy"].value
        if _policy_set(policy) != _policy_set(spec.cleanup_policy):
            out.append(Drift(spec.name, "cleanup.policy", spec.cleanup_policy, policy))
    return out


def _policy_set(policy: str) -> frozenset[str]:
    return frozenset(p.strip() for p in policy.split(",") if p.strip())


def topic_partitions(settings: Settings, admin: AdminClient | None = None, timeout: float = 15.0) -> dict[str, int]:
    """Every topic on the broker and its partition count."""
    admin = admin or admin_client(settings)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 -- KafkaException: broker unreachable
        raise TopicError(f"cannot reach Kafka at {settings.broker} ({exc}); is the stack up? try `memstream dev up`") from None
    return {name: len(t.partitions) for name, t in md.topics.items()}


def missing_topics(settings: Settings, topics: dict[str, int] | None = None) -> list[str]:
    """Catalog topics that do not exist (the worker refuses to start while any is missing)."""
    present = topic_partitions(settings) if topics is None else topics
    return [t.name for t in catalog.topics() if t.name not in present]


def ensure_internal(settings: Settings, topics: list[tuple[str, int, dict[str, str]]], timeout: float = 60.0,
                    admin: AdminClient | None = None) -> list[str]:
    """Create the worker's internal topics and table changelogs `(name, partitions, config)` that
    are missing and wait until every partition of each has a leader; returns the names created."""
    import time

    admin = admin or admin_client(settings)
    try:
        md = admin.list_topics(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 -- KafkaException: broker unreachable
        raise TopicError(f"cannot reach Kafka at {settings.broker} ({exc}); is the stack up? try `memstream dev up`") from None
    new = [NewTopic(name, partitions, settings.replication, config=dict(config))
           for name, partitions, config in topics if name not in md.topics]
    for name, partitions, _config in topics:
        have = len(md.topics[name].partitions) if name in md.topics and md.topics[name].error is None else partitions
        if have != partitions:
            raise TopicError(f"{name} has {have} partitions, this deployment runs on {partitions}: its partition count "
                             "was changed by hand; use `memstream repartition --to M`, which carries the tables' state")
    for name, fut in (admin.create_topics(new, request_timeout=timeout).items() if new else ()):
        try:
            fut.result()
        except Exception as exc:  # noqa: BLE001 - another worker created it first: fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                raise TopicError(f"cannot create internal topic {name}: {exc}") from None
    deadline = time.monotonic() + timeout
    names = [name for name, _, _ in topics]
    while True:
        md = admin.list_topics(timeout=timeout)
        led = all(n in md.topics and md.topics[n].error is None and md.topics[n].partitions
                  and all(p.leader >= 0 for p in md.topics[n].partitions.values()) for n in names)
        if led:
            return [t.topic for t in new]
        if time.monotonic() > deadline:
            raise TopicError(f"internal topics {', '.join(names)} have no partition leaders after {timeout:.0f}s")
        time.sleep(0.2)
