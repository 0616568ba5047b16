"""The KL-estimator study (experiments/studies/kl_estimators.py, the kl_*.py beside it, and analysis/studies/kl_*.py):
the study's own statistics reproduce Schulman's Gaussian table, the gradient identities hold exactly on enumerable
toys (one token and sequences), and a --quick run of the whole study writes consistent outputs. Every check runs
the study's functions, not a copy of them."""

import json
import math

import pandas as pd
import pytest
import torch

from objbench.analysis.studies.kl_config import ESTIMATORS, GRAD_RTOL, SCHULMAN_TABLE, ZERO_GRAD_TOL, Args
from objbench.experiments.studies import kl_estimators
from objbench.experiments.studies.kl_gradients import (_sequence_model, categorical_gradients, kl_grads, mc_gradients,
                                                       per_sample_grads, sequence_gradients, toy_instance)
from objbench.experiments.studies.kl_tokens import bin_tokens, estimator_stats, gaussian_table, perturb

F64 = torch.float64


# ----------------------------------------------------------------------------------------- statistics
def test_estimator_stats_by_hand():
    # values 1, 2, 3 against KL 1: errors 0, 1, 2 -> bias 1, std (ddof 1) 1, SE 1/sqrt(3); one negative of four
    st = estimator_stats([1.0, 2.0, 3.0], 1.0)
    assert st["bias"] == pytest.approx(1.0) and st["std"] == pytest.approx(1.0)
    assert st["bias_se"] == pytest.approx(1 / math.sqrt(3)) and st["rel_std"] == pytest.approx(1.0)
    assert st["frac_neg"] == 0.0 and st["rel_median"] == pytest.approx(2.0)
    st = estimator_stats([-1.0, 1.0, 2.0, 4.0], [1.0, 1.0, 2.0, 2.0])  # per-sample truth, mean 1.5
    assert st["kl_mean"] == pytest.approx(1.5) and st["bias"] == pytest.approx(0.0)
    assert st["frac_neg"] == 0.25 and st["min"] == -1.0


@pytest.fixture(scope="module")
def gauss():
    return gaussian_table(n=1_000_000, seed=0, mus=(0.1, 1.0))


@pytest.mark.parametrize("mu,kind", list(SCHULMAN_TABLE))
def test_study_statistics_reproduce_schulman_table(gauss, mu, kind):
    row = gauss[(gauss.mu == mu) & (gauss.estimator == kind)].iloc[0]
    want_bias, want_std = SCHULMAN_TABLE[(mu, kind)]
    # std/KL within 3% (1e6 samples; the published table rounds to 2-3 digits)
    assert row.rel_std == pytest.approx(want_std, rel=0.03)
    # bias/KL within 5 standard errors plus the table's rounding
    assert abs(row.rel_bias - want_bias) < 5 * row.rel_std / math.sqrt(row.n) + 5e-4
    assert row.true_kl == pytest.approx(mu**2 / 2)
    assert (row.frac_neg > 0) == (kind == "k1")  # only k1 goes negative


# ------------------------------------------------------------------------- one-token gradients (exact)
@pytest.mark.parametrize("vocab,distance,seed", [(5, 0.3, 0), (10, 2.0, 1), (20, 0.05, 2)])
def test_one_token_expected_gradients_by_enumeration(vocab, distance, seed):
    theta, ref_logits = toy_instance(vocab, distance, seed)
    pi = torch.softmax(theta, -1)
    target = kl_grads(theta, ref_logits)
    # the targets themselves, in closed form: d KL(pi||ref)/d theta = pi * (d - E_pi d), d = log pi - log ref;
    # d KL(ref||pi)/d theta = pi - ref
    d = torch.log_softmax(theta, -1) - torch.log_softmax(ref_logits, -1)
    assert torch.allclose(target["reverse"], pi * (d - (pi * d).sum()), atol=1e-14)
    assert torch.allclose(target["forward"], pi - torch.softmax(ref_logits, -1), atol=1e-14)

    def expected(form):
        return pi @ per_sample_grads(theta, ref_logits, form)

    assert expected("k1").abs().max() < 1e-12                                   # k1 as loss: no gradient at all
    assert torch.allclose(expected("k2"), target["reverse"], rtol=0, atol=1e-10)
    assert torch.allclose(expected("k1_reward"), target["reverse"], rtol=0, atol=1e-10)
    assert torch.allclose(expected("k3"), target["forward"], rtol=0, atol=1e-10)
    assert torch.allclose(expected("k3_k2grad"), target["reverse"], rtol=0, atol=1e-10)
    assert torch.allclose(expected("k3_ratio"), target["reverse"], rtol=0, atol=1e-10)
    # REFERENCE.md's k2 row read as x grad log pi (x = ref - lp) is the negative reverse-KL gradient
    assert torch.allclose(expected("x_dlogpi"), -target["reverse"], rtol=0, atol=1e-10)
    assert not torch.allclose(target["reverse"], target["forward"], atol=1e-4)  # the two targets differ


