"""Bring your own objective: the GPG surrogate of examples/gpg_plugin.py next to GRPO, under identical conditions
(same warm start, prompts and budget per seed), through objbench's Python API.

    python examples/custom_objective.py            # 2 arms x 3 seeds x 100 steps after a 2000-step warm start
    python examples/custom_objective.py --quick    # 2 arms x 1 seed x 6 steps: checks that it runs (CI), ~1 min
"""

import argparse
from pathlib import Path

import objbench

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/runs", help="where the sweep folder goes")
    p.add_argument("--quick", action="store_true", help="a few steps only (checks that it runs)")
    args = p.parse_args()
    steps, seeds, sft = (6, 1, 100) if args.quick else (100, 3, 2000)
    spec = {
        "name": "custom_objective_quick" if args.quick else "custom_objective",
        "seeds": seeds,
        "imports": [str(HERE / "gpg_plugin.py")],  # loaded here and in every worker
        "set": {"train.steps": steps, "sft.steps": sft, "train.eval_every": steps, "task.eval_per_difficulty": 16},
        "arms": {
            "grpo": {"objective": "grpo"},
            # GRPO's advantages and aggregation with GPG's surrogate: the one factor that differs
            "grpo_gpg": {"objective": "grpo", "objective.ratio.surrogate": "gpg"},
        },
    }
    folder = objbench.sweep(spec, workers=2, out_dir=args.out)
    runs = objbench.load_runs(folder)
    final = runs.evals.query("metric == 'eval/acc'").sort_values("step").groupby(["arm", "seed"]).last()
    print("held-out accuracy at the last evaluation, per seed:")
    print(final["value"].unstack("arm").to_string())


if __name__ == "__main__":
    main()
