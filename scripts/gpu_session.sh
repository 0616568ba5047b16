#!/usr/bin/env bash
# The prepared GPU session (one call on a lent CUDA machine): the gpu-marked tests, the measured cost table on
# CUDA, and benchmarks/gpu_check.py. Each part has its own time limit and writes under $OUT (default ./gpu_out),
# so one failing part does not lose the others. Missing pure-Python packages can travel as wheels in .whl/.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch, transformers;
print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"; } \
  > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
t0=$SECONDS
timeout "${T_TESTS:-210}" python3 -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider 2>&1 | tee "$OUT/tests.log"
echo "tests: ${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$OUT/tests.log"
t0=$SECONDS
timeout "${T_COST:-270}" python3 -m benchmarks.cost_table --device cuda --steps "${COST_STEPS:-3}" --repeats 5 \
  --max-response-tokens 64 --out "$OUT/cost_gpu" 2>&1 | grep -v "^Generating" | tee "$OUT/cost.log"
echo "cost: ${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$OUT/cost.log"
t0=$SECONDS
timeout "${T_CHECK:-110}" python3 -m benchmarks.gpu_check --steps 4 --out "$OUT/gpu_check" 2>&1 | grep -v "^Generating" \
  | tee "$OUT/gpu_check.log"
echo "gpu_check: ${PIPESTATUS[0]} in $((SECONDS - t0)) s" | tee -a "$OUT/gpu_check.log"
# at most 8 files come back from $OUT: keep the JSON (cost.md / cost.csv are rebuilt with --rerender)
rm -f "$OUT/cost_gpu/cost.md" "$OUT/cost_gpu/cost.csv" "$OUT/gpu_check/gpu_check.md"
