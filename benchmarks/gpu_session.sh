#!/usr/bin/env bash
# The one call of a session lent a GPU (issue 39): the torch engine's tests on the GPU, then
# benchmarks/gpu_engine.py at issue 39's sizes; everything it prints is also written under $OUT
# (default ./gpu-out): card.txt, engine_tests.txt, gpu_engine.txt, gpu_engine.md (the table for
# docs/benchmarks/measured.md), ranking_pass.txt (benchmarks/ranking_pass.py on the device),
# profile.tar.gz (torch.profiler tables of search and evaluate) and gaps.txt (benchmarks/gpu_trace.py:
# where the device idles in evaluate). TEST_SECONDS, BENCH_SECONDS, KERNEL_SECONDS and
# TRACE_SECONDS bound each part (0 skips the last two), PROFILE=0 skips the tables.
#
# Prepare here, where PyPI answers (torch, numpy, tqdm and pytest are there; the engine's tests
# also use hypothesis, a compiled wheel: the device's Python is 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nnn-retrieval==1.0.1 sortedcontainers
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl --python-version 3.12 \
#       --platform manylinux2014_x86_64 hypothesis
# then run it there with .whl carried:   bash benchmarks/gpu_session.sh
# It runs on CPU torch too (no GPU: the tests on "cpu", the benchmark at its small sizes unless
# BENCH_ARGS names others), which is how it is checked before a device call.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    for wheel in .whl/*.whl; do  # one by one: a wheel for another Python is skipped, not fatal
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/hubless-site "$wheel" \
            || echo "skipped $wheel (not installable here)"
    done
    export PYTHONPATH=/tmp/hubless-site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PYTHON=${PYTHON:-python3}
(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi") > "$OUT/card.txt"
device=$("$PYTHON" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
full="--gallery 100000 --bank 50000 --dim 512 --queries 10000"
[ "$device" = cuda ] || full=""

# shellcheck disable=SC2086 # TEST_ARGS: more pytest arguments (e.g. -k "not average"), split on purpose
HUBLESS_TEST_DEVICE=$device timeout "${TEST_SECONDS:-200}" "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/engine/test_torch_engine.py ${TEST_ARGS:-} > "$OUT/engine_tests.txt" 2>&1
echo "engine tests on $device: exit $?" >> "$OUT/engine_tests.txt"

profile="--profile $OUT/profile"
[ "${PROFILE:-1}" = 0 ] && profile=""
# shellcheck disable=SC2086 # the size arguments split into words on purpose
timeout "${BENCH_SECONDS:-330}" "$PYTHON" benchmarks/gpu_engine.py ${BENCH_ARGS:-$full} --out "$OUT/gpu_engine.md" $profile \
    > "$OUT/gpu_engine.txt" 2>&1
echo "benchmark on $device: exit $?" >> "$OUT/gpu_engine.txt"
# the ranking pass's work per method and block: eager and compiled
if [ "${KERNEL_SECONDS:-90}" != 0 ]; then  # 0: skipped
    timeout "${KERNEL_SECONDS:-90}" "$PYTHON" benchmarks/ranking_pass.py --device "$device" --dim 512 > "$OUT/ranking_pass.txt" 2>&1
    echo "ranking pass on $device: exit $?" >> "$OUT/ranking_pass.txt"
fi
# where the device idles in evaluate, its gaps charged to the host code
if [ "${TRACE_SECONDS:-150}" != 0 ]; then  # 0: skipped
    timeout "${TRACE_SECONDS:-150}" "$PYTHON" benchmarks/gpu_trace.py > "$OUT/gaps.txt" 2>&1
    echo "trace on $device: exit $?" >> "$OUT/gaps.txt"
fi
# the profiles as one file (a device call brings back a few files only)
[ -d "$OUT/profile" ] && tar -czf "$OUT/profile.tar.gz" -C "$OUT" profile && rm -rf "$OUT/profile"

cat "$OUT/card.txt"
grep -E "passed|failed|error|exit" "$OUT/engine_tests.txt" | tail -5
cat "$OUT/gpu_engine.txt"
[ -f "$OUT/ranking_pass.txt" ] && cat "$OUT/ranking_pass.txt"
[ -f "$OUT/gaps.txt" ] && tail -40 "$OUT/gaps.txt"
