"""The shortcuts that keep the harness's own time per step small compute exactly what they replace:
algos.aggregate_many (numbers worked out by hand, and bit-equal to one aggregate per loss), the per-thread mask
memo of algos._checks (recomputed after an in-place change, never kept for inference tensors, safe to reuse
across inference mode and autograd), and the character tokenizer's table encoding (equal to the tokenizer's own
ids; other tokenizers never take it)."""

import random

import pytest
import torch

from objbench import algos
from objbench.algos import _checks
from objbench.algos.aggregate import AGGREGATION_MODES
from objbench.envs.tokenizer import build_char_tokenizer
from objbench.rollout.sft import _char_table, encode_batch

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


@pytest.fixture
def private_task():
    """A freshly built default task that no other test sees: build_task caches tasks in the module-level
    ``objbench.experiments.config._TASKS`` (one per spec, for the whole process), so a test that replaces a
    task's method on the cached task would leak into every later test. The cache is swapped for an empty one
    for the duration of the test (monkeypatch puts the real one back), and the task built into it is dropped
    with it; the real cache's tasks are checked untouched afterwards."""
    import objbench.experiments.config as C
    import objbench.experiments.config.task as T

    def attributes(cache):
        return {k: {a: id(v) for a, v in vars(t).items()} for k, t in cache.items()}

    real_cache = T._TASKS
    before = attributes(real_cache)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(T, "_TASKS", {})
        task = C.build_task(C.load_config(None, []))
        assert all(task is not t for t in real_cache.values())
        yield task
    assert T._TASKS is real_cache and attributes(real_cache) == before  # no cached task was changed


def _hand_case():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    l1 = torch.tensor([[1.0, 3.0, 99.0], [4.0, 99.0, 99.0]])
    l2 = torch.tensor([[2.0, 2.0, 99.0], [0.0, 99.0, 99.0]])
    return torch.stack([l1, l2]), mask


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", [8 / 3, 4 / 3]),  # (1 + 3 + 4) / 3 tokens; (2 + 2 + 0) / 3
    ("seq_mean_token_mean", [3.0, 1.0]),  # ((1 + 3) / 2 + 4 / 1) / 2 rows; ((2 + 2) / 2 + 0) / 2
    ("seq_mean_token_sum", [4.0, 2.0]),  # (4 + 4) / 2; (4 + 0) / 2
    ("seq_mean_token_sum_norm", [1.0, 0.5]),  # 8 / (2 rows * L = 4); 4 / 8
])
def test_aggregate_many_by_hand(mode, expected):
    losses, mask = _hand_case()
    out = algos.aggregate_many(losses, mask, mode, max_len=4)
    assert out.shape == (2,)
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_many_is_bit_equal_to_aggregate(mode):
    g = torch.Generator().manual_seed(0)
    for B, T, K in ((1, 1, 1), (4, 7, 3), (64, 12, 4), (33, 40, 5)):
        mask = torch.rand(B, T, generator=g) > 0.4
        mask[0] = False  # an empty row
        losses = torch.randn(K, B, T, generator=g)
        losses[:, ~mask] = float("nan")  # garbage under the mask never enters
        out = algos.aggregate_many(losses, mask, mode, max_len=T)
        for k in range(K):
            assert torch.equal(out[k], algos.aggregate(losses[k], mask, mode, max_len=T)), (mode, B, T, k)


def test_aggregate_many_calls_a_mode_without_stackable_once_per_loss(monkeypatch):
    fn = AGGREGATION_MODES.get("seq_mean_token_sum")
    monkeypatch.setattr(fn, "stackable", False)
    losses, mask = _hand_case()
    assert algos.aggregate_many(losses, mask, "seq_mean_token_sum").tolist() == pytest.approx([4.0, 2.0])


def test_aggregate_many_rejects_bad_input():
    losses, mask = _hand_case()
    with pytest.raises(ValueError, match="mode"):
        algos.aggregate_many(losses, mask, "nope")
    with pytest.raises(ValueError, match="loss_mats"):
        algos.aggregate_many(losses[0], mask, "token_mean")
    with pytest.raises(ValueError, match="mask"):
        algos.aggregate_many(losses, mask[:, :2], "token_mean")


