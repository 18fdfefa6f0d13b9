"""`memstream dev up | down | status | logs`: a local Kafka + Schema Registry without Docker.

Apache Kafka (single-node KRaft) and Apicurio Registry 3.x are fetched from Maven Central with
`mvn` into the cache dir (outside git, reused by later runs), then run with the JDK on loopback.
Each process's pid is kept in a pid file under the stack dir; `down` stops exactly those.

Kafka runs on the `java` on PATH (17+). Apicurio Registry 3.3 is compiled for Java 21, so it
runs on the first Java 21+ found (MEMSTREAM_REGISTRY_JAVA, JAVA_HOME, /usr/lib/jvm/*).
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from streams.settings import Settings

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
SLF4J_BINDING = ("org.slf4j", "slf4j-simple", "1.7.36")


class StackError(RuntimeError):
    """Something about the local stack is wrong; the message says what and what to do."""


def _say(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- fetching


def _require_tool(name: str, hint: str) -> str:
    path = shutil.which(name)
    if not path:
        raise StackError(f"`{name}` is not on PATH: {hint}")
    return path


def _run_mvn(args: list[str], cwd: Path, log: Path, what: str) -> None:
    mvn = _require_tool("mvn", "install Maven 3.8+ (e.g. apt-get install maven)")
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([mvn, "-B", *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        started = time.monotonic()
        while proc.poll() is None:
            time.sleep(2)
            _say(f"  … fetching {what} with mvn ({time.monotonic() - started:.0f}s, log {log})")
    if proc.returncode != 0:
        raise StackError(f"mvn could not fetch {what}; read {log}")


def _kafka_pom(version: str) -> str:
    g, a, v = SLF4J_BINDING
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>memstream.devstack</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>
  </dependencies>
</project>
"""


@contextmanager
def _cache_lock(home: Path) -> Iterator[None]:
    """One fetch of a cache entry at a time: two `dev up` started together (two checkouts, two
    test sessions) would otherwise unpack into the same directory while the other starts from it."""
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_kafka(settings: Settings) -> Path:
    """Kafka's jars (and an slf4j binding) in the cache; fetched once per version."""
    home = Path(settings.cache_dir) / f"kafka-{settings.kafka_version}"
    with _cache_lock(home):
        return _ensure_kafka(settings, home)


def _ensure_kafka(settings: Settings, home: Path) -> Path:
    marker = home / ".complete"
    if marker.exists():
        return home / "libs"
    _say(f"fetching Apache Kafka {settings.kafka_version} from Maven Central into {home}")
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(_kafka_pom(settings.kafka_version))
    _run_mvn(
        [f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
         f"-DoutputDirectory={home / 'libs'}"],
        home, home / "mvn.log", f"Kafka {settings.kafka_version}",
    )
    marker.write_text(settings.kafka_version)
    return home / "libs"


def ensure_registry(settings: Settings) -> Path:
    """Apicurio Registry's Quarkus app in the cache; fetched and unpacked once per version."""
    home = Path(settings.cache_dir) / f"apicurio-{settings.apicurio_version}"
    with _cache_lock(home):
        return _ensure_registry(settings, home)


def _ensure_registry(settings: Settings, home: Path) -> Path:
    version = settings.apicurio_version
    marker = home / ".complete"
    app = home / "app"
    if marker.exists():
        return app
    _say(f"fetching Apicurio Registry {version} from Maven Central into {home}")
    dl = home / "download"
    home.mkdir(parents=True, exist_ok=True)
    _run_mvn(
        [f"{MAVEN_DEPENDENCY_PLUGIN}:copy", f"-Dartifact=io.apicurio:apicurio-registry-app:{version}:tar.gz:all",
         f"-DoutputDirectory={dl}"],
        Path(settings.cache_dir), home / "mvn.log", f"Apicurio Registry {version}",
    )
    archives = list(dl.glob("*.tar.gz"))
    if not archives:
        raise StackError(f"mvn reported success but no Apicurio archive is in {dl}; read {home / 'mvn.log'}")
    if app.exists():
        shutil.rmtree(app)
    app.mkdir(parents=True)
    with tarfile.open(archives[0]) as tar:
        tar.extractall(app, filter="data")
    if not (app / "quarkus-run.jar").exists():
        raise StackError(f"{archives[0]} has no quarkus-run.jar; delete {home} and retry")
    archives[0].unlink()
    marker.write_text(version)
    return app


