"""The Faust edge: the start-up check of the patched internals, the lane records taken
from each fetch in one batch, their acks, and the dedupe store's partitions.

Faust is patched globally by :func:`pipeline.kafka.faust_edge.install`, so every test that
installs or imports ``pipeline.app`` runs in a subprocess and leaves this process alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.subprocess_python import run_python

from pipeline.errors import ConfigurationError
from pipeline.kafka import faust_edge


def test_the_installed_faust_is_the_tested_one() -> None:
    faust_edge.check()  # raises when constraints.txt and the venv disagree


def test_another_faust_release_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version="0.16.0")
    assert "0.16.0" in str(err.value)
    assert "constraints.txt" in str(err.value)


def test_missing_private_attributes_are_named() -> None:
    class Consumer:
        def __init__(self) -> None:
            self._read_offset: dict[object, int] = {}

        def ack(self, message: object) -> bool:
            return True

    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version=faust_edge.TESTED_FAUST, consumer=Consumer)
    text = str(err.value)
    for name in ("Consumer._add_gap", "Consumer._committed_offset", "Consumer.seek"):
        assert name in text
    assert "Consumer.ack" not in text.replace("Consumer.ack,", "")  # present: not named
    assert "\n" not in text


def test_a_store_without_the_key_index_bounded_here_is_named() -> None:
    class Store:
        def __init__(self) -> None:
            self._dbs: dict[int, object] = {}

        def set_persisted_offset(self) -> None: ...

        def _db_for_partition(self) -> None: ...

    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version=faust_edge.TESTED_FAUST, store=Store)
    assert "Store._key_index" in str(err.value)
    assert "Store._dbs" not in str(err.value)


def test_a_worker_with_a_patched_attribute_missing_stops_with_one_line() -> None:
    done = run_python(
        """
        import faust.transport.consumer as c
        del c.Consumer._add_gap
        import pipeline.app
        """
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pipeline: ") and "Consumer._add_gap" in lines[0]


def test_a_released_lane_offset_is_acked_to_faust() -> None:
    """The releaser hands a released input's message to Faust's own Consumer.ack, which
    then counts its offset as committable (and stops waiting for it)."""
    done = run_python(
        """
        import asyncio, json
        import faust
        from faust.types.tuples import TP, ConsumerMessage as Message
        from pipeline.kafka import faust_edge

        faust_edge.install(frozenset({"lane"}), lambda records: None, fetch_max_wait_ms=100)
        app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
        app.topics.acking_topics.add("lane")  # as the subscribed lane topic makes it
        consumer = app.consumer
        message = Message("lane", 0, 5, 0.0, 0, None, b"k", b"v", None, tp=TP("lane", 0))
        consumer.unacked.add(message)
        out = {"before": list(consumer._acked[TP("lane", 0)])}
        asyncio.run(faust_edge.releaser(lambda: consumer)(message))
        out["after"] = list(consumer._acked[TP("lane", 0)])
        out["unacked"] = len(consumer.unacked)
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"before": [], "after": [5], "unacked": 0}


