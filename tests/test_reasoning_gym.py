"""The reasoning_gym task: seeded streams, held-out set, difficulty buckets, answer formats, and the isolation of
reasoning-gym's scorers (scrubbed worker process, timeouts, the UNSAFE_SCORERS audit). One task and one worker
are shared by the module (the worker is per process); the whole file takes ~15-25 s on 2 cores."""

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from objbench import envs
from objbench.envs import make_task, task_spec
from objbench.envs import reasoning_gym as R
from objbench.envs import rg_scorer

rg = pytest.importorskip("reasoning_gym")

SLACK_S = 1.5  # a call may exceed its timeout by this much (kill, replacement fork, a loaded 2-core machine)
HOSTILE = [
    "__import__('os').system('touch PWNED')",
    "9**9**9",
    "open('/etc/passwd').read()",
    "(lambda: [x for x in iter(int, 1)])()",
    "x" * (1 << 20),  # 1 MB: over max_completion_chars
    "(" * 20_000 + ")" * 20_000,
    "[" * 5_000 + "]" * 5_000,
    "1\x002\x00",
    "\ud800\udfff\ud83d 42",
    "<answer>" * 3_000,
    "</answer><answer>" * 2_000,
    "",
    "   ",
    "-0",
    "1" * 5_000,
    "١٢٣",  # Arabic-Indic digits
    "\x1b[2J\r\n\t",
    "\\boxed{\\boxed{\\boxed{",
    "{'a': 1}",
    "import os; os.remove('x')",
]


@pytest.fixture(scope="module")
def task():
    return make_task("reasoning_gym", dataset="basic_arithmetic", difficulty_key="num_terms",
                     answer_format="last_number", eval_size=60, scorer_timeout_s=1.0)


def _wrap(answer: str, fmt: str) -> str:
    return {"answer_tag": f"Let me think.\n<answer>{answer}</answer>", "last_number": f"So it is {answer}",
            "full": f" {answer}. "}[fmt]


# ------------------------------------------------------------------------------------------ construction, stream


def test_registered_and_spec_round_trip(task):
    assert "reasoning_gym" in envs.TASKS and envs.ReasoningGymConfig is R.ReasoningGymConfig
    spec = task_spec(task)
    assert spec["dataset"] == "basic_arithmetic" and spec["dataset_args"] == {}
    assert spec["instruction"] == "Reply with just the number." and spec["allow_unsafe_scorer"] is False
    json.dumps(spec)
    again = make_task(**spec)
    assert again.config == task.config and again.eval_set() == task.eval_set()
    assert again.problem_at(3, 17) == task.problem_at(3, 17)


def test_stream_is_deterministic_and_seeded(task):
    first = [task.problem_at(0, i) for i in (0, 1, 2, 9_999, 10_000, 25_001)]  # crosses chunk boundaries
    fresh = make_task(**task_spec(task))
    assert [fresh.problem_at(0, i) for i in (25_001, 10_000, 9_999, 2, 1, 0)] == first[::-1]  # any call order
    assert task.prompts(0, 0, 3) == first[:3]
    other = task.prompts(1, 0, 20)
    assert [p.prompt for p in other] != [p.prompt for p in task.prompts(0, 0, 20)]
    assert len({p.prompt for p in task.prompts(0, 0, 50)}) > 40  # chunks are not reasoning-gym's seed + 1 overlap
    p = first[0]
    assert p.uid == "reasoning_gym:train:0:0" and p.messages == (("user", p.prompt),)
    assert p.prompt.endswith(" Reply with just the number.")
    meta = dict(p.meta)
    assert meta["split"] == "train" and meta["rg_size"] == R.CHUNK_SIZE and meta["rg_index"] == 0
    # the entry is reasoning-gym's own entry for the recorded (seed, size, index)
    entry = rg.create_dataset("basic_arithmetic", seed=meta["rg_seed"], size=meta["rg_size"])[0]
    assert p.prompt.startswith(entry["question"]) and p.answer == entry["answer"]
    with pytest.raises(ValueError, match="seed"):
        task.problem_at(-1, 0)


