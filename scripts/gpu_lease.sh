#!/usr/bin/env bash
# Everything a lent GPU should run, as one prepared command: what the CPU can only rehearse, in the
# order a short lease should spend it. Parts (GPU_LEASE_PARTS, in this order by default):
#   peer       scripts/bench_peer.py --device cuda: nmt against OpenNMT-py 3.5.1 on the same
#              GPU in one run (training; beam 5 at batch 16 and 64, greedy at 64, sampling
#              from every word at 64), one turn
#   translate  scripts/bench_translate.py --device cuda --cuda-graphs off,on: the search's
#              steps eager and replayed as CUDA graphs, beam 5 and greedy, batch 64
#   train      scripts/bench_train.py --device cuda --graphs: the training step eager and
#              replayed, float32 and bfloat16
#   check      scripts/gpu_check.sh without its own bench (GPU_CHECK_SKIP, default "bench":
#              the parts above measure): every correctness check of CUDA
#   bleu       the toy model check trained on the GPU, decoded on the CPU too: the two BLEU
#              scores of its test set within 0.1
#   multi30k   configs/multi30k.yaml trained on the GPU for GPU_LEASE_MULTI30K_EPOCHS (3) in
#              float32, its test set (test_2016_flickr) decoded there and on the CPU: the two
#              BLEU scores within 0.1 (not in the default parts: after them, where a lease
#              has time left)
# Each part logs to $WORK/PART.log (default gpu-lease/); the end prints one table and, where
# the device tool's $OUT is set, packs the logs and JSON files into $OUT/gpu-lease.tgz
# (its returned files are few) beside summary.txt. Exit 1 if a part failed.
#
#   bash scripts/gpu_lease.sh prepare        # here, with the package index: see below
#   bash scripts/gpu_lease.sh                # on the GPU machine, from the repository root
#   GPU_LEASE_PARTS="check" bash scripts/gpu_lease.sh          # one part
#   GPU_LEASE_DEVICE=cpu bash scripts/gpu_lease.sh   # the rehearsal: every part tiny,
#                                                        # on the CPU
#
# `prepare` fills two ignored folders that the device call carries (they travel as carried
# paths, 64 MiB at most with the tree): .whl/, the wheels of OpenNMT-py and of those of its
# imports the GPU image lacks, for its Python (GPU_PYTHON_VERSION, default 3.12); and
# .gpu-data/ende-demo and .gpu-data/multi30k, copies of ../shared/corpora's (the GPU machine
# sees nothing outside the repository), and .gpu-data/absent, stand-ins for two packages OpenNMT-py
# imports and never uses here (below). On the GPU machine the wheels go to a folder of their
# own on PYTHONPATH, and OpenNMT-py runs on that machine's torch (it pins torch < 2.3; it runs
# on 2.13 in bench_peer's own venv on the CPU, and has not yet run on the GPU image's
# 2.11). The rehearsal runs the same
# path: `GPU_PYTHON_VERSION=3.11 bash scripts/gpu_lease.sh prepare` fetches the wheels for
# this machine's Python instead (prepare again before the GPU run).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}

# OpenNMT-py 3.5.1 and what it imports that the GPU image (its package list: the device
# notes) does not hold; the versions bench_peer.py's venv uses
WHEELS=(OpenNMT-py==3.5.1 configargparse==1.9.0 pyonmttok==1.38.1 pyahocorasick==2.3.1
    rapidfuzz==3.14.6)

