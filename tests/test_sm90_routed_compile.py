"""The routed MoE decode's wgmma kernels (kernels/tc_gemv.py's routed_kernel on the swapped wgmma pass),
offline, no GPU: they assemble for sm_90a with Hopper's native FP8 wgmma (QGMMA), no FP8 unpack, no
spill, and within a ceiling of SASS instructions.

Why a ceiling: a routed block runs one warp a scheduler, so its time follows the instructions each
warp issues one after another (Nsight Compute, benchmarks/RESULTS.md 2026-12-03), and the kernel's
code is read cold by every block. The counts fell from 1,952-3,080 to 1,496-2,648 when the views
stopped being Numba slices (``ptx/views.py``) and the thread indices unsigned; the K loop then took
two K blocks a turn with 32-bit counters (60 instructions a K block, 79 before; 1,424-2,600 in all,
the block-scaled forms' scale reads written three times); a change that brings the slices' bounds arithmetic back (300-450
instructions) crosses the ceiling here, where no timing would see it. The H200 runs the kernels (tests/test_experts_gpu.py).

Also here: the views' code generator checked against slices on Numba's CPU target (the same
llvmlite code; the GPU runs it in every routed test)."""

import numpy as np
import pytest
from test_sm120_compile import compile_for  # noqa: F401  (the fixture: ptxas, cuobjdump, NVVM)

from vtnumba.cuda.kernels import tc_gemv

QGMMA = "QGMMA.64"

# (stage, mode, block-scaled) -> the most SASS instructions allowed: the count at the change that
# set them, plus about 5%
CEILINGS = {
    ("gate_up", tc_gemv.MODE_STATIC, False): 1500,  # 1,424 (1,952 with slices and signed indices)
    ("gate_up", tc_gemv.MODE_PER_TOKEN, False): 1980,  # 1,888 (2,408)
    ("gate_up", tc_gemv.MODE_PER_GROUP, True): 1770,  # 1,688 (2,040)
    ("down", tc_gemv.MODE_STATIC, False): 2120,  # 2,024 (2,536)
    ("down", tc_gemv.MODE_PER_TOKEN, False): 2730,  # 2,600 (3,080)
    ("down", tc_gemv.MODE_PER_GROUP, True): 2630,  # 2,504 (2,688)
}


@pytest.mark.parametrize("stage,mode,block_scaled", list(CEILINGS))
def test_the_routed_wgmma_kernels_assemble_for_sm_90a_within_their_ceilings(compile_for, stage, mode, block_scaled):  # noqa: F811
    cfg = tc_gemv.routed_config(stage, block_scaled, wgmma=True)
    # as the H200 compiles it: hardware encoder, float32 chains, no sm_120 unit scales, int64 ids (torch)
    kernel = tc_gemv.routed_kernel(stage, cfg, mode, block_scaled, True, True, False, True)
    arch, record = compile_for((9, 0), kernel)
    assert arch == "sm_90a"
    assert set(record["sass_mma"]) == {QGMMA}, record["sass_mma"]
    assert record["sass_fp8_unpack"] == 0 and record["spill_stores"] == 0, record
    # no wgmma serialized (C7514) nor wait injected (C7517): the K loop's lag of one stays a lag
    assert record["advisories"] == [], record["advisories"]
    count, ceiling = record["sass_instructions"], CEILINGS[(stage, mode, block_scaled)]
    assert 500 < count <= ceiling, f"{stage} mode {mode}: {count} SASS instructions, ceiling {ceiling}"


def test_the_views_codegen_gives_the_slices_values():
    """ptx/views.py's ``_window`` (what ``rows_of`` and ``block_of`` lower to on the GPU), wrapped as
    CPU intrinsics: C-contiguous and strided arrays, 1-D and 2-D, empty windows, int32 starts."""
    views = pytest.importorskip("vtnumba.cuda.ptx.views")
    if not hasattr(views, "_window"):
        pytest.skip("the simulator's or numba-cuda-mlir's views are plain slices")
    import numba
    from numba.core import types
    from numba.core.extending import intrinsic
    from numba.core.imputils import impl_ret_borrowed
    from numba.np.arrayobj import make_array, populate_array

    def window(context, builder, aryty, outty, value, starts, counts):
        saved = views.make_array, views.populate_array, views.impl_ret_borrowed
        views.make_array, views.populate_array, views.impl_ret_borrowed = make_array, populate_array, impl_ret_borrowed
        try:  # the CPU target's array model helpers in place of the CUDA target's, for this codegen
            return views._window(context, builder, aryty, outty, value, starts, counts)
        finally:
            views.make_array, views.populate_array, views.impl_ret_borrowed = saved

    def intp(context, builder, value, ty):
        return context.cast(builder, value, ty, types.intp)

    @intrinsic
    def rows_of(typingctx, a, start, count):
        def codegen(context, builder, sig, args):
            s, c = intp(context, builder, args[1], sig.args[1]), intp(context, builder, args[2], sig.args[2])
            return window(context, builder, sig.args[0], sig.return_type, args[0], [s], [c])

        return a(a, start, count), codegen

    @intrinsic
    def block_of(typingctx, a, r0, rows, c0, cols):
        out = a.copy(layout="A")

        def codegen(context, builder, sig, args):
            v = [intp(context, builder, x, t) for x, t in zip(args[1:], sig.args[1:])]
            return window(context, builder, sig.args[0], out, args[0], [v[0], v[2]], [v[1], v[3]])

        return out(a, r0, rows, c0, cols), codegen

    @numba.njit
    def rows(a, start, count):
        v = rows_of(a, start, count)
        return v.copy(), v.shape[0]

    @numba.njit
    def block(a, r0, n, c0, m):
        return block_of(a, r0, n, c0, m).copy()

    a = np.arange(60, dtype=np.float32).reshape(10, 6)
    checked = 0
    for start, count in [(0, 10), (3, 2), (9, 1), (4, 0)]:
        got, n = rows(a, start, count)
        assert n == count and np.array_equal(got, a[start : start + count])
        checked += 1
    codes = np.arange(12, dtype=np.uint16)
    assert np.array_equal(rows(codes, np.int32(5), 3)[0], codes[5:8])
    for r0, n, c0, m in [(1, 1, 3, 3), (0, 10, 0, 6), (2, 3, 1, 2), (5, 0, 2, 2)]:
        assert np.array_equal(block(a, r0, n, c0, m), a[r0 : r0 + n, c0 : c0 + m])
        checked += 1
    strided = a[:, ::2]
    assert np.array_equal(block(strided, 1, 2, 1, 2), strided[1:3, 1:3])
    assert np.array_equal(rows(strided, 7, 3)[0], strided[7:10])
    assert checked == 8
