"""The TRL-parity workload (issue 6), built identically for both frameworks.

Everything here is fixed by the issue text, so two frameworks see byte-identical inputs:

- tokenizer: one token per character, ``<pad>``=0 ``<bos>``=1 ``<eos>``=2 ``0``-``9``=3-12 ``+``=13 ``=``=14
  (the first fifteen ids of objbench's own character tokenizer, by design), no post-processor;
- model: ``LlamaForCausalLM(LlamaConfig(vocab_size=15, hidden_size=64, intermediate_size=256,
  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
  tie_word_embeddings=True))`` built right after ``torch.manual_seed(0)``, fp32, sdpa attention;
- warm start: targets ``<bos>a+b=`` + reversed digits of a+b + ``<eos>``, a, b uniform in [0, 99] from
  ``random.Random(0)``; 600 steps, batch 64, AdamW lr 1e-3 (torch defaults otherwise), loss on the answer tokens
  and ``<eos>`` only (mean over those tokens of the batch);
- prompts: a, b uniform in [0, 99] from ``random.Random(1234)``, 32 per step, in order;
- reward: 1.0 iff the completion is exactly the reversed digits of a+b followed by ``<eos>``.
"""

from __future__ import annotations

import random
from functools import lru_cache

import torch

from objbench.envs.base import NumericProblem, Problem, RewardResult, Task

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
VOCAB = ("<pad>", "<bos>", "<eos>", *"0123456789", "+", "=")
PROMPTS_PER_STEP = 32
GROUP_SIZE = 8
MAX_NEW_TOKENS = 8
SFT_STEPS, SFT_BATCH, SFT_LR = 600, 64, 1e-3


def build_tokenizer():
    """The 15-token character tokenizer as a transformers PreTrainedTokenizerFast (left padding)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", padding_side="left", clean_up_tokenization_spaces=False)


def build_model(attn_implementation: str = "sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=15, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    cfg._attn_implementation = attn_implementation
    return LlamaForCausalLM(cfg).float()


def answer(a: int, b: int) -> str:
    return str(a + b)[::-1]


def char_ids(text: str) -> list[int]:
    return [VOCAB.index(ch) for ch in text]


def pairs(seed: int, n: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a = rng.randint(0, 99)
        b = rng.randint(0, 99)
        out.append((a, b))
    return out


def warm_start(model) -> list[float]:
    """The issue's SFT warm start, in place. Returns the loss per step."""
    rng = random.Random(0)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR)
    model.train()
    losses = []
    for _ in range(SFT_STEPS):
        seqs, n_prompt = [], []
        for _ in range(SFT_BATCH):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            p = [BOS_ID] + char_ids(f"{a}+{b}=")
            seqs.append(p + char_ids(answer(a, b)) + [EOS_ID])
            n_prompt.append(len(p))
        L = max(map(len, seqs))
        ids = torch.full((SFT_BATCH, L), PAD_ID)
        attn = torch.zeros(SFT_BATCH, L, dtype=torch.long)
        labels = torch.full((SFT_BATCH, L), -100)
        for i, (s, npr) in enumerate(zip(seqs, n_prompt)):
            ids[i, :len(s)] = torch.tensor(s)
            attn[i, :len(s)] = 1
            labels[i, npr:len(s)] = torch.tensor(s[npr:])
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@lru_cache(maxsize=2)
def warm_state() -> dict:
    """State dict of the warm-started model (computed once per process)."""
    model = build_model()
    warm_start(model)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def warm_model(attn_implementation: str = "sdpa"):
    model = build_model(attn_implementation)
    model.load_state_dict(warm_state())
    return model


def reward_ids(a: int, b: int, completion_ids: list[int]) -> float:
    """1.0 iff the completion ids are exactly the reversed digits of a+b followed by <eos>."""
    return 1.0 if list(completion_ids) == char_ids(answer(a, b)) + [EOS_ID] else 0.0


class UniformAddition(Task):
    """The workload as an objbench task: problem i of the stream is pair i of random.Random(1234)."""

    name = "uniform_addition"
    difficulties = (1, 2)  # digits of the larger operand; only used to bucket metrics

    def __init__(self, seed: int = 1234, n: int = 64 * PROMPTS_PER_STEP):
        self.config = {"seed": seed, "n": n}
        self._pairs = pairs(seed, n)

    def problem_at(self, seed: int, index: int) -> Problem:
        a, b = self._pairs[index]
        return NumericProblem(uid=f"{self.name}:{index}", prompt=f"{a}+{b}=", answer=answer(a, b),
                       difficulty=1 if max(a, b) < 10 else 2, op="+", operands=(a, b), target=a + b)

    def eval_set(self) -> list[Problem]:
        return []

    def is_held_out(self, problem: Problem) -> bool:
        return False  # the workload has no held-out split (the benchmark never evaluates)

    def reward(self, problem: Problem, completion: str, truncated: bool = False) -> RewardResult:
        ok = (not truncated) and completion == problem.answer
        return RewardResult(float(ok), ok, not truncated, False)

    def sft_target(self, problem: Problem, rng) -> str:
        return problem.answer

    def max_response_len(self) -> int:
        return 4

    def max_prompt_len(self) -> int:
        return 6
