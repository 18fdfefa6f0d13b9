// memstream from TypeScript: produce one memory candidate, delete the memory it formed, and read
// what memstream wrote (ledger, relay, node table). kafkajs + @kafkajs/confluent-schema-registry,
// typed with memstream's generated contracts/typescript/memstream.d.ts. See README.md.
//
//   npx tsx memstream-example.ts mb-ada [--broker 127.0.0.1:19092]
//       [--registry http://127.0.0.1:18081/apis/ccompat/v7] [--timeout 60]
//
// The last line on stdout is one JSON object (what was seen); everything before it is for
// people. Exit status 0 when every expected record was seen, 1 (with an error naming what is
// missing) when the time ran out first.

import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type KafkaMessage } from "kafkajs";
import { SchemaRegistry } from "@kafkajs/confluent-schema-registry";
import type {
  CandidateMemory,
  MemoryEvent,
  MemoryNode,
  TopicName,
} from "../../contracts/typescript/memstream";

const CANDIDATES: TopicName = "memory.candidates.v1";
const EVENTS: TopicName = "memory.events.v1";
const LEDGER: TopicName = "memory.ledger.v1";
const RELAY: TopicName = "memory.relay.v1";
const NODES: TopicName = "memory.nodes.v1";

interface Args {
  user: string;
  broker: string;
  registry: string;
  timeoutMs: number;
}

function parseArgs(argv: string[]): Args {
  const args: Args = {
    user: "",
    broker: process.env.MEMSTREAM_BROKER ?? "127.0.0.1:19092",
    registry: process.env.MEMSTREAM_REGISTRY_URL ?? "http://127.0.0.1:18081/apis/ccompat/v7",
    timeoutMs: 60_000,
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--broker") args.broker = argv[++i];
    else if (a === "--registry") args.registry = argv[++i];
    else if (a === "--timeout") args.timeoutMs = Number(argv[++i]) * 1000;
    else if (!a.startsWith("--") && !args.user) args.user = a;
    else throw new Error(`unknown argument ${a}`);
  }
  if (!args.user) throw new Error("usage: memstream-example.ts <motebit_id> [--broker host:port] [--registry url] [--timeout s]");
  return args;
}

/** One ledger or relay event as the summary shows it. */
interface EventEntry {
  event_type: string;
  event_id: string;
  branch: string;
  node_id: string | null;
  action?: string;
  content?: string;
  redacted?: boolean | null;
  redacted_reason?: string | null;
}

/** A node row as the summary shows it; null = tombstone. */
type NodeEntry = Pick<MemoryNode, "node_id" | "content" | "sensitivity" | "confidence" | "reinforcement_count" | "origin_event_id"> | null;

/** The union branch avsc read (wrapUnions 'auto': `{ "<full name>": record }`) and its record. */
function unwrap(payload: MemoryEvent["payload"]): [string, Record<string, unknown>] {
  const [name, record] = Object.entries(payload)[0];
  return [name, record as Record<string, unknown>];
}

class Seen {
  candidateId: string | null = null;
  deletionId: string | null = null;
  nodeId: string | null = null;
  rejected: string | null = null;
  ledger: EventEntry[] = [];
  relay: EventEntry[] = [];
  nodes: Record<string, NodeEntry[]> = {};

  constructor(readonly user: string) {}

  wants(topic: string, key: string): boolean {
    return topic === NODES ? key.startsWith(`${this.user}/`) : key === this.user;
  }

  addNode(key: string, row: MemoryNode | null): void {
    // kept for every node of the user: the row can arrive before the ledger names the node
    (this.nodes[key] ??= []).push(row === null ? null : {
      node_id: row.node_id, content: row.content, sensitivity: row.sensitivity, confidence: row.confidence,
      reinforcement_count: row.reinforcement_count, origin_event_id: row.origin_event_id,
    });
    console.log(`  ${NODES.padEnd(16)} ${key}: ` + (row === null ? "null (tombstone: node deleted)"
      : `${JSON.stringify(row.content)} confidence ${row.confidence.toFixed(2)}`));
  }

