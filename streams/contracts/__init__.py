"""What memstream promises to everybody else: record schemas, wire formats, the topic catalog and the
topics' creation, schema compatibility, dead letters, schema ids, and the artefacts generated for
other languages (AsyncAPI, TypeScript, JSON Schema). No Faust import here."""