# --------------------------------------------------------------------------- java


def _java_major(java: str) -> int:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return 0
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def find_java(min_major: int, explicit: str = "") -> str:
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    if shutil.which("java"):
        candidates.append(shutil.which("java") or "java")
    candidates += sorted((str(p) for p in Path("/usr/lib/jvm").glob("*/bin/java")), reverse=True)
    for java in candidates:
        if Path(java).exists() and _java_major(java) >= min_major:
            return java
    raise StackError(
        f"no Java {min_major}+ found (tried {', '.join(candidates) or 'nothing'}); "
        f"install a JDK {min_major}+ or set MEMSTREAM_REGISTRY_JAVA to its java binary"
    )


# --------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class Service:
    name: str
    marker: str  # a string that must be in the process's command line (pid-reuse guard)

    def pid_file(self, s: Settings) -> Path:
        return Path(s.stack_dir) / f"{self.name}.pid"

    def log_file(self, s: Settings) -> Path:
        return Path(s.stack_dir) / "logs" / f"{self.name}.log"

    def pid(self, s: Settings) -> int | None:
        """The pid of our running process, or None (a stale pid file is removed)."""
        f = self.pid_file(s)
        if not f.exists():
            return None
        try:
            pid = int(f.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (ValueError, OSError):
            f.unlink(missing_ok=True)
            return None
        if self.marker not in cmdline:
            return None  # not ours (pid reused) or still exec-ing; `up` overwrites the file
        return pid


KAFKA = Service("kafka", "kafka.Kafka")
REGISTRY = Service("registry", "quarkus-run.jar")
SERVICES = (KAFKA, REGISTRY)


def free_port(low: int, high: int) -> int:
    """A port of [low, high) that nothing on 127.0.0.1 holds now, for a worker's web server
    (tests, bench). Keep `high` below 32768: above it the kernel hands ports to outgoing
    connections, which could take the port before the worker binds it."""
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}..{high}")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) != 0


def _spawn(service: Service, s: Settings, argv: list[str], cwd: Path) -> int:
    log = service.log_file(s)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    service.pid_file(s).write_text(str(proc.pid))
    return proc.pid


def _wait(service: Service, s: Settings, pid: int, ready: Callable[[], bool]) -> float:
    started = time.monotonic()
    last_note = started
    while True:
        if not _alive(pid):
            raise StackError(f"{service.name} exited during start-up; read {service.log_file(s)}")
        if ready():
            return time.monotonic() - started
        now = time.monotonic()
        if now - started > s.stack_timeout:
            raise StackError(
                f"{service.name} did not answer within {s.stack_timeout:.0f}s; read {service.log_file(s)}"
            )
        if now - last_note > 10:
            _say(f"  … waiting for {service.name} ({now - started:.0f}s)")
            last_note = now
        time.sleep(0.5)


def kafka_ready(s: Settings, timeout: float = 2.0) -> bool:
    """The broker answers metadata and every partition it already has is led (after a restart
    it loads its logs first: an open port, even an answered metadata request, is not ready)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": s.broker, "socket.timeout.ms": int(timeout * 1000),
                         "log_level": 0})
    try:
        md = admin.list_topics(timeout=timeout)
        return bool(md.brokers) and all(
            t.error is None and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
            for t in md.topics.values())
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False


def registry_ready(s: Settings, timeout: float = 2.0) -> bool:
    """The registry answers its API and its storage is ready: with KafkaSQL storage it reads its
    journal topic first, and until it has, it would answer as an empty registry (Quarkus'
    readiness check on the management port, the registry port + 1, says when it has)."""
    host, port = s.registry_host_port
    try:
        with urllib.request.urlopen(f"http://{host}:{port + 1}/health/ready", timeout=timeout) as r:
            if r.status != 200:
                return False
        with urllib.request.urlopen(s.registry_url.rstrip("/") + "/subjects", timeout=timeout) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def create_registry_topics(s: Settings, timeout: float = 30.0) -> list[str]:
    """Create the registry's storage topics (streams/contracts/catalog.py REGISTRY_TOPICS) that are missing
    and wait for their leaders; returns the names created. Explicit, so that their configuration
    (never compacted, never expired) comes from the catalog, not from a broker default."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from streams.contracts import catalog

    admin = AdminClient({"bootstrap.servers": s.broker, "log_level": 0})
    existing = admin.list_topics(timeout=timeout).topics
    new = [NewTopic(t.name, 1, s.replication, config=t.config())
           for t in catalog.REGISTRY_TOPICS if t.name not in existing]
    created = []
    for name, fut in (admin.create_topics(new, operation_timeout=timeout).items() if new else ()):
        try:
            fut.result()
            created.append(name)
        except Exception as exc:  # noqa: BLE001
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise StackError(f"could not create the registry's storage topic {name}: {exc}") from None
    deadline = time.monotonic() + timeout
    while not kafka_ready(s):
        if time.monotonic() > deadline:
            raise StackError(f"the registry's storage topics have no leader after {timeout:.0f}s")
        time.sleep(0.2)
    return created


