"""Sampling a batch: G completions per prompt from the engine, decoded and verified by the task (rewards);
interjections; engine log-probs recomputed by the trainer where the engine asks."""

from __future__ import annotations

import dataclasses

import torch

from objbench.experiments.config import ConfigError
from objbench.experiments.run.batch import Batch, cpu_column
from objbench.experiments.run.setup import Setup, timed
from objbench.rollout.decode import decode_responses
from objbench.rollout.engine import Generation, SamplingParams, repeat_prompts
from objbench.rollout.scoring import score
from objbench.rollout.sft import encode_batch, pad_left, pad_right

INVALID_MARK = "\ufffd"  # prefixed to a response that held a special token; no verifier accepts it


def verify(task, probs: list, texts: list[str], truncated: list[bool]) -> list:
    """task.reward of each response; with a deterministic reward (``task.deterministic_reward``) each distinct
    (problem, text, truncated) is verified once and its copies share the (frozen) result."""
    if not getattr(task, "deterministic_reward", False):
        return [task.reward(p, t, bool(tr)) for p, t, tr in zip(probs, texts, truncated)]
    seen: dict = {}
    out = []
    for p, t, tr in zip(probs, texts, truncated):
        key = (id(p), t, bool(tr))  # a group's rows hold the same problem object; probs keeps it alive
        r = seen.get(key)
        if r is None:
            r = seen[key] = task.reward(p, t, bool(tr))
        out.append(r)
    return out


def rollout(s: Setup, problems: list, group_size: int | list, params: SamplingParams, generator,
            encoded: tuple | None = None) -> Batch:
    """G completions for each problem (or group_size[i] for problem i), decoded and scored by the task's verifier.
    ``encoded``: ``s.codec.encode_prompts(problems)`` when the caller has it (PromptStream.encoded)."""
    sizes = list(group_size) if isinstance(group_size, (list, tuple)) else None
    p_ids, p_mask = encoded if encoded is not None else s.codec.encode_prompts(problems)
    reps = group_size if sizes is None else torch.tensor(sizes, device=s.device)
    p_ids, p_mask = repeat_prompts(p_ids.to(s.device), p_mask.to(s.device), reps)
    probs = [p for p, g in zip(problems, sizes or [group_size] * len(problems)) for _ in range(g)]
    forced = None
    with timed(s, "sample"):
        if getattr(s.task, "interjection_marker", None):
            gen, forced = _generate_with_interjection(s, p_ids, p_mask, probs, params, generator)
        else:
            gen = on_device(s, s.engine.generate(p_ids, p_mask, params, generator))
    with timed(s, "reward"):
        texts = decode_responses(s.tokenizer, gen.response_ids.masked_fill(~gen.response_mask, s.codec.pad_id).cpu())
        if s.bad_ids is not None and len(s.bad_ids):
            # "1<pad>2" would decode to "12": mark such responses so that every verifier rejects them
            bad = (torch.isin(gen.response_ids, s.bad_ids) & gen.response_mask).any(-1)
            if bool(bad.any()):
                texts = [INVALID_MARK + t if b else t for t, b in zip(texts, bad.tolist())]
        results = verify(s.task, probs, texts, gen.truncated.tolist())
    rows = [(r.reward, r.correct, p.difficulty, bool(getattr(r, "malformed", False))) for r, p in zip(results, probs)]
    if rows and s.device.type == "cpu":  # four small tensors straight from the lists
        reward, correct, difficulty, malformed = (
            cpu_column(col, dt) for col, dt in zip(zip(*rows), (torch.float32, torch.bool, torch.long, torch.bool)))
    else:  # one table (float64 holds each number exactly): one host-to-device copy instead of four, then split
        cols = torch.tensor(rows, dtype=torch.float64).view(-1, 4).to(s.device).unbind(-1)
        reward, correct, difficulty, malformed = (cols[0].to(torch.float32), cols[1] != 0, cols[2].to(torch.long),
                                                  cols[3] != 0)
    return Batch(p_ids, p_mask, gen.response_ids, gen.response_mask, gen.logp, gen.truncated, reward, correct,
                 difficulty, texts, probs, [getattr(r, "reason", "") for r in results], malformed, sizes, forced)




def on_device(s: Setup, gen: Generation) -> Generation:
    if gen.response_ids.device == s.device:
        return gen
    # an engine of its own (vLLM) answers on the CPU
    return Generation(*(x.to(s.device) for x in (gen.response_ids, gen.response_mask, gen.logp, gen.truncated)))


