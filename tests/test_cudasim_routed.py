"""The routed MoE decode (vtnumba.cuda.experts.routed_*: two launches, no align) under the CUDA
simulator. Each pair is checked bit for bit against the fused tensor-core GEMV run alone on that
token's row and that expert (the routed kernels run its pass on views, so every sum is added in the
same order): the gate and up rows, SiLU-and-multiply as ``silu_mul`` gives it, the down row; the
combine in down's launch as the CPU's on the same rows; and the whole ``seam.moe_fp8`` near the
CPU's. Ids outside [0, E) route nothing. Tiny shapes: the simulator runs every thread as a Python thread.

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q -m cudasim tests/test_cudasim_routed.py
"""

import ml_dtypes
import numpy as np
import pytest

from vtnumba.cpu import experts as cpu

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
BF16 = np.dtype(ml_dtypes.bfloat16)

# (H, I, Fp8Experts options): the three routed schemes; blocks need 128-multiples
SCHEMES = {
    "per_token": (32, 16, dict(activation_scheme="per_token", per_channel=True)),
    "static": (32, 16, dict(input_scale=[0.02, 0.03, 0.01, 0.02])),
    "per_group": (128, 128, dict(block_size=(128, 128))),
}


@pytest.fixture()
def gpu(monkeypatch):
    from vtnumba.cuda import experts

    monkeypatch.setattr(experts, "SIMULATE_ROUTED", True)
    return experts


def _case(name, t=1, k=2, e=4):
    from vtnumba import seam

    h, i, opts = SCHEMES[name]
    rng = np.random.default_rng(len(name))
    gu = seam.Fp8Experts.from_float(rng.standard_normal((e, 2 * i, h)).astype(np.float32) * 0.2, **opts)
    dn = seam.Fp8Experts.from_float(rng.standard_normal((e, h, i)).astype(np.float32) * 0.2, **opts)
    x = (rng.standard_normal((t, h)) * 2).astype(np.float32).astype(BF16)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int64)
    w = rng.uniform(0.1, 1, size=(t, k)).astype(np.float32)
    return gu, dn, x, ids, w


def _fused_alone(x_row, ex, e, rows):
    """The fused tensor-core GEMV of x_row [1, K] by expert e's weight rows ``rows`` alone, float32."""
    from vtnumba.cuda.kernels import tc_gemv

    data, ws = ex.data[e][rows], ex.weight_scale
    scheme = str(ex.activation_scheme)
    if ex.block_size is not None:
        blocks = ws[e][rows.start // 128 : -(-rows.stop // 128)]
        return tc_gemv.fused_linear(x_row, data, None, None, False, None, np.float32, None, None, blocks)
    sb = ws[e][rows] if ws.ndim == 2 else ws[e : e + 1]
    static = np.float32(ex.input_scale[e]) if scheme == "static" else None
    return tc_gemv.fused_linear(x_row, data, sb, static, scheme == "per_token", None, np.float32, None, None)


@pytest.mark.parametrize(
    "name,paired", [(name, False) for name in sorted(SCHEMES)] + [("per_token", True)], ids=lambda v: str(v)
)
def test_routed_pairs_are_the_fused_gemv_alone(gpu, name, paired, monkeypatch):
    """``paired``: gate_up as one pass over a tile of gate rows and the same tile of up rows (a
    configuration of 32 rows a block), the same bits as two passes."""
    from vtnumba.cuda.kernels import tc_gemv

    if paired:
        configs = {"gate_up": tc_gemv.GEMV_CONFIGS["sim_r32_w2_d2"], "down": tc_gemv.GEMV_CONFIGS["sim_r16_w2_d2"]}
        monkeypatch.setattr(tc_gemv, "routed_config", lambda stage, block_scaled, wgmma=False: configs[stage])
    # every array the steps make starts poisoned (NaN, or -7 for the counters gate_up must zero)
    from vtnumba.cuda import steps

    monkeypatch.setattr(
        steps,
        "empty",
        lambda shape, dtype, make=None: np.full(shape, np.nan if np.dtype(dtype).kind == "f" else -7, dtype),
    )
    gu, dn, x, ids, w = _case(name)
    assert gpu.routed_reason(x, gu, dn, ids) is None
    ids[0, 1] = -1  # a pair that routes nothing
    act, arrivals = gpu.routed_gate_up(x, gu, ids, dn.shape[1], dn.block_size is not None)
    out, y = gpu.routed_down(act, arrivals, dn, ids, w, BF16)
    np.testing.assert_array_equal(arrivals, 2)  # each of the token's column tiles counted its k = 2 blocks
    e = int(ids[0, 0])
    inter = act.shape[1]
    gate = _fused_alone(x[0:1], gu, e, slice(0, inter))
    up = _fused_alone(x[0:1], gu, e, slice(inter, 2 * inter))
    want_act = gpu.silu_mul(np.concatenate([gate, up], axis=1), np.array([0, 1], np.int32))
    np.testing.assert_array_equal(act[0:1].view(np.uint32), want_act.view(np.uint32))
    want_y = _fused_alone(act[0:1], dn, e, slice(0, dn.shape[1]))
    np.testing.assert_array_equal(y[0:1].view(np.uint32), want_y.view(np.uint32))
    assert np.count_nonzero(want_y) > want_y.size // 2
    want = cpu.moe_combine(y, np.array([[0, -1]], np.int32), w, BF16)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    # both pairs routed: the last of each column tile's two blocks sums both rows, the CPU's combine
    ids[0, 1] = (e + 1) % gu.shape[0]
    act, arrivals = gpu.routed_gate_up(x, gu, ids, dn.shape[1], dn.block_size is not None)
    out, y = gpu.routed_down(act, arrivals, dn, ids, w, BF16)
    assert not np.isnan(y).any()
    want = cpu.moe_combine(y, np.array([[0, 1]], np.int32), w, BF16)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("name", ["per_token", "per_group"])
def test_moe_fp8_routes_a_decode_call_in_two_steps(gpu, name, monkeypatch):
    from vtnumba import seam
    from vtnumba.seam import experts as seam_experts

    gu, dn, x, ids, w = _case(name)
    want = seam.moe_fp8(x, gu, dn, ids, w)  # the CPU's
    monkeypatch.setattr(seam_experts, "_backend", lambda device: gpu)
    call = seam_experts.MoeCall(x, gu, dn, ids, w)
    assert [s for s, _ in call.steps] == ["routed_gate_up", "routed_down"], call.routed_reason
    got = call.run()
    assert got.dtype == want.dtype and got.shape == want.shape
    wf = want.astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), wf, rtol=0, atol=0.03 * float(np.abs(wf).max()))
    assert np.abs(wf).max() > 0


def test_routed_reasons(gpu):
    from vtnumba import seam

    gu, dn, x, ids, w = _case("per_token")
    assert gpu.routed_reason(x, gu, dn, np.zeros((8, 2), np.int64)) is None  # 16 per-token pairs
    assert "routed pairs" in gpu.routed_reason(x, gu, dn, np.zeros((17, 1), np.int64))
    dyn = seam.Fp8Experts.from_float(np.ones((4, 32, 16), np.float32))
    assert "dynamic" in gpu.routed_reason(x, gu, dyn, ids)
    assert "int32 or int64" in gpu.routed_reason(x, gu, dn, ids.astype(np.int16))
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("VT_DISABLE_KERNELS", "routed_gemv")
    try:
        assert "disabled" in gpu.routed_reason(x, gu, dn, ids)
    finally:
        monkeypatch.undo()
