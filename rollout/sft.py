"""Supervised warm start ("cold start") with a content-addressed cache.

RL starts from a policy with intermediate accuracy: a short SFT on the task's reference answers. Its
checkpoint is cached under a hash of everything that determines it (task settings, model, SFT settings,
seed, tokenizer vocabulary, this file's format version), so every arm of a comparison with the same seed
starts from byte-identical weights, and a sweep trains each start once. Weights are safetensors
(``save_pretrained``); concurrent workers asking for the same start wait on a file lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import AutoModelForCausalLM

SFT_FORMAT = 1  # bump when the SFT procedure changes, so stale caches are not reused


def default_cache_dir() -> Path:
    return Path(os.environ.get("OBJBENCH_CACHE", Path.home() / ".cache" / "objbench"))


def encode_batch(tokenizer, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
    """``[tokenizer.encode(t, add_special_tokens=...) for t in texts]``, straight through the Rust tokenizer for
    fast tokenizers (~100 us per text saved: the Python wrapper dominates for short prompts). One text at a time,
    not ``encode_batch``: the batch call hands the texts to the tokenizers library's thread pool, whose threads
    compete with torch's for the same cores; in the training loop that made encoding 8 prompts ~3x slower
    (0.75 vs 0.25 ms a step on 2 cores), and per-text calls are as fast as the batch call up to a few dozen
    texts even on an idle machine. Same ids either way."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is not None and hasattr(rust, "encode"):
        chars = _char_table(tokenizer)
        if chars is not None and (not add_special_tokens or rust.post_processor is None):
            table, unk, added = chars
            return [[table.get(c, unk) for c in t] if unk is not None and not any(a in t for a in added)
                    else rust.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]
        return [rust.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]
    return [tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]


def _char_table(tokenizer):
    """For a character-level word tokenizer (each character its own pre-token, looked up in a WordLevel vocabulary,
    no normaliser: the task tokenizer of envs.tokenizer): (char -> id, the unknown id, the added tokens' texts), so
    a text without an added token encodes by table look-up (~5x faster for short prompts). Checked once per
    tokenizer against the tokenizer itself on every ordered pair of its characters and on unknown characters; None
    for any other tokenizer. Cached on the tokenizer object."""
    cached = getattr(tokenizer, "_objbench_char_table", False)
    if cached is not False:
        return cached
    out = None
    rust = tokenizer._tokenizer
    if type(rust.model).__name__ == "WordLevel" and rust.normalizer is None:
        added = tuple(t.content for t in tokenizer.added_tokens_decoder.values())
        table = {c: i for c, i in rust.get_vocab(with_added_tokens=False).items() if len(c) == 1}
        unk_tok = getattr(rust.model, "unk_token", None)
        unk = rust.token_to_id(unk_tok) if unk_tok else None
        probe = "".join(a + b for a in table for b in table) + "\n\t\u2603"
        if table and unk is not None and not any(a in probe for a in added):
            if rust.encode(probe, add_special_tokens=False).ids == [table.get(c, unk) for c in probe]:
                out = (table, unk, added)
    try:
        tokenizer._objbench_char_table = out
    except AttributeError:  # pragma: no cover - a tokenizer object that takes no new attributes
        pass
    return out


def encode_prompts(tokenizer, texts: list[str], bos_id: int, pad_id: int):
    """Left-padded ``<bos> + text`` ids and a bool mask, (B, P)."""
    return pad_left([[bos_id] + ids for ids in encode_batch(tokenizer, texts)], pad_id)


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded (B, P) long ids and bool mask of token lists (padded in Python, one tensor each: a per-row
    tensor copy costs ~15 us a row, which for short prompts is most of the encoding time)."""
    P = max(len(s) for s in seqs)
    ids = torch.tensor([[pad_id] * (P - len(s)) + s for s in seqs], dtype=torch.long)
    mask = torch.tensor([[False] * (P - len(s)) + [True] * len(s) for s in seqs], dtype=torch.bool)
    return ids, mask


def pad_right(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) long ids and bool mask of token lists."""
    T = max(len(s) for s in seqs)
    ids = torch.tensor([s + [pad_id] * (T - len(s)) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[True] * len(s) + [False] * (T - len(s)) for s in seqs], dtype=torch.bool)
    return ids, mask


