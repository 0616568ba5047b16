import random

import pytest
import torch

from objbench.envs import make_task
from objbench.envs.tokenizer import (
    BOS_ID,
    CHARSET,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    VOCAB,
    VOCAB_SIZE,
    build_char_tokenizer,
)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_fixed_id_prefix(tok):
    # This exact prefix matches another framework's workload; it must never move.
    expected = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "+": 13, "=": 14}
    expected.update({str(d): 3 + d for d in range(10)})
    for token, idx in expected.items():
        assert tok.convert_tokens_to_ids(token) == idx
        assert VOCAB[idx] == token


def test_full_vocabulary_table(tok):
    assert VOCAB == (
        "<pad>", "<bos>", "<eos>", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
        "+", "=", "-", "*", ".", "#", " ", "<unk>", "/", "(", ")",
    )
    assert VOCAB_SIZE == 24 == len(tok)
    assert tok.get_vocab() == {t: i for i, t in enumerate(VOCAB)}


def test_special_tokens(tok):
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 20)


def test_one_token_per_character_and_no_added_specials(tok):
    assert tok.encode("12+34=") == [4, 5, 13, 6, 7, 14]
    assert tok.encode("12+34=", add_special_tokens=True) == [4, 5, 13, 6, 7, 14]  # no post-processor
    assert tok.encode("-*.# /()") == [15, 16, 17, 18, 19, 21, 22, 23]
    assert tok.encode("") == []


def test_round_trip_random_strings(tok):
    rng = random.Random(0)
    chars = sorted(CHARSET)
    for _ in range(200):
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        ids = tok.encode(text)
        assert len(ids) == len(text)
        assert tok.decode(ids) == text  # spaces included: no clean-up rewriting


def test_round_trip_task_texts_have_no_unknowns(tok):
    for task in (make_task("arithmetic", ops=["+", "-", "*"], filler_max=3), make_task("countdown", ops=["+", "-", "*", "/"])):
        rng = random.Random(1)
        for p in task.prompts(seed=0, start=0, n=300) + task.eval_set():
            for text in (p.prompt, task.sft_target(p, rng)):
                ids = tok.encode(text)
                assert UNK_ID not in ids
                assert tok.decode(ids) == text


def test_decode_skip_special_tokens(tok):
    ids = [BOS_ID, 4, 13, 5, 14, 6, EOS_ID, PAD_ID, PAD_ID]
    assert tok.decode(ids) == "<bos>1+2=3<eos><pad><pad>"
    assert tok.decode(ids, skip_special_tokens=True) == "1+2=3"
    assert tok.batch_decode([ids, [PAD_ID, BOS_ID, 3]], skip_special_tokens=True) == ["1+2=3", "0"]


def test_special_token_text_is_recognised(tok):
    assert tok.encode("<bos>1<eos>") == [BOS_ID, 4, EOS_ID]


def test_unknown_characters_map_to_unk_one_each(tok):
    ids = tok.encode("a\n٣\U0001F600é")
    assert ids == [UNK_ID] * 5


def test_padding_side(tok):
    batch = tok(["1+2=", "12+345="], padding=True, return_tensors="pt")
    assert tok.padding_side == "left"
    assert batch["input_ids"][0].tolist() == [0, 0, 0, 4, 13, 5, 14]
    assert batch["attention_mask"][0].tolist() == [0, 0, 0, 1, 1, 1, 1]
    right = build_char_tokenizer(padding_side="right")
    batch = right(["1+2=", "12+345="], padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"][0], torch.tensor([4, 13, 5, 14, 0, 0, 0]))
    with pytest.raises(ValueError, match="padding_side"):
        build_char_tokenizer(padding_side="middle")
