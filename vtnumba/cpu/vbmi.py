"""The e4m3 decode and dot product on AVX-512 VBMI (Intel Ice Lake and later, AMD Zen 4 and later),
written as LLVM vector IR through a Numba intrinsic: the ``avx512_vbmi`` path's M = 1 inner loop.

Every e4m3 value is a float32 whose low 16 bits are zero (it is exact in bfloat16), so a float32 is
two table bytes: ``hi`` (sign, exponent, top of the mantissa) and ``lo``. Per 64 weight codes:

- ``vpermi2b`` looks up ``hi`` and ``lo`` for all 64 codes at once in two 128-entry tables (the
  instruction reads the low 7 bits of each code: the magnitude); the code's sign bit is OR-ed into
  ``hi`` (``vpternlogd``);
- four more ``vpermi2b`` place byte pairs (lo, hi) into the top half of each float32 lane, in the
  weights' own order (so the activation needs no reordering), the low half masked to zero;
- four FMAs into two float32 accumulators.

Compiled (znver5), the loop spends 88 instructions per 4 rows x 64 weights, ~22 per 64 (20
vpermt2b, 4 vpermi2b, 4 vpternlogq, 16 vpandq, 16 FMAs, 16 register copies the permutes' overwritten
operand costs, loads), where the bit-arithmetic decode that LLVM vectorizes spends ~56 (zero-extend,
shift, add, two compares, blend, convert, multiply, mask-move, xor, FMA per 16); one Zen 5 core
measured 36-38 G weights/s against 16-17 (N = 1024, K = 4096, weights in cache). The tables are the
decode table itself (``vtnumba._format``'s decoder, NaN codes included: 0x7F -> 0x7FC00000), so the
products are the exact float32 products the other kernels form; only the order of the float32 sums
differs, which G3 allows. Proven in tests/test_cpu_paths.py: every code at every one of the 64 lane
positions decodes to the table's value.
"""

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .. import _format

BLOCK = 64  # codes per step: one zmm register of bytes
ROWS = 4  # weight rows per call, sharing each load of the activation

_BITS = np.array([_format.decode_e4m3_scalar(c) for c in range(128)], dtype=np.float32).view(np.uint32)
# every e4m3 value's float32 has 16 zero low bits: the whole decode is the top two bytes
assert not (_BITS & 0xFFFF).any()
HI = ((_BITS >> 24) & 0xFF).astype(np.uint8)
LO = ((_BITS >> 16) & 0xFF).astype(np.uint8)


def _expand_indices(r):
    """vpermi2b indices that put (lo[16r + j], hi[16r + j]) into bytes 2 and 3 of float32 lane j (bit 6
    of an index picks the second source, hi)."""
    idx = np.zeros(BLOCK, np.uint8)
    for j in range(16):
        idx[4 * j + 2] = 16 * r + j
        idx[4 * j + 3] = 64 + 16 * r + j
    return idx


_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V64I8, _V16I32, _V16F32 = ir.VectorType(_I8, 64), ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)


def _bytes(values):
    return ir.Constant(_V64I8, [ir.Constant(_I8, int(v)) for v in values])


class _Decode:
    """The decode above, emitted into ``builder``'s function: ``values(codes)`` turns 64 codes (a
    <64 x i8> vector) into four <16 x float> vectors, codes 16 r .. 16 r + 15 in vector r."""

    def __init__(self, builder):
        self.builder = builder
        self.perm = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V64I8, [_V64I8] * 3), "llvm.x86.avx512.vpermi2var.qi.512"
        )
        self.hi_low, self.hi_high, self.lo_low, self.lo_high = (
            _bytes(HI[:64]),
            _bytes(HI[64:]),
            _bytes(LO[:64]),
            _bytes(LO[64:]),
        )
        self.sign = _bytes([0x80] * BLOCK)
        self.top_half = ir.Constant(_V16I32, [ir.Constant(_I32, 0xFFFF0000)] * 16)
        self.expand = [_bytes(_expand_indices(r)) for r in range(4)]

    def values(self, codes):
        b = self.builder
        hi = b.or_(b.call(self.perm, [self.hi_low, codes, self.hi_high]), b.and_(codes, self.sign))
        lo = b.call(self.perm, [self.lo_low, codes, self.lo_high])
        return [
            b.bitcast(b.and_(b.bitcast(b.call(self.perm, [lo, self.expand[r], hi]), _V16I32), self.top_half), _V16F32)
            for r in range(4)
        ]


