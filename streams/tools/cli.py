"""The `memstream` command line.

Every failure the user can cause or fix (stack not up, bad settings, drifted topics, bad input
files) ends in one line on stderr naming what is wrong and what to do, and a non-zero exit.
`--traceback` shows the Python traceback for bug reports.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from streams.settings import Settings, SettingsError

EXIT_ERROR = 2

# Error types a user can act on: reported in one line. Filled lazily (modules import heavy deps).
def _user_errors() -> tuple[type[BaseException], ...]:
    from streams.contracts.topics import TopicError
    from streams.tools.demo import DemoError
    from streams.tools.devstack import StackError

    errors: list[type[BaseException]] = [SettingsError, StackError, TopicError, DemoError, FileNotFoundError]
    from streams.tools.shipper import ShipperError

    errors.append(ShipperError)
    from streams.tools.erase import EraseError

    errors.append(EraseError)
    from streams.runtime.generation import GenerationError

    errors.append(GenerationError)
    try:
        from streams.contracts.wire import WireFormatError

        errors.append(WireFormatError)
    except ImportError:
        pass
    return tuple(errors)


# --------------------------------------------------------------------------- commands


def _dev(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import devstack

    if args.dev_cmd == "up":
        return devstack.up(s)
    if args.dev_cmd == "down":
        return devstack.down(s, wipe=args.wipe)
    if args.dev_cmd == "status":
        return devstack.status(s)
    return devstack.logs(s, args.service, args.lines)


def _topics(args: argparse.Namespace, s: Settings) -> int:
    from streams.contracts import topics

    report = topics.apply(s)
    for name in report.created:
        print(f"created  {name}")
    for name in report.existing:
        print(f"exists   {name}")
    if report.subjects:
        print(f"registry: {len(report.subjects)} subjects at {topics.COMPATIBILITY}, current schemas registered")
    for d in report.drift:
        print(f"DRIFT    {d}", file=sys.stderr)
    if not report.ok:
        print(f"memstream: {len(report.drift)} topic(s) differ from the catalog (streams/contracts/catalog.py); "
              "fix or recreate them", file=sys.stderr)
        return 1
    return 0


def _catalog(args: argparse.Namespace, s: Settings) -> int:
    from streams.contracts import catalog

    if args.format == "markdown":
        print(catalog.markdown_table(s))
        return 0
    from streams.contracts import asyncapi

    text = asyncapi.render(s)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0


def _settings(args: argparse.Namespace, s: Settings) -> int:
    for var, _default, doc in Settings.documentation():
        field = var.removeprefix("MEMSTREAM_").lower()
        print(f"{var}={getattr(s, field)}    # {doc}")
    return 0


def _worker(args: argparse.Namespace, s: Settings) -> int:
    from streams.composition import create_runtime
    from streams.runtime import worker

    changes = {}
    if args.web_port is not None:
        changes["web_port"] = args.web_port
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    return worker.run(s.replace(**changes), create_runtime)


def _schemas(args: argparse.Namespace, s: Settings) -> int:
    from streams.contracts import compat

    return compat.run_check()


def _generate(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import generate

    kinds = tuple(args.kinds.split(",")) if args.kinds else generate.KINDS
    unknown = set(kinds) - set(generate.KINDS)
    if unknown:
        raise SettingsError(f"unknown --kinds {', '.join(sorted(unknown))}; choose from {', '.join(generate.KINDS)}")
    items = generate.generate(seed=args.seed, users=args.users, kinds=kinds, epoch_ms=args.start)
    if args.produce:
        n = generate.produce(items, s)
        print(f"produced {n} records to {s.broker}")
    else:
        generate.write_jsonl(items, args.out)
        print(f"wrote {len(items)} records to {args.out}")
    return 0


def _demo(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import demo

    return demo.run(s)


def _ship_graph_logs(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import shipper

    return shipper.run(args.directory, s, once=args.once, offsets_path=args.offsets, poll_s=args.poll, shipper_id=args.id)


def _ops_call(run: Callable[[], int]) -> int:
    from streams.tools.kafkatools import OpsError

    try:
        return run()
    except OpsError as exc:
        print(f"memstream: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _status(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import status

    workers = [u.strip() for u in args.workers.split(",") if u.strip()] if args.workers else None
    return _ops_call(lambda: status.status(s, workers=workers, as_json=args.json))


def _dlq(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import dlq

    if args.dlq_cmd == "inspect":
        narrow = dlq.Filter(args.topic, args.stage, args.error_class)
        return _ops_call(lambda: dlq.inspect(s, narrow=narrow, limit=args.limit, as_json=args.json))

    def run() -> int:
        offsets = dlq.parse_offsets(args.offsets) if args.offsets is not None else None
        return dlq.replay(s, offsets=offsets, error_class=args.error_class, select_all=args.all,
                          narrow=dlq.Filter(args.topic, args.stage), dry_run=args.dry_run)

    return _ops_call(run)


def _repartition(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools import repartition

    return _ops_call(lambda: repartition.run(s, args.to))


def _erase(args: argparse.Namespace, s: Settings) -> int:
    from streams.tools.erase import erase

    return erase(s, args.motebit_id, request_id=args.request_id, wait_s=args.wait)


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "dev": _dev,
    "topics": _topics,
    "catalog": _catalog,
    "settings": _settings,
    "worker": _worker,
    "schemas": _schemas,
    "generate": _generate,
    "demo": _demo,
    "ship-graph-logs": _ship_graph_logs,
    "status": _status,
    "dlq": _dlq,
    "erase": _erase,
    "repartition": _repartition,
}


def build_parser() -> argparse.ArgumentParser:
    from streams.tools.generate import EPOCH_MS

    p = argparse.ArgumentParser(prog="memstream", description="Stream processing for AI-agent memory on Kafka.")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks on errors")
    sub = p.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="the local Kafka + Schema Registry (no Docker)")
    dev_sub = dev.add_subparsers(dest="dev_cmd", required=True)
    dev_sub.add_parser("up", help="fetch (once) and start Kafka and the registry")
    down = dev_sub.add_parser("down", help="stop what `up` started")
    down.add_argument("--wipe", action="store_true", help="also delete the broker's data")
    dev_sub.add_parser("status", help="show whether each service is up (exit 1 if not)")
    logs = dev_sub.add_parser("logs", help="print the end of a service's log")
    logs.add_argument("service", choices=["kafka", "registry"])
    logs.add_argument("-n", "--lines", type=int, default=50)

    topics = sub.add_parser("topics", help="topic catalog operations")
    topics_sub = topics.add_subparsers(dest="topics_cmd", required=True)
    topics_sub.add_parser("apply", help="create missing topics; report drift (exit 1)")

    cat = sub.add_parser("catalog", help="document the topic catalog")
    cat.add_argument("--format", choices=["asyncapi", "markdown"], default="markdown")
    cat.add_argument("-o", "--output", help="write to this file instead of stdout")

    sub.add_parser("settings", help="print the effective MEMSTREAM_* settings")

    w = sub.add_parser("worker", help="run a pipeline worker (Faust)")
    w.add_argument("--web-port", type=int, help="HTTP port (overrides MEMSTREAM_WEB_PORT)")
    w.add_argument("--data-dir", help="table data dir (overrides MEMSTREAM_DATA_DIR)")

    sch = sub.add_parser("schemas", help="schema operations")
    sch_sub = sch.add_subparsers(dest="schemas_cmd", required=True)
    sch_sub.add_parser("check", help="prove every schema compatible with its released versions")

    gen = sub.add_parser("generate", help="write a deterministic sample stream of every input record type")
    gen.add_argument("--seed", type=int, default=7)
    gen.add_argument("--users", type=int, default=5, help="number of users (motebit ids)")
    gen.add_argument("--start", type=int, default=EPOCH_MS, help="Unix ms where memory timestamps begin (default 2026-11-01)")
    gen.add_argument("--kinds", help="comma-separated subset of memory,negotiator,sessions,graphs,garbage")
    where = gen.add_mutually_exclusive_group()
    where.add_argument("--out", default="sample.jsonl", help="JSON-lines file (default sample.jsonl)")
    where.add_argument("--produce", action="store_true", help="produce straight into the input topics")

    sub.add_parser("demo", help="start the stack, run a worker on sample data, show what came out")

    ship = sub.add_parser("ship-graph-logs", help="tail graph-events-*.ndjson files of a directory into graph.events.v1")
    ship.add_argument("directory", metavar="DIR", help="directory of graph-events-{hash}.ndjson files")
    ship.add_argument("--once", action="store_true", help="ship what is there now and exit (default: follow until SIGINT/SIGTERM)")
    ship.add_argument("--id", metavar="NAME", help="shipper id: names its transactional producer and its positions "
                      "(default: DIR's name and a hash of its real path)")
    ship.add_argument("--offsets", metavar="FILE", help="offsets file of the earlier, pre-transactions shipper to import "
                      "once (default: <shipper id>.offsets.json under MEMSTREAM_SHIPPER_OFFSETS_DIR)")
    ship.add_argument("--poll", metavar="SECONDS", type=float, help="seconds between scans (overrides MEMSTREAM_SHIPPER_POLL_S)")

    st = sub.add_parser("status", help="the consumer group's workers, their partitions, lag and /health (exit 1 unless all ready)")
    st.add_argument("--workers", metavar="URL,...", help="worker web URLs to health-check (default: decoded from the group's Faust metadata)")
    st.add_argument("--json", action="store_true", help="print one JSON document")

    dlq = sub.add_parser("dlq", help="inspect or replay pipeline.dlq.v1")
    dlq_sub = dlq.add_subparsers(dest="dlq_cmd", required=True)
    ins = dlq_sub.add_parser("inspect", help="one line per dead letter (reads the DLQ from the beginning)")
    ins.add_argument("--topic", help="only dead letters from this original topic (e.g. graph.events.v1, file:<name>)")
    ins.add_argument("--stage", help="only this stage (decode, validate, apply, ship)")
    ins.add_argument("--error-class", help="only this error class (e.g. UnknownMagicByteError, memory.key_mismatch)")
    ins.add_argument("--limit", type=int, metavar="N", help="only the N most recent")
    ins.add_argument("--json", action="store_true", help="one JSON object per line")
    rep = dlq_sub.add_parser("replay", help="send dead letters' original key and value back to their topic")
    which = rep.add_mutually_exclusive_group(required=True)
    which.add_argument("--offsets", metavar="P:O,...", help="DLQ partition:offset of each dead letter (as `dlq inspect` prints)")
    which.add_argument("--error-class", help="every dead letter of this error class")
    which.add_argument("--all", action="store_true", help="every replayable dead letter")
    rep.add_argument("--topic", help="only dead letters from this original topic")
    rep.add_argument("--stage", help="only this stage")
    rep.add_argument("--dry-run", action="store_true", help="list what would be replayed; send nothing")

    rp = sub.add_parser("repartition", help="take the stopped deployment to more partitions, its tables' state carried "
                        "(docs/scaling-out.md); run again to finish an interrupted run")
    rp.add_argument("--to", type=int, required=True, metavar="M", help="the new partition count (more than now)")

    er = sub.add_parser("erase", help="erase a user: every memory node, negotiator memory, relay policy and analytics "
                        "row (the pipeline applies it and writes a receipt to memory.erase-receipts.v1)")
    er.add_argument("motebit_id", help="the user to erase")
    er.add_argument("--request-id", help="id of this erasure (default: a new UUID); resending the same id is safe")
    er.add_argument("--wait", type=float, metavar="SECONDS", nargs="?", const=120.0,
                    help="wait for the receipt and print it (default 120 s when given without a value)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        return COMMANDS[args.command](args, settings)
    except KeyboardInterrupt:
        print("memstream: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns errors into one line
        if args.traceback:
            raise
        known = isinstance(exc, _user_errors())
        detail = str(exc) if known else f"{type(exc).__name__}: {exc} (a bug? re-run with --traceback)"
        print(f"memstream: error: {detail}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
