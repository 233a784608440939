"""The seam's bound fast path and CUDA graphs on a real GPU (marker ``gpu``; the H200 run proves
them): a repeated call replays the bound call bitwise; every change that must send a call back to
the full path does (another shape, a strided view, a misaligned view, the lever flipped, another
output dtype; another stream reuses the binding); at decode an eager call is the one fused launch and
a captured one the split path (VT_DECODE_PATH); with the path forced to one side a captured graph
replays bitwise what eager calls give, for a two-layer MLP and for the seven linear layers of a
Llama-3-8B block with SiLU; nothing synchronizes per call (a capture would refuse it)."""

import ml_dtypes
import numpy as np
import pytest
from kernel_names import DENSE_WGMMA_KERNEL, FUSED_KERNEL, fused_kernel

from vtnumba import seam
from vtnumba.seam import matmul as seam_matmul
from vtnumba.testing.devices import to_device, to_host

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(71)
SCHEMES = ["static", "dynamic", "per_token"]


def _weight(n, k, scheme, bias=True, per_channel=False):
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return seam.Fp8Weight.from_float(
        w,
        input_scale=np.float32(4.0 / 448) if scheme == "static" else None,
        per_channel=per_channel,
        activation_scheme=scheme,
        bias=RNG.standard_normal(n).astype(np.float32) if bias else None,
    )


def _bits(y):
    return to_host(y).view(np.uint8)


def _full(x, weight, out_dtype=None):
    """The full (validating, choosing) path, never bound: what a bound call must equal."""
    return seam_matmul._matmul_fp8(x, weight, out_dtype)[0]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_repeated_calls_take_the_bound_path_bitwise(cp, scheme, m, dtype):
    layer = seam.make_linear_method(seam.ResidentFp8(_weight(256, 512, scheme), "cuda"))
    w = layer.weight.weight
    xs = [to_device(RNG.standard_normal((m, 512)).astype(dtype), "cuda") for _ in range(4)]
    layer.apply(xs[0])  # the full path, then the binding
    assert w.bound_calls and len(w.bound_calls) == 1
    (binding,) = w.bound_calls.values()
    bound = binding.eager
    # at decode in eager code: the one fused launch where the GEMV finds the amax in its launch (a
    # static scale at any M <= 16, a dynamic one at M <= 4, on sm_90 the dense wgmma launch at M <= 8),
    # else quantize + the tensor-core GEMV
    one = fused_kernel(m, scheme)
    fused = scheme == "static" or m <= 4 or one == DENSE_WGMMA_KERNEL
    assert bound.kernels == ((one,) if fused else (bound.kernels[0], "tensorcore_gemv")), bound.kernels
    assert (bound.scratch_bytes == 0) == fused
    calls = []
    original = type(bound).__call__
    try:
        type(bound).__call__ = lambda self, *a: calls.append(1) or original(self, *a)
        for x in xs[1:]:
            # the full path quantizes, then the same GEMV: the fused launch's bytes
            np.testing.assert_array_equal(_bits(layer.apply(x)), _bits(_full(x, layer.weight)))
    finally:
        type(bound).__call__ = original
    assert len(calls) == 3  # every repeat went through the binding
    assert len(w.bound_calls) == 1


def test_changes_send_the_call_back_to_the_full_path(cp, monkeypatch):
    weight = seam.ResidentFp8(_weight(128, 256, "static"), "cuda")
    w = weight.weight
    x = cp.asarray(RNG.standard_normal((4, 256)).astype(np.float32))
    seam.matmul_fp8(x, weight)
    assert len(w.bound_calls) == 1

    def check(x_new, **kw):
        np.testing.assert_array_equal(_bits(seam.matmul_fp8(x_new, weight, **kw)), _bits(_full(x_new, weight, **kw)))

    check(cp.asarray(RNG.standard_normal((5, 256)).astype(np.float32)))  # another shape: a new binding
    assert len(w.bound_calls) == 2
    wide = cp.asarray(RNG.standard_normal((4, 512)).astype(np.float32))
    check(wide[:, ::2])  # strided: never bound
    check(wide[:, 1:257])  # not 16-byte aligned rows: never bound
    assert len(w.bound_calls) == 2
    check(x, out_dtype=np.float16)  # another output dtype: a new binding
    assert len(w.bound_calls) == 3
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        check(x)  # another stream: the same binding (a call's temporaries are its own, per call)
    stream.synchronize()
    assert len(w.bound_calls) == 3
    monkeypatch.setenv("VT_DENSE_CUBLASLT_FP8", "0")  # the lever: another kernel, another binding
    check(x)
    check(x)
    assert len(w.bound_calls) == 4


