"""The tensor-core kernels on the block-scaled mma of sm_12x (Blackwell workstations, sm_120; GB10,
sm_121), from Numba: what tc_gemm.py's tiled GEMM and tc_gemv.py's GEMV do differently there.

The instruction (``kind::mxf8f6f4.block_scale``, ptx/sm120_mma.py) has the plain e4m3 mma's A, B, C
and D fragments plus one E8M0 scale per row of A and per column of B. On sm_120-class GPUs it runs
at twice the plain FP8 mma's rate, so the tensor-core kernels issue it in two kinds (tc_gemm's
``mma_kind``, ``KINDS`` here):

- ``"unit"``: every scale 2^0 -- the plain mma's D = A B + C at the block-scaled rate, for
  per-tensor, per-channel and 128 x 128 block scales, promoted as the plain kernel promotes (the
  GEMM and the GEMV);
- ``"mx"``: MXFP8 operands (E8M0 bytes per 1 x 32 of both) with their real scales (the GEMM): each
  k32 block's D = 2^(sa + sb - 254) P from C = 0, added into float32 registers -- promotion per mma,
  as the plain kernel promotes on the GPUs whose FP8 mma is native.

Everything else in those kernels (the cp.async ring, the fragment reads, promotion, the epilogue) is
theirs; this module holds only what sm_12x changes: the mma a kernel issues, the MX step that hands
the scales to the mma in its lane map, the simulator emulation's exchange area, and the target the
kernels compile for -- the arch-specific sm_120a / sm_121a, since plain sm_12x refuses the
instruction. tests/test_sm120_compile.py checks that they assemble into ``QMMA.SF`` there.
"""

import functools

import numpy as np

from ..ptx import mma, sm120_mma
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda

# the mma kinds (tc_gemm.MMA_KINDS) that issue the block-scaled instruction
KINDS = ("unit", "mx")

# the plain e4m3 mma's D = A B + C on the block-scaled instruction (``mma.mma_e4m3``'s signature)
mma_e4m3_unit = sm120_mma.mma_e4m3_unit
available = sm120_mma.available  # whether a real GPU of compute capability cc runs the instruction

_F32_ZERO = np.float32(0.0)
_DEVICE = DEVICE_INLINE


def arch(block_scaled_mma):
    """The compile target's suffix for a kernel that issues the block-scaled mma (``"a"``: sm_120a,
    sm_121a) or not (``""``); the simulator has no targets."""
    return "a" if block_scaled_mma and not SIMULATOR else ""


def scratch_words(warps, block_scaled_mma):
    """Words of the shared exchange area a block's mma emulation needs under the simulator (the
    block-scaled one also exchanges the scale words); 1 on a GPU, where nothing is exchanged."""
    if not SIMULATOR:
        return 1
    return warps * (sm120_mma.SCRATCH_WORDS if block_scaled_mma else mma.SCRATCH_WORDS_PER_WARP)


@functools.cache
def mx_step_functions(mt, nt):
    """(n_scales, mx_scales, mx_step): tc_gemm's MX step for a warp tile of MT m16 x NT n8 mma tiles
    on the block-scaled mma, the scales passed to the instruction. ``mx_scales(kb, mx_ctx)`` reads
    K block ``kb``'s E8M0 bytes once per k32 step into ``sc`` (mx_ctx's last item, n_scales float32,
    exact): sc[i] the byte of row r + 8 (t % 2) of m16 tile i, sc[mt + j] that of column 8 j + g of
    n8 tile j -- the lanes ptx/sm120_mma.py's map reads them from; rows and columns past the edge
    read the last one's (their codes are zero-filled, their outputs not stored). ``mx_step(acc, af,
    bf, q, i, j, sc, scratch, warp, lane)``: output tile q (m16 tile i, n8 tile j) times one K block,
    D from C = 0 with the scales in the mma, added in float32."""
    mma_mx = sm120_mma.mma_e4m3_mx

    @cuda.jit(**_DEVICE)
    def mx_scales(kb, mx_ctx):
        scale_a, scale_b, row0, col0, m_last, n_last, g, t, sc = mx_ctx
        for i in range(mt):
            sc[i] = np.float32(scale_a[min(row0 + 16 * i + 8 * (t % 2), m_last), kb])
        for j in range(nt):
            sc[mt + j] = np.float32(scale_b[min(col0 + 8 * j + g, n_last), kb])

    @cuda.jit(**_DEVICE)
    def mx_step(acc, af, bf, q, i, j, sc, scratch, warp, lane):
        d0, d1, d2, d3 = mma_mx(
            af[0],
            af[1],
            af[2],
            af[3],
            bf[2 * j],
            bf[2 * j + 1],
            _F32_ZERO,
            _F32_ZERO,
            _F32_ZERO,
            _F32_ZERO,
            np.uint32(sc[i]),
            np.uint32(sc[mt + j]),
            scratch,
            warp,
            lane,
        )
        acc[q] += d0
        acc[q + 1] += d1
        acc[q + 2] += d2
        acc[q + 3] += d3

    return mt + nt, mx_scales, mx_step


__all__ = ["KINDS", "available", "arch", "scratch_words", "mma_e4m3_unit", "mx_step_functions"]
