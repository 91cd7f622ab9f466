"""Every use of faust-streaming's private parts, in one package, checked at start-up.

The worker needs a few things Faust's public API does not offer; each is
made here, and nowhere else:

- lane records are taken from each fetch as one batch, below Faust's
  per-event streams (:func:`install`): a bare Faust agent (raw bytes in, one
  produce per event) tops out at a few thousand events/s on this kind of
  machine, most of it spent building, queueing and delivering an event per
  record (docs/design.md, "Intake in batches"). So no lane record meets
  Faust's fetch loop, its streams or their acks: Faust's per-record
  "read offset" drops and "gap" acks (worker/continuity.py tells what those did to
  lane offsets before) never touch one, and a lane offset is acked to Faust
  only when the pipeline's watermark released it (:func:`releaser`);
- a hole the consumer really has (offsets that do not exist) is let through
  to Faust's commit explicitly (:func:`add_gap`); the offsets aiokafka's fetcher
  walks past without a record (a transaction's marker, an aborted or compacted
  record) are noted (:class:`PassedOffsets`, :func:`note_passed`), so the reader
  passes such a hole at once, without a seek back or a word above DEBUG;
- the consumer reads with the isolation level of ``PIPELINE_KAFKA_ISOLATION_LEVEL``
  (``read_committed`` by default; Faust asks for it only with ``exactly_once``);
- a record the reader passes over is dropped from Faust's unacked set, so a
  stopping worker does not wait for it (:func:`forget`);
- the answered inputs are committed when a rebalance revokes their partitions
  (:func:`install`): Faust's revoke drops every revoked partition's acked,
  uncommitted offsets before its own commit runs, so the partitions' next
  owners answered again everything acked since the last periodic commit;
- offsets at a partition's end that hold no record are acked as if they did,
  so the group commits past them (:func:`pass_end`);
- Faust's seek back to the committed offsets (after records it dropped in a
  rebalance, and when recovery ends) also rewinds the lane partitions the group
  has committed nothing for (:func:`seek_to_committed_or_start`), and never
  moves Faust's own committed offset back (:func:`_seek_forward_only`);
- a dedupe write names the partition of its record, so the changelog record
  goes to that partition (:func:`in_partition_of`);
- the dedupe table's memtables get a Bloom filter, which Faust's RocksDB options
  cannot say (:func:`filter_memtables`);
- the consumer's committed offsets, for the lag metric (:func:`committed`);
- the reader's seeks back and position reads are made on the consumer's thread
  (:func:`seek`, :func:`position`): Faust's ``seek`` changes aiokafka's state from
  the event loop's thread, and its ``position`` can hold the consumer thread's
  method queue while a position is being reset;
- a worker whose answer path failed stops at once, exits non-zero and waits
  for none of the records Faust handed out (:func:`stop_worker`);
- a full lane's partitions are paused in aiokafka itself (:func:`pause_fetch`),
  and the worker's consumer waits at most ``PIPELINE_KAFKA_FETCH_MAX_WAIT_MS``
  in a fetch (:func:`set_fetch_max_wait`): Faust's own flow control left a
  resumed partition unread for up to a second (see :func:`pause_fetch`), and
  its 1.5 s fetch wait stood a consumer idle behind a fetch of partitions with
  nothing new;
- the dedupe table is written into its local store directly and its changelog
  records go out through the worker's librdkafka producer, and the store's key
  index is a bounded LRU (:class:`ChangelogStore`): through Faust's table API each write is one
  record on Faust's aiokafka producer, whose buffer of 100 records stalled
  intake ("producer buffer full") and cut a noop worker's throughput by more
  than half;
- Faust's recovery of the dedupe table is watched (:class:`RecoveryWatch`): a
  changelog partition that receives nothing is read again, then let go, so the
  stored results (a cache) never hold a partition's lanes for long.

:func:`check` runs when ``pipeline.app`` is imported: a Faust other than the
pinned, tested one (``constraints.txt``), or one without these attributes,
stops the worker with one line before it joins the consumer group.

The package's files: ``consumer.py``, the consumer's patches and the calls
the lane reader makes on it (everything above but the dedupe table);
``passed.py``, the offsets the fetcher passed without a record;
``store.py``, the dedupe table's store and changelog (:class:`ChangelogStore`,
:func:`in_partition_of`); ``recovery_watch.py``, the watch on its recovery;
``stop.py``, the loud stop; this file, the start-up check.
"""

from __future__ import annotations

import importlib.metadata
import inspect

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import FetchResult, PartitionRecords
from faust.transport.consumer import Consumer, ThreadDelegateConsumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types.settings import Settings as FaustSettings
from mode import Service
from mode.threads import ServiceThread

from pipeline.errors import ConfigurationError
from pipeline.kafka.faust_edge.consumer import (
    add_gap,
    committed,
    forget,
    install,
    note_passed,
    pass_end,
    pause_fetch,
    position,
    releaser,
    resume_fetch,
    seek,
    seek_to_committed_or_start,
    set_fetch_max_wait,
)
from pipeline.kafka.faust_edge.passed import PassedOffsets
from pipeline.kafka.faust_edge.recovery_watch import RecoveryWatch
from pipeline.kafka.faust_edge.stop import stop_worker
from pipeline.kafka.faust_edge.store import ChangelogStore, filter_memtables, in_partition_of

