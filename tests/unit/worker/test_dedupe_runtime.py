"""The stored-result level of dedupe inside the worker's core (:class:`Runtime`): what is
stored, what is served from the store, and what is computed again.

The broker is a send function that acknowledges at once, the model a stand-in that
embeds a text as its length and records what it was given; the store is a plain
dict under the real :class:`StoredResults` (or one whose reads or writes raise).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from support.runtime import InstantBroker, LengthEngine, submit

from pipeline.codecs.avro import result_codec
from pipeline.codecs.keys import InputKeys
from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.worker.dedupe import Retention, StoredEntry, StoredResults
from pipeline.worker.events import Answered
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime

LONG = "a long text " * 20  # 240 characters: cut at level 3 of load shedding


class _Model(LengthEngine):
    """Stands in for the model: embeds a text as its length; ``texts`` lists every text."""

    @property
    def texts(self) -> list[str]:
        return [text for batch in self.batches for text in batch]


class _Rig:
    """One runtime over ``table``; ``answer`` submits texts and waits for their answers."""

    def __init__(
        self,
        table: Any,
        *,
        keys: Callable[[str], str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.model = _Model()
        self.broker = InstantBroker()
        self.results = self.broker.results
        self.letters = self.broker.letters
        self.released: list[int] = []
        self.now = 1_000_000
        self.settings = Settings.from_env(
            {"PIPELINE_SCHEDULER_WINDOW_MS": "0", "PIPELINE_WORKER_EXPIRE_LANES": "", **(env or {})}
        )
        self.store = StoredResults(table, retention=Retention(3_600_000), clock_ms=lambda: self.now)
        self.runtime = Runtime(
            self.settings,
            engine=self.model,  # type: ignore[arg-type]
            publisher=self.broker.publisher(),
            ack=self._release,
            stored=self.store,
            keys=keys,
            clock_ms=lambda: self.now,
        )
        self._offset = 0
        self._batches: asyncio.Future[None] | None = None

    async def close(self) -> None:
        if self._batches is not None:
            self._batches.cancel()
        await self.runtime.close(5.0)

    async def _release(self, token: Any) -> None:
        self.released.append(token)

    async def answer(self, *texts: str, released: int | None = None) -> list[dict[str, Any]]:
        """Submit ``texts``; return their results once each is published and, unless
        ``released`` says how many inputs are released by then, released."""
        first = len(self.results)
        want_released = len(self.released) + (len(texts) if released is None else released)
        if self._batches is None:
            self._batches = asyncio.ensure_future(self.runtime.run())
        for text in texts:
            _rid, value = request_bytes(text, request_id=f"r-{self._offset}")
            origin = Origin("lane.standard", 0, self._offset, 0, None, value)
            self._offset += 1
            await submit(self.runtime, Incoming("standard", origin, token=origin.offset))
        for _ in range(3000):
            done = len(self.results) - first == len(texts)
            if done and len(self.released) == want_released and not self.runtime._tasks:
                return self.results[first:]
            await asyncio.sleep(0.005)
        raise AssertionError(f"not answered: {self.runtime.counters}, {self.released}")


Make = Callable[..., _Rig]


def _run(body: Callable[[Make], Awaitable[None]]) -> None:
    """Run ``body`` with a factory of rigs; every rig made is closed afterwards."""

    async def main() -> None:
        rigs: list[_Rig] = []

        def make(table: Any, **kw: Any) -> _Rig:
            rigs.append(_Rig(table, **kw))
            return rigs[-1]

        try:
            await body(make)
        finally:
            for rig in rigs:
                await rig.close()

    asyncio.run(main())


def test_a_stored_answer_is_served_to_the_same_model_input_only() -> None:
    async def main(make: Make) -> None:
        rig = make({})
        (first,) = await rig.answer("the same text")
        (again,) = await rig.answer("the same text")
        (other,) = await rig.answer("another text")
        assert (first["served"], again["served"], other["served"]) == (
            "computed",
            "stored",
            "computed",
        )
        assert rig.model.texts == ["the same text", "another text"]

    _run(main)


def test_a_stored_answer_of_another_model_fingerprint_is_computed_again() -> None:
    async def main(make: Make) -> None:
        table: dict[bytes, bytes] = {}
        old = make(table, keys=InputKeys("fingerprint of the old weights"))
        await old.answer("a text")
        new = make(table, keys=InputKeys("fingerprint of the new weights"))
        (again,) = await new.answer("a text")
        assert again["served"] == "computed"
        assert new.model.texts == ["a text"]
        # the same fingerprint is served from the store (the store did work)
        (same,) = await make(table, keys=InputKeys("fingerprint of the new weights")).answer(
            "a text"
        )
        assert same["served"] == "stored"

    _run(main)


def _shed_to(rig: _Rig, level: int, *, late: bool = True) -> None:
    """Drive the real load shedder to ``level`` with realtime answers, late or on time,
    as the answer stage reports them: events through the runtime's dispatch."""
    guard = rig.runtime.guard
    while guard.level != level:
        rig.now += 60_000  # past the cooldown
        for _ in range(200):
            rig.runtime.dispatch(Answered("realtime", rig.now, late=late))


