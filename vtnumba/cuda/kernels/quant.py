"""GPU quantization kernels (numba-cuda) and their host-side launchers, per DESIGN.md.

The kernels are the three modes of the CPU's ``vtnumba.cpu.quant`` with the same float32
arithmetic, so the bytes are the CPU's (G2):

- static per-tensor: ``inv = float32(1) / float32(scale)`` (one IEEE division; on the GPU each
  thread forms the same float32 quotient), ``code = encode(float32(x) * inv)``;
- dynamic per-tensor: a first kernel writes one finite-amax partial per block, the quantize kernel's
  blocks each reduce the partials (a few hundred floats) and use
  ``scale = max(amax / 448, 1 / (448 * 512))``; no host round trip, no synchronization;
- dynamic per-token: one block per row reduces the row's finite amax,
  ``scale = max(min(amax, scale_ub) / 448, floor)``, then ``code = encode(x / scale)`` (a divide,
  as upstream's per-token kernel).

Inputs reach the kernels flat (1-D) as float32 or as the uint16 bits of float16 / bfloat16; both
are widened to float32 exactly before any arithmetic. Each thread handles groups of ``GROUP``
elements with 16-byte loads and one 16-byte store of codes; the few elements that do not fill a
group (or all of them, for a buffer that is not 16-byte aligned) go through a scalar loop. Under
the CUDA simulator the 16-byte accesses are emulated element by element (``codec``), so the
simulator runs the same kernel statements.

Kernels never validate (``vtnumba.ops`` does). Host functions here take what the backend
(``vtnumba.cuda``) hands them: flat C-contiguous arrays on the current device.
"""

import functools

import numpy as np

from ... import _format
from ..._format import F32_E4M3_MAX, F32_MIN_SCALE, F32_ONE, F32_ZERO
from ..ptx import codec
from ..ptx.codec import (
    bf16_high,
    bf16_low,
    bfloat16_bits_to_float32,
    bits_float32,
    f16_high,
    f16_low,
    finite_abs,
    half_bits_to_float32,
    load_u32x4,
    store_u32x4,
)
from ..ptx.target import DEVICE_INLINE, SIMULATOR, cuda, types
from ..runtime.launch import compile_kernel

GROUP = 16  # elements per thread-step: 16 codes = one 16-byte store
THREADS = 32 if SIMULATOR else 256  # the simulator runs each thread as a Python thread: keep it small
INPUT_KINDS = ("float32", "float16", "bfloat16")
# Blocks of the amax pass: enough to fill the GPU, few enough that every quantize block can reduce
# all partials cheaply (8 blocks per SM -> 1056 floats on an H200).
AMAX_BLOCKS_PER_SM = 8
MAX_BLOCKS = 1 << 20  # grid-stride loops cover anything beyond
# Every block of the dynamic kernel first reduces all amax partials (a few loads per thread and a
# block reduction), so it runs one wave of blocks, each looping over many groups: with a one-shot
# grid (16k blocks for 8192^2) that reduction was paid 16 times over and the mode ran at 0.82x of
# torch.compile on the H200.
DYNAMIC_BLOCKS_PER_SM = 8

_U32_16 = np.uint32(16)


# --- per-dtype element access ---------------------------------------------------------------------
@cuda.jit(**DEVICE_INLINE)
def _load_f32(x, i):
    return x[i]


@cuda.jit(**DEVICE_INLINE)
def _load_bf16(x, i):
    return bfloat16_bits_to_float32(x[i])


@cuda.jit(**DEVICE_INLINE)
def _load_f16(x, i):
    return half_bits_to_float32(x[i])


@cuda.jit(**DEVICE_INLINE)
def _times(v, s):
    return v * s


@cuda.jit(**DEVICE_INLINE)
def _divided(v, s):
    return v / s


