"""The client examples in examples/ (Python, TypeScript, Java) against the real stack and worker.

Each example runs as a user would run it, as a subprocess with MEMSTREAM_BROKER and
MEMSTREAM_REGISTRY_URL set and its own user id: it produces one memory candidate, deletes the node
memstream formed, and reads the ledger, the relay and the node table. Its last stdout line is a
JSON summary of what it saw, checked here; the test also reads back what the client wrote (the
framing, the schema id and the deletion's union branch) and the dead-letter topic.

A language whose toolchain is missing (node/npm, mvn/java) is skipped with the reason. The builds
are cached in gitignored folders: examples/typescript/node_modules (`npm ci` only when
package-lock.json is newer) and examples/java/target (`mvn package` only when a source, the pom
or a schema is newer than the jar); each is built at most once per module.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from fastavro import schemaless_reader

from streams.contracts import catalog, schemas
from streams.core.ids import node_id_for
from tests.conftest import ROOT
from tests.kafka_util import read_to_end, worker

pytestmark = pytest.mark.kafka

EXAMPLES = ROOT / "examples"
TS_DIR = EXAMPLES / "typescript"
JAVA_DIR = EXAMPLES / "java"
CLIENT_TIMEOUT_S = 60  # each client's own bound on each wait (it exits 1 naming what it waited for)
FORMED = "memstream.memory.MemoryFormedPayload"
DELETED = "memstream.memory.MemoryDeletedPayload"
CONSOLIDATED = "memstream.memory.MemoryConsolidatedPayload"


@pytest.fixture(scope="module")
def examples_worker(stack):
    """One memstream worker for the module: every client talks to it."""
    run = uuid.uuid4().hex[:8]
    with worker(stack, f"examples-{run}", env={"MEMSTREAM_APP_ID": f"it-examples-{run}"}):
        yield stack


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    print(f"[examples] {' '.join(cmd[:3])} … in {time.monotonic() - started:.1f}s", file=sys.stderr)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _newest(paths) -> float:
    return max((p.stat().st_mtime for p in paths if p.is_file()), default=0.0)


@pytest.fixture(scope="module")
def typescript_client():
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"TypeScript example not run: {' and '.join(missing)} not on PATH (Node 20+ needed)")
    installed = TS_DIR / "node_modules" / ".package-lock.json"  # written by npm ci
    if not installed.is_file() or installed.stat().st_mtime < _newest([TS_DIR / "package-lock.json",
                                                                          TS_DIR / "package.json"]):
        _run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], TS_DIR, timeout=600)
    # the example compiles against memstream's generated types (contracts/typescript/memstream.d.ts)
    _run(["npm", "run", "--silent", "typecheck"], TS_DIR, timeout=300)
    return [str(TS_DIR / "node_modules" / ".bin" / "tsx"), "memstream-example.ts"], TS_DIR


@pytest.fixture(scope="module")
def java_client():
    missing = [tool for tool in ("mvn", "java") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"Java example not run: {' and '.join(missing)} not on PATH (Java 17+ and Maven 3.8+ needed)")
    jar = JAVA_DIR / "target" / "memstream-example.jar"
    sources = [JAVA_DIR / "pom.xml", *(JAVA_DIR / "src").rglob("*"),
               *(ROOT / "schemas" / f for f in ("candidate_memory.avsc", "memory_event.avsc", "memory_node.avsc"))]
    if not jar.is_file() or not (JAVA_DIR / "target" / "lib").is_dir() or jar.stat().st_mtime < _newest(sources):
        _run(["mvn", "-B", "-q", "package"], JAVA_DIR, timeout=900)
    return ["java", "-jar", str(jar)], JAVA_DIR


def run_example(stack, cmd: list[str], cwd: Path, user: str) -> dict:
    """Run one client as a user would, with the stack's addresses in the environment; its parsed
    last stdout line."""
    env = {**os.environ, "MEMSTREAM_BROKER": stack.broker, "MEMSTREAM_REGISTRY_URL": stack.registry_url}
    started = time.monotonic()
    proc = subprocess.run([*cmd, user, "--timeout", str(CLIENT_TIMEOUT_S)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=3 * CLIENT_TIMEOUT_S)
    print(f"[examples] {cmd[-1]} for {user}: exit {proc.returncode} in {time.monotonic() - started:.1f}s",
          file=sys.stderr)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, \
        f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert len(lines) > 1, "the example prints what it saw for people before its JSON line"
    return json.loads(lines[-1])


def check_summary(summary: dict, client: str, user: str) -> None:
    assert summary["client"] == client and summary["user"] == user and "error" not in summary
    cid, node, deletion = summary["candidate_id"], summary["node_id"], summary["deletion_id"]
    assert node == node_id_for(user, cid)  # the derived id, as docs/contract.md says any consumer can compute it
    content = next(e["content"] for e in summary["ledger"] if e["event_type"] == "memory_formed")
    assert content.startswith("The user prefers green tea")

    # the candidate's ledger events: formed, then the accept decision; then the deletion passed through
    assert [(e["event_type"], e["branch"], e["node_id"]) for e in summary["ledger"]] == [
        ("memory_formed", FORMED, node), ("memory_consolidated", CONSOLIDATED, node), ("memory_deleted", DELETED, node)]
    assert summary["ledger"][1]["action"] == "accept"
    assert summary["ledger"][2]["event_id"] == deletion

    # the relay: personal is within the default threshold, so the content passes; the deletion is
    # followed by its tombstone (content withheld)
    relay = summary["relay"]
    assert [(e["event_type"], e["branch"], e["node_id"]) for e in relay] == [
        ("memory_formed", FORMED, node), ("memory_consolidated", CONSOLIDATED, node),
        ("memory_deleted", DELETED, node), ("memory_formed", FORMED, node)]
    assert relay[0]["content"] == content and not relay[0]["redacted"]
    assert relay[1]["action"] == "accept" and relay[2]["event_id"] == deletion
    assert relay[3]["content"] == "[REDACTED]" and relay[3]["redacted"] is True
    assert relay[3]["redacted_reason"] == "deleted"

    # the node table: the row, then its tombstone
    key = f"{user}/{node}"
    assert list(summary["nodes"]) == [key]
    row, tombstone = summary["nodes"][key]
    assert row["node_id"] == node and row["content"] == content and row["sensitivity"] == "personal"
    assert row["origin_event_id"] == cid and row["reinforcement_count"] == 0
    assert tombstone is None


def latest_schema_id(registry_url: str, topic: str) -> int:
    with urllib.request.urlopen(f"{registry_url}/subjects/{topic}-value/versions/latest", timeout=30) as r:
        return json.loads(r.read())["id"]


def check_what_the_client_wrote(stack, summary: dict, user: str) -> None:
    """Independently of the client: its two records are Confluent-framed with the registry's id,
    the deletion's payload is the MemoryDeletedPayload branch, and nothing of the user was
    dead-lettered (a wrong partitioner would show here as wrong_partition)."""
    key = user.encode()
    for topic, stem, ident, field in ((catalog.MEMORY_CANDIDATES, "candidate_memory", summary["candidate_id"], "candidate_id"),
                                      (catalog.MEMORY_EVENTS, "memory_event", summary["deletion_id"], "event_id")):
        mine = read_to_end(stack, topic, {key}, decode=False)
        assert len(mine) == 1, f"{topic}: {len(mine)} records of {user}"
        raw = mine[0]["raw"]
        assert raw[0] == 0 and int.from_bytes(raw[1:5], "big") == latest_schema_id(stack.registry_url, topic), raw[:5]
        record = schemaless_reader(io.BytesIO(raw[5:]), schemas.parsed(stem), return_record_name=True)
        assert record[field] == ident
        if stem == "memory_event":
            assert record["payload"] == (DELETED, {"node_id": summary["node_id"]})
    assert read_to_end(stack, catalog.DLQ, {key}, decode=False) == []


def round_trip(stack, language: str, cmd: list[str], cwd: Path) -> None:
    """One client's whole round trip for a user of its own, checked from its summary and from
    what it wrote to the topics."""
    user = f"mb-ex-{language[:4]}-{uuid.uuid4().hex[:8]}"
    summary = run_example(stack, cmd, cwd, user)
    check_summary(summary, language, user)
    check_what_the_client_wrote(stack, summary, user)


def test_python_example(examples_worker):
    round_trip(examples_worker, "python", [sys.executable, str(EXAMPLES / "python" / "memstream_example.py")], ROOT)


def test_typescript_example(typescript_client, examples_worker):
    round_trip(examples_worker, "typescript", *typescript_client)


def test_java_example(java_client, examples_worker):
    round_trip(examples_worker, "java", *java_client)
