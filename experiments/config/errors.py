"""Errors the command line reports as one line (importing this module imports nothing heavy)."""

import re
from datetime import datetime, timezone


class ConfigError(ValueError):
    """A configuration problem found before any compute started."""


class RunFolderError(RuntimeError):
    """A run folder that cannot be used as it is (unreadable files, another process in it); the message says
    which file and what to do."""


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(e: BaseException) -> str:
    """``Type: first line of the message``, without colour codes (Ray colours its tracebacks)."""
    lines = [line for line in ANSI.sub("", str(e)).strip().splitlines() if line.strip()]
    text = f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


LIKELY_CAUSE = {
    "reward": "the rewards are not finite: a reward function's values (or their weighted sum, reward.weights) "
              "overflow, or a task's verifier returned NaN",
    "loss": "the objective's loss is not finite at this step: a plug-in member or setting that divides by zero or "
            "takes the log of a non-positive number here, or weights already damaged",
    "grad_norm": "the loss is finite but its gradient is not: an overflow in the backward pass (try a lower "
                 "optim.lr or optim.grad_clip, or float32)",
    "value_loss": "the critic's value loss or its gradient is not finite (value.clip, value.lr_scale)",
}


class NonFiniteError(RuntimeError):
    """A non-finite quantity at a step under train.nan_policy=stop."""

    def __init__(self, step: int, quantity: str):
        self.step, self.quantity, self.cause = step, quantity, LIKELY_CAUSE[quantity]
        super().__init__(f"step {step}: {quantity} is not finite (NaN or infinite); likely cause: {self.cause}; "
                         f"the run stops before applying it and keeps its last good checkpoint")

    def record(self) -> dict:
        return {"step": self.step, "quantity": self.quantity, "cause": self.cause, "error": str(self),
                "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
