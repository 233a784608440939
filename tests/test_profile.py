"""vtnumba.profile: the timing method per device, the records' figures and views, the roofline."""

import sys
import time

import numpy as np
import pytest

from vtnumba import profile, seam


def test_cpu_timing_warms_up_then_takes_the_median():
    calls = []

    def op(delay):
        calls.append(delay)
        time.sleep(delay)

    rec = profile.profile_op(op, 0.002, repeats=5, warmup=2, name="sleep")
    assert len(calls) == 2 + 5
    assert rec.device == "cpu" and rec.method == "median of repeats" and rec.repeats == 5
    assert 0.002 <= rec.min_s <= rec.time_s < 1.0
    assert rec.host_s is None and rec.gflops is None and rec.intensity is None


def test_rates_follow_from_flops_and_bytes():
    rec = profile.ProfileRecord("x", "cpu", "median of repeats", time_s=0.5, min_s=0.4, repeats=3, flops=4e9, bytes=1e9)
    assert rec.gflops == pytest.approx(8.0)
    assert rec.gbytes_per_s == pytest.approx(2.0)
    assert rec.intensity == pytest.approx(4.0)
    d = rec.as_dict()
    assert d["gflops"] == pytest.approx(8.0) and d["name"] == "x"


def _layer(m=8, n=48, k=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32)


def test_profile_linear_fp8_counts_one_byte_per_weight():
    x, w = _layer()
    rec = profile.profile_linear(seam.Fp8Weight.from_float(w), x, repeats=3)
    m, k = x.shape
    n = w.shape[0]
    assert rec.shape == f"{m}x{n}x{k}" and rec.name == "fp8_w8a8"
    assert rec.flops == 2 * m * n * k
    assert rec.bytes == m * k * 4 + n * k * 1 + m * n * 4


def test_profile_linear_float_weight_and_methods():
    x, w = _layer()
    rec = profile.profile_linear(w, x, repeats=3, name="f32")
    assert rec.name == "f32" and rec.bytes == x.size * 4 + w.size * 4 + x.shape[0] * w.shape[0] * 4
    method = seam.make_linear_method(seam.ResidentFp8(seam.Fp8Weight.from_float(w), "cpu"))
    rec = profile.profile_linear(method, x, repeats=3, out_dtype="bfloat16")
    assert rec.bytes == x.size * 4 + w.size + x.shape[0] * w.shape[0] * 2  # bf16 output


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="fast"), "method must be 'queued' or 'graph'"),
        (dict(repeats=0), "repeats must be an int >= 1"),
        (dict(warmup=0), "warmup must be an int >= 1"),
        (dict(device="tpu"), "device must be 'cpu' or 'cuda'"),
    ],
)
def test_profile_op_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        profile.profile_op(lambda: None, **kwargs)


def test_profile_linear_rejects_a_k_mismatch():
    x, w = _layer()
    with pytest.raises(ValueError, match=r"x must have shape \(M, 64\)"):
        profile.profile_linear(seam.Fp8Weight.from_float(w), x[:, :32])
    with pytest.raises(TypeError, match="weight must be"):
        profile.profile_linear("not a weight", x)


def _results():
    return profile.ProfileResults(
        [
            profile.ProfileRecord(
                "fp8 <dyn>", "cpu", "median of repeats", 1e-3, 9e-4, 5, flops=2e6, bytes=1e5, shape="8x48x64"
            ),
            profile.ProfileRecord("sgemm", "cpu", "median of repeats", 2e-3, 1e-3, 5, flops=2e6, bytes=4e5),
        ]
    )


def test_table_text_and_html():
    res = _results()
    text = res.table()
    assert "fp8 <dyn>" in text and "GFLOP/s" in text and "2.0" in text  # 2e6 flops / 1 ms
    assert "host (us)" not in text  # a column nobody has is left out
    page = res._repr_html_()
    assert page.startswith("<table>") and page.count("<tr>") == 3
    assert "fp8 &lt;dyn&gt;" in page and "<dyn>" not in page  # names are escaped
    assert res[0]._repr_html_().count("<tr>") == 2


def test_to_pandas():
    pd = pytest.importorskip("pandas")
    df = _results().to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df["name"]) == ["fp8 <dyn>", "sgemm"]
    assert df["gflops"].tolist() == pytest.approx([2.0, 1.0])


def test_to_pandas_without_pandas_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(profile.MissingDependencyError, match=r"pip install 'vtnumba\[pandas\]'"):
        _results().to_pandas()


def test_measure_ceilings_cpu():
    c = profile.measure_ceilings("cpu", size_mb=8, gemm_n=256, repeats=2)
    assert c.device == "cpu" and c.copy_gbytes_per_s > 0 and c.peak_gflops > 0
    assert c.peak_label == "numpy sgemm 256^3"
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        profile.measure_ceilings("tpu")