def test_mask_memo_follows_in_place_changes():
    mask = torch.tensor([[True, False, True]])
    assert torch.equal(_checks.complement(mask), ~mask)
    assert _checks.valid_count(mask, torch.float32).item() == 2.0
    mask[0, 1] = True  # in place: the version counter moves, the memo recomputes
    assert torch.equal(_checks.complement(mask), ~mask)
    assert _checks.valid_count(mask, torch.float32).item() == 3.0
    assert _checks.row_counts(mask, torch.float32)[0].tolist() == [3.0]
    other = torch.tensor([[False, False, False]])  # another tensor: its own values (counts clamped to 1)
    assert _checks.valid_count(other, torch.float32).item() == 1.0
    assert _checks.row_counts(other, torch.float32)[1].item() == 1.0


def test_mask_memo_never_keeps_inference_tensors_and_mixes_with_autograd():
    with torch.inference_mode():
        inf_mask = torch.tensor([[True, False]])
        assert torch.equal(_checks.complement(inf_mask), ~inf_mask)
    assert _checks._memo.ref is None or _checks._memo.ref() is not inf_mask
    mask = torch.tensor([[True, True, False], [True, False, False]])
    with torch.inference_mode():  # memoised under inference mode ...
        algos.aggregate(torch.ones(2, 3), mask, "seq_mean_token_mean")
    x = torch.ones(2, 3, requires_grad=True)  # ... then used with autograd: recomputed, so it can be saved
    algos.aggregate(x * 2.0, mask, "seq_mean_token_mean").backward()
    assert x.grad.tolist() == [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]  # d/dx of (1/2)(2(x1+x2)/2 + 2 x3)


def test_char_tokenizer_table_encoding_matches_the_tokenizer():
    tok = build_char_tokenizer()
    assert _char_table(tok) is not None
    rust = tok._tokenizer
    rng = random.Random(0)
    pieces = list("0123456789+=-*.# /()") + ["a", "\n", "<", ">", "<eos>", "<pad>", "<unk>", "<bos>", "é"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 15))) for _ in range(2000)]
    assert encode_batch(tok, texts) == [rust.encode(t, add_special_tokens=False).ids for t in texts]


