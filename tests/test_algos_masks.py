"""Masks at the algos API boundary: torch.bool, or integer/float tensors of 0s and 1s (Hugging Face int64
attention masks, verl/TRL float masks) are accepted and give the bool mask's results to the last bit;
anything else is an error naming the argument and the offending values."""

import pytest
import torch

from objbench import algos
from objbench.algos._checks import as_mask
from objbench.algos.advantages import broadcast_to_tokens, gae, value_loss, whiten
from objbench.algos.config_dict import with_overrides
from objbench.algos.filters import overlong_filter
from objbench.algos.policy import sequence_log_ratio, sequence_token_log_ratio, token_log_ratio

F64 = torch.float64
BOOL = torch.tensor([[True, True, False], [True, False, False]])
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_one_masks_of_every_dtype_become_the_bool_mask(dtype):
    out = as_mask(BOOL.to(dtype))
    assert out.dtype == torch.bool and torch.equal(out, BOOL)


def test_bool_mask_passes_through_untouched():
    assert as_mask(BOOL) is BOOL  # no copy (and no data read: nothing to sync)


@pytest.mark.parametrize(
    "bad,shown",
    [
        (torch.tensor([[1.0, 0.5, 0.0], [1.0, 0.0, 0.0]]), "0.5"),
        (torch.tensor([[1, 2, 0], [1, 0, 0]]), "2"),
        (torch.tensor([[1, -1, 0], [1, 0, 0]]), "-1"),
        (torch.tensor([[1.0, float("nan"), 0.0], [1.0, 0.0, 0.0]]), "nan"),
        (torch.tensor([[1.0, float("inf"), 0.0], [1.0, 0.0, 0.0]]), "inf"),
        (torch.tensor([[1.0, 0.5, 0.0], [1.0, 3.0, 0.5]], dtype=torch.bfloat16), "0.5, 3.0"),
    ],
)
def test_values_other_than_zero_and_one_are_named(bad, shown):
    with pytest.raises(ValueError, match=f"^mask must hold only 0 and 1.*{bad.dtype}.*values: {shown}"):
        as_mask(bad)


def test_error_counts_offending_entries_and_truncates_long_lists():
    bad = torch.arange(20, dtype=torch.float32).reshape(2, 10)  # 0 and 1 are fine, 2..19 are not
    with pytest.raises(ValueError, match=r"18 of 20 entries not 0 or 1, values: 2\.0, 3\.0.*9\.0, \.\.\. \(18 distinct\)"):
        as_mask(bad)


def test_other_errors_name_the_argument():
    with pytest.raises(ValueError, match="^mask must be 2-D, got shape \\(3,\\)"):
        as_mask(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="^mask must have shape \\(2, 4\\), got \\(2, 3\\)"):
        as_mask(BOOL, shape=(2, 4))
    with pytest.raises(ValueError, match="^mask must be a torch.Tensor, got list"):
        as_mask([[1, 0]])
    with pytest.raises(ValueError, match="^mask must be a bool, integer or floating tensor.*complex"):
        as_mask(BOOL.to(torch.complex64))
    with pytest.raises(ValueError, match="^truncated must hold only 0 and 1"):
        as_mask(torch.tensor([0, 2]), "truncated", ndim=1)


def test_public_functions_name_the_mask():
    lp = torch.zeros(2, 3, dtype=F64)
    half = BOOL.double() * 0.5
    calls = [
        lambda m: algos.aggregate(lp, m, "token_mean"),
        lambda m: algos.policy_loss(lp, lp, lp, m),
        lambda m: token_log_ratio(lp, lp, m),
        lambda m: gae(lp, lp, m, 1.0, 1.0),
        lambda m: whiten(lp, m),
        lambda m: value_loss(lp, lp, lp, m, 0.5, "token_mean"),
        lambda m: broadcast_to_tokens(lp[:, 0], m),
        lambda m: overlong_filter(m, torch.zeros(2, dtype=torch.bool)),
        lambda m: algos.compute_advantages(algos.get_preset("grpo", group_size=2), rewards=lp[:, 0], mask=m),
        lambda m: algos.compute_loss(algos.presets["dapo"], logp=lp, old_logp=lp, advantages=lp, mask=m),
        lambda m: algos.compute_value_loss(algos.presets["ppo"], values=lp, old_values=lp, returns=lp, mask=m),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="^mask must hold only 0 and 1.*0.5"):
            call(half)
    # a wrong-shaped mask is rejected too (here against the loss matrix it must match)
    with pytest.raises(ValueError, match="mask"):
        algos.aggregate(lp, BOOL[:, :2], "token_mean")


