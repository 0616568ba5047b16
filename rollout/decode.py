"""Response ids to text, as ``batch_decode(ids, skip_special_tokens=True)``, fast for the tokenizers used here."""

from __future__ import annotations

import torch


def _concat_table(tokenizer) -> list[str] | None:
    """For a word-level tokenizer whose decoder just concatenates tokens (the task character tokenizers):
    the text of every id ("" for special tokens), so decoding is a join. None for any other tokenizer."""
    cached = getattr(tokenizer, "_objbench_concat_table", False)
    if cached is not False:
        return cached
    table = None
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and type(rust.model).__name__ == "WordLevel" and type(rust.decoder).__name__ == "Fuse":
        special = set(tokenizer.all_special_ids)
        vocab = rust.get_vocab(with_added_tokens=True)
        table = [""] * (max(vocab.values()) + 1)
        for tok, i in vocab.items():
            table[i] = "" if i in special else tok
    tokenizer._objbench_concat_table = table
    return table


def decode_responses(tokenizer, ids: torch.Tensor) -> list[str]:
    """Texts of the responses with special tokens skipped, as ``batch_decode(ids, skip_special_tokens=True)``.
    A concatenating word-level tokenizer decodes by table look-up; other fast tokenizers in Rust directly
    (transformers' batch_decode first converts every id through Python: ~3 ms for 256 short rows)."""
    table = _concat_table(tokenizer)
    if table is not None:
        return ["".join([table[i] for i in row]) for row in ids.tolist()]
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and hasattr(rust, "decode_batch"):
        return rust.decode_batch(ids.tolist(), skip_special_tokens=True)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)
