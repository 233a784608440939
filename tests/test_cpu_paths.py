"""The CPU kernels' paths and threads: which path a CPU gets, every path this CPU can run
held to G1 and G3 on both its serial and its parallel twin, and the one-thread threshold.

Speed is not tested here (benchmarks/cpu/bench_cpu_gemm.py and bench_cpu_threads.py measure it); what is
pinned is the behaviour: which variant a call takes and that each variant's bytes are right."""

import json
import os
import platform
import subprocess
import sys

import numba
import numpy as np
import pytest

import vtnumba as vt
from vtnumba import _config
from vtnumba.cpu import block, gemm, paths, quant
from vtnumba.testing import reference
from vtnumba.testing import strategies as fst
from vtnumba.testing.gates import assert_block_g3, assert_g3

F32 = np.float32
RUNNABLE = [p.name for p in paths.runnable()]
AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
ALWAYS_PARALLEL, ALWAYS_SERIAL = "0", str(1 << 62)


# -- which path a CPU gets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "features, machine, expected",
    [
        (AVX512 | {"avx512vbmi", "avx512bf16", "avx2"}, "x86_64", "avx512_bf16"),  # AMD Zen 4/5, Sapphire Rapids
        (AVX512 | {"avx512vbmi", "avx2"}, "x86_64", "avx512_vbmi"),  # Intel Ice Lake, Tiger Lake (no BF16)
        (AVX512 | {"avx512bf16", "avx2"}, "x86_64", "avx512"),  # Cooper Lake: BF16 without VBMI
        (AVX512 | {"avx2", "fma"}, "x86_64", "avx512"),  # Intel Skylake-X / Cascade Lake (no VBMI)
        ({"avx2", "fma", "f16c"}, "x86_64", "portable"),  # AVX2-only x86-64
        (AVX512 - {"avx512bw"}, "x86_64", "portable"),  # Knights Landing: AVX-512 F without BW
        ({"neon", "fp-armv8"}, "aarch64", "neon_tbl"),  # any ARMv8-A core
        (set(), "aarch64", "neon_tbl"),  # qemu: LLVM sees no features, NEON is still there
        ({"neon"}, "x86_64", "portable"),
        (set(), "riscv64", "portable"),
    ],
)
def test_path_per_cpu(features, machine, expected):
    assert paths.choose(features, machine=machine).name == expected
    assert paths.runnable(features, machine)[-1].name == "portable"  # the portable path runs everywhere


def test_host_gets_its_first_runnable_path():
    assert RUNNABLE and RUNNABLE[-1] == "portable"
    if "VT_CPU_PATH" not in os.environ:
        assert paths.active().name == RUNNABLE[0]
    assert paths.describe()["path"] == paths.active().name


def test_forced_path_is_checked():
    with pytest.raises(
        ValueError, match=r"VT_CPU_PATH must be one of avx512_bf16, avx512_vbmi, avx512, neon_tbl, portable, got 'sse9'"
    ):
        paths.choose(forced="sse9")
    with pytest.raises(ValueError, match=r"this CPU lacks avx512f, avx512bw, avx512dq, avx512vl\); unset it"):
        paths.choose({"avx2"}, forced="avx512", machine="x86_64")
    with pytest.raises(ValueError, match=r"lacks an aarch64/arm64 CPU \(this is x86_64\)"):
        paths.choose(set(), forced="neon_tbl", machine="x86_64")
    assert paths.choose({"avx2"}, forced="portable").name == "portable"


def test_env_forces_the_path_at_import():
    code = "from vtnumba.cpu import paths; print(paths.active().name)"
    for name in RUNNABLE:
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, VT_CPU_PATH=name),
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == name


# -- every runnable path, serial and parallel: G1 and G3 -------------------------------------------


@pytest.fixture(params=[(p, t) for p in RUNNABLE for t in ("serial", "parallel")], ids=lambda v: f"{v[0]}-{v[1]}")
def variant(request, monkeypatch):
    """Run the test's calls on one path, on its serial or its parallel twin (the threshold forced)."""
    path, threads = request.param
    if threads == "parallel" and numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread: there is no parallel twin to run")
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", ALWAYS_PARALLEL if threads == "parallel" else ALWAYS_SERIAL)
    with paths.use(path):
        yield path, threads == "parallel"


