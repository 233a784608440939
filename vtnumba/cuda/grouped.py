"""The GPU grouped GEMM of the mixture-of-experts layer: ``grouped_scaled_mm`` runs, for each
expert e, rows offsets[e]:offsets[e + 1] of ``a`` against the expert's weight ``b[e]`` (the
signature of ``vtnumba/cpu/experts.py``'s, whose results are the reference; cupy in, cupy out,
numpy under the CUDA simulator). ``cuda/experts.py``'s MoE steps and ``vtnumba.seam.experts`` call it.

The first kernel of ``KERNELS`` that can run the call runs (``registry.choose``: each says why not;
"nothing fits" lists every reason), or the one named by ``kernel=``:

``wgmma_grouped_gemv``       decode on sm_90: the grouped GEMV on the swapped wgmma pass
                             (kernels/tc_gemv.py's ``grouped_wgmma_launch``), the codes read
                             natively; the tensor-core bound, so only where the lever lets
                             cuBLASLt run; the rows of the GEMV below
``tensorcore_grouped_gemv``  the tensor-core grouped GEMV of ``kernels/tc_gemv.py``
                             (``grouped_gemv_launch``; it says why not in ``grouped_gemv_reason``):
                             float32 scales, decode row counts (up to ``TILED_MIN_ROWS`` rows
                             per expert on average, or any where no tiled kernel can run)
``per_expert``               large prefill: ONE device-to-host read of ``offsets`` (a
                             synchronization), then ``vt.scaled_mm`` of each expert's rows
                             (cuBLASLt where it takes them), written into the output. Only where
                             the call has ``PER_EXPERT_MIN_FLOPS`` per expert on average,
                             never while the stream is being captured into a CUDA graph
``wgmma_grouped_gemm``       prefill on sm_90: the grouped wgmma GEMM (kernels/sm90_wgmma_gemm.py),
                             a tile map (kernels/moe.py's ``row_tiles``) then one launch; the
                             tensor-core bound, so only where the lever lets cuBLASLt run
``tensorcore_grouped_gemm``  prefill elsewhere (sm_89, sm_12x) or with the lever off: the grouped
                             tiled ``mma.sync`` GEMM (kernels/tc_gemm.py), strict G3, MXFP8 too
``grouped``                  the CUDA-core grouped kernel (kernels/grouped_gemm.py): the
                             expert's rows counted on the device, one launch, exact (G3)
``grouped_general``          the same on any K, block size and alignment, slower

``grouped_kernel_for(...)`` names the kernel a call would run; ``VT_DISABLE_KERNELS`` (read at
every call) takes kernels out by name, as for ``scaled_mm``. Arrays and launches go through
``steps.py`` (so a bound MoE call records them); nothing here synchronizes but ``per_expert``.
"""

import numpy as np

from .. import _config
from . import steps
from .ptx.target import SIMULATOR
from .registry import choose

# From this many FLOPs per expert on average (2 (P / E) N K, known on the host) the per-expert path
# runs: cuBLASLt expert by expert costs ~80 us of host time an expert (the validating scaled_mm and
# the read-back: 6.1-10.9 ms for 128 experts on the H200, 2026-12-01, benchmarks/gpu/bench_grouped_tc.py
# --kernels, at 64-512 rows an expert, where the grouped wgmma GEMM took 0.24-1.05 ms), and runs each
# GEMM about twice as fast as the grouped wgmma tiles (0.5x cuBLASLt at 4096^3). That pays from
# ~80 us x 1.37 PFLOP/s ~ 1e11 FLOPs an expert: Mixtral's 28672 x 4096 experts from ~450 rows each,
# Qwen3-30B-A3B's 1536 x 2048 from ~16,000 (an estimate past the measured 512 rows).
PER_EXPERT_MIN_FLOPS = 1e11
# Past this many rows per expert on average the grouped tiled GEMMs take the call from the grouped
# GEMV, which streams each expert's weight once per 16 rows. On the H200 (same run, Qwen3-30B-A3B's
# gate_up, 128 experts): 16 rows each, wgmma tiles 252 us against the GEMV's 317; the tiles cost
# about as much with fewer rows (260 us at 64: a tile's weight is streamed whatever its rows), and
# at 8 rows the GEMV took 171 us (benchmarks/RESULTS.md, 10:57). The wgmma grouped GEMV (sm_90), which
# streams the weight once per 8 rows, keeps the same line: on an H100 (2026-12-07 21:11) it won up to 8
# rows in gate_up and down (148 / 80 us against the tiles' 182 / 138), and at 16 lost gate_up (276
# against 190) while still winning down (102 against 146), a K = 768 case a rule by K could take.
TILED_MIN_ROWS = 8