def _chunk_ops(kind, encode_pair, scale_op):
    """(load_chunk(x, g) -> words, amax_words(words), encode_words(words, out, g, s)) for input
    ``kind``: chunk ``g`` is elements [16 g, 16 g + 16) of the flat input (8 uint32 words of 16-bit
    values, or 16 of float32) and codes [16 g, 16 g + 16) of the flat output. A kernel that needs a
    chunk twice (its amax, then its codes) keeps the words in registers."""
    if kind == "float32":

        @cuda.jit(**DEVICE_INLINE)
        def quad(w0, w1, w2, w3, s):  # 4 float32 words -> 4 codes in one uint32, element 0 lowest
            lo = encode_pair(scale_op(bits_float32(w0), s), scale_op(bits_float32(w1), s))
            hi = encode_pair(scale_op(bits_float32(w2), s), scale_op(bits_float32(w3), s))
            return lo | (hi << _U32_16)

        @cuda.jit(**DEVICE_INLINE)
        def load_chunk(x, g):
            a0, a1, a2, a3 = load_u32x4(x, 4 * g)
            b0, b1, b2, b3 = load_u32x4(x, 4 * g + 1)
            c0, c1, c2, c3 = load_u32x4(x, 4 * g + 2)
            d0, d1, d2, d3 = load_u32x4(x, 4 * g + 3)
            return a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3

        @cuda.jit(**DEVICE_INLINE)
        def encode_words(w, out, g, s):
            store_u32x4(
                out,
                g,
                quad(w[0], w[1], w[2], w[3], s),
                quad(w[4], w[5], w[6], w[7], s),
                quad(w[8], w[9], w[10], w[11], s),
                quad(w[12], w[13], w[14], w[15], s),
            )

        @cuda.jit(**DEVICE_INLINE)
        def amax4(w0, w1, w2, w3):
            return max(
                max(finite_abs(bits_float32(w0)), finite_abs(bits_float32(w1))),
                max(finite_abs(bits_float32(w2)), finite_abs(bits_float32(w3))),
            )

        @cuda.jit(**DEVICE_INLINE)
        def amax_words(w):
            return max(
                max(amax4(w[0], w[1], w[2], w[3]), amax4(w[4], w[5], w[6], w[7])),
                max(amax4(w[8], w[9], w[10], w[11]), amax4(w[12], w[13], w[14], w[15])),
            )

        return load_chunk, amax_words, encode_words

    lo_of, hi_of = (bf16_low, bf16_high) if kind == "bfloat16" else (f16_low, f16_high)

    @cuda.jit(**DEVICE_INLINE)
    def pair_word(wa, wb, s):  # 2 words of 2 halves each -> 4 codes in one uint32, element 0 lowest
        first = encode_pair(scale_op(lo_of(wa), s), scale_op(hi_of(wa), s))
        second = encode_pair(scale_op(lo_of(wb), s), scale_op(hi_of(wb), s))
        return first | (second << _U32_16)

    @cuda.jit(**DEVICE_INLINE)
    def load_chunk(x, g):
        a0, a1, a2, a3 = load_u32x4(x, 2 * g)
        b0, b1, b2, b3 = load_u32x4(x, 2 * g + 1)
        return a0, a1, a2, a3, b0, b1, b2, b3

    @cuda.jit(**DEVICE_INLINE)
    def encode_words(w, out, g, s):
        store_u32x4(
            out,
            g,
            pair_word(w[0], w[1], s),
            pair_word(w[2], w[3], s),
            pair_word(w[4], w[5], s),
            pair_word(w[6], w[7], s),
        )

    @cuda.jit(**DEVICE_INLINE)
    def amax2(w):
        return max(finite_abs(lo_of(w)), finite_abs(hi_of(w)))

    @cuda.jit(**DEVICE_INLINE)
    def amax_words(w):
        return max(
            max(max(amax2(w[0]), amax2(w[1])), max(amax2(w[2]), amax2(w[3]))),
            max(max(amax2(w[4]), amax2(w[5])), max(amax2(w[6]), amax2(w[7]))),
        )

    return load_chunk, amax_words, encode_words


def _group_ops(kind, encode_pair, scale_op):
    """(encode_group(x, out, g, s), amax_group(x, g)): a chunk's codes, and its finite amax, each
    from one load of the chunk (``_chunk_ops``)."""
    load_chunk, amax_words, encode_words = _chunk_ops(kind, encode_pair, scale_op)

    @cuda.jit(**DEVICE_INLINE)
    def encode_group(x, out, g, s):
        encode_words(load_chunk(x, g), out, g, s)

    @cuda.jit(**DEVICE_INLINE)
    def amax_group(x, g):
        return amax_words(load_chunk(x, g))

    return encode_group, amax_group


_LOADERS = {"float32": _load_f32, "bfloat16": _load_bf16, "float16": _load_f16}


