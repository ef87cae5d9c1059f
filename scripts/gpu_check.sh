#!/usr/bin/env bash
# Every check that needs a GPU, in one short run (about 5 minutes on one H100/H200):
#   1. the engine's gradient-equivalence and bitwise-sharing tests on CUDA,
#   2. `nmt memreport --device cuda` (accounted bytes beside max_memory_allocated/reserved),
#   3. the training-speed benchmark on CUDA (needs the ende-demo corpus: DATA=folder).
# Results are also written to $OUT (default gpu-check/).
#   DATA=data/ende-demo bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check}
mkdir -p "$out"
status=0
python - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), "no CUDA device"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}")
PY
echo "== 1. engine equivalence and sharing on CUDA"
NMT_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider \
    tests/test_engine_equivalence.py tests/test_engine_sharing.py 2>&1 | tee "$out/tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== 2. memreport on CUDA"
python -m nmt memreport --config configs/seed-4x600.yaml --device cuda \
    --json "$out/memreport-seed-4x600.json" 2>&1 | tee "$out/memreport.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== 3. training speed on CUDA"
data=${DATA:-../shared/corpora/ende-demo}
if [ -f "$data/src-train.txt" ]; then
    python scripts/bench_train.py --device cuda --steps 30 --data "$data" 2>&1 | tee "$out/bench.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
    echo "skipped: no ende-demo corpus in $data (set DATA=folder)"
    status=1
fi
exit $status
