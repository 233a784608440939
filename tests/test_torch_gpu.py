"""A converted torch model on the GPU (marker ``gpu``; the H200 run proves it): which kernels run,
graph capture, torch.compile, torch's allocator, conversion on the GPU.

- Kernel choice is pinned two ways: the layer's binding names what it runs (``Fp8Linear.kernels``),
  and torch.profiler sees exactly those launches -- at decode in eager one fused GEMV launch, above
  it cuBLASLt's GEMM with no Numba epilogue after it wherever the docstrings promise cuBLASLt
  (per-token x per-channel scales through OUTER_VEC_32F included), so a silent fallback fails here.
- ``torch.cuda.graph`` in its default capture mode replays every scheme to the eager bytes.
- ``torch.compile(fullgraph=True)`` and ``mode="reduce-overhead"`` give the eager bytes.
- Results are torch allocations (``torch.cuda.memory_allocated`` counts them); cupy's pool is left
  alone call after call.
- ``convert`` of a model on the GPU quantizes there, to the CPU conversion's bytes.
"""

import copy

import kernel_names as profiled
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from kernel_names import FUSED_KERNEL, fused_kernel  # noqa: E402  (vtnumba.cuda.bound's names)

nn = torch.nn

SCHEMES = ["static", "dynamic", "per_token", "per_group"]
QUANT_KERNEL = {
    "static": ("quantize_static",),
    "dynamic": ("finite_amax_partials", "quantize_dynamic"),
    "per_token": ("quantize_per_token",),
    "per_group": ("quantize_per_group16",),
}


def _quant_kernels(scheme, m, k):
    if scheme == "dynamic" and m * k <= 1 << 14:  # small inputs: one launch (vtnumba.cuda.kernels.quant)
        return ("quantize_dynamic_small",)
    return QUANT_KERNEL[scheme]


def _vtt():
    import vtnumba.torch as vtt

    return vtt


def _mlp(k=256, hidden=512, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(k, hidden, bias=False), nn.SiLU(), nn.Linear(hidden, k, bias=False)).eval()


def _converted(scheme, model=None, dtype=torch.bfloat16):
    vtt = _vtt()
    model = copy.deepcopy(model if model is not None else _mlp()).to("cuda", dtype)
    scales = None
    if scheme == "static":
        x = torch.randn(64, model[0].in_features, device="cuda", dtype=dtype)
        scales = vtt.calibrate(model, lambda: model(x))
    return vtt.convert(model, scheme, input_scales=scales)


def _fused(scheme, m):
    """Whether an eager call of m rows is the one fused decode launch (vtnumba.cuda.bound.fused_reason):
    M <= 16, and a dynamic amax only for M <= 4 (the layers here are K = 1024, so every row fits)."""
    return (
        m <= 4
        or (m <= 16 and scheme in ("static", "per_group"))
        or (m <= 8 and fused_kernel(m, scheme) != FUSED_KERNEL)
    )


def _expected_gemm(scheme, m):
    """The GEMM vtnumba.cuda.gemm's docstring promises for an eager call: the tensor-core GEMV at
    decode (M <= 16); above, cuBLASLt everywhere, with per-row x per-channel scales through
    OUTER_VEC_32F from OUTER_VEC_MIN_M rows on and the f32-staged path below; block scales through
    cuBLASLt where it takes them (M % 4 == 0), the tensor-core GEMV else."""
    from vtnumba.cuda import gemm

    if m <= 16:
        return "tensorcore_block_gemv" if scheme == "per_group" else "tensorcore_gemv"
    if scheme == "per_group":
        return "cublaslt_block" if m % 4 == 0 else "tensorcore_block_gemv"
    if scheme == "per_token" and m < gemm.OUTER_VEC_MIN_M:
        return "cublaslt_f32_epilogue"
    return "cublaslt"