def _generate_with_interjection(s: Setup, p_ids, p_mask, probs: list, params: SamplingParams, generator):
    """Sampling in two parts around an environment's interjection (a task with ``interjection_marker``, e.g.
    arithmetic's verdict): the policy writes until the marker (its stop token for this part, at most
    ``task.interjection_window()`` tokens), the task appends ``interjection(problem, first part)``, and the policy
    goes on from there until EOS. Rows that never write the marker, or write EOS before it, end there (truncated,
    so never correct). Returns (one Generation of the whole responses, (B, T) bool of the interjected tokens:
    attended to, in the response mask, with log-prob 0, and excluded from the loss by update())."""
    task, codec = s.task, s.codec
    (mark,) = encode_batch(codec.tokenizer, [task.interjection_marker])
    if len(mark) != 1:
        raise ConfigError(f"the task's interjection marker {task.interjection_marker!r} must be one token of the "
                          f"tokenizer, got {len(mark)}")
    window = min(task.interjection_window(), params.max_new_tokens - 1)
    first = on_device(s, s.engine.generate(p_ids, p_mask, dataclasses.replace(
        params, eos_id=mark[0], max_new_tokens=window), generator))
    ids1 = [r[m].tolist() for r, m in zip(first.response_ids, first.response_mask)]
    lp1 = [r[m].tolist() for r, m in zip(first.logp, first.response_mask)]
    # an EOS inside the first part does not stop it (the marker does): such a row ends there, truncated
    stopped = [ok and params.eos_id not in x for ok, x in zip((~first.truncated).tolist(), ids1)]
    rows = [i for i, ok in enumerate(stopped) if ok]
    inter: dict[int, list[int]] = {}
    ids2, lp2, trunc2 = {}, {}, {}
    if rows:
        texts = decode_responses(s.tokenizer, pad_right([ids1[i] for i in rows], codec.pad_id)[0])
        enc = encode_batch(codec.tokenizer, [task.interjection(probs[i], t) for i, t in zip(rows, texts)])
        inter = dict(zip(rows, enc))
        prompts = [p[m].tolist() for p, m in zip(p_ids[rows], p_mask[rows])]
        q_ids, q_mask = pad_left([q + ids1[i] + inter[i] for q, i in zip(prompts, rows)], codec.pad_id)
        budget = params.max_new_tokens - max(len(ids1[i]) + len(inter[i]) for i in rows)
        second = on_device(s, s.engine.generate(q_ids.to(s.device), q_mask.to(s.device), dataclasses.replace(
            params, max_new_tokens=max(1, budget)), generator))
        for j, i in enumerate(rows):
            m = second.response_mask[j]
            ids2[i], lp2[i] = second.response_ids[j][m].tolist(), second.logp[j][m].tolist()
            trunc2[i] = bool(second.truncated[j])
    seqs, lps, forced, trunc = [], [], [], []
    for i in range(len(ids1)):
        v = inter.get(i, [])
        seqs.append(ids1[i] + v + ids2.get(i, []))
        lps.append(lp1[i] + [0.0] * len(v) + lp2.get(i, []))
        forced.append([False] * len(ids1[i]) + [True] * len(v) + [False] * len(ids2.get(i, [])))
        trunc.append(trunc2.get(i, True))
    ids, mask = pad_right(seqs, codec.pad_id)
    T = ids.shape[1]
    logp = torch.tensor([x + [0.0] * (T - len(x)) for x in lps], dtype=torch.float32)
    forced_t = torch.tensor([x + [False] * (T - len(x)) for x in forced], dtype=torch.bool)
    dev = s.device
    return Generation(ids.to(dev), mask.to(dev), logp.to(dev), torch.tensor(trunc, device=dev)), forced_t.to(dev)


def recompute_old_logp(s: Setup, b: Batch) -> torch.Tensor | None:
    """When the engine asks for it (``engine.recompute_logp``), replace ``b.old_logp`` by the trainer's
    teacher-forced log-probs of the sampled tokens; return |engine - trainer| over the valid tokens (1-D), else
    None. The trainer's numbers make the first minibatch's ratio exactly 1, as with the hf engine."""
    if not getattr(s.engine, "recompute_logp", False):
        return None
    with torch.no_grad(), timed(s, "old_logp"):
        sc = score(s.policy, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                   temperature=s.cfg.rollout.temperature, with_entropy=False, forward=s.forward)
        diff = (sc.logp - b.old_logp)[b.response_mask].abs()
        b.old_logp = sc.logp.masked_fill(~b.response_mask, 0.0)
    return diff


def engine_logp_metrics(diffs: list) -> dict:
    diffs = [d for d in diffs if d is not None]
    if not diffs:
        return {}
    d = torch.cat(diffs)
    if not d.numel():
        return {}
    return {"rollout/engine_logp_abs_diff_mean": float(d.mean()), "rollout/engine_logp_abs_diff_max": float(d.max())}
