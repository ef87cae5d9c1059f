#!/usr/bin/env bash
# What the CPU test suite can only fake, checked on a real GPU in one run (planned to take
# under 8 minutes on one modern GPU; needs no network and nothing outside the repository):
#   engine     the engine's gradient-equivalence and bitwise-sharing tests on the device,
#              and the kernel encoder's (cuDNN's LSTM and GRU), with deterministic algorithms;
#              the fused granularity's cells there run torch's fused CUDA cell kernels
#              (`nmt.kernels.cuda_cells`), checked against the reference cell (test_kernels)
#   train      nmt train on configs/toy.yaml (data/toy)
#   repeat     the same training run twice, and once stopped halfway and resumed,
#              deterministic: bitwise equal parameters
#   translate  nmt translate of the toy test set with that model: BLEU >= 90; the search's
#              steps replayed as CUDA graphs write what eager steps write (--cuda-graphs off),
#              with and without --block-ngram-repeat 2 --unk-penalty 0.5
#              --coverage-penalty 0.2, and sampled
#              with a seed;
#              --quantize int8 refused on CUDA in one line, float32's translations written
#   memreport  nmt memreport --device cuda on configs/seed-4x600.yaml: max_memory_allocated
#              within 10% of the accounted total, per policy
#   precision  nmt train, translate and memreport in bfloat16 and float16 (loss scaling);
#              what train.precision auto chooses
#   graphs     scripts/graphs_check.py: training steps replayed as CUDA graphs bitwise equal
#              to the same steps run eagerly, float32 and bfloat16, through a learning-rate
#              decay and a skipped non-finite step (the CPU form emulates the graphs)
#   2 ranks    a 2-rank torchrun run, when two GPUs are visible
#   bench      scripts/bench_train.py --device cuda on the toy corpus, float32 and bfloat16,
#              each deterministic mode (last: the only check that measures rather than proves)
# It ends with one summary table and exits 1 if any check failed. Logs go to $OUT
# (default gpu-check/).
#
#   bash scripts/gpu_check.sh                        # on a machine with a CUDA GPU
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh   # the same checks, tiny, on the CPU
#   GPU_CHECK_SKIP="engine bench" bash scripts/gpu_check.sh   # leave these checks out
#
# The CPU form (small sizes, a few steps, BLEU not required, 2 Gloo ranks, the engine tests
# of one structure per cell and granularity with general attention, which the suite runs in
# full) is run by the test suite so that this script cannot rot; it proves nothing about CUDA.
set -uo pipefail
cd "$(dirname "$0")/.."
device=${GPU_CHECK_DEVICE:-cuda}
out=${OUT:-gpu-check}
py=${PYTHON:-python}
mkdir -p "$out"
case $device in
cuda) ;;
cpu) export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ;;
*) echo "GPU_CHECK_DEVICE must be cuda or cpu, not $device" >&2; exit 2 ;;
esac

"$py" - "$device" <<'PY' | tee "$out/device.txt" || exit 1
import sys, torch
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible: run on a GPU machine, or GPU_CHECK_DEVICE=cpu")
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {names}")
else:
    print(f"torch {torch.__version__}, cpu (a rehearsal: nothing here runs on CUDA)")
PY
gpus=0
[ "$device" = cuda ] && gpus=$("$py" -c "import torch; print(torch.cuda.device_count())")

if [ "$device" = cuda ]; then
    train_sets=(--set train.device=cuda)
    test_lines=500 min_bleu=90 beam=5
    engine_sel=()
    engine_workers=${GPU_CHECK_WORKERS:-8}  # test processes sharing the GPU (0: this one)
    mem_args=(--config configs/seed-4x600.yaml --device cuda)
    bench_args=(--device cuda --steps 30 --set train.loss_chunk=8  # as docs/speed.md's table
        --variants clones-nngraph,clones-fused,clones-fused-per-position,autograd-kernel
        --precisions float32,bfloat16
        --determinism on,nofill,off)
    ranks_sets=(--set train.device=cuda --set train.max_steps=100 --set train.valid_every=50)
    repeat_sets=(--set train.device=cuda --set train.valid_bleu_sample=0) repeat_steps=60
    low_sets=(--set train.device=cuda --set train.max_steps=300 --set train.valid_every=150)
    low_mem=(--config configs/seed-4x600.yaml --device cuda)
    low_precisions=(bfloat16 float16)
    graphs_args=(--device cuda --precisions float32,bfloat16 --steps 24)
