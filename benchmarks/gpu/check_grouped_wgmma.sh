#!/usr/bin/env bash
# The first GPU run of the grouped wgmma GEMV (the aligned MoE decode on sm_90), in one call: its tests
# and the tests of every kernel whose code it changed, then the MoE layer by tokens with it and without
# it (VT_DISABLE_KERNELS=wgmma_grouped_gemv: the mma.sync grouped GEMV, the tree before), then the
# grouped GEMMs alone at the decode rows an expert, each ring depth, against torch's grouped FP8.
# Its run on an H100 is in benchmarks/RESULTS.md (2026-12-07 21:11); the four test files took 284 s there.
#   bash benchmarks/gpu/check_grouped_wgmma.sh "$OUT"   (after installing the .whl wheels, DEVICE.md)
set -u
out=${1:-grouped_wgmma_logs}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NUMBA_CUDA_ARRAY_INTERFACE_SYNC=0
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
timeout 330 python3 -m pytest -q -n 14 -p no:cacheprovider -rfE tests/test_grouped_tc_gpu.py \
    tests/test_dense_wgmma_gpu.py tests/test_experts_gpu.py tests/test_torch_experts.py > "$out/tests.log" 2>&1
echo "tests exited $?" >> "$out/tests.log"
timeout 90 python3 benchmarks/gpu/bench_moe.py --parts decode,tokens > "$out/moe_new.log" 2>&1
VT_DISABLE_KERNELS=wgmma_grouped_gemv timeout 70 python3 benchmarks/gpu/bench_moe.py --parts tokens \
    > "$out/moe_old.log" 2>&1
timeout 120 python3 benchmarks/gpu/bench_grouped_tc.py --shapes qwen3_gate_up,qwen3_down --rows 1x52,4,8,16 \
    --wgmma --kernels --rounds 2 > "$out/grouped.log" 2>&1
tail -3 "$out/tests.log"
