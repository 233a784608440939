"""The e4m3 decode and dot product on AVX-512 VBMI (Intel Ice Lake and later, AMD Zen 4 and later),
written as LLVM vector IR through a Numba intrinsic: the ``avx512_vbmi`` path's M = 1 inner loop,
and, last in this file, the ``avx512_bf16`` path's (the same lookups into bfloat16 dot products).

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
_V8I64 = ir.VectorType(ir.IntType(64), 8)


class _BFloat16(ir.Type):
    """LLVM's ``bfloat`` (llvmlite.ir has no class for it): the element type of the AVX512-BF16
    intrinsics' operands."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat16)

    def __hash__(self):
        return hash("bfloat")


_V32BF16 = ir.VectorType(_BFloat16(), 32)


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

    def halves(self, codes):
        """(hi, lo): the top and the next byte of each code's float32 (its bfloat16's two bytes)."""
        b = self.builder
        hi = b.or_(b.call(self.perm, [self.hi_low, codes, self.hi_high]), b.and_(codes, self.sign))
        return hi, b.call(self.perm, [self.lo_low, codes, self.lo_high])

    def values(self, codes):
        b = self.builder
        hi, lo = self.halves(codes)
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
    """A prefetch of the cache line at ``ptr`` (i8*) into L2 and the levels past it (llvm.prefetch: a
    read, locality 2, data; any target, a hint that never faults). Into L1 too (locality 3), the
    streaming M = 1 loops ran at two thirds of the speed at 1536 x 2048 and half at 4096 x 1536 on a
    Zen 4 core, weights cold (gemm.READ_AHEAD_BYTES has the figures): an L1 prefetch holds one of
    the core's few L1 miss buffers until the line comes from memory."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer()] + [_I32] * 3), "llvm.prefetch.p0i8"
    )
    builder.call(fn, [ptr] + [ir.Constant(_I32, v) for v in (0, 2, 1)])


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
    past 64 * nblocks and applies the epilogue. ``ahead``: uint8 1-D contiguous, bytes the
    caller reads later (four rows ``gemm.ahead_rows`` on), of which the first 4 * 64 * nblocks are
    prefetched in order, one cache line per row and step, so they are in cache when their turn comes. Measured
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


@intrinsic
def decode_codes(typingctx, codes, out, nblocks):
    """out[:64 * nblocks] = dec(codes[:64 * nblocks]) by the lookups above (``codes`` uint8, ``out``
    float32, both 1-D contiguous): the register tiles' weight decode on the byte-lookup paths
    (tile.py), about 22 instructions per 64 codes where the bit arithmetic takes about 224."""
    sig = types.none(codes, out, nblocks)

    def codegen(context, builder, signature, args):
        decode = _Decode(builder)
        src = _data(context, builder, signature, args, 0, _I8)
        dst = _data(context, builder, signature, args, 1, _F32)
        blocks = context.cast(builder, args[2], signature.args[2], types.intp)
        with cgutils.for_range(builder, blocks) as loop:
            base = builder.mul(loop.index, ir.Constant(loop.index.type, BLOCK))
            block = builder.load(builder.bitcast(builder.gep(src, [base]), _V64I8.as_pointer()), align=1)
            for r, values in enumerate(decode.values(block)):
                at = builder.gep(dst, [builder.add(base, ir.Constant(base.type, 16 * r))])
                builder.store(values, builder.bitcast(at, _V16F32.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


# -- the avx512_bf16 path: the same lookups, then bfloat16 dot products ------------------------------
#
# A decoded e4m3 value is its float32's top 16 bits: a bfloat16, exactly. So once ``hi`` and ``lo``
# are looked up, two in-lane byte interleaves (vpunpcklbw / vpunpckhbw) make the 64 codes' bfloat16
# words, and AVX512-BF16's ``vdpbf16ps`` multiplies 32 of them by 32 activation words and adds the
# products into 16 float32 lanes, two a lane: 2 instructions where the vbmi path spends 4 vpermt2b,
# 4 masks and 4 FMAs per 64 codes. The interleaves keep each 128-bit lane's codes, in two halves:
# words 0-7 of lane l are codes 16 l .. 16 l + 7 in the first vector, 16 l + 8 .. 16 l + 15 in the
# second; the activation's words are put in the same order once a step for all four rows (two
# vcvtne2ps2bf16, two 128-bit lane shuffles).
#
# Exact: the activation x is dec(a), e4m3 values, so its bfloat16 is x itself (its conversion rounds
# nothing), and a product of two e4m3 values is exact in float32 (4 x 4 significant bits), so each
# add of vdpbf16ps (Intel's pseudocode: the odd word's product added, then the even's, each rounded
# to nearest even) is an FMA's. Its input denormals count as zero and it flushes denormal results,
# neither of which these values reach: the smallest nonzero e4m3 is 2^-9, every product and every
# sum of them a multiple of 2^-18, far above float32's 2^-126. Only the order of the float32 sums
# differs from the other paths', which G3 allows. NaN codes decode to NaN words and give NaN sums.

_UNPACK_LOW = [i for lane in range(4) for j in range(8) for i in (16 * lane + j, 64 + 16 * lane + j)]
_UNPACK_HIGH = [i for lane in range(4) for j in range(8, 16) for i in (16 * lane + j, 64 + 16 * lane + j)]
# the activation's words in the codes' interleaved order: 128-bit lanes (0, 2) and (1, 3) of x[0:32]
# and of x[32:64] (two 64-bit elements a lane)
_LANES_EVEN = [0, 1, 4, 5, 8, 9, 12, 13]
_LANES_ODD = [2, 3, 6, 7, 10, 11, 14, 15]


def _const_indices(values):
    return ir.Constant(ir.VectorType(_I32, len(values)), [ir.Constant(_I32, v) for v in values])


class _Bf16Dot:
    """The avx512_bf16 step, emitted into ``builder``'s function: ``activation(xptr, base)`` gives x's
    64 values from ``base`` as the two word vectors the codes' halves pair with, ``accumulate(accs,
    codes, xw)`` adds a row's 64 products into its two accumulators."""

    def __init__(self, builder):
        self.builder = builder
        self.decode = _Decode(builder)
        module = builder.module
        self.dot = cgutils.get_or_insert_function(
            module, ir.FunctionType(_V16F32, [_V16F32, _V32BF16, _V32BF16]), "llvm.x86.avx512bf16.dpbf16ps.512"
        )
        self.convert = cgutils.get_or_insert_function(
            module, ir.FunctionType(_V32BF16, [_V16F32, _V16F32]), "llvm.x86.avx512bf16.cvtne2ps2bf16.512"
        )

    def activation(self, xptr, base):
        b = self.builder
        xs = _activation(b, xptr, base)
        # cvtne2ps2bf16(a, b): b's 16 words first, then a's
        low, high = (b.bitcast(b.call(self.convert, [xs[i + 1], xs[i]]), _V8I64) for i in (0, 2))
        return [
            b.bitcast(b.shuffle_vector(low, high, _const_indices(lanes)), _V32BF16)
            for lanes in (_LANES_EVEN, _LANES_ODD)
        ]

    def accumulate(self, accs, codes, xw):
        b = self.builder
        hi, lo = self.decode.halves(codes)
        for acc, order, xv in zip(accs, (_UNPACK_LOW, _UNPACK_HIGH), xw):
            words = b.bitcast(b.shuffle_vector(lo, hi, _const_indices(order)), _V32BF16)
            b.store(b.call(self.dot, [b.load(acc), words, xv]), acc)


