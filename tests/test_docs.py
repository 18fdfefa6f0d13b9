"""The documentation's generated sections (README, docs/), the AsyncAPI document and docker-compose.yml
agree with the code."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from streams.contracts import asyncapi, catalog
from streams.settings import Settings
from streams.tools import readme

ROOT = Path(__file__).resolve().parent.parent


def test_generated_sections_match_the_code():
    for path, sections in readme.TARGETS.items():
        text = path.read_text()
        for name in sections:
            assert f"<!-- {name}:begin -->" in text and f"<!-- {name}:end -->" in text, (path.name, name)
        assert readme.render(text, sections) == text, f"{path.name} is stale: run `python -m streams.tools.readme`"
    assert readme.stale() == []
    catalog_page = readme.TOPICS.read_text()
    for t in catalog.topics():
        assert f"| `{t.name}` |" in catalog_page
    settings_page = readme.OPERATIONS.read_text()
    for var, _default, _doc in Settings.documentation():
        assert f"| `{var}` |" in settings_page, var


def test_topology_sections_match_the_declarations():
    from streams.agents import processors

    readme_text = readme.README.read_text()
    diagram = readme_text.split("<!-- topology-diagram:begin -->")[1].split("<!-- topology-diagram:end -->")[0]
    assert "```mermaid\nflowchart LR" in diagram
    for p in processors():
        assert f'["{p.name}"]' in diagram, p.name
    text = readme.ARCHITECTURE.read_text()
    assert "<!-- topology:begin -->" in text
    section = text.split("<!-- topology:begin -->")[1].split("<!-- topology:end -->")[0]
    assert "```mermaid\nflowchart LR" in section
    assert diagram.strip() in section  # the README's diagram is the architecture page's
    for p in processors():
        assert f"Processor: {p.name}  ({p.module})" in section, p.name
    assert "## One candidate record, hop by hop" in text


def test_contract_tables_match_the_code_and_the_docs_stand_alone():
    text = readme.CONTRACT.read_text()
    assert readme.render(text, readme.CONTRACT_SECTIONS) == text, \
        "docs/contract.md tables are stale: run `python -m streams.tools.readme`"
    for doc in [readme.README, *sorted((ROOT / "docs").glob("*.md"))]:  # a clone has no ../shared/
        assert "shared/SPEC" not in doc.read_text(), doc
    for t in catalog.topics():
        assert f"`{t.name}`" in text or t.name in text, t.name


def test_asyncapi_document_has_every_topic_with_its_binding():
    doc = json.loads(asyncapi.render(Settings(partitions=3)))
    assert doc["asyncapi"] == "3.0.0"
    addresses = {c["address"]: c for c in doc["channels"].values()}
    assert set(addresses) == {t.name for t in catalog.topics()}
    nodes = addresses["memory.nodes.v1"]["bindings"]["kafka"]
    assert nodes["partitions"] == 3 and nodes["topicConfiguration"]["cleanup.policy"] == ["compact"]
    dlq = addresses["pipeline.dlq.v1"]["bindings"]["kafka"]["topicConfiguration"]
    assert dlq["retention.ms"] == 30 * catalog.DAY_MS
    actions = {op["channel"]["$ref"].split("/")[-1]: op["action"] for op in doc["operations"].values()}
    assert actions["memory_events_v1"] == "receive" and actions["memory_ledger_v1"] == "send"
    msg = doc["components"]["messages"]["memory_events_v1_message"]
    assert msg["payload"]["schema"]["name"] == "MemoryEvent"
    assert msg["payload"]["schemaFormat"].startswith("application/vnd.apache.avro")


def test_docker_compose_parses_names_services_and_only_real_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "registry", "topics", "worker"}
    assert services["topics"]["command"] == ["topics", "apply"]
    assert services["worker"]["command"] == ["worker"]
    assert services["worker"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    known = {var for var, _d, _doc in Settings.documentation()}
    for name in ("topics", "worker"):
        env = services[name]["environment"]
        assert set(env) <= known, set(env) - known
        settings = Settings.from_env(env)  # every value parses into the settings object
        assert settings.broker == "kafka:9092"
    assert "ports" not in services["worker"], "a fixed host port would stop --scale worker=N"


def test_docker_compose_registry_keeps_its_storage_in_the_catalogs_topics():
    from streams.contracts import catalog

    env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["registry"]["environment"]
    assert env["APICURIO_STORAGE_KIND"] == "kafkasql"
    for t in catalog.REGISTRY_TOPICS:  # Quarkus maps apicurio.a.b to APICURIO_A_B
        assert env[t.apicurio_property.upper().replace(".", "_")] == t.name


def test_every_key_column_names_fields_of_the_value_schema():
    """The catalog's key (and so README's key column) names the record fields the key is taken
    from, spelled as the schema spells them (`sessionId`, not `session_id`)."""
    from streams.contracts import schemas

    for t in catalog.topics():
        if t.key == "original key":  # the DLQ keeps the failed record's own key
            continue
        fields = {f["name"] for f in schemas.parsed(t.value_schema)["fields"]}
        assert set(t.key.split("/")) <= fields, (t.name, t.key, sorted(fields))
