"""The prepared host call (seam.host_linear) behind Fp8Linear's CPU forward: the same bytes as the
full path of seam.matmul_fp8 for every scheme, input dtype, output dtype and shape; the full path
is not run; writes to the buffers are seen; and its host work stays small, counted in Python calls
(a count, not a timing: the figures are in benchmarks/RESULTS.md)."""

import copy
import sys

import numpy as np
import pytest

from vtnumba import seam
from vtnumba._interop import to_native, to_torch
from vtnumba.cpu import block, gemm, paths
from vtnumba.seam import matmul as seam_matmul
from vtnumba.seam.host_linear import HostLinear

torch = pytest.importorskip("torch")
vtt = pytest.importorskip("vtnumba.torch")
from vtnumba.torch import custom_ops  # noqa: E402
from vtnumba.torch._common import _NUMPY_OUT  # noqa: E402

nn = torch.nn

SCHEMES = {
    "dynamic": {},
    "static": {"input_scale": 0.02},
    "per_token": {},
    "per_group": {"block_size": (32, 64)},  # K = 200: three 64-wide groups and a short one
    "per_group_ue8m0": {"block_size": (16, 32), "scale_ue8m0": True},
}
N, K = 48, 200


def _layer(name, bias=True):
    torch.manual_seed(7)
    kwargs = dict(SCHEMES[name])
    scheme = "per_group" if name.startswith("per_group") else name
    return vtt.Fp8Linear.from_linear(nn.Linear(K, N, bias=bias), scheme, **kwargs)


def _x(*shape, dtype=torch.float32):
    rng = np.random.default_rng(sum(shape))
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype)


@pytest.fixture
def no_full_path(monkeypatch):
    """Fails a forward that falls back to the full path; counts the prepared calls made."""
    calls = []
    real = HostLinear.__call__

    def full(*args, **kwargs):
        raise AssertionError("the CPU forward ran seam.matmul_fp8's full path, not its prepared call")

    def counted(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(custom_ops, "matmul_fp8", full)
    monkeypatch.setattr(HostLinear, "__call__", counted)
    return calls


def _bits(t):
    """A tensor's bytes as integers: bitwise equality, NaN payloads and signed zeros included."""
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16).numpy()


def _full_path(layer, x, out_dtype=None):
    """The full path of seam.matmul_fp8 (every check, vt.quantize_fp8, vt.scaled_mm) on the layer's
    weight: what the prepared call must equal."""
    xs = to_native(x.detach(), "x")
    out = None if out_dtype is None else _NUMPY_OUT[out_dtype]
    return to_torch(seam_matmul._matmul_fp8(xs, layer.fp8_weight, out)[0])


@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_prepared_call_is_the_full_path_bitwise(name, no_full_path, monkeypatch):
    layer = _layer(name)
    blas_rows = gemm.SMALL_M_ELEMENTS // K + 3  # past the small_m kernels' bound: the blas kernels
    # the register tiles keep a block-scaled GEMM of this small weight at any M (block.takes_small_m)
    monkeypatch.setattr(block, "TILED_MAX_WEIGHT", 0)
    cases = [
        (_x(1, K), None),  # decode: the M = 1 kernels
        (_x(2, 3, K), None),  # [..., K]: flattened, then back
        (_x(K), None),  # one row as [K]
        (_x(2, 0, K), None),  # no rows: an empty [2, 0, N]
        (_x(5, K, dtype=torch.bfloat16), None),
        (_x(5, K, dtype=torch.float16), torch.float32),
        (_x(4, K), torch.bfloat16),
        (_x(K, 6).t(), None),  # strided: the kernels read a contiguous copy
        (_x(blas_rows, K), None),
    ]
    with torch.no_grad():
        for x, out_dtype in cases:
            layer.out_dtype = out_dtype
            y = layer(x)
            want = _full_path(layer, x, out_dtype)
            assert y.shape == (*x.shape[:-1], N) and y.dtype == (out_dtype or x.dtype)
            np.testing.assert_array_equal(_bits(y), _bits(want))
    assert len(no_full_path) == len(cases)  # every case ran the prepared call
    kernels = {layer.kernels(x)[1] for x, _ in cases}
    assert {"cpu small_m", "cpu blas"} <= kernels  # both kernel families were compared


