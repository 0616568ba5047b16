"""One run split over data-parallel ranks optimises the single-process objective (issue 45 item 3).

The acceptance test starts ONE group of 2 CPU processes (gloo; this file run as a script, once per rank, joining a
TCPStore that the test process hosts on a port the OS picks, so no port can be taken in between) and loops over
every preset x every aggregation mode x with and without micro-batches (plus GRPO with adv.scale=batch and DAPO with
an entropy bonus), in float64 and float32. Each rank computes advantages and the loss of its half of a fixed batch
through the training loop's own code (algos.compute_advantages, experiments/run/update.py policy_backward and, for
PPO, value_backward), the ranks' gradients are then averaged as DDP averages them; the test process computes the
whole batch in one process (the single-process path) and compares. The batch gives the ranks unequal token counts
(rank 0 long responses, rank 1 short ones) and rank 1 a zero-variance group, so a per-rank normaliser moves the
gradient: the same group run with per-rank weights (count(block) / count(rank), what a naive framework does) must
differ by more than 1e-3 relative, which shows the comparison can fail.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from objbench import algos
from objbench.algos import global_stats
from objbench.algos import presets as PRESETS
from objbench.algos.advantages import whiten
from objbench.algos.presets import with_overrides
from objbench.algos.entropy import entropy_from_log_probs
from objbench.experiments.run import update as update_module
from objbench.experiments.run.update import Minibatch, policy_backward, value_backward
from objbench.rollout.scoring import Scored, full_inputs, score

AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
OBJECTIVES = (("ppo", ()), ("grpo", ()), ("dr_grpo", ()), ("dapo", ()), ("gspo", ()),
              ("grpo", (("adv.scale", "batch"),)), ("dapo", (("loss.entropy_coef", 0.01),)))
DTYPES = (torch.float64, torch.float32)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
VOCAB, P, T, G, B, WORLD = 40, 3, 6, 4, 16, 2
LENGTHS = (6, 5, 6, 4, 6, 6, 3, 5, 2, 1, 3, 1, 2, 1, 1, 2)  # rank 0 (rows 0-7) long, rank 1 (rows 8-15) short
REWARDS = (1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1)  # rows 8-11: rank 1's zero-variance group


# ---------------------------------------------------------------------------------------------------------
# the global weights and moments, by hand (no process group: the formulas on plain numbers)


def test_split_weights_by_hand():
    # token_mean over 2 ranks: rank 0 holds 3 valid tokens with losses 1, 2, 3 (its token mean 2), rank 1 one token
    # with loss 6. The whole batch: (1 + 2 + 3 + 6) / 4 = 3. Global weights 3/4 * 2 = 1.5 and 1/4 * 2 = 0.5: the ranks
    # contribute 1.5 * 2 = 3 and 0.5 * 6 = 3, averaged (DDP) (3 + 3) / 2 = 3, the whole batch's loss. Per-rank weights
    # (1 each) would give (2 + 6) / 2 = 4: rank 1's single token would weigh as much as rank 0's three.
    w0, w1 = global_stats.split_weights([3.0], 4.0, 2)[0], global_stats.split_weights([1.0], 4.0, 2)[0]
    assert (w0, w1) == (1.5, 0.5)
    assert (w0 * 2.0 + w1 * 6.0) / 2 == 3.0 == (1 + 2 + 3 + 6) / 4
    # micro-blocks on a rank: rank 0's tokens in blocks of 2 and 1 -> 2/4 * 2 = 1 and 1/4 * 2 = 0.5
    assert global_stats.split_weights([2.0, 1.0], 4.0, 2) == [1.0, 0.5]
    assert global_stats.split_weights([0.0, 0.0], 0.0, 2) == [0.0, 0.0]  # nothing valid anywhere: weight 0


def test_single_process_weights_are_micro_batch_weights():
    # no process group: global_block_weights is micro_batch_weights itself (the same floats, no "x 1")
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    blocks = [slice(0, 1), slice(1, 4)]
    assert not global_stats.data_parallel() and global_stats.world_size() == 1
    for mode in AGGS:
        assert algos.global_block_weights(mask, mode, blocks) == algos.micro_batch_weights(mask, mode, blocks)
    assert global_stats.global_divisor_count(mask, "token_mean") == 6.0
    assert global_stats.global_divisor_count(mask, "seq_mean_token_sum_norm") == 3.0


def test_global_mean_var_single_process_by_hand():
    # x = 1, 2, 3 | 6 over valid tokens (a 9 under the mask is ignored): mean 3, unbiased var (4 + 1 + 0 + 9) / 3
    x = torch.tensor([[1.0, 2.0, 3.0], [6.0, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    mean, var = global_stats.global_mean_var(x, mask)
    assert float(mean) == 3.0 and float(var) == pytest.approx(14 / 3, rel=1e-15)
    # the single-process whiten is unchanged: its own formula
    assert torch.equal(whiten(x, mask)[mask], ((x - 3.0) / torch.sqrt(var + 1e-8))[mask])


# ---------------------------------------------------------------------------------------------------------
# the cases: the same code computes one rank's half (rows) or the whole batch (all rows)


def cases():
    return [(name, dict(over), agg, micro, dtype) for dtype in DTYPES for name, over in OBJECTIVES for agg in AGGS
            for micro in (0, 3)]


def key(case) -> str:
    name, over, agg, micro, dtype = case
    extra = ",".join(f"{k}={v}" for k, v in over.items())
    return f"{name}[{extra}] {agg} micro={micro} {str(dtype)[6:]}"


def objective(name: str, over: dict, agg: str):
    fields = {**over, "loss.agg": agg}
    if PRESETS[name].group_size > 1:
        fields["group_size"] = G
    return with_overrides(PRESETS[name], fields)


def models(dtype):
    """A tiny Llama policy (hidden 16, one layer: a small gradient to ship between processes) and its critic."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from objbench.rollout.models import ValueModel

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = LlamaForCausalLM(config).to(dtype)
        critic = ValueModel(copy.deepcopy(policy))
        torch.nn.init.normal_(critic.head.weight, std=0.5)
    return policy, critic.to(dtype)


