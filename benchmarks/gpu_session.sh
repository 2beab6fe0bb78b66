#!/usr/bin/env bash
# What a session lent a GPU runs in one device call (docs/gpu.md): the GPU suite on the GPU
# with --out "$OUT", then its results packed so that they come back (the device tool returns at
# most 8 files).
#
#   bash benchmarks/gpu_session.sh            # from the repository root, on the device machine
#
# Environment: OUT (required: the folder whose files come back), GPU_SUITE_BUDGET_S (the
# suite's --budget-s, default 420), GPU_SUITE_ARGS (more arguments, e.g. "--pieces prune"),
# PYTHON (default python3), GPU_SUITE_COMMIT (the commit the copied tree was made from, recorded
# in environment.json where the copy has no .git). The suite is stopped (SIGTERM, then SIGKILL 15 s later) at the
# budget + 50 s; its summary.md is rewritten after every piece, so a stopped suite still
# leaves the pieces done. Leaves in $OUT:
#   gpu_suite.tar.gz   the results folder <device name>-<date>/, gpu_suite.log inside it
#   summary.md         a copy of the results' summary, to read at once
#   gpu_suite.log      the suite's output (progress lines, tracebacks of failed pieces)
# Exit code: the suite's (0 every piece finished, 1 a piece failed, 124 stopped by timeout).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
: "${OUT:?set OUT to the folder whose files come back}"
BUDGET="${GPU_SUITE_BUDGET_S:-420}"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

mkdir -p "$OUT" || exit 2
LOG="$OUT/gpu_suite.log"
{
    date -u +"start %Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null || echo "commit ${GPU_SUITE_COMMIT:-unknown} (no .git here)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
} >"$LOG" 2>&1
# shellcheck disable=SC2086  # GPU_SUITE_ARGS is a list of words
timeout --kill-after=15 "$((BUDGET + 50))" "$PY" -m benchmarks.gpu_suite --out "$OUT" \
    --budget-s "$BUDGET" ${GPU_SUITE_ARGS:-} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "gpu_suite exit code $rc at $(date -u +%H:%M:%SZ)" | tee -a "$LOG"

# the results folder: one file each, packed (the unpacked files would pass the 8-file limit)
folder="$(find "$OUT" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
if [ -n "$folder" ]; then
    cp "$LOG" "$folder/gpu_suite.log"
    [ -f "$folder/summary.md" ] && cp "$folder/summary.md" "$OUT/summary.md"
    tar -czf "$OUT/gpu_suite.tar.gz" -C "$OUT" "$(basename "$folder")" && rm -rf "$folder"
fi
exit "$rc"
