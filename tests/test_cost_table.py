"""benchmarks/cost_table.py's table from hand-made measurements: the ratios it prints are the ones worked out here."""

from __future__ import annotations

from benchmarks.cost_table import ARMS, _summary, write_table


def _row(arm, s, mem, state):
    return {"arm": arm, "model": "m", "repeats": 3, "s_per_step": {"median": s, "min": s * 0.9, "max": s * 1.1},
            "gen_tokens_per_step": 100.0, "model_state_mb": state, "peak_rss_mb": {"median": 1.0, "min": 1.0, "max": 1.0},
            "peak_gpu_mb": {"median": mem, "min": mem, "max": mem}, "phases": {}}


def test_summary_is_median_min_max():
    reps = [{"x": 3.0}, {"x": 1.0}, {"x": 2.0}, {"x": 10.0}]
    assert _summary(reps, "x") == {"median": 2.5, "min": 1.0, "max": 10.0}


def test_critic_alone_and_prompt_sharing_ratios(tmp_path):
    rows = [_row("ppo", 2.0, 1000.0, 9.0), _row("ppo_g8", 1.6, 990.0, 9.0), _row("ppo_minus_critic", 1.2, 792.0, 5.0),
            _row("grpo", 1.0, 800.0, 5.0)]
    meta = {"device": "cuda", "gpu": "X", "steps": 2, "repeats": 3, "commit": "c", "command": "cmd", "elapsed_s": 1.0,
            "versions": {"torch": "t", "transformers": "tf", "threads": 1}}
    write_table(rows, [], meta, tmp_path)
    md = (tmp_path / "cost.md").read_text()
    # ppo -> grpo: time 1.0 / 2.0 = 0.50, memory 800 / 1000 = 0.80, state 5 / 9 = 0.56
    assert "| m: ppo -> grpo (as the seed compares) | 0.50 | 0.80 | 0.56 |" in md
    # the critic alone: 1.2 / 1.6 = 0.75, 792 / 990 = 0.80, 5 / 9 = 0.56
    assert "| m: ppo_g8 -> ppo_minus_critic (the critic alone) | 0.75 | 0.80 | 0.56 |" in md
    # prompt sharing alone: 1.6 / 2.0 = 0.80, 990 / 1000 = 0.99, 9 / 9 = 1.00
    assert "| m: ppo -> ppo_g8 (prompt sharing alone) | 0.80 | 0.99 | 1.00 |" in md
    assert "| seed documents: PPO -> GRPO (64 -> 45 GB, 3.2 -> 2.1 s/step) | 0.66 | 0.70 | |" in md
    assert (tmp_path / "cost.csv").read_text().splitlines()[0].startswith("model,arm,repeats,s_per_step")


def test_ppo_minus_critic_differs_from_ppo_g8_only_in_the_critic():
    from objbench.experiments.config import load_config

    a = load_config(None, ARMS["ppo_g8"]).objective
    b = load_config(None, ARMS["ppo_minus_critic"]).objective
    assert a.adv.estimator == "gae" and b.adv.estimator == "group"
    assert a.group_size == b.group_size == 8
    assert (a.ratio, a.loss, a.kl, a.n_minibatches, a.n_epochs) == (b.ratio, b.loss, b.kl, b.n_minibatches, b.n_epochs)
