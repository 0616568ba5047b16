"""A real Hugging Face model folder end to end: a small Qwen2 with a byte-level BPE tokenizer trained in memory
and a chat template (rollout/toy_hf.py), saved with save_pretrained, loaded through AutoModelForCausalLM /
AutoTokenizer exactly as a downloaded model would be. Nothing here uses the character tokenizer."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from objbench.envs import Problem
from objbench.experiments.cli.main import main
from objbench.experiments.config import ConfigError, load_config
from objbench.rollout.bundle import hf_codec, load_hf
from objbench.rollout.toy_hf import CHATML, write_toy_model

FAST = ["train.eval_every=2", "train.eval_samples=2", "train.log_samples=4", "rollout.completions_per_step=16",
        "train.checkpoint_every=2"]


@pytest.fixture(scope="session")
def toy_model(tmp_path_factory) -> Path:
    return write_toy_model(tmp_path_factory.mktemp("models") / "toy-qwen2")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tokenizer_and_ids_come_from_the_folder(toy_model):
    model, codec = load_hf(str(toy_model))
    tok = codec.tokenizer
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert codec.eos_id == tok.convert_tokens_to_ids("<|im_end|>") and codec.pad_id == tok.pad_token_id
    assert codec.bos_id is None and codec.chat
    assert len(tok) == model.config.vocab_size == 512


def test_chat_template_applies_to_messages_only(toy_model):
    _, codec = load_hf(str(toy_model))
    chat = Problem("u", "What is 2+3?", "5", messages=(("user", "What is 2+3?"),))
    plain = Problem("p", "2+3=", "5")
    ids, mask = codec.encode_prompts([chat, plain])
    texts = [codec.tokenizer.decode(r[m].tolist()) for r, m in zip(ids, mask)]
    assert texts[0] == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert texts[1] == "2+3="
    assert mask[1, 0].item() is False and mask[0].all()  # left padding
    no_chat = hf_codec(codec.tokenizer, "none")
    ids2, mask2 = no_chat.encode_prompts([chat])
    assert codec.tokenizer.decode(ids2[0][mask2[0]].tolist()) == "What is 2+3?"


def test_pad_falls_back_to_eos(toy_model, tmp_path):
    _, codec = load_hf(str(toy_model))
    tok = codec.tokenizer
    tok2 = type(tok).from_pretrained(toy_model)
    tok2.pad_token = None
    c = hf_codec(tok2)
    assert c.pad_id == c.eos_id == tok.eos_token_id


def test_train_on_a_model_folder(toy_model, tmp_path, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    rc = main(["train", "--quiet", f"model.path={toy_model}", "task.name=arithmetic", "sft.steps=30",
               "sft.batch_size=16", "train.steps=3", "task.eval_per_difficulty=4", f"out_dir={out}", "name=r",
               *FAST])
    assert rc == 0
    run = out / "r"
    meta = json.loads((run / "meta.json").read_text())
    assert meta["model"]["model_type"] == "qwen2" and meta["special_ids"]["eos"] == 2
    assert meta["sft"]["model_path"] == str(toy_model.resolve())
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/tokens"] > 0 for r in rows)
    samples = _rows(run / "samples.jsonl")
    assert samples and all(isinstance(s["response"], str) for s in samples)
    assert (run / "done").exists() and (run / "checkpoints" / "last" / "policy" / "config.json").is_file()


def test_mixture_task_on_a_model_folder(toy_model, tmp_path, monkeypatch):
    """The difficulty study's mixture task through the folder's BPE tokenizer: per-component metrics and weight
    shares, a warm start with per-component noise."""
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    comps = [{"name": "arithmetic", "ops": "+", "max_digits": 1, "difficulty_weights": {1: 1}, "eval_per_difficulty": 4},
             {"name": "arithmetic", "ops": "*", "max_digits": 1, "difficulty_weights": {1: 1}, "eval_per_difficulty": 4}]
    cfgfile = tmp_path / "mix.json"
    cfgfile.write_text(json.dumps({"task": {"name": "mixture", "components": comps, "sft_noise": [0.0, 0.5]}}))
    out = tmp_path / "runs"
    rc = main(["train", "--quiet", "--config", str(cfgfile), f"model.path={toy_model}", "sft.steps=20",
               "sft.batch_size=16", "train.steps=2", f"out_dir={out}", "name=m", *FAST])
    assert rc == 0
    rows = _rows(out / "m" / "metrics.jsonl")
    assert any("reward/acc_d2" in r for r in rows) and all("adv/weight_share_d1" in r for r in rows)
    assert {"eval/pass@1_d1", "eval/pass@1_d2"} <= set(_rows(out / "m" / "eval.jsonl")[-1])


def test_pretrained_without_sft_starts_from_the_folder_weights(toy_model, tmp_path, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    cfg = load_config(None, [f"model.path={toy_model}", "task.name=arithmetic", f"out_dir={tmp_path}"])
    assert cfg.sft.steps == 0  # unset sft.steps resolves to 0 for a pretrained model
    from objbench.experiments.config import build_task
    from objbench.experiments.run.setup import load_start

    policy, codec, info, ckpt = load_start(cfg, build_task(cfg))
    ref, _ = load_hf(str(toy_model))
    assert info == {"pretrained": str(toy_model.resolve())}
    for (k, a), (_, b) in zip(policy.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k
    assert not (tmp_path / "cache").exists()  # no warm start trained or cached


def _bad_folder(toy_model, tmp_path, name) -> Path:
    d = tmp_path / name
    shutil.copytree(toy_model, d)
    return d


@pytest.mark.parametrize("case", ["no_tokenizer", "vocab_mismatch", "no_weights", "bad_config", "missing",
                                  "hub_offline"])
def test_bad_model_folder_fails_before_any_run_folder(case, toy_model, tmp_path, monkeypatch):
    out = tmp_path / "runs"
    if case == "no_tokenizer":
        d = _bad_folder(toy_model, tmp_path, case)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (d / f).unlink(missing_ok=True)
        expect = "no tokenizer files"
    elif case == "vocab_mismatch":
        d = _bad_folder(toy_model, tmp_path, case)
        c = json.loads((d / "config.json").read_text())
        c["vocab_size"] = 100
        (d / "config.json").write_text(json.dumps(c))
        expect = "512 tokens but the model's embedding has 100 rows"
    elif case == "no_weights":
        d = _bad_folder(toy_model, tmp_path, case)
        (d / "model.safetensors").unlink()
        expect = "no weights"
    elif case == "bad_config":
        d = _bad_folder(toy_model, tmp_path, case)
        (d / "config.json").write_text("{not json")
        expect = "config.json is not valid JSON"
    elif case == "missing":
        d = tmp_path / "nowhere"
        expect = "no such folder"
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        d = "Qwen/Qwen2.5-0.5B-Instruct"
        expect = "HF_HUB_OFFLINE is set"
    with pytest.raises(ConfigError, match=expect) as e:
        load_config(None, [f"model.path={d}", "task.name=arithmetic", f"out_dir={out}"])
    assert str(d) in str(e.value)
    assert main(["train", f"model.path={d}", "task.name=arithmetic", f"out_dir={out}"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("case", ["truncated", "header_cut", "not_safetensors", "missing_shard"])
def test_broken_weights_are_one_line_before_any_run_folder(case, toy_model, tmp_path, capsys):
    """A truncated or unreadable model.safetensors (an interrupted download) is a one-line config error naming the
    file and what is wrong, found from its header (no weights loaded), before any run folder."""
    out = tmp_path / "runs"
    d = _bad_folder(toy_model, tmp_path, case)
    weights = d / "model.safetensors"
    size = weights.stat().st_size
    if case == "truncated":
        os.truncate(weights, size // 2)
        expect = f"model.safetensors is truncated: {size // 2:,} bytes, but its header describes {size:,}"
    elif case == "header_cut":
        os.truncate(weights, 100)
        expect = "model.safetensors is not a readable safetensors file \\(100 bytes; safetensors says: .*header"
    elif case == "not_safetensors":
        weights.write_text("<html>rate limited</html>" * 10)
        expect = "model.safetensors is not a readable safetensors file"
    else:
        weights.rename(d / "model-00001-of-00002.safetensors")
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": names[0], "b": names[1]}}))
        expect = "model.safetensors.index.json names 1 shard file\\(s\\) that are not there " \
                 "\\(model-00002-of-00002.safetensors\\)"
    with pytest.raises(ConfigError, match=expect) as e:
        load_config(None, [f"model.path={d}", "task.name=arithmetic", f"out_dir={out}"])
    assert str(d) in str(e.value) and "\n" not in str(e.value)
    capsys.readouterr()
    assert main(["train", f"model.path={d}", "task.name=arithmetic", f"out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "download or save the model again" in err and "Traceback" not in err, err
    assert not out.exists()


def test_built_in_arch_rejects_a_folder(toy_model):
    with pytest.raises(ConfigError, match="model.path"):
        load_config(None, [f"model.arch={toy_model}"])


def test_verdict_task_is_refused_on_a_model_folder(toy_model, tmp_path):
    # the length study's verdict needs the policy's '=' as a token of its own; a BPE tokenizer may merge it
    with pytest.raises(ConfigError, match="task.verdict needs the built-in character tokenizer"):
        load_config(None, [f"model.path={toy_model}", "task.name=arithmetic", "task.filler_max=4",
                           "task.filler_position=after", "task.verdict=true", f"out_dir={tmp_path}"])
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------------
# data sets on a real model: the command a GPU user types, on CPU


@pytest.fixture(scope="session")
def gsm8k_file(tmp_path_factory) -> Path:
    from objbench.envs.dataset import write_synthetic_gsm8k

    path = tmp_path_factory.mktemp("data") / "gsm8k_train.jsonl"
    write_synthetic_gsm8k(str(path), 120, seed=0)
    return path


SMALL = ["train.steps=2", "task.max_response_tokens=12", "rollout.completions_per_step=8", "objective.group_size=4",
         "train.eval_every=2", "train.eval_samples=2", "train.eval_size=6", "train.log_samples=8"]


def test_gsm8k_file_on_a_model_folder(toy_model, gsm8k_file, tmp_path, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    # exactly the README's command, plus sizes that keep it short
    rc = main(["train", "--quiet", f"model.path={toy_model}", "task.name=dataset", f"task.path={gsm8k_file}",
               "task.format=gsm8k", "sft.steps=0", f"out_dir={out}", "name=g", *SMALL])
    assert rc == 0
    run = out / "g"
    cfg = (run / "config.yaml").read_text()
    assert f"path: {gsm8k_file.resolve()}" in cfg and "format: gsm8k" in cfg
    meta = json.loads((run / "meta.json").read_text())
    assert meta["sft"] == {"pretrained": str(toy_model.resolve())} and meta["chat_template"] is True
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and "reward/acc" in rows[0]
    samples = _rows(run / "samples.jsonl")
    reasons = {s["reason"] for s in samples}
    assert reasons <= {"correct", "wrong", "unparseable", "truncated", "timeout", "too_long"} and reasons
    evals = _rows(run / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2] and "eval/pass@1" in evals[0]


def test_sft_on_the_data_set_solutions_then_rl(toy_model, gsm8k_file, tmp_path, monkeypatch):
    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    args = ["train", "--quiet", f"model.path={toy_model}", "task.name=dataset", f"task.path={gsm8k_file}",
            "task.format=gsm8k", "sft.steps=3", "sft.batch_size=4", "sft.noise=0", f"out_dir={tmp_path / 'runs'}",
            *SMALL]
    assert main([*args, "name=a"]) == 0
    meta = json.loads((tmp_path / "runs" / "a" / "meta.json").read_text())
    assert meta["sft"]["key"]["data"] and meta["sft"]["weights_sha256"]
    assert main([*args, "name=b"]) == 0  # the second run reuses the cached warm start
    assert len(list((tmp_path / "cache" / "sft").glob("*/sft.json"))) == 1


def test_verl_parquet_with_chat_messages(toy_model, tmp_path, monkeypatch):
    from objbench.envs.dataset import write_synthetic_verl
    from objbench.experiments.config import build_task
    from objbench.rollout.bundle import load_hf

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "train.parquet"
    write_synthetic_verl(str(data), 40, seed=0)
    cfg = load_config(None, [f"model.path={toy_model}", "task.name=dataset", f"task.path={data}",
                             "task.format=verl", f"out_dir={tmp_path}"])
    task = build_task(cfg)
    p = task.eval_set()[0]
    assert p.messages
    _, codec = load_hf(str(toy_model))
    ids, mask = codec.encode_prompts([p])
    text = codec.tokenizer.decode(ids[0][mask[0]].tolist())
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert main(["train", "--quiet", f"model.path={toy_model}", "task.name=dataset", f"task.path={data}",
                 "task.format=verl", f"out_dir={tmp_path / 'runs'}", "name=v", *SMALL]) == 0


def test_sweep_of_two_presets_and_its_report(toy_model, gsm8k_file, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    spec = {"name": "real", "seeds": [0], "out_dir": str(tmp_path / "runs"),
            "set": {"model.path": str(toy_model), "task.name": "dataset", "task.path": str(gsm8k_file),
                    "task.format": "gsm8k", **dict(a.split("=", 1) for a in SMALL)},
            "arms": {"grpo": {"objective": "grpo", "objective.group_size": 4},
                     "dr_grpo": {"objective": "dr_grpo", "objective.group_size": 4}}}
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path), "--workers", "1"]) == 0
    sweep_dir = tmp_path / "runs" / "real"
    assert sorted(p.name for p in sweep_dir.iterdir() if (p / "done").exists()) == ["dr_grpo__s0", "grpo__s0"]
    report = (sweep_dir / "report" / "report.md").read_text()
    assert "grpo" in report and "dr_grpo" in report


def test_sweep_trains_a_model_folders_warm_start_before_its_runs(toy_model, tmp_path, monkeypatch):
    """sft.steps > 0 on a model folder through a sweep: the sweep trains each seed's warm start before the runs,
    with no run's codec at hand (it failed with 'NoneType' has no 'encode_prompts' until the folder's own codec
    was loaded there); the run then finds the same start in the cache instead of training its own."""
    import yaml

    from objbench.experiments.config import build_task
    from objbench.experiments.run.warmstart import warm_start

    monkeypatch.setenv("OBJBENCH_CACHE", str(tmp_path / "cache"))
    spec = {"name": "sft", "seeds": [0], "out_dir": str(tmp_path / "runs"),
            "set": {"model.path": str(toy_model), "task.name": "arithmetic", "sft.batch_size": 16,
                    "train.steps": 2, "task.eval_per_difficulty": 2, **dict(a.split("=", 1) for a in FAST)},
            "arms": {"rl_only": {"sft.steps": 0}, "sft_then_rl": {"sft.steps": 6}}}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path), "--workers", "1", "--no-report"]) == 0
    run = tmp_path / "runs" / "sft" / "sft_then_rl__s0"
    assert (run / "done").exists() and (tmp_path / "runs" / "sft" / "rl_only__s0" / "done").exists()
    sft = json.loads((run / "meta.json").read_text())["sft"]
    assert sft["steps"] == 6 and sft["model_path"] == str(toy_model.resolve())
    cfg = load_config(None, [f"model.path={toy_model}", "task.name=arithmetic", "sft.steps=6", "sft.batch_size=16",
                             "task.eval_per_difficulty=2", *FAST, f"out_dir={tmp_path}"])
    _, ckpt, _ = warm_start(cfg, build_task(cfg), load_hf(str(toy_model))[1])  # a run's call, with its codec
    assert str(ckpt) == sft["checkpoint"]  # the start the sweep trained, from the cache


@pytest.mark.parametrize("case", ["missing_column", "empty", "wrong_type", "not_utf8", "no_marker"])
def test_bad_data_file_fails_before_any_run_folder(case, toy_model, tmp_path):
    data = tmp_path / "bad.jsonl"
    if case == "missing_column":
        data.write_text(json.dumps({"q": "1+1?", "answer": "2\n#### 2"}) + "\n")
        expect = "question"
    elif case == "empty":
        data.write_text("")
        expect = "empty|no rows"
    elif case == "wrong_type":
        data.write_text("".join(json.dumps({"question": ["a", "list"], "answer": "x\n#### 1"}) + "\n"
                                for _ in range(3)))
        expect = "question"
    elif case == "not_utf8":
        data.write_bytes(b'{"question": "caf\xe9", "answer": "#### 1"}\n')
        expect = "UTF-8"
    else:
        data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "no marker"}) + "\n" for i in range(3)))
        expect = "####"
    out = tmp_path / "runs"
    with pytest.raises(ConfigError, match=expect) as e:
        load_config(None, [f"model.path={toy_model}", "task.name=dataset", f"task.path={data}",
                           "task.format=gsm8k", f"out_dir={out}"])
    assert "bad.jsonl" in str(e.value)
    assert main(["train", f"model.path={toy_model}", "task.name=dataset", f"task.path={data}",
                 "task.format=gsm8k", f"out_dir={out}"]) == 2
    assert not out.exists()


def test_word_problems_need_a_real_tokenizer(gsm8k_file):
    with pytest.raises(ConfigError, match="character tokenizer"):
        load_config(None, ["task.name=dataset", f"task.path={gsm8k_file}", "task.format=gsm8k"])


def test_the_first_command_a_researcher_types_explains_itself():
    with pytest.raises(ConfigError, match="model.path") as e:
        load_config(None, ["model.arch=Qwen/Qwen2.5-0.5B-Instruct"])
    with pytest.raises(ConfigError, match="task.name=dataset task.format=gsm8k task.path="):
        load_config(None, ["task.name=gsm8k"])
