#!/usr/bin/env bash
# Everything the GPU work asks of a lent GPU, in one command (the device tool's machine starts bare
# and stays warm only seconds between calls). Run from the repository root:
#     tools/gpu_session.sh STAGE...      (stages: facts cuda-tests all-tests profile products
#                                        levels refactor ranges variants quick-bench bench
#                                        training training-profile ablation)
# SST trees are read from $TREES (default .gpu/test.txt, a copy carried with the call, since
# ../shared does not travel). Logs and results go to $OUT (default ./gpu-out). Each stage has a
# time limit; those of one call must add up to less than the call's (all-tests ~400 s on 16
# cores, quick-bench ~220 s (limit 300 s), cuda-tests (every test file that runs backend="cuda") with
# PYTEST_ARGS="-n 12"; the tests no GPU has passed yet (.gpu/pending-tests.txt, which
# tools/gpu_inputs.sh writes) run first), profile ~20 s,
# products, at 256 and 512 threads a block and on TreeFC's shape, direct and staged through
# shared memory, and MV-RNN's W_M in row groups, ~70 s: limit 150 s;
# levels, us a batch as chosen (unrefactored, block packs), on grids of 32 and 64 blocks, and
# with the grid's packs, and each packed product in tiles of its own, LEVELS_ARGS to
# gpu_levels.py;
# refactor, the per-forest refactoring choice against both schedules, REFACTOR_ARGS to
# gpu_schedules.py; ranges, the bench's batches with and without node ranges, RANGES_ARGS to
# gpu_schedules.py; variants, the bench's batches under the default and each schedule that
# turns one of the unmeasured choices off, ~11 kernels to compile (a variant whose source is
# the default's, as MV-RNN's unranged, comes from numba's cache), VARIANTS_ARGS to
# gpu_schedules.py); training, VPPS's training step (X=H=256, batches of 1, 10 and 25) with
# recjit's vjp on the GPU and PyTorch level-batched on CUDA, from .gpu/train.txt, TRAINING_ARGS
# to bench_training.py); training-profile, that step's phases timed and its device calls
# counted, ~60 s with its kernels compiled (tools/gpu_training_profile.py, from .gpu/train.txt,
# TRAINING_PROFILE_ARGS to it).
# PROFILE_ARGS and BENCH_ARGS (default --machine gpu-quick) go to gpu_profile.py and bench.py.
# The full bench takes more than one call's 600 s on an H100 (third GPU session), more with
# DyNet carried in: run it in several calls, FULL_BENCH_ARGS="--models A,B --machine NAME-1",
# then the other models as NAME-2, ..., and `bench.py --merge` the parts. A call that its limit
# stops leaves the rows it measured in NAME-k.partial.json, which --merge takes as well.
# BENCH_LIMIT and ABLATION_LIMIT change those stages' limits, ABLATION_ARGS goes to ablation.py
# (the whole ablation took ~410 s on an H200, its plot last: limit 450 s).
# After each stage the kernel cache goes to $OUT/kernels.tar.xz.part-aa, -ab (at most 2 parts of
# 15 MiB); copy them to .gpu/ here and the next call (carry .gpu) starts with those kernels
# compiled. The device tool brings back 8 files a call: a call of many stages may want fewer.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD RECJIT_CACHE_DIR=${RECJIT_CACHE_DIR:-/tmp/recjit-cache}
OUT=${OUT:-$PWD/gpu-out}
TREES=${TREES:-.gpu/test.txt}
mkdir -p "$OUT"
# The wheels carried in .whl (tools/gpu_inputs.sh: an older NumPy, since the image's 2.5 lacks
# np.row_stack, which numba-cuda 0.30 registers at import; DyNet, which the image lacks) are
# installed first.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
# The kernels earlier calls compiled (each call's $OUT/kernels.tar.xz.part-*, copied to .gpu/
# and carried back in): a fused kernel took 15-250 s to compile on the device machine, which
# starts bare whenever it went idle between calls, and the seventh and eighth sessions' calls
# spent most of their time compiling (numba's IR inliner; docs/cuda.md, "Compile time").
# numba's cache takes them as they are (recjit/generated.py gives every generated file one
# modification time).
if ls .gpu/kernels.tar.xz.part-* >/dev/null 2>&1; then
    mkdir -p "$RECJIT_CACHE_DIR" && cat .gpu/kernels.tar.xz.part-* \
        | tar -xJf - -C "$RECJIT_CACHE_DIR" \
        && echo "=== kernels carried in: $(ls "$RECJIT_CACHE_DIR/kernels" | wc -l) files"
fi
MARK=$(mktemp)  # results written after this are copied to $OUT

# The kernel cache, for the next call to carry in, in parts of the files the device tool brings
# back (16 MiB each), if it fits in two: the wheels (~23 MiB) and two parts keep what a call
# carries under its 64 MiB.
save_kernels() {
    [ -d "$RECJIT_CACHE_DIR/kernels" ] || return
    rm -f "$OUT"/kernels.tar.xz.part-*
    tar -cf - -C "$RECJIT_CACHE_DIR" kernels | xz -T0 -6 \
        | split -b 15M - "$OUT/kernels.tar.xz.part-"
    local parts
    parts=$(ls "$OUT"/kernels.tar.xz.part-* | wc -l)
    if [ "$parts" -gt 2 ]; then
        rm -f "$OUT"/kernels.tar.xz.part-*
        echo "=== the kernel cache is over 30 MiB compressed: not kept"
    else
        echo "=== the kernel cache: $parts part(s) in $OUT"
    fi
}

