"""A reward function for `reward.fns` (TRL's signature): 1.0 when a response ends in GSM8K's answer format
"#### <number>", else 0.0; None (abstain) for an empty response, which then gets only the task's reward.

    objbench train ... task.name=dataset task.format=gsm8k reward.fns=[examples/format_reward.py:gsm8k_format] \
        reward.weights=[0.2]
"""

import re

FINAL = re.compile(r"####\s*-?[\d,]*\.?\d+\s*$")


def gsm8k_format(prompts, completions, **columns):
    """prompts, completions: lists of text; columns: answer, difficulty and the data set's other columns."""
    return [None if not c.strip() else float(bool(FINAL.search(c.strip()))) for c in completions]
