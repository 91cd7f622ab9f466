"""Exact token lengths (pipeline.codecs.lengths) against the real tokenizer's ``encode``:
all-MiniLM-L6-v2's (BERT's pre-tokenizer: the ASCII fast path) and the same vocabulary
behind another pre-tokenizer (the general path); and the worker queues its requests with
them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.runtime import InstantBroker, LengthEngine

from pipeline.codecs.keys import InputKeys
from pipeline.codecs.lengths import TokenLengths
from pipeline.inference.loading import default_model_path
from pipeline.kafka.client import request_bytes
from pipeline.settings import Settings
from pipeline.tools.bench.workload import WorkloadSpec, generate
from pipeline.worker.records import Incoming, Origin
from pipeline.worker.runtime import Runtime, wall_ms

_HOSTILE = [
    "",
    "   ",
    "[MASK] is an added token, and so is [cls]",
    "Café naïve résumé — “quoted” ½ ™ ﬁ",
    "東京は日本の首都です。",
    "emoji 🙂🚀, a\x1fcontrol\x00char and a\u200bzero width space",
    "tabs\tand\nnewlines\r\n  runs   of spaces",
    "under_score, hy-phen, a.b.c, $5.00 & 100% (ok?) {x} [y] <z> ~`^|\\",
    "pneumonoultramicroscopicsilicovolcanoconiosis " * 3,
    "y" * 400,
    "word " * 300,
]


@pytest.fixture(scope="module")
def backend() -> Any:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(default_model_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class _Fast:
    """What InputKeys reads of a fast tokenizer: its ``backend_tokenizer``."""

    def __init__(self, backend: Any) -> None:
        self.backend_tokenizer = backend


def _texts() -> list[str]:
    bench = [r.text for r in generate(WorkloadSpec(n=2000, dup_rate=0.0, seed=3))]
    readme = Path(__file__).parents[3] / "README.md"
    prose = [p for p in readme.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return bench + prose + _HOSTILE


def test_counts_equal_the_tokenizers_own_encode(backend: Any) -> None:
    lengths = TokenLengths.of(InputKeys("fp", _Fast(backend)))
    assert lengths is not None
    for text in _texts():
        real = len(backend.encode(text).ids)
        assert lengths(text, 100_000) == real, text
        assert lengths(text, 256) == min(real, 256), text


def test_another_pre_tokenizer_is_counted_through_its_own_words(backend: Any) -> None:
    """Whitespace-only splitting (punctuation stays in words): no BERT regex applies."""
    from tokenizers import pre_tokenizers

    other = type(backend).from_str(backend.to_str())
    other.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    lengths = TokenLengths.of(InputKeys("fp", _Fast(other)))
    assert lengths is not None
    for text in _texts():
        assert lengths(text, 100_000) == len(other.encode(text).ids), text


def test_the_word_cache_is_bounded_and_counts_stay_exact(backend: Any) -> None:
    lengths = TokenLengths.of(InputKeys("fp", _Fast(backend)), words=3)
    assert lengths is not None
    for text in _texts()[:300]:
        assert lengths(text, 100_000) == len(backend.encode(text).ids), text
    assert len(lengths._words) == 3


def test_without_a_tokenizer_there_are_no_lengths() -> None:
    assert TokenLengths.of(InputKeys("fp")) is None


def test_the_worker_queues_requests_with_their_exact_length(backend: Any) -> None:
    """``Runtime(lengths=...)``: the scheduler's plan carries the tokenizer's count."""
    text = "Tokenization of pneumonoultramicroscopicsilicovolcanoconiosis, exactly!"
    keys = InputKeys("fp", _Fast(backend))

    async def main() -> Any:
        runtime = Runtime(
            Settings.from_env({}),
            engine=LengthEngine(),  # type: ignore[arg-type]
            publisher=InstantBroker().publisher(),
            ack=lambda token: asyncio.sleep(0),
            keys=keys,
            lengths=TokenLengths.of(keys),
        )
        _rid, value = request_bytes(text, request_id="r-1")
        assert runtime.take(Incoming("bulk", Origin("lane.bulk", 0, 0, 0, None, value), 0))
        return runtime.scheduler.next_batch(wall_ms() + 1_000)  # past its batch window

    plan = asyncio.run(main())
    assert plan is not None and len(plan.items) == 1
    assert plan.items[0].tokens == len(backend.encode(text).ids) == plan.real_tokens


def test_an_inputs_key_then_its_length_normalise_its_text_once(backend: Any) -> None:
    """The worker asks for a text's key and then its length: the normal form is
    computed once for both, and keys and lengths equal those of keys that remember
    nothing (each text asked of fresh ones), for texts seen before too."""
    keys = InputKeys("fp", _Fast(backend))
    lengths = TokenLengths.of(keys)
    assert lengths is not None
    forms = 0
    form = keys._form

    def counted(text: str) -> str | None:
        nonlocal forms
        forms += 1
        return form(text)

    keys._form = counted  # type: ignore[method-assign]
    texts = _texts()[:200] + _HOSTILE
    for text in texts + texts:  # the second round: texts seen before, not just now
        fresh = InputKeys("fp", _Fast(backend))
        fresh_lengths = TokenLengths.of(fresh)
        assert fresh_lengths is not None
        assert keys(text) == fresh(text), text
        assert lengths(text, 100_000) == fresh_lengths(text, 100_000), text
    assert forms == 2 * len(texts)