def _fma(builder):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")


def _data(context, builder, signature, args, i, ty):
    """A pointer of type ``ty`` to the data of array argument ``i``."""
    return builder.bitcast(context.make_array(signature.args[i])(context, builder, args[i]).data, ty.as_pointer())


def _activation(builder, xptr, base):
    """x[base .. base + 63] as four <16 x float> vectors."""
    return [
        builder.load(
            builder.bitcast(
                builder.gep(xptr, [builder.add(base, ir.Constant(base.type, 16 * r))]), _V16F32.as_pointer()
            ),
            align=4,
        )
        for r in range(4)
    ]


def emit_prefetch(builder, ptr):
    """A prefetch of the cache line at ``ptr`` (i8*) into every cache level (llvm.prefetch: a read,
    locality 3, data; any target, a hint that never faults)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer()] + [_I32] * 3), "llvm.prefetch.p0i8"
    )
    builder.call(fn, [ptr] + [ir.Constant(_I32, v) for v in (0, 3, 1)])


@intrinsic
def prefetch(typingctx, a, i):
    """Prefetch the cache line holding a[i] (``a`` 1-D contiguous): ``emit_prefetch`` for kernels
    written in Python (the block-scaled M = 1 kernel, on every path)."""

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        emit_prefetch(builder, builder.bitcast(builder.gep(data, [args[1]]), _I8.as_pointer()))
        return context.get_dummy_value()

    return types.none(a, i), codegen


def _row_sums(builder, accs):
    """Each row's two accumulators added, then their 16 lanes summed in lane order: a float32 a row."""
    sums = []
    for pair in accs:
        v = builder.fadd(builder.load(pair[0]), builder.load(pair[1]))
        total = builder.extract_element(v, ir.Constant(_I32, 0))
        for j in range(1, 16):
            total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, j)))
        sums.append(total)
    return sums


