"""Mixture-of-experts on a real GPU (vtnumba.cuda.experts through the seam): grouped_matmul_fp8 and
moe_fp8 on cupy against the CPU backend for every scheme (dynamic, static per expert, per-token x
per-channel, 128 x 128 blocks, UE8M0 blocks, MXFP8) -- quantization and routing byte for byte, the
GEMMs within G3 per expert (the tensor-core bound where cuBLASLt runs), the SiLU within the exp
tolerance of tests/test_cudasim_experts.py, the combine byte for byte; which grouped kernel runs per
scheme and rows per expert (1, 8, 64, 512); the CUDA-core grouped kernels forced on every scheme;
a whole moe_fp8 captured into a CUDA graph (vtnumba.cuda.capture, and torch.cuda.graph in its
default mode) replaying the eager bytes; no host synchronization at decode (a raw stream capture,
which any synchronization breaks); the per-expert path's read-back refused while capturing; empty
experts and T = 0. Skipped without a GPU (marker ``gpu``)."""

import ml_dtypes
import numpy as np
import pytest

from vtnumba import _config, seam
from vtnumba.cpu import experts as cpu
from vtnumba.seam import experts as se
from vtnumba.testing.gates import assert_block_g3, assert_g3

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
E, H, I = 8, 256, 256

SCHEMES = {
    "dynamic": dict(),
    "static": dict(input_scale=list(np.linspace(0.008, 0.012, E))),
    "per_token": dict(activation_scheme="per_token", per_channel=True),
    "per_group": dict(block_size=(128, 128)),
    "ue8m0": dict(block_size=(128, 128), scale_ue8m0=True, scale_format="e8m0"),
    "mxfp8": dict(block_size=(1, 32), scale_format="e8m0"),
}
FLOAT_SCALES = {"dynamic", "static", "per_token", "per_group"}  # what the tensor-core grouped GEMV takes
ROUTED = {"static", "per_token", "per_group"}  # what the routed decode takes (vtnumba.cuda.experts)


def _device(cp, x):
    """x on the GPU; bfloat16 travels as its bits (cupy has no bfloat16)."""
    x = np.ascontiguousarray(x)
    return cp.asarray(x.view(np.uint16)).view(BF16) if x.dtype == BF16 else cp.asarray(x)


def _host(cp, x):
    return x if isinstance(x, np.ndarray) else cp.asnumpy(x)


_LAYERS = {}


def _layer(name):
    """(gate_up, down) host Fp8Experts of scheme ``name`` and their resident copies on cuda:0."""
    if name not in _LAYERS:
        rng = np.random.default_rng(len(name))
        opts = SCHEMES[name]
        gu = seam.Fp8Experts.from_float((rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32), **opts)
        dn_opts = dict(opts, input_scale=list(np.linspace(0.012, 0.02, E))) if "input_scale" in opts else opts
        dn = seam.Fp8Experts.from_float((rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32), **dn_opts)
        _LAYERS[name] = (gu, dn, seam.ResidentFp8(gu, "cuda:0"), seam.ResidentFp8(dn, "cuda:0"))
    return _LAYERS[name]


