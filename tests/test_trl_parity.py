"""objbench's GRPO loss and gradient equal TRL's GRPOTrainer on one identical batch (issue 6).

Marked `trl` (left out of the default run) and skipped when TRL is missing: pip install -e ".[trl]", then
python -m pytest -m trl tests/test_trl_parity.py
"""

import pytest

pytest.importorskip("trl")
pytestmark = pytest.mark.trl


@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory):
    from benchmarks.trl_parity import save_warm_model

    path = tmp_path_factory.mktemp("warm") / "model"
    save_warm_model(path)
    return str(path)


@pytest.mark.parametrize("beta,bias_correction", [(0.0, True), (0.04, True), (0.04, False)])
def test_loss_and_gradient_match_trl(warm_dir, beta, bias_correction):
    from benchmarks.trl_parity import numerics

    c = numerics(warm_dir, beta, bias_correction)
    assert c["adv_max_abs_diff"] <= 1e-6
    assert c["loss_abs_diff"] <= 1e-5
    assert c["grad_max_abs_diff"] <= 1e-5
    assert c["grad_norm"] > 0.01  # a real gradient, not two zeros
    assert c["mask_dtype"] == "torch.int64"  # algos got TRL's own completion mask, not a bool copy


def test_the_kl_forms_differ_so_the_check_can_fail(warm_dir):
    # TRL's default multiplies k3 by the differentiable ratio: objbench's k3 (not k3_ratio) must NOT match it
    from benchmarks.trl_parity import numerics

    on, off = numerics(warm_dir, 0.04, True), numerics(warm_dir, 0.04, False)
    assert abs(on["grad_norm"] - off["grad_norm"]) > 1e-3