def encode_targets(tokenizer, texts: list[str], eos_id: int, pad_id: int):
    """Right-padded ``text + <eos>`` ids and a bool mask, (B, T)."""
    return pad_right([ids + [eos_id] for ids in encode_batch(tokenizer, texts)], pad_id)


@dataclass
class Until:
    """A competence-based warm start: train on clean targets until ``reached(policy)`` says so (checked every
    ``check_every`` steps, at most ``max_steps``), then ``then_steps`` steps of ``then_batch_fn`` while the
    learning rate decays linearly to 10%. ``reached`` returns (done, record); the records are kept."""
    reached: Callable[[torch.nn.Module], tuple[bool, dict]]
    check_every: int
    max_steps: int
    then_steps: int
    then_batch_fn: Callable[[int, random.Random], tuple[list, list[str]]]
    warmup: int = 100
    history: list = field(default_factory=list)
    clean_steps: int | None = None
    done: bool = False


def sft_train(policy, codec, batch_fn: Callable[[int, random.Random], tuple[list, list[str]]], *,
              steps: int, lr: float, seed: int, special: dict | None = None, log_every: int = 0,
              grad_clip: float = 0.0, until: Until | None = None, log_label: str = "warm start") -> list[float]:
    """Train ``policy`` in place with teacher forcing; loss on the answer tokens and EOS only.

    ``codec`` is a rollout.bundle.Codec (or a bare tokenizer together with ``special`` = its bos/eos/pad ids).
    ``batch_fn(step, rng)`` returns (prompts: problems or texts, target texts). ``grad_clip`` > 0 clips the
    gradient's global norm (0: no clipping). Without ``until``: ``steps`` steps on a fixed schedule; with it:
    see :class:`Until` (``steps`` is then ignored). ``log_every`` > 0 prints ``log_label: step N loss L`` to
    stderr every that many steps (and the criterion's verdict). Returns the loss curve.
    """
    enc_p, enc_t = _sft_encoders(codec, special)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _sft_lr_lambda(steps, until))
    rng = random.Random(seed)
    losses = []
    one_step = _sft_step_fn(policy, opt, sched, enc_p, enc_t, grad_clip, losses, log_every, log_label)

    policy.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if until is None:
            for step in range(steps):
                one_step(*batch_fn(step, rng))
        else:
            _train_until(policy, until, one_step, batch_fn, rng, log_every, log_label)
    policy.eval()
    return losses


def _sft_encoders(codec, special: dict | None):
    """(encode_prompts(prompts), encode_targets(targets)) of ``sft_train``: the codec's own, or for a bare
    tokenizer with ``special`` ids "<bos> + prompt" and "target + <eos>"."""
    if special is None:
        return codec.encode_prompts, codec.encode_targets
    tok = codec

    def enc_p(prompts):
        return encode_prompts(tok, prompts, special["bos"], special["pad"])

    def enc_t(targets):
        return encode_targets(tok, targets, special["eos"], special["pad"])

    return enc_p, enc_t