def test_offsets_passed_at_a_partitions_end_let_faust_commit_past_them() -> None:
    """A transaction's two markers end the partition after offset 4: Faust's gaps count
    only below an acked offset, so its commit stopped at 5; with the markers passed
    (``pass_end``) Faust's own ``_new_offset`` reaches 7, the log end."""
    done = run_python(
        """
        import asyncio, json
        import faust
        from faust.types.tuples import TP, ConsumerMessage as Message
        from pipeline.kafka import faust_edge

        app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
        app.topics.acking_topics.add("lane")
        consumer = app.consumer
        tp = TP("lane", 0)
        consumer._committed_offset[tp] = 3
        for offset in (3, 4):
            m = Message("lane", 0, offset, 0.0, 0, None, b"k", b"v", None, tp=tp)
            consumer.ack(m)
        out = {"records": consumer._new_offset(tp)}
        consumer._committed_offset[tp] = out["records"]
        asyncio.run(faust_edge.add_gap(consumer, tp, 5, 6))
        out["gap"] = consumer._new_offset(tp)
        faust_edge.pass_end(consumer, ("lane", 0), 5, 6)
        out["passed"] = consumer._new_offset(tp)
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"records": 5, "gap": None, "passed": 7}


def test_a_seek_back_that_reads_a_stale_commit_does_not_stop_the_partitions_commits() -> None:
    """The lookup of a seek back answers 29 while the commit of 32 lands: with Faust's
    own ``perform_seek`` its committed offset falls back to 29, below the acks that
    commit removed, and ``_new_offset`` refuses every later commit (None); with the
    edge's, 32 stands and the next commit goes through."""
    done = run_python(
        """
        import asyncio, json
        import faust
        from faust.transport.consumer import Consumer
        from faust.types.tuples import TP, ConsumerMessage as Message
        from pipeline.kafka.faust_edge import consumer as edge_consumer

        def run(perform_seek):
            app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
            app.topics.acking_topics.add("lane")
            consumer = app.consumer
            tp = TP("lane", 0)
            consumer._committed_offset[tp] = 29
            for offset in (29, 30, 31):
                consumer.ack(Message("lane", 0, offset, 0.0, 0, None, b"k", b"v", None, tp=tp))

            async def stale_lookup():
                # the commit of 32 lands while the lookup is under way
                consumer._committed_offset[tp] = consumer._new_offset(tp)
                return {tp: 29}

            consumer.seek_to_committed = stale_lookup
            asyncio.run(perform_seek(consumer))
            for offset in (32, 33):
                consumer.ack(Message("lane", 0, offset, 0.0, 0, None, b"k", b"v", None, tp=tp))
            return [consumer._committed_offset[tp], consumer._new_offset(tp)]

        out = {"faust": run(Consumer.perform_seek), "edge": run(edge_consumer._seek_forward_only)}
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"faust": [29, None], "edge": [32, 34]}


def test_each_fetch_hands_its_lane_records_over_in_one_call() -> None:
    """Faust's own ``Consumer.getmany`` runs (flow control, generation, active partitions,
    its round robin over partitions); the lane records of one fetch reach the sink in
    one call, in each partition's offset order, tracked as unacked; the other topics'
    records are yielded to Faust's fetch loop as before."""
    done = run_python(
        """
        import asyncio, json
        from types import SimpleNamespace
        import faust
        from faust.types.tuples import TP
        from pipeline.kafka import faust_edge

        calls = []
        faust_edge.install(
            frozenset({"lane"}), lambda records: calls.append(records), fetch_max_wait_ms=100
        )
        app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
        consumer = app.consumer

        def record(topic, partition, offset):
            return SimpleNamespace(
                topic=topic, partition=partition, offset=offset, timestamp=1000,
                timestamp_type=0, headers=[], key=b"k", value=b"v%d" % offset, checksum=None,
                serialized_key_size=1, serialized_value_size=2,
            )

        fetched = {
            TP("lane", 0): [record("lane", 0, o) for o in (4, 5, 6)],
            TP("other", 0): [record("other", 0, o) for o in (10, 11)],
            TP("lane", 1): [record("lane", 1, o) for o in (7, 8)],
        }

        async def wait_next_records(timeout):
            return fetched, set(fetched)

        consumer._wait_next_records = wait_next_records
        consumer.highwater = lambda tp: 99

        async def drain():
            return [(tp.topic, m.offset) async for tp, m in consumer.getmany(timeout=1.0)]

        yielded = asyncio.run(drain())
        out = {
            "yielded": yielded,
            "calls": [[(m.topic, m.partition, m.offset) for m in call] for call in calls],
            "unacked": sorted((m.topic, m.offset) for m in consumer.unacked),
        }
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["yielded"] == [["other", 10], ["other", 11]]
    assert len(out["calls"]) == 1
    lane = out["calls"][0]
    assert sorted(lane) == sorted(
        [["lane", 0, 4], ["lane", 0, 5], ["lane", 0, 6], ["lane", 1, 7], ["lane", 1, 8]]
    )
    for partition in (0, 1):
        offsets = [o for _t, p, o in lane if p == partition]
        assert offsets == sorted(offsets)
    assert out["unacked"] == [["lane", 4], ["lane", 5], ["lane", 6], ["lane", 7], ["lane", 8]]


def test_the_seek_back_to_committed_offsets_rewinds_uncommitted_lane_partitions() -> None:
    """Faust's consumer thread seeks back (``perform_seek``) through
    ``seek_to_committed_or_start``, on the thread: aiokafka's own seek first, then the
    lane partitions it leaves where they were (no commit, or 0) from their first
    offset; other topics' partitions, and one no longer assigned, are left alone.
    The aiokafka behaviour this relies on is checked on a broker in
    tests/kafka/test_seek_back.py."""
    done = run_python(
        """
        import asyncio, json
        from aiokafka import TopicPartition as TP
        from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
        from pipeline.kafka import faust_edge

        faust_edge.install(frozenset({"lane"}), lambda records: None, fetch_max_wait_ms=100)
        committed = {
            TP("lane", 0): None, TP("lane", 1): 4, TP("lane", 2): 0, TP("lane", 3): None,
            TP("other", 0): None,
        }

        class AIOKafkaConsumer:  # what aiokafka's consumer does on the broker
            sought = []

            async def seek_to_committed(self):
                return committed

            def assignment(self):
                return set(committed) - {TP("lane", 3)}  # revoked meanwhile

            async def seek_to_beginning(self, *tps):
                self.sought.extend(tps)

        aio = AIOKafkaConsumer()
        thread = AIOKafkaConsumerThread.__new__(AIOKafkaConsumerThread)
        thread._ensure_consumer = lambda: aio
        on_thread = []

        async def call_thread(fun, *args):
            on_thread.append(fun.__name__)
            return await fun(*args)

        thread.call_thread = call_thread
        returned = asyncio.run(AIOKafkaConsumerThread.seek_to_committed(thread))
        print(json.dumps({
            "on_thread": on_thread,
            "sought": sorted([tp.topic, tp.partition] for tp in aio.sought),
            "returned": returned is committed,
        }))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "on_thread": ["seek_to_committed_or_start"],
        "sought": [["lane", 0], ["lane", 2]],
        "returned": True,
    }


def test_a_consumer_thread_without_the_seek_back_is_named() -> None:
    class Thread:
        def call_thread(self) -> None: ...

    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version=faust_edge.TESTED_FAUST, thread=Thread)
    text = str(err.value)
    assert "AIOKafkaConsumerThread.seek_to_committed" in text
    assert "AIOKafkaConsumerThread._ensure_consumer" in text
    assert "AIOKafkaConsumerThread._create_worker_consumer" in text
    assert "AIOKafkaConsumerThread.call_thread" not in text


