"""One character tokenizer shared by every task, built in memory (no hub access).

One token per character, and one fixed vocabulary for all tasks, so a single tiny model fits every task and a
checkpoint trained on one task can be scored on another. The first fifteen ids are fixed on purpose: a benchmark
matches another framework's workload that uses exactly `<pad>`=0, `<bos>`=1, `<eos>`=2, `0`-`9`=3-12, `+`=13,
`=`=14. New symbols may only ever be appended at the end; reordering would silently change every checkpoint.

| id | token | | id | token |
|----|-------|-|----|-------|
| 0 | `<pad>` | | 15 | `-` |
| 1 | `<bos>` | | 16 | `*` |
| 2 | `<eos>` | | 17 | `.` (filler) |
| 3-12 | `0`-`9` | | 18 | `#` (separator) |
| 13 | `+` | | 19 | ` ` (space) |
| 14 | `=` | | 20 | `<unk>` |
| | | | 21-23 | `/` `(` `)` (countdown expressions) |

The tokenizer adds no special tokens of its own (no post-processor): the training code prepends `<bos>` to prompts
and appends `<eos>` to targets. Any character outside the vocabulary encodes to `<unk>` (one per character).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"

# The order is the id assignment. Append only.
VOCAB: tuple[str, ...] = (
    PAD_TOKEN, BOS_TOKEN, EOS_TOKEN,
    *"0123456789",
    "+", "=", "-", "*", ".", "#", " ",
    UNK_TOKEN,
    "/", "(", ")",
)
VOCAB_SIZE: int = len(VOCAB)
TOKEN_TO_ID: dict[str, int] = {tok: i for i, tok in enumerate(VOCAB)}
PAD_ID: int = TOKEN_TO_ID[PAD_TOKEN]
BOS_ID: int = TOKEN_TO_ID[BOS_TOKEN]
EOS_ID: int = TOKEN_TO_ID[EOS_TOKEN]
UNK_ID: int = TOKEN_TO_ID[UNK_TOKEN]
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
# Plain characters a task may use in prompts and completions.
CHARSET: frozenset[str] = frozenset(tok for tok in VOCAB if tok not in SPECIAL_TOKENS)

assert VOCAB[:15] == ("<pad>", "<bos>", "<eos>", *"0123456789", "+", "="), "fixed id prefix changed"
assert len(set(VOCAB)) == VOCAB_SIZE and all(len(t) == 1 for t in CHARSET)


def build_char_tokenizer(padding_side: str = "left") -> PreTrainedTokenizerFast:
    """Build the shared character tokenizer.

    padding_side: "left" (default, what batched generation wants for prompts) or "right".
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    # Imported here so that `import envs` (tasks, verifiers) stays light for analysis and reward workers.
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=dict(TOKEN_TO_ID), unk_token=UNK_TOKEN))
    # Every character (newlines included) becomes its own pre-token, so WordLevel sees single characters only.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # join tokens with no separator
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side=padding_side,
        # The default clean-up would rewrite " ." and similar; characters must round-trip exactly.
        clean_up_tokenization_spaces=False,
    )
    return tok
