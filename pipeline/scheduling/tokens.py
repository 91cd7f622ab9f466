"""How many tokens a text will be, estimated where the tokenizer is not at hand.

The worker buckets a request by length when it queues it, before the model
process has tokenized it, and the batch is padded to its bucket. Where the
model has a fast tokenizer the worker counts exactly
(:class:`pipeline.codecs.lengths.TokenLengths`, ~5 µs a text); this estimate
is what it uses otherwise (the no-op task, a tokenizer the exact count cannot
follow) and what start-up calibration sizes its texts by. The estimate used to be four
characters a token plus two: on the bench's texts (common English words,
about five characters a token) it put only 33 % of the texts in their real
bucket and overshot by 34 % on average, so a batch padded to the bucket of
an overestimate, and requests of one real length landed in different
buckets; on the simulated slow device adaptive's batches were 0.40 padding
against the model alone's 0.06.

A BERT-style tokenizer splits on whitespace and punctuation, then into word
pieces: a common word is one token, a long or rare one a few. So: two
special tokens, one per word plus one per nine characters of it, one per
punctuation mark. Against all-MiniLM-L6-v2's tokenizer it put 92 % of the
bench's texts and 66 % of this repository's prose (README and design
paragraphs) in their real bucket (four characters a token: 33 % and 44 %),
with 3 % and 9 % mean error; it costs 1-2 µs a text, where the worker's
``tokenizers`` handle (built for the dedupe keys) took 175 µs to encode one.
"""

from __future__ import annotations

import re

__all__ = ["estimate_tokens"]

_PUNCTUATION = re.compile(r"[^\w\s]")

#: Characters of a word per extra word piece.
_PIECE_CHARS = 9


def estimate_tokens(text: str, limit: int) -> int:
    """Tokens ``text`` is estimated to be, special tokens included, at most ``limit``."""
    n = 2 + len(_PUNCTUATION.findall(text))
    for word in text.split():
        n += 1 + len(word) // _PIECE_CHARS
    return min(n, limit)
