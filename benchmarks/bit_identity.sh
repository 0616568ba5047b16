#!/usr/bin/env bash
# Does a change leave every logged number as it was? Trains the same short runs with two source trees and compares
# every logged value and the warm-start weights (benchmarks/compare_runs.py).
#
#   bash benchmarks/bit_identity.sh OLD_TREE NEW_TREE [OUT]     # e.g. a `git worktree add /tmp/old HEAD~1`
#
# The runs: every preset, PPO and GRPO micro-batched (train.micro_batch_size=5: the accumulated backward paths), and
# the length-verdict, mixture, staleness and adaptive-group configurations of their sweep specs, 20 steps, seed 0, 1 thread each, with an empty warm-start cache per tree (the warm starts are
# trained and compared too). Each tree runs from a copy laid out as the installed package (OUT/<tree>/src), so an
# editable install elsewhere does not leak in. About 15 min on 2 cores.
set -euo pipefail
old=$(realpath "$1"); new=$(realpath "$2"); out=$(realpath -m "${3:-/tmp/objbench-bit-identity}")
here=$(dirname "$(realpath "$0")")
snapshot() {  # SRC DEST: the tree's packages as objbench.<name> (a pre-package tree's folders are mapped alike)
  rm -rf "$2"; mkdir -p "$2/objbench"
  if [ -d "$1/objbench" ]; then cp "$1"/objbench/*.py "$2/objbench/"; else touch "$2/objbench/__init__.py"; fi
  for d in algos envs rollout experiments analysis; do cp -r "$1/$d" "$2/objbench/$d"; cp -r "$1/$d" "$2/$d"; done
}
train_all() {  # TREE OUT
  local src=$2/src; snapshot "$1" "$src"; mkdir -p "$2/cfg"; cd "$src"
  local cli="python3 -m objbench.experiments.cli"  # a module before the packages, a package (its __main__) after
  [ -d "$1/objbench" ] || cli="python3 -m experiments.cli"  # a tree from before the one-package layout
  export OBJBENCH_CACHE=$2/cache OBJBENCH_QUIET=1
  local common="train.steps=20 train.eval_every=10 train.threads=1 seed=0 out_dir=$2/runs"
  $cli sweep experiments/sweeps/length_filler.yaml --print-config verdict_seq_mean__s0 | grep -v '^#' > "$2/cfg/verdict.yaml"
  $cli sweep experiments/sweeps/difficulty_mixture.yaml --print-config group_std__s0 | grep -v '^#' > "$2/cfg/mixture.yaml"
  $cli sweep experiments/sweeps/off_policy_stale.yaml --print-config u8_stale4__s0 | grep -v '^#' > "$2/cfg/stale.yaml"
  $cli sweep experiments/sweeps/directions.yaml --print-config adaptive_k__s0 | grep -v '^#' > "$2/cfg/adaptive.yaml"
  for p in ppo grpo dr_grpo dapo gspo; do $cli train --quiet objective=$p name=$p $common; done
  for p in ppo grpo; do $cli train --quiet objective=$p name=${p}_micro train.micro_batch_size=5 $common; done
  for c in verdict mixture stale adaptive; do $cli train --quiet --config "$2/cfg/$c.yaml" name=$c $common; done
}
(train_all "$old" "$out/old") > "$out.old.log" 2>&1 &
(train_all "$new" "$out/new") > "$out.new.log" 2>&1 &
wait
# (diff exits 1 when the files differ: under pipefail that would hide the message)
{ diff -r "$out/old/cfg" "$out/new/cfg" || true; } | grep -v '^[<>] out_dir' | grep '^[<>]' \
  && echo "resolved configs differ (settings added later show as '>' lines)" || true
python3 "$here/compare_runs.py" "$out/old" "$out/new"
