#!/usr/bin/env bash
# What a session lent a GPU runs in one device call (docs/gpu.md): the CUDA-only route tests,
# then the GPU suite twice on the same machine, with the GPU routes off ("before") and on
# ("after"), then both results folders packed so that they come back (the device tool returns
# at most 8 files).
#
#   bash benchmarks/gpu_session.sh            # from the repository root, on the device machine
#
# Environment: OUT (required: the folder whose files come back); GPU_SUITE_COMMIT (the commit
# the copied tree was made from; recorded in environment.json, it wins over the commit of any
# checkout around the copy); PYTHON (default python3); GPU_TESTS_TIMEOUT_S (default 100: the
# pytest run of tests/test_gpu_routes.py); GPU_BEFORE_BUDGET_S and GPU_AFTER_BUDGET_S (the
# suites' --budget-s, default 100 and 230); GPU_BEFORE_PIECES and GPU_AFTER_PIECES (default
# sync,prune,prune_epoch,arms_loorf and sync,prune,prune_epoch,arms_loorf,routes,structured;
# structured needs torch-pruning, which the device's python lacks: carry it in .gpu_vendor/);
# GPU_SUITE_ARGS (more arguments for both suites). Each suite is stopped (SIGTERM, then
# SIGKILL 15 s later) at its budget + 40 s; its summary.md is rewritten after every piece, so a
# stopped suite still leaves the pieces done. With the defaults the whole script takes at most
# about 100 + 140 + 270 = 510 s, and about 400 s when nothing stalls (the H100 suite of
# 2026-11-26 spent 75 s on sync, prune and arms_loorf; the after-suite adds the fused tail's
# compilation and the routes piece).
# Leaves in $OUT:
#   gpu_suite.tar.gz        both results folders <device name>-<date>-routes-{off,all}/, each
#                           with its gpu_suite.log, and test_gpu_routes.log
#   summary-routes-off.md, summary-routes-all.md   copies of the summaries, to read at once
#   gpu_session.log         the tests' and both suites' output (progress, tracebacks)
# Exit code: 0 when the tests passed and both suites finished every piece, else the first
# failure's code (124: stopped by a timeout).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
: "${OUT:?set OUT to the folder whose files come back}"
PY="${PYTHON:-python3}"
# torch-pruning (the structured piece) where it was carried in .gpu_vendor/ (docs/gpu.md)
VENDOR=""; [ -d "$PWD/.gpu_vendor" ] && VENDOR=":$PWD/.gpu_vendor"
export PYTHONPATH="$PWD$VENDOR${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

mkdir -p "$OUT" || exit 2
LOG="$OUT/gpu_session.log"
{
    date -u +"start %Y-%m-%dT%H:%M:%SZ"
    echo "commit ${GPU_SUITE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
} >"$LOG" 2>&1
status=0

# 1. the routes on the GPU: equality with the reference paths, no extra host syncs
TESTS_LOG="$OUT/test_gpu_routes.log"
timeout --kill-after=10 "${GPU_TESTS_TIMEOUT_S:-100}" "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_gpu_routes.py 2>&1 | tee "$TESTS_LOG" | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "test_gpu_routes exit code $rc at $(date -u +%H:%M:%SZ)" | tee -a "$LOG"
[ "$status" -eq 0 ] && status=$rc

# 2. the suite before (routes off) and after (routes on), same machine, one after the other
suite() {  # label routes budget pieces
    # shellcheck disable=SC2086  # GPU_SUITE_ARGS is a list of words
    timeout --kill-after=15 "$(($3 + 40))" "$PY" -m benchmarks.gpu_suite --out "$OUT" \
        --routes "$2" --label "$1" --budget-s "$3" --pieces "$4" ${GPU_SUITE_ARGS:-} 2>&1 \
        | tee -a "$LOG"
    local code=${PIPESTATUS[0]}
    echo "gpu_suite $1 exit code $code at $(date -u +%H:%M:%SZ)" | tee -a "$LOG"
    return "$code"
}
suite routes-off off "${GPU_BEFORE_BUDGET_S:-100}" \
    "${GPU_BEFORE_PIECES:-sync,prune,prune_epoch,arms_loorf}"
rc=$?; [ "$status" -eq 0 ] && status=$rc
suite routes-all all "${GPU_AFTER_BUDGET_S:-230}" \
    "${GPU_AFTER_PIECES:-sync,prune,prune_epoch,arms_loorf,routes,structured}"
rc=$?; [ "$status" -eq 0 ] && status=$rc

# 3. both results folders in one archive (the unpacked files would pass the 8-file limit)
folders=()
for label in off all; do
    for folder in "$OUT"/*-routes-"$label" "$OUT"/*-routes-"$label"-smoke; do
        [ -d "$folder" ] || continue
        cp "$LOG" "$folder/gpu_suite.log"
        cp "$TESTS_LOG" "$folder/test_gpu_routes.log" 2>/dev/null
        [ -f "$folder/summary.md" ] && cp "$folder/summary.md" "$OUT/summary-routes-$label.md"
        folders+=("$(basename "$folder")")
    done
done
if [ "${#folders[@]}" -gt 0 ]; then
    tar -czf "$OUT/gpu_suite.tar.gz" -C "$OUT" "${folders[@]}" \
        && (cd "$OUT" && rm -rf "${folders[@]}")
fi
exit "$status"
