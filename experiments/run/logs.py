"""A run's logs: append-only JSON-lines files (metrics, eval, samples) and the optional wandb run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from objbench.experiments.config import ConfigError, TrainConfig, to_dict
from objbench.experiments.config.errors import RunFolderError


class JsonlWriter:
    """Append-only JSON-lines file, flushed per row; ``truncate_after(step)`` drops rows logged after a checkpoint."""

    def __init__(self, path: Path):
        self.path = path
        self.fh = open(path, "a")

    def write(self, row: dict):
        self.fh.write(json.dumps(row, allow_nan=True) + "\n")
        self.fh.flush()

    def close(self):
        self.fh.close()

    @staticmethod
    def truncate_after(path: Path, step: int) -> str | None:
        """Drop the rows logged after ``step`` (a resume from its checkpoint). A last line cut off by a crash is
        dropped too, and said (the returned note); a damaged line before the last one is no crash's doing, so the
        file is left as it is and RunFolderError names the line."""
        if not path.exists():
            return None
        lines = path.read_text().splitlines()
        last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
        keep, note = [], None
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if i != last:
                    raise RunFolderError(f"{path}: line {i + 1} is not valid JSON (edited by hand?); the resume "
                                         f"would drop it: repair or remove that line, then run again") from None
                note = f"{path}: dropped its last line, cut off by the crash ({len(line)} characters)"
                continue
            if row.get("step", 0) <= step:
                keep.append(line)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)
        return note


def wandb_mode() -> str | None:
    """None (wandb decides: WANDB_MODE, an API key, or a `wandb login`) unless nothing is configured at all,
    then "offline", so a run never blocks on a login prompt."""
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        import netrc

        if netrc.netrc().authenticators(host):
            return None  # `wandb login` wrote the key to ~/.netrc
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def wandb_init(cfg: TrainConfig, run_dir: Path, meta: dict):
    try:
        import wandb
    except ImportError:
        raise ConfigError("log.wandb=true needs wandb: pip install 'objbench[wandb]'") from None
    # one wandb run per run folder: a resumed run continues the same wandb run (same id, resume="allow")
    id_file = run_dir / "wandb_id"
    safe = "".join(c if c.isalnum() or c in "_-" else "-" for c in cfg.run_name[:40])
    run_id = id_file.read_text().strip() if id_file.is_file() else f"{safe}-{os.urandom(4).hex()}"
    id_file.write_text(run_id)
    mode = wandb_mode()
    kw = {"mode": mode} if mode else {}
    for attempt in range(10):
        try:
            return wandb.init(project=cfg.log.wandb_project, name=cfg.run_name, id=run_id, resume="allow",
                              dir=str(run_dir), config=to_dict(cfg), group=meta.get("sweep") or None,
                              tags=[t for t in (meta.get("arm"), f"seed{cfg.seed}") if t], **kw)
        except Exception as e:  # after a hard crash wandb's service may hold the run for a few seconds
            if "in use" not in str(e) or attempt == 9:
                raise
            time.sleep(2)


class RunLogs:
    """The run's three JSON-lines logs and its optional wandb run, opened together and closed together."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, meta: dict):
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl")
        self.eval = JsonlWriter(run_dir / "eval.jsonl")
        self.samples = JsonlWriter(run_dir / "samples.jsonl")
        self.wandb = wandb_init(cfg, run_dir, meta) if cfg.log.wandb else None

    def write_samples(self, step: int, b, n: int) -> None:
        """The first ``n`` sampled responses of the step (everything sampled, ``b``), decoded, with their rewards."""
        for i in range(min(n, b.size)):
            row = {"step": step, "prompt": b.problems[i].prompt, "response": b.texts[i],
                   "reward": float(b.rewards[i]), "correct": bool(b.correct[i])}
            if b.reasons and b.reasons[i]:
                row["reason"] = b.reasons[i]  # why the verifier judged it (unparseable / wrong / ...)
            self.samples.write(row)

    def to_wandb(self, row: dict, step: int) -> None:
        if self.wandb is not None:
            self.wandb.log(row, step=step)

    def close(self) -> None:
        for w in (self.metrics, self.eval, self.samples):
            w.close()
        if self.wandb is not None:
            self.wandb.finish()
