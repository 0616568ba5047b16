"""The training loop end to end, on a tiny budget: files, determinism, resume after a hard crash, budgets."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from objbench.experiments.config import ConfigError, load_config
from objbench.experiments.run.loop_state import LoopState
from objbench.experiments.run.train import NONDETERMINISTIC_KEYS, train

CRASH_RUN = str(Path(__file__).with_name("crash_run.py"))  # the CLI, crashing hard after a given step
FAST = ["sft.steps=30", "train.steps=4", "rollout.completions_per_step=16", "train.eval_size=6",
        "train.eval_samples=2", "train.eval_every=2", "train.checkpoint_every=2", "train.threads=1"]


def _args(*overrides):
    """key=value overrides where a later key replaces an earlier one (the command line refuses duplicates)."""
    merged = {}
    for o in overrides:
        merged[o.split("=", 1)[0]] = o
    return list(merged.values())


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # one warm-start cache for the whole module run: every test reuses the same SFT start
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _rows(path):
    return [json.loads(l) for l in open(path)]


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_KEYS)} for r in rows]


def _cfg(tmp_path, *extra):
    return load_config(None, _args(*FAST, f"out_dir={tmp_path}", *extra))


def test_run_writes_every_file_with_provenance(tmp_path):
    run = train(_cfg(tmp_path, "objective=grpo", "name=a"), progress=False)
    for f in ("config.yaml", "meta.json", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "done",
              "checkpoints/last/policy/model.safetensors", "checkpoints/last/optimizer.pt"):
        assert (run / f).exists(), f
    meta = json.loads((run / "meta.json").read_text())
    assert meta["seed"] == 0 and meta["commit"] and meta["versions"]["torch"] and meta["end"]
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward/acc", "length/mean", "policy/entropy", "kl/exact", "kl/k3", "policy/clipfrac_low",
                "adv/zero_var_frac", "optim/grad_norm", "time/sample", "mem/peak_rss_mb"):
        assert key in rows[0], key
    evals = _rows(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]
    assert all(0 <= e["eval/acc"] <= 1 and e["eval/pass@1"] <= e["eval/pass@2"] + 1e-9 for e in evals)
    # on-policy single minibatch: the importance ratio is 1 up to float error
    assert abs(rows[0]["policy/ratio_max"] - 1) < 1e-4
    # every logged key is documented in experiments/metrics.py
    from objbench.experiments.run.metrics import undocumented

    assert undocumented({k for r in rows + evals for k in r}) == []
    # difficulty-bias measurement: with binary rewards a group's total |A| has a closed form in its pass count
    from objbench.analysis.studies import closed_form_weight

    G, eps = 8, load_config(None, ["objective=grpo"]).objective.adv.eps
    seen = 0
    for r in rows:
        for key, v in r.items():
            if key.startswith("adv/group_weight_k"):
                k = int(key.rsplit("k", 1)[1])
                assert v == pytest.approx(closed_form_weight(k, G, "group", eps), rel=1e-4, abs=1e-6), key
                seen += 1
    assert seen > 0


def test_every_ppo_key_is_documented(tmp_path):
    from objbench.experiments.run.metrics import undocumented

    run = train(_cfg(tmp_path, "objective=ppo", "name=p", "train.steps=1", "train.eval_every=1"), progress=False)
    keys = {k for r in _rows(run / "metrics.jsonl") + _rows(run / "eval.jsonl") for k in r}
    assert undocumented(keys) == []


def _record_policy_grad_norm_after_clipping(monkeypatch):
    """Wraps torch.nn.utils.clip_grad_norm_ (the loop calls it once per optimizer step, right before opt.step()):
    each call appends (max_norm, the norm of the gradients as the optimizer then sees them)."""
    real = torch.nn.utils.clip_grad_norm_
    calls = []

    def recording(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        out = real(parameters, max_norm, *args, **kwargs)
        grads = [p.grad.detach().double().flatten() for p in parameters if p.grad is not None]
        calls.append((float(max_norm), float(torch.linalg.vector_norm(torch.cat(grads)))))
        return out

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return calls


def test_a_tiny_grad_clip_clips_every_step_and_zero_turns_clipping_off(tmp_path, monkeypatch):
    # optim.grad_clip = 1e-3, far below any gradient norm of this model: every step MUST be clipped, so the
    # gradient the optimizer applies has norm 1e-3 and the logged clipped norm is 1e-3 (clip_grad_norm_ scales by
    # clip / (norm + 1e-6): 1e-3 to a relative 1e-6 / norm), with clip_active 1. An entropy bonus gives every
    # step a gradient (the rewards of a step can all be equal this early: zero advantages, zero gradient)
    calls = _record_policy_grad_norm_after_clipping(monkeypatch)
    bonus = "objective.loss.entropy_coef=0.1"
    rows = _rows(train(_cfg(tmp_path, "name=g", "optim.grad_clip=1e-3", bonus), progress=False) / "metrics.jsonl")
    assert len(rows) == 4 and all(r["optim/steps"] == 1 for r in rows)  # one optimizer step per training step
    policy_calls = calls[-4:]  # the last 4 calls are the RL steps (a warm start, if it ran here, clips before)
    for r, (max_norm, applied) in zip(rows, policy_calls):
        assert r["optim/grad_norm"] > 0.01  # the premise: the norm before clipping is well above the clip
        assert r["optim/grad_norm_clipped"] == pytest.approx(1e-3, rel=1e-4)
        assert r["optim/clip_active"] == 1.0
        assert max_norm == 1e-3 and applied == pytest.approx(1e-3, rel=1e-4)  # the gradient really was scaled down
    # grad_clip = 0: no clipping. The optimizer sees the unclipped gradient (norm = the logged norm, far above 1e-3)
    # and no clipped-norm metrics are logged
    calls.clear()
    rows = _rows(train(_cfg(tmp_path, "name=n", "optim.grad_clip=0", bonus), progress=False) / "metrics.jsonl")
    assert all("optim/grad_norm_clipped" not in r and "optim/clip_active" not in r for r in rows)
    for r, (max_norm, applied) in zip(rows, calls[-4:]):
        assert max_norm == float("inf")
        assert r["optim/grad_norm"] > 0.01 and applied == pytest.approx(r["optim/grad_norm"], rel=1e-4)


def test_filler_lengths_are_logged_by_correctness(tmp_path):
    from objbench.experiments.run.metrics import undocumented

    run = train(_cfg(tmp_path, "name=f", "task.filler_max=6", "task.filler_position=after", "task.filler_demo_max=2",
                     "task.format_reward=0.5", "rollout.completions_per_step=32"), progress=False)  # some correct
    rows = _rows(run / "metrics.jsonl")
    assert undocumented({k for r in rows for k in r}) == []
    for r in rows:
        for k in ("length/filler_correct", "length/filler_incorrect"):
            assert r[k] != r[k] or 0.0 <= r[k] <= 6.0  # NaN when no response of that kind, else within 0..6
    assert any(r["length/filler_correct"] == r["length/filler_correct"] for r in rows)
    import re

    formed = [x["response"] for x in map(json.loads, open(run / "samples.jsonl")) if x["reward"] > 0]
    assert formed and all(re.fullmatch(r"-?[0-9]+\.{0,6}", t) for t in formed)  # well formed = filler after


def test_same_config_and_seed_give_the_same_metrics(tmp_path):
    a = train(_cfg(tmp_path, "name=a"), progress=False)
    b = train(_cfg(tmp_path, "name=b"), progress=False)
    assert _strip(_rows(a / "metrics.jsonl")) == _strip(_rows(b / "metrics.jsonl"))
    assert _rows(a / "eval.jsonl") == _rows(b / "eval.jsonl")
    c = train(_cfg(tmp_path, "name=c", "seed=1"), progress=False)
    assert _strip(_rows(a / "metrics.jsonl")) != _strip(_rows(c / "metrics.jsonl"))


def test_prompt_stream_is_identical_across_objectives(tmp_path):
    # The prompts of step k depend only on the data seed and the prompt index: same G, same prompts.
    prompts = {}
    for o in ("grpo", "dr_grpo", "gspo"):
        run = train(_cfg(tmp_path, f"objective={o}", f"name={o}", "train.log_samples=16"), progress=False)
        rows = _rows(run / "samples.jsonl")
        prompts[o] = [(r["step"], r["prompt"]) for r in rows]
    assert prompts["grpo"] == prompts["dr_grpo"] == prompts["gspo"]
    assert len(set(p for _, p in prompts["grpo"])) > 4


@pytest.mark.robustness
def test_resume_after_hard_crash_has_no_duplicate_or_missing_steps(tmp_path):
    cfg_args = _args(*FAST, f"out_dir={tmp_path}", "name=r", "train.steps=6")
    cmd = [sys.executable, "-m", "objbench.experiments.cli.main", "train", "--quiet", *cfg_args]
    env = {**os.environ, "OBJBENCH_TEST_CRASH_AT_STEP": "5"}  # dies after logging step 5; checkpoint is at 4
    p = subprocess.run([sys.executable, CRASH_RUN, *cmd[3:]], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr[-2000:]
    run = tmp_path / "r"
    assert not (run / "done").exists()
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (run / "done").exists()
    resumed = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in _rows(run / "eval.jsonl")] == [0, 2, 4, 6]
    # and the resumed run equals an uninterrupted one
    ref = train(load_config(None, _args(*cfg_args, "name=ref")), progress=False)
    assert _strip(resumed) == _strip(_rows(ref / "metrics.jsonl"))


def test_finished_run_is_skipped_and_a_different_config_is_refused(tmp_path):
    run = train(_cfg(tmp_path, "name=x"), progress=False)
    before = (run / "metrics.jsonl").read_text()
    train(_cfg(tmp_path, "name=x"), progress=False)  # already done: nothing rewritten
    assert (run / "metrics.jsonl").read_text() == before
    with pytest.raises(ConfigError, match="different config"):
        train(_cfg(tmp_path, "name=x", "optim.lr=0.5"), progress=False)
    assert (run / "metrics.jsonl").read_text() == before  # nothing already written is lost


def test_budget_parity_ppo_sees_more_prompts(tmp_path):
    ppo = _cfg(tmp_path, "objective=ppo")
    grpo = _cfg(tmp_path, "objective=grpo")
    assert ppo.rollout.completions_per_step == grpo.rollout.completions_per_step
    assert ppo.prompts_per_step == grpo.prompts_per_step * grpo.objective.group_size


@pytest.mark.parametrize("objective", ["ppo", "dapo", "gspo", "dr_grpo"])
def test_every_preset_runs_a_step(tmp_path, objective):
    run = train(_cfg(tmp_path, f"objective={objective}", "train.steps=2", f"name={objective}"), progress=False)
    rows = _rows(run / "metrics.jsonl")
    assert len(rows) == 2 and all(r["optim/grad_norm"] == r["optim/grad_norm"] for r in rows if "optim/grad_norm" in r)
    if objective == "ppo":
        assert "value/loss" in rows[0] and "value/explained_var" in rows[0]
    if objective == "gspo":
        assert rows[0]["optim/steps"] == 4  # four minibatches per rollout batch


def test_wandb_logging_runs_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = train(_cfg(tmp_path, "name=w", "train.steps=2", "log.wandb=true"), progress=False,
                meta_extra={"arm": "grpo", "sweep": "t"})
    offline = list((run / "wandb").glob("offline-run-*"))
    assert (run / "done").exists() and offline, "expected an offline wandb run folder"
    assert wandb.run is None  # finished


def test_bench_charges_a_slow_phase_to_its_own_key(monkeypatch):
    # every policy-loss computation is made 1 s slower (each phase takes ~1-50 ms here): bench must report that
    # time under "loss", in no other phase and not in "other" (time outside every timed phase)
    import time

    from objbench import algos
    from objbench.experiments.cli.bench import bench

    real, delay, calls = algos.compute_loss, 1.0, []

    def slow_loss(*args, **kwargs):
        calls.append(1)
        time.sleep(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(algos, "compute_loss", slow_loss)  # the loop calls it as algos.compute_loss
    res = bench(None, _args(*FAST, "objective=ppo"), steps=2, warmup=1, quiet=True)
    ph = res["phases"]
    for k in ("sample", "reward", "reference", "critic", "forward", "loss", "backward", "optimizer", "other"):
        assert k in ph and ph[k] >= 0, k  # other >= 0: no time counted in two phases
    slow_per_step = delay * len(calls) / 3  # 3 steps ran: 1 warmup + 2 timed
    assert len(calls) >= 3 and ph["loss"] >= slow_per_step
    assert all(v < delay for k, v in ph.items() if k != "loss"), ph
    assert res["s_per_step"] >= ph["loss"]
    assert res["rollout_tokens_per_s"] > 0 and res["update_tokens_per_s"] > 0
    assert 0 <= res["harness_overhead_frac"] < 1


def test_special_token_inside_a_response_makes_it_invalid():
    # "1<pad>2<eos>" decodes to "12" with special tokens skipped; the loop must not reward it as "12"
    import torch

    from objbench.envs.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, build_char_tokenizer
    from objbench.experiments.config import build_task
    from objbench.experiments.run.sample import INVALID_MARK, rollout
    from objbench.experiments.run.setup import make_setup
    from objbench.rollout.engine import Generation
    from objbench.rollout.models import build_policy

    cfg = load_config(None, ["objective=grpo"])
    task, tok = build_task(cfg), build_char_tokenizer()
    s = make_setup(cfg, task, tok, build_policy("tiny", VOCAB_SIZE, seed=0))
    prob = next(p for p in task.prompts(0, 0, 50) if len(p.answer) >= 2)
    a = tok.encode(prob.answer, add_special_tokens=False)
    rows = [a + [EOS_ID], a[:1] + [PAD_ID] + a[1:] + [EOS_ID], a[:1] + [1] + a[1:] + [EOS_ID]]  # 1 = <bos>
    T = max(map(len, rows))
    ids = torch.tensor([r + [PAD_ID] * (T - len(r)) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (T - len(r)) for r in rows])

    class FixedEngine:
        def generate(self, prompt_ids, prompt_mask, params, generator=None):
            return Generation(ids, mask, torch.zeros(ids.shape), torch.zeros(3, dtype=torch.bool))

    s.engine = FixedEngine()
    b = rollout(s, [prob], 3, s.sampling, None)
    assert b.correct.tolist() == [True, False, False]
    assert b.texts[0] == prob.answer and b.texts[1] == b.texts[2] == INVALID_MARK + prob.answer


def test_fast_response_decoding_equals_batch_decode():
    import torch

    from objbench.envs.tokenizer import build_char_tokenizer
    from objbench.rollout.decode import decode_responses

    tok = build_char_tokenizer()
    ids = torch.randint(0, len(tok), (200, 9), generator=torch.Generator().manual_seed(0))  # specials included
    assert decode_responses(tok, ids) == tok.batch_decode(ids, skip_special_tokens=True)


def test_countdown_trains_from_the_command_line(tmp_path):
    from objbench.experiments.cli.main import main

    assert main(["train", "--quiet", "task.name=countdown", *FAST, f"out_dir={tmp_path}", "name=cd"]) == 0
    cfg = (tmp_path / "cd" / "config.yaml").read_text()
    assert "name: countdown" in cfg and "max_numbers: 4" in cfg and "max_digits" not in cfg
    rows = _rows(tmp_path / "cd" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and all("reward/acc_d2" in r or "reward/acc_d3" in r
                                                            for r in rows)


def test_warm_start_does_not_depend_on_the_callers_thread_count(tmp_path):
    import torch

    from objbench.experiments.config import build_task
    from objbench.experiments.run.warmstart import warm_start

    before = torch.get_num_threads()
    cfg = load_config(None, ["sft.steps=12", "sft.batch_size=16", "train.threads=2"])
    torch.set_num_threads(2)
    a, _, info = warm_start(cfg, build_task(cfg), cache_dir=tmp_path / "a")
    torch.set_num_threads(1)
    b, _, _ = warm_start(cfg, build_task(cfg), cache_dir=tmp_path / "b")
    torch.set_num_threads(before)
    assert info["threads"] == 1 and len(info["weights_sha256"]) == 16
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k


def test_evaluation_uses_the_current_weights(tmp_path):
    """evaluate() after RL steps equals evaluate() of a freshly built model holding the same weights (no stale
    fused-weight cache, no engine holding the start weights)."""
    import torch

    from objbench.experiments.run.evaluate import evaluate
    from objbench.experiments.run.setup import build_setup, make_optimizers, make_setup
    from objbench.experiments.run.train import train_step

    cfg = _cfg(tmp_path, "objective=grpo", "name=e")
    s = build_setup(cfg)
    start = {k: v.clone() for k, v in s.policy.state_dict().items()}
    s.policy.train()
    opt, copt = make_optimizers(s)
    state = LoopState()
    for _ in range(3):
        train_step(s, state, opt, copt)
    assert any(not torch.equal(start[k], v) for k, v in s.policy.state_dict().items())
    fresh = type(s.policy)(s.policy.config)
    fresh.load_state_dict(s.policy.state_dict())
    s2 = make_setup(cfg, s.task, s.codec, fresh)
    assert evaluate(s, 3) == evaluate(s2, 3)


def test_f32_mean_of_ints_is_torch_mean_of_the_same_values():
    # rollout_metrics averages counts and lengths in Python; the logged numbers must stay torch's float32 means
    import torch

    from objbench.experiments.run.step_metrics import f32_mean_of_ints

    for n in [1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 255, 256, 257, 511, 1000, 1024, 4096]:
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            v = torch.zeros(n)
            v[:k] = 1.0
            assert f32_mean_of_ints(k, n) == float(v.mean()), (k, n)
            assert f32_mean_of_ints(7 * k, n) == float((7 * v).mean()), (7 * k, n)


def test_stale_rollouts_sample_with_the_weights_of_staleness_updates_ago(tmp_path):
    from objbench.experiments.run.setup import build_setup, make_optimizers
    from objbench.experiments.run.train import train_step
    from objbench.rollout.scoring import score

    cfg = load_config(None, _args(*FAST, f"out_dir={tmp_path}", "rollout.staleness=2", "objective=grpo"))
    s = build_setup(cfg)
    s.policy.train()
    opt, copt = make_optimizers(s)
    state = LoopState()
    snaps = [{k: v.clone() for k, v in s.policy.state_dict().items()}]  # snaps[k]: the weights after k updates
    rows, batches = [], []
    for _ in range(4):
        row, b = train_step(s, state, opt, copt)
        rows.append(row)
        batches.append(b)
        snaps.append({k: v.clone() for k, v in s.policy.state_dict().items()})
    # step t samples with the weights after max(0, t - 1 - 2) updates
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 2, 2]
    probe = type(s.policy)(s.policy.config)
    for t, b in enumerate(batches, start=1):
        probe.load_state_dict(snaps[max(0, t - 3)])
        with torch.no_grad():
            sc = score(probe, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
        d = (sc.logp - b.old_logp)[b.response_mask].abs().max().item()
        assert d < 1e-5, f"step {t}: old log-probs are not those of the weights after {max(0, t - 3)} updates ({d})"
    # one update per rollout, yet the ratio is not 1 once the sampler lags: the first minibatch is off-policy
    # (sampling and scoring agree to ~1e-7 on-policy)
    assert rows[0]["policy/log_ratio_std"] < 1e-6 and rows[3]["policy/log_ratio_std"] > 1e-3, \
        [r["policy/log_ratio_std"] for r in rows]
    # evaluation samples the current weights, not the sampler's
    assert all(torch.equal(p, q) for p, q in zip(s.engine.model.parameters(), s.policy.parameters()))


@pytest.mark.robustness
def test_stale_rollouts_resume_equal_to_an_uninterrupted_run(tmp_path):
    cfg_args = _args(*FAST, f"out_dir={tmp_path}", "name=r", "train.steps=6", "rollout.staleness=3",
                     "train.checkpoint_every=2")
    cmd = [sys.executable, "-m", "objbench.experiments.cli.main", "train", "--quiet", *cfg_args]
    p = subprocess.run([sys.executable, CRASH_RUN, *cmd[3:]], env={**os.environ, "OBJBENCH_TEST_CRASH_AT_STEP": "5"},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stderr[-2000:]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    ref = train(load_config(None, _args(*cfg_args, "name=ref")), progress=False)
    assert _strip(_rows(tmp_path / "r" / "metrics.jsonl")) == _strip(_rows(ref / "metrics.jsonl"))


@pytest.mark.parametrize("bad, msg", [("rollout.staleness=-1", "rollout.staleness must be an int in [0, 64]"),
                                      ("rollout.staleness=65", "rollout.staleness must be an int in [0, 64]")])
def test_bad_staleness_is_refused_at_load(bad, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, [bad])
