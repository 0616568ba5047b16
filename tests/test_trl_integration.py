"""objbench.integrations.trl: TRL's GRPOTrainer with an objbench objective's loss gives the same loss and gradient
as objbench's own compute_loss on the same batch, for GRPO, Dr. GRPO, GSPO-token and CISPO (and a plug-in).

Marked `trl` and skipped when TRL is missing: pip install -e ".[trl]", then python -m pytest -m trl
tests/test_trl_integration.py
"""

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.trl

OBJECTIVES = {
    "grpo": "grpo",
    "dr_grpo": "dr_grpo",
    "gspo_token": {"preset": "gspo", "ratio.level": "sequence_token"},
    "cispo": {"preset": "grpo", "ratio.surrogate": "cispo", "ratio.eps_high_is": 0.28},
}


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    from benchmarks.trl_parity import save_warm_model

    path = tmp_path_factory.mktemp("warm") / "model"
    save_warm_model(path)
    return str(path)


def _both(warm_dir: str, objective) -> dict:
    """TRL's loss and gradient through ObjbenchGRPOTrainer, and objbench's on the same batch and weights."""
    import torch

    from benchmarks import workload as W
    from benchmarks.trl_parity import make_trl_trainer, trl_step
    from objbench import algos
    from objbench.integrations.trl import ObjbenchGRPOTrainer, resolve_objective
    from objbench.rollout.scoring import score

    obj = resolve_objective(objective)
    beta = obj.kl.beta if obj.kl.placement == "loss" else 0.0
    with tempfile.TemporaryDirectory() as tmp:
        tr = make_trl_trainer(warm_dir, beta, 1, tmp, bias_correction=False, scale_rewards=obj.adv.scale,
                              trainer_cls=ObjbenchGRPOTrainer, objective=obj)
    model, _, batch, loss_trl, g_trl = trl_step(tr)
    model.zero_grad(set_to_none=True)
    c_mask = batch["completion_mask"].bool()
    sc = score(model, batch["prompt_ids"], batch["prompt_mask"].bool(), batch["completion_ids"], c_mask)
    loss_ob, _ = algos.compute_loss(obj, logp=sc.logp, old_logp=sc.logp.detach(), advantages=batch["advantages"],
                                    mask=c_mask, ref_logp=batch.get("ref_per_token_logps"), entropy=sc.entropy,
                                    max_len=W.MAX_NEW_TOKENS)
    loss_ob.backward()
    g_ob = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss_trl": float(loss_trl), "loss_ob": float(loss_ob),
            "grad_diff": max(float((g_ob[n] - g_trl[n]).abs().max()) for n in g_ob),
            "grad_norm": float(torch.sqrt(sum((g ** 2).sum() for g in g_trl.values()))),
            "logged": sorted(k for k in tr._metrics["train"] if k.startswith("objbench/"))}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_the_trl_loss_is_the_objective_s_loss(warm_dir, name):
    c = _both(warm_dir, OBJECTIVES[name])
    assert abs(c["loss_trl"] - c["loss_ob"]) <= 1e-6
    assert c["grad_diff"] <= 1e-6 and c["grad_norm"] > 1e-3
    assert "objbench/clipfrac_high" in c["logged"]


def test_the_objectives_differ_so_the_check_can_fail(warm_dir):
    a, b = _both(warm_dir, "grpo"), _both(warm_dir, "dr_grpo")
    assert abs(a["grad_norm"] - b["grad_norm"]) > 1e-3


def test_mismatched_trl_settings_are_refused_with_both_names():
    from types import SimpleNamespace

    from objbench.algos import get_preset
    from objbench.integrations.trl import check_trl_settings

    ok = dict(num_generations=8, scale_rewards="group", beta=0.04, top_entropy_quantile=1.0,
              off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=True)
    assert check_trl_settings(get_preset("grpo"), SimpleNamespace(**ok)) == []
    for change, says in [({"num_generations": 4}, "objective.group_size=8"), ({"beta": 0.0}, "beta=0.0"),
                         ({"scale_rewards": False}, "objective.adv.scale='group'"),
                         ({"top_entropy_quantile": 0.2}, "top_entropy_quantile")]:
        with pytest.raises(ValueError, match=says):
            check_trl_settings(get_preset("grpo"), SimpleNamespace(**{**ok, **change}))
    with pytest.raises(ValueError, match="filters"):
        check_trl_settings(get_preset("dapo"), SimpleNamespace(**{**ok, "beta": 0.0}))
    warned = check_trl_settings(get_preset("gspo"), SimpleNamespace(**{**ok, "beta": 0.0}))
    assert warned and "n_minibatches=4" in warned[0]


def test_a_plugin_surrogate_runs_inside_trl(warm_dir):
    from objbench.experiments.config.plugins import load_plugins

    root = Path(__file__).resolve().parent.parent
    load_plugins([str(root / "examples" / "gpg_plugin.py")])
    c = _both(warm_dir, {"preset": "dr_grpo", "ratio.surrogate": "gpg"})
    assert abs(c["loss_trl"] - c["loss_ob"]) <= 1e-6 and c["grad_diff"] <= 1e-6