__all__ = [
    "TESTED_FAUST",
    "ChangelogStore",
    "PassedOffsets",
    "RecoveryWatch",
    "add_gap",
    "check",
    "committed",
    "filter_memtables",
    "forget",
    "in_partition_of",
    "install",
    "note_passed",
    "pass_end",
    "pause_fetch",
    "position",
    "releaser",
    "resume_fetch",
    "seek",
    "seek_to_committed_or_start",
    "set_fetch_max_wait",
    "stop_worker",
]

#: The faust-streaming release these patches were written and tested against.
TESTED_FAUST = "0.15.3"

#: Instance attributes of ``faust.transport.consumer.Consumer`` used here.
_CONSUMER_STATE = ("_acked", "_committed_offset", "_read_offset", "_unacked_messages")
#: Methods of ``Consumer`` replaced or called here.
_CONSUMER_METHODS = (
    "_add_gap",
    "ack",
    "commit",
    "getmany",
    "maybe_wait_for_commit_to_finish",
    "on_partitions_revoked",
    "perform_seek",
    "seek",
    "seek_to_committed",
    "unacked",
)
#: Methods of the aiokafka driver's consumer thread replaced or called here.
_THREAD_METHODS = (
    "_create_worker_consumer",
    "_ensure_consumer",
    "call_thread",
    "seek_to_committed",
)

#: Instance attributes of other classes (set in their ``__init__``) used here.
_INSTANCE_STATE = (
    (ThreadDelegateConsumer, "_thread"),
    (ServiceThread, "thread_loop"),
    (AIOKafkaConsumer, "_fetch_max_wait_ms"),
    (AIOKafkaConsumer, "_isolation_level"),
    (FetchResult, "_partition_records"),
    (FetchResult, "_topic_partition"),
    (PartitionRecords, "next_fetch_offset"),
)
#: What the recovery watch reads and calls on Faust's table recovery.
_RECOVERY_STATE = (
    "_active_events_received_at",
    "active_highwaters",
    "active_offsets",
    "active_tps",
)
_RECOVERY_ATTRIBUTES = (
    "_recovery_started_at",
    "_set_recovery_ended",
    "active_remaining",
    "flush_buffers",
    "in_recovery",
    "need_recovery",
    "signal_recovery_end",
)

#: Methods of aiokafka's classes replaced here.
_AIOKAFKA_METHODS = ((FetchResult, "getall"),)


def check(
    version: str | None = None,
    consumer: type = Consumer,
    store: type | None = None,
    thread: type | None = None,
    recovery: type | None = None,
) -> None:
    """Raise ConfigurationError (one line) unless Faust is the tested release and has
    every private attribute this package relies on."""
    if store is None:
        from faust.stores.rocksdb import Store

        store = Store
    if thread is None:
        thread = AIOKafkaConsumerThread
    if recovery is None:
        from faust.tables.recovery import Recovery

        recovery = Recovery
    found = version if version is not None else importlib.metadata.version("faust-streaming")
    if found != TESTED_FAUST:
        raise ConfigurationError(
            f"faust-streaming {found} is installed, but the worker patches private parts of "
            f"{TESTED_FAUST} (pipeline/kafka/faust_edge/): install the pinned versions with "
            "`pip install -c constraints.txt -e .` (./run setup does)"
        )
    missing = [f"Consumer.{name}" for name in _CONSUMER_METHODS if not hasattr(consumer, name)]
    init = _init_source(consumer)
    missing += [f"Consumer.{name}" for name in _CONSUMER_STATE if f"self.{name}" not in init]
    missing += [
        f"AIOKafkaConsumerThread.{name}" for name in _THREAD_METHODS if not hasattr(thread, name)
    ]
    missing += [
        f"{cls.__name__}.{name}"
        for cls, name in _INSTANCE_STATE
        if f"self.{name}" not in _init_source(cls)
    ]
    missing += [f"{c.__name__}.{name}" for c, name in _AIOKAFKA_METHODS if not hasattr(c, name)]
    recovery_init = _init_source(recovery)
    missing += [f"Recovery.{n}" for n in _RECOVERY_STATE if f"self.{n}" not in recovery_init]
    missing += [f"Recovery.{n}" for n in _RECOVERY_ATTRIBUTES if not hasattr(recovery, n)]
    # stop_worker: Faust's setting, mode's crash reason and the service's beacon.
    missing += [
        f"{cls.__name__}.{name}"
        for cls, name in ((FaustSettings, "stream_wait_empty"), (Service, "crash_reason"))
        if not hasattr(cls, name)
    ]
    if "self.beacon" not in inspect.getsource(Service):
        missing.append("mode.Service.beacon")
    for name in ("set_persisted_offset", "_db_for_partition"):
        if not hasattr(store, name):
            missing.append(f"faust.stores.rocksdb.Store.{name}")
    for name in ("_dbs", "_key_index", "rocksdb_options"):
        if f"self.{name}" not in _init_source(store):
            missing.append(f"faust.stores.rocksdb.Store.{name}")
    if missing:
        raise ConfigurationError(
            f"faust-streaming {found} lacks {', '.join(missing)}, which the worker relies on "
            "(pipeline/kafka/faust_edge/): reinstall with `pip install -c constraints.txt -e .`"
        )


def _init_source(cls: type) -> str:
    """The source of ``cls.__init__`` (where its instance attributes are made), or ""."""
    try:
        return inspect.getsource(vars(cls)["__init__"])
    except (KeyError, OSError, TypeError):
        return ""
