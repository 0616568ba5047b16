"""Bring your own reward: a format reward (examples/format_reward.py) added to a data-set task's verifier, on a
Hugging Face model folder, through objbench's Python API. Offline: the model (a small Qwen2 with a BPE tokenizer
trained here) and the GSM8K-layout data are generated.

    python examples/custom_reward.py            # 30 steps
    python examples/custom_reward.py --quick    # 3 steps: checks that it runs (CI)
"""

import argparse
import json
from pathlib import Path

import objbench
from objbench.envs.dataset import write_synthetic_gsm8k
from objbench.rollout.toy_hf import write_toy_model

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/runs/custom_reward", help="folder for the model, data and run")
    p.add_argument("--quick", action="store_true", help="3 steps only (checks that it runs)")
    args = p.parse_args()
    out = Path(args.out)
    model = out / "toy-qwen2"
    if not (model / "config.json").is_file():
        write_toy_model(model)
    data = out / "gsm8k.jsonl"
    write_synthetic_gsm8k(str(data), 200, seed=0)
    run = objbench.train({
        "model.path": str(model), "task.name": "dataset", "task.path": str(data), "task.format": "gsm8k",
        "task.max_response_tokens": 24, "train.eval_size": 16, "train.steps": 3 if args.quick else 30,
        "train.eval_every": 3 if args.quick else 10,
        "reward.fns": [f"{HERE / 'format_reward.py'}:gsm8k_format"], "reward.weights": [0.2],
        "out_dir": str(out / "runs"), "name": "grpo_format",
    }, progress=not args.quick)
    print("step  reward/mean  reward/task  reward/gsm8k_format  abstained")
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        print(f"{m['step']:>4}  {m['reward/mean']:11.3f}  {m['reward/task']:11.3f}  {m['reward/gsm8k_format']:19.3f}"
              f"  {m['reward/gsm8k_format_abstained']:9.3f}")


if __name__ == "__main__":
    main()