else
    small=(--set data.tokenizer=word --set model.rnn_size=32 --set model.word_vec_size=16)
    train_sets=("${small[@]}" --set train.device=cpu --set train.max_steps=30
        --set train.valid_every=15)
    test_lines=40 min_bleu=0 beam=2
    engine_sel=(-k "general-L3-feed-bi-drop")
    engine_workers=0
    mem_args=(--config configs/toy.yaml --device cpu "${small[@]}" --set train.batch_size=8
        --set data.max_src_len=12 --set data.max_tgt_len=12)
    bench_args=(--device cpu --steps 3 --layers 1 --rnn 32 --batch 16)
    ranks_sets=("${small[@]}" --set train.device=cpu --set train.max_steps=4
        --set train.valid_every=2)
    repeat_sets=("${small[@]}" --set train.device=cpu --set train.valid_bleu_sample=0)
    repeat_steps=4
    low_sets=("${small[@]}" --set train.device=cpu --set train.max_steps=4
        --set train.valid_bleu_sample=0)
    low_mem=(--config configs/toy.yaml --device cpu "${small[@]}" --set train.batch_size=8
        --set data.max_src_len=12 --set data.max_tgt_len=12)
    low_precisions=(bfloat16)  # the rehearsal of the loop; the suite runs float16 on the CPU
    graphs_args=(--device cpu --precisions float32 --steps 12)
fi

# the test lines translate and precision translate (each check can run without the others)
head -n "$test_lines" data/toy/test.src > "$out/test.src"
head -n "$test_lines" data/toy/test.tgt > "$out/test.tgt"