class GroupedCall:
    """One grouped_scaled_mm call, normalized once for every kernel's reason / run.

    ``a`` [P, K] codes, ``b`` [E, N, K] (``b2d``: the [E * N, K] view), ``offsets`` int32 [E + 1],
    ``p, n, k, e``; the scales flat: ``sa`` read at ``row * sa_row + kb * sa_kb``, ``sb`` at
    ``e * sb_e + (n // block_n) * sb_nb + kb * sb_kb``, float32 or E8M0 bytes (``sa_e8m0``,
    ``sb_e8m0``); ``blocked`` with K-blocks of ``block_k`` (else one K-block, ``block_k`` = K);
    ``scale_a`` / ``scale_b`` as given but float32 (or uint8) and contiguous; ``block_size`` as given;
    ``out_dtype``; ``device``."""

    __slots__ = (
        "a",
        "b",
        "b2d",
        "offsets",
        "p",
        "n",
        "k",
        "e",
        "sa",
        "sa_e8m0",
        "sa_row",
        "sa_kb",
        "sb",
        "sb_e8m0",
        "sb_e",
        "sb_nb",
        "sb_kb",
        "blocked",
        "block_n",
        "block_k",
        "block_size",
        "scale_a",
        "scale_b",
        "out_dtype",
        "device",
    )

    def __init__(self, a, scale_a, b, scale_b, offsets, out_dtype, block_size):
        self.device = steps.device.current()
        self.a = a = steps.array(a)
        self.b = b = steps.array(b)
        self.p, self.k = (int(d) for d in a.shape)
        self.e, self.n = int(b.shape[0]), int(b.shape[1])
        self.b2d = b.reshape(self.e * self.n, self.k)
        self.offsets = steps.array(offsets)
        self.out_dtype = np.dtype(out_dtype)
        self.block_size = None if block_size is None else tuple(int(v) for v in block_size)
        self.blocked = block_size is not None
        self.block_n, self.block_k = self.block_size if self.blocked else (1, self.k)
        sa = steps.array(scale_a)
        sb = steps.array(scale_b)
        self.sa_e8m0 = np.dtype(sa.dtype) == np.uint8
        if not self.sa_e8m0 and np.dtype(sa.dtype) != np.float32:
            sa = sa.astype(np.float32)
        if sa.ndim == 2 and sa.shape[1] > 1:
            self.sa_row, self.sa_kb = int(sa.shape[1]), 1
        else:
            self.sa_row, self.sa_kb = (0 if sa.size == 1 else 1), 0
        self.sa = sa.reshape(-1)
        self.sb_e8m0 = np.dtype(sb.dtype) == np.uint8
        if not self.sb_e8m0 and np.dtype(sb.dtype) != np.float32:
            sb = sb.astype(np.float32)
        self.scale_a, self.scale_b = sa, sb
        if sb.ndim == 3:
            self.sb_e, self.sb_nb, self.sb_kb = int(sb.shape[1] * sb.shape[2]), int(sb.shape[2]), 1
        elif sb.ndim == 2:
            self.sb_e, self.sb_nb, self.sb_kb = int(sb.shape[1]), 1, 0
            self.block_n = 1
        else:
            self.sb_e, self.sb_nb, self.sb_kb = 1, 0, 0
        self.sb = sb.reshape(-1)