def test_a_full_lanes_partition_is_paused_in_aiokafka_itself_until_resumed() -> None:
    """pause_fetch pauses the partition in aiokafka's own consumer, on the consumer
    thread's loop (Faust's flow control left aiokafka fetching it, and a getmany asked
    before the resume waited up to 1 s with the old partitions); resume_fetch undoes
    it, whichever TP type it is given; a partition revoked meanwhile is let be."""
    import asyncio
    from types import SimpleNamespace

    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition
    from faust.types import TP

    async def scenario() -> list[set[TopicPartition]]:
        aio = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        aio.assign([TopicPartition("lane", 0), TopicPartition("lane", 1)])
        loop = asyncio.get_running_loop()
        thread = SimpleNamespace(_ensure_consumer=lambda: aio, thread_loop=loop)
        consumer = SimpleNamespace(_thread=thread)
        seen = []
        faust_edge.pause_fetch(consumer, TP("lane", 1))
        seen.append(aio.paused())  # made on the thread's loop, not at once
        await asyncio.sleep(0.01)
        seen.append(aio.paused())
        faust_edge.resume_fetch(consumer, TopicPartition("lane", 1))
        await asyncio.sleep(0.01)
        seen.append(aio.paused())
        faust_edge.pause_fetch(consumer, TP("lane", 0))
        aio.assign([TopicPartition("lane", 1)])  # revoked before the pause is made
        await asyncio.sleep(0.01)
        seen.append(aio.paused())
        await aio.stop()
        return seen

    assert asyncio.run(scenario()) == [set(), {TopicPartition("lane", 1)}, set(), set()]