def test_a_bpe_tokenizer_never_takes_the_table_path():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator(["12+34=46", "7*8=56", "100-1=99"] * 50,
                             trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    assert _char_table(tok) is None
    assert encode_batch(tok, ["12+34="]) == [core.encode("12+34=", add_special_tokens=False).ids]


def test_a_deterministic_reward_verifies_each_distinct_completion_once(private_task, monkeypatch):
    from objbench.experiments.run.sample import verify

    task = private_task
    calls = []
    real = task.reward

    def counting(p, t, tr=False):
        calls.append((p.uid, t, tr))
        return real(p, t, tr)

    monkeypatch.setattr(task, "reward", counting)
    p, q = task.prompts(0, 0, 2)
    probs = [p, p, p, q, q]
    texts = [p.answer, p.answer, "1", p.answer, "x"]  # q's rows: answer and text of the other problem
    truncated = [False, False, False, False, True]
    out = verify(task, probs, texts, truncated)
    assert len(calls) == 4 and out[0] is out[1]  # (p, answer) verified once, its copy shares the result
    assert [r.correct for r in out] == [True, True, False, p.answer == q.answer, False]
    assert out == [real(pp, t, tr) for pp, t, tr in zip(probs, texts, truncated)]
    calls.clear()
    monkeypatch.setattr(task, "deterministic_reward", False)  # a random or stateful reward: every row is verified
    assert verify(task, probs, texts, truncated) == out and len(calls) == 5


def test_peak_rss_reads_getrusage_only_where_it_equals_vmhwm(monkeypatch):
    import objbench.experiments.run.provenance as T

    if T._vmhwm_kb() is None:
        pytest.skip("no /proc/self/status (not Linux)")
    # this process: either path gives VmHWM, ru_maxrss within the kernel's per-CPU counter slack (< 1%)
    ballast = bytearray(64 * 2 ** 20)  # raise the peak while the test runs
    ballast[:: 4096] = b"x" * len(ballast[:: 4096])
    for _ in range(2):
        assert T.peak_rss_mb() == pytest.approx(T._vmhwm_kb() / 1024, rel=0.01)
    del ballast

    class Usage:
        def __init__(self, kb):
            self.ru_maxrss = kb

    reads = []
    state = {"ru": 900, "hwm": 300}  # a child that inherited its parent's 900 KiB peak; its own is 300

    def hwm():
        reads.append(1)
        return state["hwm"]

    monkeypatch.setattr(T, "_INHERITED_MAXRSS", None)
    monkeypatch.setattr(T, "_vmhwm_kb", hwm)
    monkeypatch.setattr(T.resource, "getrusage", lambda who: Usage(state["ru"]))
    assert T.peak_rss_mb() == 300 / 1024 and len(reads) == 1  # ru_maxrss is the parent's: VmHWM is read
    state["hwm"] = 800
    assert T.peak_rss_mb() == 800 / 1024 and len(reads) == 2  # still below the inherited peak: read again
    state["ru"] = state["hwm"] = 1000  # own peak past the inherited one: ru_maxrss is VmHWM, no read
    assert T.peak_rss_mb() == 1000 / 1024 and len(reads) == 2
    # a process whose ru_maxrss is its own from the start reads /proc once, then never again
    monkeypatch.setattr(T, "_INHERITED_MAXRSS", None)
    state["ru"] = state["hwm"] = 500
    assert T.peak_rss_mb() == 500 / 1024 and len(reads) == 3
    state["ru"] = 700
    assert T.peak_rss_mb() == 700 / 1024 and len(reads) == 3


def test_timed_adds_each_block_to_its_key_and_passes_exceptions():
    from collections import defaultdict
    from types import SimpleNamespace

    from objbench.experiments.run.setup import timed

    s = SimpleNamespace(timers=defaultdict(float))
    with timed(s, "a"):
        pass
    with pytest.raises(KeyError):
        with timed(s, "b"):
            raise KeyError("x")
    assert set(s.timers) == {"a", "b"} and all(v >= 0 for v in s.timers.values())


def test_zero_var_frac_equals_the_tensor_computation():
    from objbench.algos.advantages import zero_variance_groups
    from objbench.experiments.run.step_metrics import zero_var_frac

    nan = float("nan")
    cases = [([1.0, 1.0, 0.0, 0.0, 0.5, 0.5], 2), ([0.0, -0.0, 1.0, 1.0 + 2 ** -23], 2),
             ([nan, nan, 1.0, 1.0, nan, 1.0], 2), ([0.25] * 8, 4), ([0.1, 0.2, 0.3], 3), ([0.1, 0.2, 0.3], 1)]
    rng = random.Random(0)
    cases += [([rng.choice([0.0, 0.1, 1.0]) for _ in range(8 * G)], G) for G in (2, 4, 8) for _ in range(20)]
    for rewards, G in cases:
        r = torch.tensor(rewards, dtype=torch.float32)
        assert zero_var_frac(r, G) == float(zero_variance_groups(r, G).float().mean()), (rewards, G)
    # 1 + 2**-24 rounds to 1.0 in float32: the comparison is on the tensor's values
    assert zero_var_frac(torch.tensor([1.0, 1.0 + 2 ** -24]), 2) == 1.0
    with pytest.raises(ValueError):
        zero_var_frac(torch.ones(5), 2)  # not whole groups: the tensor function's own error


def test_prompt_stream_gives_the_task_prompts_for_any_request_order(private_task, monkeypatch):
    from objbench.experiments.run.setup import PromptStream

    task = private_task
    calls = []
    real = task.prompts

    def counting(seed, start, n):
        calls.append((start, n))
        return real(seed, start, n)

    monkeypatch.setattr(task, "prompts", counting)
    stream = PromptStream(task, 3, chunk=16)
    requests = [(0, 8), (8, 8), (16, 8), (20, 3), (5, 2), (100, 40), (0, 0), (139, 1), (140, 1)]
    for start, n in requests:
        assert stream.take(start, n) == real(3, start, n), (start, n)
    # what was asked for, then the rest of the chunk ahead: (0, 8) and (8, 8) from one chunk; a request behind or
    # past the chunk draws a new one
    assert calls == [(0, 8), (8, 8), (16, 8), (24, 8), (5, 2), (7, 14), (100, 40), (0, 0), (0, 16), (139, 1),
                     (140, 15)]


def test_prompt_stream_of_a_finite_task_raises_only_past_its_end():
    """A task whose stream ends (the TRL benchmark's fixed list of problems) must run to its last problem: the
    stream's draw ahead stops at the end instead of failing the step, and asking past the end still raises."""
    from benchmarks.workload import UniformAddition
    from objbench.experiments.run.setup import PromptStream

    task = UniformAddition(n=40)
    for start, n in [(0, 32), (32, 8), (39, 1), (0, 40)]:
        assert PromptStream(task, 0, chunk=256).take(start, n) == task.prompts(0, start, n)
    stream = PromptStream(task, 0, chunk=256)
    assert len(stream.take(0, 32)) == 32 and len(stream.take(32, 8)) == 8
    with pytest.raises(IndexError):
        stream.take(32, 9)


def test_the_trl_benchmarks_objbench_worker_runs_past_one_prompt_chunk(tmp_path):
    """10 steps x 32 prompts of a 320-problem task: past the stream's 256-problem chunk (this failed at c95e727)."""
    from benchmarks.trl_parity import run_objbench, save_warm_model

    save_warm_model(tmp_path)
    res = run_objbench(str(tmp_path), 0.04, 10)
    assert len(res["times"]) == len(res["rewards"]) == 10
    assert all(0.0 <= r <= 1.0 for r in res["rewards"]) and all(t > 0 for t in res["tokens"])


def test_prompt_stream_encoding_is_the_codecs_encoding_of_the_same_prompts():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from objbench.experiments.config import build_task, load_config
    from objbench.experiments.run.setup import PromptStream
    from objbench.rollout.bundle import Codec, char_codec

    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator(["12+34=46", "7*8=56", "100-1=99"] * 50,
                             trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>", "<pad>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")
    bpe = Codec(tok, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    task = build_task(load_config(None, ["task.max_digits=3"]))  # prompt lengths differ
    for codec in (char_codec(), bpe):
        stream = PromptStream(task, 0, codec, chunk=32)
        for start, n in [(0, 8), (8, 8), (3, 1), (30, 8), (40, 40)]:
            ids, mask = stream.encoded(start, n)
            want_ids, want_mask = codec.encode_prompts(task.prompts(0, start, n))
            assert torch.equal(ids, want_ids) and torch.equal(mask, want_mask), (start, n)
            assert ids.dtype == want_ids.dtype and mask.dtype == torch.bool


def test_cpu_column_is_torch_tensor_of_the_same_values():
    import numpy as np

    from objbench.experiments.run.sample import cpu_column

    cases = [([0.0, 1.0, 0.1, -0.0, float("nan"), float("inf"), 1e300, 1e-50, 3, True, np.float64(0.5)], torch.float32),
             ([True, False, 1, 0, 2, np.bool_(True)], torch.bool), ([1, 2, 3, -5, 2 ** 40], torch.long),
             ([1.0, 2.0], torch.long), ([], torch.float32)]
    bits = {torch.float32: torch.int32, torch.bool: torch.uint8, torch.long: torch.long}  # bit-level views
    for values, dtype in cases:
        got, want = cpu_column(values, dtype), torch.tensor(values, dtype=dtype)
        assert got.dtype == want.dtype and got.shape == want.shape, (values, dtype)
        assert torch.equal(got.view(bits[dtype]), want.view(bits[dtype])), (values, dtype)  # NaN, -0.0, bool bytes


def test_policy_loss_option_checks_are_remembered_only_for_combinations_that_passed(monkeypatch):
    from objbench.algos import policy as P

    mask = torch.ones(2, 3, dtype=torch.bool)
    lp, old, adv = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2)
    calls = []
    real = P._check_choices
    monkeypatch.setattr(P, "_check_choices", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(P, "_CHECKED", {})
    for _ in range(3):
        algos.policy_loss(lp, old, adv, mask, eps_low=0.1)
    assert len(calls) == 1  # checked once, remembered
    for _ in range(2):  # a failing combination raises every time: never remembered
        with pytest.raises(ValueError, match="eps_low"):
            algos.policy_loss(lp, old, adv, mask, eps_low=1.5)
    with pytest.raises(ValueError, match="tau_pos"):  # an option the surrogate does not read
        algos.policy_loss(lp, old, adv, mask, tau_pos=2.0)
    with pytest.raises((ValueError, TypeError)):  # unhashable: the checks still run and complain
        algos.policy_loss(lp, old, adv, mask, eps_low=[0.1])
    assert len(calls) == 5


def test_pass_at_k_on_integers_is_the_array_estimator_without_numpy_or_analysis():
    """reward/pass@k is logged every step: the plain-Python path gives the array path's floats exactly, and a
    training process never loads pandas or pyarrow (objbench.analysis) for it (the toy step's regression after
    a0f9202: +85 MB RSS and ~2 ms a step of NumPy scalar operations)."""
    import subprocess
    import sys

    import numpy as np

    from objbench.envs.passk import pass_at_k, pass_at_k_int

    for n in range(1, 65):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k_int(n, c, k) == pass_at_k(np.int64(n), c, k) == pass_at_k(n, c, k), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k_int(4, 5, 2)
    code = ("import sys; from objbench.experiments.run import step_metrics as m, train; "
            "m.group_pass_at_k([1, 0, 0, 1, 1, 1, 0, 0], [4, 4]); "
            "print(sorted({'pandas', 'pyarrow'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