if [ "${1:-}" = prepare ]; then
    version=${GPU_PYTHON_VERSION:-3.12}
    rm -rf .whl .gpu-data/absent
    mkdir -p .whl .gpu-data/absent
    for spec in "${WHEELS[@]}"; do
        "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
            --implementation cp --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform any -d .whl "$spec" || { echo "prepare: $spec: no wheel" >&2; exit 1; }
    done
    # spacy and fasttext: imported by OpenNMT-py's terminology and clean transforms, which
    # it imports with the rest and these runs never use; their wheels and spacy's would
    # pass the carry limit, so stand-ins take their names and fail if anything uses them
    for name in spacy fasttext; do
        mkdir -p ".gpu-data/absent/$name"
        printf 'def __getattr__(name):\n    raise ImportError("%s is not installed here (a stand-in of scripts/gpu_lease.sh)")\n' \
            "$name" > ".gpu-data/absent/$name/__init__.py"
    done
    rm -rf .gpu-data/ende-demo .gpu-data/multi30k
    cp -r ../shared/corpora/ende-demo .gpu-data/ende-demo || exit 1
    mkdir -p .gpu-data/multi30k
    cp -r ../shared/corpora/multi30k/tok .gpu-data/multi30k/tok || exit 1
    du -sh .whl .gpu-data
    echo "carry: .whl .gpu-data"
    exit 0
fi

device=${GPU_LEASE_DEVICE:-cuda}
work=${WORK:-gpu-lease}
parts=${GPU_LEASE_PARTS:-peer translate train check bleu}
onmt_python=${ONMT_PYTHON:-$py}
mkdir -p "$work"
case $device in
cuda | cpu) ;;
*) echo "GPU_LEASE_DEVICE must be cuda or cpu, not $device" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # nmt from this checkout, installed or not
if compgen -G ".whl/*.whl" > /dev/null; then
    site=/tmp/nmt-gpu-lease-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:$site"
fi
[ -d .gpu-data/absent ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpu-data/absent"  # last: a
# real spacy or fasttext, where one is installed, comes first
data=${GPU_LEASE_DATA:-.gpu-data/ende-demo}  # the ende-demo file names (bench_peer's)
[ -d "$data" ] || data=../shared/corpora/ende-demo

if [ "$device" = cuda ]; then
    peer_args=(--device cuda --threads 2 --repeats 1 --variants clones-fused --sample-topk -1)
    translate_args=(--device cuda --threads 0 --train-steps 300 --lines 500 --batch-size 64
        --beams 5,1 --granularities fused --cuda-graphs off,on)
    train_args=(--device cuda --steps 30 --set train.loss_chunk=8 --graphs
        --variants clones-fused,autograd-kernel --precisions float32,bfloat16)
    multi30k_sets=(--set "train.epochs=${GPU_LEASE_MULTI30K_EPOCHS:-3}")
else
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
    peer_args=(--device cpu --threads 1 --repeats 1 --variants clones-fused --steps 4
        --log-every 2 --sentences 4 --rnn 32 --sample-topk -1)
    translate_args=(--device cpu --threads 1 --train-steps 5 --layers 1 --rnn 32 --lines 8
        --batch-size 4 --beams 5,1 --granularities fused --cuda-graphs off,on)
    train_args=(--device cpu --steps 2 --layers 1 --rnn 32 --batch 16 --graphs
        --variants clones-fused --precisions float32)
    multi30k_sets=(--set train.max_steps=3 --set model.rnn_size=32 --set model.word_vec_size=32
        --set model.num_layers=1 --set translate.max_length=10 --set data.src_vocab_size=100
        --set data.tgt_vocab_size=100)
fi

for name in $parts; do
    case $name in
    peer | translate | train | check | bleu | multi30k) ;;
    *) echo "GPU_LEASE_PARTS: no part $name (peer translate train check bleu multi30k)" >&2
        exit 2 ;;
    esac
done

names=() results=() times=()
failed=0
part() {  # part NAME COMMAND...: run, log to $work/NAME.log, record
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name"
    "$@" 2>&1 | tee "$work/$name.log"
    rc=${PIPESTATUS[0]}
    names+=("$name") times+=($((SECONDS - start)))
    if [ "$rc" -eq 0 ]; then results+=(pass); else results+=(FAIL); failed=1; fi
}