@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_tiles_shortcut_is_the_full_path_bitwise(name, no_full_path):
    """The prepared call's register-tile shortcut (``HostLinear.tiles``: the tiled kernel called on the
    quantized activation without the GEMM entry's conversions): bitwise the full path, taken from 16
    rows on where the path runs the tiles, declined below and on the other paths."""
    layer = _layer(name)
    with torch.no_grad():
        layer(_x(2, K))  # makes the prepared call
        host = layer._host_linear()
        shortcut, taken = host.tiles, []
        assert shortcut is not None

        def recorded(codes, scale_a, out_dtype):
            y = shortcut(codes, scale_a, out_dtype)
            taken.append((len(codes), y is not None))
            return y

        host.tiles = recorded
        compared = 0
        for path in paths.runnable():
            with paths.use(path.name):
                taken.clear()
                for x, out_dtype in ((_x(40, K), None), (_x(1, 16, K), torch.bfloat16), (_x(15, K), None)):
                    layer.out_dtype = out_dtype
                    y = layer(x)
                    np.testing.assert_array_equal(_bits(y), _bits(_full_path(layer, x, out_dtype)))
                    compared += y.numel()
                assert taken == [(40, path.register_tiles), (16, path.register_tiles), (15, False)], path.name
    assert compared >= 71 * N


def test_writes_to_the_buffers_are_seen(no_full_path):
    """In place (``copy_``, ``mul_``, a static scale's ``fill_``, under inference mode too) the views
    see the new values; a replaced buffer or a module-wide dtype change makes the call again."""
    x = _x(3, K)
    with torch.no_grad():
        for name in ("static", "per_group", "per_token"):
            layer = _layer(name)
            before = layer(x)
            layer.weight_scale.mul_(2)
            layer.bias.add_(1)
            after = layer(x)
            assert not torch.equal(before, after)
            torch.testing.assert_close(after, _full_path(layer, x), rtol=0, atol=0)
            layer.weight.copy_(_layer(name).weight.flip(0))
            torch.testing.assert_close(layer(x), _full_path(layer, x), rtol=0, atol=0)
            layer.bias = torch.zeros(N)  # a new buffer
            torch.testing.assert_close(layer(x), _full_path(layer, x), rtol=0, atol=0)
            layer.to(torch.bfloat16)  # the bias follows the module: bfloat16, widened per call
            assert layer.bias.dtype == torch.bfloat16
            torch.testing.assert_close(layer(x), _full_path(layer, x), rtol=0, atol=0)
    layer = _layer("static")
    with torch.inference_mode():
        first = layer(x)
        layer.input_scale.fill_(0.05)
        second = layer(x)
    assert not torch.equal(first, second)
    with torch.no_grad():
        torch.testing.assert_close(second, _full_path(layer, x), rtol=0, atol=0)
    with torch.inference_mode():
        scale = torch.tensor([0.02])  # made under inference mode: no version counter
        layer.input_scale = scale
        third = layer(x)
        scale.fill_(0.05)
        assert torch.equal(layer(x), second) and torch.equal(third, first)


def test_a_deep_copy_reads_its_own_buffers(no_full_path):
    layer = _layer("per_token")
    x = _x(2, K)
    with torch.no_grad():
        want = layer(x)  # the prepared call is made here, on the original's buffers
        twin = copy.deepcopy(layer)
        twin.weight_scale.mul_(4)
        np.testing.assert_array_equal(layer(x).numpy(), want.numpy())
        np.testing.assert_array_equal(twin(x).numpy(), _full_path(twin, x).numpy())
        assert not torch.equal(twin(x), want)


def test_what_the_prepared_call_does_not_take_runs_the_full_path():
    """float64 x (cast to float32 by the full path)."""
    layer = _layer("per_token")
    x = _x(3, K)
    with torch.no_grad():
        np.testing.assert_array_equal(layer(x.double()).numpy(), layer(x).numpy())
    assert HostLinear.of(_layer("dynamic").fp8_weight) is not None


E8M0_WEIGHTS = {
    "mxfp8": {"block_size": (1, 32), "scale_format": "e8m0"},
    "mxfp8_floor": {"block_size": (1, 32), "scale_format": "e8m0", "scale_rounding": "floor"},
    "e8m0_weight_blocks": {"block_size": (16, 32), "scale_format": "e8m0"},  # float32 activation scales
}