def _mlp(cp, d=256, h=512, schemes=("static", "per_token")):
    up = seam.make_linear_method(seam.ResidentFp8(_weight(h, d, schemes[0]), "cuda"))
    down = seam.make_linear_method(seam.ResidentFp8(_weight(d, h, schemes[1], per_channel=True), "cuda"))

    def forward(x):
        return down.apply(cp.maximum(up.apply(x), 0))

    return forward


@pytest.mark.parametrize("decode_path", ["fused", "split"])
@pytest.mark.parametrize("schemes", [("static", "per_token"), ("dynamic", "static")])
def test_graph_replay_equals_eager_bitwise(cp, monkeypatch, schemes, decode_path):
    """With the decode path forced to one side (VT_DECODE_PATH), eager calls and a captured graph run
    the same kernels, and the graph replays the eager bytes."""
    import vtnumba.cuda as vcuda

    monkeypatch.setenv("VT_DECODE_PATH", decode_path)
    forward = _mlp(cp, schemes=schemes)
    xs = [cp.asarray(RNG.standard_normal((2, 256)).astype(np.float32)).astype(cp.float16) for _ in range(4)]
    step = vcuda.capture(forward, xs[0])
    for x in xs[1:] + xs[:1]:
        eager = _bits(forward(x))
        replay = _bits(step(x))
        np.testing.assert_array_equal(replay, eager)
        assert np.count_nonzero(replay) > 0


LLAMA_8B = {
    "q": (4096, 4096),
    "k": (1024, 4096),
    "v": (1024, 4096),
    "o": (4096, 4096),
    "gate": (14336, 4096),
    "up": (14336, 4096),
    "down": (4096, 14336),
}