def _profiled_kernels(fn):
    """The names the profiler gives the CUDA kernels ``fn`` runs (its second call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_promised_kernel_runs(scheme, m, out_dtype):
    vtt = _vtt()
    torch.manual_seed(m)
    linear = nn.Linear(1024, 512, bias=False).to("cuda", torch.bfloat16)
    layer = vtt.Fp8Linear.from_linear(
        linear, scheme, input_scale=0.01 if scheme == "static" else None, out_dtype=out_dtype
    )
    with torch.inference_mode():  # an inference tensor: each call quantizes (no sharing between calls)
        x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
        kernels = layer.kernels(x)
        names = _profiled_kernels(lambda: layer(x))
    # ours by the kernels vtnumba compiled, named alike under both compilers (numba-cuda-mlir's
    # names carry no module path); any other is cuBLASLt's
    ours = profiled.ours(names)
    theirs = [n for n in names if not profiled.is_ours(n)]
    if _fused(scheme, m):  # one launch: the GEMV quantizes x as it reads it
        assert kernels == (fused_kernel(m, scheme),), kernels
        assert len(names) == 1 and len(ours) == 1 and "gemv" in ours[0], names
        return
    assert kernels == _quant_kernels(scheme, m, 1024) + (_expected_gemm(scheme, m),), kernels
    assert all(any(q in n for n in ours) for q in _quant_kernels(scheme, m, 1024)), names
    staged = _expected_gemm(scheme, m) == "cublaslt_f32_epilogue"
    assert any("_epilogue_vector_kernel" in n for n in ours) == staged, names  # no silent f32-staged fallback
    if _expected_gemm(scheme, m).startswith("cublaslt"):
        assert theirs, names  # cuBLASLt ran the GEMM
    else:
        assert any("gemv" in n for n in ours) and not theirs, names


def test_float32_bias_for_bf16_output_takes_the_f32_staged_path(monkeypatch):
    """The one documented fallback: a float32 bias with bf16 output (cuBLASLt would round the bias
    to bf16 first) runs cuBLASLt into float32 and the Numba epilogue, the 8-wide form (on the split
    path: at M = 16 in eager code the tensor-core GEMV would take the call)."""
    monkeypatch.setenv("VT_DECODE_PATH", "split")
    vtt = _vtt()
    linear = nn.Linear(1024, 512).cuda()  # float32 bias
    layer = vtt.Fp8Linear.from_linear(linear, "per_token", out_dtype=torch.bfloat16)
    x = torch.randn(16, 1024, device="cuda")
    assert layer.kernels(x) == ("quantize_per_token", "cublaslt_f32_epilogue")
    with torch.inference_mode():
        names = _profiled_kernels(lambda: layer(x))
    assert any("_epilogue_vector_kernel" in n for n in profiled.ours(names)), names


@pytest.mark.parametrize("decode_path", ["fused", "split"])
@pytest.mark.parametrize("grad_mode", ["inference_mode", "no_grad"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_torch_cuda_graph_replays_the_eager_bytes(monkeypatch, scheme, grad_mode, decode_path):
    """Default capture mode (any cudaMalloc would break it), warm-up and capture on one stream: the
    graph holds its own quantization even right after an eager call on the same tensor (under
    no_grad, where eager calls share codes), so new inputs copied in replay to the eager bytes. The
    decode path is forced to one side (VT_DECODE_PATH): by default an eager call at decode is the
    fused launch and a captured one the split path, which agree within the tensor cores' bound only."""
    monkeypatch.setenv("VT_DECODE_PATH", decode_path)
    model = _converted(scheme)
    xs = [torch.randn(4, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    static_x = xs[0].clone()
    with getattr(torch, grad_mode)():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up, as torch's docs do it, on the capture's stream
            model(static_x)
            model(static_x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_y = model(static_x)
        compared = 0
        for x in xs[1:] + xs[:1]:
            eager = model(x)
            static_x.copy_(x)
            graph.replay()
            torch.testing.assert_close(static_y, eager, rtol=0, atol=0)
            compared += int(torch.count_nonzero(eager))
    assert compared > 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiled_model_equals_eager(monkeypatch, scheme):
    # the graph of mode="reduce-overhead" runs what eager runs only with the decode path forced
    monkeypatch.setenv("VT_DECODE_PATH", "fused")
    torch._dynamo.reset()
    model = _converted(scheme)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = model(x)
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0
        got = torch.compile(model, fullgraph=True)(x)
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
        graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):  # warm-up, record, replay
            got = graphed(x).clone()
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
    assert int(torch.count_nonzero(eager)) > 0


def test_results_are_torch_allocations_and_cupy_pool_is_left_alone():
    import cupy

    layer = _converted("per_token")[0]
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        layer(x)
        layer(x)  # bound by now
        torch.cuda.synchronize()
        pool = cupy.get_default_memory_pool()
        used, total = pool.used_bytes(), pool.total_bytes()
        before = torch.cuda.memory_allocated()
        ys = [layer(x) for _ in range(4)]
        after = torch.cuda.memory_allocated()
        torch.cuda.synchronize()
    assert after - before >= sum(y.numel() * y.element_size() for y in ys)
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)
    # the general (interop) path too: an op on tensors allocates its result from torch
    import vtnumba as vt

    before = torch.cuda.memory_allocated()
    q = vt.quantize_fp8(x, per_token=True)
    assert torch.cuda.memory_allocated() - before >= q.data.numel()
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_convert_on_the_gpu_gives_the_cpu_conversion(scheme):
    """A model on the GPU converts there (the codes and scales never visit the host), byte for byte
    the CPU conversion, and its float weights are released."""
    vtt = _vtt()
    model = _mlp(seed=3).to(torch.bfloat16)
    scales = {"0": 0.02, "2": 0.03} if scheme == "static" else None
    on_cpu = vtt.convert(copy.deepcopy(model), scheme, input_scales=scales)
    gpu_model = copy.deepcopy(model).cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    on_gpu = vtt.convert(gpu_model, scheme, input_scales=scales)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() < before  # 2-byte weights gone, 1-byte codes in
    for name in ("0", "2"):
        a, b = on_cpu.get_submodule(name), on_gpu.get_submodule(name)
        assert b.weight.is_cuda and b.weight_scale.is_cuda
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8).cpu())
        assert torch.equal(a.weight_scale.view(torch.int32), b.weight_scale.view(torch.int32).cpu())
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        torch.testing.assert_close(on_gpu(x.cuda()).cpu(), on_cpu.cuda()(x.cuda()).cpu(), rtol=0, atol=0)


