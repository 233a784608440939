"""Hopper's warpgroup MMA for Numba kernels: ``wgmma.mma_async`` with e4m3 operands read from
shared memory through matrix descriptors, its fences, and the ``fence.proxy.async`` that makes
``cp.async`` data visible to it -- llvmlite ``InlineAsm`` intrinsics, the mechanism of mma.py.

Why: on sm_90 the FP8 ``mma.sync`` of mma.py is not native (ptxas converts every operand to f16
first), which holds tc_gemm.py at ~0.18x cuBLASLt. ``wgmma`` is Hopper's native FP8 tensor-core
instruction, the one CUTLASS's and DeepGEMM's Hopper kernels issue. It exists only for the arch-specific
target ``sm_90a`` (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"), so kernels
using it compile with ``compile_kernel(..., arch="a")`` and run on compute capability 9.0 only.

The instruction, for one warpgroup (four consecutive warps, 128 threads, all executing it):
``wgmma.mma_async.sync.aligned.m64n{N}k32.f32.e4m3.e4m3 {d}, desc_a, desc_b, p, 1, 1`` computes
D[64, N] = A[64, 32] B[32, N] (+ D when the predicate p is true) in float32; A is 64 rows of 32
codes (K-major), B is N rows of 32 codes (K-major: a row of nn.Linear's weight), both in shared
memory. D lives in registers, N / 2 floats a thread: thread 32 w + 4 g + t holds, for each n8 block
j, d[4 j], d[4 j + 1] at row 16 w + g, columns 8 j + 2 t, 8 j + 2 t + 1, and d[4 j + 2], d[4 j + 3]
at row 16 w + g + 8 (mma.py's C layout, repeated per n8 block).

Shared-memory layout (the 128-byte swizzle, ``layout_type`` 1): a tile is rows of 128 codes, one
128-byte row each; 16-byte chunk c of row r is stored at chunk position c ^ (r % 8), and the tile
starts on a 1024-byte boundary (the swizzle is a function of the address bits, so the pattern must
start there). A descriptor holds the start address >> 4 (bits 0-13), the leading byte offset >> 4
(bits 16-29; unused by swizzled K-major layouts: 0), the stride byte offset >> 4 (bits 32-45: 1024,
the distance between groups of 8 rows) and the layout type (bits 62-63). The k32 slice kk of a
128-code row is the same descriptor with its start advanced by 32 kk bytes: the hardware applies the
swizzle to the address it computes. These are DeepGEMM's choices (``make_smem_desc(ptr, 1, 0, 1024)``
in its mma_utils.cuh) with TMA's SWIZZLE_128B tile layout, written here by ``cp.async``.

Ordering (PTX ISA): ``wgmma.fence`` before the first wgmma of a batch (registers written by other
instructions); ``wgmma.commit_group`` closes the batch; ``wgmma.wait_group n`` waits until at most n
batches are pending. The accumulator registers must not be touched between the wgmma and the wait:
``wait_group`` here also passes the accumulator through the asm statement (DeepGEMM's
``warpgroup_fence_operand``), so no use of it can be scheduled above the wait. Data written by
``cp.async`` (the generic proxy) reaches wgmma (the async proxy) only after the writing thread's
``fence.proxy.async.shared::cta`` and a barrier.

Also here: mbarriers (the warp-specialized kernel's hand-over of ring slots), ``hold`` and ``stash``
(which keep a kernel's accumulators in registers, see their docstrings) and a paired global store.

There is no simulator emulation: the kernels using these run on an sm_90 GPU only (kernels/sm90_wgmma_gemm.py).
"""

from .target import SIMULATOR, intrinsic, lowering, mlir_asm, mlir_cast, mlir_codegen, mlir_type, types

MIN_CC = (9, 0)  # sm_90a: arch-specific, so exactly 9.0 (not 10.x, not 12.x)
ARCH = "a"  # compile_kernel(..., arch=ARCH)
SWIZZLE_128B = 1  # the descriptor's layout type
SWIZZLE_ATOM_BYTES = 1024  # 8 rows of 128 bytes: a tile starts on this boundary
ROW_BYTES = 128  # codes per row of a tile (the K depth of one stage)
K_STEP = 32  # codes per wgmma


