"""Where the group's reading of each lane partition starts, read from the broker.

The agent checks a partition's first record against this offset (see
continuity.py): records before it that the consumer skipped are read again.
Asking the broker costs a round trip or two, so the offsets of every lane
partition a rebalance assigns are requested together, in the background, as
soon as the assignment is known; the first record of a partition then usually
finds its offset already there instead of holding its lane for the lookup
(measured: the first realtime requests after a worker start expired while
each partition's lookup ran in line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from pipeline.settings import Settings

__all__ = ["StartOffsets"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class StartOffsets:
    """The group's committed offset of a partition, else its log's first offset.

    ``prefetch`` starts one lookup for many partitions; ``get`` returns a
    partition's offset (waiting for a lookup under way, or starting one), or
    None when the broker could not tell (the caller then skips the check).
    One admin client serves every lookup of the worker's life.
    """

    def __init__(self, settings: Settings, timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self._admin: Any = None
        self._lookups: dict[TopicPartition, asyncio.Future[dict[TopicPartition, int]]] = {}

    def prefetch(self, partitions: Iterable[TopicPartition]) -> None:
        """Start looking up ``partitions`` not already known or under way."""
        todo = [tp for tp in partitions if tp not in self._lookups]
        if not todo:
            return
        future = asyncio.get_running_loop().run_in_executor(None, self._lookup, todo)
        for tp in todo:
            self._lookups[tp] = future

    async def get(self, partition: TopicPartition) -> int | None:
        if partition not in self._lookups:
            self.prefetch([partition])
        found = await self._lookups[partition]
        return found.get(partition)

    def forget(self, partition: TopicPartition) -> None:
        """Drop what is known of a revoked partition; a new assignment looks again."""
        self._lookups.pop(partition, None)

    def _lookup(self, todo: list[TopicPartition]) -> dict[TopicPartition, int]:
        from confluent_kafka import ConsumerGroupTopicPartitions
        from confluent_kafka import TopicPartition as TP
        from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

        from pipeline.security import client_config

        try:
            if self._admin is None:
                self._admin = AdminClient(client_config(self.settings))
            admin = self._admin
            group = ConsumerGroupTopicPartitions(
                self.settings.worker.app_id, [TP(t, p) for t, p in todo]
            )
            (fut,) = admin.list_consumer_group_offsets([group]).values()
            found: dict[TopicPartition, int] = {}
            for tp in fut.result(timeout=self.timeout_s).topic_partitions:
                if tp.offset >= 0:
                    found[(tp.topic, tp.partition)] = int(tp.offset)
            missing = [tp for tp in todo if tp not in found]
            if missing:
                earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
                futures = admin.list_offsets({TP(t, p): earliest for t, p in missing})
                for tp, low in futures.items():
                    found[(tp.topic, tp.partition)] = int(low.result(timeout=self.timeout_s).offset)
            return found
        except Exception as exc:  # best effort: the in-stream check still runs
            log.warning("could not read the start offsets of %d partitions: %s", len(todo), exc)
            return {}