# ------------------------------------------------------------------------------------------- parity
def _batch():
    g = torch.Generator().manual_seed(0)
    B, T = 8, 5
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:, 0] = True
    mask[5] = False  # a fully masked (filtered) row
    old = -torch.rand(B, T, generator=g, dtype=F64) * 2
    return dict(
        mask=mask,
        old=old,
        lp=old + 0.3 * torch.randn(B, T, generator=g, dtype=F64),
        ref=old + 0.3 * torch.randn(B, T, generator=g, dtype=F64),
        values=torch.randn(B, T, generator=g, dtype=F64),
        ent=torch.rand(B, T, generator=g, dtype=F64),
        rewards=(torch.rand(B, generator=g) > 0.5).to(F64),
    )


def _everything(name, mask, b):
    cfg = algos.get_preset(name) if name == "ppo" else algos.get_preset(name, group_size=4)
    cfg = with_overrides(cfg, {"loss.entropy_coef": 0.01})
    adv, ret, ma = algos.compute_advantages(cfg, rewards=b["rewards"], mask=mask, values=b["values"],
                                            old_logp=b["old"], ref_logp=b["ref"], max_len=5)
    lp = b["lp"].clone().requires_grad_()
    loss, ml = algos.compute_loss(cfg, logp=lp, old_logp=b["old"], advantages=adv, mask=mask, ref_logp=b["ref"],
                                  entropy=b["ent"], max_len=5)
    loss.backward()
    out = {"adv": adv, "loss": loss.detach(), "grad": lp.grad, **ma, **ml}
    if ret is not None:
        v = (b["values"] + 0.2).requires_grad_()
        vl, mv = algos.compute_value_loss(cfg, values=v, old_values=b["values"], returns=ret, mask=mask)
        vl.backward()
        out.update(ret=ret, vloss=vl.detach(), vgrad=v.grad, **mv)
    return out


@pytest.mark.parametrize("name", ["ppo", "grpo", "dr_grpo", "dapo", "gspo"])
def test_bool_int64_float32_masks_give_identical_results(name):
    b = _batch()
    ref = _everything(name, b["mask"], b)
    for dtype in (torch.int64, torch.float32):
        got = _everything(name, b["mask"].to(dtype), b)
        assert got.keys() == ref.keys()
        for k in ref:
            assert torch.equal(got[k], ref[k]), (name, dtype, k)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_component_functions_accept_zero_one_masks(dtype):
    b = _batch()
    m, mm = b["mask"], b["mask"].to(dtype)
    for fn in (token_log_ratio, sequence_log_ratio, sequence_token_log_ratio):
        assert torch.equal(fn(b["lp"], b["old"], mm), fn(b["lp"], b["old"], m))
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        assert torch.equal(algos.aggregate(b["lp"], mm, mode, 5), algos.aggregate(b["lp"], m, mode, 5))
    assert torch.equal(whiten(b["lp"], mm), whiten(b["lp"], m))
    assert all(torch.equal(x, y) for x, y in zip(gae(b["lp"], b["values"], mm, 0.9, 0.8),
                                                 gae(b["lp"], b["values"], m, 0.9, 0.8)))
    trunc = torch.zeros(8, dtype=torch.bool)
    trunc[2] = True
    assert torch.equal(overlong_filter(mm, trunc.to(dtype)), overlong_filter(m, trunc))