def test_the_workers_consumer_waits_in_a_fetch_as_long_as_the_setting_says() -> None:
    """The worker's consumer and the bench's bare Faust agent's (which must pay the
    same fetch path) wait PIPELINE_KAFKA_FETCH_MAX_WAIT_MS, not Faust's 1500."""
    done = run_python(
        """
        import asyncio
        import faust
        from pipeline.kafka import faust_edge
        from pipeline.settings import Settings

        faust_edge.install(frozenset({"lane"}), lambda records: None, fetch_max_wait_ms=123)
        app = faust.App("edge-test", broker="kafka://127.0.0.1:1")

        def fetch_wait(app):
            return app.consumer._thread._create_worker_consumer(app.transport)._fetch_max_wait_ms

        async def main():
            print(fetch_wait(app))
            from pipeline.tools.bench.faust_floor import create_floor_app

            env = {"PIPELINE_KAFKA_FETCH_MAX_WAIT_MS": "77", "PIPELINE_WORKER_APP_ID": "floor"}
            print(fetch_wait(create_floor_app(Settings.from_env(env))))

        asyncio.run(main())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["123", "77"]


def test_the_workers_consumer_reads_with_the_isolation_level_set() -> None:
    """read_committed unless PIPELINE_KAFKA_ISOLATION_LEVEL says otherwise; Faust's own
    choice (read_uncommitted without exactly_once) when the edge is given none."""
    done = run_python(
        """
        import asyncio
        import faust
        from pipeline.kafka import faust_edge
        from pipeline.settings import Settings

        def level(app):
            return app.consumer._thread._create_worker_consumer(app.transport)._isolation_level

        async def main():
            app = faust.App("edge-test", broker="kafka://127.0.0.1:1")
            faust_edge.set_fetch_max_wait(100)
            print(level(app))
            for env in ({}, {"PIPELINE_KAFKA_ISOLATION_LEVEL": "read_uncommitted"}):
                s = Settings.from_env(env)
                faust_edge.install(
                    frozenset({"lane"}), lambda records: None, fetch_max_wait_ms=100,
                    isolation_level=s.kafka.isolation_level,
                )
                print(level(app))

        asyncio.run(main())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["read_uncommitted", "read_committed", "read_uncommitted"]


def test_offsets_aiokafkas_fetch_walks_past_without_a_record_are_noted() -> None:
    """aiokafka's own FetchResult.getall over records 10, 11 and 16 of a fetch from 10
    whose position ends at 18 (a transaction aborted at 12..15, a marker at 17, as its
    PartitionRecords skips them): 12..15 and 17 are noted; a fetch of a changelog
    topic notes nothing; a result dropped for a moved position notes nothing."""
    done = run_python(
        """
        from types import SimpleNamespace as NS
        from aiokafka.consumer.fetcher import FetchResult
        from pipeline.kafka import faust_edge

        class Records:  # aiokafka's PartitionRecords, as far as getall uses it
            def __init__(self, start, offsets, end):
                self.next_fetch_offset, self._offsets, self._end = start, list(offsets), end
            def __iter__(self):
                return self
            def __next__(self):
                if not self._offsets:
                    self.next_fetch_offset = self._end
                    raise StopIteration
                o = self._offsets.pop(0)
                self.next_fetch_offset = o + 1
                return NS(offset=o)

        class Assignment:
            active = True
            def __init__(self, position):
                self.state = NS(paused=False, position=position,
                                consumed_to=lambda p: setattr(self.state, "position", p))
            def state_value(self, tp):
                return self.state

        passed = faust_edge.PassedOffsets({"lane"})
        faust_edge.install(frozenset({"lane"}), lambda r: None, fetch_max_wait_ms=100,
                           passed=passed)
        for topic in ("lane", "changelog"):
            a = Assignment(10)
            got = FetchResult((topic, 0), assignment=a,
                              partition_records=Records(10, [10, 11, 16], 18), backoff=0)
            print(topic, [r.offset for r in got.getall()], a.state.position,
                  passed.ranges((topic, 0)))
        moved = FetchResult(("lane", 1), assignment=Assignment(0),
                            partition_records=Records(10, [10], 12), backoff=0)
        print("moved", moved.getall(), passed.ranges(("lane", 1)))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "lane [10, 11, 16] 18 [(12, 15), (17, 17)]",
        "changelog [10, 11, 16] 18 []",
        "moved [] []",
    ]


def test_seeks_back_and_position_reads_are_made_on_the_consumers_thread() -> None:
    """The reader's seek back and its position read run on the consumer thread's loop
    (Faust's seek changed aiokafka's state from the event loop's thread); a seek of a
    partition revoked meanwhile is let be; a position that does not come within the
    timeout raises instead of holding the thread."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from aiokafka.errors import IllegalStateError

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    calls: list[tuple[str, object, bool]] = []

    class AIOKafka:  # aiokafka's consumer, as far as the edge calls it
        def seek(self, partition: object, offset: int) -> None:
            calls.append(("seek", (partition, offset), threading.current_thread() is thread))
            if partition[1] == 9:  # type: ignore[index]
                raise IllegalStateError("not assigned")

        async def position(self, partition: object) -> int:
            calls.append(("position", partition, threading.current_thread() is thread))
            if partition[1] == 9:  # type: ignore[index]
                await asyncio.sleep(10)  # a reset under way
            return 42

    consumer = SimpleNamespace(_thread=SimpleNamespace(thread_loop=loop, _ensure_consumer=AIOKafka))

    async def main() -> list[object]:
        await faust_edge.seek(consumer, ("lane", 1), 7)
        await faust_edge.seek(consumer, ("lane", 9), 7)  # revoked: no error
        got: list[object] = [await faust_edge.position(consumer, ("lane", 1))]
        try:
            await faust_edge.position(consumer, ("lane", 9), timeout_s=0.2)
        except TimeoutError:
            got.append("timeout")
        await asyncio.sleep(0.1)  # the seeks were handed to the other loop
        return got

    try:
        assert asyncio.run(main()) == [42, "timeout"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert sorted(calls, key=str) == sorted(
        [
            ("seek", (("lane", 1), 7), True),
            ("seek", (("lane", 9), 7), True),
            ("position", ("lane", 1), True),
            ("position", ("lane", 9), True),
        ],
        key=str,
    )


def test_the_dedupe_store_keeps_nothing_per_key_in_memory(tmp_path: Path) -> None:
    """20,000 distinct keys written (and their changelog records delivered), then
    Faust's own table write path for 20,000 more: the store's key index never holds
    more than KEY_INDEX_LIMIT keys (ChangelogStore's writes leave it empty), and the
    delivered offsets one per partition; every entry is in RocksDB."""
    done = run_python(
        f"""
        import asyncio, json
        from types import SimpleNamespace
        import faust
        from faust.types import TP
        from pipeline.kafka import faust_edge
        from pipeline.kafka.faust_edge.store import KEY_INDEX_LIMIT

        app = faust.App("edge-test", broker="kafka://127.0.0.1:1", store="rocksdb://",
                        datadir={str(tmp_path)!r})
        table = app.Table("dedupe", key_type=bytes, value_type=bytes, partitions=3)

        def send(topic, key, value, partition, on_delivery):
            on_delivery(None, SimpleNamespace(partition=lambda: partition,
                                              offset=lambda: int(key[1:])))

        async def main():
            store = faust_edge.ChangelogStore(table, send)
            for i in range(20_000):
                token = SimpleNamespace(partition=i % 3)
                faust_edge.in_partition_of(token, lambda: store.__setitem__(b"k%d" % i, b"v"))
            index = table.data._key_index
            after_ours = len(index)
            for i in range(20_000):  # what Faust's Store._set does per key
                index[b"f%d" % i] = i % 3
            return {{
                "after_ours": after_ours,
                "after_faust": len(index),
                "limit": KEY_INDEX_LIMIT,
                "delivered": len(store._delivered),
                "stored": sum(1 for i in range(0, 20_000, 997) if store.get(b"k%d" % i)),
            }}

        print(json.dumps(asyncio.run(main())))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["after_ours"] == 0
    assert out["after_faust"] == out["limit"] == 1000
    assert out["delivered"] == 3
    assert out["stored"] == len(range(0, 20_000, 997))


def test_dedupe_entries_are_written_in_their_records_partition(tmp_path: Path) -> None:
    """A ChangelogStore write lands in the partition store of the record it is made
    for and its changelog record goes to that partition; a lookup finds it from any
    record (every partition held is searched); a write outside any record is refused;
    the changelog offsets the producer reports delivered become the persisted ones."""
    done = run_python(
        f"""
        import asyncio, json
        from types import SimpleNamespace
        import faust
        from pipeline.kafka import faust_edge

        app = faust.App("edge-test", broker="kafka://127.0.0.1:1", store="rocksdb://",
                        datadir={str(tmp_path)!r})
        table = app.Table("dedupe", key_type=bytes, value_type=bytes, partitions=3)
        sent = []

        deliveries = []

        def send(topic, key, value, partition, on_delivery):
            sent.append((topic, key.decode(), value.decode(), partition))
            deliveries.append(on_delivery)

        async def main():
            store = faust_edge.ChangelogStore(table, send)
            in_p1, in_p2 = SimpleNamespace(partition=1), SimpleNamespace(partition=2)
            faust_edge.in_partition_of(in_p1, lambda: store.__setitem__(b"k", b"v"))
            dbs = table.data
            found = []
            faust_edge.in_partition_of(in_p2, lambda: found.append(store.get(b"k")))
            out = {{
                "p1": dbs._db_for_partition(1).get(b"k"),
                "p2": dbs._db_for_partition(2).get(b"k"),
                "from_p2": found[0],
                "any": store.get(b"k"),
                "sent": sent,
            }}
            try:
                store[b"x"] = b"y"
            except RuntimeError as exc:
                out["outside"] = str(exc)
            # The producer reports the changelog record delivered at offset 7 (on its
            # polling thread); once flushed, that is partition 1's persisted offset.
            from faust.types import TP
            changelog = TP("edge-test-dedupe-changelog", 1)
            deliveries[0](None, SimpleNamespace(partition=lambda: 1, offset=lambda: 7))
            out["persisted_before"] = dbs.persisted_offset(changelog)
            store.flush_offsets()
            out["persisted"] = dbs.persisted_offset(changelog)
            return out

        out = asyncio.run(main())
        out = {{k: (v.decode() if isinstance(v, bytes) else v) for k, v in out.items()}}
        print(json.dumps(out))
        """
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["p1"] == "v"
    assert out["p2"] is None
    assert out["from_p2"] == "v"
    assert out["any"] == "v"
    assert out["sent"] == [["edge-test-dedupe-changelog", "k", "v", 1]]
    assert "in_partition_of" in out["outside"]
    assert out["persisted_before"] is None
    assert out["persisted"] == 7


def test_a_recovery_without_what_the_watch_reads_is_named() -> None:
    class Recovery:
        in_recovery = False

        def __init__(self) -> None:
            self.active_tps: set[object] = set()

        def need_recovery(self) -> bool:
            return False

    with pytest.raises(ConfigurationError) as err:
        faust_edge.check(version=faust_edge.TESTED_FAUST, recovery=Recovery)
    text = str(err.value)
    for name in ("Recovery.active_offsets", "Recovery._active_events_received_at"):
        assert name in text
    for name in ("Recovery._set_recovery_ended", "Recovery.signal_recovery_end"):
        assert name in text
    for present in ("Recovery.active_tps", "Recovery.in_recovery", "Recovery.need_recovery"):
        assert present not in text
