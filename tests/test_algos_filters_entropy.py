"""algos.filters (DAPO dynamic sampling, overlong shaping/filtering) and algos.entropy, by hand."""

import math

import pytest
import torch

from objbench.algos.entropy import entropy_from_log_probs, token_entropy
from objbench.algos.filters import dynamic_sampling_keep, overlong_filter, overlong_penalty

F64 = torch.float64


def test_dynamic_sampling_keep_by_hand():
    # groups of 2: [1, 0] mixed -> keep; [1, 1] all equal -> drop; [0, 0] -> drop; [0.5, 0.5001] -> keep
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5001], dtype=F64)
    assert dynamic_sampling_keep(r, 2).tolist() == [True, False, False, True]
    assert dynamic_sampling_keep(r, 4).tolist() == [True, True]
    with pytest.raises(ValueError, match="group_size"):
        dynamic_sampling_keep(r, 1)
    with pytest.raises(ValueError, match="group_size"):
        dynamic_sampling_keep(r, 3)


def test_overlong_penalty_by_hand():
    # L_max = 20, L_cache = 4 -> L_exp = 16:
    #   |y| = 10, 16 -> 0;  17 -> (16 - 17)/4 = -0.25;  19 -> -0.75;  20 -> -1.0;  21 (> L_max) -> -1
    lengths = torch.tensor([10, 16, 17, 19, 20, 21])
    out = overlong_penalty(lengths, max_len=20, cache_len=4)
    assert out.dtype == torch.get_default_dtype()
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0, -1.0]))
    # factor scales the whole penalty
    assert torch.allclose(overlong_penalty(lengths, 20, 4, factor=0.5), torch.tensor([0.0, 0.0, -0.125, -0.375, -0.5, -0.5]))
    # no soft zone (cache 0): 0 up to L_max, -1 beyond
    assert torch.allclose(overlong_penalty(lengths, 20, 0), torch.tensor([0.0, 0, 0, 0, 0, -1.0]))
    # float lengths keep their dtype
    assert overlong_penalty(lengths.to(F64), 20, 4).dtype == F64


def test_overlong_penalty_errors():
    lengths = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="max_len"):
        overlong_penalty(lengths, 0, 0)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, 10, 11)
    with pytest.raises(ValueError, match="factor"):
        overlong_penalty(lengths, 10, 2, factor=-1.0)
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(lengths[None], 10, 2)


def test_overlong_filter():
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    out = overlong_filter(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[True, True, False], [False, False, False], [True, False, False]]
    assert torch.equal(overlong_filter(mask, torch.tensor([0, 1, 0])), out)  # a 0/1 integer flag vector is a mask too
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter(mask, torch.tensor([0, 2, 0]))
    with pytest.raises(ValueError, match="truncated"):
        overlong_filter(mask, torch.tensor([False, True]))


def test_token_entropy_by_hand():
    # [0.5, 0.25, 0.25]: H = 0.5 log 2 + 2 * 0.25 log 4 = 0.34657359 + 0.69314718 = 1.03972077
    # uniform over 4: log 4 = 1.38629436;  one-hot (other logits -inf): 0
    logits = torch.stack([
        torch.log(torch.tensor([0.5, 0.25, 0.25, 1e-300], dtype=F64)),
        torch.zeros(4, dtype=F64),
        torch.tensor([0.0, -math.inf, -math.inf, -math.inf], dtype=F64),
    ])[None]  # (B=1, T=3, V=4)
    h = token_entropy(logits)
    assert h.shape == (1, 3) and h.dtype == F64
    assert torch.allclose(h, torch.tensor([[1.03972077, 1.38629436, 0.0]], dtype=F64), atol=1e-8)
    # the same rows given as log-probs (the scoring's log_softmax): the same numbers
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(entropy_from_log_probs(lp), torch.tensor([[1.03972077, 1.38629436, 0.0]], dtype=F64),
                          atol=1e-8)


def test_token_entropy_stable_for_large_logits():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 11, generator=g, dtype=F64)
    assert torch.allclose(token_entropy(a + 1e4), token_entropy(a), atol=1e-9)
    big = token_entropy(a * 1e4)
    assert torch.isfinite(big).all() and (big >= -1e-12).all()
    x = a.clone().requires_grad_()
    token_entropy(x).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert token_entropy(a.float()).dtype == torch.float32
