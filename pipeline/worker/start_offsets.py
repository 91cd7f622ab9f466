"""Where the group's reading of each lane partition starts, read from the broker.

The agent checks a partition's first record against this offset (see
continuity.py): records before it that the consumer skipped are read again.
Asking the broker costs a round trip or two, so the offsets of every lane
partition a rebalance assigns are requested together, in the background, as
soon as the assignment is known; the first record of a partition then usually
finds its offset already there instead of holding its lane for the lookup
(measured: the first realtime requests after a worker start expired while
each partition's lookup ran in line).

A lookup that fails (broker unreachable, coordinator moving) is retried with
capped backoff until it succeeds or the partition is revoked: without its
start, the agent could not tell a skipped record from the first one, so it
holds the partition rather than accept whatever offset comes first.

A failed lookup also drops the admin client it asked through; the retry asks
through a new one. An admin client that was connected when the broker
restarted may never answer again (measured with librdkafka 2.16 against a
restarted broker on the same port: its group-offset requests timed out on
every try, or its log-start requests failed with FENCED_LEADER_EPOCH on every
try, while a new client answered at once); kept, it held the partitions of
every later rebalance for good.

The group's offsets are asked through a consumer that never joins the group, not
through the admin client: librdkafka 2.16's admin ``list_consumer_group_offsets``
crashes the process (a segfault in ``result()``) when the group's coordinator
answers NOT_COORDINATOR, which a broker does while its offsets topic is created or
loaded (measured: every first lookup on a broker where no group had yet existed).
The admin's answer handler then re-queries the coordinator through a consumer
group handle the admin client does not have; a consumer has one, and the same
answer is a NOT_COORDINATOR error, retried like any failed lookup.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from pipeline.settings import Settings

__all__ = ["StartOffsets"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

#: Looks up start offsets of many partitions at once; raises when the broker cannot tell.
LookupFn = Callable[[list[TopicPartition]], dict[TopicPartition, int]]


class StartOffsets:
    """The group's committed offset of a partition, else its log's first offset.

    ``prefetch`` starts one lookup for many partitions; ``get`` returns a
    partition's offset, waiting for a lookup under way or starting one, and
    retrying failed lookups every ``retry_s`` (doubling up to ``retry_max_s``)
    for as long as the partition is assigned; it returns None only when the
    partition was forgotten (revoked) meanwhile. One pair of clients (a consumer
    that never joins the group, for its committed offsets; an admin client, for the
    logs' first offsets) serves the lookups until one fails; the next builds a new pair.
    """

    def __init__(
        self,
        settings: Settings,
        timeout_s: float = 10.0,
        *,
        lookup: LookupFn | None = None,
        retry_s: float = 0.5,
        retry_max_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self._lookup_fn: LookupFn = lookup or self._lookup
        self._clients: _Clients | None = None
        self._lookups: dict[TopicPartition, asyncio.Future[dict[TopicPartition, int]]] = {}
        self.failures = 0  # failed lookups over the worker's life (a metric's source)
        self._revoked: set[TopicPartition] = set()

    def prefetch(self, partitions: Iterable[TopicPartition]) -> None:
        """Start looking up ``partitions`` not already known or under way."""
        todo = [tp for tp in partitions if tp not in self._lookups]
        if not todo:
            return
        future = asyncio.get_running_loop().run_in_executor(None, self._lookup_fn, todo)
        for tp in todo:
            self._lookups[tp] = future

    async def get(self, partition: TopicPartition) -> int | None:
        """The partition's start offset; None if it is revoked (forgotten and not assigned
        again) before or while waiting: a record fetched before the revoke is not this
        worker's to read, and looking its partition up would track it into the next
        assignment."""
        if self._forgotten(partition):
            return None
        if partition not in self._lookups:
            self.prefetch([partition])
        delay = self.retry_s
        while True:
            future = self._lookups.get(partition)
            if future is None:
                return None  # revoked while we waited
            try:
                found = await asyncio.shield(future)
            except Exception as exc:
                found = {}
                if self._lookups.get(partition) is future:
                    self.failures += 1
                    log.warning(
                        "%s[%d]: start offset unknown (%s: %s); holding the partition, "
                        "asking again in %.1fs",
                        partition[0],
                        partition[1],
                        type(exc).__name__,
                        exc,
                        delay,
                    )
            if partition in found:
                return found[partition]
            if self._lookups.get(partition) is future:
                del self._lookups[partition]
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
                if partition not in self._lookups and not self._forgotten(partition):
                    self.prefetch([partition])

    def forget(self, partition: TopicPartition) -> None:
        """Drop what is known of a revoked partition; a new assignment looks again,
        and a ``get`` waiting for it returns None."""
        self._lookups.pop(partition, None)
        self._revoked.add(partition)

    def assigned(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions are (again) this worker's: look their starts up."""
        todo = list(partitions)
        self._revoked.difference_update(todo)
        self.prefetch(todo)

    def _forgotten(self, partition: TopicPartition) -> bool:
        return partition in self._revoked

    def _lookup(self, todo: list[TopicPartition]) -> dict[TopicPartition, int]:
        from confluent_kafka import TopicPartition as TP
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        clients = self._clients
        try:
            if clients is None:
                clients = self._clients = _Clients.of(self.settings)
            found: dict[TopicPartition, int] = {}
            asked = [TP(t, p) for t, p in todo]
            for tp in clients.group.committed(asked, timeout=self.timeout_s):
                if tp.error is not None:
                    raise RuntimeError(f"{tp.topic}[{tp.partition}]: {tp.error}")
                if tp.offset >= 0:
                    found[(tp.topic, tp.partition)] = int(tp.offset)
            missing = [tp for tp in todo if tp not in found]
            if missing:
                earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
                futures = clients.admin.list_offsets({TP(t, p): earliest for t, p in missing})
                for tp, low in futures.items():
                    found[(tp.topic, tp.partition)] = int(low.result(timeout=self.timeout_s).offset)
            return found
        except Exception as exc:
            from pipeline.errors import BrokerUnavailable

            # Possibly wedged since a broker restart: the next lookup asks through new
            # clients. Only these: a lookup running beside it may have built new ones
            # already. They are destroyed when the last lookup using them lets them go.
            if self._clients is clients:
                self._clients = None
            raise BrokerUnavailable(
                f"start offsets of {len(todo)} partitions: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if clients is not None:
                clients.serve_logs()


@dataclasses.dataclass(frozen=True)
class _Clients:
    """The lookup's clients: ``group`` reads the group's committed offsets (a consumer
    in the worker's group that never subscribes, so never joins it), ``admin`` the
    logs' first offsets."""

    group: Any
    admin: Any

    @classmethod
    def of(cls, settings: Settings) -> _Clients:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        from pipeline.kafka.security import client_config
        from pipeline.observability.logs import librdkafka_log

        # librdkafka's lines through logging (not stderr): a lookup's clients outlive a
        # broker restart until they are dropped, connection refusals and all.
        config = {**client_config(settings), **librdkafka_log()}
        group = Consumer(
            {**config, "group.id": settings.worker.app_id, "enable.auto.commit": False}
        )
        return cls(group=group, admin=AdminClient(config))

    def serve_logs(self) -> None:
        """Hand the log lines queued since the last lookup to logging."""
        from pipeline.observability.logs import serve_logs

        serve_logs(self.group, self.admin)
