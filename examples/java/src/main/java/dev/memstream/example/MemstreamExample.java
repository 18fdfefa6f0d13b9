package dev.memstream.example;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.apicurio.registry.serde.Legacy4ByteIdHandler;
import io.apicurio.registry.serde.SerdeConfig;
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import io.apicurio.registry.serde.avro.AvroKafkaSerializer;
import java.io.IOException;
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.UUID;
import java.util.function.Supplier;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * memstream from Java: produce one memory candidate, delete the memory it formed, and read what
 * memstream wrote (ledger, relay, node table). kafka-clients + Apicurio Registry's Avro serde, in
 * the framing memstream itself writes (Confluent framing, the registry's content id). See README.md.
 *
 * <pre>
 *   java -jar target/memstream-example.jar mb-ada [--broker 127.0.0.1:19092]
 *       [--registry http://127.0.0.1:18081/apis/ccompat/v7] [--timeout 60]
 * </pre>
 *
 * <p>The last line on stdout is one JSON object (what was seen); everything before it is for
 * people. Exit status 0 when every expected record was seen, 1 (with an error naming what is
 * missing) when the time ran out first.
 */
public final class MemstreamExample {
    static final String CANDIDATES = "memory.candidates.v1";
    static final String EVENTS = "memory.events.v1";
    static final String LEDGER = "memory.ledger.v1";
    static final String RELAY = "memory.relay.v1";
    static final String NODES = "memory.nodes.v1";

    public static void main(String[] argv) throws Exception {
        String user = null;
        String broker = Objects.requireNonNullElse(System.getenv("MEMSTREAM_BROKER"), "127.0.0.1:19092");
        String registry = Objects.requireNonNullElse(System.getenv("MEMSTREAM_REGISTRY_URL"),
                "http://127.0.0.1:18081/apis/ccompat/v7");
        Duration timeout = Duration.ofSeconds(60);
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--broker" -> broker = argv[++i];
                case "--registry" -> registry = argv[++i];
                case "--timeout" -> timeout = Duration.ofMillis((long) (Double.parseDouble(argv[++i]) * 1000));
                default -> {
                    if (argv[i].startsWith("--") || user != null) {
                        throw new IllegalArgumentException("unknown argument " + argv[i]);
                    }
                    user = argv[i];
                }
            }
        }
        if (user == null) {
            System.err.println("usage: memstream-example <motebit_id> [--broker host:port] [--registry url] [--timeout s]");
            System.exit(2);
        }
        System.exit(new MemstreamExample(user, broker, registry, timeout).run());
    }

    private final String user;
    private final String broker;
    private final String registryApi;
    private final Duration timeout;
    private final Seen seen;

    MemstreamExample(String user, String broker, String registry, Duration timeout) {
        this.user = user;
        this.broker = broker;
        this.registryApi = apicurioApi(registry);
        this.timeout = timeout;
        this.seen = new Seen(user);
    }

    /**
     * memstream's setting names the registry's Confluent-compatible API ({@code .../apis/ccompat/v7});
     * Apicurio's serde talks to Apicurio's own API beside it.
     */
    static String apicurioApi(String url) {
        int at = url.indexOf("/apis/");
        return (at >= 0 ? url.substring(0, at) : url.replaceAll("/+$", "")) + "/apis/registry/v2";
    }

    /** Serde settings that read and write exactly what memstream reads and writes. */
    Map<String, Object> serdeConfig() {
        Map<String, Object> c = new LinkedHashMap<>();
        c.put(SerdeConfig.REGISTRY_URL, registryApi);
        // memstream registered every topic's schema (subject/artifact `<topic>-value`) at start:
        // write with its latest version, never register from here
        c.put(SerdeConfig.AUTO_REGISTER_ARTIFACT, false);
        c.put(SerdeConfig.FIND_LATEST_ARTIFACT, true);
        // Confluent framing (magic byte 0, 4-byte id) with the content id, which is the id the
        // registry's Confluent-compatible API serves: the framing memstream itself writes, so
        // consumers of memstream's outputs need these settings to read them. (The serde's
        // defaults, headers + globalId, are read by memstream as well, but not written by it.)
        // Legacy4ByteIdHandler is what `apicurio.registry.as-confluent=true` selects; naming it
        // spares the serde's "Duplicate id-handler configuration" warning.
        c.put(SerdeConfig.ID_HANDLER, Legacy4ByteIdHandler.class.getName());
        c.put(SerdeConfig.USE_ID, "contentId");
        c.put(SerdeConfig.ENABLE_HEADERS, false);
        return c;
    }

    int run() throws Exception {
        Schema candidateSchema = schema("candidate_memory.avsc");
        Schema eventSchema = schema("memory_event.avsc");
        String run = UUID.randomUUID().toString().replace("-", "").substring(0, 12);

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        // the default partitioner (murmur2 of the key) is what memstream expects: set none
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, broker);
        c.put(ConsumerConfig.GROUP_ID_CONFIG, "memstream-example-" + UUID.randomUUID().toString().substring(0, 8));
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        c.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");

        AvroKafkaSerializer<GenericRecord> valueSerializer = new AvroKafkaSerializer<>();
        valueSerializer.configure(serdeConfig(), false);
        AvroKafkaDeserializer<GenericRecord> valueDeserializer = new AvroKafkaDeserializer<>();
        valueDeserializer.configure(serdeConfig(), false);

        String error = null;
        try (KafkaProducer<String, GenericRecord> producer =
                     new KafkaProducer<>(p, new StringSerializer(), valueSerializer);
             // values arrive as bytes and only the user's are deserialized: cheaper on a shared
             // topic, and another team's undecodable record cannot stop this consumer
             KafkaConsumer<String, byte[]> consumer =
                     new KafkaConsumer<>(c, new StringDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(List.of(LEDGER, RELAY, NODES));

            // 1. one memory candidate
            String candidateId = "ex-java-" + run;
            GenericRecord candidate = new GenericData.Record(candidateSchema);
            candidate.put("candidate_id", candidateId);
            candidate.put("motebit_id", user);
            // memstream never re-forms deleted content: this run's id keeps a second run's content new
            candidate.put("content", "The user prefers green tea in the morning (example run " + run + ").");
            candidate.put("sensitivity", enumOf(candidateSchema, "sensitivity", "personal"));
            candidate.put("source", enumOf(candidateSchema, "source", "user_stated"));
            candidate.put("memory_type", enumOf(candidateSchema, "memory_type", "semantic"));
            candidate.put("confidence", 0.9);
            candidate.put("timestamp", System.currentTimeMillis());
            seen.candidateId = candidateId;
            producer.send(new ProducerRecord<>(CANDIDATES, user, candidate)).get();
            System.out.println("produced candidate " + candidateId + " for " + user + " to " + CANDIDATES);
            poll(consumer, valueDeserializer, seen::formedMissing);
            System.out.println("memstream formed node " + seen.nodeId);

            // 2. delete the memory it formed. The payload is a record of the MemoryDeletedPayload
            // schema: Avro picks the union branch by the record's schema (MemoryAccessedPayload has
            // the same fields; docs/records.md)
            String deletionId = "ex-java-del-" + run;
            Schema payloadSchema = branch(eventSchema, "payload", "memstream.memory.MemoryDeletedPayload");
            GenericRecord payload = new GenericData.Record(payloadSchema);
            payload.put("node_id", seen.nodeId);
            GenericRecord deletion = new GenericData.Record(eventSchema);
            deletion.put("event_id", deletionId);
            deletion.put("motebit_id", user);
            deletion.put("device_id", "java-example");
            deletion.put("timestamp", System.currentTimeMillis());
            deletion.put("version_clock", 1L);
            deletion.put("event_type", enumOf(eventSchema, "event_type", "memory_deleted"));
            deletion.put("payload", payload);
            seen.deletionId = deletionId;
            producer.send(new ProducerRecord<>(EVENTS, user, deletion)).get();
            System.out.println("produced memory_deleted " + deletionId + " of node " + seen.nodeId + " to " + EVENTS);
            poll(consumer, valueDeserializer, seen::deletedMissing);
            System.out.println("memstream deleted the node: ledger event, relay tombstone and node-table tombstone seen");
        } catch (Missing e) {
            error = e.getMessage();
            System.err.println("error: " + error);
        }
        Map<String, Object> summary = seen.summary();
        if (error != null) {
            summary.put("error", error);
        }
        System.out.println(new ObjectMapper().writeValueAsString(summary));
        return error == null ? 0 : 1;
    }

    /** Polls the three topics until {@code missing} names nothing; throws naming it after the timeout. */
    void poll(KafkaConsumer<String, byte[]> consumer, AvroKafkaDeserializer<GenericRecord> deserializer,
              Supplier<List<String>> missing) {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!missing.get().isEmpty()) {
            if (System.nanoTime() > deadline) {
                throw new Missing("gave up after " + timeout.toSeconds() + " s waiting for "
                        + String.join("; ", missing.get()));
            }
            for (ConsumerRecord<String, byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                if (!seen.wants(r.topic(), r.key())) {
                    continue; // another user's record: not decoded
                }
                GenericRecord value = r.value() == null ? null : deserializer.deserialize(r.topic(), r.headers(), r.value());
                if (r.topic().equals(NODES)) {
                    seen.addNode(r.key(), value); // null: a tombstone, the node was deleted
                } else if (value != null) {
                    seen.addEvent(r.topic(), value);
                }
            }
        }
    }

    static Schema schema(String file) throws IOException {
        // copied from the repository's schemas/ into the jar at build time (pom.xml)
        try (InputStream in = MemstreamExample.class.getResourceAsStream("/memstream/schemas/" + file)) {
            if (in == null) {
                throw new IOException("schema " + file + " is not on the class path");
            }
            return new Schema.Parser().parse(in);
        }
    }

    static Schema fieldType(Schema record, String field) {
        return record.getField(field).schema();
    }

    /** The non-null branch of field {@code field}'s union (or its type) named {@code name}, else its only record/enum. */
    static Schema branch(Schema record, String field, String name) {
        Schema type = fieldType(record, field);
        if (type.getType() != Schema.Type.UNION) {
            return type;
        }
        for (Schema s : type.getTypes()) {
            if (s.getType() != Schema.Type.NULL && (name == null || s.getFullName().equals(name))) {
                return s;
            }
        }
        throw new IllegalArgumentException(field + " has no branch " + name);
    }

    static GenericData.EnumSymbol enumOf(Schema record, String field, String symbol) {
        return new GenericData.EnumSymbol(branch(record, field, null), symbol);
    }

    static final class Missing extends RuntimeException {
        Missing(String message) {
            super(message);
        }
    }

    /** What the consumer saw of this run, and what is still missing. */
    static final class Seen {
        final String user;
        String candidateId;
        String deletionId;
        String nodeId;
        String rejected;
        final List<Map<String, Object>> ledger = new ArrayList<>();
        final List<Map<String, Object>> relay = new ArrayList<>();
        final Map<String, List<Map<String, Object>>> nodes = new LinkedHashMap<>();

        Seen(String user) {
            this.user = user;
        }

        boolean wants(String topic, String key) {
            return key != null && (topic.equals(NODES) ? key.startsWith(user + "/") : key.equals(user));
        }

        void addNode(String key, GenericRecord row) {
            // kept for every node of the user: the row can arrive before the ledger names the node
            Map<String, Object> entry = null;
            if (row != null) {
                entry = new LinkedHashMap<>();
                for (String f : List.of("node_id", "content", "sensitivity", "confidence", "reinforcement_count",
                        "origin_event_id")) {
                    entry.put(f, plain(row.get(f)));
                }
            }
            nodes.computeIfAbsent(key, k -> new ArrayList<>()).add(entry);
            System.out.printf("  %-16s %s: %s%n", NODES, key, row == null ? "null (tombstone: node deleted)"
                    : String.format("\"%s\" confidence %.2f", row.get("content"), (Double) row.get("confidence")));
        }

        void addEvent(String topic, GenericRecord event) {
            GenericRecord payload = (GenericRecord) event.get("payload");
            GenericRecord causedBy = (GenericRecord) event.get("caused_by");
            String eventType = event.get("event_type").toString();
            String eventId = event.get("event_id").toString();
            Object node = payload.hasField("node_id") ? payload.get("node_id")
                    : payload.hasField("new_node_id") ? payload.get("new_node_id") : null;
            String payloadNode = node == null ? null : node.toString();
            boolean mine = (causedBy != null && Objects.equals(causedBy.get("id").toString(), candidateId))
                    || (nodeId != null && nodeId.equals(payloadNode))
                    || eventId.equals(deletionId);
            if (!mine) {
                return; // an earlier run's record of the same user
            }
            Map<String, Object> entry = new LinkedHashMap<>();
            entry.put("event_type", eventType);
            entry.put("event_id", eventId);
            // the union branch Avro read: the payload record's own schema
            entry.put("branch", payload.getSchema().getFullName());
            entry.put("node_id", payloadNode);
            for (String f : List.of("action", "content", "redacted", "redacted_reason")) {
                if (payload.hasField(f)) {
                    entry.put(f, plain(payload.get(f)));
                }
            }
            if (topic.equals(LEDGER)) {
                if (eventType.equals("memory_formed") && nodeId == null) {
                    nodeId = payloadNode;
                }
                if (eventType.equals("memory_consolidated") && "reject".equals(entry.get("action"))) {
                    rejected = String.valueOf(payload.get("reason"));
                }
                ledger.add(entry);
            } else {
                relay.add(entry);
            }
            Object detail = entry.get("action") != null ? entry.get("action")
                    : entry.get("redacted_reason") != null ? entry.get("redacted_reason")
                    : "\"" + Objects.requireNonNullElse(entry.get("content"), "") + "\"";
            System.out.printf("  %-16s %-20s node %s  %s%n", topic, eventType, payloadNode, detail);
        }

        /** Avro's Utf8 strings and enum symbols as plain JSON values. */
        static Object plain(Object v) {
            return v instanceof CharSequence || v instanceof GenericData.EnumSymbol ? v.toString() : v;
        }

        static boolean has(List<Map<String, Object>> events, String type, Map<String, Object> fields) {
            return events.stream().anyMatch(e -> e.get("event_type").equals(type)
                    && fields.entrySet().stream().allMatch(f -> Objects.equals(e.get(f.getKey()), f.getValue())));
        }

        String nodeKey() {
            return user + "/" + nodeId;
        }

        List<String> formedMissing() {
            if (rejected != null) {
                throw new Missing("memstream rejected the candidate: " + rejected);
            }
            List<String> out = new ArrayList<>();
            if (nodeId == null) {
                out.add("memory_formed for candidate " + candidateId + " on " + LEDGER);
                return out;
            }
            if (!has(ledger, "memory_consolidated", Map.of("action", "accept"))) {
                out.add("memory_consolidated (accept) on " + LEDGER);
            }
            if (!has(relay, "memory_formed", Map.of("node_id", nodeId))) {
                out.add("memory_formed of node " + nodeId + " on " + RELAY);
            }
            if (nodes.getOrDefault(nodeKey(), List.of()).stream().noneMatch(Objects::nonNull)) {
                out.add("the row " + nodeKey() + " on " + NODES);
            }
            return out;
        }

        List<String> deletedMissing() {
            List<String> out = new ArrayList<>();
            if (!has(ledger, "memory_deleted", Map.of("node_id", nodeId))) {
                out.add("memory_deleted of node " + nodeId + " on " + LEDGER);
            }
            if (!has(relay, "memory_formed", Map.of("node_id", nodeId, "redacted_reason", "deleted"))) {
                out.add("the deletion tombstone (redacted_reason deleted) of node " + nodeId + " on " + RELAY);
            }
            List<Map<String, Object>> rows = nodes.getOrDefault(nodeKey(), List.of());
            if (rows.isEmpty() || rows.get(rows.size() - 1) != null) {
                out.add("the tombstone (null value) of " + nodeKey() + " on " + NODES);
            }
            return out;
        }

        Map<String, Object> summary() {
            Map<String, Object> s = new LinkedHashMap<>();
            s.put("client", "java");
            s.put("user", user);
            s.put("candidate_id", candidateId);
            s.put("deletion_id", deletionId);
            s.put("node_id", nodeId);
            s.put("ledger", ledger);
            s.put("relay", relay);
            Map<String, Object> mine = new LinkedHashMap<>();
            if (nodes.containsKey(nodeKey())) {
                mine.put(nodeKey(), nodes.get(nodeKey()));
            }
            s.put("nodes", mine);
            return s;
        }
    }
}