def score_in_model_dtype(model, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature=1.0,
                         with_logits=False, entropy_grad=True, forward="auto", **_):
    """The teacher-forced scores in the model's own dtype (rollout.scoring.score computes them in float32, which
    would make a float64 comparison one of float32 roundings): used for the float64 cases."""
    ids, attn, pos = full_inputs(prompt_ids, prompt_mask, response_ids, response_mask)
    T = response_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits[:, -T - 1:-1]
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    ent = entropy_from_log_probs(logp_all)
    return Scored(logp_all.gather(-1, response_ids[..., None]).squeeze(-1), ent if entropy_grad else ent.detach(),
                  logits if with_logits else None, logp_all if with_logits else None)


def scorer(dtype):
    """The training loop's scorer for float32, the model-dtype one for float64 (patched into update.py)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return mock.patch.object(update_module, "score", score_in_model_dtype)


def batch(policy, dtype):
    """The fixed batch (identical in every process): ids, masks, rewards, behaviour/reference log-probs, values."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(3, VOCAB, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.bool)
    prompt_mask[::5, 0] = False  # left padding
    response_ids = torch.randint(3, VOCAB, (B, T), generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    with torch.no_grad():
        logp = (score if dtype == torch.float32 else score_in_model_dtype)(policy, prompt_ids, prompt_mask,
                                                                          response_ids, mask).logp
    noise = torch.randn(3, B, T, generator=g, dtype=torch.float64).to(dtype)
    old_logp = (logp + 0.05 * noise[0]) * mask  # off-policy: some ratios clip
    return SimpleNamespace(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                           response_mask=mask, old_logp=old_logp, ref_logp=(logp - 0.1 + 0.05 * noise[1]) * mask,
                           values=noise[2] * mask, rewards=torch.tensor(REWARDS, dtype=dtype))


def rows_of(b, rows: slice):
    return SimpleNamespace(**{k: v[rows] for k, v in vars(b).items()})


def run_case(case, policy, critic, b) -> dict:
    """Advantages, policy loss and backward (and the critic's) of batch ``b`` through the training loop's code.
    Returns this process's loss, value loss (their whole-rows aggregates) and gradients."""
    name, over, agg, micro, dtype = case
    obj = objective(name, over, agg)
    mask = b.response_mask
    adv, returns, am = algos.compute_advantages(
        obj, rewards=b.rewards, mask=mask, values=b.values, old_logp=b.old_logp,
        ref_logp=b.ref_logp if obj.kl.placement == "reward" else None, max_len=T)
    ref = Scored(b.ref_logp, None, None) if obj.kl.placement == "loss" else None
    mb = Minibatch(b, lambda x: x, mask, mask, ref, b.values, adv, returns, max_len=T, first_pass=True)
    cfg = SimpleNamespace(objective=obj, rollout=SimpleNamespace(temperature=1.0),
                          train=SimpleNamespace(micro_batch_size=micro))
    s = SimpleNamespace(cfg=cfg, policy=policy, critic=critic, forward="auto", timers=defaultdict(float))
    with scorer(dtype):
        lm, _ = policy_backward(s, mb, SimpleNamespace(zero_grad=policy.zero_grad), False)
    out = {"loss": float(lm["loss"]), "loss_scale": float(am["adv_abs_mean"]), "grads": {n: p.grad.clone() for n, p in policy.named_parameters()}}
    if obj.adv.estimator == "gae":
        vm = value_backward(s, mb, SimpleNamespace(zero_grad=critic.zero_grad))
        out["value_loss"] = float(vm["value_loss"])
        out["value_grads"] = {n: p.grad.clone() for n, p in critic.named_parameters()}
    return out


def max_rel(a: dict, b: dict) -> float:
    """Largest relative difference: |loss_a - loss_b| / max(|loss_b|, its terms' size), and for every parameter's
    gradient ||g_a - g_b|| / ||g_b|| (a parameter whose reference gradient is 0 is measured against the whole
    gradient's norm). The policy loss is a mean of terms of size |A| (``loss_scale``: b's mean |advantage|); PPO's
    whitened advantages have mean 0, so its loss is a cancellation near 0 and is measured against that size."""
    rel = 0.0
    for k in ("loss", "value_loss"):
        if k in a and k in b:
            size = b.get("loss_scale", 0.0) if k == "loss" else 0.0
            rel = max(rel, abs(a[k] - b[k]) / max(abs(b[k]), size, 1e-30))
    for k in ("grads", "value_grads"):
        if k in a and k in b:
            whole = float(torch.cat([g.flatten() for g in b[k].values()]).norm())
            for n, g in b[k].items():
                rel = max(rel, float((a[k][n] - g).norm()) / (float(g.norm()) or whole))
    return rel


# ---------------------------------------------------------------------------------------------------------
# one rank (this file run as a script)


def averaged(out: dict, rows_mask, agg: str) -> dict:
    """What DDP makes of this rank's result: gradients averaged over the ranks; the loss likewise, each rank's
    whole-rows aggregate weighted by its global block weight (the weighted sum the gradients are of)."""
    w = algos.global_block_weights(rows_mask, agg, [slice(0, rows_mask.shape[0])])[0]
    res = {}
    for k in ("loss", "value_loss"):
        if k in out:
            res[k] = float(global_stats.all_sum(torch.tensor([out[k] * w], dtype=torch.float64))[0]) / WORLD
    for k in ("grads", "value_grads"):
        if k in out:
            res[k] = {n: global_stats.all_sum(g) / WORLD for n, g in out[k].items()}
    return res


def naive(out: dict) -> dict:
    """A naive framework: each rank's own (per-rank normalised) loss and gradients, averaged over the ranks."""
    dist = torch.distributed
    res = {"loss": out["loss"]}
    t = torch.tensor([out["loss"]], dtype=torch.float64)
    dist.all_reduce(t)
    res["loss"] = float(t[0]) / WORLD
    res["grads"] = {}
    for n, g in out["grads"].items():
        g = g.clone()
        dist.all_reduce(g)
        res["grads"][n] = g / WORLD
    return res


def rank_main(rank: int, port: int, out_path: str) -> None:
    torch.set_num_threads(1)
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    rows = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
    results, per_rank = {}, {}
    hand = torch.tensor([[1.0, 2.0, 3.0]]) if rank == 0 else torch.tensor([[6.0, 0.0, 0.0]])
    hand_mask = torch.tensor([[1, 1, 1]] if rank == 0 else [[1, 0, 0]], dtype=torch.bool)
    hand_out = {"count": global_stats.global_divisor_count(hand_mask, "token_mean"),
                "weights": algos.global_block_weights(hand_mask, "token_mean", [slice(0, 1)]),
                "mean_var": [float(v) for v in global_stats.global_mean_var(hand.double(), hand_mask)]}
    for dtype in DTYPES:
        policy, critic = models(dtype)
        b = rows_of(batch(policy, dtype), rows)
        for case in (c for c in cases() if c[4] == dtype):
            results[key(case)] = averaged(run_case(case, policy, critic, b), b.response_mask, case[2])
            if case[2] == "token_mean":  # the same case with every normaliser per rank
                with mock.patch.object(global_stats, "data_parallel", lambda group=None: False):
                    per_rank[key(case)] = naive(run_case(case, policy, critic, b))
    torch.distributed.destroy_process_group()
    torch.save({"hand": hand_out, "results": results if rank == 0 else None,
                "per_rank": per_rank if rank == 0 else None}, out_path)


# ---------------------------------------------------------------------------------------------------------
# the test process: one group of 2 ranks for every case, the single-process reference here


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=60))
    outs = [tmp / f"rank{r}.pt" for r in range(WORLD)]
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(r), str(store.port), str(outs[r])],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the 2-rank group did not finish in 240 s")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    del store
    return [torch.load(o, weights_only=False) for o in outs]