@intrinsic
def dot4_e4m3(typingctx, x, w0, w1, w2, w3, nblocks, ahead):
    """(sum_k x[k] * dec(w_i[k]) for i in 0..3) over k < 64 * nblocks, as float32 sums (any order).

    ``x``: float32 1-D contiguous; ``w_i``: uint8 1-D contiguous rows; the caller adds the tail
    past 64 * nblocks and applies the epilogue. ``ahead``: uint8 1-D contiguous, the bytes the
    caller reads next (the next four rows), of which the first 4 * 64 * nblocks are prefetched in
    order, one cache line per row and step, so they are in cache when their turn comes. Measured
    on one Xeon core, weights cold (benchmarks/RESULTS.md, 2026-12-02 12:36-13:34 UTC): the hardware's
    prefetchers, following four short rows at once, kept 1536 x 2048 at 5.0 G weights/s and
    2048 x 768 at 6.8; reading ahead this way, 10.7 and 11.6 (4096^2: 11.1 -> 13.5), against 14-15
    with the weights in cache. Per-row prefetches a fixed distance ahead in the same rows did less
    at every shape (4.0-12.4 over the three). It changes no arithmetic."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, nblocks, ahead)

    def codegen(context, builder, signature, args):
        decode, fma = _Decode(builder), _fma(builder)
        xptr = _data(context, builder, signature, args, 0, _F32)
        wptrs = [_data(context, builder, signature, args, 1 + i, _I8) for i in range(ROWS)]
        next_ptr = _data(context, builder, signature, args, 6, _I8)
        zero = ir.Constant(_V16F32, [ir.Constant(_F32, 0.0)] * 16)
        # two accumulators per row: the four FMAs of a step do not all wait on one another
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(ROWS)]
        with cgutils.for_range(builder, args[5]) as loop:
            base = builder.mul(loop.index, ir.Constant(loop.index.type, BLOCK))
            xs = _activation(builder, xptr, base)
            lines = builder.mul(base, ir.Constant(base.type, ROWS))  # 4 lines of `ahead` a step
            for row in range(ROWS):
                emit_prefetch(builder, builder.gep(next_ptr, [builder.add(lines, ir.Constant(base.type, 64 * row))]))
                codes = builder.load(builder.bitcast(builder.gep(wptrs[row], [base]), _V64I8.as_pointer()), align=1)
                for r, d in enumerate(decode.values(codes)):
                    acc = accs[row][r % 2]
                    builder.store(builder.call(fma, [d, xs[r], builder.load(acc)]), acc)
        return context.make_tuple(builder, signature.return_type, _row_sums(builder, accs))

    return sig, codegen


@intrinsic
def dot4_e4m3_mx(typingctx, x, w0, w1, w2, w3, s0, s1, s2, s3, nsteps):
    """(sum_kb s_i[kb] * sum_{k in block kb} x[k] * dec(w_i[k]) for i in 0..3) over the first 2 * nsteps
    blocks of 32 (k < 64 * nsteps): the MXFP8 M = 1 inner loop.

    ``x``: float32 1-D contiguous, already multiplied by the activation's own block scales (exact);
    ``w_i``: uint8 1-D contiguous weight rows; ``s_i``: float32 1-D contiguous, row i's block scales
    (decoded E8M0 bytes: powers of two). Per row and step the decode is ``dot4_e4m3``'s; then each
    block's two 16-lane product vectors are summed (``fma(d1, x1, d0 * x0)``, one rounding, the products
    exact), multiplied by the block's scale (a broadcast load folded into the FMA; exact while it
    neither overflows nor leaves float32's range, which the caller's range check ensures) and added
    into one of two accumulators per row (even and odd blocks): no sum across lanes until the end,
    where the block-scaled kernels spend one per block. A term passes through at most
    1 + nblocks / 2 + 16 roundings, inside the G3-per-block allowance of ``reference.block_scaled_mm``
    (DESIGN.md, "MXFP8")."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, s0, s1, s2, s3, nsteps)

    def codegen(context, builder, signature, args):
        decode, fma = _Decode(builder), _fma(builder)
        xptr = _data(context, builder, signature, args, 0, _F32)
        wptrs = [_data(context, builder, signature, args, 1 + i, _I8) for i in range(ROWS)]
        sptrs = [_data(context, builder, signature, args, 5 + i, _F32) for i in range(ROWS)]
        zero = ir.Constant(_V16F32, [ir.Constant(_F32, 0.0)] * 16)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(ROWS)]
        splat = ir.Constant(_V16I32, [ir.Constant(_I32, 0)] * 16)
        with cgutils.for_range(builder, args[9]) as loop:
            base = builder.mul(loop.index, ir.Constant(loop.index.type, BLOCK))
            kb = builder.mul(loop.index, ir.Constant(loop.index.type, BLOCK // _format.MX_GROUP))
            xs = _activation(builder, xptr, base)
            for row in range(ROWS):
                codes = builder.load(builder.bitcast(builder.gep(wptrs[row], [base]), _V64I8.as_pointer()), align=1)
                d = decode.values(codes)
                for half in range(2):
                    p = builder.call(fma, [d[2 * half + 1], xs[2 * half + 1], builder.fmul(d[2 * half], xs[2 * half])])
                    scale = builder.load(builder.gep(sptrs[row], [builder.add(kb, ir.Constant(kb.type, half))]))
                    one = builder.insert_element(ir.Constant(_V16F32, ir.Undefined), scale, ir.Constant(_I32, 0))
                    scales = builder.shuffle_vector(one, ir.Constant(_V16F32, ir.Undefined), splat)
                    acc = accs[row][half]
                    builder.store(builder.call(fma, [p, scales, builder.load(acc)]), acc)
        return context.make_tuple(builder, signature.return_type, _row_sums(builder, accs))

    return sig, codegen
