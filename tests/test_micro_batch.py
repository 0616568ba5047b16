"""Micro-batches with gradient accumulation (train.micro_batch_size): the loss, its metrics and the gradient equal
the unsplit minibatch's for every aggregation mode, because each micro-batch's loss is weighted by its share of the
minibatch's normaliser (algos.micro_batch_weights). Checked on a real Hugging Face model (a small Qwen2 built in
memory, rollout/toy_hf.py), with the lean forward and the transformers forward, and on the PPO critic."""

from __future__ import annotations

import copy
import operator
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from objbench import algos
from objbench.algos import presets as PRESETS
from objbench.algos.aggregate import AGGREGATION_MODES
from objbench.algos.presets import with_overrides
from objbench.experiments.run.update import Minibatch, critic_step, policy_backward
from objbench.rollout.models import ValueModel
from objbench.rollout.scoring import Scored, row_blocks, score, score_blocks
from objbench.rollout.toy_hf import build_model

AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


# ---------------------------------------------------------------------------------------------------------
# the weights, by hand


def test_row_blocks():
    assert row_blocks(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert row_blocks(10, 0) == [slice(0, 10)]
    assert row_blocks(3, 4) == [slice(0, 3)]


def test_micro_batch_weights_by_hand():
    # valid tokens per row: 2, 1, 0, 3 -> 6 tokens, 3 non-empty rows
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    blocks = [slice(0, 2), slice(2, 4)]
    assert algos.micro_batch_weights(mask, "token_mean", blocks) == [3 / 6, 3 / 6]
    for mode in AGGS[1:]:
        assert algos.micro_batch_weights(mask, mode, blocks) == [2 / 3, 1 / 3]
    # a block with nothing valid weighs 0; an all-masked batch gives 0 everywhere (never a division by zero)
    assert algos.micro_batch_weights(mask, "token_mean", [slice(2, 3), slice(0, 2), slice(3, 4)]) == [0, 0.5, 0.5]
    assert algos.micro_batch_weights(torch.zeros(2, 3, dtype=torch.bool), "token_mean", [slice(0, 1),
                                                                                        slice(1, 2)]) == [0.0, 0.0]


def test_weighted_block_aggregates_equal_the_whole_by_hand():
    # losses 1, 3 | 5 | - | 2, 4, 6 (masked entries are garbage and must not matter)
    loss = torch.tensor([[1.0, 3.0, 99.0], [5.0, -7.0, 0.0], [8.0, 8.0, 8.0], [2.0, 4.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    blocks = [slice(0, 2), slice(2, 4)]
    expected = {"token_mean": (1 + 3 + 5 + 2 + 4 + 6) / 6,              # 21 / 6 = 3.5
                "seq_mean_token_mean": (2.0 + 5.0 + 4.0) / 3,             # row means 2, 5, 4
                "seq_mean_token_sum": (4.0 + 5.0 + 12.0) / 3,             # row sums 4, 5, 12 -> 7
                "seq_mean_token_sum_norm": (4.0 + 5.0 + 12.0) / (3 * 3)}  # L = 3
    for mode, value in expected.items():
        whole = algos.aggregate(loss, mask, mode, max_len=3)
        parts = sum(w * algos.aggregate(loss[b], mask[b], mode, max_len=3)
                    for b, w in zip(blocks, algos.micro_batch_weights(mask, mode, blocks)))
        assert float(whole) == pytest.approx(value, abs=1e-6)
        assert float(parts) == pytest.approx(value, abs=1e-6)


def test_a_mode_without_divisor_count_cannot_be_split(monkeypatch):
    monkeypatch.delattr(AGGREGATION_MODES.get("token_mean"), "divisor_count")
    with pytest.raises(ValueError, match="micro_batch_size=0"):
        algos.micro_batch_weights(torch.ones(2, 2, dtype=torch.bool), "token_mean", [slice(0, 1), slice(1, 2)])


# ---------------------------------------------------------------------------------------------------------
# the training loop's update: accumulated == whole


VOCAB, B, P, T = 300, 10, 5, 7


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return build_model(VOCAB, seed=0, hidden=32, layers=2, heads=2).float()


def make_batch(policy, seed=1):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, VOCAB, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[::3, :2] = False  # left padding
    response_ids = torch.randint(3, VOCAB, (B, T), generator=g)
    lengths = torch.tensor([7, 1, 3, 7, 5, 2, 7, 4, 6, 3])
    response_mask = torch.arange(T)[None, :] < lengths[:, None]
    with torch.no_grad():
        sc = score(policy, prompt_ids, prompt_mask, response_ids, response_mask)
    old_logp = sc.logp + 0.05 * torch.randn(B, T, generator=g)  # an off-policy ratio, so clipping is active
    mask = response_mask.clone()
    mask[2] = False  # a row taken out of the loss (overlong filter): empty in every mode
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                           response_mask=response_mask, old_logp=old_logp * response_mask), mask


def setup_for(objective, policy, micro: int, forward: str, critic=None):
    cfg = SimpleNamespace(objective=objective, rollout=SimpleNamespace(temperature=1.0),
                          train=SimpleNamespace(micro_batch_size=micro))
    return SimpleNamespace(cfg=cfg, policy=policy, forward=forward, timers=defaultdict(float), critic=critic,
                           codec=SimpleNamespace(vocab_size=VOCAB))


def minibatch(b, mask, ref=None, values=None, returns=None, seed=2):
    adv = torch.randn(B, generator=torch.Generator().manual_seed(seed))[:, None].expand(B, T) * mask
    pick = operator.itemgetter(torch.arange(B))
    return Minibatch(b, pick, mask, mask, ref, values, adv, returns, max_len=T, first_pass=True)


def grads_of(run, model):
    model.zero_grad(set_to_none=True)
    lm, vals = run()
    return lm, vals, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(lm_a, lm_b, g_a, g_b):
    assert lm_a.keys() == lm_b.keys()
    for k in lm_a:
        assert float(lm_a[k]) == pytest.approx(float(lm_b[k]), rel=1e-6, abs=1e-6), k
    assert g_a.keys() == g_b.keys() and g_a
    scale = max(float(g.abs().max()) for g in g_a.values())
    assert scale > 1e-4  # a gradient that is all but zero would prove nothing
    for n in g_a:
        assert float((g_a[n] - g_b[n]).abs().max()) <= 1e-6 * max(1.0, scale), n


OBJECTIVES = [(name, {"loss.agg": agg}) for name, agg in (("grpo", a) for a in AGGS)] + [
    ("dapo", {}), ("dr_grpo", {}), ("gspo", {}), ("grpo", {"loss.entropy_coef": 0.01})]


@pytest.mark.parametrize("forward", ["auto", "hf"])
@pytest.mark.parametrize("preset,overrides", OBJECTIVES)
def test_accumulated_equals_whole_minibatch(policy, preset, overrides, forward):
    objective = with_overrides(PRESETS[preset], overrides) if overrides else PRESETS[preset]
    b, mask = make_batch(policy)
    ref = None
    if objective.kl.placement == "loss":  # GRPO: the k3 term in the loss, against a perturbed reference
        with torch.no_grad():
            ref = score(policy, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask, with_entropy=False)
        ref.logp = ref.logp - 0.1
    mb = minibatch(b, mask, ref=ref)
    opt = SimpleNamespace(zero_grad=policy.zero_grad)
    lm_w, vals_w, g_w = grads_of(lambda: policy_backward(setup_for(objective, policy, 0, forward), mb, opt, False),
                                 policy)
    lm_a, vals_a, g_a = grads_of(lambda: policy_backward(setup_for(objective, policy, 3, forward), mb, opt,
                                                              False), policy)
    assert_same(lm_w, lm_a, g_w, g_a)
    assert torch.allclose(vals_w.logp, vals_a.logp, atol=1e-6)


def test_exact_kl_log_probs_are_kept_per_micro_batch(policy):
    b, mask = make_batch(policy)
    mb = minibatch(b, mask)
    opt = SimpleNamespace(zero_grad=policy.zero_grad)
    _, whole = policy_backward(setup_for(PRESETS["dapo"], policy, 0, "auto"), mb, opt, True)
    _, parts = policy_backward(setup_for(PRESETS["dapo"], policy, 4, "auto"), mb, opt, True)
    assert parts.log_probs.shape == (B, T, VOCAB)
    assert torch.allclose(whole.log_probs, parts.log_probs, atol=1e-5)


def test_reference_scores_in_blocks_equal_one_pass(policy):
    b, _ = make_batch(policy)
    args = (policy, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    with torch.no_grad():
        one = score(*args, with_logits=True)
        blocks = score_blocks(*args, block_rows=4, with_logits=True)
    for k in ("logp", "entropy", "log_probs"):
        assert torch.allclose(getattr(one, k), getattr(blocks, k), atol=1e-5), k
    assert isinstance(blocks, Scored)


@pytest.mark.parametrize("agg", AGGS)
def test_critic_accumulated_equals_whole(policy, agg):
    objective = with_overrides(PRESETS["ppo"], {"loss.agg": agg})
    torch.manual_seed(3)
    critic = ValueModel(copy.deepcopy(policy))
    torch.nn.init.normal_(critic.head.weight, std=0.5)
    b, mask = make_batch(policy)
    g = torch.Generator().manual_seed(4)
    values, returns = torch.randn(B, T, generator=g) * mask, torch.randn(B, T, generator=g) * mask
    mb = minibatch(b, mask, values=values, returns=returns)
    opt = SimpleNamespace(zero_grad=critic.zero_grad, step=lambda: None)
    clip = SimpleNamespace(grad_clip=0.0)

    def run(micro):
        s = setup_for(objective, policy, micro, "auto", critic=critic)
        s.cfg.optim = clip
        return critic_step(s, mb, opt), None

    lm_w, _, g_w = grads_of(lambda: run(0), critic)
    lm_a, _, g_a = grads_of(lambda: run(4), critic)
    assert_same(lm_w, lm_a, g_w, g_a)


# ---------------------------------------------------------------------------------------------------------
# a run on a model folder: micro-batches change the memory, not the numbers


def test_a_run_with_micro_batches_logs_the_same_step(tmp_path, monkeypatch):
    import json

    from objbench.experiments.cli.main import main
    from objbench.rollout.toy_hf import write_toy_model

    folder = write_toy_model(tmp_path / "toy", vocab_size=300, hidden=32, layers=2, heads=2)
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    rows = {}
    for micro in (0, 3):
        out = tmp_path / f"runs{micro}"
        rc = main(["train", "--quiet", f"model.path={folder}", "task.name=arithmetic", "sft.steps=0",
                   "train.steps=1", "train.eval_every=1", "train.eval_samples=2", "task.eval_per_difficulty=2",
                   "rollout.completions_per_step=8", "objective=grpo", f"train.micro_batch_size={micro}",
                   f"out_dir={out}", "name=r"])
        assert rc == 0
        rows[micro] = json.loads((out / "r" / "metrics.jsonl").read_text().splitlines()[0])
    whole, parts = rows[0], rows[3]
    assert whole["reward/mean"] == parts["reward/mean"]  # the same samples
    for key in ("loss/total", "loss/policy", "optim/grad_norm", "kl/k3", "kl/exact"):
        key = next((k for k in whole if k == key or k.startswith(key)), key)
        assert key in whole and key in parts, key
        assert parts[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key