@functools.cache
def _share_ops(kind, encoder):
    """(amax_share(x, first, step, ngroups), encode_share(x, out, inv, first, step, ngroups)) over
    the flat input: a thread's share is the 16-element groups first, first + step, ... below
    ``ngroups``, then the tail elements past them at the same stride (every per-tensor kernel walks
    x this way: the grid-stride loops, and one block's)."""
    encode_group, amax_group = _group_ops(kind, codec.encode_pair(encoder), _times)
    encode = codec.encode_one(encoder)
    load = _LOADERS[kind]

    @cuda.jit(**DEVICE_INLINE)
    def amax_share(x, first, step, ngroups):
        amax = F32_ZERO
        for g in range(first, ngroups, step):
            amax = max(amax, amax_group(x, g))
        for j in range(ngroups * GROUP + first, x.size, step):
            amax = max(amax, finite_abs(load(x, j)))
        return amax

    @cuda.jit(**DEVICE_INLINE)
    def encode_share(x, out, inv, first, step, ngroups):
        for g in range(first, ngroups, step):
            encode_group(x, out, g, inv)
        for j in range(ngroups * GROUP + first, x.size, step):
            out[j] = encode(load(x, j) * inv)

    return amax_share, encode_share


@functools.cache
def block_max_for(threads):
    """A device function: the max of ``v`` over a block of ``threads`` threads (a power of two),
    returned to every thread, through ``shared`` (``threads`` float32 slots). Every thread of the
    block must call it (it synchronizes the block)."""

    @cuda.jit(**DEVICE_INLINE)
    def block_max(v, shared):
        t = cuda.threadIdx.x
        shared[t] = v
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if t < step:
                shared[t] = max(shared[t], shared[t + step])
            cuda.syncthreads()
            step //= 2
        result = shared[0]
        cuda.syncthreads()  # the shared slots may be reused after this
        return result

    return block_max


_block_max = block_max_for(THREADS)


@cuda.jit(**DEVICE_INLINE)
def _dynamic_scale(amax):
    return max(amax / F32_E4M3_MAX, F32_MIN_SCALE)  # float32, as vtnumba.cpu.quant.dynamic_scale


# --- kernel factories (one compiled kernel per input kind x encoder x scale source) --------------
def _signature_input(kind):
    return types.float32[::1] if kind == "float32" else types.uint16[::1]


@functools.cache
def _scalar_reader(on_device):
    """A device function reading a float32 kernel argument that is either a device float32[1] (read
    on the GPU, never synchronized) or a plain float32 passed by value."""
    if on_device:

        @cuda.jit(**DEVICE_INLINE)
        def read(value):
            return value[0]
    else:

        @cuda.jit(**DEVICE_INLINE)
        def read(value):
            return value

    return read


@functools.cache
def static_kernel(kind, encoder, device_scale):
    """codes = encode(x * (1 / scale)); ``scale`` a float32 argument or a device float32[1]."""
    _, encode_share = _share_ops(kind, encoder)
    read_scale = _scalar_reader(device_scale)

    def quantize_static(x, out, scale, ngroups):
        inv = F32_ONE / read_scale(scale)  # float32, as the CPU's np.float32(1.0) / np.float32(scale)
        encode_share(x, out, inv, cuda.grid(1), cuda.gridsize(1), ngroups)

    scale_type = types.float32[::1] if device_scale else types.float32
    return compile_kernel(quantize_static, (_signature_input(kind), types.uint8[::1], scale_type, types.int64))


@functools.cache
def amax_kernel(kind):
    """partials[block] = finite amax of the block's grid-stride share of x."""
    amax_share, _ = _share_ops(kind, "portable")  # the encoder is unused here

    def finite_amax_partials(x, partials, ngroups):
        shared = cuda.shared.array(THREADS, types.float32)
        amax = _block_max(amax_share(x, cuda.grid(1), cuda.gridsize(1), ngroups), shared)
        if cuda.threadIdx.x == 0:
            partials[cuda.blockIdx.x] = amax

    return compile_kernel(finite_amax_partials, (_signature_input(kind), types.float32[::1], types.int64))


@functools.cache
def dynamic_kernel(kind, encoder):
    """Each block reduces the amax partials, forms the dynamic scale, quantizes its share; block 0
    writes the scale."""
    _, encode_share = _share_ops(kind, encoder)

    def quantize_dynamic(x, out, partials, scale_out, ngroups):
        shared = cuda.shared.array(THREADS, types.float32)
        t = cuda.threadIdx.x
        amax = F32_ZERO
        for p in range(t, partials.size, THREADS):
            amax = max(amax, partials[p])
        s = _dynamic_scale(_block_max(amax, shared))
        i = cuda.grid(1)
        if i == 0:
            scale_out[0] = s
        encode_share(x, out, F32_ONE / s, i, cuda.gridsize(1), ngroups)

    return compile_kernel(
        quantize_dynamic,
        (_signature_input(kind), types.uint8[::1], types.float32[::1], types.float32[::1], types.int64),
    )