def test_eval_set_is_fixed_balanced_and_disjoint_from_training(task):
    ev = task.eval_set()
    assert len(ev) == 60 and ev == task.eval_set() and ev[0].uid == "reasoning_gym:eval:0000"
    assert task.difficulties == (2, 3, 4, 5, 6)  # num_terms of basic_arithmetic's defaults
    assert [p.difficulty for p in ev[:10]] == [2, 3, 4, 5, 6] * 2  # round-robin: every prefix balanced
    assert all(task.is_held_out(p) for p in ev)
    held = {p.prompt for p in ev}
    train = [p for seed in (0, 1) for p in task.prompts(seed, 0, 150)]
    assert not held & {p.prompt for p in train} and not any(task.is_held_out(p) for p in train)
    other = make_task(**{**task_spec(task), "eval_seed": 1})
    assert {p.prompt for p in other.eval_set()} != held


def test_training_redraws_held_out_questions_in_a_small_space():
    # 1-digit a + b: 100 questions, 30 of them held out, so ~30% of the raw draws hit the held-out set
    small = make_task("reasoning_gym", dataset="basic_arithmetic", eval_size=30, answer_format="full",
                      dataset_args={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                    "operators": ["+"], "allow_parentheses": False, "allow_negation": False})
    held = {p.prompt for p in small.eval_set()}
    train = small.prompts(0, 0, 300)
    assert not held & {p.prompt for p in train}
    assert sum(dict(p.meta)["rg_seed"] != dict(train[0].meta)["rg_seed"] for p in train) > 30  # redraws happened
    assert train == small.prompts(0, 0, 300)
    with pytest.raises(ValueError, match="distinct questions"):
        make_task(**{**task_spec(small), "eval_size": 150})


def test_difficulty_key_must_name_an_integer_field():
    one = make_task("reasoning_gym", dataset="chain_sum", eval_size=5)
    assert one.difficulties == (0,)
    with pytest.raises(ValueError, match=r"difficulty_key 'level' is missing.*integer metadata fields: .*num_terms"):
        make_task("reasoning_gym", dataset="chain_sum", eval_size=5, difficulty_key="level")
    with pytest.raises(ValueError, match="difficulty_key 'expression' is '.*', not an integer"):
        make_task("reasoning_gym", dataset="chain_sum", eval_size=5, difficulty_key="expression")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dataset": ""}, "dataset"),
        ({"dataset": "no_such_set"}, r"unknown reasoning-gym data set 'no_such_set'; valid: .*basic_arithmetic"),
        ({"dataset": "composite"}, "task.name=mixture"),
        ({"dataset_args": {"seed": 3}}, r"dataset_args may not set \['seed'\]"),
        ({"dataset_args": {"max_termz": 3}}, r"not valid for reasoning-gym data set 'basic_arithmetic'.*max_terms"),
        ({"dataset_args": [1]}, "dataset_args must be a mapping"),
        ({"dataset_args": {"max_terms:3": None}}, "write a space after the colon"),
        ({"answer_format": "boxed"}, "answer_format must be one of"),
        ({"scorer_timeout_s": 0}, "scorer_timeout_s"),
        ({"eval_size": 0}, "eval_size"),
        ({"allow_unsafe_scorer": "yes"}, "allow_unsafe_scorer"),
    ],
)
def test_invalid_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_task("reasoning_gym", **{"dataset": "basic_arithmetic", "eval_size": 5, **kwargs})


def test_last_number_needs_numeric_answers():
    with pytest.raises(ValueError, match="'last_number' needs answers that are one number.*'answer_tag' or 'full'"):
        make_task("reasoning_gym", dataset="spell_backward", eval_size=5, answer_format="last_number")


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[real\]"'):
        make_task("reasoning_gym", dataset="basic_arithmetic")


def test_nondeterministic_sets_are_refused():
    with pytest.raises(ValueError, match="'list_functions' is not supported: .*global random state"):
        make_task("reasoning_gym", dataset="list_functions", eval_size=5)


def test_hash_seed_dependent_sets_need_a_fixed_hash_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match="'word_ladder'.*PYTHONHASHSEED"):
        make_task("reasoning_gym", dataset="word_ladder", eval_size=5)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert make_task("reasoning_gym", dataset="word_ladder", eval_size=5, answer_format="full").difficulties == (0,)
    assert R.scorer_env("/x")["PYTHONHASHSEED"] == "0"  # and the worker gets the same


# --------------------------------------------------------------------------------------------- answers, rewards