def _kafka_properties(s: Settings, data: Path) -> str:
    host, port = s.broker_host_port
    c = s.controller_port
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{c}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{c}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=10",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "log.segment.bytes=67108864",
        "log.cleaner.min.compaction.lag.ms=0",
        "",
    ])


def _start_kafka(s: Settings, libs: Path) -> float:
    root = Path(s.stack_dir).resolve()
    data = root / "kafka-data"
    conf = root / "kafka.properties"
    conf.write_text(_kafka_properties(s, data))
    java = _require_tool("java", "install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)")
    cp = f"{libs}/*"
    jvm = [*_jvm_options(s.kafka_jvm_options), "-Djava.awt.headless=true",
           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
           "-Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info",
           "-Dorg.slf4j.simpleLogger.showDateTime=true"]
    if not (data / "meta.properties").exists():
        cluster_id = _kafka_cluster_id()
        with open(KAFKA.log_file(s), "ab") as log:
            formatted = subprocess.run(
                [java, *jvm, "-cp", cp, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(conf)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        if formatted.returncode != 0:
            raise StackError(f"formatting Kafka's storage failed; read {KAFKA.log_file(s)}")
    pid = _spawn(KAFKA, s, [java, *jvm, "-cp", cp, "kafka.Kafka", str(conf)], root)
    return _wait(KAFKA, s, pid, lambda: kafka_ready(s))


def _jvm_options(line: str) -> list[str]:
    """`kafka_jvm_options` as arguments; a line the shell could not split fails `dev up` by name."""
    import shlex

    try:
        return shlex.split(line)
    except ValueError as exc:
        raise StackError(f"MEMSTREAM_KAFKA_JVM_OPTIONS cannot be split into options ({exc}): {line!r}") from None


def _kafka_cluster_id() -> str:
    """A random Kafka cluster id (base64url of 16 bytes). Like Kafka's own Uuid.randomUuid, never
    one starting with "-", which the storage tool's argument parser would take for an option."""
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def registry_storage_properties(s: Settings) -> list[str]:
    """Apicurio's KafkaSQL storage in the stack's own broker: every subject, schema and id is in
    the journal topic, so a registry restart (or `dev down` without --wipe) keeps every id. The
    topics are ours (created from the catalog before the registry starts), not auto-created."""
    from streams.contracts import catalog

    return ["-Dapicurio.storage.kind=kafkasql", f"-Dapicurio.kafkasql.bootstrap.servers={s.broker}",
            "-Dapicurio.kafkasql.topic.auto-create=false",
            # its start-up reads the journal and snapshots topics, each until one poll returns
            # nothing: 1 s instead of 5 s per such poll (a registry restart ~10 s shorter)
            "-Dapicurio.kafkasql.consumer.poll.timeout=1000",
            *(f"-D{t.apicurio_property}={t.name}" for t in catalog.REGISTRY_TOPICS)]


def _start_registry(s: Settings, app: Path) -> float:
    java = find_java(21, s.registry_java)
    host, port = s.registry_host_port
    argv = [java, "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",  # C1 only: starts faster, ample here
            # class-data sharing archive in the cache, written by the first run: later starts load faster
            f"-XX:SharedArchiveFile={app.parent / 'registry-cds.jsa'}", "-XX:+AutoCreateSharedArchive",
            f"-Dquarkus.http.port={port}", f"-Dquarkus.http.host={host}",
            # the management interface (health, metrics) is on by default at :9000: give each
            # registry its own port next to its HTTP port so several can run side by side
            f"-Dquarkus.management.host={host}", f"-Dquarkus.management.port={port + 1}",
            "-Dquarkus.log.level=WARN", "-Dquarkus.banner.enabled=false",
            *registry_storage_properties(s),
            "-jar", str(app / "quarkus-run.jar")]
    created = create_registry_topics(s)
    if created:
        _say(f"created the registry's storage topics {', '.join(created)}")
    pid = _spawn(REGISTRY, s, argv, Path(s.stack_dir).resolve())
    return _wait(REGISTRY, s, pid, lambda: registry_ready(s))


# --------------------------------------------------------------------------- commands


def up(s: Settings) -> int:
    Path(s.stack_dir).mkdir(parents=True, exist_ok=True)
    (Path(s.stack_dir) / "logs").mkdir(exist_ok=True)
    running = [svc.name for svc in SERVICES if svc.pid(s)]
    if len(running) == len(SERVICES):
        _say(f"stack already up (kafka {s.broker}, registry {s.registry_url}); nothing to do")
        return 0
    started = time.monotonic()
    _require_tool("java", "install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)")
    libs = ensure_kafka(s)
    app = ensure_registry(s) if s.registry_url else None
    if KAFKA.pid(s) is None:
        host, port = s.broker_host_port
        for p in (port, s.controller_port):
            if not _port_free(host, p):
                raise StackError(f"port {host}:{p} is taken by another process; stop it or set MEMSTREAM_BROKER / MEMSTREAM_CONTROLLER_PORT")
        _say(f"starting Kafka {s.kafka_version} (KRaft) on {s.broker}")
        t = _start_kafka(s, libs)
        _say(f"kafka ready after {t:.1f}s")
    if app is not None and REGISTRY.pid(s) is None:
        host, port = s.registry_host_port
        for p in (port, port + 1):
            if not _port_free(host, p):
                raise StackError(f"port {host}:{p} is taken by another process; stop it or set MEMSTREAM_REGISTRY_URL "
                                 "(the registry uses its port and the next one)")
        _say(f"starting Apicurio Registry {s.apicurio_version} on {s.registry_url}")
        t = _start_registry(s, app)
        _say(f"registry ready after {t:.1f}s")
    _say(f"stack up in {time.monotonic() - started:.1f}s (logs: {Path(s.stack_dir) / 'logs'})")
    return 0


def stop(s: Settings, svc: Service) -> None:
    """Stop one service of the stack (its data stays); `up` starts it again."""
    pid = svc.pid(s)
    if pid is None:
        _say(f"{svc.name}: not running")
        return
    _say(f"{svc.name}: stopping pid {pid}")
    _stop_pid(pid, svc.name)
    svc.pid_file(s).unlink(missing_ok=True)


def down(s: Settings, wipe: bool = False) -> int:
    for svc in reversed(SERVICES):
        stop(s, svc)
    if wipe:
        for sub in ("kafka-data", "kafka.properties"):
            p = Path(s.stack_dir) / sub
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        _say(f"wiped broker data (and with it the registry's storage topics) under {s.stack_dir}")
    return 0


def _stop_pid(pid: int, name: str, grace: float = 30.0) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.2)
    _say(f"{name}: did not stop within {grace:.0f}s; killing")
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"


def status(s: Settings) -> int:
    all_up = True
    for svc in SERVICES:
        pid = svc.pid(s)
        if svc is KAFKA:
            answer = kafka_ready(s) if pid else False
            where = s.broker
        else:
            answer = registry_ready(s) if pid else False
            where = s.registry_url
        state = "up" if pid and answer else ("starting/unresponsive" if pid else "down")
        all_up &= state == "up"
        _say(f"{svc.name:9} {state:22} pid={pid or '-'}  {where}  log={svc.log_file(s)}")
    return 0 if all_up else 1


def logs(s: Settings, name: str, lines: int = 50) -> int:
    services = {svc.name: svc for svc in SERVICES}
    if name not in services:
        raise StackError(f"unknown service {name!r}; choose one of {', '.join(services)}")
    log = services[name].log_file(s)
    if not log.exists():
        raise StackError(f"{log} does not exist yet; run `memstream dev up` first")
    with open(log, "rb") as f:
        tail = f.readlines()[-lines:]
    sys.stdout.write(b"".join(tail).decode(errors="replace"))
    return 0
