"""A small Hugging Face model folder built offline: Qwen2 architecture, a byte-level BPE tokenizer trained in
memory with `tokenizers`, and a ChatML chat template. It exercises exactly the code path of a downloaded model
(AutoTokenizer / AutoModelForCausalLM from a folder, the tokenizer's own special ids and chat template), so the
tests and the README's smoke commands need no hub:

    python -m objbench.rollout.toy_hf /tmp/toy-qwen            # writes config.json, model.safetensors, tokenizer files
    objbench train model.path=/tmp/toy-qwen task.name=arithmetic sft.steps=200 train.steps=20

head_dim is 32, a size vLLM's CPU attention supports.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def corpus(n: int = 2000, seed: int = 0) -> list[str]:
    """Text the tokenizer is trained on: arithmetic, small word problems and chat scaffolding."""
    rng = random.Random(seed)
    names = ["Tom", "Ana", "Lee", "Mia", "Sam", "Kai"]
    things = ["apples", "books", "coins", "pens", "cards", "shells"]
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        name, thing = rng.choice(names), rng.choice(things)
        out += [f"{a}+{b}={a + b}", f"{a}-{b}={a - b}", f"{a}*{b}={a * b}",
                f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
                f"{name} has {a} + {b} = {a + b} {thing}.\n#### {a + b}",
                "Solve the problem. Put the final answer after ####.", "user\n", "assistant\n", "system\n"]
    return out


def build_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A byte-level BPE tokenizer (GPT-2/Qwen style) trained in memory, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(seed=seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML
    return fast


def build_model(vocab_size: int, *, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 2,
                eos_id: int = 2, pad_id: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=512, tie_word_embeddings=True, eos_token_id=eos_id,
                      pad_token_id=pad_id, bos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg)


def write_toy_model(folder: str | Path, *, vocab_size: int = 512, seed: int = 0, **model_kw) -> Path:
    """Build tokenizer + model and ``save_pretrained`` both into ``folder``; returns the folder."""
    folder = Path(folder)
    tok = build_tokenizer(vocab_size, seed=seed)
    model = build_model(len(tok), seed=seed, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **model_kw)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(write_toy_model(a.folder, vocab_size=a.vocab_size, seed=a.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
