"""Writer schemas of Confluent-framed lane records, looked up in the Schema Registry.

The lane reader asks :meth:`WriterSchemas.wanted` of every record before the
runtime takes it: a record in the registry's framing whose schema id was never
looked up waits in the lane buffer (its partition's later records with it;
other partitions go on) while :meth:`look_up` asks the registry on a thread of
its own, never on the event loop. Intake then decodes with :meth:`writer`, a
dictionary read. The hit path is one byte compared and one dict lookup.

An id the registry answered for is kept for the life of the worker: its
schema, or the reason it cannot be read (no such id, Protobuf, references),
which dead-letters each record naming it. A registry that does not answer
(down, slow, refusing our credentials) is never the input's fault: the lookup
is tried again with doubling waits (``PIPELINE_REGISTRY_RETRY_BACKOFF_MS`` up to
``_MAX_MS``) for as long as it takes; the records wait in the lane buffer,
whose bound stops the partitions' fetching. ``pipeline_registry_waiting_schemas``
counts the ids waiting meanwhile (alert ``SchemaRegistryUnavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fastavro.schema

from pipeline.codecs.avro import crc64_avro, request_codec
from pipeline.codecs.registry import FRAME_LEN, RegistryClient, WriterSchema
from pipeline.errors import DecodeError, RegistryUnavailable, UnknownSchemaId
from pipeline.observability.metrics import PipelineMetrics
from pipeline.settings import RegistrySettings

__all__ = ["MAX_UNREADABLE", "WriterSchemas"]

log = logging.getLogger(__name__)

#: Ids the registry said it cannot give us, kept to dead-letter their records at
#: once; the oldest are forgotten past this many (the ids come from the input).
MAX_UNREADABLE = 1024


class WriterSchemas:
    """The writer schemas of registry-framed records (see the module's promise)."""

    def __init__(
        self,
        settings: RegistrySettings,
        metrics: PipelineMetrics,
        *,
        fetch: Callable[[int], WriterSchema] | None = None,
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self.enabled = settings.enabled
        self._fetch = fetch or (RegistryClient(settings).schema if self.enabled else None)
        self._known: dict[int, Any] = {}
        self._unreadable: OrderedDict[int, DecodeError] = OrderedDict()
        self._looking: dict[int, asyncio.Task[None]] = {}
        self._waiting: set[int] = set()  # ids whose lookup failed to reach the registry
        self._executor: ThreadPoolExecutor | None = None

    def wanted(self, value: bytes | None) -> int | None:
        """The schema id ``value`` needs and that is not known yet, or None (not in the
        registry's framing, too short to name an id, no registry set, or known)."""
        if not self.enabled or not value or value[0] != 0 or len(value) < FRAME_LEN:
            return None
        schema_id = int.from_bytes(value[1:FRAME_LEN], "big")
        if schema_id in self._known or schema_id in self._unreadable:
            return None
        return schema_id

    def writer(self, schema_id: int) -> Any:
        """The parsed writer schema of ``schema_id``; raises the DecodeError that names
        why it cannot be had (the registry knows no such id, ...)."""
        parsed = self._known.get(schema_id)
        if parsed is not None:
            return parsed
        error = self._unreadable.get(schema_id)
        if error is not None:
            raise type(error)(str(error))
        if not self.enabled:
            raise DecodeError(
                "Confluent Schema Registry framing (magic byte 00), and no registry is "
                "configured here (PIPELINE_REGISTRY_URL)"
            )
        # Intake asked before the lane reader's lookup: not the input's fault either way.
        raise RegistryUnavailable(f"schema {schema_id} was not looked up yet")

    def look_up(self, schema_id: int, done: Callable[[], None]) -> None:
        """Look ``schema_id`` up unless a lookup runs already; call ``done`` once it is
        known (found, or unreadable for good)."""
        if schema_id in self._looking:
            return
        task = asyncio.ensure_future(self._look_up(schema_id, done))
        self._looking[schema_id] = task
        task.add_done_callback(lambda _t: self._looking.pop(schema_id, None))

    async def _look_up(self, schema_id: int, done: Callable[[], None]) -> None:
        if self._executor is None:
            # One thread: lookups are rare (once per id) and the client is blocking.
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="schema-registry")
        loop = asyncio.get_running_loop()
        delay_ms = float(self.settings.retry_backoff_ms)
        while True:
            try:
                parsed = await loop.run_in_executor(self._executor, self._writer_of, schema_id)
            except UnknownSchemaId as exc:
                self._metrics.registry_lookup("unknown")
                self._unreadable[schema_id] = exc
                while len(self._unreadable) > MAX_UNREADABLE:
                    self._unreadable.popitem(last=False)
                log.warning("schema %d cannot be read: %s (its records are dead-lettered)",
                            schema_id, exc)  # fmt: skip
                break
            except RegistryUnavailable as exc:
                self._metrics.registry_lookup("unavailable")
                if schema_id not in self._waiting:
                    self._waiting.add(schema_id)
                    self._metrics.registry_waiting(len(self._waiting))
                log.warning(
                    "schema registry unavailable looking up schema %d (its records wait; "
                    "asking again in %.1f s): %s",
                    schema_id,
                    delay_ms / 1000,
                    exc,
                )
                await asyncio.sleep(delay_ms / 1000)
                delay_ms = min(delay_ms * 2, float(self.settings.retry_backoff_max_ms))
                continue
            self._metrics.registry_lookup("found")
            self._known[schema_id] = parsed
            if schema_id in self._waiting:
                log.info("schema registry answered again: schema %d found", schema_id)
            break
        if schema_id in self._waiting:
            self._waiting.discard(schema_id)
            self._metrics.registry_waiting(len(self._waiting))
        done()

    def _writer_of(self, schema_id: int) -> Any:
        """Fetch ``schema_id`` (on the lookup thread). A schema this worker knows already
        (the current request schema or an older one, by fingerprint) is answered with
        the codec's own parsed form: fastavro then reads the current schema without
        resolving it, as fast as single-object records."""
        assert self._fetch is not None
        parsed = self._fetch(schema_id).parsed
        try:
            canonical = fastavro.schema.to_parsing_canonical_form(parsed)
        except Exception:  # fastavro parsed it, so this is unexpected: resolve it anyway
            return parsed
        known = request_codec().by_fingerprint.get(
            crc64_avro(canonical.encode("utf-8")).to_bytes(8, "little")
        )
        return parsed if known is None else known.parsed

    def close(self) -> None:
        """Stop looking up (the worker stops)."""
        for task in list(self._looking.values()):
            task.cancel()
        if self._executor is not None:
            with contextlib.suppress(Exception):
                self._executor.shutdown(wait=False, cancel_futures=True)