def test_categorical_table_and_verdict_inputs():
    g = categorical_gradients((0.1, 2.0), vocab=8, seed=3)
    on = g.set_index(["distance", "form"])
    assert (g.norm_ratio_rev[g.form == "k1"] < ZERO_GRAD_TOL).all() and g.cos_rev[g.form == "k1"].isna().all()
    for form in ("k2", "k1_reward", "k3_k2grad", "k3_ratio"):
        assert (on.xs(form, level="form").rel_err_rev < GRAD_RTOL).all()
    assert (on.xs("k3", level="form").rel_err_fwd < GRAD_RTOL).all()
    assert (on.xs("x_dlogpi", level="form").cos_rev < -1 + 1e-12).all()
    # off-policy: only k3_ratio (importance ratio in the graph) keeps the reverse-KL gradient
    off = categorical_gradients((0.5,), vocab=8, seed=3, off_policy=0.5).set_index("form")
    assert off.loc["k3_ratio", "rel_err_rev"] < GRAD_RTOL
    assert (off.loc[["k2", "k3", "k3_k2grad"], "rel_err_rev"] > 1e-3).all()
    assert "k1_reward" not in off.index


def test_monte_carlo_std_matches_the_exact_per_token_std():
    mc = mc_gradients((0.5,), vocab=6, seed=0, n_tokens=2000, reps=100).set_index("form")
    # the std of a mean of N iid gradients is the per-token std / sqrt(N); 100 repetitions: ~7% sampling error
    ratio = mc.rel_std_mc / mc.rel_std_mc_predicted
    assert ((ratio > 0.75) & (ratio < 1.25)).all(), ratio
    assert abs(mc.loc["k1", "mc_cos_rev"]) < 0.3  # zero-mean noise: no direction on average
    assert mc.loc["k2", "mc_cos_rev"] > 0.95 and mc.loc["k3", "mc_cos_fwd"] > 0.95