def _offsets(counts):
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def _assert_expert_g3(y, a, sa, ex, offsets, out_dtype=F32, tensor_core=False):
    """y's rows of every expert within G3 (per block) of the float64 reference of a's codes and
    scales against ex's weights; padding rows 0. Returns the count compared."""
    b, sb = np.asarray(ex.data), np.asarray(ex.weight_scale)
    y, a, sa = np.asarray(y), np.asarray(a), np.asarray(sa)
    compared = 0
    for e in range(b.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi <= lo:
            continue
        if ex.block_size is None:
            sae = sa[lo:hi] if sa.size > 1 else sa.reshape(-1)[0]
            compared += assert_g3(y[lo:hi], a[lo:hi], b[e], sae, sb[e], None, out_dtype, tensor_core=tensor_core)
        else:
            compared += assert_block_g3(
                y[lo:hi], a[lo:hi], b[e], sa[lo:hi], sb[e], ex.block_size, None, out_dtype, tensor_core=tensor_core
            )
    assert (y[int(offsets[-1]) :].astype(np.float64) == 0).all()
    return compared


def _codes_close(got, want):
    """Equal codes but for the exp tolerance (tests/test_cudasim_experts.py)."""
    diff = got != want
    if diff.any():
        g, w = got[diff].astype(int), want[diff].astype(int)
        assert diff.mean() <= 0.02 and ((g & 0x80) == (w & 0x80)).all() and (np.abs(g - w) == 1).all()


def _scales_close(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == np.uint8:
        assert (np.abs(got.astype(int) - want.astype(int)) <= 1).all()
    else:
        np.testing.assert_allclose(got, want, rtol=2.0**-20, atol=0)


def _expected_kernel(name, rows_per_expert):
    """The kernel the choice gives on the H200 (sm_90) for ``rows_per_expert`` rows in each expert."""
    from vtnumba.cuda.grouped import PER_EXPERT_MIN_FLOPS, TILED_MIN_ROWS

    if 2 * rows_per_expert * (2 * I) * H >= PER_EXPERT_MIN_FLOPS:  # gate_up's [2I, H] experts
        return "per_expert"
    if rows_per_expert > TILED_MIN_ROWS:  # the tiled kernels: float32 scales (wgmma), MXFP8 (mma.sync)
        return {"ue8m0": "grouped", "mxfp8": "tensorcore_grouped_gemm"}.get(name, "wgmma_grouped_gemm")
    if name not in FLOAT_SCALES:
        return "grouped"
    from vtnumba.cuda.runtime import device

    sm90 = tuple(device.current().cc) == (9, 0)  # the swapped wgmma pass, with the lever on (its default)
    return "wgmma_grouped_gemv" if sm90 and _config.dense_cublaslt_fp8_enabled() else "tensorcore_grouped_gemv"


def _tensor_core(kernel):
    """Whether ``kernel`` holds the tensor-core bound (cuBLASLt's) rather than strict G3."""
    return kernel in ("per_expert", "wgmma_grouped_gemm", "wgmma_grouped_gemv")


def _kernel_of(cp, a, scale, resident, offsets):
    """The grouped kernel a GEMM of these GPU operands runs."""
    from vtnumba.cuda import experts as gpu

    w = resident.weight
    return gpu.grouped_kernel_for(a, scale, w.data, w.weight_scale, offsets, F32, w.block_size)


# -- the grouped GEMM ------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 8, 64, 1024])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_grouped_matmul_on_the_gpu_runs_the_expected_kernel_within_g3(cp, name, rows):
    from vtnumba.cuda import experts as gpu

    gu, _, gu_res, _ = _layer(name)
    counts = [2 * rows, rows, rows, 0, rows, rows, rows, rows]  # expert 3 empty
    offsets = _offsets(counts)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((int(offsets[-1]), H)).astype(np.float32)
    xd, offs_d = _device(cp, x), cp.asarray(offsets)
    # the activation's quantization: the CPU's bytes (G2)
    codes_d, scale_d = se._quantize_rows(xd, gu_res.weight, offs_d, gpu)
    codes, scale = se._quantize_rows(x, gu, offsets, cpu)
    np.testing.assert_array_equal(_host(cp, codes_d), codes)
    np.testing.assert_array_equal(_host(cp, scale_d).view(np.uint8), np.asarray(scale).view(np.uint8))
    dev = gu_res.weight
    kernel = gpu.grouped_kernel_for(
        codes_d, se._row_scale(scale_d, dev), dev.data, dev.weight_scale, offs_d, F32, dev.block_size
    )
    assert kernel == _expected_kernel(name, rows)
    y = seam.grouped_matmul_fp8(xd, gu_res, offs_d, out_dtype=np.float32)
    assert (
        _assert_expert_g3(_host(cp, y), codes, se._row_scale(scale, gu), gu, offsets, tensor_core=_tensor_core(kernel))
        > y.size // 2
    )


@pytest.mark.parametrize("kernel", ["grouped", "grouped_general"])
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_cuda_core_grouped_kernels_meet_g3_on_every_scheme(cp, name, rows, kernel):
    from vtnumba.cuda import experts as gpu

    gu, _, gu_res, _ = _layer(name)
    counts = [rows, 0, 3 * rows, rows, 0, rows, rows, 1]
    offsets = _offsets(counts)
    p = int(offsets[-1]) + 3  # three padding rows
    rng = np.random.default_rng(7 * rows)
    x = rng.standard_normal((p, H)).astype(np.float32)
    codes, scale = se._quantize_rows(x, gu, offsets, cpu)
    scale = se._row_scale(scale, gu)
    dev = gu_res.weight
    for out_dtype in (F32, BF16):
        y = gpu.grouped_scaled_mm(
            cp.asarray(codes),
            cp.asarray(scale),
            dev.data,
            dev.weight_scale,
            cp.asarray(offsets),
            out_dtype,
            dev.block_size,
            kernel=kernel,
        )
        host = _host(cp, y.view(np.uint16)).view(BF16) if out_dtype == BF16 else _host(cp, y)
        assert _assert_expert_g3(host, codes, scale, gu, offsets, out_dtype) > host.size // 2


# -- the whole layer --------------------------------------------------------------------------------------


def _routing(rng, t, k, empty=(3,)):
    live = [e for e in range(E) if e not in empty]
    ids = np.stack([rng.choice(live, size=k, replace=False) for _ in range(t)]).astype(np.int64)
    if t * k >= 4:
        ids.flat[1], ids.flat[-1] = -1, E  # the sentinels route nothing
    w = rng.uniform(0.1, 1.0, size=(t, k)).astype(np.float32)
    return ids, w


@pytest.mark.parametrize("t", [4, 256])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_moe_fp8_on_the_gpu_step_by_step_against_the_cpu(cp, name, t, monkeypatch):
    """Every step of MoeCall on the GPU against the CPU's: routing and the gate_up activation byte for
    byte, both GEMMs within G3 of their own inputs, the SiLU-quantize within the exp tolerance of the
    CPU's on the GPU's hidden rows, the combine the CPU's bytes on the GPU's y."""
    monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_gemv")  # the aligned steps (the routed: below)
    gu, dn, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(t + len(name))
    x = rng.standard_normal((t, H)).astype(BF16 if t == 4 else np.float32)
    ids, w = _routing(rng, t, 2)
    want = se.MoeCall(x, gu, dn, ids, w)
    want.run()
    call = se.MoeCall(_device(cp, x), gu_res, dn_res, cp.asarray(ids), cp.asarray(w))
    out = call.run()
    got = {key: value for key, value in call.state.items()}
    ref = want.state
    for key in ("offsets", "pair_row", "row_token", "a"):
        np.testing.assert_array_equal(_host(cp, got[key]), ref[key], err_msg=key)
    np.testing.assert_array_equal(_host(cp, got["sa"]).view(np.uint8), np.asarray(ref["sa"]).view(np.uint8))
    offsets = ref["offsets"]
    hidden = _host(cp, got["hidden"])
    tensor_core = _tensor_core(
        _kernel_of(cp, got["a"], se._row_scale(got["sa"], gu_res.weight), gu_res, got["offsets"])
    )
    _assert_expert_g3(hidden, ref["a"], se._row_scale(ref["sa"], gu), gu, offsets, tensor_core=tensor_core)
    act_want, sact_want = se._quantize_rows(cpu.silu_mul(hidden, offsets), dn, offsets, cpu)
    act, sact = _host(cp, got["act"]), _host(cp, got["sact"])
    _codes_close(act, act_want)
    _scales_close(sact, np.asarray(sact_want))
    y = _host(cp, got["y"])
    tensor_core = _tensor_core(
        _kernel_of(cp, got["act"], se._row_scale(got["sact"], dn_res.weight), dn_res, got["offsets"])
    )
    _assert_expert_g3(y, act, se._row_scale(sact, dn), dn, offsets, tensor_core=tensor_core)
    host_out = _host(cp, out.view(np.uint16)).view(BF16) if x.dtype == BF16 else _host(cp, out)
    np.testing.assert_array_equal(
        host_out.view(np.uint8), cpu.moe_combine(y, ref["pair_row"], w, x.dtype).view(np.uint8)
    )
    assert np.abs(host_out.astype(np.float32)).max() > 0


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_moe_fp8_captured_into_a_cuda_graph_replays_the_eager_bytes(cp, name):
    """A decode step captured whole (vtnumba.cuda.capture): new tokens and a new routing copied in
    replay to the eager bytes -- the row counts are read on the device, call after call."""
    import vtnumba.cuda

    _, _, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(11)
    t = 4
    x = cp.asarray(rng.standard_normal((t, H)).astype(np.float32))
    ids, w = _routing(rng, t, 2)
    step = vtnumba.cuda.capture(
        lambda a, b, c: seam.moe_fp8(a, gu_res, dn_res, b, c), x, cp.asarray(ids), cp.asarray(w)
    )
    for seed in range(3):
        r = np.random.default_rng(100 + seed)
        x2 = cp.asarray(r.standard_normal((t, H)).astype(np.float32))
        ids2, w2 = _routing(r, t, 2, empty=(seed,))
        eager = seam.moe_fp8(x2, gu_res, dn_res, cp.asarray(ids2), cp.asarray(w2))
        replay = step(x2, cp.asarray(ids2), cp.asarray(w2))
        np.testing.assert_array_equal(cp.asnumpy(replay).view(np.uint32), cp.asnumpy(eager).view(np.uint32))


@pytest.mark.parametrize("name", ["dynamic", "mxfp8", "static"])
def test_a_decode_moe_fp8_never_synchronizes_with_the_host(cp, name):
    """The whole call inside a raw stream capture (relaxed mode: allocations allowed): any
    synchronization on the stream -- a read-back of the offsets, a .get() -- makes the capture
    fail. The graph then replays the eager bytes."""
    _, _, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(12)
    x = cp.asarray(rng.standard_normal((2, H)).astype(np.float32))
    ids, w = (cp.asarray(v) for v in _routing(rng, 2, 2))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        eager = seam.moe_fp8(x, gu_res, dn_res, ids, w)  # warm: kernels compiled, scales uploaded
        stream.synchronize()
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        stream.begin_capture() if mode is None else stream.begin_capture(mode)
        try:
            out = seam.moe_fp8(x, gu_res, dn_res, ids, w)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint32), cp.asnumpy(eager).view(np.uint32))


