"""The e4m3 decode and dot product on aarch64 NEON, written as LLVM vector IR through a Numba intrinsic:
the ``neon_tbl`` path's M = 1 inner loop (the counterpart of ``vbmi.py``; read that first).

Every e4m3 value's float32 is two table bytes (``hi``, ``lo``) over 16 zero bits. Per 16 weight codes:
``tbl`` (four table registers, 64 entries) then ``tbx`` (the other 64; indices out of its range keep
the first lookup's byte) give ``hi`` and ``lo`` for the code's 7-bit magnitude, the sign bit is OR-ed
into ``hi``, two ``zip``s put (lo, hi) byte pairs into the top half of each float32 lane, and four
``fmla`` accumulate. The bit-arithmetic decode that LLVM vectorizes for NEON spends ~5.5 instructions
per weight (widening ``sshll``/``ushll``, shifts, compares, ``bit`` selects, ``ucvtf``, ``fmul``,
``fneg``: read from its assembly for Neoverse N1 and generic aarch64); this loop ~1.1. Chosen by that
count: no Arm hardware was at hand, and emulated timings mean nothing. The products are the same
exact float32 products; only the order of the float32 sums differs, which G3 allows. Proven under
emulation (tools/arm64/run.sh): every code at every lane position decodes to the decoder's value.
"""

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .vbmi import BLOCK, HI, LO, ROWS

_I8, _I32, _F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
_V16I8, _V32I8, _V64I8, _V16F32 = (ir.VectorType(_I8, 16), ir.VectorType(_I8, 32), ir.VectorType(_I8, 64),
                                   ir.VectorType(_F32, 16))


def _bytes(values, vtype=_V16I8):
    return ir.Constant(vtype, [ir.Constant(_I8, int(v)) for v in values])


def _mask(indices):
    return ir.Constant(ir.VectorType(_I32, len(indices)), [ir.Constant(_I32, int(i)) for i in indices])


# (lo_j, hi_j) interleaved, then each pair placed in bytes 2 and 3 of float32 lane j (zeros below)
_INTERLEAVE = _mask([i // 2 + (16 if i % 2 else 0) for i in range(32)])
_LANES = _mask([32 + 2 * (i // 4) + (i % 4 - 2) if i % 4 >= 2 else 0 for i in range(64)])


@intrinsic
def dot4_e4m3(typingctx, x, w0, w1, w2, w3, nblocks):
    """As ``vbmi.dot4_e4m3``: (sum_k x[k] * dec(w_i[k]) for i in 0..3) over k < 64 * nblocks."""
    sig = types.UniTuple(types.float32, ROWS)(x, w0, w1, w2, w3, nblocks)

    def codegen(context, builder, signature, args):
        module = builder.module
        tbl = cgutils.get_or_insert_function(module, ir.FunctionType(_V16I8, [_V16I8] * 5),
                                             "llvm.aarch64.neon.tbl4.v16i8")
        tbx = cgutils.get_or_insert_function(module, ir.FunctionType(_V16I8, [_V16I8] * 6),
                                             "llvm.aarch64.neon.tbx4.v16i8")
        fma = cgutils.get_or_insert_function(module, ir.FunctionType(_V16F32, [_V16F32] * 3), "llvm.fma.v16f32")
        xptr = builder.bitcast(context.make_array(signature.args[0])(context, builder, args[0]).data,
                               _F32.as_pointer())
        wptrs = [builder.bitcast(context.make_array(signature.args[1 + i])(context, builder, args[1 + i]).data,
                                 _I8.as_pointer()) for i in range(ROWS)]
        zero = ir.Constant(_V16F32, [ir.Constant(_F32, 0.0)] * 16)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(ROWS)]
        hi_tables = [_bytes(HI[16 * t:16 * t + 16]) for t in range(8)]
        lo_tables = [_bytes(LO[16 * t:16 * t + 16]) for t in range(8)]
        magnitude, sign, sixty_four = _bytes([0x7F] * 16), _bytes([0x80] * 16), _bytes([64] * 16)
        zeros32 = _bytes([0] * 32, _V32I8)

        def lookup(tables, index, upper):
            first = builder.call(tbl, tables[:4] + [index])
            return builder.call(tbx, [first] + tables[4:] + [upper])  # out-of-range indices keep `first`

        with cgutils.for_range(builder, builder.mul(args[5], ir.Constant(args[5].type, BLOCK // 16))) as loop:
            base = builder.mul(loop.index, ir.Constant(loop.index.type, 16))
            xs = builder.load(builder.bitcast(builder.gep(xptr, [base]), _V16F32.as_pointer()), align=4)
            for row in range(ROWS):
                codes = builder.load(builder.bitcast(builder.gep(wptrs[row], [base]), _V16I8.as_pointer()), align=1)
                index = builder.and_(codes, magnitude)
                upper = builder.sub(index, sixty_four)  # 0..63 for the upper half, >= 192 (out of range) below
                hi = builder.or_(lookup(hi_tables, index, upper), builder.and_(codes, sign))
                lo = lookup(lo_tables, index, upper)
                pairs = builder.shuffle_vector(lo, hi, _INTERLEAVE)
                lanes = builder.bitcast(builder.shuffle_vector(zeros32, pairs, _LANES), _V16F32)
                builder.store(builder.call(fma, [lanes, xs, builder.load(accs[row])]), accs[row])
        sums = []
        for row in range(ROWS):
            v = builder.load(accs[row])
            total = builder.extract_element(v, ir.Constant(_I32, 0))
            for j in range(1, 16):
                total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, j)))
            sums.append(total)
        return context.make_tuple(builder, signature.return_type, sums)

    return sig, codegen

