"""The length study's positive control end to end: sampling in two parts around the environment's verdict
(experiments/train.py: _generate_with_interjection), the verdict token excluded from the loss."""

import pytest
import torch

from objbench.experiments.config import load_config
from objbench.experiments.run.sample import rollout
from objbench.experiments.run.setup import build_setup, make_optimizers
from objbench.experiments.run.update import update

SETTINGS = ["sft.steps=200", "train.threads=1", "rollout.completions_per_step=32", "task.filler_max=6",
            "task.filler_position=after", "task.filler_demo_max=2", "task.verdict=true", "objective=grpo"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verdict")
    return build_setup(load_config(None, [*SETTINGS, f"out_dir={tmp}"]), tmp / "cache")


def test_the_verdict_is_the_environments_token_and_tells_the_truth(setup):
    s = setup
    torch.manual_seed(0)
    problems = s.task.prompts(0, 0, 8)
    b = rollout(s, problems, 4, s.sampling, torch.Generator().manual_seed(3))
    plus, minus, eq = (s.tokenizer.convert_tokens_to_ids(c) for c in "+-=")
    assert b.forced is not None and b.forced.shape == b.response_mask.shape
    n_verdicts = 0
    for i in range(b.size):
        ids = b.response_ids[i][b.response_mask[i]].tolist()
        forced = b.forced[i][b.response_mask[i]].tolist()
        if eq in ids and not b.truncated[i]:  # the policy wrote its answer and "=": one verdict follows
            k = ids.index(eq)
            assert forced == [j == k + 1 for j in range(len(ids))]
            assert ids[k + 1] == (plus if bool(b.correct[i]) else minus)  # "+" exactly when the answer is right
            assert float(b.old_logp[i][k + 1]) == 0.0 and b.texts[i][k + 1] in "+-"
            n_verdicts += 1
        else:
            assert not any(forced)
    assert n_verdicts >= b.size // 2
    assert not (b.forced & ~b.response_mask).any()


def test_the_verdict_gets_no_gradient(setup):
    """One update from the same weights with the verdict tokens' old log-probs changed gives the same weights
    (they are not in the loss); changing one of the policy's own tokens instead gives other weights."""
    import copy

    s = setup
    b = rollout(s, s.task.prompts(0, 8, 8), 4, s.sampling, torch.Generator().manual_seed(4))
    b.rewards = torch.arange(b.size, dtype=torch.float32) % 3  # non-equal groups: every row has an advantage
    assert b.forced.any()
    start = {k: v.clone() for k, v in s.policy.state_dict().items()}

    def after(batch):
        s.policy.load_state_dict(start)
        opt, copt = make_optimizers(s)
        update(s, batch, opt, copt, step=1)
        return {k: v.clone() for k, v in s.policy.state_dict().items()}

    base = after(b)
    b_verdict = copy.copy(b)
    b_verdict.old_logp = b.old_logp.masked_fill(b.forced, -3.0)
    assert all(torch.equal(base[k], v) for k, v in after(b_verdict).items())
    own = b.response_mask & ~b.forced
    b_own = copy.copy(b)
    b_own.old_logp = b.old_logp.clone()
    r, t = own.nonzero()[0].tolist()
    b_own.old_logp[r, t] -= 3.0
    assert not all(torch.equal(base[k], v) for k, v in after(b_own).items())
    s.policy.load_state_dict(start)
