#!/usr/bin/env bash
# The main job on the embedded demo corpus: set up, build the dataset, train the tiny model straight
# through, train it again but kill it (SIGKILL) mid-run and resume, and show the losses match bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=${DEMO_OUT:-demo-out}
STEPS=${DEMO_STEPS:-60}

echo "== 1. dataprep build: demo/corpus -> $OUT/data"
dataprep build demo/corpus --out "$OUT/data" --config configs/dataprep-demo.yaml --workers 2
dataprep verify "$OUT/data"
sed -n '1,60p' "$OUT/data/report.md"

TRAIN=(--config configs/tiny.yaml --set "data.path=$OUT/data" "train.steps=$STEPS")
rm -rf "$OUT/run-straight" "$OUT/run-resumed"

echo "== 2. train $STEPS steps straight through"
train launch "${TRAIN[@]}" "run.dir=$OUT/run-straight"

echo "== 3. train again, kill -9 after the first checkpoint, resume with --resume auto"
train launch "${TRAIN[@]}" "run.dir=$OUT/run-resumed" &
pid=$!
until [ -e "$OUT/run-resumed/checkpoints/latest" ] || ! kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
sleep 1.5
kill -9 "$pid" 2>/dev/null && echo "   killed the run (pid $pid) with SIGKILL" || true
wait "$pid" 2>/dev/null || true
train launch "${TRAIN[@]}" "run.dir=$OUT/run-resumed" --resume auto

echo "== 4. compare the losses step by step"
train compare "$OUT/run-straight" "$OUT/run-resumed"
train eval "${TRAIN[@]}" "run.dir=$OUT/run-resumed"
