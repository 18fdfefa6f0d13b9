"""The worker's web server as the runtime sets it up: which worker owns a table key
(`PartitionRouter`, replacing Faust's router) and the aiohttp server's limits
(`install_server_limits`). The HTTP API's views (streams/api/) build on both; this module knows
none of them.

Routing: the partition of a key is murmur2 of its changelog key bytes modulo the table's partition
count — computed here, not asked of the Kafka client (Faust's own router asks the producer for the
changelog topic's metadata, which it only has once this worker has written to that topic: on a
fresh stack that was a `TypeError` and a 500) — and the owner of that partition is read from the
partition assignor's table of changelog partition → worker URL, which every member receives with
its assignment. `PartitionRouter` replaces Faust's router with this, so `app.router.key_store`
uses it too (Faust's `/router/` views are not served: streams/runtime/app.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import murmur2
from faust.app.router import Router
from yarl import URL

from streams.runtime import faust_internals

log = logging.getLogger("memstream.http")


class OwnerUnknown(KeyError):
    """No worker is known to own the key's partition (no assignment yet, or rebalancing)."""


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a key: murmur2 as the Java client (and aiokafka's default partitioner)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def owner_url(distribution: Mapping[Any, Mapping[str, Any]], topic: str, partition: int) -> str | None:
    """The worker URL that actively owns `topic`'s `partition` in the assignor's distribution
    ({url: {topic: [partitions]}}), or None."""
    for url, topics in distribution.items():
        if partition in (topics.get(topic) or ()):
            return str(url)
    return None


class PartitionRouter(Router):
    """Faust's router without the Kafka client's topic metadata (see the module docstring)."""

    def key_store(self, table_name: str, key: Any) -> URL:
        # what Faust's `_get_table`, `_get_table_topic` and `_get_serialized_key` do, through public API
        table = self.app.tables[table_name]
        changelog = table.changelog_topic
        topic = changelog.get_topic_name()
        partitions = changelog.partitions or self.app.conf.topic_partitions
        partition = key_partition(changelog.prepare_key(key, None)[0], partitions)
        url = owner_url(self.app.assignor.tables_metadata(), topic, partition)
        if url is None:
            raise OwnerUnknown(f"no worker owns partition {partition} of {topic} yet")
        return URL(url)


# --------------------------------------------------------------------------------------------
# HTTP server limits (Faust's aiohttp driver creates its AppRunner with no limits at all)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerLimits:
    header_timeout_s: float  #: a new connection must send a whole request head within this
    idle_timeout_s: float  #: a connection with no request in flight is closed after this
    max_connections: int  #: open connections per worker; one more is closed at once


def install_server_limits(app: Any, limits: ServerLimits) -> None:
    """Give the worker's aiohttp server `limits` (before it starts): Faust builds
    `AppRunner(web_app, access_log=None)`; this replaces it with one whose handlers time out a
    connection that sends no complete request head (slow or half-open clients), close idle
    keep-alive connections (aiohttp's `keepalive_timeout`, which also covers a connection that
    never sends a byte), and refuse connections beyond the cap. A body's read timeout and size
    limit are applied where views read bodies (streams/api/http.py `ApiView.read_body`)."""
    from aiohttp import web, web_protocol, web_server

    class LimitedHandler(web_protocol.RequestHandler):
        _refused = False
        _head_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            manager = self._manager
            if manager is not None and len(manager.connections) >= limits.max_connections:
                self._refused = True
                log.warning("refusing an HTTP connection: %d open (MEMSTREAM_HTTP_MAX_CONNECTIONS)",
                            len(manager.connections))
                transport.close()
                return
            super().connection_made(transport)
            self._head_deadline = self._loop.call_later(limits.header_timeout_s, self._head_timeout)

        def _head_timeout(self) -> None:
            transport = self.transport
            if self._request_count == 0 and transport is not None:
                self.force_close()  # may drop self.transport: close the one we hold
                transport.close()

        def connection_lost(self, exc: BaseException | None) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            if self._refused:
                return
            super().connection_lost(exc)

    class LimitedServer(web_server.Server):
        def __call__(self) -> web_protocol.RequestHandler:
            return LimitedHandler(self, loop=self._loop, **self._kwargs)

    class LimitedRunner(web.AppRunner):
        async def _make_server(self) -> web_server.Server:
            server = await super()._make_server()
            server.__class__ = LimitedServer
            return server

    faust_internals.install_web_runner(
        app, lambda web_app: LimitedRunner(web_app, access_log=None, keepalive_timeout=limits.idle_timeout_s))
