"""The block-scaled FP8 ``mma.sync`` of Blackwell workstations and GB10 (sm_120 / sm_121, arch-specific
targets sm_120a / sm_121a), as an llvmlite ``InlineAsm`` intrinsic with a portable emulation for the
CUDA simulator (the pattern of ``mma.py``).

The instruction::

    mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e4m3.f32.ue8m0
        {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3}, {sfa}, {0, 0}, {sfb}, {0, 0}

computes ``D[r, n] = C[r, n] + 2^(sa_r - 127) * 2^(sb_n - 127) * sum_k A[r, k] B[k, n]`` over one
32-wide K block, with one E8M0 scale per row of A and per column of B. Its A, B, C and D fragments
are those of the plain e4m3 ``mma.m16n8k32`` (``mma.py``). The scales, with both selector pairs
(byte-id, thread-id) zero, come from byte 0 of each lane's scale register, lane = 4 g + t:

- row g of A from lane (g, t = 0), row g + 8 from lane (g, t = 1);
- column g of B from lane (g, t = 0); the other lanes' scale bytes are not read.

That map is the one a public probe on sm_121a hardware established with one boosted scale byte at a
time and confirmed bit for bit against an exact oracle (its report: the PTX ISA table's
same-register reading, row g in byte 0 and row g + 8 in byte 1, was measured false). It is not
measured here (no GB10 here): the emulation below implements that map, and the kernels that use the
instruction are written against it; tests/test_sm120_compile.py proves that they assemble for
sm_121a / sm_120a into ``QMMA.SF``.

Why the block-scaled form even for per-tensor scales: on sm_120-class GPUs the plain FP8 ``mma.sync``
with float32 accumulation runs at half the block-scaled form's rate (about 102 against 202 TFLOPS on
an RTX 5060 Ti, flashinfer #3628; triton #11320). With unit scales (byte 127 = 2^0 on both operands,
``mma_e4m3_unit``) the block-scaled instruction computes exactly the plain one's D = A B + C.

On sm_121a (and sm_120a) ptxas assembles it to ``QMMA.SF.16832.F32.E4M3.E4M3.E8``
(docs/DEVICE.md, "Compiling for a GPU you do not have"); the plain form and ``kind::f8f6f4`` to ``QMMA.16832``. Plain sm_120 / sm_121
(without the "a") reject it: kernels using it are compiled for the arch-specific target.
"""

import numpy as np

from .mma import SCRATCH_WORDS_PER_WARP
from .target import DEVICE_INLINE, SIMULATOR, cuda, intrinsic, lowering, mlir_asm, mlir_cast, mlir_codegen, types

# compute capabilities with the instruction: Blackwell workstations (12.0) and GB10 (12.1), on their
# arch-specific targets
CCS = ((12, 0), (12, 1))
UNIT_SCALE = 0x7F  # E8M0 byte 127: 2^0
_U32_UNIT = np.uint32(UNIT_SCALE)
# the emulation's exchange area: the six operand words of mma.py's plus the two scale words
SCRATCH_WORDS = SCRATCH_WORDS_PER_WARP + 2 * 32

if SIMULATOR:
    from ... import _format
    from . import mma as _plain

    _E8M0 = np.array([_format.decode_e8m0_scalar(np.uint32(b)) for b in range(256)], dtype=np.float32)

    def mma_e4m3_mx(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb, scratch, warp, lane):
        """Emulated block-scaled mma (this lane's d0..d3): the plain emulation's float32 sum of the 32
        products of each output (k ascending), times its row's and its column's scale, plus C; the
        scales gathered from the lanes the map above names. ``scratch`` holds SCRATCH_WORDS a warp."""
        base = warp * SCRATCH_WORDS
        scratch[base + SCRATCH_WORDS_PER_WARP + lane] = np.uint32(sfa)
        scratch[base + SCRATCH_WORDS_PER_WARP + 32 + lane] = np.uint32(sfb)
        cuda.syncthreads()
        g, t = lane // 4, lane % 4
        sa_g = _E8M0[int(scratch[base + SCRATCH_WORDS_PER_WARP + 4 * g]) & 0xFF]
        sa_g8 = _E8M0[int(scratch[base + SCRATCH_WORDS_PER_WARP + 4 * g + 1]) & 0xFF]
        sb_0 = _E8M0[int(scratch[base + SCRATCH_WORDS_PER_WARP + 32 + 4 * (2 * t)]) & 0xFF]
        sb_1 = _E8M0[int(scratch[base + SCRATCH_WORDS_PER_WARP + 32 + 4 * (2 * t + 1)]) & 0xFF]
        cuda.syncthreads()
        zero = np.float32(0.0)
        p0, p1, p2, p3 = _plain.mma_e4m3(a0, a1, a2, a3, b0, b1, zero, zero, zero, zero, scratch, warp, lane)
        with np.errstate(invalid="ignore", over="ignore"):
            return (
                np.float32(np.float32(c0) + np.float32(np.float32(p0 * sa_g) * sb_0)),
                np.float32(np.float32(c1) + np.float32(np.float32(p1 * sa_g) * sb_1)),
                np.float32(np.float32(c2) + np.float32(np.float32(p2 * sa_g8) * sb_0)),
                np.float32(np.float32(c3) + np.float32(np.float32(p3 * sa_g8) * sb_1)),
            )

    mma_e4m3_mx = cuda.jit(device=True)(mma_e4m3_mx)

else:
    from llvmlite import ir

    from .codec import asm_tuple

    _f32 = ir.FloatType()
    _INSTRUCTION = (
        "mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32.e4m3.e4m3.f32.ue8m0"
        " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13}, {$14}, {0, 0}, {$15}, {0, 0};"
    )

    @intrinsic
    def mma_e4m3_mx(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb, scratch, warp, lane):
        """D = A B (scaled per row of A and column of B by the E8M0 bytes in byte 0 of ``sfa`` / ``sfb``,
        the map of the module docstring) + C; scratch, warp and lane are the emulation's."""
        sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, sfa, sfb, scratch, warp, lane)

        def codegen(context, builder, signature, args):
            tys = signature.args
            ins = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], tys[:6])]
            ins += [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:10], tys[6:10])]
            ins += [context.cast(builder, v, t, types.uint32) for v, t in zip(args[10:12], tys[10:12])]
            return asm_tuple(
                context, builder, signature.return_type, _f32, _INSTRUCTION, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f,r,r", ins
            )

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            kinds = [types.uint32] * 6 + [types.float32] * 4 + [types.uint32] * 2
            ins = [mlir_cast(lower, v, t, k) for v, t, k in zip(values, argtypes, kinds)]
            return tuple(mlir_asm(_INSTRUCTION, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f,r,r", ins, "ffff"))

        return sig, lowering(codegen, mlir)


@cuda.jit(**DEVICE_INLINE)
def mma_e4m3_unit(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, warp, lane):
    """The plain e4m3 mma's D = A B + C on the block-scaled instruction, every scale 2^0 (byte 127):
    ``mma.mma_e4m3``'s signature, for the kernels that run at the block-scaled rate on sm_12x."""
    return mma_e4m3_mx(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, _U32_UNIT, _U32_UNIT, scratch, warp, lane)


def available(cc):
    """Whether the block-scaled mma runs on compute capability ``cc`` (a real sm_120 / sm_121 GPU)."""
    return not SIMULATOR and tuple(cc)[:2] in CCS


__all__ = ["CCS", "UNIT_SCALE", "SCRATCH_WORDS", "available", "mma_e4m3_mx", "mma_e4m3_unit"]