def _capturing():
    """Whether cupy's current stream is being captured into a CUDA graph (a failed query counts as
    capturing: the per-expert path's read-back must never run inside a capture)."""
    if SIMULATOR:
        return False
    cupy = steps.device.xp
    try:
        return cupy.cuda.runtime.streamIsCapturing(cupy.cuda.get_current_stream().ptr) != 0
    except Exception:  # e.g. the legacy stream queried while another stream captures globally
        return True


class GroupedKernel:
    """What every grouped kernel is (registry.py's protocol): ``name``, ``reason(call, named)`` -> None
    when it can run ``call``, else why not (``named``: asked for by name, so no size heuristic
    applies), and ``run(call, y, active)``."""

    name = ""

    def reason(self, call, named):
        raise NotImplementedError

    def can_implement(self, call, named=False):
        why = self.reason(call, named)
        return why is None, why or ""


class TensorCoreGroupedGemv(GroupedKernel):
    """The tensor-core grouped GEMV (``kernels/tc_gemv.py``'s ``grouped_gemv_launch``, another
    engineer's): float32 scales, per-tensor / per-row / per-channel or 128 x 128 blocks, its own
    reasons (``grouped_gemv_reason``) for the rest. It leaves the padding rows as y held them, so y
    is zeroed first (one memset on the stream). A call large enough for ``per_expert`` goes there
    instead: past ``tc_gemv.grouped_rows_hint`` rows an expert re-reads its weight every pass."""

    name = "tensorcore_grouped_gemv"

    def reason(self, call, named):
        from .kernels import tc_gemv

        if getattr(tc_gemv, "grouped_gemv_launch", None) is None:
            return "kernels/tc_gemv.py has no grouped_gemv_launch (the tensor-core grouped GEMV)"
        why = tc_gemv.grouped_gemv_reason(call.a, call.scale_a, call.b, call.scale_b, call.block_size, call.device)
        if why is None and not named and call.p > TILED_MIN_ROWS * call.e:
            disabled = _config.disabled_kernels()
            tiled = next((k.name for k in _TILED if k.name not in disabled and k.reason(call, False) is None), None)
            if tiled is not None:
                why = (
                    f"a prefill-sized call ({call.p} rows over {call.e} experts): {tiled} takes it, past "
                    f"{TILED_MIN_ROWS} rows per expert on average"
                )
        return why

    def run(self, call, y, active):
        from .kernels import tc_gemv

        y_bits = steps.epilogue.out_bits(y)  # (the map's last grid row writes the padding rows as 0)
        # at most 8 rows per expert on average (decode: T <= 8 tokens of top-k): the 8-row passes, which
        # ran 171 against 236 us at 8 rows over 128 experts (H200); an expert with more takes more passes
        hint = 8 if call.p <= 8 * call.e else None
        steps.run(
            tc_gemv.grouped_gemv_launch(
                call.a,
                call.scale_a,
                call.b,
                call.scale_b,
                call.offsets,
                y_bits,
                call.out_dtype,
                call.block_size,
                call.device,
                rows_hint=hint,
                active=active,
            )
        )


class WgmmaGroupedGemv(GroupedKernel):
    """The grouped GEMV on the swapped wgmma pass (``kernels/tc_gemv.py``'s ``grouped_wgmma_launch``,
    sm_90): the decode rows of the grouped mma.sync GEMV (float32 scales, per-tensor / per-row /
    per-channel or 128 x 128 blocks) with the e4m3 codes read natively. It holds the tensor-core bound,
    so it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run; up to ``TILED_MIN_ROWS`` rows
    per expert on average, as the GEMV it stands before."""

    name = "wgmma_grouped_gemv"

    def reason(self, call, named):
        from .kernels import tc_gemv

        why = tc_gemv.grouped_wgmma_reason(call.a, call.scale_a, call.b, call.scale_b, call.block_size, call.device)
        if why is None and not named:
            if not _config.dense_cublaslt_fp8_enabled():
                why = "it holds the tensor-core bound, not strict G3: turned off with cuBLASLt by the lever VT_DENSE_CUBLASLT_FP8"
            elif call.p > TILED_MIN_ROWS * call.e:
                why = (
                    f"a prefill-sized call ({call.p} rows over {call.e} experts): the tiles take it, past "
                    f"{TILED_MIN_ROWS} rows per expert on average"
                )
        return why

    def run(self, call, y, active):
        from .kernels import tc_gemv

        launch = tc_gemv.grouped_wgmma_launch(
            call.a,
            call.scale_a,
            call.b,
            call.scale_b,
            call.offsets,
            steps.epilogue.out_bits(y),  # (the map's last grid row writes the padding rows as 0)
            call.out_dtype,
            call.block_size,
            call.device,
            active=active,
        )
        steps.run(launch[:4])  # (the kernel carries its shared bytes)


