"""algos.aggregate: hand-computed values for every mode, fully masked rows, garbage under the mask."""

import pytest
import torch

from objbench import algos
from objbench.algos.aggregate import AGGREGATION_MODES

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
NAN, INF = float("nan"), float("inf")


def _example(dtype=torch.float64):
    # row 0: losses 1, 2, 3 (3 valid tokens); row 1: loss 4 (1 valid token), then padding
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, INF]], dtype=dtype)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    return loss, mask


# token_mean               = (1 + 2 + 3 + 4) / 4             = 2.5
# seq_mean_token_mean      = ((1 + 2 + 3) / 3 + 4 / 1) / 2   = (2 + 4) / 2 = 3.0
# seq_mean_token_sum       = ((1 + 2 + 3) + 4) / 2           = 5.0
# seq_mean_token_sum_norm  = (1 + 2 + 3 + 4) / (B=2 * L=4)   = 1.25
HAND = {"token_mean": 2.5, "seq_mean_token_mean": 3.0, "seq_mean_token_sum": 5.0, "seq_mean_token_sum_norm": 1.25}


@pytest.mark.parametrize("mode", MODES)
def test_hand_values_and_garbage_under_mask(mode):
    loss, mask = _example()
    out = algos.aggregate(loss, mask, mode, max_len=4)
    assert out.dim() == 0 and out.dtype == torch.float64
    assert out.item() == pytest.approx(HAND[mode], abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_row_is_dropped_from_B(mode):
    # decision: a row with no valid token (e.g. a filtered truncated response) does not count in B'
    loss, mask = _example()
    loss3 = torch.cat([loss, torch.tensor([[NAN, 7.0, -INF]], dtype=loss.dtype)])
    mask3 = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    out = algos.aggregate(loss3, mask3, mode, max_len=4)
    assert out.item() == pytest.approx(HAND[mode], abs=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_batch_is_zero_with_grad(mode):
    loss = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    out = algos.aggregate(loss, mask, mode, max_len=4)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert torch.equal(loss.grad, torch.zeros_like(loss))


def test_gradients_by_hand():
    # d token_mean / d l_it = m_it / 4; d seq_mean_token_mean / d l_it = m_it / (B |y_i|) = 1/6 on row 0, 1/2 on row 1
    loss, mask = _example()
    loss = loss.nan_to_num(0.0, posinf=0.0).requires_grad_()
    algos.aggregate(loss, mask, "token_mean").backward()
    assert torch.allclose(loss.grad, torch.tensor([[0.25, 0.25, 0.25], [0.25, 0, 0]], dtype=torch.float64))
    loss.grad = None
    algos.aggregate(loss, mask, "seq_mean_token_mean").backward()
    assert torch.allclose(loss.grad, torch.tensor([[1 / 6, 1 / 6, 1 / 6], [0.5, 0, 0]], dtype=torch.float64))


@pytest.mark.parametrize("mode", MODES)
def test_garbage_gradients_do_not_leak(mode):
    loss, mask = _example()
    clean = loss.nan_to_num(0.0, posinf=0.0).requires_grad_()
    dirty = loss.clone().requires_grad_()
    algos.aggregate(clean, mask, mode, max_len=4).backward()
    algos.aggregate(dirty, mask, mode, max_len=4).backward()
    assert torch.equal(clean.grad, dirty.grad)
    assert torch.isfinite(dirty.grad).all()


def test_token_mean_equals_seq_mean_token_mean_for_equal_lengths():
    g = torch.Generator().manual_seed(0)
    loss = torch.randn(6, 9, generator=g, dtype=torch.float64)
    mask = torch.zeros(6, 9, dtype=torch.bool)
    mask[:, 2:7] = True  # every row has 5 valid tokens
    a = algos.aggregate(loss, mask, "token_mean")
    b = algos.aggregate(loss, mask, "seq_mean_token_mean")
    assert torch.allclose(a, b, rtol=0, atol=1e-14)
    # and seq_mean_token_sum_norm with L = |y| equals them too
    assert torch.allclose(algos.aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=5), a, atol=1e-14)


@pytest.mark.parametrize("mode", MODES)
def test_dtype_preserved(mode):
    for dtype in (torch.float32, torch.float64):
        loss, mask = _example(dtype)
        assert algos.aggregate(loss, mask, mode, max_len=4).dtype == dtype


def test_errors_name_the_argument():
    loss, mask = _example()
    with pytest.raises(ValueError, match="max_len"):
        algos.aggregate(loss, mask, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="max_len"):
        algos.aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=0)
    with pytest.raises(ValueError, match="mode.*token_mean"):
        algos.aggregate(loss, mask, "sum")
    with pytest.raises(ValueError, match="mask must hold only 0 and 1.*0.5"):
        algos.aggregate(loss, mask.double() * 0.5, "token_mean")
    with pytest.raises(ValueError, match="mask"):
        algos.aggregate(loss, mask[:, :2], "token_mean")
    with pytest.raises(ValueError, match="loss_mat"):
        algos.aggregate(loss.long(), mask, "token_mean")


def test_function_shadows_module_and_registry_is_reachable():
    assert callable(algos.aggregate)
    assert set(AGGREGATION_MODES.names()) == set(MODES)