def test_the_per_expert_path_is_refused_while_capturing(cp, monkeypatch):
    """A call past per_expert's threshold (lowered here to these small experts' FLOPs) takes it
    eagerly (its read-back synchronizes), never inside a capture: there the next kernel runs, within
    the same bounds."""
    import vtnumba.cuda
    from vtnumba.cuda import experts as gpu
    from vtnumba.cuda import grouped

    monkeypatch.setattr(grouped, "PER_EXPERT_MIN_FLOPS", 2 * 256 * (2 * I) * H)
    gu, _, gu_res, _ = _layer("dynamic")
    counts = [256] * E
    offsets = cp.asarray(_offsets(counts))
    rng = np.random.default_rng(13)
    x = rng.standard_normal((256 * E, H)).astype(np.float32)
    xd = cp.asarray(x)
    codes, scale = se._quantize_rows(xd, gu_res.weight, offsets, gpu)
    dev = gu_res.weight
    assert gpu.grouped_kernel_for(codes, scale, dev.data, dev.weight_scale, offsets, F32, None) == "per_expert"
    eager = seam.grouped_matmul_fp8(xd, gu_res, offsets, out_dtype=np.float32)
    step = vtnumba.cuda.capture(lambda a: seam.grouped_matmul_fp8(a, gu_res, offsets, out_dtype=np.float32), xd)
    replay = step(xd)
    host_codes, host_scale = se._quantize_rows(x, gu, _offsets(counts), cpu)
    # inside the capture the next kernel ran: wgmma's tiles on the H200 (the tensor-core bound)
    _assert_expert_g3(cp.asnumpy(replay), host_codes, host_scale, gu, _offsets(counts), tensor_core=True)
    _assert_expert_g3(cp.asnumpy(eager), host_codes, host_scale, gu, _offsets(counts), tensor_core=True)