class PerExpert(GroupedKernel):
    """Large prefill: the offsets read back once (a synchronization), then ``vt.scaled_mm`` (or the
    block-scaled GEMM) of each expert's rows, written into y; padding rows 0."""

    name = "per_expert"

    def reason(self, call, named):
        if _capturing():
            return "the stream is being captured into a CUDA graph: the per-expert path reads offsets on the host"
        if call.blocked and call.scale_a.ndim != 2:
            return "the per-expert path takes group activation scales [P, KB] with block-scaled weights"
        if named:
            return None
        if SIMULATOR:
            return "the per-expert path is for cuBLASLt, which needs a real GPU (running under the CUDA simulator)"
        if not _config.dense_cublaslt_fp8_enabled():
            return "turned off by the lever VT_DENSE_CUBLASLT_FP8 (its point is cuBLASLt)"
        flops = 2.0 * call.p / max(call.e, 1) * call.n * call.k
        if flops < PER_EXPERT_MIN_FLOPS:
            return (
                f"its host cost per expert pays from {PER_EXPERT_MIN_FLOPS:.0e} FLOPs an expert on average, got "
                f"{flops:.2e} (P = {call.p} rows over E = {call.e} experts of [{call.n}, {call.k}])"
            )
        return None

    def run(self, call, y, active):
        if steps.active_recording() is not None:
            raise steps.Unbindable("per_expert reads the offsets back on the host (a prefill-sized call)")
        offs = np.asarray(call.offsets) if SIMULATOR else steps.device.xp.asnumpy(call.offsets)  # the one read-back
        per_row_a = call.sa_row != 0
        bits = steps.epilogue.out_bits(y)  # copies as float32 or 16-bit words: cupy has no bfloat16 arithmetic
        for e in range(call.e):
            lo, hi = int(offs[e]), int(offs[e + 1])
            if hi <= lo:
                continue
            sa = _aligned_copy(call.scale_a[lo:hi]) if per_row_a else call.scale_a
            if call.blocked:
                part = steps.block.block_scaled_mm(
                    call.a[lo:hi],
                    call.b[e],
                    sa,
                    _aligned_copy(call.scale_b[e]),
                    call.block_size,
                    call.out_dtype,
                    None,
                    None,
                )
            else:
                sb = call.scale_b[e] if call.scale_b.ndim == 2 else call.scale_b[e : e + 1]
                part = steps.gemm.scaled_mm(call.a[lo:hi], call.b[e], sa, _aligned_copy(sb), call.out_dtype, None, None)
            bits[lo:hi] = steps.epilogue.out_bits(part)
        bits[max(0, int(offs[call.e])) :] = 0


def _aligned_copy(view):
    """``view``, or a copy of it where its address is not 16-byte aligned: cuBLASLt refused an expert's
    per-tensor scale read in place from the [E] array (CUBLAS_STATUS_NOT_SUPPORTED on the H200 for
    expert e at a 4 e byte offset), and so may any scale vector it reads through a pointer."""
    if SIMULATOR or view.data.ptr % 16 == 0:
        return view
    return view.copy()