# Small inputs take dynamic per-tensor quantization in ONE launch: a single block reduces the amax
# of the whole input and quantizes it (the arithmetic of the two-kernel form, so the same bytes). At
# decode the two launches of the general form are launch-bound. Measured on the H200 (2026-12-01,
# bench_torch_model.py --parts kernels, bf16, device us one / two launches): 1 x 4096 3.7 / 6.3,
# 1 x 14336 4.7 / 6.5, but 16 x 4096 8.9 / 6.5 and 64 x 16384 95 / 8.0 -- one block stops paying
# between 14 Ki and 64 Ki elements, so the threshold covers a decode row of up to 16 Ki.
SMALL_DYNAMIC_MAX = 1 << 14  # elements
SMALL_THREADS = 32 if SIMULATOR else 1024
_small_block_max = block_max_for(SMALL_THREADS)


@functools.cache
def dynamic_small_kernel(kind, encoder):
    """One block: scale = max(finite amax / 448, floor) over all of x, codes = encode(x * (1 / scale));
    the scale to ``scale_out[0]``."""
    amax_share, encode_share = _share_ops(kind, encoder)

    def quantize_dynamic_small(x, out, scale_out, ngroups):
        shared = cuda.shared.array(SMALL_THREADS, types.float32)
        t = cuda.threadIdx.x
        s = _dynamic_scale(_small_block_max(amax_share(x, t, SMALL_THREADS, ngroups), shared))
        if t == 0:
            scale_out[0] = s
        encode_share(x, out, F32_ONE / s, t, SMALL_THREADS, ngroups)

    return compile_kernel(
        quantize_dynamic_small, (_signature_input(kind), types.uint8[::1], types.float32[::1], types.int64)
    )


@functools.cache
def per_token_kernel(kind, encoder, device_ub):
    """One block per row: t = min(finite amax, scale_ub) (no bound when scale_ub <= 0),
    s = max(t / 448, floor), codes = encode(x / s) -- a divide, as upstream's per-token kernel."""
    encode_group, amax_group = _group_ops(kind, codec.encode_pair(encoder), _divided)
    encode = codec.encode_one(encoder)
    load = _LOADERS[kind]

    read_ub = _scalar_reader(device_ub)

    def quantize_per_token(x, out, scales, scale_ub, cols, row_groups):
        shared = cuda.shared.array(THREADS, types.float32)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        start = row * cols
        first_group = start // GROUP  # exact when row_groups > 0 (cols % GROUP == 0)
        amax = F32_ZERO
        for g in range(t, row_groups, THREADS):
            amax = max(amax, amax_group(x, first_group + g))
        for j in range(row_groups * GROUP + t, cols, THREADS):
            amax = max(amax, finite_abs(load(x, start + j)))
        amax = _block_max(amax, shared)
        ub = read_ub(scale_ub)
        if ub > F32_ZERO:
            amax = min(amax, ub)
        s = _dynamic_scale(amax)
        if t == 0:
            scales[row] = s
        for g in range(t, row_groups, THREADS):
            encode_group(x, out, first_group + g, s)
        for j in range(row_groups * GROUP + t, cols, THREADS):
            out[start + j] = encode(load(x, start + j) / s)

    ub_type = types.float32[::1] if device_ub else types.float32
    return compile_kernel(
        quantize_per_token,
        (_signature_input(kind), types.uint8[::1], types.float32[::1], ub_type, types.int64, types.int64),
    )


# --- per-group (1 x g) quantization: one warp per group -------------------------------------------
# Upstream's per_token_group_quant_fp8 (vllm/model_executor/layers/quantization/utils/fp8_utils.py):
# each run of g elements along a row gets scale = max(amax, 1e-10) / 448 (optionally rounded up to a
# power of two, UE8M0), and codes = encode(x / scale), a true division. The scale rule is
# ``_format.per_group_scale``, the very function the CPU runs. A warp owns a group: its lanes stride
# through the group's elements for the finite amax, meet through a warp reduction, then encode.
GROUP_WARPS = 1 if SIMULATOR else 8  # warps (groups) per block


def _shfl_warp_max(v, scratch, lane, warp):
    offset = 16
    while offset > 0:
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, offset))
        offset //= 2
    return v