@pytest.mark.parametrize("name", ["per_token", "per_group"])
def test_moe_fp8_on_torch_tensors_in_a_torch_cuda_graph(cp, name):
    torch = pytest.importorskip("torch")
    _, _, gu_res, dn_res = _layer(name)
    t = 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(t, H, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3)]
    rng = np.random.default_rng(14)
    ids, w = _routing(rng, t, 2)
    ids_t = torch.as_tensor(ids, device="cuda")
    w_t = torch.as_tensor(w, device="cuda")
    static_x = xs[0].clone()
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            seam.moe_fp8(static_x, gu_res, dn_res, ids_t, w_t)
            seam.moe_fp8(static_x, gu_res, dn_res, ids_t, w_t)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            static_out = seam.moe_fp8(static_x, gu_res, dn_res, ids_t, w_t)
        assert isinstance(static_out, torch.Tensor) and static_out.dtype == torch.bfloat16
        for x in xs[1:] + xs[:1]:
            eager = seam.moe_fp8(x, gu_res, dn_res, ids_t, w_t)
            static_x.copy_(x)
            graph.replay()
            torch.testing.assert_close(static_out, eager, rtol=0, atol=0)
    assert int(torch.count_nonzero(eager)) > 0


def test_empty_experts_and_no_tokens(cp):
    gu, dn, gu_res, dn_res = _layer("dynamic")
    rng = np.random.default_rng(15)
    x = rng.standard_normal((6, H)).astype(np.float32)
    ids = np.full((6, 2), 2, dtype=np.int64)  # every pair on expert 2 ...
    ids[:, 1] = -1  # ... or on none
    ids[0, 0] = E
    w = rng.uniform(0.1, 1, size=(6, 2)).astype(np.float32)
    got = cp.asnumpy(seam.moe_fp8(cp.asarray(x), gu_res, dn_res, cp.asarray(ids), cp.asarray(w)))
    want = seam.moe_fp8(x, gu, dn, ids, w)
    assert (got[0] == 0).all() and (want[0] == 0).all()  # token 0 routes nothing
    np.testing.assert_allclose(got, want, rtol=0, atol=0.05 * float(np.abs(want).max()))
    none = seam.moe_fp8(
        cp.zeros((0, H), np.float32), gu_res, dn_res, cp.zeros((0, 2), np.int64), cp.zeros((0, 2), np.float32)
    )
    assert none.shape == (0, H)
    ids[:] = -1  # nothing routed at all
    out = cp.asnumpy(seam.moe_fp8(cp.asarray(x), gu_res, dn_res, cp.asarray(ids), cp.asarray(w)))
    assert (out == 0).all()


# -- the bound call ---------------------------------------------------------------------------------


