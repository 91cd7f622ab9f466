"""Exact token lengths, cheap enough to take for every request as it is queued.

The scheduler buckets each request by its length and a batch is padded to its
bucket (on a GPU and the simulated device) or to its longest text (on a CPU).
An estimate (:func:`pipeline.scheduling.tokens.estimate_tokens`, 2-3 µs) puts
the bench's texts within -2..+1 tokens, but they are short (median 11
tokens), and two tokens is a sixth of such a text: replayed through the real
scheduler at the slow simulated device's cost, batches were 0.24 padding
(0.82x the model alone); exact lengths with one-token buckets below 16, 0.11
(0.97x) (docs/design.md, "Exact lengths"). The tokenizer's own ``encode``
costs ~35 µs a text here, against ~80 µs for all else the worker does per
request; this count costs ~4 µs on ASCII text:

- the text's normal form is the dedupe key's (:meth:`InputKeys.form`: on ASCII
  text one ``str.translate``);
- the pre-tokenizer's words come from one regular expression where the
  pre-tokenizer is BERT's and the form ASCII (checked against the real one at
  load), else from the pre-tokenizer itself;
- each word's pieces come from the tokenizer's model, cached per word (at most
  ``words`` of them, each at most ``_CACHED_CHARS`` long: common words repeat);
- plus the special tokens, capped at the limit.

A text holding an added token (``[MASK]``), or one the normaliser rejects, is
encoded whole. Promise: ``lengths(text, limit)`` equals
``min(len(tokenizer.encode(text).ids), limit)``, checked on sample texts when
built (:meth:`TokenLengths.of` gives None where it does not hold, and the
worker keeps the estimate).
"""

from __future__ import annotations

import random
import re
from typing import Any

from pipeline.codecs.keys import InputKeys

__all__ = ["TokenLengths"]

#: BERT's pre-tokenizer on ASCII: runs of anything but whitespace and punctuation
#: (every printable ASCII character that is not a letter or digit), and each
#: punctuation mark alone. Whitespace is Rust's ``char::is_whitespace``.
_BERT_WORDS = re.compile(r"[^\t\n\x0b\x0c\r !-/:-@\[-`{-~]+|[!-/:-@\[-`{-~]")
#: Words longer than this are counted each time, not cached (bounds the cache's memory).
_CACHED_CHARS = 48


class TokenLengths:
    """Token counts of texts as the model's tokenizer counts them (special tokens
    included). Not thread-safe: one per event loop. Build with :meth:`of`."""

    def __init__(self, keys: InputKeys, tokenizer: Any, *, words: int = 65_536) -> None:
        self._keys = keys
        self._tokenizer = tokenizer
        self._pre = tokenizer.pre_tokenizer
        self._model = tokenizer.model
        post = tokenizer.post_processor
        self._special = post.num_special_tokens_to_add(False) if post is not None else 0
        self._words: dict[str, int] = {}
        self._max_words = words
        self._ascii_words = self._pre is not None and _splits_like_bert(self._pre)

    @classmethod
    def of(cls, keys: InputKeys, *, words: int = 65_536) -> TokenLengths | None:
        """The lengths of ``keys``' tokenizer, or None when there is none or the counts
        differ from its ``encode`` on the sample texts."""
        own = keys.tokenizer
        if own is None:
            return None
        tokenizer = type(own).from_str(own.to_str())  # its own: truncation and padding off
        tokenizer.no_truncation()
        tokenizer.no_padding()
        lengths = cls(keys, tokenizer, words=words)
        try:
            if all(lengths(t, 10_000) == len(tokenizer.encode(t).ids) for t in _samples()):
                return lengths
        except Exception:  # any tokenizer the count cannot follow keeps the estimate
            pass
        return None

    def __call__(self, text: str, limit: int) -> int:
        """Tokens the model will see for ``text``, at most ``limit``."""
        form = self._keys.form(text)
        if form is None:
            try:
                return min(len(self._tokenizer.encode(text).ids), limit)
            except Exception:  # e.g. a lone surrogate: the model rejects it; length moot
                return min(len(text), limit)
        if self._ascii_words and form.isascii():
            words: list[str] = _BERT_WORDS.findall(form)
        else:
            words = [w for w, _ in self._pre.pre_tokenize_str(form)] if self._pre else [form]
        n = self._special
        cache = self._words
        for word in words:
            pieces = cache.get(word)
            if pieces is None:
                pieces = len(self._model.tokenize(word))
                if len(word) <= _CACHED_CHARS and len(cache) < self._max_words:
                    cache[word] = pieces
            n += pieces
            if n >= limit:
                return limit
        return min(n, limit)


def _splits_like_bert(pre: Any) -> bool:
    """Whether ``pre`` is BERT's pre-tokenizer and splits ASCII as ``_BERT_WORDS`` does."""
    if type(pre).__name__ != "BertPreTokenizer":
        return False
    rng = random.Random(0)
    alphabet = "".join(map(chr, range(128)))
    texts = [alphabet, alphabet[::-1]]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(200)]
    try:
        return all([w for w, _ in pre.pre_tokenize_str(t)] == _BERT_WORDS.findall(t) for t in texts)
    except Exception:
        return False


def _samples() -> list[str]:
    """Texts the count is checked on against the tokenizer's own ``encode``: ASCII,
    punctuation, long and rare words, whitespace runs, accents, CJK, emoji, controls."""
    rng = random.Random(1)
    alphabet = "".join(map(chr, range(32, 127))) + "  \t\n"
    texts = [
        "The quick brown fox jumps over the lazy dog.",
        "  Hello,   world!!  (it's 3:45pm)  ",
        "pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
        "Café naïve résumé — “quoted” ½ ™",
        "東京は日本の首都です。 mixed 漢字 text",
        "emoji 🙂🚀 and a\x1fcontrol\x00char",
        "x" * 300,
        "",
    ]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(1, 80))) for _ in range(100)]
    return texts