same_bleu() {  # the check's toy model and test lines, decoded here on the CPU as there
    local c=$work/check
    [ -f "$c/toy/model.pt" ] || { echo "no $c/toy/model.pt: run the check part first"; return 1; }
    "$py" -m nmt translate --model "$c/toy/model.pt" --src "$c/test.src" --ref "$c/test.tgt" \
        --output "$work/test-cpu.hyp" --beam-size 5 --device cpu --no-progress \
        2> "$work/bleu-cpu.log" || return 1
    within_01 "$(bleu_of "$c/translate.log")" "$(bleu_of "$work/bleu-cpu.log")"
}

bleu_of() {  # bleu_of LOG: the score of the first sacreBLEU line of nmt translate's stderr
    grep -o '^BLEU = [0-9.]*' "$1" | head -n 1 | grep -o '[0-9.]*$'
}

within_01() {  # within_01 A B: both scores there, and at most 0.1 apart
    echo "BLEU $device $1, cpu $2"
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d <= 0.1 && d >= -0.1) }'
}

multi30k_bleu() {  # configs/multi30k.yaml trained here, its test set decoded here and on the CPU
    local m=$work/multi30k d=${GPU_LEASE_MULTI30K:-.gpu-data/multi30k}/tok where
    [ -d "$d" ] || d=../shared/corpora/multi30k/tok
    "$py" -m nmt train --config configs/multi30k.yaml --out "$m" --force \
        --set "data.train_src=$d/train.lc.norm.tok.en" \
        --set "data.train_tgt=$d/train.lc.norm.tok.de" \
        --set "data.valid_src=$d/val.lc.norm.tok.en" --set "data.valid_tgt=$d/val.lc.norm.tok.de" \
        --set train.precision=float32 --set train.early_stopping=0 \
        --set train.early_stopping_metric=ppl \
        --set train.valid_bleu_sample=0 --set "train.device=$device" "${multi30k_sets[@]}" \
        || return 1
    for where in "$device" cpu; do
        "$py" -m nmt translate --model "$m/model.pt" --src "$d/test_2016_flickr.lc.norm.tok.en" \
            --ref "$d/test_2016_flickr.lc.norm.tok.de" --output "$m/test-$where.hyp" \
            --device "$where" --no-progress 2> "$m/translate-$where.log" || return 1
    done
    within_01 "$(bleu_of "$m/translate-$device.log")" "$(bleu_of "$m/translate-cpu.log")"
}

"$py" - "$device" <<'PY' | tee "$work/device.txt" || exit 1
import sys, torch
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device visible: run on a GPU machine, or GPU_LEASE_DEVICE=cpu")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
PY
for name in $parts; do
    case $name in
    peer) part peer "$py" scripts/bench_peer.py "${peer_args[@]}" --data "$data" \
        --onmt-python "$onmt_python" --work "$work/peer" --json "$work/peer.json" ;;
    translate) part translate "$py" scripts/bench_translate.py "${translate_args[@]}" \
        --data "$data" ;;
    train) part train "$py" scripts/bench_train.py "${train_args[@]}" --data "$data" ;;
    check) part check env OUT="$work/check" GPU_CHECK_DEVICE="$device" PYTHON="$py" \
        GPU_CHECK_SKIP="${GPU_CHECK_SKIP:-bench}" bash scripts/gpu_check.sh ;;
    bleu) part bleu same_bleu ;;
    multi30k) part multi30k multi30k_bleu ;;
    esac
done

{
    echo "gpu_lease on $device: $(cat "$work/device.txt")"
    printf '%-10s %-6s %8s\n' part result seconds
    for i in "${!names[@]}"; do
        printf '%-10s %-6s %8s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
    done
} | tee "$work/summary.txt"
if [ -n "${OUT:-}" ]; then
    cp "$work/summary.txt" "$OUT/" 2>/dev/null
    tar czf "$OUT/gpu-lease.tgz" --exclude='*.pt' --exclude='prepared' --exclude='data' \
        -C "$work" . 2>/dev/null
fi
exit $failed
