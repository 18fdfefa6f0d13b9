"""Operator and developer commands behind `memstream`: the CLI, dead-letter inspection and replay,
group status, the local dev stack, the demo, the sample generator, the graph-log shipper, erasure,
and the README generator."""