def _sum4(builder, vectors):
    """Each of four <16 x float> summed across its lanes by a fixed tree of shuffles and adds (halves
    of two vectors side by side, then quarters, then pairs, then neighbours): a <4 x float> of the
    four sums in about a dozen instructions, where four lane-order sums take 60 dependent adds."""

    def fold(u, v, first, second):
        return builder.fadd(
            builder.shuffle_vector(u, v, _const_indices(first)), builder.shuffle_vector(u, v, _const_indices(second))
        )

    # 16 lanes of u and of v -> 8 + 8: u's halves added in lanes 0-7, v's in 8-15
    ab = fold(vectors[0], vectors[1], list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)))
    cd = fold(vectors[2], vectors[3], list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)))
    # -> 4 lanes a vector: row r in lanes 4 r .. 4 r + 3
    quarters = [q + 8 * h for h in range(2) for q in range(4)]
    four = fold(ab, cd, quarters + [16 + i for i in quarters], [i + 4 for i in quarters] + [20 + i for i in quarters])
    undef = ir.Constant(_V16F32, ir.Undefined)
    two = fold(
        four,
        undef,
        [4 * r + i for r in range(4) for i in (0, 1, 0, 1)],
        [4 * r + i for r in range(4) for i in (2, 3, 2, 3)],
    )
    one = fold(two, undef, [4 * r for r in range(4) for _ in range(4)], [4 * r + 1 for r in range(4) for _ in range(4)])
    return builder.shuffle_vector(one, undef, _const_indices([4 * r for r in range(ROWS)]))


def _lanes(builder, vector):
    return [builder.extract_element(vector, ir.Constant(_I32, r)) for r in range(ROWS)]