DESCRIPTOR_ADDRESS_MASK = 0x3FFF  # bits 0-13: the start address >> 4


def descriptor_base(address):
    """The 64-bit descriptor of a 128-byte-swizzled K-major tile at shared ``address`` (bytes; a
    multiple of 1024), as a Python int; add ``offset >> 4`` for a tile or k slice ``offset`` bytes on.
    ``descriptor_base(0)`` holds the constant fields a kernel ORs with the address it computes."""
    return ((address >> 4) & DESCRIPTOR_ADDRESS_MASK) | ((SWIZZLE_ATOM_BYTES >> 4) << 32) | (SWIZZLE_128B << 62)


def available(cc):
    """Whether wgmma runs on compute capability ``cc`` (a real GPU, never the simulator)."""
    return not SIMULATOR and tuple(cc) == MIN_CC


if not SIMULATOR and intrinsic is not None:
    from llvmlite import ir

    from .mma import _mlir_lane, _mlir_llvm, _mlir_shared_pointer, _mlir_void_asm, _shared_address

    _i32, _i64, _f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

    # numba-cuda-mlir: a local array is a memref; its elements are read and written at constant
    # indices (memref.load / memref.store), which MLIR's mem2reg keeps in registers as LLVM does
    def _mlir_index(i):
        from numba_cuda_mlir.lowering_utilities import index_of

        return index_of(i)

    def _mlir_cells(acc, regs):
        from numba_cuda_mlir._mlir.dialects import memref

        return [memref.load(acc, [_mlir_index(i)]) for i in range(regs)]

    def _mlir_store_cells(acc, values):
        from numba_cuda_mlir._mlir.dialects import memref

        for i, v in enumerate(values):
            memref.store(v, acc, [_mlir_index(i)])

    def _mlir_call_through(acc, regs, text, constraints, extra=()):
        """_call_through's MLIR twin: acc's ``regs`` floats tied through the asm, stored back."""
        results = mlir_asm(text, constraints, _mlir_cells(acc, regs) + list(extra), "f" * regs, side_effect=True)
        _mlir_store_cells(acc, results)

    def _void_asm(text):
        @intrinsic
        def op(typingctx):
            def codegen(context, builder, signature, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return types.void(), lowering(codegen, _mlir_void_asm(text))

        return op

    fence = _void_asm("wgmma.fence.sync.aligned;")
    commit = _void_asm("wgmma.commit_group.sync.aligned;")
    fence_proxy_async = _void_asm("fence.proxy.async.shared::cta;")

    @intrinsic
    def shared_address(typingctx, smem, word):
        """The 32-bit shared-window address (bytes) of word ``word`` of a shared array."""
        sig = types.uint32(smem, word)

        def codegen(context, builder, signature, args):
            addr, _ = _shared_address(context, builder, signature.args[0], args[0], args[1], signature.args[1])
            return addr

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            return _mlir_shared_pointer(lower, values, argtypes)[0]

        return sig, lowering(codegen, mlir)

    def _registers(builder, arr_ptr, first, count):
        return [builder.gep(arr_ptr, [ir.Constant(_i64, first + i)]) for i in range(count)]

    def _local_data(context, builder, arrty, arr):
        return context.make_array(arrty)(context, builder, arr).data

    def _call_through(context, builder, arrty, arr, regs, text, constraints, extra=(), extra_types=()):
        """Call the asm ``text`` with the ``regs`` floats of local array ``arr`` as tied in/out
        operands (then the ``extra`` values), and store its results back into the array."""
        cells = _registers(builder, _local_data(context, builder, arrty, arr), 0, regs)
        fnty = ir.FunctionType(ir.LiteralStructType([_f32] * regs), [_f32] * regs + list(extra_types))
        res = builder.call(
            ir.InlineAsm(fnty, text, constraints, side_effect=True), [builder.load(c) for c in cells] + list(extra)
        )
        for i, c in enumerate(cells):
            builder.store(builder.extract_value(res, i), c)

    _MMAS = {}

    def mma_e4m3(n):
        """The intrinsic ``mma(acc, desc_a, desc_b, accumulate)``: one m64n{n}k32 e4m3 wgmma into
        the float32 local array ``acc`` (n / 2 elements, indices known at compile time: they stay
        registers); ``accumulate`` false (0) computes D = A B, true adds A B to acc."""
        if n % 8 or not 8 <= n <= 256:
            raise ValueError(f"wgmma e4m3 needs N a multiple of 8 in [8, 256], got {n}")
        if n not in _MMAS:
            regs = n // 2
            outs = ", ".join(f"${i}" for i in range(regs))
            text = (
                "{ .reg .pred p; setp.ne.b32 p, $%d, 0; "
                "wgmma.mma_async.sync.aligned.m64n%dk32.f32.e4m3.e4m3 {%s}, $%d, $%d, p, 1, 1; }"
                % (2 * regs + 2, n, outs, 2 * regs, 2 * regs + 1)
            )
            constraints = ",".join(["=f"] * regs + [str(i) for i in range(regs)] + ["l", "l", "r"])

            @intrinsic
            def mma(typingctx, acc, desc_a, desc_b, accumulate):
                sig = types.void(acc, desc_a, desc_b, accumulate)

                def codegen(context, builder, signature, args):
                    tys = signature.args
                    extra = [
                        context.cast(builder, args[1], tys[1], types.uint64),
                        context.cast(builder, args[2], tys[2], types.uint64),
                        context.cast(builder, args[3], tys[3], types.int32),
                    ]
                    _call_through(context, builder, tys[0], args[0], regs, text, constraints, extra, [_i64, _i64, _i32])
                    return context.get_dummy_value()

                @mlir_codegen
                def mlir(lower, values, argtypes, restype):
                    kinds = (types.uint64, types.uint64, types.int32)
                    extra = [mlir_cast(lower, v, t, k) for v, t, k in zip(values[1:], argtypes[1:], kinds)]
                    _mlir_call_through(values[0], regs, text, constraints, extra)

                return sig, lowering(codegen, mlir)

            _MMAS[n] = mma
        return _MMAS[n]

    _PASS_THROUGH = {}

    def _pass_through(text, regs):
        """The intrinsic ``op(acc)``: the asm statement ``text``, with the ``regs`` floats of the local
        array ``acc`` passed through it (tied operands), so no use of them moves across it."""
        key = (text, regs)
        if key not in _PASS_THROUGH:
            constraints = ",".join(["=f"] * regs + [str(i) for i in range(regs)] + ["~{memory}"])

            @intrinsic
            def op(typingctx, acc):
                sig = types.void(acc)

                def codegen(context, builder, signature, args):
                    _call_through(context, builder, signature.args[0], args[0], regs, text, constraints)
                    return context.get_dummy_value()

                @mlir_codegen
                def mlir(lower, values, argtypes, restype):
                    _mlir_call_through(values[0], regs, text, constraints)

                return sig, lowering(codegen, mlir)

            _PASS_THROUGH[key] = op
        return _PASS_THROUGH[key]

    def wait(pending, regs):
        """The intrinsic ``wait(acc)``: ``wgmma.wait_group pending``, with the ``regs`` floats of the
        local array ``acc`` passed through the statement, so they are read only after it."""
        return _pass_through(f"wgmma.wait_group.sync.aligned {int(pending)};", regs)

    @intrinsic
    def store_global_pair(typingctx, address, lo, hi):
        """One 8-byte (two float32) or 4-byte (two uint16) store of (lo, hi) at global ``address``
        (int64, aligned to the pair), lo at the lower address: an epilogue writes two adjacent
        columns of y with one instruction instead of two."""
        if lo != hi or lo not in (types.float32, types.uint16):
            return None
        sig = types.void(address, lo, hi)

        def codegen(context, builder, signature, args):
            tys = signature.args
            elem = _f32 if tys[1] == types.float32 else ir.IntType(16)
            vec_ty = ir.VectorType(elem, 2)
            vec = ir.Constant(vec_ty, ir.Undefined)
            vec = builder.insert_element(vec, args[1], ir.Constant(_i32, 0))
            vec = builder.insert_element(vec, args[2], ir.Constant(_i32, 1))
            addr = context.cast(builder, args[0], tys[0], types.int64)
            ptr = builder.inttoptr(addr, vec_ty.as_pointer(1))
            builder.store(vec, ptr, align=8 if tys[1] == types.float32 else 4)
            return context.get_dummy_value()

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            llvm = _mlir_llvm()
            vec = llvm.mlir_undef(mlir_type("vector<2xf32>" if argtypes[1] == types.float32 else "vector<2xi16>"))
            vec = llvm.insertelement(vec, values[1], _mlir_lane(0))
            vec = llvm.insertelement(vec, values[2], _mlir_lane(1))
            addr = mlir_cast(lower, values[0], argtypes[0], types.int64)
            ptr = llvm.inttoptr(llvm.PointerType.get(1), addr)
            llvm.store(vec, ptr, alignment=8 if argtypes[1] == types.float32 else 4)

        return sig, lowering(codegen, mlir)

    def _mlir_on_shared_word(text, constraints, returns=False):
        """_on_shared_word's MLIR twin: the codegen calling ``text`` on the shared address of word
        values[1] of the shared array values[0] and the other arguments as 32-bit operands."""

        @mlir_codegen
        def mlir(lower, values, argtypes, restype):
            addr, _ = _mlir_shared_pointer(lower, values, argtypes)
            ins = [addr] + [mlir_cast(lower, v, t, types.uint32) for v, t in zip(values[2:], argtypes[2:])]
            out = mlir_asm(text, constraints, ins, "r" if returns else "", side_effect=True)
            return out[0] if returns else None

        return mlir

    def _on_shared_word(context, builder, signature, args, text, constraints, returns=False):
        """Call the asm ``text`` on the shared address of word args[1] of the shared array args[0]
        ($0, or $1 after a 32-bit result) and the other arguments as 32-bit operands."""
        tys = signature.args
        addr, _ = _shared_address(context, builder, tys[0], args[0], args[1], tys[1])
        ins = [addr] + [context.cast(builder, v, t, types.uint32) for v, t in zip(args[2:], tys[2:])]
        fnty = ir.FunctionType(_i32 if returns else ir.VoidType(), [_i32] * len(ins))
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), ins)

    # mbarriers (PTX ISA "Parallel Synchronization and Communication Instructions: mbarrier"), 8 bytes
    # of shared memory each at an 8-byte aligned word: init with the arrival count a phase needs; a
    # thread arrives; a waiter polls try_wait.parity with the parity of the phase it waits for
    # (0 for the first completion, then 1, 0, ...), which gives 1 once that phase has completed.
    @intrinsic
    def mbarrier_init(typingctx, smem, word, count):
        def codegen(context, builder, signature, args):
            _on_shared_word(
                context, builder, signature, args, "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}"
            )
            return context.get_dummy_value()

        mlir = _mlir_on_shared_word("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}")
        return types.void(smem, word, count), lowering(codegen, mlir)

    @intrinsic
    def mbarrier_arrive(typingctx, smem, word):
        def codegen(context, builder, signature, args):
            _on_shared_word(
                context,
                builder,
                signature,
                args,
                "{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [$0]; }",
                "r,~{memory}",
            )
            return context.get_dummy_value()

        mlir = _mlir_on_shared_word("{ .reg .b64 state; mbarrier.arrive.shared::cta.b64 state, [$0]; }", "r,~{memory}")
        return types.void(smem, word), lowering(codegen, mlir)

    @intrinsic
    def mbarrier_try_wait(typingctx, smem, word, parity):
        def codegen(context, builder, signature, args):
            return _on_shared_word(
                context,
                builder,
                signature,
                args,
                "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; "
                "selp.u32 $0, 1, 0, done; }",
                "=r,r,r,~{memory}",
                returns=True,
            )

        mlir = _mlir_on_shared_word(
            "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [$1], $2; selp.u32 $0, 1, 0, done; }",
            "=r,r,r,~{memory}",
            returns=True,
        )
        return types.uint32(smem, word, parity), lowering(codegen, mlir)

    # thread block clusters (PTX ISA "Cluster"; sm_90): a kernel whose PTX declares
    # ``.reqnctapercluster`` (launch.Kernel's ``cluster`` option) runs its blocks in groups that
    # share their shared memory. ``cluster_sync``: every thread of every block of the cluster
    # arrives (release: its shared-memory writes are visible to the others) and waits (acquire).
    # ``cluster_load``: word ``word`` of shared array ``smem`` as it is in block ``rank`` of the
    # cluster (mapa gives the peer's address in the cluster's shared window).
    cluster_sync = _void_asm("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;")
    _CLUSTER_LOAD = "{ .reg .b32 peer; mapa.shared::cluster.u32 peer, $1, $2; ld.shared::cluster.u32 $0, [peer]; }"

    @intrinsic
    def cluster_load(typingctx, smem, word, rank):
        def codegen(context, builder, signature, args):
            return _on_shared_word(context, builder, signature, args, _CLUSTER_LOAD, "=r,r,r,~{memory}", returns=True)

        mlir = _mlir_on_shared_word(_CLUSTER_LOAD, "=r,r,r,~{memory}", returns=True)
        return types.uint32(smem, word, rank), lowering(codegen, mlir)

    _STASHES = {}

    def stash(regs):
        """The intrinsic ``stash(acc, out, base, stride)``: ``out[base + i * stride] = acc[i]`` for the
        ``regs`` floats of the local array ``acc``, each at an index known at compile time. A kernel's
        epilogue indexing ``acc`` at run time would make LLVM keep it in local memory, and on the H200
        that stored the whole array every K block (16 STL.128 in the main loop of the block-scaled
        kernel, 2.7x its time); through ``out`` (shared memory) it stays in registers."""
        if regs not in _STASHES:

            @intrinsic
            def stash_op(typingctx, acc, out, base, stride):
                sig = types.void(acc, out, base, stride)

                def codegen(context, builder, signature, args):
                    tys = signature.args
                    cells = _registers(builder, _local_data(context, builder, tys[0], args[0]), 0, regs)
                    dst = _local_data(context, builder, tys[1], args[1])
                    base_v = context.cast(builder, args[2], tys[2], types.int64)
                    stride_v = context.cast(builder, args[3], tys[3], types.int64)
                    for i, c in enumerate(cells):
                        index = builder.add(base_v, builder.mul(stride_v, ir.Constant(_i64, i)))
                        builder.store(builder.load(c), builder.gep(dst, [index]))
                    return context.get_dummy_value()

                @mlir_codegen
                def mlir(lower, values, argtypes, restype):
                    from numba_cuda_mlir._mlir.dialects import arith, memref

                    base_v, stride_v = (mlir_cast(lower, v, t, types.int64) for v, t in zip(values[2:], argtypes[2:]))
                    for i, v in enumerate(_mlir_cells(values[0], regs)):
                        index = arith.index_cast(mlir_type("index"), base_v + stride_v * i)
                        memref.store(v, values[1], [index])

                return sig, lowering(codegen, mlir)

            _STASHES[regs] = stash_op
        return _STASHES[regs]

    def hold(regs):
        """The intrinsic ``hold(acc)``: an empty statement the ``regs`` floats of ``acc`` pass through
        (DeepGEMM's ``warpgroup_fence_operand``). After a promotion it pins the float32 adds before
        the next wgmma: LLVM otherwise sinks them past it, keeping the partial alive while the tensor
        core rewrites it, and ptxas then serializes every wgmma (its advisory C7514)."""
        return _pass_through("", regs)


__all__ = [
    "MIN_CC",
    "ARCH",
    "SWIZZLE_128B",
    "SWIZZLE_ATOM_BYTES",
    "ROW_BYTES",
    "K_STEP",
    "DESCRIPTOR_ADDRESS_MASK",
    "descriptor_base",
    "available",
    "fence",
    "commit",
    "fence_proxy_async",
    "shared_address",
    "mma_e4m3",
    "wait",
    "hold",
    "stash",
    "store_global_pair",
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_try_wait",
    "cluster_sync",
    "cluster_load",
]