def _bf16_inputs(cp, seed, t, k=2):
    r = np.random.default_rng(seed)
    ids, w = _routing(r, t, k, empty=(seed % E,))
    return _device(cp, r.standard_normal((t, H)).astype(BF16)), cp.asarray(ids), cp.asarray(w)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_a_second_call_replays_the_bound_launches_bitwise(cp, name, monkeypatch):
    """The first cupy call of a signature runs the steps and binds them (a BoundMoe on the seam
    experts, under the call's key); later calls of that signature take the bound launches -- the
    steps cannot run (MoeCall is made to fail) -- and give the unbound steps' bytes on inputs the
    binding never saw."""
    from vtnumba.cuda.bound import BoundMoe

    _, _, gu_res, dn_res = _layer(name)
    x, ids, w = _bf16_inputs(cp, 0, 3)
    first = seam.moe_fp8(x, gu_res, dn_res, ids, w)
    key = se._cupy_moe_key(x, dn_res, ids, w, cp.ndarray)
    replay = se._bound_holder(gu_res).bound_calls[key]
    assert isinstance(replay, BoundMoe)
    from vtnumba.cuda import experts as gpu

    routed = ("routed_gate_up", "routed_down")
    if gpu.routed_wgmma_reason(H, I) is None:  # sm_90: the swapped wgmma pass's kernels
        routed = tuple(f"{k}_wgmma" for k in routed)
    want_ends = routed if name in ROUTED else ("_align", "combine")
    assert (replay.kernels[0], replay.kernels[-1]) == want_ends, replay.kernels
    later = [_bf16_inputs(cp, seed, 3) for seed in (1, 2, 3)]
    want = [se.MoeCall(*args[:1], gu_res, dn_res, *args[1:]).run() for args in [(x, ids, w)] + later]

    def steps_must_not_run(*args, **kwargs):
        raise AssertionError("the bound path should have run, not MoeCall")

    monkeypatch.setattr(se, "MoeCall", steps_must_not_run)
    got = [seam.moe_fp8(a, gu_res, dn_res, b, c) for a, b, c in [(x, ids, w)] + later]
    compared = 0
    for g, wv in zip([first] + got[1:], want):
        np.testing.assert_array_equal(cp.asnumpy(g).view(np.uint16), cp.asnumpy(wv).view(np.uint16))
        compared += int(cp.count_nonzero(wv.view(np.uint16)))
    np.testing.assert_array_equal(cp.asnumpy(got[0]).view(np.uint16), cp.asnumpy(first).view(np.uint16))
    assert compared > 0


def test_what_a_binding_refuses(cp, monkeypatch):
    """A call that reads the device on the host (a prefill-sized call: per_expert) or makes an array
    outside the scratch (int16 ids, widened by a cupy astype) is not bound: bind_moe says why, the
    seam keeps None under its key, and those calls keep giving the full path's bytes without
    trying to bind again."""
    from vtnumba.cuda import bound, grouped

    _, _, gu_res, dn_res = _layer("per_token")
    rng = np.random.default_rng(22)
    x, ids, w = _bf16_inputs(cp, 5, 3)
    ids16 = ids.astype(cp.int16)
    replay, why = bound.bind_moe(x, ids16, w, lambda: se.MoeCall(x, gu_res, dn_res, ids16, w).run())
    assert replay is None and "outside the steps' scratch" in why
    t = 512  # 1024 pairs over 8 experts: 128 rows an expert, at per_expert's threshold lowered to these experts
    monkeypatch.setattr(grouped, "PER_EXPERT_MIN_FLOPS", 2 * 128 * (2 * I) * H)
    big = cp.asarray(rng.standard_normal((t, H)).astype(np.float32))
    big_ids = cp.asarray(np.stack([rng.choice(E, 2, replace=False) for _ in range(t)]).astype(np.int64))
    big_w = cp.asarray(rng.uniform(0.1, 1, size=(t, 2)).astype(np.float32))
    replay, why = bound.bind_moe(big, big_ids, big_w, lambda: se.MoeCall(big, gu_res, dn_res, big_ids, big_w).run())
    assert replay is None and "per_expert" in why
    for args in ((x, ids16, w), (big, big_ids, big_w)):
        first = seam.moe_fp8(args[0], gu_res, dn_res, *args[1:])
        key = se._cupy_moe_key(args[0], dn_res, *args[1:], cp.ndarray)
        assert key in se._bound_holder(gu_res).bound_calls and se._bound_holder(gu_res).bound_calls[key] is None
        with monkeypatch.context() as patch:
            patch.setattr(se, "bind_moe_call", None)  # a second attempt would fail here
            again = seam.moe_fp8(args[0], gu_res, dn_res, *args[1:])
        np.testing.assert_array_equal(cp.asnumpy(again).view(np.uint16), cp.asnumpy(first).view(np.uint16))