  addEvent(topic: string, event: MemoryEvent): void {
    const [branch, payload] = unwrap(event.payload);
    const nodeId = (payload.node_id ?? payload.new_node_id ?? null) as string | null;
    const mine = event.caused_by?.id === this.candidateId
      || (this.nodeId !== null && nodeId === this.nodeId)
      || event.event_id === this.deletionId;
    if (!mine) return; // an earlier run's record of the same user
    const entry: EventEntry = { event_type: event.event_type, event_id: event.event_id, branch, node_id: nodeId };
    for (const f of ["action", "content", "redacted", "redacted_reason"] as const) {
      if (f in payload) (entry as unknown as Record<string, unknown>)[f] = payload[f];
    }
    if (topic === LEDGER) {
      if (event.event_type === "memory_formed" && this.nodeId === null) this.nodeId = nodeId;
      if (event.event_type === "memory_consolidated" && entry.action === "reject") {
        this.rejected = String(payload.reason ?? "rejected");
      }
      this.ledger.push(entry);
    } else {
      this.relay.push(entry);
    }
    const detail = entry.action ?? entry.redacted_reason ?? JSON.stringify(entry.content ?? "");
    console.log(`  ${topic.padEnd(16)} ${entry.event_type.padEnd(20)} node ${nodeId}  ${detail}`);
  }

  private has(events: EventEntry[], type: string, fields: Partial<EventEntry> = {}): boolean {
    return events.some((e) => e.event_type === type
      && Object.entries(fields).every(([k, v]) => (e as unknown as Record<string, unknown>)[k] === v));
  }

  private nodeKey(): string {
    return `${this.user}/${this.nodeId}`;
  }

  formedMissing(): string[] {
    if (this.rejected) throw new Error(`memstream rejected the candidate: ${this.rejected}`);
    if (this.nodeId === null) return [`memory_formed for candidate ${this.candidateId} on ${LEDGER}`];
    const out: string[] = [];
    if (!this.has(this.ledger, "memory_consolidated", { action: "accept" })) out.push(`memory_consolidated (accept) on ${LEDGER}`);
    if (!this.has(this.relay, "memory_formed", { node_id: this.nodeId })) out.push(`memory_formed of node ${this.nodeId} on ${RELAY}`);
    if (!(this.nodes[this.nodeKey()] ?? []).some((r) => r !== null)) out.push(`the row ${this.nodeKey()} on ${NODES}`);
    return out;
  }

  deletedMissing(): string[] {
    const out: string[] = [];
    if (!this.has(this.ledger, "memory_deleted", { node_id: this.nodeId })) out.push(`memory_deleted of node ${this.nodeId} on ${LEDGER}`);
    if (!this.has(this.relay, "memory_formed", { node_id: this.nodeId, redacted_reason: "deleted" })) {
      out.push(`the deletion tombstone (redacted_reason deleted) of node ${this.nodeId} on ${RELAY}`);
    }
    const rows = this.nodes[this.nodeKey()] ?? [];
    if (rows.length === 0 || rows[rows.length - 1] !== null) out.push(`the tombstone (null value) of ${this.nodeKey()} on ${NODES}`);
    return out;
  }

  summary(): object {
    const key = this.nodeKey();
    return {
      client: "typescript", user: this.user, candidate_id: this.candidateId, deletion_id: this.deletionId,
      node_id: this.nodeId, ledger: this.ledger, relay: this.relay,
      nodes: key in this.nodes ? { [key]: this.nodes[key] } : {},
    };
  }
}

/** Resolves once `missing()` names nothing; rejects naming what is missing after `timeoutMs`. */
function waitFor(seen: Seen, missing: () => string[], timeoutMs: number, wake: { notify?: () => void }): Promise<void> {
  return new Promise((resolve, reject) => {
    const check = () => {
      try {
        if (missing().length === 0) {
          clearTimeout(timer);
          wake.notify = undefined;
          resolve();
        }
      } catch (err) {
        clearTimeout(timer);
        reject(err);
      }
    };
    const timer = setTimeout(() => {
      wake.notify = undefined;
      reject(new Error(`gave up after ${timeoutMs / 1000} s waiting for ${missing().join("; ")}`));
    }, timeoutMs);
    wake.notify = check;
    check();
  });
}

