"""Tensor-core primitives for Numba kernels: FP8 ``mma.sync``, ``ldmatrix``, shared-memory loads
and ``cp.async`` copies, as llvmlite ``InlineAsm`` intrinsics (the mechanism of ``codec.py``'s
``cvt``), each with a portable emulation for the CUDA simulator.

The instruction: ``mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`` (sm_89 and newer), one
warp computing D[16, 8] = A[16, 32] B[32, 8] + C in float32 from e4m3 codes. Fragment layout
(PTX ISA, "Matrix Fragments for mma.m16n8k32", and measured on the H200), lane = 4 g + t:

- A: a0..a3 hold rows g, g + 8, g, g + 8 at k = 4t .. 4t + 3 (a2, a3: k + 16), four codes a
  register, the lowest k in the lowest byte;
- B: b0, b1 hold column g at k = 4t .. 4t + 3 (b1: k + 16);
- C and D: c0, c1 at row g, columns 2t, 2t + 1; c2, c3 at row g + 8.

A is "row" (k contiguous in a row of A) and B is "col" (k contiguous in a column of B), so both
operands read k-contiguous bytes: for ``a [M, K] @ b[N, K]^T`` a row of ``b`` (nn.Linear's layout)
is exactly a B column. Only the pairing of k between A and B matters to the product, so a kernel
may load any permutation of k as long as it uses the same one for both (the decode GEMV does).

On sm_90 the instruction is not native: ptxas lowers it to e4m3 -> f16 conversions
(F2FP.F16.E4M3.UNPACK_B), two HMMA.16816.F32 (the first from zero) and a float32 FADD of C
(cuobjdump), so C is added in float32 after each k32 product (tc_gemm.py relies on it).

The f16 path (tc_gemm.py's f16-staged tiles): ``cvt_e4m3x4_f16`` converts four codes (one 32-bit
word) into two f16x2 words with ``cvt.rn.f16x2.e4m3x2`` (sm_89 and newer; exact: every e4m3 value
is an f16 value, NaN stays NaN), and ``mma_f16`` is ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``
(native HMMA.16816.F32 on sm_80 and newer). Its fragments, lane = 4 g + t, two f16 a register (the
lower k in the lower half): A: a0, a1 rows g, g + 8 at k = 2t, 2t + 1; a2, a3 the same at k + 8;
B: b0 column g at k = 2t, 2t + 1, b1 at k + 8; C and D as above.

``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` hands lane 4 g + t the 32-bit word t of row g of
each of four 8 x 16-byte matrices whose row addresses lanes 8 j .. 8 j + 7 supply: with rows of
codes that is word for word the A fragment (matrices: rows 0-7 / 8-15 at k 0-15, then at k 16-31)
and two B fragments, one instruction where 32-bit shared loads take four. With rows of f16 (8 a
16-byte row) the same four matrices are the m16n8k16 A fragment (rows 0-7 / 8-15 at k 0-7, then
k 8-15) and two B fragments.

Emulation (``NUMBA_ENABLE_CUDASIM=1``): the simulator runs each thread as a Python thread and has
no PTX. There each warp-level primitive exchanges its lanes' operands through a shared ``scratch``
array (``SCRATCH_WORDS_PER_WARP`` uint32 per warp), synchronizing the block (so every thread of the
block must call it, as on the GPU every lane of a warp must); the emulated mma decodes the codes
exactly and sums the 32 (f16: 16) products of each output in float32, k ascending, then adds C. The hardware
functions take the same ``scratch, warp, lane`` arguments and ignore them, so one kernel source
serves both. ``cp.async`` is a synchronous copy there, commit and wait do nothing.
"""

import numpy as np

from .target import (
    DEVICE_INLINE,
    SIMULATOR,
    cuda,
    intrinsic,
    lowering,
    mlir_address,
    mlir_asm,
    mlir_byte_pointer,
    mlir_cast,
    mlir_codegen,
    mlir_element_pointer,
    mlir_stride_bytes,
    mlir_type,
    types,
)

MIN_CC = (8, 9)  # mma with e4m3 operands: sm_89 (Ada) and newer
SCRATCH_WORDS_PER_WARP = 6 * 32  # the emulation's exchange area: six operand words per lane