def test_roofline_plot(tmp_path):
    pytest.importorskip("matplotlib")
    ceilings = profile.Ceilings("cpu", copy_gbytes_per_s=20.0, peak_gflops=100.0, peak_label="sgemm")
    png = tmp_path / "r.png"
    fig = _results().roofline(ceilings, path=png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and len(ax.collections) == 2  # one point per record
    ridge = ax.lines[0].get_ydata()
    assert max(ridge) == pytest.approx(100.0) and min(ridge) < 100.0  # the roof and the slope
    with pytest.raises(ValueError, match="at least one record with flops and bytes"):
        profile.roofline_plot([profile.ProfileRecord("t", "cpu", "m", 1.0, 1.0, 1)], ceilings)


def test_roofline_draws_each_measured_peak(tmp_path):
    """On the GPU the half-precision roof stands beside the FP8 one (measure_ceilings' extra peaks)."""
    pytest.importorskip("matplotlib")
    fp8, f16, f32 = "vtnumba scaled_mm FP8 8192^3", "cuBLAS hgemm (f16) 8192^3", "cuBLAS sgemm 8192^3"
    ceilings = profile.Ceilings(
        "cuda", copy_gbytes_per_s=4000.0, peak_gflops=1.2e6, peak_label=fp8, extra={f32: 5e4, f16: 6e5, fp8: 1.2e6}
    )
    fig = _results().roofline(ceilings, path=tmp_path / "r.png")
    ax = fig.axes[0]
    assert [max(line.get_ydata()) for line in ax.lines] == pytest.approx([1.2e6, 5e4, 6e5])
    labels = [t.get_text() for t in ax.texts]
    assert any(t.startswith(f16) for t in labels) and any(t.startswith(fp8) for t in labels)
    # a peak that could not be measured (0, measure_ceilings on a GPU without FP8) draws no roof
    lacking = profile.Ceilings("cuda", 4000.0, 6e5, f16, extra={f16: 6e5, "FP8 unavailable (RuntimeError)": 0.0})
    assert len(_results().roofline(lacking).axes[0].lines) == 1


def test_roofline_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    ceilings = profile.Ceilings("cpu", 20.0, 100.0, "sgemm")
    with pytest.raises(profile.MissingDependencyError, match=r"pip install 'vtnumba\[plot\]'"):
        _results().roofline(ceilings)


def test_gpu_ceilings_without_a_gpu():
    reason = profile.gpu_unavailable_reason()
    if reason is None:
        pytest.skip("a usable GPU is present")
    with pytest.raises(RuntimeError, match="needs a usable GPU"):
        profile.measure_ceilings("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["queued", "graph"])
def test_gpu_timing(method):
    import cupy as cp

    x, w = _layer(m=16, n=1024, k=1024)
    weight = seam.ResidentFp8(seam.Fp8Weight.from_float(w), "cuda")
    xd = cp.asarray(x)
    rec = profile.profile_linear(weight, xd, repeats=20, method=method)
    assert rec.device == "cuda" and rec.method == method
    assert rec.time_s > 0 and rec.host_s is not None and rec.host_s > 0
    # the device time of a GEMM reading 1 MiB of weight is microseconds, not the host's launch cost
    assert rec.time_s < 1e-3
    copy = profile.profile_op(
        cp.copyto,
        cp.empty(1 << 24, cp.float32),
        cp.ones(1 << 24, cp.float32),
        bytes=2 * 4 * (1 << 24),
        repeats=20,
        method=method,
    )
    assert 100 < copy.gbytes_per_s < 10_000  # an H200 copies at a few TB/s


@pytest.mark.gpu
def test_gpu_ceilings():
    c = profile.measure_ceilings("cuda", size_mb=256, gemm_n=4096)
    assert c.copy_gbytes_per_s > 500 and c.peak_gflops > 10_000 and len(c.extra) == 3
    assert c.peak_label.startswith("vtnumba scaled_mm FP8")  # FP8 outruns f16 on Hopper


def test_profile_moe_reports_the_routing_and_each_step():
    """The experts record: rows per expert from the routing, the bytes of the experts hit, the layer
    and its six steps each timed (and the layer's result is the plain moe_fp8's)."""
    rng = np.random.default_rng(3)
    e, h, inter = 6, 64, 32
    gu = seam.Fp8Experts.from_float(
        rng.standard_normal((e, 2 * inter, h)).astype(np.float32), per_channel=True, activation_scheme="per_token"
    )
    dn = seam.Fp8Experts.from_float(
        rng.standard_normal((e, h, inter)).astype(np.float32), per_channel=True, activation_scheme="per_token"
    )
    x = rng.standard_normal((5, h)).astype(np.float32)
    ids = np.array([[0, 1], [1, 6], [1, 0], [-1, 3], [3, 1]], np.int32)  # 6 and -1 route nothing
    w = rng.random((5, 2)).astype(np.float32)
    rec = profile.profile_moe(x, gu, dn, ids, w, repeats=3, warmup=1)
    assert rec.rows_per_expert == (2, 4, 0, 2, 0, 0) and rec.experts_hit == 3
    per_expert = 2 * inter * h + h * inter + (gu.weight_scale.nbytes + dn.weight_scale.nbytes) // e
    assert rec.expert_bytes == 3 * per_expert and rec.total.bytes == 3 * per_expert
    assert [s.name.strip() for s in rec.steps] == ["align", "quantize", "gate_up", "act_quantize", "down", "combine"]
    assert all(s.time_s > 0 for s in rec.steps) and rec.total.time_s > 0
    text = str(rec)
    assert "3 of 6 experts hit" in text and "gate_up" in text and "combine" in text
    assert "<table>" in rec._repr_html_() and rec.as_dict()["experts_hit"] == 3
