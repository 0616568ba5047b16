import json
import random
from pathlib import Path

import pytest
import yaml

from objbench.envs import make_task, task_spec
from objbench.envs.dataset import (
    DatasetConfig,
    DatasetTask,
    synthetic_gsm8k_rows,
    synthetic_math_rows,
    synthetic_verl_rows,
    write_rows,
    write_synthetic_gsm8k,
    write_synthetic_math,
    write_synthetic_verl,
)

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module", autouse=True)
def private_datasets_cache(tmp_path_factory):
    """Keep the Arrow caches of the many small test files out of the user's ~/.cache/huggingface."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets_cache")))
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    paths = {
        "gsm8k": d / "gsm8k.jsonl",
        "gsm8k_levels": d / "gsm8k_levels.jsonl",
        "gsm8k_test": d / "gsm8k_test.jsonl",
        "math": d / "math.jsonl",
        "verl": d / "verl.parquet",
    }
    write_synthetic_gsm8k(str(paths["gsm8k"]), 40, seed=0)
    write_synthetic_gsm8k(str(paths["gsm8k_levels"]), 30, seed=1, difficulty=True)
    write_synthetic_gsm8k(str(paths["gsm8k_test"]), 10, seed=2)
    write_synthetic_math(str(paths["math"]), 30, seed=0)
    write_synthetic_verl(str(paths["verl"]), 30, seed=0)
    for suffix in ("csv", "parquet", "json"):  # the same rows as gsm8k.jsonl in the other file types
        paths[f"gsm8k_{suffix}"] = d / f"gsm8k.{suffix}"
        write_synthetic_gsm8k(str(paths[f"gsm8k_{suffix}"]), 40, seed=0)
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def gsm8k(files):
    return make_task("dataset", path=files["gsm8k"], eval_size=8)


# ------------------------------------------------------------------------------------------------ the formats


def test_gsm8k_problems_and_sft_targets(gsm8k, files):
    rows = [json.loads(line) for line in open(files["gsm8k"])]
    by_question = {r["question"]: r for r in rows}
    assert gsm8k.n_train == 32 and len(gsm8k.eval_set()) == 8 and gsm8k.difficulties == (0,)
    assert gsm8k.has_sft_targets
    rng = random.Random(0)
    for p in gsm8k.prompts(0, 0, 32) + gsm8k.eval_set():
        row = by_question[p.prompt]
        assert p.answer == row["answer"].split("#### ")[-1]
        assert p.messages == (("user", p.prompt),)
        assert p.chat() == [{"role": "user", "content": p.prompt}]
        assert dict(p.meta)["answer_style"] == "gsm8k"
        target = gsm8k.sft_target(p, rng)
        assert target == row["answer"]
        r = gsm8k.reward(p, target)
        assert (r.reward, r.correct, r.format_ok, r.malformed, r.reason) == (1.0, True, True, False, "correct")


def test_first_synthetic_row_reads_like_gsm8k():
    row = synthetic_gsm8k_rows(1, seed=0)[0]
    assert row["answer"].endswith("\n#### " + row["answer"].split("= ")[-1].split(" ")[0])
    assert row["question"].endswith("?")


@pytest.mark.parametrize("kind", ["gsm8k_csv", "gsm8k_parquet", "gsm8k_json"])
def test_every_file_type_gives_the_same_task(gsm8k, files, kind):
    other = make_task("dataset", path=files[kind], eval_size=8)
    assert other.eval_set() == gsm8k.eval_set()
    assert other.prompts(3, 0, 50) == gsm8k.prompts(3, 0, 50)


def test_math_format_levels_and_symbolic_answers(files):
    task = make_task("dataset", path=files["math"], format="math", eval_fraction=0.2)
    assert task.difficulties == (1, 2, 3)  # "Level k"
    assert task.config.answer_style == "boxed"
    eval_set = task.eval_set()
    assert len(eval_set) == 6
    order = [p.difficulty for p in eval_set]
    assert order[: len(set(order))] == sorted(set(order))  # round-robin over difficulties: prefixes are balanced
    problems = task.prompts(0, 0, task.n_train) + eval_set
    for p in problems:
        r = task.reward(p, task.sft_target(p, random.Random(0)))
        assert r.correct and r.reason == "correct"
    sqrt = next(p for p in problems if "sqrt" in p.answer)  # e.g. "3\sqrt{5}"
    k, m = sqrt.answer.replace("}", "").split("\\sqrt{")
    unsimplified = f"\\boxed{{\\sqrt{{{int(k) ** 2 * int(m)}}}}}"
    assert task.reward(sqrt, unsimplified).reason == "correct"  # through math-verify
    assert task.reward(sqrt, f"\\boxed{{{k}\\sqrt{{{int(m) + 1}}}}}").reason == "wrong"


def test_verl_parquet_with_nested_columns(files):
    task = make_task("dataset", path=files["verl"], format="verl", eval_size=5,
                     system_prompt="You are careful.", instruction="Be brief.")
    assert task.config.answer_column == "reward_model.ground_truth"
    assert task.config.messages_column == "prompt" and task.config.prompt_column is None
    assert task.config.answer_style is None  # per row, from data_source
    rows = synthetic_verl_rows(30, seed=0)
    p = task.problem_at(0, 0)
    meta = dict(p.meta)
    row = rows[meta["row"]]
    assert p.answer == row["reward_model"]["ground_truth"]
    assert p.messages == (("system", "You are careful."), ("user", row["prompt"][0]["content"] + " Be brief."))
    assert p.prompt == row["prompt"][0]["content"] + " Be brief."
    assert meta["data_source"] == "synthetic/gsm8k" and meta["answer_style"] == "gsm8k"
    assert json.loads(meta["extra_info"])["index"] == meta["row"]
    assert task.reward(p, f"Let me think. #### {p.answer}").correct
    assert not task.has_sft_targets
    with pytest.raises(ValueError, match="no SFT targets"):
        task.sft_target(p, random.Random(0))


def test_verl_row_with_own_system_message_keeps_it(tmp_path):
    rows = synthetic_verl_rows(6, seed=0)
    rows[0]["prompt"] = [{"role": "system", "content": "Own."}] + rows[0]["prompt"]
    rows[1]["data_source"] = "lighteval/MATH"
    rows[1]["reward_model"]["ground_truth"] = "\\frac{1}{2}"
    path = str(tmp_path / "v.jsonl")
    write_rows(path, rows)
    task = make_task("dataset", path=path, format="verl", eval_size=1, split_seed=3, system_prompt="Default.")
    problems = {dict(p.meta)["row"]: p for p in task.prompts(0, 0, task.n_train) + task.eval_set()}
    assert problems[0].messages[0] == ("system", "Own.")
    assert problems[2].messages[0] == ("system", "Default.")
    assert dict(problems[1].meta)["answer_style"] == "boxed"  # verl's dispatch on data_source
    assert task.reward(problems[1], "so \\boxed{0.5}").correct


def test_columns_format_and_overrides(tmp_path):
    path = str(tmp_path / "qa.csv")
    write_rows(path, [{"q": f"What is {i} plus {i}?", "final": 2 * i, "hard": i % 2} for i in range(10)])
    task = make_task("dataset", path=path, format="columns", prompt_column="q", answer_column="final",
                     difficulty_column="hard", answer_style="last_number", eval_size=2, instruction="Answer:")
    assert task.difficulties == (0, 1)
    p = task.problem_at(0, 0)
    assert p.prompt.endswith("? Answer:") and p.answer == str(2 * int(p.prompt.split()[2]))  # CSV ints -> text
    assert task.reward(p, f"it is {p.answer}").correct
    assert not task.has_sft_targets
    # gsm8k layout under other column names
    path = str(tmp_path / "renamed.jsonl")
    write_rows(path, [{"input": r["question"], "output": r["answer"]} for r in synthetic_gsm8k_rows(10, 0)])
    renamed = make_task("dataset", path=path, prompt_column="input", answer_column="output", eval_size=2,
                        system_prompt="Think.")
    q = renamed.problem_at(0, 0)
    assert q.messages == (("system", "Think."), ("user", q.prompt))
    assert renamed.sft_target(q, random.Random(0)).endswith("#### " + q.answer)


def test_columns_format_with_messages(tmp_path):
    path = str(tmp_path / "chat.jsonl")
    write_rows(path, [{"msgs": [{"role": "user", "content": f"{i} + 1 = ?"}], "gt": str(i + 1)} for i in range(6)])
    # answer_style is now required for plain answers (it used to default to "boxed")
    task = make_task("dataset", path=path, format="columns", messages_column="msgs", answer_column="gt",
                     eval_size=1, answer_style="boxed")
    p = task.problem_at(0, 0)
    assert p.messages == (("user", p.prompt),) and task.reward(p, f"\\boxed{{{p.answer}}}").correct


def test_columns_format_needs_an_answer_style_unless_the_answers_show_it(tmp_path):
    path = str(tmp_path / "plain.jsonl")
    write_rows(path, [{"q": f"{i} + 1 = ?", "a": str(i + 1)} for i in range(6)])
    with pytest.raises(ValueError, match=r"plain.jsonl: format 'columns' needs answer_style.*gsm8k, boxed, last_n"):
        make_task("dataset", path=path, format="columns", prompt_column="q", answer_column="a", eval_size=1)
    # one answer without the marker: no style shown
    mixed = str(tmp_path / "mixed.jsonl")
    write_rows(mixed, [{"q": f"{i} + 1 = ?", "a": f"#### {i + 1}" if i else "1"} for i in range(6)])
    with pytest.raises(ValueError, match="needs answer_style"):
        make_task("dataset", path=mixed, format="columns", prompt_column="q", answer_column="a", eval_size=1)
    # every answer shows "####": gsm8k, stored in the config; the final answer is the ground truth
    marked = str(tmp_path / "marked.jsonl")
    write_rows(marked, [{"q": f"{i} + 1 = ?", "a": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(6)])
    task = make_task("dataset", path=marked, format="columns", prompt_column="q", answer_column="a", eval_size=1)
    assert task.config.answer_style == "gsm8k" and task_spec(task)["answer_style"] == "gsm8k"
    p = task.problem_at(0, 0)
    assert p.answer == str(int(p.prompt.split()[0]) + 1) and task.reward(p, f"so #### {p.answer}").correct
    assert make_task(**task_spec(task)).problem_at(0, 0) == p
    boxed = str(tmp_path / "boxed.jsonl")
    write_rows(boxed, [{"q": f"{i} + 2 = ?", "a": f"It is \\boxed{{{i + 2}}}."} for i in range(6)])
    task = make_task("dataset", path=boxed, format="columns", prompt_column="q", answer_column="a", eval_size=1)
    assert task.config.answer_style == "boxed" and task.problem_at(0, 0).answer.isdigit()


# -------------------------------------------------------------------------------------- held-out sets, streams


def test_seeded_split_is_disjoint_deterministic_and_seed_free(files):
    a = make_task("dataset", path=files["gsm8k"], eval_size=8)
    b = make_task("dataset", path=files["gsm8k"], eval_size=8)
    assert a.eval_set() == b.eval_set()
    held = {p.prompt for p in a.eval_set()}
    for seed in (0, 1, 7):  # the data seed never touches the eval set
        train = {p.prompt for p in a.prompts(seed, 0, 3 * a.n_train)}
        assert len(train) == a.n_train and not train & held
        assert not any(a.is_held_out(p) for p in a.prompts(seed, 0, 40))
    assert all(a.is_held_out(p) for p in a.eval_set())
    other = make_task("dataset", path=files["gsm8k"], eval_size=8, split_seed=1)
    assert {p.prompt for p in other.eval_set()} != held
    frac = make_task("dataset", path=files["gsm8k"], eval_fraction=0.2)
    assert len(frac.eval_set()) == 8 and frac.eval_set() == a.eval_set()  # same permutation, same count
    default = make_task("dataset", path=files["gsm8k"])  # nothing set: a seeded 10% (4 of 40 rows)
    assert default.n_eval == 4
    assert {p.prompt for p in default.eval_set()} <= held and default.n_train == 36


def test_held_out_file(files, tmp_path):
    task = make_task("dataset", path=files["gsm8k"], eval_path=files["gsm8k_test"])
    assert task.n_train == 40 and len(task.eval_set()) == 10 and task.n_overlap_dropped == 0
    test_rows = [json.loads(line) for line in open(files["gsm8k_test"])]
    assert [p.prompt for p in task.eval_set()] == [r["question"] for r in test_rows]  # file order
    # a training row that is also in the held-out file is dropped from training
    train_rows = [json.loads(line) for line in open(files["gsm8k"])]
    leaky = str(tmp_path / "leaky.jsonl")
    write_rows(leaky, train_rows + test_rows[:3])
    leak = make_task("dataset", path=leaky, eval_path=files["gsm8k_test"])
    assert leak.n_train == 40 and leak.n_overlap_dropped == 3
    assert not {p.prompt for p in leak.prompts(0, 0, 40)} & {p.prompt for p in leak.eval_set()}
    # eval_size with eval_path: a seeded sample of the held-out file
    sample = make_task("dataset", path=files["gsm8k"], eval_path=files["gsm8k_test"], eval_size=4)
    assert len(sample.eval_set()) == 4 and {p.prompt for p in sample.eval_set()} <= {r["question"] for r in test_rows}


def test_problem_at_is_a_pure_function_with_seeded_epochs(gsm8k, files):
    n = gsm8k.n_train
    first = [gsm8k.problem_at(3, i) for i in range(2 * n + 5)]
    again = [gsm8k.problem_at(3, i) for i in reversed(range(2 * n + 5))][::-1]
    fresh = make_task("dataset", path=files["gsm8k"], eval_size=8)
    assert first == again == [fresh.problem_at(3, i) for i in range(2 * n + 5)]
    epoch0, epoch1 = [p.prompt for p in first[:n]], [p.prompt for p in first[n : 2 * n]]
    assert len(set(epoch0)) == n and set(epoch0) == set(epoch1)  # every training row once per epoch
    assert epoch0 != epoch1  # reshuffled per epoch
    assert epoch0 != [gsm8k.problem_at(4, i).prompt for i in range(n)]
    assert len({p.uid for p in first}) == len(first)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="index"):
            gsm8k.problem_at(0, bad)


def test_difficulty_column(files, tmp_path):
    task = make_task("dataset", path=files["gsm8k_levels"], eval_size=6)  # "level" column, found by the preset
    assert task.difficulties == (1, 2, 3)
    order = [p.difficulty for p in task.eval_set()]
    assert order[: len(set(order))] == sorted(set(order))  # round-robin over difficulties
    levels = {json.loads(line)["question"]: json.loads(line)["level"] for line in open(files["gsm8k_levels"])}
    assert all(p.difficulty == levels[p.prompt] for p in task.prompts(0, 0, 24))
    none = make_task("dataset", path=files["gsm8k_levels"], eval_size=6, difficulty_column="")
    assert none.difficulties == (0,)


# ------------------------------------------------------------------------------------------------ rewards


def test_reward_cases(gsm8k):
    p = gsm8k.problem_at(0, 0)
    right, wrong = f"so #### {p.answer}", f"so #### {int(p.answer) + 1}"

    def fields(r):
        return (r.reward, r.correct, r.format_ok, r.malformed, r.reason)

    assert fields(gsm8k.reward(p, right)) == (1.0, True, True, False, "correct")
    assert fields(gsm8k.reward(p, wrong)) == (0.0, False, True, False, "wrong")
    assert fields(gsm8k.reward(p, right, truncated=True)) == (0.0, False, False, False, "truncated")
    assert fields(gsm8k.reward(p, "no idea")) == (0.0, False, False, True, "unparseable")
    assert fields(gsm8k.reward(p, "x" * 40_000)) == (0.0, False, False, True, "too_long")
    assert fields(gsm8k.reward(p, None)) == (0.0, False, False, True, "unparseable")
    shaped = make_task("dataset", path=gsm8k.config.path, eval_size=8, format_reward=0.1)
    assert fields(shaped.reward(p, wrong)) == (0.1, False, True, False, "wrong")
    assert fields(shaped.reward(p, wrong, truncated=True)) == (0.0, False, False, False, "truncated")


def test_lengths(gsm8k, files):
    longest = max(len(p.prompt) for p in gsm8k.prompts(0, 0, gsm8k.n_train) + gsm8k.eval_set())
    assert gsm8k.max_prompt_len() == longest
    assert gsm8k.max_response_len() == 256
    assert make_task("dataset", path=files["gsm8k"], eval_size=8, max_response_tokens=512).max_response_len() == 512
    with_system = make_task("dataset", path=files["gsm8k"], eval_size=8, system_prompt="S" * 1000)
    assert with_system.max_prompt_len() == longest + 1000


def test_task_spec_round_trips(files):
    for task in (make_task("dataset", path=files["verl"], format="verl", eval_size=5, timeout_s=2),
                 make_task("dataset", path=files["math"], format="math", eval_fraction=0.1, instruction="Box it.")):
        spec = task_spec(task)
        assert spec["name"] == "dataset"
        for text in (yaml.safe_dump(spec), json.dumps(spec)):
            loaded = yaml.safe_load(text)
            assert loaded == spec
            again = make_task(**loaded)
            assert again.config == task.config
            assert again.prompts(1, 0, 10) == task.prompts(1, 0, 10) and again.eval_set() == task.eval_set()


def test_synthetic_writers_are_deterministic(tmp_path):
    for write in (write_synthetic_gsm8k, write_synthetic_math, write_synthetic_verl):
        a, b, c = (str(tmp_path / f"{write.__name__}{k}.jsonl") for k in "abc")
        write(a, 20, 5)
        write(b, 20, 5)
        write(c, 20, 6)
        assert Path(a).read_bytes() == Path(b).read_bytes() != Path(c).read_bytes()
    assert len({r["problem"] for r in synthetic_math_rows(60, 0)}) == 60


# ---------------------------------------------------------------------------------------------- bad inputs


def _write(path: Path, content) -> str:
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, list):
        write_rows(str(path), content)
    else:
        path.write_text(content)
    return str(path)


GOOD = {"question": "Tom has 3 apples. How many?", "answer": "Tom has 3.\n#### 3"}
GOOD2 = {"question": "Ana has 5 pens. How many?", "answer": "Ana has 5.\n#### 5"}


@pytest.mark.parametrize(
    "name, content, settings, message",
    [
        ("missing.jsonl", None, {}, "file not found"),
        ("empty.jsonl", "", {}, "empty file"),
        ("zero.json", "[]", {}, "no rows"),
        ("header_only.csv", "question,answer\n", {}, "no rows|could not be read"),
        ("syntax.jsonl", '{"question": "q", "answer": "#### 1"}\n{"question": \n', {}, "line 2"),
        ("latin1.jsonl", b'{"question": "caf\xe9?", "answer": "#### 1"}\n', {}, "not valid UTF-8 \\(line 1"),
        ("cols.jsonl", [{"q": "a?", "answer": "#### 1"}], {}, "no column 'question'.*columns present: q, answer"),
        ("nested.jsonl", [{"question": "a?", "rm": {"x": 1}}], {"answer_column": "rm.ground_truth"},
         "row 0: column 'rm' has no 'ground_truth'"),
        ("marker.jsonl", [GOOD, {"question": "b?", "answer": "42"}], {}, "row 1: gsm8k answer has no '####'"),
        ("after.jsonl", [GOOD, {"question": "b?", "answer": "so ####   "}], {},
         "row 1: gsm8k answer has nothing after"),
        ("type.jsonl", [GOOD, {"question": "b?", "answer": ["#### 1"]}], {}, "row 1: answer .* must be a string"),
        ("prompt_type.jsonl", [GOOD, {"question": 7, "answer": "#### 7"}], {}, "row 1: prompt .* must be a string"),
        ("empty_prompt.jsonl", [GOOD, {"question": "  ", "answer": "#### 1"}], {}, "row 1: prompt .* is empty"),
        ("dup.jsonl", [GOOD, GOOD2, {"question": GOOD["question"], "answer": "#### 4"}], {},
         "rows 0 and 2 have the same prompt but different answers"),
        ("math.jsonl", [{"problem": "p?", "solution": "it is 3"}], {"format": "math"}, "row 0: math solution has no"),
        ("level.jsonl", [{**GOOD, "level": "Level ?"}, {**GOOD2, "level": "Level 2"}], {},
         "row 0: difficulty 'Level \\?' in column 'level'"),
        ("verl_msgs.jsonl", [{"prompt": "just text", "reward_model": {"ground_truth": "1"}}], {"format": "verl"},
         "row 0: messages .* must be a non-empty list"),
        ("verl_role.jsonl", [{"prompt": [{"content": "hi"}], "reward_model": {"ground_truth": "1"}}],
         {"format": "verl"}, "row 0: messages .* each message must be"),
        ("verl_user.jsonl", [{"prompt": [{"role": "system", "content": "hi"}], "reward_model": {"ground_truth": "1"}}],
         {"format": "verl"}, "row 0: messages .* has no non-empty user message"),
        ("verl_gt.jsonl", [{"prompt": [{"role": "user", "content": "hi"}], "reward_model": {"ground_truth": None}}],
         {"format": "verl"}, "row 0: answer .* must be a string or a number"),
        ("all_held.jsonl", [GOOD, GOOD2], {"eval_size": 2}, "leaves no training rows"),
        ("data.txt", "question,answer\n", {}, "unsupported file type '.txt'"),
    ],
)
def test_bad_inputs_name_the_file_and_the_problem(tmp_path, name, content, settings, message):
    path = tmp_path / name
    if content is not None:
        _write(path, content)
    settings = {"eval_size": 1, **settings}
    with pytest.raises(ValueError, match=message) as info:
        make_task("dataset", path=str(path), **settings)
    assert str(path) in str(info.value)


def test_duplicates_with_the_same_answer_are_dropped(tmp_path):
    third = {"question": "Li has 2 cups. How many?", "answer": "#### 2"}
    path = _write(tmp_path / "d.jsonl", [GOOD, GOOD2, GOOD, third])
    task = make_task("dataset", path=path, eval_size=1)
    assert task.n_duplicates == 1 and task.n_train + len(task.eval_set()) == 3


def test_held_out_file_covering_all_training_rows(tmp_path):
    path = _write(tmp_path / "t.jsonl", [GOOD, GOOD2])
    with pytest.raises(ValueError, match="every training row's prompt is in the held-out file") as info:
        make_task("dataset", path=path, eval_path=path)
    assert path in str(info.value)


def test_directory_and_hub_names(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="is a directory"):
        make_task("dataset", path=str(tmp_path), eval_size=1)
    # A name that is not a local file goes to the hub; offline, the error names it (fast: offline mode).
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="hub data set 'nobody-xyz/no-such-set'.*could not be loaded.*offline"):
        make_task("dataset", path="nobody-xyz/no-such-set", eval_size=1)


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"path": ""}, "path"),
        ({"format": "alpaca"}, "format"),
        ({"answer_style": "latex"}, "answer_style"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"eval_fraction": 0.1, "eval_size": 3}, "eval_fraction"),
        ({"eval_size": -1}, "eval_size"),
        ({"messages_column": "msgs"}, "messages_column"),
        ({"format": "columns"}, "answer_column"),
        ({"format": "columns", "answer_column": "a"}, "exactly one of prompt_column and messages_column"),
        ({"format": "verl", "prompt_column": "q"}, "prompt_column"),
        ({"prompt_column": ""}, "prompt_column"),
        ({"difficulty_column": 3}, "difficulty_column"),
        ({"format_reward": 1.0}, "format_reward"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_response_tokens": 0}, "max_response_tokens"),
        ({"max_completion_chars": 0}, "max_completion_chars"),
        ({"split_seed": -1}, "split_seed"),
        ({"instruction": None}, "instruction"),
    ],
)
def test_invalid_settings_name_the_field(settings, field):
    settings = {"path": "x.jsonl", "eval_size": 1, **settings}
    with pytest.raises(ValueError, match=field):
        DatasetConfig(**settings)


def test_task_needs_a_config():
    with pytest.raises(ValueError, match="DatasetConfig"):
        DatasetTask(None)
    with pytest.raises(ValueError, match="path"):
        make_task("dataset")