if SIMULATOR:
    from ... import _format

    _DECODE = np.array([_format.decode_e4m3_scalar(np.uint32(c)) for c in range(256)], dtype=np.float32)

    def _fragment_tables(depth, per_register):
        """Where the fragments of an m16n8k{depth} mma put each element, ``per_register`` elements a
        32-bit register, the lowest k lowest (PTX ISA, "Matrix Fragments for mma.m16n8k32" and
        "... m16n8k16"; half = depth / 2): A[r, k] in lane 4 (r % 8) + (k % half) / per_register,
        register (r >= 8) + 2 (k >= half); B[k, n] (stored per column n) in lane 4 n + (k % half) /
        per_register, register k >= half; (A lanes, A registers, B lanes, B registers, bit offsets)."""
        k = np.arange(depth)
        half = depth // 2
        return (
            4 * (np.arange(16)[:, None] % 8) + (k[None, :] % half) // per_register,
            (np.arange(16)[:, None] // 8) + 2 * (k[None, :] // half),
            4 * np.arange(8)[:, None] + (k[None, :] % half) // per_register,
            np.broadcast_to(k[None, :] // half, (8, depth)),
            ((32 // per_register) * (k % per_register)).astype(np.uint32),
        )

    _A_LANE, _A_REG, _B_LANE, _B_REG, _SHIFT = _fragment_tables(32, 4)  # e4m3: four codes a register

    def _codes(words, lanes, regs):
        return ((words[lanes, regs] >> _SHIFT[None, :]) & np.uint32(0xFF)).astype(np.uint8)

    def _emulated_mma(operands):
        """The emulated mma of one fragment layout: ``operands(words, g, t)`` -> (A rows g, g + 8;
        B columns 2 t, 2 t + 1) as float32 [2, K] from the warp's [32, 6] operand words."""

        def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, warp, lane):
            base = warp * SCRATCH_WORDS_PER_WARP
            for i, w in enumerate((a0, a1, a2, a3, b0, b1)):
                scratch[base + 6 * lane + i] = np.uint32(w)
            cuda.syncthreads()
            words = np.array(scratch[base : base + SCRATCH_WORDS_PER_WARP], dtype=np.uint32).reshape(32, 6)
            a_rows, b_cols = operands(words, lane // 4, lane % 4)
            cuda.syncthreads()
            out = []
            for r, c, cin in ((0, 0, c0), (0, 1, c1), (1, 0, c2), (1, 1, c3)):
                s = np.float32(0.0)
                with np.errstate(invalid="ignore", over="ignore"):
                    for k in range(a_rows.shape[1]):
                        s = np.float32(s + np.float32(a_rows[r, k] * b_cols[c, k]))
                    out.append(np.float32(np.float32(cin) + s))
            return out[0], out[1], out[2], out[3]

        return mma

    def _e4m3_operands(words, g, t):
        return (
            _DECODE[_codes(words[:, 0:4], _A_LANE[[g, g + 8]], _A_REG[[g, g + 8]])],
            _DECODE[_codes(words[:, 4:6], _B_LANE[[2 * t, 2 * t + 1]], _B_REG[:2])],
        )

    # Emulated m16n8k32 e4m3 mma: this lane's (d0, d1, d2, d3)
    mma_e4m3 = _emulated_mma(_e4m3_operands)

    _HA_LANE, _HA_REG, _HB_LANE, _HB_REG, _HSHIFT = _fragment_tables(16, 2)  # f16: two halves a register

    def _halves(words, lanes, regs):
        bits = ((words[lanes, regs] >> _HSHIFT[None, :]) & np.uint32(0xFFFF)).astype(np.uint16)
        return bits.view(np.float16).astype(np.float32)

    def _f16_operands(words, g, t):
        return (
            _halves(words[:, 0:4], _HA_LANE[[g, g + 8]], _HA_REG[[g, g + 8]]),
            _halves(words[:, 4:6], _HB_LANE[[2 * t, 2 * t + 1]], _HB_REG[:2]),
        )

    # Emulated m16n8k16 f16 mma (float32 accumulate): this lane's (d0, d1, d2, d3)
    mma_f16 = _emulated_mma(_f16_operands)

    _F16_BITS = _DECODE.astype(np.float16).view(np.uint16).astype(np.uint32)  # exact: e4m3 is in f16

    def cvt_e4m3x4_f16(word):
        """The four codes of ``word`` as two f16x2 words: (codes 0, 1), (codes 2, 3), the lower code
        in the lower half."""
        w = np.uint32(word)
        h = [_F16_BITS[int((w >> np.uint32(8 * i)) & np.uint32(0xFF))] for i in range(4)]
        return np.uint32(h[0] | (h[1] << np.uint32(16))), np.uint32(h[2] | (h[3] << np.uint32(16)))

    def sts_u32x4(smem, word, w0, w1, w2, w3):
        smem[word] = w0
        smem[word + 1] = w1
        smem[word + 2] = w2
        smem[word + 3] = w3

    def ldmatrix_x4(smem, row_word, scratch, warp, lane):
        """Emulated ldmatrix .x4: lane supplies the word index of row ``lane % 8`` of matrix
        ``lane // 8``; returns word ``lane % 4`` of row ``lane // 4`` of each matrix."""
        base = warp * SCRATCH_WORDS_PER_WARP
        scratch[base + lane] = np.uint32(row_word)
        cuda.syncthreads()
        g, t = lane // 4, lane % 4
        r = [np.uint32(smem[int(scratch[base + 8 * j + g]) + t]) for j in range(4)]
        cuda.syncthreads()
        return r[0], r[1], r[2], r[3]

    def lds_u32(smem, word):
        return np.uint32(smem[word])

    def lds_u32x4(smem, word):
        return np.uint32(smem[word]), np.uint32(smem[word + 1]), np.uint32(smem[word + 2]), np.uint32(smem[word + 3])

    def global_address(src, row, col):
        """The byte offset of src[row, col] (an address on the GPU)."""
        return row * src.strides[0] + col

    def cp_async_16(smem, word, src, address, nbytes):
        """Copy the 16 bytes at ``address`` of src into smem words word .. word + 4; zeros when
        nbytes == 0."""
        flat = (
            np.lib.stride_tricks.as_strided(src, shape=(src.shape[0] * src.strides[0],), strides=(1,))
            if src.shape[0]
            else src.reshape(-1)
        )
        for q in range(4):
            w = np.uint32(0)
            if nbytes != 0:
                for j in range(4):
                    w |= np.uint32(flat[address + 4 * q + j]) << np.uint32(8 * j)
            smem[word + q] = w

    def cp_async_commit():
        pass

    def cp_async_wait_group(n):
        def wait():
            pass

        return cuda.jit(device=True)(wait)

    mma_e4m3 = cuda.jit(device=True)(mma_e4m3)
    mma_f16 = cuda.jit(device=True)(mma_f16)
    cvt_e4m3x4_f16 = cuda.jit(device=True)(cvt_e4m3x4_f16)
    sts_u32x4 = cuda.jit(device=True)(sts_u32x4)
    ldmatrix_x4 = cuda.jit(device=True)(ldmatrix_x4)
    lds_u32 = cuda.jit(device=True)(lds_u32)
    lds_u32x4 = cuda.jit(device=True)(lds_u32x4)
    cp_async_16 = cuda.jit(device=True)(cp_async_16)
    global_address = cuda.jit(device=True)(global_address)
    cp_async_commit = cuda.jit(device=True)(cp_async_commit)

else:
    from llvmlite import ir

    from .codec import asm_tuple

    _i8, _i32, _i64, _f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()

    def _shared_address(context, builder, arrty, arr, index, indexty):
        """The 32-bit shared-memory address of word ``index`` of a shared array (Numba keeps a
        generic pointer in the array; addrspacecast back to addrspace(3) folds to the symbol)."""
        ary = context.make_array(arrty)(context, builder, arr)
        idx = context.cast(builder, index, indexty, types.intp)
        elem = builder.gep(ary.data, [idx])
        shared = builder.addrspacecast(elem, elem.type.pointee.as_pointer(3))
        return builder.ptrtoint(shared, _i32), shared

    def _global_address(context, builder, arrty, arr, row, rowty, col, colty):
        """The 64-bit global address of byte &arr[row, col] of a 2-D array with unit column stride."""
        ary = context.make_array(arrty)(context, builder, arr)
        r = context.cast(builder, row, rowty, types.intp)
        c = context.cast(builder, col, colty, types.intp)
        stride0 = builder.extract_value(ary.strides, 0)
        offset = builder.add(builder.mul(r, stride0), c)
        ptr = builder.gep(builder.bitcast(ary.data, _i8.as_pointer()), [offset])
        return builder.ptrtoint(builder.addrspacecast(ptr, _i8.as_pointer(1)), _i64)

    # numba-cuda-mlir: the same addresses from a memref (target.py's mlir_* helpers)
    def _mlir_shared_pointer(lower, values, argtypes):
        """(32-bit shared address, shared-space pointer) of word values[1] of the array values[0]."""
        ptr = mlir_element_pointer(lower, values[0], argtypes[0], values[1:2], argtypes[1:2], space=3)
        return mlir_address(ptr, 32), ptr

    def _mlir_u32(lower, values, argtypes):
        return [mlir_cast(lower, v, t, types.uint32) for v, t in zip(values, argtypes)]

    def _mlir_llvm():
        from numba_cuda_mlir._mlir.dialects import llvm

        return llvm

    def _mlir_lane(i):
        from numba_cuda_mlir._mlir.dialects import arith

        return arith.constant(mlir_type("i32"), i)

    def _mlir_void_asm(text, constraints="~{memory}", operands=lambda lower, values, argtypes: []):
        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            mlir_asm(text, constraints, operands(lower, values, argtypes), side_effect=True)

        return mlir

    def _mma_sync(instruction):
        """The intrinsic ``mma(a0..a3, b0, b1, c0..c3, scratch, warp, lane) -> (d0..d3)`` running
        ``instruction`` (an m16n8 mma.sync with four A, two B and four float32 C/D registers a lane);
        scratch, warp and lane are the emulation's and are ignored here."""

        @intrinsic
        def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, warp, lane):
            sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, scratch, warp, lane)

            def codegen(context, builder, signature, args):
                tys = signature.args
                ins = [context.cast(builder, v, t, types.uint32) for v, t in zip(args[:6], tys[:6])]
                ins += [context.cast(builder, v, t, types.float32) for v, t in zip(args[6:10], tys[6:10])]
                return asm_tuple(
                    context,
                    builder,
                    signature.return_type,
                    _f32,
                    instruction + " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                    "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                    ins,
                )

            @mlir_codegen
            def mlir(lower, values, argtypes, restype):
                ins = _mlir_u32(lower, values[:6], argtypes[:6])
                ins += [mlir_cast(lower, v, t, types.float32) for v, t in zip(values[6:10], argtypes[6:10])]
                text = instruction + " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};"
                return tuple(mlir_asm(text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", ins, "ffff"))

            return sig, lowering(codegen, mlir)

        return mma

    # D = A B + C for one m16n8k32 e4m3 tile (this lane's fragments)
    mma_e4m3 = _mma_sync("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
    # D = A B + C for one m16n8k16 f16 tile, float32 accumulate (two f16 a 32-bit register)
    mma_f16 = _mma_sync("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")

    @intrinsic
    def cvt_e4m3x4_f16(typingctx, word):
        """The four e4m3 codes of a 32-bit word as two f16x2 words, (codes 0, 1) and (codes 2, 3),
        the lower code in the lower half (cvt.rn.f16x2.e4m3x2: exact)."""
        ret = types.UniTuple(types.uint32, 2)
        sig = ret(word)

        def codegen(context, builder, signature, args):
            w = context.cast(builder, args[0], signature.args[0], types.uint32)
            return asm_tuple(
                context,
                builder,
                ret,
                _i32,
                "{ .reg .b16 c01, c23; mov.b32 {c01, c23}, $2; "
                "cvt.rn.f16x2.e4m3x2 $0, c01; cvt.rn.f16x2.e4m3x2 $1, c23; }",
                "=r,=r,r",
                [w],
            )

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            text = (
                "{ .reg .b16 c01, c23; mov.b32 {c01, c23}, $2; "
                "cvt.rn.f16x2.e4m3x2 $0, c01; cvt.rn.f16x2.e4m3x2 $1, c23; }"
            )
            return tuple(mlir_asm(text, "=r,=r,r", _mlir_u32(lower, values, argtypes), "rr"))

        return sig, lowering(codegen, mlir)

    @intrinsic
    def sts_u32x4(typingctx, smem, word, w0, w1, w2, w3):
        """smem[word .. word + 4) = w0 .. w3 in one 16-byte shared store (word % 4 == 0)."""
        sig = types.void(smem, word, w0, w1, w2, w3)

        def codegen(context, builder, signature, args):
            tys = signature.args
            _, ptr = _shared_address(context, builder, tys[0], args[0], args[1], tys[1])
            vec = ir.Constant(ir.VectorType(_i32, 4), ir.Undefined)
            for i in range(4):
                v = context.cast(builder, args[2 + i], tys[2 + i], types.uint32)
                vec = builder.insert_element(vec, v, ir.Constant(_i32, i))
            builder.store(vec, builder.bitcast(ptr, ir.VectorType(_i32, 4).as_pointer(3)), align=16)
            return context.get_dummy_value()

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            _, ptr = _mlir_shared_pointer(lower, values, argtypes)
            vec = _mlir_llvm().mlir_undef(mlir_type("vector<4xi32>"))
            for i, word in enumerate(_mlir_u32(lower, values[2:], argtypes[2:])):
                vec = _mlir_llvm().insertelement(vec, word, _mlir_lane(i))
            _mlir_llvm().store(vec, ptr, alignment=16)

        return sig, lowering(codegen, mlir)

    @intrinsic
    def ldmatrix_x4(typingctx, smem, row_word, scratch, warp, lane):
        """ldmatrix.sync.aligned.m8n8.x4.shared.b16 from the row at word ``row_word`` of ``smem``
        (this lane's row address: row lane % 8 of matrix lane // 8)."""
        ret = types.UniTuple(types.uint32, 4)
        sig = ret(smem, row_word, scratch, warp, lane)

        def codegen(context, builder, signature, args):
            addr, _ = _shared_address(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            return asm_tuple(
                context,
                builder,
                ret,
                _i32,
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
                "=r,=r,=r,=r,r,~{memory}",
                [addr],
                side_effect=True,
            )

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            addr, _ = _mlir_shared_pointer(lower, values, argtypes)
            text = "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
            return tuple(mlir_asm(text, "=r,=r,=r,=r,r,~{memory}", [addr], "rrrr", side_effect=True))

        return sig, lowering(codegen, mlir)

    @intrinsic
    def lds_u32(typingctx, smem, word):
        """smem[word] as uint32 through a shared-space load (no negative-index wraparound)."""
        sig = types.uint32(smem, word)

        def codegen(context, builder, signature, args):
            _, ptr = _shared_address(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            return builder.load(ptr, align=4)

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            _, ptr = _mlir_shared_pointer(lower, values, argtypes)
            return _mlir_llvm().load(mlir_type("i32"), ptr, alignment=4)

        return sig, lowering(codegen, mlir)

    @intrinsic
    def global_address(typingctx, src, row, col):
        """The global address of byte &src[row, col] (a 2-D array with unit column stride) as
        int64: kernels advance it with integer arithmetic, so no per-copy row products stay live."""
        sig = types.int64(src, row, col)

        def codegen(context, builder, signature, args):
            tys = signature.args
            return _global_address(context, builder, tys[0], args[0], args[1], tys[1], args[2], tys[2])

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            row, col = (mlir_cast(lower, v, t, types.int64) for v, t in zip(values[1:], argtypes[1:]))
            offset = row * mlir_stride_bytes(lower, values[0], argtypes[0], 0) + col  # col in bytes, as above
            return mlir_address(mlir_byte_pointer(values[0], offset, space=1))

        return sig, lowering(codegen, mlir)

    @intrinsic
    def lds_u32x4(typingctx, smem, word):
        """smem[word .. word + 4) as 4 uint32 in one 16-byte shared load (word % 4 == 0)."""
        ret = types.UniTuple(types.uint32, 4)
        sig = ret(smem, word)

        def codegen(context, builder, signature, args):
            _, ptr = _shared_address(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            vec_ptr = builder.bitcast(ptr, ir.VectorType(_i32, 4).as_pointer(3))
            vec = builder.load(vec_ptr, align=16)
            words = [builder.extract_element(vec, ir.Constant(_i32, i)) for i in range(4)]
            return context.make_tuple(builder, ret, words)

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            _, ptr = _mlir_shared_pointer(lower, values, argtypes)
            vec = _mlir_llvm().load(mlir_type("vector<4xi32>"), ptr, alignment=16)
            return tuple(_mlir_llvm().extractelement(vec, _mlir_lane(i)) for i in range(4))

        return sig, lowering(codegen, mlir)

    @intrinsic
    def cp_async_16(typingctx, smem, word, src, address, nbytes):
        """cp.async.cg.shared.global of the 16 bytes at global ``address`` (see global_address;
        ``src`` is the array it points into, unused here) to smem word ``word``, both 16-byte
        aligned; ``nbytes`` (0 or 16) bytes are read, the rest zero-filled."""
        sig = types.void(smem, word, src, address, nbytes)

        def codegen(context, builder, signature, args):
            tys = signature.args
            dst, _ = _shared_address(context, builder, tys[0], args[0], args[1], tys[1])
            gaddr = context.cast(builder, args[3], tys[3], types.int64)
            size = context.cast(builder, args[4], tys[4], types.uint32)
            fnty = ir.FunctionType(ir.VoidType(), [_i32, _i64, _i32])
            asm = ir.InlineAsm(
                fnty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True
            )
            builder.call(asm, [dst, gaddr, size])
            return context.get_dummy_value()

        def operands(lower, values, argtypes):
            dst, _ = _mlir_shared_pointer(lower, values, argtypes)
            gaddr = mlir_cast(lower, values[3], argtypes[3], types.int64)
            return [dst, gaddr, mlir_cast(lower, values[4], argtypes[4], types.uint32)]

        mlir = _mlir_void_asm("cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", operands)
        return sig, lowering(codegen, mlir)

    @intrinsic
    def cp_async_commit(typingctx):
        """cp.async.commit_group: the copies issued so far form one group."""
        sig = types.void()

        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(
                ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}", side_effect=True
            )
            builder.call(asm, [])
            return context.get_dummy_value()

        return sig, lowering(codegen, _mlir_void_asm("cp.async.commit_group;"))

    _WAITS = {}

    def cp_async_wait_group(n):
        """The intrinsic ``cp.async.wait_group n``: wait until at most ``n`` groups are pending."""
        if n not in _WAITS:

            @intrinsic
            def wait(typingctx):
                sig = types.void()

                def codegen(context, builder, signature, args):
                    asm = ir.InlineAsm(
                        ir.FunctionType(ir.VoidType(), []),
                        f"cp.async.wait_group {int(n)};",
                        "~{memory}",
                        side_effect=True,
                    )
                    builder.call(asm, [])
                    return context.get_dummy_value()

                return sig, lowering(codegen, _mlir_void_asm(f"cp.async.wait_group {int(n)};"))

            _WAITS[n] = wait
        return _WAITS[n]


def cp_async_rows(copies, pass_words):
    """``copy(smem, word, src, address, step, col, rows, k_ok, zero)``: this thread's ``copies``
    16-byte ``cp_async_16`` copies of one operand's rows, copy i from ``address + i * step + col``
    into smem words ``word + i * pass_words``; a copy past the operand's rows (i >= rows) or past
    K (not ``k_ok``) is zero-filled, reading from the valid address ``zero``. The tile loads of the
    cp.async GEMMs (tc_gemm.py, sm90_wgmma_gemm.py)."""
    copy16 = cp_async_16

    @cuda.jit(**DEVICE_INLINE)
    def copy(smem, word, src, address, step, col, rows, k_ok, zero):
        for i in range(copies):
            ok = k_ok and i < rows
            copy16(smem, word + i * pass_words, src, (address + i * step + col) if ok else zero, 16 if ok else 0)

    return copy


def available(cc):
    """Whether the tensor-core instructions exist on compute capability ``cc`` (a real GPU)."""
    return not SIMULATOR and tuple(cc) >= MIN_CC


__all__ = [
    "MIN_CC",
    "SCRATCH_WORDS_PER_WARP",
    "available",
    "mma_e4m3",
    "mma_f16",
    "cvt_e4m3x4_f16",
    "sts_u32x4",
    "ldmatrix_x4",
    "lds_u32",
    "lds_u32x4",
    "global_address",
    "cp_async_16",
    "cp_async_commit",
    "cp_async_wait_group",
    "cp_async_rows",
]
