"""Request keys: the Kafka key producers give a request, and the worker's dedupe key.

Two hashes. :func:`content_hash` is the request's Kafka key (producers compute
it, for partitioning only). The worker dedupes on a stricter key,
:class:`InputKeys`: two texts share one only when the model is given the same
input, computed by the same model files and settings (the fingerprint,
:mod:`pipeline.inference.fingerprint`); the README's "Keys" gives the rule.
Pure: no Kafka, no model; the tokenizer is handed in.
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from collections.abc import Callable
from typing import Any

__all__ = ["KEY_RULE", "InputKeys", "content_hash", "normalise"]


def normalise(text: str) -> str:
    """NFC-normalise, trim, and collapse runs of whitespace to one space."""
    # str.split() splits on exactly what the regex \s matches (both are str.isspace),
    # at a fifth of re.sub's cost (0.4 against 1.9 us a text; checked on every code point).
    return " ".join(unicodedata.normalize("NFC", text).split())


def content_hash(text: str, model_id: str) -> str:
    """Hex hash of the normalised text and the model id: the request's Kafka key.

    Equal for texts that differ only in whitespace or Unicode composition, so
    they meet on one partition and are computed once.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(model_id.encode("utf-8"))
    h.update(b"\x00")
    h.update(normalise(text).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


#: Unicode White_Space (Rust's ``char::is_whitespace``): what the pre-tokenizers in
#: ``_SPLITTING`` split on and drop. Not Python's ``\s``, which also matches U+001C..U+001F.
_WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)
_WHITE_RUN = re.compile("[" + re.escape(_WHITE_SPACE) + "]+")
_SPACE_RUN = re.compile(" {2,}")
#: Pre-tokenizers that split a text on whitespace and drop it, so a run of it reads as one.
_SPLITTING = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
#: Normalisers that map each ASCII character on its own, whatever surrounds it.
_CHARWISE = frozenset({"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
#: Bump when the rule below changes: keys of two rules are never compared.
KEY_RULE = "1"


class InputKeys:
    """Dedupe keys: equal for two texts only when the model is given the same input.

    ``keys(text)`` is a hex BLAKE2b-128 of the ``fingerprint`` (the model's files and
    everything else that changes its answer) and one of two forms of the text:

    - the tokenizer's own normal form: its normaliser's output
      (``backend_tokenizer.normalizer.normalize_str``), with runs of whitespace read as
      one space when its pre-tokenizer splits on whitespace and drops it (checked here
      on every whitespace character). The tokenizer turns equal normal forms into equal
      token ids, so they get one key;
    - the exact text, when that cannot be promised: no fast tokenizer (``tokenizer``
      None), a text holding an added token's content (``[MASK]``, matched before
      normalisation), or a text the normaliser rejects.

    The normaliser is a copy of the tokenizer's, so calls never contend with the
    engine's tokenizer thread. About one normaliser call and one hash per text.
    """

    def __init__(self, fingerprint: str, tokenizer: Any | None = None) -> None:
        self._normalize: Callable[[str], str] | None = None
        self._added: re.Pattern[str] | None = None
        self._added_marks = ""  # a text without any of these holds no added token
        self._ascii: dict[int, str] | None = None  # the normaliser's map of ASCII, char by char
        self._collapse = False
        self._ascii_spaced = False  # the ASCII map turns whitespace into spaces already
        self._own: Any | None = None
        # The last text asked for and its form: a worker asks twice per input, for
        # its key and then its length (TokenLengths), ~2 µs of normalising a text.
        self._last: tuple[str | None, str | None] = (None, None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            own = type(backend).from_str(backend.to_str())  # private: no shared state
            self._own = own
            normalizer, pre = own.normalizer, own.pre_tokenizer
            self._normalize = normalizer.normalize_str if normalizer is not None else str
            self._ascii = _ascii_map(normalizer)
            self._collapse = pre is not None and _drops_white_space(pre)
            contents = sorted(
                {t.content.casefold() for t in own.get_added_tokens_decoder().values()} - {""},
                key=len,
                reverse=True,
            )
            if contents:
                self._added = re.compile("|".join(map(re.escape, contents)))
                firsts = {c[0] for c in contents}
                if all(not f.isalnum() and f.isascii() for f in firsts):
                    self._added_marks = "".join(sorted(firsts))
            # ASCII: whitespace becomes a space as it is mapped (then only runs of spaces
            # are left), unless an added token holds whitespace to match.
            if (
                self._collapse
                and self._ascii is not None
                and not any(_WHITE_RUN.search(c) for c in contents)
            ):
                self._ascii = {i: _WHITE_RUN.sub(" ", v) for i, v in self._ascii.items()}
                self._ascii_spaced = True
        base = hashlib.blake2b(digest_size=16)
        rule = f"{KEY_RULE}:{int(self._normalize is not None)}:{int(self._collapse)}"
        base.update(f"{fingerprint}\x00{rule}\x00".encode("utf-8", "surrogatepass"))
        self._base = base

    @property
    def tokenizer(self) -> Any | None:
        """The keys' own copy of the backend tokenizer (``tokenizers.Tokenizer``), or None
        without a fast tokenizer; read-only by promise: the keys rely on its settings."""
        return self._own

    def __call__(self, text: str) -> str:
        form = self.form(text)
        h = self._base.copy()
        if form is None:
            h.update(b"x")
            h.update(text.encode("utf-8", "surrogatepass"))
        else:
            h.update(b"n")
            h.update(form.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def form(self, text: str) -> str | None:
        """The normal form ``text`` is keyed by, or None when it is keyed exactly."""
        last_text, last_form = self._last  # one read: a pair another thread set whole
        if text is last_text:
            return last_form
        form = self._form(text)
        self._last = (text, form)
        return form

    def _form(self, text: str) -> str | None:
        if self._normalize is None:
            return None
        spaced = False
        if self._ascii is not None and text.isascii():
            form = text.translate(self._ascii)  # what the normaliser gives, without the call
            spaced = self._ascii_spaced
        else:
            try:
                form = self._normalize(text)
            except Exception:  # e.g. a lone surrogate: the exact text is always safe
                return None
        added = self._added
        if (
            added is not None
            and self._may_hold_added(text, form)
            and (added.search(text.casefold()) or added.search(form.casefold()))
        ):
            return None
        if spaced:
            if "  " in form:
                form = _SPACE_RUN.sub(" ", form)
            form = form.strip(" ")
        elif self._collapse:
            form = _WHITE_RUN.sub(" ", form).strip(" ")
        return form

    def _may_hold_added(self, text: str, form: str) -> bool:
        marks = self._added_marks
        if not marks:
            return True
        for m in marks:  # noqa: SIM110 (a loop, not any(): no generator per text)
            if m in text or m in form:
                return True
        return False


def _ascii_map(normalizer: Any) -> dict[int, str] | None:
    """The normaliser's output for each ASCII character, when it maps ASCII text one
    character at a time (a known kind, checked on sample texts), else None."""
    if normalizer is None:
        return {i: chr(i) for i in range(128)}
    if type(normalizer).__name__ not in _CHARWISE:
        return None
    try:
        table = {i: normalizer.normalize_str(chr(i)) for i in range(128)}
        rng = random.Random(0)
        alphabet = "".join(map(chr, range(128)))
        samples = [alphabet, alphabet[::-1], "a\x1fb \t\r\nC\x00D\x7f"]
        samples += ["".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(200)]
        if all(s.translate(table) == normalizer.normalize_str(s) for s in samples):
            return table
    except Exception:
        pass
    return None


def _drops_white_space(pre: Any) -> bool:
    """Whether the pre-tokenizer ``pre`` splits on every whitespace character and drops
    it: a known kind, and "a<ws>b" / " a " read as ["a", "b"] / ["a"]."""
    if type(pre).__name__ not in _SPLITTING:
        return False
    try:
        cases = [(f"a{c}{c}b", ["a", "b"]) for c in _WHITE_SPACE] + [(" a ", ["a"])]
        return all([p for p, _ in pre.pre_tokenize_str(t)] == want for t, want in cases)
    except Exception:
        return False