@pytest.mark.parametrize("fmt", R.ANSWER_FORMATS)
def test_reward_correct_wrong_unparseable_per_format(task, fmt):
    t = make_task(**{**task_spec(task), "answer_format": fmt, "instruction": None})
    assert t.config.instruction == R.DEFAULT_INSTRUCTIONS[fmt]
    p = t.problem_at(0, 5)
    wrong = str(int(p.answer) + 1)
    cases = {
        _wrap(p.answer, fmt): ("correct", 1.0),
        _wrap(wrong, fmt): ("wrong", 0.0),
        {"answer_tag": "I think it is 5", "last_number": "no idea", "full": "  "}[fmt]: ("unparseable", 0.0),
    }
    for completion, (reason, reward) in cases.items():
        r = t.reward(p, completion)
        assert (r.reason, r.reward, r.correct) == (reason, reward, reason == "correct"), completion
        assert r.malformed == (reason == "unparseable") and r.format_ok == (reason != "unparseable")
    r = t.reward(p, _wrap(p.answer, fmt), truncated=True)
    assert (r.reason, r.reward, r.correct, r.malformed) == ("truncated", 0.0, False, False)
    r = t.reward(p, "9" * (t.config.max_completion_chars + 1))
    assert (r.reason, r.malformed) == ("too_long", True)
    assert t.reward(p, t.sft_target(p, random.Random(0))).correct


def test_extraction_rules():
    ex = R.extract_answer
    assert ex("<answer> a <answer>b</answer> c </answer>", "answer_tag") == "b"  # the last well-formed pair
    assert ex("<answer>a <answer>b</answer>", "answer_tag") == "b"  # reasoning-gym's regex: "a <answer>b"
    assert ex("<answer>1</answer> then <answer> 2 </answer>", "answer_tag") == "2"
    assert ex("<answer>1", "answer_tag") is None and ex("</answer><answer>", "answer_tag") is None
    assert ex("x = -3, then 7.", "last_number") == "7" and ex("a-3", "last_number") == "3"
    assert ex(" The cat sat. ", "full") == "The cat sat"
    assert ex("The cat sat.", "full", "The cat sat.") == "The cat sat."  # the reference keeps its period
    assert ex(None, "full") is None and ex("", "full") is None
    start = time.perf_counter()
    assert ex("<answer>" * 50_000, "answer_tag") is None  # linear: reasoning-gym's regex is quadratic here
    assert ex("<answer>" + "</answer>" * 50_000, "answer_tag") is None  # empty pair
    assert time.perf_counter() - start < 0.5


def test_partial_credit_is_the_scorers_own():
    t = make_task("reasoning_gym", dataset="chain_sum", eval_size=5, answer_format="full")
    p = t.problem_at(0, 0)
    r = t.reward(p, p.answer + "0000")  # reasoning-gym: len(oracle) / len(answer) when the oracle is inside
    assert r.reason == "wrong" and 0 < r.reward < 1 and not r.correct and r.format_ok
    assert t.reward(p, "+" + p.answer + ".00").correct or p.answer.startswith("-")  # Decimal equality


def test_sft_target_with_chain_of_thought():
    t = make_task("reasoning_gym", dataset="gsm_symbolic", eval_size=5)
    p = t.problem_at(0, 0)
    target = t.sft_target(p, random.Random(0))
    assert target.endswith(f"\n<answer>{p.answer}</answer>") and "####" not in target and len(target) > 60
    assert t.reward(p, target).correct and t.has_sft_targets
    full = make_task("reasoning_gym", dataset="gsm_symbolic", eval_size=5, answer_format="full")
    assert full.sft_target(p, random.Random(0)) == p.answer
    none = make_task("reasoning_gym", dataset="graph_color", eval_size=5)
    assert not none.has_sft_targets
    with pytest.raises(ValueError, match="no reference answers"):
        none.sft_target(none.problem_at(0, 0), random.Random(0))


def test_a_rebuilt_entry_that_differs_is_an_error_not_a_score(task):
    p = task.problem_at(0, 7)
    forged = replace(p, meta=tuple((k, "0" * 16 if k == "qhash" else v) for k, v in p.meta))
    with pytest.warns(UserWarning, match="could not score"):
        r = task.reward(forged, p.answer)
    assert (r.reason, r.reward, r.correct) == ("error", 0.0, False)
    assert task.reward(p, p.answer).correct


# --------------------------------------------------------------------------------------------- scorer isolation


def test_unsafe_scorers_are_refused_unless_allowed():
    with pytest.raises(ValueError, match=r"'spiral_matrix' is refused.*task\.allow_unsafe_scorer=true"):
        make_task("reasoning_gym", dataset="spiral_matrix", eval_size=5)
    t = make_task("reasoning_gym", dataset="spiral_matrix", eval_size=5, answer_format="full",
                  allow_unsafe_scorer=True)
    assert t.unsafe_scorer is True
    assert make_task("reasoning_gym", dataset="chain_sum", eval_size=5).unsafe_scorer is False