def test_the_torch_experts_module_replays_its_bound_call_in_eager_and_in_a_graph(cp, monkeypatch):
    """vtnumba.torch.Fp8Experts on the GPU: its second call of a signature takes the bound launches
    straight from torch's tensors (no interop), bitwise the seam's steps; a torch.cuda.graph of it
    replays the eager bytes on new tokens."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import vtnumba.torch as vtt
    from vtnumba.torch._common import _view  # a cupy view of a tensor (bfloat16 through its bits)

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=2, num_hidden_layers=1
    )
    torch.manual_seed(0)
    module = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts(cfg)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.05)
        module.down_proj.normal_(0, 0.05)
    layer = vtt.convert(torch.nn.Sequential(module.to("cuda", torch.bfloat16)), "per_token")[0]
    t = 4
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(t, H, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    ids = torch.stack([torch.randperm(E, device="cuda", generator=gen)[:2] for _ in range(t)])
    w = torch.rand(t, 2, device="cuda", generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        gu, dn = layer._state(0)
        want = [se.MoeCall(_view(x), gu, dn, _view(ids), _view(w)).run() for x in xs]
        layer(xs[0], ids, w)  # the first call of the signature: the full path, then the binding
        key = se._cupy_moe_key(_view(xs[0]), dn, _view(ids), _view(w), cp.ndarray)
        assert se._bound_holder(gu).bound_calls[key] is not None
        monkeypatch.setattr(se, "MoeCall", None)  # the steps cannot run from here on
        for x, wv in zip(xs, want):
            y = layer(x, ids, w)
            assert y.dtype == torch.bfloat16 and y.shape == (t, H)
            np.testing.assert_array_equal(y.view(torch.int16).cpu().numpy(), cp.asnumpy(wv).view(np.int16))
        static_x = xs[0].clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = layer(static_x, ids, w)
        for x in xs[1:]:
            static_x.copy_(x)
            graph.replay()
            torch.testing.assert_close(static_out, layer(x, ids, w), rtol=0, atol=0)
    assert int(torch.count_nonzero(static_out)) > 0


# -- the routed decode (three launches, no align) ---------------------------------------------------


@pytest.mark.parametrize("t,k", [(1, 8), (2, 2), (4, 2)])
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_the_routed_decode_gives_the_aligned_steps_bytes(cp, name, t, k, monkeypatch):
    """At decode (T k <= ROUTED_MAX_PAIRS) moe_fp8 runs two launches (routed_gate_up, routed_down with
    the combine), and their result is the aligned steps' bytes: each pair's GEMVs are the mma.sync grouped
    GEMV's pass on the same codes (x and act quantized inside the launch as quantize_fp8 /
    silu_mul_quantize quantize them), the combine the combine kernel's arithmetic in the same order,
    whichever block of a token finishes last. The sentinels -1 and E route nothing."""
    _, _, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(40 + t * k)
    ids, w = _routing(rng, t, k, empty=() if k >= E else (3,))
    x = _device(cp, rng.standard_normal((t, H)).astype(BF16))
    ids, w = cp.asarray(ids), cp.asarray(w)
    monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_wgmma")  # the GEMV's pass: the aligned GEMV's arithmetic
    call = se.MoeCall(x, gu_res, dn_res, ids, w)
    assert [s for s, _ in call.steps] == ["routed_gate_up", "routed_down"], call.routed_reason
    got = call.run()
    # the aligned steps on the mma.sync grouped GEMV (sm_90 runs the wgmma one there by default)
    monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_gemv,wgmma_grouped_gemv")
    aligned = se.MoeCall(x, gu_res, dn_res, ids, w)
    assert [s for s, _ in aligned.steps][0] == "align" and "disabled" in aligned.routed_reason
    want = aligned.run()
    g, wv = cp.asnumpy(got).view(np.uint16), cp.asnumpy(want).view(np.uint16)
    assert np.count_nonzero(wv) > wv.size // 2
    np.testing.assert_array_equal(g, wv)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_the_routed_decode_is_near_the_cpu(cp, name):
    """One token, top-8 of the 8 experts: the routed result within the tolerance the seam's GPU
    steps meet against the CPU's moe_fp8 (tests/test_cudasim_experts.py), logits cosine ~ 1."""
    gu, dn, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(50)
    ids, w = _routing(rng, 1, 8, empty=())
    x = rng.standard_normal((1, H)).astype(BF16)
    want = seam.moe_fp8(x, gu, dn, ids, w).astype(np.float32)
    got = cp.asnumpy(seam.moe_fp8(_device(cp, x), gu_res, dn_res, cp.asarray(ids), cp.asarray(w)).view(np.uint16))
    got = got.view(BF16).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * float(np.abs(want).max()))
    cos = float(np.dot(got.ravel(), want.ravel()) / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cos > 0.999 and np.abs(want).max() > 0, cos


@pytest.mark.parametrize("routed_pass", ["wgmma", "mma.sync"])
def test_which_moe_decode_runs(cp, routed_pass, monkeypatch):
    """The choice pinned: routed up to 64 pairs (T = 8 at top-8) on sm_90's wgmma pass, up to
    ROUTED_MAX_PAIRS on the GEMV's (16 static and per-token, 32 for 128 x 128 blocks), for static,
    per-token and 128 x 128 blocks; aligned past it, for dynamic per-tensor, UE8M0 and MXFP8 (each with
    its reason)."""
    from vtnumba.cuda import experts as gpu

    if routed_pass == "mma.sync":
        monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_wgmma")
    elif (why_not := gpu.routed_wgmma_reason(H, I)) is not None:
        pytest.skip(why_not)
    x = cp.zeros((1, H), np.float32)
    assert gpu.ROUTED_MAX_PAIRS == {"static": 16, "per_token": 16, "per_group": 32}  # T <= 2 / 4 at top-8
    assert gpu.ROUTED_WGMMA_MAX_PAIRS == 64
    checked = 0
    for name in sorted(SCHEMES):
        _, _, gu_res, dn_res = _layer(name)
        gu = se._experts_for(gu_res, x, "gate_up")
        scheme = str(gu.activation_scheme)
        limit = gpu.routed_max_pairs(scheme, H, I) if name in ROUTED else 8
        if name in ROUTED:
            assert limit == (64 if routed_pass == "wgmma" else gpu.ROUTED_MAX_PAIRS[scheme]), (name, limit)
        for t, k in ((1, limit), (1, limit + 1)):
            ids = cp.zeros((t, k), np.int64)
            why = gpu.routed_reason(x, gu, se._experts_for(dn_res, x, "down"), ids)
            if name in ROUTED and t * k <= limit:
                assert why is None, (name, t, k, why)
            else:
                assert why, (name, t, k)
            checked += 1
    assert checked == 2 * len(SCHEMES)


@pytest.mark.parametrize("name", ["per_token", "per_group"])
@pytest.mark.parametrize("gate_up_config", ["r16_w4_d2", "r32_w4_d2", "r32_w2_d2"])
def test_every_routed_configuration_gives_the_aligned_bytes(cp, name, gate_up_config, monkeypatch):
    """The routed GEMVs in each configuration the sweep times (32 rows a block: gate_up's paired one
    pass over gate and up rows) give the aligned steps' bytes at one token of top-8."""
    from vtnumba.cuda.kernels import tc_gemv

    configs = {"gate_up": tc_gemv.ROUTED_GEMV_CONFIGS[gate_up_config], "down": tc_gemv.ROUTED_GEMV_CONFIGS["r32_w2_d2"]}
    _, _, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(60)
    ids, w = _routing(rng, 1, 8, empty=())
    x = _device(cp, rng.standard_normal((1, H)).astype(BF16))
    ids, w = cp.asarray(ids), cp.asarray(w)
    monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_gemv,wgmma_grouped_gemv")  # the mma.sync grouped GEMV
    want = cp.asnumpy(se.MoeCall(x, gu_res, dn_res, ids, w).run().view(np.uint16))
    monkeypatch.delenv("VT_DISABLE_KERNELS")
    monkeypatch.setattr(tc_gemv, "routed_config", lambda stage, block_scaled, wgmma=False: configs[stage])
    call = se.MoeCall(x, gu_res, dn_res, ids, w)
    assert call.routed_reason is None
    got = cp.asnumpy(call.run().view(np.uint16))
    assert np.count_nonzero(want) > want.size // 2
    np.testing.assert_array_equal(got, want)


# -- the swapped wgmma pass of the routed decode (sm_90) -------------------------------------------


def _wgmma_routed(h=H, inter=I):
    from vtnumba.cuda import experts as gpu

    why = gpu.routed_wgmma_reason(h, inter)
    if why is not None:
        pytest.skip(why)
    return gpu


WGMMA_CONFIG_NAMES = ("wg_s2", "wg_s3", "wg_s4", "wg_s6")


WIDE = 768  # H = I = 768: six K blocks, more than most rings hold (slots reused)
_WIDE_LAYERS = {}


def _wide_layer(name):
    """(gate_up, down) host Fp8Experts of scheme ``name`` at H = I = WIDE and their resident copies."""
    if name not in _WIDE_LAYERS:
        rng = np.random.default_rng(len(name) + 100)
        opts = SCHEMES[name]
        n = WIDE
        gu = seam.Fp8Experts.from_float((rng.standard_normal((E, 2 * n, n)) / np.sqrt(n)).astype(np.float32), **opts)
        dn = seam.Fp8Experts.from_float((rng.standard_normal((E, n, n)) / np.sqrt(n)).astype(np.float32), **opts)
        _WIDE_LAYERS[name] = (gu, dn, seam.ResidentFp8(gu, "cuda:0"), seam.ResidentFp8(dn, "cuda:0"))
    return _WIDE_LAYERS[name]


@pytest.mark.parametrize("config", ["chosen", *WGMMA_CONFIG_NAMES])
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_the_wgmma_routed_pass_holds_the_tensor_core_bound(cp, name, config, monkeypatch):
    """On sm_90 the routed decode's pass is the swapped wgmma one (the weight rows wgmma's M, the token
    its N): each pair's down GEMV, on the act rows its gate_up made, within the tensor-core bound of the
    float64 reference of those rows quantized on the CPU; the combine of those y the CPU's bytes. In the
    configuration chosen and in each the sweep times, at H = I = 768 (six K blocks: the rings of 2-4
    slots are refilled)."""
    gpu = _wgmma_routed(WIDE, WIDE)
    from vtnumba.cuda.kernels import tc_gemv

    assert set(WGMMA_CONFIG_NAMES) == set(tc_gemv.ROUTED_WGMMA_CONFIGS)
    if config != "chosen":
        monkeypatch.setattr(tc_gemv, "ROUTED_WGMMA_CHOICE", {"gate_up": config, "down": config})
    _, dn, gu_res, dn_res = _wide_layer(name)
    rng = np.random.default_rng(70)
    ids_h = rng.permutation(E).reshape(1, E).astype(np.int64)  # every expert once, shuffled slots
    w_h = rng.uniform(0.1, 1.0, size=(1, E)).astype(np.float32)
    x = _device(cp, rng.standard_normal((1, WIDE)).astype(BF16))
    ids, w = cp.asarray(ids_h), cp.asarray(w_h)
    gu_d, dn_d = se._experts_for(gu_res, x, "gate_up"), se._experts_for(dn_res, x, "down")
    assert gpu.routed_reason(x, gu_d, dn_d, ids) is None
    act, arrivals = gpu.routed_gate_up(x, gu_d, ids, WIDE, dn.block_size is not None)
    out, y = gpu.routed_down(act, arrivals, dn_d, ids, w, np.float32)
    order = np.argsort(ids_h[0])  # the pairs in expert order: expert e's row is pair order[e]
    act_h, y_slots = cp.asnumpy(act), cp.asnumpy(y)
    offsets = _offsets(np.ones(E, np.int64))
    codes, scale = se._quantize_rows(act_h[order], dn, offsets, se._backend("cpu"))
    compared = _assert_expert_g3(y_slots[order], codes, se._row_scale(scale, dn), dn, offsets, tensor_core=True)
    assert compared > E * WIDE // 2
    want = cpu.moe_combine(y_slots, np.arange(E, dtype=np.int32).reshape(1, E), w_h, np.float32)
    np.testing.assert_array_equal(cp.asnumpy(out), want)


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_the_wgmma_routed_decode_takes_up_to_eight_tokens(cp, name, t, monkeypatch):
    """The wgmma pass's reach (ROUTED_WGMMA_MAX_PAIRS = 64: T = 8 at top-8), run: T = 2, 4 and 8
    tokens of top-8 over the 8 experts (every expert routed by several tokens, the sentinels -1 and E
    among the slots) take the two routed wgmma launches, and the layer's output is within the
    tolerance the seam's GPU steps meet against the CPU's moe_fp8, cosine ~ 1, token by token."""
    gpu = _wgmma_routed()
    from vtnumba.cuda.kernels import tc_gemv

    gu, dn, gu_res, dn_res = _layer(name)
    rng = np.random.default_rng(80 + t)
    ids, w = _routing(rng, t, E, empty=())
    assert ids.size <= gpu.ROUTED_WGMMA_MAX_PAIRS and ids.size == 8 * t
    x = rng.standard_normal((t, H)).astype(BF16)
    seen = []
    real = tc_gemv.routed_launch

    def spy(*args, **kwargs):
        launch = real(*args, **kwargs)
        seen.append(getattr(launch[0], "kernel", launch[0]).pyfunc.__name__)
        return launch

    monkeypatch.setattr(tc_gemv, "routed_launch", spy)
    call = se.MoeCall(_device(cp, x), gu_res, dn_res, cp.asarray(ids), cp.asarray(w))
    assert [s for s, _ in call.steps] == ["routed_gate_up", "routed_down"], call.routed_reason
    got = cp.asnumpy(call.run().view(np.uint16)).view(BF16).astype(np.float32)
    assert seen == ["routed_gate_up_wgmma", "routed_down_wgmma"]
    want = seam.moe_fp8(x, gu, dn, ids, w).astype(np.float32)
    assert want.shape == got.shape == (t, H) and np.abs(want).max() > 0
    for row in range(t):
        scale = float(np.abs(want[row]).max())
        np.testing.assert_allclose(got[row], want[row], rtol=0, atol=0.03 * scale)
        cos = float(np.dot(got[row], want[row]) / (np.linalg.norm(got[row]) * np.linalg.norm(want[row])))
        assert cos > 0.999, (row, cos)


def test_which_routed_pass_runs(cp, monkeypatch):
    """The pass pinned by name: the swapped wgmma one on sm_90 by default (``routed_*_wgmma`` kernels);
    the tensor-core GEMV's under the lever VT_DENSE_CUBLASLT_FP8=0 or VT_DISABLE_KERNELS=routed_wgmma,
    each with its reason; and the two agree within the tensor cores' reach at the layer's output."""
    gpu = _wgmma_routed()
    from vtnumba.cuda.kernels import tc_gemv

    _, _, gu_res, dn_res = _layer("per_token")
    rng = np.random.default_rng(71)
    ids, w = (cp.asarray(a) for a in _routing(rng, 1, E, empty=()))
    x = _device(cp, rng.standard_normal((1, H)).astype(BF16))
    seen = []
    real = tc_gemv.routed_launch

    def spy(*args, **kwargs):
        launch = real(*args, **kwargs)
        kernel = getattr(launch[0], "kernel", launch[0])  # (a DynamicSharedKernel wraps it)
        seen.append(kernel.pyfunc.__name__)
        return launch

    monkeypatch.setattr(tc_gemv, "routed_launch", spy)

    def layer():
        bits = cp.asnumpy(se.MoeCall(x, gu_res, dn_res, ids, w).run().view(np.uint16))
        return bits.view(BF16).astype(np.float32)

    fast = layer()
    assert seen == ["routed_gate_up_wgmma", "routed_down_wgmma"]
    for env, value in (("VT_DENSE_CUBLASLT_FP8", "0"), ("VT_DISABLE_KERNELS", "routed_wgmma")):
        monkeypatch.setenv(env, value)
        assert gpu.routed_wgmma_reason(H, I), env
        seen.clear()
        strict = layer()
        assert seen == ["routed_gate_up", "routed_down"], env
        monkeypatch.delenv(env)
    scale = float(np.abs(strict).max())
    assert scale > 0 and np.abs(fast - strict).max() <= 0.02 * scale
