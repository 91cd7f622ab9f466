"""Content hashes, stored results with expiry, single-flight."""

from __future__ import annotations

import itertools
import re
import sys
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.codecs.keys import InputKeys, content_hash, normalise
from pipeline.inference import default_model_path
from pipeline.worker.dedupe import Retention, SingleFlight, StoredResults


def test_hash_ignores_whitespace_and_unicode_form_but_not_model() -> None:
    a = content_hash("  Caf\u00e9   au lait ", "m@1")
    b = content_hash("Cafe\u0301 au\tlait", "m@1")
    assert a == b
    assert a != content_hash("Café au lait", "m@2")
    assert a != content_hash("Café au laid", "m@1")
    assert normalise(" a \n b ") == "a b"
    assert len(a) == 32 and int(a, 16) >= 0


def test_the_kafka_keys_whitespace_is_every_unicode_whitespace_and_nothing_else() -> None:
    # Producers in any language compute this key (README, "Keys"): runs of any code
    # point Python's \s matches collapse to one space, ends trimmed; nothing else does.
    for code in range(sys.maxunicode + 1):
        c = chr(code)
        if re.fullmatch(r"\s", c):
            assert normalise(f"{c}a{c}{c}b{c}") == "a b", hex(code)
        else:
            assert normalise(c) == unicodedata.normalize("NFC", c), hex(code)


def test_stored_results_expire_and_survive_round_trip() -> None:
    now = [1_000]
    table: dict[bytes, bytes] = {}
    stored = StoredResults(table, retention=Retention(100), clock_ms=lambda: now[0])
    assert stored.get("ab") is None
    stored.put("ab", b"result")
    assert stored.get("ab") == b"result"
    now[0] += 100
    assert stored.get("ab") == b"result"
    now[0] += 1
    assert stored.get("ab") is None
    table[b"cd"] = b"\x00"  # corrupt entry: ignored, not a crash
    assert stored.get("cd") is None


def test_single_flight_leader_then_joiners_then_fresh_start() -> None:
    flight: SingleFlight[str] = SingleFlight()
    assert flight.join("h", "first") is True
    assert flight.join("h", "second") is False
    assert "h" in flight and len(flight) == 1
    assert flight.finish("h") == ["first", "second"]
    assert flight.join("h", "third") is True


# -- dedupe keys: equal only for the same model input ---------------------------------


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True)


@pytest.fixture(scope="module")
def minilm_keys(minilm_tokenizer: Any) -> InputKeys:
    return InputKeys("fp", minilm_tokenizer)


def test_texts_the_tokenizer_reads_differently_get_different_keys(minilm_tokenizer: Any) -> None:
    keys = InputKeys("fp", minilm_tokenizer)
    assert keys("Alpha") == keys("alpha")  # keyed by the tokenizer's normal form
    for a, b in [
        ("alpha\x1fbeta gamma delta", "alpha beta gamma delta"),  # U+001F is deleted
        ("alpha\x0bbeta", "alpha beta"),  # so is a vertical tab (a control character)
        ("a\x85b", "a b"),  # and NEL
        ("[MASK] x", "[mask] x"),  # an added token is matched before lowercasing
        ("Café", "Cafe!"),
    ]:
        ids = minilm_tokenizer([a, b])["input_ids"]
        assert ids[0] != ids[1], (a, b)
        assert keys(a) != keys(b), (a, b)


def test_texts_the_tokenizer_reads_alike_share_a_key(minilm_tokenizer: Any) -> None:
    keys = InputKeys("fp", minilm_tokenizer)
    for a, b in [
        ("alpha beta gamma delta", "  ALPHA beta\tgamma \u3000 delta\n"),
        ("Café au lait", "cafe\xa0au lait"),  # accents stripped, as the uncased model does
        ("中文", "中 文"),  # each CJK character is a word of its own
    ]:
        ids = minilm_tokenizer([a, b])["input_ids"]
        assert ids[0] == ids[1], (a, b)
        assert keys(a) == keys(b), (a, b)
    assert InputKeys("another fingerprint", minilm_tokenizer)("alpha") != keys("alpha")


