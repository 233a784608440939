"""The e4m3 decode and dot product on aarch64 NEON, written as LLVM vector IR through a Numba intrinsic:
the ``neon_tbl`` path's M = 1 inner loop (the counterpart of ``vbmi.py``; read that first).

Every e4m3 value's float32 is two table bytes (``hi``, ``lo``) over 16 zero bits. Per 16 weight codes:
``tbl`` (four table registers, 64 entries) then ``tbx`` (the other 64; indices out of its range keep
the first lookup's byte) give ``hi`` and ``lo`` for the code's 7-bit magnitude, the sign bit is OR-ed
into ``hi``, ``zip1``/``zip2`` pair the bytes (lo, hi) and zip the pairs with zeros into the top
half of four float32 vectors, and four ``fmla`` accumulate, one float32x4 accumulator per weight row
(16 table registers, 4 accumulators and the activation fit NEON's 32 registers without spilling).
Chosen by instruction count, read from the assembly LLVM makes of it for Neoverse N1/V2, Cortex-X925
and generic aarch64 (tools/arm64/check.py; see benchmarks/RESULTS.md): no Arm hardware was at hand,
and emulated timings mean nothing. The products are the same exact float32 products; only the order
of the float32 sums differs, which G3 allows. Proven under emulation (tools/arm64/run.sh): every
code at every lane position decodes to the decoder's value.
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .vbmi import BLOCK, HI, LO, ROWS

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
_V16I8, _V8I16, _V4F32 = ir.VectorType(_I8, 16), ir.VectorType(_I16, 8), ir.VectorType(_F32, 4)


def _bytes(values):
    return ir.Constant(_V16I8, [ir.Constant(_I8, int(v)) for v in values])


def _mask(indices):
    return ir.Constant(ir.VectorType(_I32, len(indices)), [ir.Constant(_I32, int(i)) for i in indices])


_ZIP1_16B = _mask([i // 2 + (16 if i % 2 else 0) for i in range(16)])  # lo0 hi0 lo1 hi1 ... lo7 hi7
_ZIP2_16B = _mask([8 + i // 2 + (16 if i % 2 else 0) for i in range(16)])
_ZIP1_8H = _mask([0, 8, 1, 9, 2, 10, 3, 11])  # (0, pair) halfword pairs: the pair in each lane's top half
_ZIP2_8H = _mask([4, 12, 5, 13, 6, 14, 7, 15])


def emit_dot4(builder, xptr, wptrs, nblocks):
    """The loop in IR at ``builder``: float32 sums of x[k] * dec(w_i[k]) for the four rows ``wptrs``
    (i8*) over k < 64 * nblocks; ``xptr`` is float*. Returns the four float32 values."""
    module = builder.module
    tbl = cgutils.get_or_insert_function(module, ir.FunctionType(_V16I8, [_V16I8] * 5), "llvm.aarch64.neon.tbl4.v16i8")
    tbx = cgutils.get_or_insert_function(module, ir.FunctionType(_V16I8, [_V16I8] * 6), "llvm.aarch64.neon.tbx4.v16i8")
    fma = cgutils.get_or_insert_function(module, ir.FunctionType(_V4F32, [_V4F32] * 3), "llvm.fma.v4f32")
    zero = ir.Constant(_V4F32, [ir.Constant(_F32, 0.0)] * 4)
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(ROWS)]
    hi_tables = [_bytes(HI[16 * t : 16 * t + 16]) for t in range(8)]
    lo_tables = [_bytes(LO[16 * t : 16 * t + 16]) for t in range(8)]
    magnitude, sign, sixty_four = _bytes([0x7F] * 16), _bytes([0x80] * 16), _bytes([64] * 16)
    zeros8h = ir.Constant(_V8I16, [ir.Constant(_I16, 0)] * 8)

    def lookup(tables, index, upper):
        first = builder.call(tbl, tables[:4] + [index])
        return builder.call(tbx, [first] + tables[4:] + [upper])  # out-of-range indices keep `first`

    with cgutils.for_range(builder, builder.mul(nblocks, ir.Constant(nblocks.type, BLOCK // 16))) as loop:
        base = builder.mul(loop.index, ir.Constant(loop.index.type, 16))
        xs = [
            builder.load(
                builder.bitcast(
                    builder.gep(xptr, [builder.add(base, ir.Constant(base.type, 4 * r))]), _V4F32.as_pointer()
                ),
                align=4,
            )
            for r in range(4)
        ]
        for row in range(ROWS):
            codes = builder.load(builder.bitcast(builder.gep(wptrs[row], [base]), _V16I8.as_pointer()), align=1)
            index = builder.and_(codes, magnitude)
            upper = builder.sub(index, sixty_four)  # 0..63 for the upper half, >= 192 (out of range) below
            hi = builder.or_(lookup(hi_tables, index, upper), builder.and_(codes, sign))
            lo = lookup(lo_tables, index, upper)
            lanes = []
            for pairs_mask in (_ZIP1_16B, _ZIP2_16B):
                pairs = builder.bitcast(builder.shuffle_vector(lo, hi, pairs_mask), _V8I16)
                for half_mask in (_ZIP1_8H, _ZIP2_8H):
                    lanes.append(builder.bitcast(builder.shuffle_vector(zeros8h, pairs, half_mask), _V4F32))
            acc = builder.load(accs[row])
            for r in range(4):
                acc = builder.call(fma, [lanes[r], xs[r], acc])
            builder.store(acc, accs[row])
    sums = []
    for row in range(ROWS):
        v = builder.load(accs[row])
        total = builder.extract_element(v, ir.Constant(_I32, 0))
        for j in range(1, 4):
            total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, j)))
        sums.append(total)
    return sums


@intrinsic
def dot4_e4m3(typingctx, x, w0, w1, w2, w3, nblocks, ahead):
    """As ``vbmi.dot4_e4m3``: (sum_k x[k] * dec(w_i[k]) for i in 0..3) over k < 64 * nblocks.
    ``ahead`` (the bytes vbmi's prefetches) is taken and not read: that prefetch was measured on
    x86 only, and no Arm hardware was at hand to measure it here."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, nblocks, ahead)

    def codegen(context, builder, signature, args):
        xptr = builder.bitcast(context.make_array(signature.args[0])(context, builder, args[0]).data, _F32.as_pointer())
        wptrs = [
            builder.bitcast(
                context.make_array(signature.args[1 + i])(context, builder, args[1 + i]).data, _I8.as_pointer()
            )
            for i in range(ROWS)
        ]
        sums = emit_dot4(builder, xptr, wptrs, args[5])
        return context.make_tuple(builder, signature.return_type, sums)

    return sig, codegen
