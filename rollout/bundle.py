"""Model and tokenizer come together: the token side of a run (``Codec``) and the loading of a Hugging Face model.

Tasks produce text (a prompt, or chat messages); only this layer turns text into ids. Two codecs:

- the built-in character tokenizer (envs.tokenizer) for the tiny/small architectures: ``<bos> + prompt``,
  exactly what every committed result used;
- any Hugging Face tokenizer loaded from the model's folder: special ids from the tokenizer (PAD falls back to
  EOS), its chat template applied to a problem's messages when it has one (``rollout.chat_template=auto``),
  otherwise the prompt text with the tokenizer's own special tokens (a BOS where the tokenizer adds one).

Prompts are left-padded (sampling), targets right-padded. Loading checks the folder before any compute: a
missing folder, a folder without a tokenizer, a truncated or unreadable safetensors file (headers only, no weights
read), a vocabulary larger than the model's embedding, or a tokenizer without an EOS token is a ``ValueError``
naming the folder and the problem.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from objbench.rollout.sft import encode_batch, encode_prompts, encode_targets, pad_left

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


@dataclass
class Codec:
    """Text <-> ids for one tokenizer: special ids, prompt and target encoding (the only place that tokenizes)."""

    tokenizer: object
    eos_id: int
    pad_id: int
    bos_id: int | None = None
    """prepended to every prompt by the codec itself (the character tokenizer); None = the tokenizer decides"""
    chat: bool = False
    """apply the tokenizer's chat template to problems that carry messages"""

    @property
    def special(self) -> dict:
        return {"bos": self.bos_id, "eos": self.eos_id, "pad": self.pad_id}

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def prompt_texts(self, problems) -> list[str]:
        """The text each prompt is encoded from (chat template applied where it applies)."""
        out = []
        for p in problems:
            if isinstance(p, str):
                out.append(p)
            elif self.chat and p.messages:
                out.append(self.tokenizer.apply_chat_template(p.chat(), tokenize=False, add_generation_prompt=True))
            else:
                out.append(p.prompt)
        return out

    def encode_prompts(self, problems) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and a bool mask, (B, P), for problems (or plain prompt strings)."""
        if self.bos_id is not None:  # character tokenizer: <bos> + text (the committed runs' encoding)
            texts = [p if isinstance(p, str) else p.prompt for p in problems]
            return encode_prompts(self.tokenizer, texts, self.bos_id, self.pad_id)
        templated = [not isinstance(p, str) and self.chat and bool(p.messages) for p in problems]
        texts = self.prompt_texts(problems)
        # a chat template writes its own special tokens as text; a plain prompt gets the tokenizer's (e.g. <s>)
        seqs = self._encode(texts, templated)
        for i, s in enumerate(seqs):
            if not s:
                raise ValueError(f"prompt {i} encodes to no tokens: {texts[i]!r}")
        return pad_left(seqs, self.pad_id)

    def _encode(self, texts: list[str], templated: list[bool]) -> list[list[int]]:
        out: list[list[int] | None] = [None] * len(texts)
        for flag in (True, False):
            idx = [i for i, t in enumerate(templated) if t == flag]
            if idx:
                enc = encode_batch(self.tokenizer, [texts[i] for i in idx], add_special_tokens=not flag)
                for i, e in zip(idx, enc):
                    out[i] = e
        return out

    def encode_targets(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ``text + <eos>`` ids and a bool mask, (B, T)."""
        return encode_targets(self.tokenizer, texts, self.eos_id, self.pad_id)


def char_codec() -> Codec:
    """The built-in character tokenizer with its fixed ids (<pad> 0, <bos> 1, <eos> 2)."""
    from objbench.envs.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer

    return Codec(build_char_tokenizer(), eos_id=EOS_ID, pad_id=PAD_ID, bos_id=BOS_ID, chat=False)


def hf_codec(tokenizer, chat_template: str = "auto") -> Codec:
    """Codec for a Hugging Face tokenizer: EOS from the tokenizer, PAD falling back to EOS, left padding."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token (eos_token); set one in tokenizer_config.json")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    tokenizer.padding_side = "left"
    chat = chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))
    return Codec(tokenizer, eos_id=int(eos), pad_id=int(pad), bos_id=None, chat=chat)


# ---------------------------------------------------------------------------------------------------------
# Hugging Face model folders


def folder_codec(path: str, chat_template: str = "auto") -> Codec:
    """The codec of a Hugging Face model folder's own tokenizer (what ``load_hf`` returns beside the model)."""
    from transformers import AutoTokenizer

    return hf_codec(AutoTokenizer.from_pretrained(Path(inspect_model_folder(path)["folder"])), chat_template)