async function main(): Promise<number> {
  const args = parseArgs(process.argv.slice(2));
  const { user } = args;
  const registry = new SchemaRegistry({ host: args.registry });
  const kafka = new Kafka({ clientId: "memstream-example-ts", brokers: [args.broker], logLevel: logLevel.ERROR });
  // kafkajs 2.x's DefaultPartitioner is murmur2 of the key, as the Java client and memstream
  // partition; the LegacyPartitioner (kafkajs 1.x's default) is not, and memstream would
  // dead-letter its records as wrong_partition
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, idempotent: true });
  const consumer = kafka.consumer({ groupId: `memstream-example-${randomUUID().slice(0, 8)}`, readUncommitted: false });
  const seen = new Seen(user);
  const wake: { notify?: () => void } = {};
  const run = randomUUID().replaceAll("-", "").slice(0, 12);

  // memstream registered every topic's schema at start: write with the subject's latest version
  const candidateSchemaId = await registry.getLatestSchemaId(`${CANDIDATES}-value`);
  const eventSchemaId = await registry.getLatestSchemaId(`${EVENTS}-value`);

  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topics: [LEDGER, RELAY, NODES], fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ topic, message }: { topic: string; message: KafkaMessage }) => {
      const key = message.key?.toString("utf8") ?? "";
      if (!seen.wants(topic, key)) return; // another user's record: not decoded
      if (topic === NODES) {
        // a compacted topic: a null value is a tombstone (the node was deleted); never decode it
        seen.addNode(key, message.value === null ? null : (await registry.decode(message.value)) as MemoryNode);
      } else if (message.value !== null) {
        seen.addEvent(topic, (await registry.decode(message.value)) as MemoryEvent);
      }
      wake.notify?.();
    },
  });

  let error: string | null = null;
  try {
    // 1. one memory candidate
    const candidateId = `ex-ts-${run}`;
    const candidate: CandidateMemory = {
      candidate_id: candidateId, motebit_id: user,
      // memstream never re-forms deleted content: this run's id keeps a second run's content new
      content: `The user prefers green tea in the morning (example run ${run}).`,
      sensitivity: "personal", source: "user_stated", memory_type: "semantic", confidence: 0.9,
      valid_from: null, timestamp: Date.now(), embedding: null, frontmatter_type: null, extra: null,
      supersedes: null, kind: null, session_id: null,
    };
    seen.candidateId = candidateId;
    await producer.send({ topic: CANDIDATES, messages: [{ key: user, value: await registry.encode(candidateSchemaId, candidate) }] });
    console.log(`produced candidate ${candidateId} for ${user} to ${CANDIDATES}`);
    await waitFor(seen, () => seen.formedMissing(), args.timeoutMs, wake);
    console.log(`memstream formed node ${seen.nodeId}`);

    // 2. delete the memory it formed. The payload union is wrapped: the key names the branch
    // (MemoryAccessedPayload has the same fields; docs/records.md)
    const deletionId = `ex-ts-del-${run}`;
    const deletion: MemoryEvent = {
      event_id: deletionId, motebit_id: user, device_id: "typescript-example", timestamp: Date.now(),
      version_clock: 1, event_type: "memory_deleted",
      payload: { "memstream.memory.MemoryDeletedPayload": { node_id: seen.nodeId! } }, caused_by: null,
    };
    seen.deletionId = deletionId;
    await producer.send({ topic: EVENTS, messages: [{ key: user, value: await registry.encode(eventSchemaId, deletion) }] });
    console.log(`produced memory_deleted ${deletionId} of node ${seen.nodeId} to ${EVENTS}`);
    await waitFor(seen, () => seen.deletedMissing(), args.timeoutMs, wake);
    console.log("memstream deleted the node: ledger event, relay tombstone and node-table tombstone seen");
  } catch (err) {
    error = err instanceof Error ? err.message : String(err);
    console.error(`error: ${error}`);
  } finally {
    await consumer.disconnect();
    await producer.disconnect();
  }
  console.log(JSON.stringify(error === null ? seen.summary() : { ...seen.summary(), error }));
  return error === null ? 0 : 1;
}

main().then((code) => process.exit(code), (err) => {
  console.error(`error: ${err instanceof Error ? err.message : err}`);
  process.exit(1);
});
