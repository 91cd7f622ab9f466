"""The answer producer (librdkafka bridged to asyncio): acknowledgements arrive on the
event loop in batches, a refused record fails definitely, a record whose fate is
unknown fails as such and is never resent (``pipeline.kafka.producer``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.errors import AnswerPathFailure, PublishRejected
from pipeline.kafka.producer import MAX_MESSAGE_BYTES, AnswerProducer, Report
from pipeline.kafka.security import client_config
from pipeline.settings import Settings
from pipeline.tools.supervise import free_port


class _Counted(AnswerProducer):
    """Counts the event loop's wake-ups (one per poll that returned reports)."""

    wakeups = 0

    def _settle(self, reports: list[Report]) -> None:
        self.wakeups += 1
        super()._settle(reports)


def _settings(bootstrap: str) -> Settings:
    return Settings.from_env({"PIPELINE_KAFKA_BOOTSTRAP_SERVERS": bootstrap})


async def _outcomes(
    producer: AnswerProducer, sends: list[tuple[str, bytes]]
) -> list[BaseException | None]:
    producer.start()
    try:
        futures = [await producer.send(topic, None, value) for topic, value in sends]
        done = await asyncio.gather(*futures, return_exceptions=True)
        return [d if isinstance(d, BaseException) else None for d in done]
    finally:
        await asyncio.get_running_loop().run_in_executor(None, producer.close, 5.0)


def test_a_record_over_the_size_limit_is_refused_without_a_broker() -> None:
    fatal: list[BaseException] = []
    producer = AnswerProducer(_settings(f"127.0.0.1:{free_port()}"), on_fatal=fatal.append)
    (outcome,) = asyncio.run(_outcomes(producer, [("results", b"x" * (MAX_MESSAGE_BYTES + 1))]))
    assert isinstance(outcome, PublishRejected), outcome
    assert fatal == []


def test_a_delivery_that_times_out_has_an_unknown_fate() -> None:
    fatal: list[BaseException] = []
    producer = AnswerProducer(
        _settings(f"127.0.0.1:{free_port()}"),  # nobody listens: never acknowledged
        on_fatal=fatal.append,
        extra={"message.timeout.ms": 500},
    )
    outcomes = asyncio.run(_outcomes(producer, [("results", b"a"), ("results", b"b")]))
    assert all(isinstance(o, AnswerPathFailure) for o in outcomes), outcomes
    assert "may or may not be written" in str(outcomes[0])


@pytest.mark.kafka
def test_acknowledgements_reach_the_loop_in_batches(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory("answers", partitions=1)
    settings = _settings(kafka_bootstrap)
    producer = _Counted(settings, on_fatal=lambda exc: None)
    n = 2_000
    outcomes = asyncio.run(_outcomes(producer, [(topic, b"%d" % i) for i in range(n)]))
    assert outcomes == [None] * n
    assert producer.wakeups < n, "one wake-up per poll, not one per record"
    assert producer.outstanding == 0
    consumer = Consumer({**client_config(settings), "group.id": "-"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert high - low == n, "each record written once"


def test_every_librdkafka_error_is_a_refusal_or_of_unknown_fate() -> None:
    """Over every error code librdkafka defines: a delivery report with one of the
    definite refusals (docs/design.md, "What a failed produce means") dead-letters
    the input; every other code, the ones librdkafka retries by itself included
    (they only reach a report as _MSG_TIMED_OUT), and any fatal error, stops the
    worker with the input kept."""
    from confluent_kafka import KafkaError

    from pipeline.kafka.producer import _DEFINITE, RETRIED, classify

    codes = {
        getattr(KafkaError, name)
        for name in dir(KafkaError)
        if name.lstrip("_").isupper() and isinstance(getattr(KafkaError, name), int)
    }
    assert len(codes) > 150  # the whole list, not a sample
    assert codes.issuperset(_DEFINITE | RETRIED) and not _DEFINITE & RETRIED
    for code in codes:
        verdict = classify(KafkaError(code), "results")
        expected = PublishRejected if code in _DEFINITE else AnswerPathFailure
        assert isinstance(verdict, expected), (KafkaError(code).name(), verdict)
        fatal = classify(KafkaError(code, fatal=True), "results")
        assert isinstance(fatal, AnswerPathFailure), KafkaError(code).name()
    # The one issue 30 named: a record outside the topic's timestamp bounds.
    assert isinstance(classify(KafkaError(KafkaError.INVALID_TIMESTAMP), "r"), PublishRejected)
    for unknown in (KafkaError._MSG_TIMED_OUT, KafkaError._FATAL, KafkaError.UNKNOWN):
        assert isinstance(classify(KafkaError(unknown), "r"), AnswerPathFailure)