stage() {
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s)"
    local start=$SECONDS
    # SIGINT first: pytest stopped by it still prints the failures' tracebacks.
    timeout -s INT -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local status=$?
    echo "=== $name: exit $status after $((SECONDS - start))s"
    tail -n 25 "$OUT/$name.log"
}

for name in "$@"; do
    case $name in
        facts) stage facts 60 bash -c 'nvidia-smi; python3 -c "
import sys, numpy, numba, llvmlite, numba_cuda, torch, hypothesis
from numba import cuda
d = cuda.get_current_device()
print(sys.version.split()[0], \"numpy\", numpy.__version__, \"numba\", numba.__version__,
      \"llvmlite\", llvmlite.__version__, \"numba-cuda\", numba_cuda.__version__,
      \"torch\", torch.__version__, \"hypothesis\", hypothesis.__version__)
try:
    import dynet_config
    print(\"DyNet\", dynet_config.__file__)
except ImportError:
    print(\"DyNet absent: carry its wheel (tools/gpu_inputs.sh)\")
print(d.name, \"sm\", d.compute_capability, \"SMs\", d.MULTIPROCESSOR_COUNT,
      \"driver\", cuda.cudadrv.driver.get_version(), \"runtime\", cuda.runtime.get_version())"' ;;
        cuda-tests) RECJIT_TESTS_FIRST=.gpu/pending-tests.txt \
            stage cuda-tests ${TEST_LIMIT:-270} python3 -m pytest -p no:cacheprovider -rs \
            -v --tb=short -o faulthandler_timeout=80 --durations=10 ${PYTEST_ARGS:-} \
            $(python3 tools/gpu_pending_tests.py --files) ;;
        all-tests) stage all-tests ${ALL_LIMIT:-400} python3 -m pytest -p no:cacheprovider -rs -v \
            --tb=short -n 8 ;;
        profile) stage profile ${PROFILE_LIMIT:-150} python3 tools/gpu_profile.py --trees "$TREES" ${PROFILE_ARGS:-} ;;
        products) stage products 150 bash -c 'set -e
            for threads in 256 512; do python3 tools/gpu_products.py --threads $threads; done
            for threads in 256 512; do
                python3 tools/gpu_products.py --threads $threads --rows 256 --columns 512 \
                    --nodes 1,10,40,160,640 --tile-nodes 20
            done
            python3 tools/gpu_products.py --rows 64 --columns 128 --nodes 1,64,640,2304' ;;
        levels) stage levels ${LEVELS_LIMIT:-300} python3 tools/gpu_levels.py \
            ${LEVELS_ARGS:---models tree_fc,tree_lstm --depths 1,8,32,64 \
            --variants default,blocks32,blocks64,staged,gridpacked,unshared} ;;
        refactor) stage refactor ${REFACTOR_LIMIT:-300} python3 tools/gpu_schedules.py \
            --trees "$TREES" ${REFACTOR_ARGS:-} ;;
        ranges) stage ranges ${RANGES_LIMIT:-300} python3 tools/gpu_schedules.py \
            --trees "$TREES" --schedules default,unranged ${RANGES_ARGS:---models \
            tree_fc,dag_rnn,tree_lstm,tree_gru,tree_rnn --hidden 256} ;;
        variants) stage variants ${VARIANTS_LIMIT:-540} python3 tools/gpu_schedules.py \
            --trees "$TREES" ${VARIANTS_ARGS:---models tree_fc,tree_lstm,mv_rnn \
            --hidden small --count 4 --rounds 8 \
            --schedules default,unranged,staged,gridpacked,ungrouped,unshared} ;;
        quick-bench) stage quick-bench ${QUICK_LIMIT:-300} python3 benchmarks/bench.py --quick --cuda \
            --trees "$TREES" ${BENCH_ARGS:---machine gpu-quick} ;;
        bench) stage bench ${BENCH_LIMIT:-560} python3 benchmarks/bench.py --cuda --trees "$TREES" \
            ${FULL_BENCH_ARGS:-} ;;
        training) stage training ${TRAINING_LIMIT:-240} python3 benchmarks/bench_training.py \
            --vpps --cuda --data .gpu ${TRAINING_ARGS:---machine gpu-training} ;;
        training-profile) stage training-profile ${TRAINING_PROFILE_LIMIT:-200} python3 \
            tools/gpu_training_profile.py --data .gpu ${TRAINING_PROFILE_ARGS:-} ;;
        ablation) stage ablation ${ABLATION_LIMIT:-450} python3 benchmarks/ablation.py --cuda \
            --trees "$TREES" ${ABLATION_ARGS:-} ;;
        *) echo "unknown stage $name"; exit 2 ;;
    esac
    find benchmarks/results -newer "$MARK" \( -name "*.json" -o -name "*.md" \) \
        -exec cp {} "$OUT"/ \;
    save_kernels
done