def _sft_lr_lambda(steps: int, until: Until | None) -> Callable[[int], float]:
    """The learning-rate factor of ``sft_train`` at a step (a LambdaLR lambda)."""
    if until is None:
        # linear warm-up over the first 5% of steps, constant, then linear decay to 10% over the last 25%.
        # (A cosine schedule kept tiny models on the loss plateau before addition "clicks"; see the note.)
        warm, decay_from = max(1, steps // 20), int(steps * 0.75)

        def lr_at(step):
            if step < warm:
                return (step + 1) / warm
            if step < decay_from:
                return 1.0
            return 1.0 - 0.9 * (step - decay_from) / max(1, steps - decay_from)
    else:
        def lr_at(step):  # warm-up, constant until the criterion holds, then linear decay to 10% in phase 2
            if until.clean_steps is None:
                return min(1.0, (step + 1) / until.warmup)
            return 1.0 - 0.9 * (step - until.clean_steps) / max(1, until.then_steps)
    return lr_at


def _sft_step_fn(policy, opt, sched, enc_p, enc_t, grad_clip: float, losses: list, log_every: int,
                 log_label: str) -> Callable[[list, list[str]], None]:
    """``one_step(prompts, targets)``: one optimizer step of ``sft_train`` on a batch; appends its loss to
    ``losses`` (the step count) and logs every ``log_every`` steps."""
    device = next(policy.parameters()).device
    from objbench.rollout.scoring import score  # local import keeps module import light

    def one_step(prompts, targets):
        p_ids, p_mask = (x.to(device) for x in enc_p(prompts))
        t_ids, t_mask = (x.to(device) for x in enc_t(targets))
        sc = score(policy, p_ids, p_mask, t_ids, t_mask, with_entropy=False)
        loss = -(sc.logp * t_mask).sum() / t_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        step = len(losses)
        if log_every and step % log_every == 0:
            print(f"{log_label}: step {step} loss {losses[-1]:.4f}", file=sys.stderr, flush=True)

    return one_step


def _train_until(policy, until: Until, one_step, batch_fn, rng: random.Random, log_every: int,
                 log_label: str) -> None:
    """The two phases of a competence-based ``sft_train`` (see :class:`Until`): clean steps of ``batch_fn``
    until ``until.reached`` (or ``until.max_steps``), then ``until.then_steps`` steps of ``until.then_batch_fn``.
    Records the checks and the outcome on ``until``."""
    step = 0
    while until.clean_steps is None:
        one_step(*batch_fn(step, rng))
        step += 1
        if step % until.check_every == 0 or step == until.max_steps:
            policy.eval()
            with torch.no_grad():
                done, record = until.reached(policy)
            policy.train()
            until.history.append({"step": step, **record})
            if done or step >= until.max_steps:
                until.done, until.clean_steps = bool(done), step
                if log_every:
                    print(f"{log_label}: {'criterion met' if done else 'criterion NOT met'} after {step} "
                          f"clean steps ({record}); {until.then_steps} more steps", file=sys.stderr,
                          flush=True)
    for i in range(until.then_steps):
        one_step(*until.then_batch_fn(step + i, rng))


WARM_START_THREADS = 1
"""A warm start trains with this many torch threads whatever the caller uses: CPU kernels reduce in a
thread-count-dependent order, so a start trained with 2 threads differs from one trained with 1 (seen: weights
apart by up to 0.67, 3-digit accuracy 0.06 vs 0.94), and a cache keyed without it would hand every later run
whichever start the first command made. 1 is what every committed sweep used (2 workers x 1 thread)."""


@contextlib.contextmanager
def fixed_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def weights_hash(folder: Path) -> str:
    """sha256 of a checkpoint's weight files: what a report cites to name the exact start policy."""
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cached_warm_start(key: dict, build: Callable[[], torch.nn.Module], train: Callable[[torch.nn.Module], dict],
                      cache_dir: Path | None = None) -> tuple[torch.nn.Module, Path, dict]:
    """Return (policy, checkpoint dir, info) for ``key``, training it once if no cached copy exists.

    Training runs with WARM_START_THREADS torch threads, so the start is the same whatever thread count the
    calling command uses; ``info["weights_sha256"]`` names the exact weights."""
    cache_dir = Path(cache_dir or default_cache_dir()) / "sft"
    blob = json.dumps({**key, "format": SFT_FORMAT, "threads": WARM_START_THREADS}, sort_keys=True,
                      default=str).encode()
    digest = hashlib.sha256(blob).hexdigest()[:16]
    ckpt = cache_dir / digest
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be training the same start
        if not (ckpt / "sft.json").is_file():
            t0 = time.time()
            with fixed_threads(WARM_START_THREADS):
                model = build()
                info = train(model)
            info = {**info, "key": key, "seconds": round(time.time() - t0, 2), "threads": WARM_START_THREADS}
            tmp = cache_dir / f"{digest}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp)  # safetensors
            info["weights_sha256"] = weights_hash(tmp)
            (tmp / "sft.json").write_text(json.dumps(info, indent=1, default=str))
            shutil.rmtree(ckpt, ignore_errors=True)
            os.replace(tmp, ckpt)  # atomic: a half-written start is never visible
    info = json.loads((ckpt / "sft.json").read_text())
    model = load_policy(ckpt)
    return model, ckpt, info


def load_policy(path: Path, attn_implementation: str | None = None):
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(path, **kw)
    model.eval()
    return model
