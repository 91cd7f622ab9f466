"""Build a tiny BERT model folder in seconds, for tests that need a real model.

The folder holds a WordPiece vocabulary, a fast tokenizer and an untrained
``BertForSequenceClassification`` with three labels; it loads through
``pipeline.inference.load_model`` with task ``classify`` or ``embed``.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ["good", "bad", "movie", "the", "is", "very", "not", "poison", "a", "film", "##s"]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def build_tiny_bert(folder: Path, *, seed: int = 0) -> Path:
    """Write a tiny sequence-classification BERT into ``folder`` and return it."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # transformers 5.x: the argument is ``vocab`` (a path or a dict); ``vocab_file``
    # is silently swallowed by **kwargs and every token becomes [UNK].
    tokenizer = transformers.BertTokenizer(vocab=str(vocab_file))
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        id2label=dict(LABELS),
        label2id={v: k for k, v in LABELS.items()},
    )
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