# ---------------------------------------------------------------------------------- sequence toy (exact)
def test_sequence_model_enumerates_every_sequence_once():
    seqs, prefix, n_prefix = _sequence_model(3, 3)
    assert seqs.shape == (27, 3) and len({tuple(r) for r in seqs.tolist()}) == 27 and n_prefix == 1 + 3 + 9
    # same prefix <-> same table row, and rows of different lengths never collide
    keys = {}
    for y, p in zip(seqs.tolist(), prefix.tolist()):
        for t in range(3):
            assert keys.setdefault((t, tuple(y[:t])), p[t]) == p[t]
    assert len(set(keys.values())) == len(keys) == n_prefix
    logits = torch.randn(n_prefix, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    probs = torch.log_softmax(logits, -1)[prefix, seqs].sum(-1).exp()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_sequence_gradients_exact_identities():
    sq = sequence_gradients((0.3, 2.0), instances=2, seed=0)
    by = {f: sq[sq.form == f] for f in sq.form.unique()}
    for f in ("k1_reward_seq", "k1_reward_togo"):  # k1 in the reward: the sequence-KL gradient
        assert (by[f].rel_err_seq_rev < 1e-10).all()
    for f in ("k2", "k3_k2grad", "k3_ratio"):  # per-token k2 gradient: the token-local reverse KL only
        assert (by[f].rel_err_local_rev < 1e-10).all()
    assert (by["k3"].rel_err_local_fwd < 1e-10).all()
    far = by["k2"][by["k2"].distance == 2.0]
    assert (far.rel_err_seq_rev > 1e-2).all()  # ... which is not the sequence-KL gradient


# ------------------------------------------------------------------------------------ part (a) pieces
def test_bin_tokens_assigns_bins_and_checks_columns():
    kl = [5e-7, 2e-3, 3e-3, 0.5]
    df = pd.DataFrame({"kl": kl, **{k: [v + 0.1 for v in kl] for k in ESTIMATORS},
                       **{f"{k}_mean": kl for k in ESTIMATORS}, **{f"{k}_var": [0.0] * 4 for k in ESTIMATORS}})
    b = bin_tokens(df, min_tokens=1)
    k1 = b[b.estimator == "k1"]
    assert list(k1.n) == [1, 2, 1] and list(k1.bin_low) == [0.0, 1e-3, 0.1]
    assert k1.bias.tolist() == pytest.approx([0.1] * 3) and (k1.bias_enum == 0).all()
    assert len(bin_tokens(df, min_tokens=2)) == 3  # only the two-token bin is kept, for 3 estimators
    with pytest.raises(ValueError, match="k2_var"):
        bin_tokens(df.drop(columns="k2_var"))


def test_perturb_scales_with_sigma_and_leaves_the_original_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 3))
    before = [p.detach().clone() for p in model.parameters()]
    same = perturb(model, 0.0, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(same.parameters(), before))
    dist = []
    for sigma in (0.01, 0.1):
        m = perturb(model, sigma, torch.Generator().manual_seed(0))
        dist.append(sum((a - b).norm() ** 2 for a, b in zip(m.parameters(), before)).sqrt().item())
    assert dist[1] == pytest.approx(10 * dist[0], rel=1e-5)  # same noise draw, 10x the scale
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_quick_run_writes_consistent_outputs(tmp_path):
    out = tmp_path / "kl"
    argv = ["--out", str(out), "--quick", "--set", "sft.steps=10", "--cache-dir", str(tmp_path / "cache")]
    assert kl_estimators.main(argv) == 0
    for f in ("README.md", "kl_token_bins.png", "token_bins.csv", "policies.csv", "gaussian_table.csv",
              "grad_categorical.csv", "grad_mc.csv", "grad_sequence.csv", "verdicts.md", "run.json"):
        assert (out / f).stat().st_size > 0, f
    pol = pd.read_csv(out / "policies.csv")
    assert list(pol.sigma) == list(Args.quick_sizes()["sigmas"])
    assert pol.kl_exact.is_monotonic_increasing and (pol.kl_exact > 0).all()  # more noise, further away
    assert (pol.n_tokens >= pol.n_completions).all()  # every completion has at least its EOS token
    bins = pd.read_csv(out / "token_bins.csv")
    assert set(bins.estimator) == {"k1", "k2", "k3"}
    # k1 and k3 are exactly unbiased given the prefix; k3 is never negative
    assert (bins[bins.estimator != "k2"].bias_enum.abs() <= 1e-6 * bins[bins.estimator != "k2"].kl_mean).all()
    assert (bins[bins.estimator == "k3"].frac_neg == 0).all()
    readme = (out / "README.md").read_text()
    assert "--quick" in readme and "k1 as a loss has zero expected gradient: confirmed" in readme
    assert json.loads((out / "run.json").read_text())["args"]["quick"] is True


def test_k2_and_k3_in_the_reward_by_hand():
    """E_pi[sg(k(v)) grad log pi(v)] on two tokens: theta = [0, ln 3] (pi = [1/4, 3/4]), ref uniform.
    x = ln ref - ln pi = [ln 2, ln(2/3)]; grad_theta log pi(v) = e_v - pi, so the expectation is
    (1/4)(3/4) (k(0) - k(1)) [1, -1].
    k2 = x^2 / 2: k(0) = 0.240227, k(1) = 0.082204 -> 0.1875 * 0.158023 = 0.029629.
    k3 = e^x - 1 - x: k(0) = 2 - 1 - ln 2 = 0.306853, k(1) = 2/3 - 1 - ln(2/3) = 0.072132 -> 0.1875 * 0.234721
    = 0.044010."""
    theta = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)
    ref = torch.zeros(2, dtype=torch.float64)
    pi = torch.softmax(theta, -1)
    for form, want in (("k2_reward", 0.029629), ("k3_reward", 0.044010)):
        g = pi @ per_sample_grads(theta, ref, form)
        assert g.tolist() == pytest.approx([want, -want], abs=2e-6), form