def _simulated_warp_max(v, scratch, lane, warp):
    """The same through shared memory (the simulator has no shuffles); every thread of the block
    must call it."""
    scratch[warp * 32 + lane] = v
    cuda.syncthreads()
    total = F32_ZERO
    for i in range(32):
        total = max(total, scratch[warp * 32 + i])
    cuda.syncthreads()
    return total


_warp_max = cuda.jit(**DEVICE_INLINE)(_simulated_warp_max if SIMULATOR else _shfl_warp_max)


def _group_scale_rule(ue8m0, e8m0):
    """(scale_of(amax) -> (stored, divisor), the scales array's element type) of a per-group kernel:

    - ``e8m0`` None: ``_format.per_group_scale`` (``ue8m0``: rounded up to a power of two), stored
      and divided by as it is (float32);
    - ``e8m0`` 'rceil' / 'floor': MX, the group's E8M0 byte by that rule (``_format.e8m0_scale_byte``)
      stored (uint8), and x divided by 2^(byte - 127): the same float32 as the CPU's multiply by
      2^(127 - byte), one rounding of the same real number (DESIGN.md, "MXFP8").

    Both rules are the plain-Python functions the CPU compiles."""
    if e8m0 is None:
        group_scale = codec.compile_device(_format.per_group_scale)

        @cuda.jit(**DEVICE_INLINE)
        def scale_of(amax):
            s = group_scale(amax, ue8m0)
            return s, s

        return scale_of, types.float32
    scale_byte = codec.compile_device(_format.e8m0_scale_byte)
    decode_scale = codec.compile_device(_format.decode_e8m0_scalar)
    rceil = e8m0 == "rceil"

    @cuda.jit(**DEVICE_INLINE)
    def scale_of_e8m0(amax):
        byte = scale_byte(amax, rceil)
        return byte, decode_scale(byte)

    return scale_of_e8m0, types.uint8


@functools.cache
def per_group_kernel(kind, encoder, ue8m0, e8m0=None):
    """codes = encode(x / s) per group of ``group_size`` along each row of x [rows, k] (flat); the
    group's scale to scales[row * row_stride + group * group_stride] (row- or column-major).
    ``e8m0`` ('rceil', 'floor'): MX quantization, the scales E8M0 bytes (``_group_scale_rule``)."""
    encode = codec.encode_one(encoder)
    load = _LOADERS[kind]
    scale_of, scale_type = _group_scale_rule(ue8m0, e8m0)
    threads = 32 * GROUP_WARPS

    def quantize_per_group(x, out, scales, rows, k, group_size, row_stride, group_stride):
        scratch = cuda.shared.array(threads, types.float32)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        groups = (k + group_size - 1) // group_size
        total = rows * groups
        # every warp of a block takes the same number of steps: the simulator's reduction syncs the block
        for base in range(cuda.blockIdx.x * GROUP_WARPS, total + GROUP_WARPS - 1, cuda.gridDim.x * GROUP_WARPS):
            gi = base + warp
            r = gi // groups if gi < total else 0
            lo = (gi - r * groups) * group_size if gi < total else 0
            hi = min(k, lo + group_size) if gi < total else 0
            start = r * k
            amax = F32_ZERO
            for j in range(lo + lane, hi, 32):
                amax = max(amax, finite_abs(load(x, start + j)))
            stored, s = scale_of(_warp_max(amax, scratch, lane, warp))
            if gi < total:
                if lane == 0:
                    scales[r * row_stride + (gi - r * groups) * group_stride] = stored
                for j in range(lo + lane, hi, 32):
                    out[start + j] = encode(load(x, start + j) / s)

    signature = (
        _signature_input(kind),
        types.uint8[::1],
        scale_type[::1],
        types.int64,
        types.int64,
        types.int64,
        types.int64,
        types.int64,
    )
    return compile_kernel(quantize_per_group, signature), threads


# The 16-wide form, for groups of a multiple of 16 elements in rows of a multiple of 16 on a
# 16-byte aligned input: a segment of ``width`` lanes owns a group, each lane its 16-element
# chunks (two or four 16-byte loads, one 16-byte store of codes), the segment's amax meets through
# shuffles inside it. The element-per-lane form above reads 2-byte elements one lane at a time and
# stores codes byte by byte. On the H200 (2026-12-01, bf16, g = 128, TB/s read + written at
# 4096 x 4096 / 4096 x 14336): element per lane 0.47 / 0.49, this loop 1.60 / 1.77, a chunk a lane
# (``one_read``) 1.75 / 1.95; per-token quantization 2.05 / 2.69; the copy
# 3.5 / 4.0. What holds the group forms below per-token was not found in that run.
CHUNK = GROUP  # elements per lane-step: 16


