#!/usr/bin/env bash
# The arms on a GPU: wan2.1 and taehv (random weights, real architectures) decoding on
# CUDA at 832x480, 81 frames; the encode on CPU threads (libx264). Prints the same
# table as `python -m benchmarks --sections arms`, one per model.
#
#   benchmarks/device.sh [--repeats N] [--frames F] [--out DIR] [--models "wan2.1 taehv"]
#                        [--weights-dir DIR]   (default /tmp/vaecast-random-weights: ~0.5 GB)
#
# Without CUDA it says so and exits 0, having run nothing else. The machine's probe
# (CUDA device, whether h264_nvenc opens and encodes here) is printed first and kept
# in DIR/probe.json.
set -euo pipefail

repeats=5
frames=81
out=benchmarks/results/gpu
models="wan2.1 taehv"
weights_dir=${TMPDIR:-/tmp}/vaecast-random-weights
while [ $# -gt 0 ]; do
    case "$1" in
        --repeats) repeats="$2"; shift 2 ;;
        --frames) frames="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --models) models="$2"; shift 2 ;;
        --weights-dir) weights_dir="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "device.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
python=${PYTHON:-python}
mkdir -p "$out"

status=0
"$python" -m benchmarks.gpu probe | tee "$out/probe.json" || status=$?
if [ "$status" -eq 3 ]; then
    echo "device.sh: SKIPPING: no CUDA device here (torch.cuda.is_available() is False);" \
        "nothing was measured." >&2
    exit 0
elif [ "$status" -ne 0 ]; then
    echo "device.sh: the probe failed (exit $status)" >&2
    exit "$status"
fi

if ! "$python" -m benchmarks --help | grep -q -- "--weights"; then
    echo "device.sh: 'python -m benchmarks' has no --weights option yet, and wan2.1 and" \
        "taehv need one (see benchmarks/gpu.py); nothing was measured." >&2
    exit 2
fi

for model in $models; do
    weights=$("$python" -m benchmarks.gpu weights --model "$model" --dir "$weights_dir")
    echo "== $model on cuda, $frames frames at 832x480, random weights at $weights"
    "$python" -m benchmarks --sections arms --device cuda --model "$model" \
        --weights "$weights" --frames "$frames" --width 832 --height 480 \
        --repeats "$repeats" --out "$out/$model"
    # The arms table (and its notes), as `python -m benchmarks --sections arms` prints it.
    cat "$out/$model/benchmarks.md"
done