def _bf16_rows(context, builder, signature, args, nsteps, block_steps, on_block):
    """The bf16 loop shared by both intrinsics: ``nsteps`` 64-code steps over four rows (args 1-4)
    against x (arg 0), reading ``ahead`` (the last argument) ahead as ``dot4_e4m3`` does; every
    ``block_steps`` steps (or once at the end, None: then they are returned) the four rows' sums, a
    <4 x float>, go to ``on_block(index, sums)`` and the accumulators restart."""
    dot = _Bf16Dot(builder)
    xptr = _data(context, builder, signature, args, 0, _F32)
    wptrs = [_data(context, builder, signature, args, 1 + i, _I8) for i in range(ROWS)]
    next_ptr = _data(context, builder, signature, args, len(args) - 1, _I8)
    zero = ir.Constant(_V16F32, [ir.Constant(_F32, 0.0)] * 16)
    accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(ROWS)]

    def step(index):
        base = builder.mul(index, ir.Constant(index.type, BLOCK))
        xw = dot.activation(xptr, base)
        lines = builder.mul(base, ir.Constant(base.type, ROWS))  # 4 lines of `ahead` a step
        for row in range(ROWS):
            emit_prefetch(builder, builder.gep(next_ptr, [builder.add(lines, ir.Constant(base.type, 64 * row))]))
            codes = builder.load(builder.bitcast(builder.gep(wptrs[row], [base]), _V64I8.as_pointer()), align=1)
            dot.accumulate(accs[row], codes, xw)

    def sums():
        return _sum4(builder, [builder.fadd(builder.load(a), builder.load(b)) for a, b in accs])

    if block_steps is None:
        with cgutils.for_range(builder, nsteps) as loop:
            step(loop.index)
        return sums()
    with cgutils.for_range(builder, nsteps) as blocks:
        for row in accs:
            for acc in row:
                builder.store(zero, acc)
        first = builder.mul(blocks.index, block_steps)
        with cgutils.for_range(builder, block_steps) as loop:
            step(builder.add(first, loop.index))
        on_block(blocks.index, sums())
    return None


@intrinsic
def dot4_e4m3_bf16(typingctx, x, w0, w1, w2, w3, nblocks, ahead):
    """``dot4_e4m3`` on the avx512_bf16 path (same arguments, same result up to the order of the
    float32 sums): the codes' bfloat16 words into ``vdpbf16ps`` (the section above). ``x`` must hold
    e4m3 values (dec(a)): its bfloat16 conversion is then exact."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, nblocks, ahead)

    def codegen(context, builder, signature, args):
        sums = _bf16_rows(context, builder, signature, args, args[5], None, None)
        return context.make_tuple(builder, signature.return_type, _lanes(builder, sums))

    return sig, codegen


# The flag the block step's instructions carry. Numba's fastmath pass gives every float instruction of
# a reassociating kernel that has no flags its own ("reassoc", "contract"), the step's too, and LLVM
# then fused the step's multiply and add into an FMA (another rounding). "arcp" only licenses a
# reciprocal in a division, so on a multiply or an add it changes nothing, and it keeps those flags off.
_STRICT = ("arcp",)


@intrinsic
def dot4_e4m3_blocks_bf16(typingctx, x, w0, w1, w2, w3, block_steps, nblocks, sat, sb0, sb1, sb2, sb3, ahead):
    """The block-scaled M = 1 inner loop on the avx512_bf16 path, its block steps included: for
    i < 4 the total of rows w_i over ``nblocks`` K-blocks of 64 ``block_steps`` codes each,

        t_i = t_i + (p[kb, i] * sat[kb, 0]) * sb_i[kb],  kb in order, t_i from 0,

    p[kb, i] = sum_{k in block kb} x[k] * dec(w_i[k]) in any order (G3), the step in the contract's
    order and roundings (block.py, ``_block_step``), four rows in one <4 x float>. ``sat``: float32
    [>= nblocks, 1] C-contiguous (one activation row's block scales); ``sb_i``: the weight block-row
    of w_i's scales, float32, contiguous; ``x`` holds e4m3 values, as for ``dot4_e4m3_bf16``;
    ``ahead`` as there. Measured against the sums stored to an array and stepped by a strict
    function per four rows: 137 -> 126 us at 1536 x 2048 on one Zen 4 thread, weights in L3."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, block_steps, nblocks, sat, sb0, sb1, sb2, sb3, ahead)

    def codegen(context, builder, signature, args):
        steps, blocks = (context.cast(builder, args[i], signature.args[i], types.intp) for i in (5, 6))
        sat_ptr = _data(context, builder, signature, args, 7, _F32)
        sb_ptrs = [_data(context, builder, signature, args, 8 + i, _F32) for i in range(ROWS)]
        four = ir.VectorType(_F32, ROWS)
        total = cgutils.alloca_once_value(builder, ir.Constant(four, [ir.Constant(_F32, 0.0)] * ROWS))
        undef = ir.Constant(four, ir.Undefined)

        def step(kb, sums):
            sa = builder.load(builder.gep(sat_ptr, [kb]))
            sa = builder.shuffle_vector(
                builder.insert_element(undef, sa, ir.Constant(_I32, 0)), undef, _const_indices([0] * ROWS)
            )
            sb = undef
            for i, ptr in enumerate(sb_ptrs):
                sb = builder.insert_element(sb, builder.load(builder.gep(ptr, [kb])), ir.Constant(_I32, i))
            scaled = builder.fmul(builder.fmul(sums, sa, flags=_STRICT), sb, flags=_STRICT)
            builder.store(builder.fadd(builder.load(total), scaled, flags=_STRICT), total)

        _bf16_rows(context, builder, signature, args, blocks, steps, step)
        return context.make_tuple(builder, signature.return_type, _lanes(builder, builder.load(total)))

    return sig, codegen
