"""The hand-over lead (pipeline.worker.batches.HandoverLead): what the device waited for
a batch formed at the hand-over is added to the lead, within a bound, and given back
slowly while batches find the device busy."""

from __future__ import annotations

import pytest

from pipeline.worker.batches import HandoverLead


def test_the_lead_starts_at_the_tokenisation_time_plus_the_setting() -> None:
    lead = HandoverLead(3.0)
    assert lead.ms(None) == 3.0
    assert lead.ms(4.5) == 7.5


def test_a_wait_of_the_device_is_added_and_the_extra_is_bounded() -> None:
    lead = HandoverLead(3.0)
    lead.observe(12.0)
    assert lead.ms(2.0) == pytest.approx(17.0)
    for _ in range(20):
        lead.observe(30.0)  # a device waiting on something an earlier batch cannot cure
    assert lead.extra_ms == HandoverLead.MAX_EXTRA_MS


def test_batches_that_find_the_device_busy_take_the_extra_back_slowly() -> None:
    lead = HandoverLead(3.0)
    lead.observe(20.0)
    lead.observe(HandoverLead.NOISE_MS / 2)  # noise: not a wait
    assert 19.0 < lead.extra_ms < 20.0
    for _ in range(200):
        lead.observe(0.0)
    assert lead.extra_ms < 0.1
    assert lead.ms(None) == pytest.approx(3.0, abs=0.1)


def test_the_batch_loop_feeds_the_lead_what_the_device_waited_under_a_backlog() -> None:
    """The real runtime with a stand-in engine that takes 20 ms a batch and reports the
    device idle 7 ms before each: batches formed while another runs, with a backlog
    waiting, grow the lead; the first batch (nothing ran before it) does not."""
    import asyncio
    from typing import Any

    from support.runtime import InstantBroker, LengthEngine, settle, submit

    from pipeline.inference import BatchOutcome
    from pipeline.kafka.client import request_bytes
    from pipeline.settings import Settings
    from pipeline.worker.records import Incoming, Origin
    from pipeline.worker.runtime import Runtime

    class Waiting(LengthEngine):
        async def run(self, texts: list[str], **shape: int | None) -> BatchOutcome:
            await asyncio.sleep(0.02)
            ran = await super().run(texts, **shape)
            return BatchOutcome(ran.outcomes, ran.batch_size, idle_before_ms=7.0)

    async def main() -> Runtime:
        released: list[Any] = []

        async def release(token: Any) -> None:
            released.append(token)

        runtime = Runtime(
            Settings.from_env({"PIPELINE_SCHEDULER_POLICY": "fixed",
                               "PIPELINE_SCHEDULER_MAX_ITEMS": "8"}),
            engine=Waiting(),  # type: ignore[arg-type]
            publisher=InstantBroker().publisher(),
            ack=release,
        )  # fmt: skip
        for offset in range(64):
            _rid, value = request_bytes(f"text {offset}", request_id=f"r-{offset}")
            origin = Origin("lane.bulk", 0, offset, 0, None, value)
            assert await submit(runtime, Incoming("bulk", origin, token=offset))
        assert runtime.batches.lead.extra_ms == 0.0
        batches = asyncio.ensure_future(runtime.run())
        await settle(runtime, batches, lambda: len(released) == 64)
        return runtime

    runtime = asyncio.run(main())
    assert runtime.batches.lead.extra_ms > 7.0
