#!/usr/bin/env bash
# The H200 run for GPU quantization: the gpu tests, then the benchmark; short tables printed last.
# On the device machine, after installing the .whl wheels (DEVICE.md):
#   bash benchmarks/gpu_run.sh [output folder]
# Logs go to the output folder (default: ./gpu_run_logs).
set -u
out=${1:-gpu_run_logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0
cd "$(dirname "$0")/.."
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
python3 -m pytest -q -p no:cacheprovider -m gpu -s -rs tests/test_cuda_quant.py 2>&1 | tee "$out/test_cuda_quant.log"
tests_rc=${PIPESTATUS[0]}
python3 benchmarks/bench_gpu_quant.py 2>&1 | tee "$out/bench_gpu_quant.log"
bench_rc=${PIPESTATUS[0]}
echo
echo "==== summary ===="
grep -h "G2 exhaustive" "$out/test_cuda_quant.log" || true
tail -n 1 "$out/test_cuda_quant.log"
sed -n '/==== GPU quantization table ====/,$p' "$out/bench_gpu_quant.log"
echo "tests exit $tests_rc, benchmark exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