def llama_block(cp, scheme="static", reduce=1):
    """The seven linear layers of a Llama-3-8B decoder block (N and K divided by ``reduce``) with
    SiLU(gate) * up, as one function of the hidden state; attention itself is left out (q stands for
    its output), so the block is every FP8 GEMM of a decode step's layer."""
    layers = {
        name: seam.make_linear_method(seam.ResidentFp8(_weight(n // reduce, k // reduce, scheme, bias=False), "cuda"))
        for name, (n, k) in LLAMA_8B.items()
    }
    silu_mul = cp.ElementwiseKernel(
        "T g, T u", "T y", "y = (T)((float)g / (1.0f + expf(-(float)g)) * (float)u)", "vt_silu_mul"
    )  # float16 activations (cupy has no bfloat16 arithmetic)

    def block(h):
        q = layers["q"].apply(h)
        layers["k"].apply(h)
        layers["v"].apply(h)
        o = layers["o"].apply(q)
        g = layers["gate"].apply(o)
        u = layers["up"].apply(o)
        return layers["down"].apply(silu_mul(g, u))

    return block


def test_auto_decode_path_eager_fused_graph_split(cp, monkeypatch):
    """The default (VT_DECODE_PATH unset), the tensor-core GEMV's side (the dense wgmma launch, which
    takes both regimes on sm_90, disabled): an eager call at decode is the one fused launch, the same
    call captured into a graph the quantization kernel and cuBLASLt; the two agree within the tensor
    cores' bound (the fused GEMV accumulates exactly, G3), and each replays its own bytes."""
    import vtnumba.cuda as vcuda
    from vtnumba.testing import reference

    monkeypatch.setenv("VT_DISABLE_KERNELS", DENSE_WGMMA_KERNEL)

    w = _weight(256, 512, "static", bias=False)
    layer = seam.make_linear_method(seam.ResidentFp8(w, "cuda"))
    x = cp.asarray(RNG.standard_normal((1, 512)).astype(np.float32))
    eager = layer.apply(x)
    (binding,) = layer.weight.weight.bound_calls.values()
    assert binding.eager.kernels == (FUSED_KERNEL,)
    assert binding.graph.kernels == ("quantize_static", "cublaslt"), binding.graph.kernels
    step = vcuda.capture(lambda a: layer.apply(a), x)
    replay = cp.asnumpy(step(x))
    np.testing.assert_array_equal(_bits(layer.apply(x)), _bits(eager))  # eager: its own bytes again
    np.testing.assert_array_equal(_bits(step(x)), replay.view(np.uint8))
    q = seam.quantize_activation(x.get(), w)
    ref, g3 = reference.scaled_mm(q.data, w.data, q.scale, w.weight_scale, None)
    tensor_cores = reference.tensor_core_bound(q.data, w.data, q.scale, w.weight_scale)
    allow = g3 + tensor_cores + reference.out_rounding(ref, np.float32)
    assert np.all(np.abs(replay.astype(np.float64) - ref) <= allow)
    assert np.all(np.abs(cp.asnumpy(eager).astype(np.float64) - ref) <= allow)
    assert np.count_nonzero(ref) > 0


@pytest.mark.parametrize("decode_path", ["fused", "split"])
def test_llama_block_graph_equals_eager_bitwise(cp, monkeypatch, decode_path):
    import vtnumba.cuda as vcuda

    monkeypatch.setenv("VT_DECODE_PATH", decode_path)
    block = llama_block(cp, reduce=4)
    xs = [cp.asarray(RNG.standard_normal((1, 1024)).astype(np.float16)) for _ in range(3)]
    step = vcuda.capture(block, xs[0])
    for x in xs:
        np.testing.assert_array_equal(_bits(step(x)), _bits(block(x)))


def test_capture_on_a_torch_stream(cp, monkeypatch):
    torch = pytest.importorskip("torch")
    import vtnumba.cuda as vcuda

    monkeypatch.setenv("VT_DECODE_PATH", "fused")  # eager and the graph run the same kernels

    forward = _mlp(cp)
    x = cp.asarray(RNG.standard_normal((1, 256)).astype(np.float32))
    ts = torch.cuda.Stream()
    step = vcuda.capture(forward, x, stream=ts)
    want = _bits(forward(x))
    got = step(x)
    ts.synchronize()
    np.testing.assert_array_equal(_bits(got), want)


def test_capture_refuses_other_shapes_and_strided_views(cp):
    import vtnumba.cuda as vcuda

    forward = _mlp(cp)
    x = cp.asarray(RNG.standard_normal((2, 256)).astype(np.float32))
    step = vcuda.capture(forward, x)
    with pytest.raises(ValueError, match="argument 0 must have the captured shape"):
        step(cp.zeros((3, 256), np.float32))
    with pytest.raises(ValueError, match="argument 0 must be C-contiguous"):
        step(cp.zeros((2, 512), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="stream must be a cupy or torch CUDA stream"):
        vcuda.capture(forward, x, stream="default")


def test_a_replay_copies_its_small_arguments_in_one_launch(cp):
    """vtnumba.cuda.capture's replay: the small word-sized arguments go through the one copy launch
    (graphs._copy_words), an odd-sized and a large one by memcpy, and every replay computes on the
    new arguments, a source off a word boundary included (that call falls back to memcpy)."""
    import vtnumba.cuda as vcuda
    from vtnumba.cuda import graphs

    def fn(a, odd, big, ids):
        return a * 2 + ids[:, :1].astype(cp.float32), odd + 1, big[:8] * 3

    def args(seed):
        rng = np.random.default_rng(seed)
        return (
            cp.asarray(rng.standard_normal((3, 64)).astype(np.float32)),
            cp.asarray(rng.integers(0, 100, 7, dtype=np.uint8)),  # 7 bytes: not whole words
            cp.asarray(rng.standard_normal(graphs.FUSED_COPY_MAX_BYTES // 4 + 1).astype(np.float32)),
            cp.asarray(rng.integers(0, 128, (3, 8), dtype=np.int32)),
        )

    step = vcuda.capture(fn, *args(0))
    assert step._fused == (0, 3) and step._copy is not None

    class CountedCopy:  # the prepared copy launch, its launches counted (it has __slots__: wrap it)
        def __init__(self, launch):
            self.launch_of, self.launches = launch, 0

        def set_arg(self, index, value):
            self.launch_of.set_arg(index, value)

        def launch(self, stream_ptr):
            self.launches += 1
            self.launch_of.launch(stream_ptr)

    step._copy = counted = CountedCopy(step._copy)
    for seed in (1, 2):
        new = args(seed)
        got = [cp.asnumpy(y) for y in step(*new)]
        want = [cp.asnumpy(y) for y in fn(*new)]
        assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))
    assert counted.launches == 2  # each replay copied its two small arguments in the one launch
    # a float32 argument whose data starts 2 bytes into a buffer
    a, odd, big, ids = args(3)
    raw = cp.empty(a.nbytes + 4, dtype=cp.uint8)
    shifted = cp.ndarray(a.shape, cp.float32, memptr=raw.data + 2)  # no kernel may touch it: memcpy only
    cp.cuda.runtime.memcpy(shifted.data.ptr, a.data.ptr, a.nbytes, 3)  # 3: device to device
    assert shifted.data.ptr % 4 == 2
    got = cp.asnumpy(step(shifted, odd, big, ids)[0])
    np.testing.assert_array_equal(got, cp.asnumpy(fn(a, odd, big, ids)[0]))
    assert counted.launches == 2  # that call copied every argument by memcpy