class _TiledGrouped(GroupedKernel):
    """A grouped tiled tensor-core GEMM: a tile map (kernels/moe.py's ``row_tiles``, the counts read
    on the device) and one launch over it, each block one expert's tile of rows."""

    @staticmethod
    def decode_sized(call):
        """Why a call is the GEMV's rather than the tiles' (None past ``TILED_MIN_ROWS`` an expert)."""
        if call.p <= TILED_MIN_ROWS * call.e:
            return (
                f"a decode-sized call ({call.p} rows over {call.e} experts): the grouped GEMV's, up to "
                f"{TILED_MIN_ROWS} rows per expert on average"
            )
        return None

    def run(self, call, y, active):
        rows = self.tile_rows(call)
        tiles = steps.new((steps.moe.row_tile_count(call.p, call.e, rows), 3), np.int32)
        steps.run(steps.moe.row_tiles_launch(call.offsets, call.e, call.p, rows, tiles))
        steps.run(self.launch(call, steps.epilogue.out_bits(y), tiles))


class WgmmaGrouped(_TiledGrouped):
    """The grouped wgmma GEMM (kernels/sm90_wgmma_gemm.py, sm_90): Hopper's native FP8 tensor-core
    instruction, promotion per 128 of K -- the tensor-core bound cuBLASLt holds, not DESIGN.md's strict
    G3 -- so it runs where the lever VT_DENSE_CUBLASLT_FP8 lets cuBLASLt run (the contract of the fast
    path), from ``TILED_MIN_ROWS`` rows per expert on average."""

    name = "wgmma_grouped_gemm"

    def reason(self, call, named):
        from .kernels import sm90_wgmma_gemm

        why = sm90_wgmma_gemm.grouped_reason(call)
        if why is None and not named:
            if not _config.dense_cublaslt_fp8_enabled():
                why = "it holds the tensor-core bound, not strict G3: turned off with cuBLASLt by the lever VT_DENSE_CUBLASLT_FP8"
            else:
                why = self.decode_sized(call)
        return why

    def tile_rows(self, call):
        from .kernels import sm90_wgmma_gemm

        return sm90_wgmma_gemm.block_rows(sm90_wgmma_gemm.grouped_config(call))

    def launch(self, call, y_bits, tiles):
        from .kernels import sm90_wgmma_gemm

        return sm90_wgmma_gemm.grouped_gemm_launch(call, y_bits, tiles)


class TensorCoreGroupedGemm(_TiledGrouped):
    """The grouped tiled GEMM on ``mma.sync`` (kernels/tc_gemm.py): strict G3 (promotion per mma), any
    GPU with FP8 mma (sm_89, sm_90, sm_12x), float32 scales or MXFP8, from ``TILED_MIN_ROWS`` rows per
    expert on average."""

    name = "tensorcore_grouped_gemm"

    def reason(self, call, named):
        from .kernels import tc_gemm

        why = tc_gemm.unavailable_reason(call.device, simulate=named) or tc_gemm.grouped_shape_reason(call)
        if why is None:
            scales = tc_gemm.grouped_scales(call)
            why = scales if isinstance(scales, str) else None
        if why is None and not named:
            why = self.decode_sized(call)
        return why

    def tile_rows(self, call):
        from .kernels import tc_gemm

        return tc_gemm.grouped_tile_rows(call)

    def launch(self, call, y_bits, tiles):
        from .kernels import tc_gemm

        return tc_gemm.grouped_gemm_launch(call, y_bits, tiles)


class GroupedCudaCore(GroupedKernel):
    """The CUDA-core grouped kernel (kernels/grouped_gemm.py's ``grouped_kernel``)."""

    name = "grouped"

    def reason(self, call, named):
        return steps.grouped_gemm.grouped_reason(call)

    def run(self, call, y, active):
        steps.run(
            steps.grouped_gemm.grouped_launch(
                call, steps.epilogue.out_bits(y), steps.epilogue.OUT_KIND[call.out_dtype], active
            )
        )


class GroupedGeneral(GroupedKernel):
    """The general CUDA-core grouped kernel: any K, block size and alignment."""

    name = "grouped_general"

    def reason(self, call, named):
        return None

    def run(self, call, y, active):
        steps.run(
            steps.grouped_gemm.general_launch(
                call, steps.epilogue.out_bits(y), steps.epilogue.OUT_KIND[call.out_dtype], active
            )
        )