# Kin: pieces of one group often read alike, sometimes not (where Python, the
# normaliser and the pre-tokenizer disagree). A pair of texts is built of words and
# separators, taking at each place two pieces of one group: equal keys are frequent,
# and the traps are among them.
_SEPARATORS = [" ", "  ", "\t", "\n", "\x1c", "\x1f", "\x0b", "\x85", "\xa0", "\u3000", ""]
_WORDS = [
    ["ab", "AB", "\xe1b", "a\u0301b", "\xc1B", "a\x1fb", "a\x00b", "a\u200bb"],
    ["[MASK]", "[mask]", "[Mask]", "[ MASK ]"],
    ["\u4e2d", "\u4e2d ", " \u4e2d"],
    ["!", "\uff01", " !"],
    ["\ud800", "x"],
]


def _kin(group: list[str]) -> st.SearchStrategy[tuple[str, str]]:
    return st.tuples(st.sampled_from(group), st.sampled_from(group))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from(_WORDS).flatmap(_kin), _kin(_SEPARATORS)),
        min_size=1,
        max_size=6,
    )
)
def test_equal_keys_mean_equal_token_ids(
    minilm_tokenizer: Any,
    minilm_keys: InputKeys,
    pairs: list[tuple[tuple[str, str], tuple[str, str]]],
) -> None:
    text_a = "".join(word + sep for (word, _), (sep, _) in pairs)
    text_b = "".join(word + sep for (_, word), (_, sep) in pairs)
    if minilm_keys(text_a) != minilm_keys(text_b):
        return
    try:
        ids = minilm_tokenizer([text_a, text_b])["input_ids"]
    except Exception:  # a lone surrogate: keyed exactly, so only equal texts share
        assert text_a == text_b
        return
    assert ids[0] == ids[1], (text_a, text_b)


def test_equal_keys_mean_equal_token_ids_for_every_pair_of_kin(
    minilm_tokenizer: Any, minilm_keys: InputKeys
) -> None:
    """Exhaustive over two-word texts: every pair of separators, with every pair of kin
    in one of the words (the random test above builds longer texts)."""
    kin = [
        (wa, sa, wb, sb)
        for group in _WORDS
        for wa, wb in itertools.product(group, repeat=2)
        for sa, sb in itertools.product(_SEPARATORS, repeat=2)
    ]
    pairs = [(f"{wa}{sa}x", f"{wb}{sb}x") for wa, sa, wb, sb in kin]
    pairs += [(f"ab{sa}{wa}", f"ab{sb}{wb}") for wa, sa, wb, sb in kin]
    shared = [(a, b) for a, b in pairs if a != b and minilm_keys(a) == minilm_keys(b)]
    assert len(shared) > 1000  # the test has teeth: many different texts share a key
    for a, b in shared:
        ids = minilm_tokenizer([a, b])["input_ids"]
        assert ids[0] == ids[1], (a, b)


def test_whitespace_runs_are_one_only_where_the_pre_tokenizer_drops_whitespace() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = Tokenizer(models.BPE())
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt_like = InputKeys(
        "fp",
        PreTrainedTokenizerFast(tokenizer_object=byte_level),  # type: ignore[no-untyped-call]
    )
    assert gpt_like("a  b") != gpt_like("a b") and gpt_like(" a") != gpt_like("a")
    split = Tokenizer(models.BPE())
    split.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = InputKeys(
        "fp",
        PreTrainedTokenizerFast(tokenizer_object=split),  # type: ignore[no-untyped-call]
    )
    assert words("a \t b ") == words("a b") != words("a\x1fb")
    exact = InputKeys("fp")  # no fast tokenizer: only equal texts share
    assert exact("a b") == exact("a b") != exact("a  b")