def _ran(kernel, path, parallel):
    """Vacuity guard: the variant under test was compiled, i.e. it ran."""
    return (path, parallel) in kernel._variants


def _codes(rng, shape):
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 0x01  # no NaN codes: they would make most outputs NaN
    return codes


def test_g3_gemm(variant):
    path, parallel = variant
    rng = np.random.default_rng(22)
    compared = 0
    for m, n, k in ((1, 70, 300), (1, 4, 64), (1, 9, 1100), (1, 6, 40), (5, 33, 96), (16, 64, 1100), (7, 3, 40)):
        a, b = _codes(rng, (m, k)), _codes(rng, (n, k))
        sa = (rng.uniform(0.01, 1, size=(m, 1))).astype(F32)
        sb = (rng.uniform(0.001, 0.1, size=n) * rng.choice([-1, 1], size=n)).astype(F32)
        bias = rng.standard_normal(n).astype(F32)
        y = vt.scaled_mm(a, b, sa, sb, bias=bias, kernel="small_m")
        compared += assert_g3(y, a, b, sa, sb, bias)
    assert compared > 0
    m1 = gemm.gemv_lookup_kernel if paths.active().byte_lookup_decode else gemm.gemv_kernel
    assert _ran(m1, path, parallel) and _ran(gemm.small_m_kernel, path, parallel)
    assert _ran(gemm.rows_kernel(16), path, parallel)  # M = 16: the register tiles on the AVX-512 paths


def test_g3_gemm_nan_codes_spread(variant):
    rng = np.random.default_rng(5)
    a, b = _codes(rng, (3, 80)), _codes(rng, (9, 80))
    a[1, 7], b[4, 50] = 0x7F, 0xFF
    for rows in (a, a[:1]):
        y = vt.scaled_mm(rows, b, F32(0.5), F32(0.25), kernel="small_m")
        assert assert_g3(y, rows, b, F32(0.5), F32(0.25)) > 0
        assert np.isnan(y[:, 4]).all()


def test_g3_block_gemm(variant):
    path, parallel = variant
    rng = np.random.default_rng(7)
    compared = 0
    for m in (1, 6):
        n, k, bs = 40, 200, (16, 64)
        a, b = _codes(rng, (m, k)), _codes(rng, (n, k))
        sa = rng.uniform(0.01, 1, size=(m, 4)).astype(F32)
        sb = rng.uniform(0.001, 0.1, size=(3, 4)).astype(F32)
        y = vt.scaled_mm(a, b, sa, sb, block_size=bs, kernel="small_m")
        compared += assert_block_g3(y, a, b, sa, sb, bs)
    assert compared > 0
    assert _ran(block.gemv_kernel, path, parallel) and _ran(block.small_m_kernel, path, parallel)


def test_g1_quantization(variant):
    path, parallel = variant
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(30000) * m for m in (1e-3, 1, 30, 448)]).astype(F32)
    x[:6] = [np.nan, -np.inf, np.inf, 0.0, -0.0, 1e30]
    mismatches = compared = 0
    for scale in fst.DESIGN_SCALES:
        got, want = vt.quantize_fp8(x, scale=scale).data, reference.quantize(x, scale=scale).data
        mismatches += int(np.count_nonzero(got != want))
        compared += int(np.count_nonzero(want))
    rows = x.reshape(40, -1)
    for kwargs in ({}, {"per_token": True}):
        q, ref = vt.quantize_fp8(rows, **kwargs), reference.quantize(rows, **kwargs)
        mismatches += int(np.count_nonzero(q.data != ref.data)) + int(np.count_nonzero(q.scale != ref.scale))
    q, ref = vt.quantize_fp8(rows, group_size=32), reference.quantize_per_group(rows, 32)
    mismatches += int(np.count_nonzero(q.data != ref.data)) + int(np.count_nonzero(q.scale != ref.scale))
    assert mismatches == 0 and compared > 100000
    for kernel in (quant.quantize_static, quant.finite_amax, quant.quantize_per_token, block.quantize_per_group_kernel):
        assert _ran(kernel, path, parallel), kernel.__name__


LOOKUP_PATHS = [p.name for p in paths.runnable() if p.byte_lookup_decode]


