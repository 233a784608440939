#!/usr/bin/env bash
# The whole H200 proof in one call (device time is scarce): every gpu-marked test, then the GPU
# benchmarks, logs under the given folder, short tables last.
#   VT_COMMIT=<commit> bash benchmarks/gpu/h200_all.sh "$OUT"   (after installing the .whl wheels, DEVICE.md;
#   the device copy of the tree may carry a stale .git, so the commit is passed in)
set -u
out=${1:-h200_logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0
cd "$(dirname "$0")/../.."
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null) commit ${VT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
# VT_SKIP lists steps to leave out (e.g. "sweep seam"): device time is scarce
skip=" ${VT_SKIP:-} "
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -rs -x tests/test_cuda_quant.py tests/test_cuda_gemm.py \
    tests/test_seam_gpu.py tests/test_fastpath_gpu.py 2>&1 | tee "$out/gpu_tests.log" | grep -v "^\." | tail -40
[[ $skip == *" quant "* ]] || timeout 60 python3 benchmarks/gpu/bench_gpu_quant.py > "$out/bench_gpu_quant.log" 2>&1
[[ $skip == *" gemm "* ]] || timeout 60 python3 benchmarks/gpu/bench_gpu_gemm.py > "$out/bench_gpu_gemm.log" 2>&1
[[ $skip == *" decode "* ]] || timeout 120 python3 benchmarks/gpu/bench_decode.py > "$out/bench_decode.log" 2>&1
[[ $skip == *" sweep "* ]] || timeout 90 python3 benchmarks/gpu/sweep_gemv.py > "$out/sweep_gemv.log" 2>&1
[[ $skip == *" seam "* ]] || timeout 60 python3 benchmarks/gpu/bench_seam_overhead.py --device cuda --rounds 41 > "$out/bench_seam_cuda.log" 2>&1
echo "==== quant ===="; sed -n '/==== GPU quantization table ====/,$p' "$out/bench_gpu_quant.log" 2>/dev/null | tail -30
echo "==== gemm ===="; tail -60 "$out/bench_gpu_gemm.log" 2>/dev/null
echo "==== decode ===="; tail -40 "$out/bench_decode.log" 2>/dev/null
echo "==== seam ===="; tail -12 "$out/bench_seam_cuda.log" 2>/dev/null
echo "==== GEMV rows sweep ===="; cat "$out/sweep_gemv.log" 2>/dev/null