@pytest.fixture(scope="module")
def single_process():
    """Every case on the whole batch in this process (torch.distributed not initialised: the single-process path)."""
    assert not global_stats.data_parallel()
    out = {}
    for dtype in DTYPES:
        policy, critic = models(dtype)
        b = batch(policy, dtype)
        for case in (c for c in cases() if c[4] == dtype):
            out[key(case)] = run_case(case, policy, critic, b)
    return out


def test_the_two_ranks_see_the_global_counts(two_ranks):
    # the hand-worked example above, on the real group: 3 + 1 tokens -> count 4 on both ranks, weights 1.5 and 0.5,
    # and the moments of 1, 2, 3 | 6: mean 3, unbiased var 14 / 3
    (r0, r1) = (o["hand"] for o in two_ranks)
    assert r0["count"] == r1["count"] == 4.0
    assert (r0["weights"], r1["weights"]) == ([1.5], [0.5])
    for r in (r0, r1):
        assert r["mean_var"][0] == 3.0 and r["mean_var"][1] == pytest.approx(14 / 3, rel=1e-15)


def test_data_parallel_objective_is_the_single_process_objective(two_ranks, single_process):
    results = two_ranks[0]["results"]
    worst = {dtype: 0.0 for dtype in DTYPES}
    for case in cases():
        k = key(case)
        ref = single_process[k]
        assert max(float(g.abs().max()) for g in ref["grads"].values()) > 1e-4, k  # a gradient that proves something
        rel = max_rel(results[k], ref)
        worst[case[4]] = max(worst[case[4]], rel)
    fails = {k: v for k, v in ((key(c), max_rel(results[key(c)], single_process[key(c)])) for c in cases())
             if v > TOLERANCE[[c for c in cases() if key(c) == k][0][4]]}
    assert not fails, fails
    print("max relative difference N=2 vs N=1:", {str(d): f"{v:.2e}" for d, v in worst.items()})


def test_a_per_rank_normaliser_is_caught(two_ranks, single_process):
    per_rank = two_ranks[0]["per_rank"]
    sizes = {k: max_rel(v, single_process[k]) for k, v in per_rank.items()}
    print("per-rank normaliser, relative difference from N=1:", {k: f"{v:.2e}" for k, v in sizes.items()})
    for k, rel in sizes.items():
        assert rel > 1e-3, (k, rel)


if __name__ == "__main__":
    rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