@pytest.mark.skipif(not LOOKUP_PATHS, reason="no byte-lookup path runs on this CPU")
@pytest.mark.parametrize("path", LOOKUP_PATHS)
@pytest.mark.parametrize("threads", ["serial", "parallel"])
def test_byte_lookup_decode_is_exhaustively_exact(path, threads, monkeypatch):
    """The table decode of a byte-lookup path (vpermi2b on avx512_vbmi, the same bytes as bfloat16 words
    on avx512_bf16, tbl/tbx on neon_tbl): every one of the 256 codes at every lane position of a
    64-code step (x = the unit vector at that position) gives the decoder's float32, NaN for 0x7F and
    0xFF; the K % 64 tail (K = 2 * 64 + 5) goes through the bit-arithmetic decode. The other positions
    hold finite codes that differ along K, so a weight paired with the wrong activation lane shows.
    The same for the block-scaled M = 1 kernel (64-code K-blocks, unit scales) on a path whose blocks
    take the lookup loop (``block_lookup``): each whole block its own sum, the short last one the
    plain loop."""
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", ALWAYS_PARALLEL if threads == "parallel" else ALWAYS_SERIAL)
    k = 2 * 64 + 5
    filler = (np.arange(k) % 100 + 1).astype(np.uint8)  # finite codes, a different one at each position
    want = vt.decode_e4m3(np.arange(256, dtype=np.uint8))
    one, bias = np.ones(1, F32), np.zeros(0, F32)
    nkb = -(-k // 64)
    block_ones = np.ones((nkb, 1), F32), np.ones((4, nkb), F32)  # the kernel's scale_a.T and scale_b
    blocks = paths.choose(forced=path).kernel_globals.get("block_lookup", False)
    checked = 0
    with paths.use(path):
        for position in range(k):
            x = np.zeros((1, k), F32)
            x[0, position] = 1.0
            b = np.repeat(filler[None, :], 256, axis=0)
            b[:, position] = np.arange(256)  # every code at this position, one a row
            out = np.empty((1, 256), F32)
            gemm.gemv_lookup_kernel(x, b, one, one, bias, out)
            np.testing.assert_array_equal(out[0], want, err_msg=f"lane position {position}")
            checked += int(np.count_nonzero(want[~np.isnan(want)]))
            if blocks:
                out = np.empty((1, 256), F32)
                block.gemv_kernel(x, b, *block_ones, 64, 64, bias, out)
                np.testing.assert_array_equal(out[0], want, err_msg=f"block kernel, lane position {position}")
                checked += int(np.count_nonzero(want[~np.isnan(want)]))
    assert checked == 252 * k * (2 if blocks else 1) and _ran(gemm.gemv_lookup_kernel, path, threads == "parallel")
    assert not blocks or _ran(block.gemv_kernel, path, threads == "parallel")


def test_the_bf16_path_runs_its_own_loops(tmp_path):
    """Which instructions each path's M = 1 kernels hold (vacuity for the test above: a path whose
    globals silently fell back would pass it too): vdpbf16ps in both M = 1 kernels on avx512_bf16 and
    in no kernel of another path, read from the assembly of a fresh compile."""
    if "avx512_bf16" not in RUNNABLE:
        pytest.skip("this CPU has no avx512_bf16 path (AVX-512 VBMI and BF16)")
    code = """if True:
        import json, numpy as np
        import vtnumba as vt
        from vtnumba.cpu import block, gemm, paths
        a = np.full((1, 256), 0x38, np.uint8)
        b = np.full((8, 256), 0x38, np.uint8)
        found = {}
        for path in ("avx512_bf16", "avx512_vbmi"):
            with paths.use(path):
                vt.scaled_mm(a, b, np.float32(1), np.float32(1), kernel="small_m")
                ones = np.ones((1, 2), np.float32)
                vt.scaled_mm(a, b, ones, ones, block_size=(128, 128), kernel="small_m")
                for kernel in (gemm.gemv_lookup_kernel, block.gemv_kernel):
                    d = kernel.variant(path, False)
                    found[f"{path} {kernel.__name__}"] = d.inspect_asm(d.signatures[0]).count("vdpbf16ps")
        print(json.dumps(found))
    """
    env = dict(os.environ, VT_CPU_PARALLEL_MIN_WORK=ALWAYS_SERIAL)
    env["NUMBA_CACHE_DIR"] = str(tmp_path)  # a fresh compile: its assembly can be read
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["avx512_bf16 gemv_lookup_kernel"] >= 8 and found["avx512_bf16 gemv_kernel"] >= 8, found
    assert found["avx512_vbmi gemv_lookup_kernel"] == found["avx512_vbmi gemv_kernel"] == 0, found


# -- the one-thread threshold ----------------------------------------------------------------------


def test_small_work_runs_on_one_thread(monkeypatch):
    monkeypatch.delenv("VT_CPU_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.setattr(paths, "free_cpus", lambda: 64)  # an idle machine (the load rule is tested below)
    macs = _config.CPU_PARALLEL_MIN_MACS
    x, b = np.zeros((1, 64), F32), np.zeros((macs // 64 - 1, 64), np.uint8)
    assert not gemm.gemv_kernel.runs_parallel(x, b)  # one multiply-add short
    big = np.zeros((macs // 64, 64), np.uint8)
    assert gemm.gemv_kernel.runs_parallel(x, big) == (numba.get_num_threads() > 1)
    n = _config.CPU_PARALLEL_MIN_ELEMENTS
    assert not quant.quantize_static.runs_parallel(np.zeros(n - 1, F32), F32(1), None)
    assert quant.quantize_static.runs_parallel(np.zeros(n, F32), F32(1), None) == (numba.get_num_threads() > 1)
    # the 16x32x64 layer stays on one thread: its GEMM and its quantization
    assert not gemm.small_m_kernel.runs_parallel(np.zeros((16, 64), F32), np.zeros((32, 64), np.uint8))
    assert not quant.finite_amax.runs_parallel(np.zeros(16 * 64, F32))


def test_a_loaded_machine_runs_serial(monkeypatch):
    """Above the threshold a call takes the CPUs free at that moment: none free (one busy process
    beside it on two cores) means the serial twin; the knob's 0 means every thread regardless."""
    monkeypatch.delenv("VT_CPU_PARALLEL_MIN_WORK", raising=False)
    x, b = np.zeros((1, 64), F32), np.zeros((_config.CPU_PARALLEL_MIN_MACS // 64, 64), np.uint8)
    threads = numba.get_num_threads()
    for free, expected in ((0, 1), (1, 1), (64, threads), (None, threads)):
        monkeypatch.setattr(paths, "free_cpus", lambda free=free: free)
        assert gemm.gemv_kernel.threads_for(x, b) == expected, free
    monkeypatch.setattr(paths, "free_cpus", lambda: 1)
    y = np.empty((1, b.shape[0]), F32)
    gemm.gemv_kernel(x, b, np.ones(1, F32), np.ones(1, F32), np.zeros(0, F32), y)  # the serial twin, loaded
    assert _ran(gemm.gemv_kernel, paths.active().name, False)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")
    assert gemm.gemv_kernel.threads_for(x, b) == threads


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 3, reason="needs 3 Numba threads to cap at 2")
def test_capped_threads_are_restored(monkeypatch):
    monkeypatch.delenv("VT_CPU_PARALLEL_MIN_WORK", raising=False)
    monkeypatch.setattr(paths, "free_cpus", lambda: 2)
    rng = np.random.default_rng(3)
    a, b = _codes(rng, (1, 4096)), _codes(rng, (1024, 4096))
    before = numba.get_num_threads()
    assert gemm.gemv_kernel.threads_for(np.zeros((1, 4096), F32), b) == 2
    assert assert_g3(vt.scaled_mm(a, b, F32(1), F32(1)), a, b, F32(1), F32(1)) > 0
    assert numba.get_num_threads() == before


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="free CPUs are read from Linux's /proc/loadavg")
def test_free_cpus_reads_the_running_count():
    free = _config.free_cpus()
    assert isinstance(free, int) and free <= os.cpu_count()  # this thread runs: at most the CPU count


def test_free_cpus_reads_the_load_once_a_millisecond(monkeypatch):
    """A reading serves the calls within FREE_CPUS_FRESH_NS after it (a layer's quantizer and GEMM
    both ask); past that the next call reads /proc/loadavg again."""
    reads, clock = [], [10**12]
    monkeypatch.setattr(_config, "_read_loadavg", lambda: reads.append(1) or b"0.00 0.00 0.00 3/200 1")
    monkeypatch.setattr(_config.time, "monotonic_ns", lambda: clock[0])
    monkeypatch.setattr(_config, "_free_seen", [(-_config.FREE_CPUS_FRESH_NS, None)])
    assert _config.free_cpus() == _config._CPUS - 2 and len(reads) == 1
    clock[0] += _config.FREE_CPUS_FRESH_NS - 1
    assert _config.free_cpus() == _config._CPUS - 2 and len(reads) == 1  # the same reading
    clock[0] += 1
    assert _config.free_cpus() == _config._CPUS - 2 and len(reads) == 2  # read again


def test_threshold_knob(monkeypatch):
    x, b = np.zeros((1, 8), F32), np.zeros((8, 8), np.uint8)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")
    assert gemm.gemv_kernel.runs_parallel(x, b) == (numba.get_num_threads() > 1)
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "lots")
    with pytest.raises(ValueError, match=r"VT_CPU_PARALLEL_MIN_WORK must be an integer, got 'lots'"):
        gemm.gemv_kernel.runs_parallel(x, b)


def test_one_numba_thread_means_serial(monkeypatch):
    monkeypatch.setenv("VT_CPU_PARALLEL_MIN_WORK", "0")
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert not gemm.gemv_kernel.runs_parallel(np.zeros((1, 8), F32), np.zeros((8, 8), np.uint8))
    finally:
        numba.set_num_threads(before)


def test_variants_have_their_own_cache_names():
    names = set()
    for path in RUNNABLE:
        for parallel in (True, False):
            names.add(gemm.gemv_kernel.variant(path, parallel).py_func.__qualname__)
    assert len(names) == 2 * len(RUNNABLE)


_POOL_PROBE = """
import json, os, numba
seen = {}
real = numba.get_num_threads
def probe():
    seen.setdefault("policy", os.environ.get("OMP_WAIT_POLICY"))
    return real()
numba.get_num_threads = probe
from vtnumba import _config
_config.start_threads()
print(json.dumps(dict(during=seen.get("policy"), after=os.environ.get("OMP_WAIT_POLICY"))))
"""


@pytest.mark.parametrize("user, during, after", [(None, "PASSIVE", None), ("ACTIVE", "ACTIVE", "ACTIVE")])
def test_thread_pool_starts_with_passive_workers_unless_the_user_chose(user, during, after):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if user:
        env["OMP_WAIT_POLICY"] = user
    out = subprocess.run([sys.executable, "-c", _POOL_PROBE], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"during": during, "after": after}


# -- the assembly finding behind the avx512 path ---------------------------------------------------

_WIDTH_PROBE = """
import json
from numba import types
from vtnumba.cpu import gemm, paths
f32_2d, u8_2d, f32_1d = types.float32[:, ::1], types.uint8[:, ::1], types.float32[::1]
counts = {}
for p in paths.runnable():
    k = gemm.gemv_kernel.variant(p.name, False)
    sig = (f32_2d, u8_2d, f32_1d, f32_1d, f32_1d, f32_2d)
    k.compile(sig)  # compiled, never run
    asm = k.inspect_asm(sig)
    counts[p.name] = dict(zmm=asm.count("%zmm"), ymm=asm.count("%ymm"))
print(json.dumps(counts))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86-64 finding (LLVM's x86 tuning)")
def test_avx512_path_gets_512_bit_vectors_under_intel_tuning():
    """LLVM's tuning for Intel server cores prefers 256-bit vectors: compiled for sapphirerapids with
    AVX-512 (compiled only, so any x86-64 host can read it), the portable kernel has no zmm register
    and the avx512 path's has them."""
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features().flatten() + "," + ",".join("+" + f for f in sorted(AVX512))
    env = dict(os.environ, NUMBA_CPU_NAME="sapphirerapids", NUMBA_CPU_FEATURES=features, VT_NUMBA_CACHE="0")
    out = subprocess.run([sys.executable, "-c", _WIDTH_PROBE], env=env, capture_output=True, text=True, check=True)
    counts = json.loads(out.stdout)
    assert counts["portable"]["zmm"] == 0 and counts["portable"]["ymm"] > 0
    assert counts["avx512"]["zmm"] > 0