def test_unsafe_scorers_list_is_complete_for_the_installed_version():
    """Scan every registered data set's scorer (and what it calls) in the installed reasoning-gym source."""
    from reasoning_gym.factory import DATASETS

    flagged = {name: R.scorer_sinks(cls) for name, (cls, _) in DATASETS.items()}
    flagged = {name: sinks for name, sinks in flagged.items() if sinks}
    # The scanner is not vacuous: it finds the eval() and parse_expr() calls known from reading the source.
    for name in ("string_insertion", "spiral_matrix", "binary_matrix", "countdown", "simple_integration",
                 "intermediate_integration", "polynomial_multiplication"):
        assert name in flagged, name
    assert any("eval()" in s for s in flagged["spiral_matrix"])
    assert any("parse_expr" in s for s in flagged["countdown"])
    if R.installed_version() != R.PINNED_VERSION:
        pytest.skip(f"UNSAFE_SCORERS was derived from {R.PINNED_VERSION}; installed {R.installed_version()}")
    assert set(flagged) - set(R.ORACLE_ONLY_EVAL) == set(R.UNSAFE_SCORERS), flagged
    assert set(R.ORACLE_ONLY_EVAL) <= set(flagged)  # the reviewed exceptions are still what they were


class _Helper:
    @staticmethod
    def parse(text):
        return eval(text)  # the scanner must find this


def _module_level(text):
    return _Helper.parse(text)


class _FakeDataset:
    def score_answer(self, answer, entry):
        return float(_module_level(answer) == entry["answer"])


class _SafeFake:
    def score_answer(self, answer, entry):
        import re

        return float(re.compile(r"\d+").fullmatch(answer or "") is not None)


def test_scanner_follows_calls():
    assert R.scorer_sinks(_FakeDataset) == []  # this module's code is not followed by default
    sinks = R.scorer_sinks(_FakeDataset, follow=(__name__,))
    assert any("_Helper.parse: eval()" in s for s in sinks), sinks  # method -> function -> static method
    assert R.scorer_sinks(_SafeFake, follow=(__name__,)) == []  # re.compile is not the builtin compile


def test_worker_environment_is_scrubbed(monkeypatch, tmp_path):
    monkeypatch.setenv("OBJBENCH_SECRET", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    env = R.scorer_env(str(tmp_path))
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS",
                        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED"}
    assert "hunter2" not in json.dumps(env) and env["PATH"] == os.defpath
    R.stop_worker()  # the next request starts a worker from this (secret-holding) process
    seen = R.probe_worker()
    assert "OBJBENCH_SECRET" not in seen["env"] and "OPENAI_API_KEY" not in seen["env"]
    workdir = R.worker_stats()["workdir"]
    assert seen["env"] == R.scorer_env(workdir) and os.path.realpath(seen["cwd"]) == os.path.realpath(workdir)
    assert seen["pid"] != os.getpid() and seen["limits"]["RLIMIT_AS"][0] == R.WORKER_MEMORY_BYTES
    assert 0 < seen["limits"]["RLIMIT_CPU"][0] < 10_000  # a finite CPU bound
    assert seen["limits"]["RLIMIT_FSIZE"][0] == R.WORKER_FILE_BYTES
    assert not any(p.endswith(os.path.join("main", "envs")) for p in seen["sys_path"])


def test_fuzz_hostile_completions(task, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tmp_path))
    tasks = [make_task(**{**task_spec(task), "answer_format": fmt, "instruction": None}) for fmt in R.ANSWER_FORMATS]
    p = task.problem_at(0, 3)
    times = []
    for t in tasks:
        limit = t.config.scorer_timeout_s + SLACK_S
        for text in HOSTILE + [f"<answer>{h}</answer>" for h in HOSTILE[:10]]:
            start = time.perf_counter()
            r = t.reward(p, text)
            times.append(time.perf_counter() - start)
            assert times[-1] < limit, (t.config.answer_format, text[:40], times[-1])
            assert r.reason in R.REASONS and 0.0 <= r.reward <= 1.0 and not r.correct
    assert set(os.listdir(tmp_path)) == before  # nothing written here
    assert not os.path.exists(os.path.join(R.worker_stats()["workdir"], "PWNED"))  # nothing ran in the worker
    assert task.reward(p, p.answer).correct  # the worker still works