def _cut_by_load_shedding(rig: _Rig) -> None:
    """Drive the real load shedder to level 3 (texts cut) with late realtime answers."""
    _shed_to(rig, 3)
    guard = rig.runtime.guard
    assert guard.actions.max_text_chars is not None
    assert len(LONG) > guard.actions.max_text_chars


def test_shedding_reaches_deadlines_and_gates_through_the_runtime_and_recovers() -> None:
    """Late realtime answers (Answered events) raise shedding: bulk's lane is paused and
    standard's late requests expire (the deadline owner says so); on-time answers bring
    both back."""

    async def main(make: Make) -> None:
        rig = make({})
        runtime = rig.runtime
        assert not runtime.deadlines.expires("standard") and runtime.gates.open("bulk")
        _shed_to(rig, 2)
        assert runtime.deadlines.expires("standard") and not runtime.gates.open("bulk")
        assert runtime.gates.open("realtime")
        _shed_to(rig, 0, late=False)
        assert not runtime.deadlines.expires("standard") and runtime.gates.open("bulk")

    _run(main)


def test_a_text_cut_by_load_shedding_is_never_stored() -> None:
    async def main(make: Make) -> None:
        table: dict[bytes, bytes] = {}
        rig = make(table, env={"PIPELINE_DEGRADE_MAX_TEXT_CHARS": "100"})
        _cut_by_load_shedding(rig)
        (cut,) = await rig.answer(LONG)
        assert rig.model.texts == [LONG[:100]] and cut["served"] == "computed"
        assert table == {}
        (again,) = await rig.answer(LONG)
        assert again["served"] == "computed"
        # a short text, not cut, is stored as ever
        await rig.answer("short")
        assert len(table) == 1

    _run(main)


def _stored_under_key(rig: _Rig, text: str, result: bytes) -> None:
    key = rig.runtime.keys(text)
    rig.store.put(key, result)


def test_a_stored_answer_of_another_model_version_or_undecodable_is_computed_again() -> None:
    async def main(make: Make) -> None:
        rig = make({})
        (first,) = await rig.answer("versioned")
        old = result_codec().encode({**first, "model_version": "0"})
        _stored_under_key(rig, "versioned", old)
        _stored_under_key(rig, "garbled", b"\xc3\x01 not a result")
        (versioned,) = await rig.answer("versioned")
        (garbled,) = await rig.answer("garbled")
        assert versioned["served"] == "computed" and garbled["served"] == "computed"
        assert versioned["model_version"] == rig.settings.model.version
        assert rig.model.texts == ["versioned", "versioned", "garbled"]
        # the recomputed answers replaced the unusable entries
        (stored,) = await rig.answer("garbled")
        assert stored["served"] == "stored"

    _run(main)


class _Unreadable(dict[bytes, bytes]):
    def get(self, key: bytes, default: Any = None) -> Any:
        raise OSError("the store cannot be read")


class _Unwritable(dict[bytes, bytes]):
    def __setitem__(self, key: bytes, value: bytes) -> None:
        raise OSError("No space left on device")


def test_a_store_lookup_that_raises_is_a_miss() -> None:
    async def main(make: Make) -> None:
        rig = make(_Unreadable())
        results = await rig.answer("one", "one", "two")
        assert sorted(r["served"] for r in results) == ["batch", "computed", "computed"]
        assert sorted(rig.released) == [0, 1, 2]

    _run(main)


def test_a_store_write_that_fails_never_releases_the_input() -> None:
    async def main(make: Make) -> None:
        rig = make(_Unwritable())
        (result,) = await rig.answer("to be stored", released=0)
        assert result["served"] == "computed"  # the answer is out...
        assert rig.released == []  # ...but the input is never released
        assert rig.letters == []

    _run(main)


def test_stored_entries_survive_a_round_trip_and_expire() -> None:
    entry = StoredEntry(stored_at_ms=5, result=b"r")
    assert StoredEntry.decode(entry.encode()) == entry
    assert StoredEntry.decode(b"short") is None