@pytest.mark.parametrize("name", list(E8M0_WEIGHTS))
def test_e8m0_weights_take_the_prepared_call_bitwise(name, monkeypatch):
    """seam.matmul_fp8 on numpy with E8M0-scaled weights (MXFP8's kernels, or the scales decoded):
    the prepared call, the full path's bytes, at every CPU kernel's row count (K = 200: a short last
    32-wide group)."""
    rng = np.random.default_rng(11)
    w = seam.Fp8Weight.from_float(rng.standard_normal((N, K)).astype(np.float32), **E8M0_WEIGHTS[name])
    assert w.weight_scale.dtype == np.uint8
    calls = []
    real = HostLinear.__call__
    monkeypatch.setattr(HostLinear, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    monkeypatch.setattr(block, "TILED_MAX_WEIGHT", 0)  # the last row count takes the blas kernels here too
    rows = (1, 5, 40, gemm.SMALL_M_ELEMENTS // K + 3)
    for m in rows:
        x = (rng.standard_normal((m, K)) * np.exp(rng.uniform(-6, 6, (m, 1)))).astype(np.float32)
        y = seam.matmul_fp8(x, w)
        want = seam_matmul._matmul_fp8(x, w, None)[0]
        assert y.shape == want.shape == (m, N)
        np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    assert len(calls) == len(rows)  # every call took the prepared path


# A warmed CPU forward's Python function calls (sys.setprofile 'call' events), M = 4, on 2026-12-06:
# 48-60 by scheme, against 74-87 for the full path of seam.matmul_fp8 alone (on numpy, no torch
# layer around it) and 136-149 for the torch forward through it before the prepared call. A change
# that puts the checks back on every call, or another layer of wrappers, fails here.
MAX_PYTHON_CALLS = 70


@pytest.mark.parametrize("name", ["dynamic", "static", "per_token", "per_group"])
def test_a_cpu_forward_makes_few_python_calls(name):
    layer = _layer(name)
    x = _x(4, K)
    counts = []

    def count(frame, event, arg):
        if event == "call":
            counts.append(frame.f_code.co_name)

    with torch.no_grad():
        layer(x), layer(x)
        sys.setprofile(count)
        try:
            layer(x)
        finally:
            sys.setprofile(None)
        full = []  # the full path alone, on numpy: what the ceiling must tell apart
        xs, w = x.numpy(), layer.fp8_weight
        seam_matmul._matmul_fp8(xs, w)
        sys.setprofile(lambda frame, event, arg: full.append(1) if event == "call" else None)
        try:
            seam_matmul._matmul_fp8(xs, w)
        finally:
            sys.setprofile(None)
    assert "__call__" in counts and "quantize_host" in counts  # the prepared call ran, and was counted
    assert len(counts) <= MAX_PYTHON_CALLS < len(full), (len(counts), len(full))


@pytest.mark.parametrize("name", list(SCHEMES))
def test_seam_matmul_on_numpy_takes_the_prepared_call(name, monkeypatch):
    """seam.matmul_fp8 with numpy x and a host weight: the prepared call kept on the weight, the
    full path's bytes, for 1-D, 2-D and 3-D x; a weight whose codes were released after an upload
    drops it and is refused as before."""
    w = _layer(name).fp8_weight
    w = seam.Fp8Weight(
        w.data.copy(),
        w.weight_scale.copy(),
        input_scale=w.input_scale,
        bias=w.bias.copy(),
        activation_scheme=w.activation_scheme,
        block_size=w.block_size,
        scale_ue8m0=w.scale_ue8m0,
    )
    calls = []
    real = HostLinear.__call__
    monkeypatch.setattr(HostLinear, "__call__", lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(5)
    for shape, dtype, out in (
        ((K,), np.float32, None),
        ((3, K), np.float16, "bfloat16"),
        ((2, 2, K), np.float32, None),
    ):
        x = rng.standard_normal(shape).astype(dtype)
        y = seam.matmul_fp8(x, w, out)
        want = seam_matmul._matmul_fp8(x, w, out)[0]
        assert y.shape == want.shape == (*shape[:-1], N) and y.dtype == want.dtype
        np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))
    assert len(calls) == 3 and isinstance(w.host_call, HostLinear)
    seam.ResidentFp8(w, "cpu", release_host=True)
    assert w.host_call is None
    with pytest.raises(ValueError, match="released"):
        seam.matmul_fp8(np.ones((1, K), np.float32), w)
    assert len(calls) == 3