def test_timeout_kills_and_replaces_the_server():
    t = make_task("reasoning_gym", dataset="spiral_matrix", eval_size=5, answer_format="full",
                  allow_unsafe_scorer=True, scorer_timeout_s=0.5)
    p = t.problem_at(0, 0)
    assert t.reward(p, p.answer).correct  # warm: the data set is built in the worker
    restarts = R.worker_stats()["restarts"]
    for hostile in ("9**9**9", "__import__('time').sleep(30)"):
        start = time.perf_counter()
        r = t.reward(p, hostile)
        assert (r.reason, r.reward) == ("timeout", 0.0) and time.perf_counter() - start < 0.5 + SLACK_S
    assert R.worker_stats()["restarts"] == restarts + 2
    start = time.perf_counter()
    assert t.reward(p, t.problem_at(0, 1).answer).reason in ("correct", "wrong")  # the next call works
    assert time.perf_counter() - start < 0.5 + SLACK_S
    r = t.reward(p, "'x' * 10**10")  # over the worker's address space: MemoryError, scored 0, worker survives
    assert (r.reason, r.reward) == ("wrong", 0.0) and R.worker_stats()["restarts"] == restarts + 2


def test_a_worker_that_cannot_start_scores_timeout_and_says_why(task, tmp_path, monkeypatch):
    broken = tmp_path / "worker.py"
    broken.write_text("import sys\nsys.exit('boom: reasoning_gym is not importable here')\n")
    R.stop_worker()
    monkeypatch.setattr(rg_scorer, "_WORKER_PATH", str(broken))  # the scorer worker's job module
    monkeypatch.setattr(rg_scorer._WORKER, "_warned", False)
    p = task.problem_at(0, 11)
    with pytest.warns(UserWarning, match="did not start.*boom: reasoning_gym is not importable"):
        r = task.reward(p, "12345")
    assert (r.reason, r.reward) == ("timeout", 0.0)
    monkeypatch.undo()
    R.stop_worker()
    assert task.reward(p, p.answer).correct  # the real worker starts again


def test_allowed_eval_runs_inside_the_worker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OBJBENCH_SECRET", "hunter2")
    R.stop_worker()  # restart from a process that holds the secret
    t = make_task("reasoning_gym", dataset="string_insertion", eval_size=5, answer_format="full",
                  allow_unsafe_scorer=True)
    p = t.problem_at(0, 0)
    code = "open('PWNED', 'w').write(repr(dict(__import__('os').environ)) + __import__('os').getcwd())"
    r = t.reward(p, code)
    assert r.reason == "wrong" and r.reward == 0.0  # it ran (join of a non-list fails after the write)
    workdir = R.worker_stats()["workdir"]
    with open(os.path.join(workdir, "PWNED")) as f:
        written = f.read()
    assert "hunter2" not in written and "OBJBENCH_SECRET" not in written and workdir in written
    assert not os.path.exists(tmp_path / "PWNED")
    R.stop_worker()
    assert not os.path.exists(workdir)  # the worker's folder goes with it


@pytest.mark.slow
def test_determinism_lists_are_complete():
    """Generate every data set's entries in three fresh processes (~3 min on 2 cores), the process-wide random
    generators reseeded from entropy before each data set as in a fresh process: the sets that differ between two
    runs with one PYTHONHASHSEED are NONDETERMINISTIC; those that differ only under another hash seed are
    HASH_SEED_DEPENDENT."""
    code = (
        "import hashlib, json, random, numpy, reasoning_gym\n"
        "from reasoning_gym.factory import DATASETS\n"
        "out = {}\n"
        "for n in sorted(DATASETS):\n"
        "    if n == 'composite': continue\n"
        "    random.seed(); numpy.random.seed()\n"
        "    es = []\n"
        "    for seed, k in ((123, 30), (98765, 10)):\n"
        "        ds = reasoning_gym.create_dataset(n, seed=seed, size=100)\n"
        "        es += [[e['question'], str(e['answer']), json.dumps(e['metadata'], sort_keys=True, default=str)]\n"
        "               for e in (ds[i] for i in range(k))]\n"
        "    out[n] = hashlib.sha256(json.dumps(es).encode()).hexdigest()\n"
        "print('\\nRESULT', json.dumps(out))\n"  # some generators print too (dots, no newline)
    )
    runs = []
    for hash_seed in ("0", "0", "1"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed}).stdout
        runs.append(json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][7:]))
    a, b, c = runs
    assert sorted(n for n in a if a[n] != b[n]) == sorted(R.NONDETERMINISTIC)
    assert sorted(n for n in a if a[n] == b[n] and a[n] != c[n]) == sorted(R.HASH_SEED_DEPENDENT)
