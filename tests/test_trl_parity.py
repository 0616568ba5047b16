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


def test_loss_and_gradient_match_trl_on_a_bpe_chat_model(tmp_path, monkeypatch):
    # the real-model benchmark's workload (reasoning-gym sums, chat template, 32 completions of 32 tokens) on a small
    # Qwen2 folder with a BPE tokenizer; a random model rarely answers right, so the reward here is a fixed function
    # of the completion text (the same function on both sides), which gives non-zero advantages
    pytest.importorskip("reasoning_gym")
    from benchmarks import trl_parity_real as R
    from objbench.rollout.toy_hf import write_toy_model

    folder = str(write_toy_model(tmp_path / "toy"))
    monkeypatch.setattr(R.TaskReward, "score", lambda self, i, text, ids: float(len(text) % 3 == 0))
    for beta in (0.0, 0.04):
        c = R.numerics(folder, beta)
        assert c["prompts_identical"]
        assert 0.0 < c["reward_mean"] < 1.0
        assert c["adv_max_abs_diff"] <= 1e-6
        assert c["loss_abs_diff"] <= 1e-5
        assert c["grad_max_abs_diff"] <= 1e-5
        assert c["grad_norm"] > 0.01