def active_map(call):
    """The experts a grouped kernel's grid rows run for ``call`` (``active_experts`` of its offsets)."""
    return active_experts(call.offsets, call.e, call.p)


def active_experts(offsets, num_experts, rows):
    """The experts a grouped kernel's grid rows run, int32 [G + 1] (kernels/moe.py's map): where fewer
    experts can have rows than there are experts (G = P < E: decode), one small launch lists the ones
    that do, so the grid has G rows of blocks instead of E; otherwise every expert in order. Made
    once by a caller whose GEMMs share the offsets (``moe_fp8``'s gate_up and down) and passed to
    each as ``active=``; made from the offsets on the device, so a captured graph remakes it on each
    replay."""
    steps.load()
    from .kernels import tc_gemv

    e, slots = int(num_experts), min(int(num_experts), int(rows))
    if slots >= e:
        return tc_gemv.identity_map(steps.device.current(), e)
    active = steps.new(slots + 1, np.int32)
    steps.run(steps.moe.active_experts_launch(steps.array(offsets), e, active))
    return active


_TILED = (WgmmaGrouped(), TensorCoreGroupedGemm())
# the order they are tried in:
KERNELS = (
    WgmmaGroupedGemv(),  # decode on sm_90: the swapped wgmma pass, codes read natively (kernels/tc_gemv.py)
    TensorCoreGroupedGemv(),  # decode: the tensor-core grouped GEMV (kernels/tc_gemv.py)
    PerExpert(),  # large prefill on cuBLASLt, expert by expert (one read-back)
    *_TILED,  # prefill: tensor-core tiles, one launch, the counts on the device
    GroupedCudaCore(),  # what the tensor-core kernels refuse: one launch, the counts on the device
    GroupedGeneral(),  # what the grouped kernel refuses
)
KERNELS_BY_NAME = {k.name: k for k in KERNELS}


def select(call, kernel=None):
    """The kernel that runs ``call``: the one named ``kernel``, else the first of ``KERNELS`` that
    can; ValueError listing every reason when none can (``registry.choose``)."""
    return choose(call, kernel, KERNELS, KERNELS_BY_NAME, "grouped GEMM")


def grouped_kernel_for(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None, kernel=None):
    """The name of the kernel ``grouped_scaled_mm`` with these arguments runs (nothing is launched)."""
    steps.load()
    return select(GroupedCall(a, scale_a, b, scale_b, offsets, out_dtype, block_size), kernel).name


def grouped_scaled_mm(a, scale_a, b, scale_b, offsets, out_dtype, block_size=None, kernel=None, active=None):
    """y [P, N]: rows offsets[e]:offsets[e + 1] are ``vt.scaled_mm`` of those rows of ``a`` with
    expert e's weight ``b[e]``; padding rows 0 (arguments as the CPU's ``grouped_scaled_mm``, plus
    ``kernel=`` to force one by name, and ``active``: the map ``active_experts`` made for these
    offsets, else one is made here). Only ``per_expert`` synchronizes (module docstring)."""
    steps.load()
    call = GroupedCall(a, scale_a, b, scale_b, offsets, out_dtype, block_size)
    y = steps.new((call.p, call.n), call.out_dtype)
    if call.p == 0 or call.n == 0:
        return y
    chosen = select(call, kernel)
    if active is None and not isinstance(chosen, (PerExpert, _TiledGrouped)):  # the tiles read their own map
        active = active_map(call)
    chosen.run(call, y, active)
    return y


__all__ = [
    "GroupedCall",
    "GroupedKernel",
    "KERNELS",
    "KERNELS_BY_NAME",
    "PER_EXPERT_MIN_FLOPS",
    "TILED_MIN_ROWS",
    "active_experts",
    "active_map",
    "grouped_kernel_for",
    "grouped_scaled_mm",
    "select",
]