names=() results=() times=() details=()
failed=0
check() {  # check NAME DETAIL_FUNCTION COMMAND...: run, log to $out/NAME.log, record
    local name=$1 detail=$2 start=$SECONDS rc
    shift 2
    if [[ " ${GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
        skip "$name" "in GPU_CHECK_SKIP"
        return
    fi
    echo "== $name"
    "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    names+=("$name")
    times+=($((SECONDS - start)))
    details+=("$("$detail" "$out/$name.log" 2>/dev/null | tail -n 1)")
    if [ "$rc" -eq 0 ]; then results+=(pass); else results+=(FAIL); failed=1; fi
}
skip() {  # skip NAME WHY
    names+=("$1") results+=(skip) times+=(0) details+=("$2")
}

last_line() { grep -v '^\s*$' "$1" | tail -n 1; }
trained() { grep -o 'done: .*perplexity [0-9.]*' "$1"; }
bleu() { grep -o '^BLEU = [0-9.]*' "$1" | sed "s/\$/ (required: >= $min_bleu)/"; }
allocated() {  # cuda: each policy's allocated-vs-accounted verdict; cpu: the byte checks
    if grep -q 'max_memory_allocated .* vs accounted' "$1"; then
        grep -o '^[a-z]*: max_memory_allocated .*' "$1" | sed 's/max_memory_allocated .*: //' |
            paste -sd ';' -
    else
        echo "$(grep -cE '^(none|attention|all|recompute|autograd) .* yes$' "$1")/5 policies match byte for byte"
    fi
}
speed() {  # clones against autograd, recompute against sharing, precisions against float32,
    # deterministic modes against "on"
    grep -oE '^(ratios vs|step time recompute / all|[a-z-]+[@/][a-z0-9/]+ / ).*' "$1" |
        paste -sd ';' -
}
graphed() {  # each precision's verdict
    grep -E '^[a-z0-9]+: [0-9]+ steps' "$1" | sed 's/ ([0-9]* captured[^)]*)//' | paste -sd ';' -
}
low_results() {  # each low precision's BLEU or failure, and what auto chooses
    grep -E '^([a-z0-9]+: (BLEU|[a-z]+ FAILED)|train.precision auto: )' "$1" | paste -sd ';' -
}

run_engine() {
    NMT_TEST_DEVICE=$device "$py" -m pytest -q -n "$engine_workers" -p no:cacheprovider \
        tests/test_engine_equivalence.py tests/test_engine_sharing.py tests/test_nn_rnn.py \
        tests/test_kernels.py \
        "${engine_sel[@]}"
}
run_repeat() {  # deterministic (the default): two runs from one seed, and a third stopped
    # halfway and resumed from its last.pt, end with equal bits
    local run half=$((repeat_steps / 2))
    rm -f "$out"/repeat-{a,b,c}.log
    for run in a b; do
        train_toy "$out/repeat-$run" --set train.max_steps=$repeat_steps || return 1
    done
    train_toy "$out/repeat-c" --set train.max_steps=$half || return 1
    train_toy "$out/repeat-c" --set train.max_steps=$repeat_steps \
        --resume "$out/repeat-c/last.pt" || return 1
    "$py" - "$out"/repeat-{a,b,c}/last.pt <<'PY'
import sys, torch
a, b, c = (torch.load(p, weights_only=True)["model"] for p in sys.argv[1:])
same = lambda x: sum(torch.equal(a[k], x[k]) for k in a)
print(f"parameters bitwise equal: {same(b)} of {len(a)} tensors (repeated),"
      f" {same(c)} of {len(a)} (stopped halfway and resumed)")
sys.exit(0 if same(b) == same(c) == len(a) else 1)
PY
}
train_toy() {  # train_toy DIR ARGS...: a quiet toy run of the repeat check, logged in DIR.log
    local dir=$1
    shift
    "$py" -m nmt train --config configs/toy.yaml --out "$dir" --force --no-progress \
        "${repeat_sets[@]}" "$@" >> "$dir.log" 2>&1
}
run_train() {
    "$py" -m nmt train --config configs/toy.yaml --out "$out/toy" --force --no-progress \
        "${train_sets[@]}"
}
run_translate() {
    "$py" -m nmt translate --model "$out/toy/model.pt" --src "$out/test.src" \
        --ref "$out/test.tgt" --output "$out/test.hyp" --beam-size "$beam" --device "$device" \
        --no-progress || return 1
    # sacreBLEU prints its line on stderr, which check() logs with the rest; on CUDA the
    # search's steps replayed as graphs (--cuda-graphs auto): every step eager must write
    # the same translations
    "$py" -m nmt translate --model "$out/toy/model.pt" --src "$out/test.src" \
        --output "$out/test-eager.hyp" --beam-size "$beam" --device "$device" --no-progress \
        --cuda-graphs off || return 1
    cmp "$out/test.hyp" "$out/test-eager.hyp" ||
        { echo "translations with --cuda-graphs off differ from the default's"; return 1; }
    # n-gram blocking replays too (its step reads the whole history buffer, masked by the
    # position on the device), and so do the <unk> and coverage penalties (the coverage a
    # buffer of the workspace): the same pair with all three
    local ngram
    for ngram in auto off; do
        "$py" -m nmt translate --model "$out/toy/model.pt" --src "$out/test.src" \
            --output "$out/test-ngram-$ngram.hyp" --beam-size "$beam" --device "$device" \
            --no-progress --block-ngram-repeat 2 --unk-penalty 0.5 --coverage-penalty 0.2 \
            --cuda-graphs "$ngram" ||
            return 1
    done
    cmp "$out/test-ngram-auto.hyp" "$out/test-ngram-off.hyp" ||
        { echo "blocking and both penalties: --cuda-graphs off differs"; return 1; }
    # sampling replays too, its graphs told of the search's generator: the same seed draws
    # the same translations replayed and eager, and another seed other ones
    local draws
    for draws in auto:3 off:3 auto:4; do
        "$py" -m nmt translate --model "$out/toy/model.pt" --src "$out/test.src" \
            --output "$out/test-sample-${draws/:/-}.hyp" --device "$device" --no-progress \
            --random-sampling-topk -1 --random-sampling-temp 1.5 --seed "${draws#*:}" \
            --cuda-graphs "${draws%:*}" || return 1
    done
    cmp "$out/test-sample-auto-3.hyp" "$out/test-sample-off-3.hyp" ||
        { echo "sampling: --cuda-graphs off draws other translations than the default"; return 1; }
    ! cmp -s "$out/test-sample-auto-3.hyp" "$out/test-sample-auto-4.hyp" ||
        { echo "sampling: seeds 3 and 4 drew the same translations"; return 1; }
    # --quantize int8 serves the CPU only: on CUDA one line says so and float32 runs (the
    # same translations as the default's); on the CPU the int8 output layer runs
    "$py" -m nmt translate --model "$out/toy/model.pt" --src "$out/test.src" \
        --output "$out/test-int8.hyp" --beam-size "$beam" --device "$device" --progress \
        --quantize int8 2>"$out/test-int8.err" || return 1
    if [[ $device == cuda* ]]; then
        grep -q -- "--quantize int8: 8-bit products run on the CPU only" "$out/test-int8.err" ||
            { echo "--quantize int8 on CUDA: no line saying it runs float32"; return 1; }
        cmp "$out/test.hyp" "$out/test-int8.hyp" ||
            { echo "--quantize int8 on CUDA: not the float32 translations"; return 1; }
    else
        grep -q "quantize: int8 output layer" "$out/test-int8.err" ||
            { echo "--quantize int8 on the CPU: the int8 output layer did not run"; return 1; }
    fi
}
run_memreport() {
    "$py" -m nmt memreport "${mem_args[@]}" --json "$out/memreport.json"
}
run_bench() {  # bench_train.py reads the ende-demo file names: the toy corpus under them
    local d="$out/toy-bench"
    mkdir -p "$d"
    ln -sf "$PWD/data/toy/train.src" "$d/src-train.txt"
    ln -sf "$PWD/data/toy/train.tgt" "$d/targ-train.txt"
    ln -sf "$PWD/data/toy/valid.src" "$d/src-val.txt"
    ln -sf "$PWD/data/toy/valid.tgt" "$d/targ-val.txt"
    "$py" scripts/bench_train.py --data "$d" "${bench_args[@]}"
}
run_precision() {  # each low precision trains, translates, and memreport checks it; a
    # failure is named and the next precision still runs, so one lease sees every failure
    local p rc=0
    for p in "${low_precisions[@]}"; do
        if ! "$py" -m nmt train --config configs/toy.yaml --out "$out/toy-$p" --force \
            --no-progress --set train.precision=$p "${low_sets[@]}" > "$out/toy-$p.log" 2>&1; then
            echo "$p: training FAILED ($out/toy-$p.log)"
            rc=1
            continue
        fi
        "$py" -m nmt translate --model "$out/toy-$p/model.pt" --src "$out/test.src" \
            --ref "$out/test.tgt" --output "$out/test-$p.hyp" --device "$device" --no-progress \
            2>&1 | grep -o '^BLEU = [0-9.]*' | sed "s/^/$p: /" ||
            { echo "$p: translation FAILED"; rc=1; }
        "$py" -m nmt memreport "${low_mem[@]}" --precision "$p" > "$out/memreport-$p.log" 2>&1 ||
            { echo "$p: memreport FAILED: $(tail -n 1 "$out/memreport-$p.log")"; rc=1; }
    done
    # what train.precision auto chooses on this device (accounted on meta: no step runs)
    "$py" -m nmt memreport "${low_mem[@]}" --device meta --precision auto 2>&1 >/dev/null \
        | grep '^train.precision auto: ' || rc=1
    return $rc
}
run_graphs() {
    "$py" scripts/graphs_check.py "${graphs_args[@]}"
}
run_ranks() {
    "$py" -m torch.distributed.run --standalone --nproc_per_node 2 -m nmt train \
        --config configs/toy.yaml --out "$out/toy-2ranks" --force --no-progress \
        "${ranks_sets[@]}"
}
bleu_ok() {
    local b
    b=$(grep -o '^BLEU = [0-9.]*' "$out/translate.log" | grep -o '[0-9.]*$')
    [ -n "$b" ] && awk -v b="$b" -v m="$min_bleu" 'BEGIN { exit !(b >= m) }'
}

check engine last_line run_engine
check train trained run_train
check repeat last_line run_repeat
check translate bleu run_translate
if [ "${results[-1]}" = pass ] && ! bleu_ok; then results[-1]=FAIL; failed=1; fi
check memreport allocated run_memreport
check precision low_results run_precision
check graphs graphed run_graphs
if [ "$device" = cpu ] || [ "$gpus" -ge 2 ]; then
    check 2-ranks trained run_ranks
else
    skip 2-ranks "one GPU visible"
fi
check bench speed run_bench

echo
echo "gpu_check on $device: $(cat "$out/device.txt")"
printf '%-10s %-6s %8s  %s\n' check result seconds detail
for i in "${!names[@]}"; do
    printf '%-10s %-6s %8s  %s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}" "${details[$i]}"
done
exit $failed