def test_fp8_linear_host_cost_stays_near_nn_linear():
    """Not a timing gate (benchmarks/gpu/bench_torch_model.py measures it): a bound forward at decode
    makes one torch allocation (y) and no cupy one, and one launch (the fused GEMV, on sm_90 the dense wgmma launch)."""
    layer = _converted("dynamic")[0]
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        layer(x)
        state = layer._states[0]
        assert len(state.calls) == 1
        (binding,) = state.calls.values()
        assert binding.eager.kernels == (fused_kernel(1, "dynamic"),) and binding.eager.scratch_bytes == 0
        calls = []
        original = type(binding.eager).enqueue
        type(binding.eager).enqueue = lambda self, *a: calls.append(a) or original(self, *a)
        before = torch.cuda.memory_stats()["allocation.all.allocated"]
        try:
            layer(x)
            layer(x)
        finally:
            type(binding.eager).enqueue = original
        allocations = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    assert len(calls) == 2 and len(state.calls) == 1
    assert allocations == 2, allocations  # y, once a call


@pytest.mark.parametrize("scheme", SCHEMES)
def test_layers_that_share_an_input_quantize_it_once(monkeypatch, scheme):
    """q/k/v and gate/up read one tensor: on the split path (the fused decode launch quantizes inside
    its GEMV and shares nothing) the second layer takes the first one's codes (one set of
    quantization launches for two GEMMs), to the bytes each layer gives alone; an in-place write to
    x between them, or another tensor, quantizes again."""
    monkeypatch.setenv("VT_DECODE_PATH", "split")
    vtt = _vtt()
    torch.manual_seed(5)
    a, b = (nn.Linear(512, 256, bias=False).to("cuda", torch.bfloat16) for _ in range(2))
    scale = 0.02 if scheme == "static" else None
    la, lb = (vtt.Fp8Linear.from_linear(lin, scheme, input_scale=scale) for lin in (a, b))
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():  # inference tensors keep no version counter, so they never share
        alone_b = lb(x.clone())
        la(x), lb(x)  # bound

        def both(t):
            return la(t), lb(t)

        names = _profiled_kernels(lambda: both(x.clone()))  # a fresh tensor each call
        quant = [n for n in profiled.ours(names) if "quantize" in n or "amax" in n]
        assert len(quant) == len(_quant_kernels(scheme, 16, 512)), names  # once for both layers
        la(x)
        yb = lb(x)
        torch.testing.assert_close(yb, alone_b, rtol=0, atol=0)
        la(x)
        x.mul_(2)  # an in-place write: the next layer must quantize the new values
        torch.testing.assert_close(lb(x), lb(x.clone()), rtol=0, atol=0)
        assert not torch.equal(lb(x), alone_b)
    with torch.inference_mode():  # inference tensors: each layer quantizes for itself
        xi = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
        la(xi), lb(xi)
        names = _profiled_kernels(lambda: both(xi))
        quant = [n for n in profiled.ours(names) if "quantize" in n or "amax" in n]
        assert len(quant) == 2 * len(_quant_kernels(scheme, 16, 512)), names