def resolve_model_path(path: str) -> Path:
    """A local model folder for ``model.path``: the folder itself, or a hub id from the local cache or the hub.

    Raises ValueError naming the path when it is neither a folder nor a hub id that can be fetched (offline, or
    the hub unreachable): nothing has been written yet when this fails.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return p.resolve()
    if p.exists():
        raise ValueError(f"model.path={path!r} is a file; give the folder that holds config.json and the tokenizer")
    if not _HUB_ID.match(path):
        raise ValueError(f"model.path={path!r}: no such folder")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise ValueError(f"model.path={path!r}: no such folder, and huggingface_hub is not installed") from None
    try:
        return Path(snapshot_download(path, local_files_only=True))
    except Exception:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ValueError(f"model.path={path!r}: no such folder, not in the local Hugging Face cache, and "
                         "HF_HUB_OFFLINE is set; download it where the hub is reachable and pass the folder")
    try:
        return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt",
                                                            "*.tiktoken", "*.jinja"]))
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"model.path={path!r}: no such folder, and the Hugging Face hub could not provide it "
                         f"({type(e).__name__}: {msg[:200]}); download it where the hub is reachable "
                         "(`huggingface-cli download ID --local-dir DIR`) and pass model.path=DIR") from None


@functools.lru_cache(maxsize=8)
def _inspect(folder: str, stamp: tuple) -> dict:
    from transformers import AutoConfig, AutoTokenizer

    d = Path(folder)
    if not (d / "config.json").is_file():
        raise ValueError(f"model folder {d}: no config.json (not a Hugging Face model folder)")
    try:
        json.loads((d / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"model folder {d}: config.json is not valid JSON ({e})") from None
    if not any((d / f).is_file() for f in _WEIGHT_FILES) and not list(d.glob("*.safetensors")):
        raise ValueError(f"model folder {d}: no weights (expected model.safetensors or pytorch_model.bin)")
    check_weight_files(d)
    try:
        config = AutoConfig.from_pretrained(d)
    except Exception as e:
        raise ValueError(f"model folder {d}: config.json cannot be read by transformers "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if not any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                                            "vocab.json")):
        raise ValueError(f"model folder {d}: no tokenizer files (tokenizer.json / tokenizer_config.json); "
                         "save the tokenizer next to the model (tokenizer.save_pretrained(folder))")
    try:
        tok = AutoTokenizer.from_pretrained(d)
    except Exception as e:
        raise ValueError(f"model folder {d}: the tokenizer cannot be loaded "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    text_cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(text_cfg, "vocab_size", None)
    if vocab is None:
        raise ValueError(f"model folder {d}: config.json has no vocab_size (not a causal LM?)")
    if len(tok) > vocab:
        raise ValueError(f"model folder {d}: the tokenizer has {len(tok)} tokens but the model's embedding has "
                         f"{vocab} rows (vocabulary mismatch: wrong tokenizer for this model?)")
    if tok.eos_token_id is None:
        raise ValueError(f"model folder {d}: the tokenizer has no EOS token; set eos_token in "
                         "tokenizer_config.json")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        i = getattr(tok, name)
        if i is not None and not 0 <= i < vocab:
            raise ValueError(f"model folder {d}: tokenizer {name}={i} is outside the model's vocabulary ({vocab})")
    return {"folder": str(d), "model_type": getattr(config, "model_type", "?"), "vocab_size": int(vocab),
            "tokenizer_size": len(tok), "chat_template": bool(getattr(tok, "chat_template", None)),
            "max_positions": getattr(text_cfg, "max_position_embeddings", None)}


def check_weight_files(d: Path) -> None:
    """The safetensors weights of a model folder are complete and readable: each file's header parses
    (safetensors' own safe_open) and every tensor's bytes lie within the file; a sharded folder's index names
    shards that are there. Raises ValueError naming the file and what is wrong. Reads headers only."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"model folder {d}: {index.name} is not a readable index ({type(e).__name__}: "
                             f"{str(e)[:200]})") from None
        missing = [s for s in shards if not (d / str(s)).is_file()]
        if missing:
            raise ValueError(f"model folder {d}: {index.name} names {len(missing)} shard file(s) that are not "
                             f"there ({', '.join(map(str, missing[:3]))}); download or save the model again")
    for f in sorted(d.glob("*.safetensors")):
        problem = _safetensors_problem(f)
        if problem:
            raise ValueError(f"model folder {d}: {f.name} {problem}; download or save the model again")


def _safetensors_problem(f: Path) -> str | None:
    """What is wrong with one safetensors file (truncated, unreadable, not safetensors), or None."""
    from safetensors import safe_open

    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n)) if size >= 8 and 8 + n <= size and n <= 100_000_000 else None
    except OSError as e:
        return f"cannot be read ({type(e).__name__}: {e.strerror or e})"
    except (UnicodeDecodeError, ValueError):
        header = None
    if isinstance(header, dict):
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
                and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2
                and isinstance(v["data_offsets"][1], int)]
        need = 8 + n + max(ends, default=0)
        if need > size:
            return f"is truncated: {size:,} bytes, but its header describes {need:,}"
    try:
        with safe_open(str(f), framework="pt"):
            pass
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: any failure to open is the answer
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return f"is not a readable safetensors file ({size:,} bytes; safetensors says: {msg})"
    return None


def inspect_model_folder(path: str) -> dict:
    """Check a model folder without loading its weights (cheap; cached per folder state). Raises ValueError."""
    folder = resolve_model_path(path)
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(folder.iterdir())
                  if f.is_file())
    return _inspect(str(folder), stamp)


def load_hf(path: str, *, chat_template: str = "auto", dtype: torch.dtype = torch.float32,
            attn_implementation: str = "sdpa"):
    """(policy, codec) from a Hugging Face model folder (or hub id, where reachable)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = inspect_model_folder(path)
    folder = Path(info["folder"])
    tok = AutoTokenizer.from_pretrained(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
    except Exception as e:
        raise ValueError(f"model folder {folder}: the weights cannot be loaded "
                         f"({type(e).__name__}: {str(e).splitlines()[0][:300]})") from None
    model.eval()
    return model, hf_codec(tok, chat_template)


def fingerprint_folder(path: str | Path) -> str:
    """sha256 over the names and bytes of the files in a model folder (what a warm start from it depends on)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={device!r} but torch sees no CUDA device "
                         f"(torch {torch.__version__}; a CPU build?)")
    return torch.device(device)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