def group_width(group_size):
    """Lanes per group of the 16-wide form: the largest power of two <= min(32, chunks per group)."""
    chunks = group_size // CHUNK
    width = 1
    while width * 2 <= min(32, chunks):
        width *= 2
    return width


def _shfl_segment_max(v, scratch, lane, warp, width):
    offset = width // 2
    while offset > 0:
        v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, offset))
        offset //= 2
    return v


def _simulated_segment_max(v, scratch, lane, warp, width):
    """The same through shared memory (the simulator has no shuffles); every thread of the block
    must call it."""
    scratch[warp * 32 + lane] = v
    cuda.syncthreads()
    first = warp * 32 + (lane // width) * width
    total = F32_ZERO
    for i in range(width):
        total = max(total, scratch[first + i])
    cuda.syncthreads()
    return total


_segment_max = cuda.jit(**DEVICE_INLINE)(_simulated_segment_max if SIMULATOR else _shfl_segment_max)


@functools.cache
def per_group_vector_kernel(kind, encoder, ue8m0, width, one_read, e8m0=None):
    """``per_group_kernel``'s arithmetic, 16 elements per lane-step (see above): groups of a
    multiple of 16 elements, K % 16 == 0, a 16-byte aligned input; ``width`` lanes per group.
    ``one_read``: each group is exactly ``width`` chunks (g = 16 .. 512 and K % g == 0), so a lane
    loads its one chunk once, reduces the group's amax from registers and encodes the same
    registers -- one read of x instead of two. ``e8m0``: MX, as ``per_group_kernel``."""
    load_chunk, amax_words, encode_words = _chunk_ops(kind, codec.encode_pair(encoder), _divided)
    encode_group, amax_group = _group_ops(kind, codec.encode_pair(encoder), _divided)
    scale_of, scale_type = _group_scale_rule(ue8m0, e8m0)
    threads = 32 * GROUP_WARPS
    per_warp = 32 // width
    per_block = GROUP_WARPS * per_warp

    def quantize_per_group16(x, out, scales, rows, k, group_size, row_stride, group_stride):
        scratch = cuda.shared.array(threads, types.float32)
        lane = cuda.threadIdx.x % 32
        warp = cuda.threadIdx.x // 32
        seg = lane // width
        sub = lane - seg * width
        groups = (k + group_size - 1) // group_size
        total = rows * groups
        # every thread of a block takes the same steps: the simulator's reduction syncs the block
        for base in range(cuda.blockIdx.x * per_block, total, cuda.gridDim.x * per_block):
            gi = base + warp * per_warp + seg
            valid = gi < total
            r = gi // groups if valid else 0
            lo = (gi - r * groups) * group_size if valid else 0
            chunks = (min(k, lo + group_size) - lo) // CHUNK if valid else 0
            first = (r * k + lo) // CHUNK
            amax = F32_ZERO
            if one_read:
                words = load_chunk(x, first + sub)  # (an invalid lane reads chunk 0: its group's first)
                if valid:
                    amax = amax_words(words)
            else:
                for c in range(sub, chunks, width):
                    amax = max(amax, amax_group(x, first + c))
            stored, s = scale_of(_segment_max(amax, scratch, lane, warp, width))
            if valid:
                if sub == 0:
                    scales[r * row_stride + (gi - r * groups) * group_stride] = stored
                if one_read:
                    encode_words(words, out, first + sub, s)
                else:
                    for c in range(sub, chunks, width):
                        encode_group(x, out, first + c, s)

    signature = (
        _signature_input(kind),
        types.uint8[::1],
        scale_type[::1],
        types.int64,
        types.int64,
        types.int64,
        types.int64,
        types.int64,
    )
    return compile_kernel(quantize_per_group16, signature), threads, per_block


__all__ = [
    "GROUP",
    "THREADS",
    "GROUP_WARPS",
    "DYNAMIC_BLOCKS_PER_SM",
    "INPUT_KINDS",
    "static_kernel",
    "amax_kernel",
    "dynamic_kernel",
    "dynamic_small_kernel",
    "SMALL_DYNAMIC_MAX",
    "per_token_kernel",
    "per_group_kernel",
    "per_group_vector_kernel",
    "group_width",
]
