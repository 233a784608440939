"""Faults injected on the GPU (marker ``gpu``; the H200 run proves it), through ``vtnumba._faults``'s
hook points -- a kernel launch (``cuda.launch``), cuBLASLt's algorithm query (``cublaslt.heuristic``)
and its matmul (``cublaslt.matmul``) -- and through an allocator that fails (cupy's pool), and a real
out-of-memory error from torch's allocator.

For each fault, in a dense FP8 layer and in a whole MoE layer, first and bound calls alike:

- the call raises (the injected error, naming the step and the kernel or the GEMM's shape); nothing
  is returned;
- the tables of bound calls hold no entry made by the failed call, and cuBLASLt's plan table holds no
  "impossible" verdict for it (a failed heuristic is not remembered as a call cuBLASLt cannot run);
- cupy's pool has as many bytes in use as before;
- the next call with the same arguments succeeds, bitwise equal to the same call made in a fresh
  process (computed once, in a subprocess, before the faults)."""

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vtnumba import _faults, seam
from vtnumba.seam import experts as se

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
E, H, I, T, K_TOP = 8, 256, 128, 3, 2


def _operands(cp, n):
    """A dense layer [n, 512] (per-token) with its input [16, 512], and an MoE layer with its routed
    tokens: the same bytes in every process (fixed seeds)."""
    rng = np.random.default_rng(n)
    w = (rng.standard_normal((n, 512)) / np.sqrt(512)).astype(np.float32)
    weight = seam.ResidentFp8(seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token"), "cuda")
    x = cp.asarray(rng.standard_normal((16, 512)).astype(np.float32))
    kw = dict(per_channel=True, activation_scheme="per_token")
    gu = seam.Fp8Experts.from_float((rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32), **kw)
    dn = seam.Fp8Experts.from_float((rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32), **kw)
    ids = np.stack([rng.choice(E, K_TOP, replace=False) for _ in range(T)]).astype(np.int64)
    moe = (
        seam.ResidentFp8(gu, "cuda"),
        seam.ResidentFp8(dn, "cuda"),
        cp.asarray(rng.standard_normal((T, H)).astype(np.float32)),
        cp.asarray(ids),
        cp.asarray(rng.uniform(0.1, 1, size=(T, K_TOP)).astype(np.float32)),
    )
    return weight, x, moe


SHAPES = {
    "cuda.launch": 256,
    "cublaslt.heuristic": 272,
    "cublaslt.matmul": 288,
    "alloc": 304,
}  # N: multiples of 16 (cuBLASLt)
# the dense calls run on cuBLASLt (the other dense kernels taken out), so its two steps are met
DISABLED = "decode_gemv,tensorcore_gemv,tensorcore,tiled"


@pytest.fixture(autouse=True)
def _on_cublaslt(monkeypatch):
    monkeypatch.setenv("VT_DISABLE_KERNELS", DISABLED)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """{n: (dense y, moe y)} as a fresh process computes them (saved by a subprocess)."""
    out = tmp_path_factory.mktemp("fresh") / "fresh.npz"
    code = f"""
        import sys, numpy as np, cupy as cp
        sys.path.insert(0, {str(HERE)!r})
        from test_faults_gpu import _operands, SHAPES
        from vtnumba import seam
        saved = {{}}
        for n in SHAPES.values():
            weight, x, (gu, dn, xm, ids, w) = _operands(cp, n)
            saved[f"dense{{n}}"] = cp.asnumpy(seam.matmul_fp8(x, weight))
            saved[f"moe{{n}}"] = cp.asnumpy(seam.moe_fp8(xm, gu, dn, ids, w))
        np.savez({str(out)!r}, **saved)
    """
    env = dict(os.environ, VT_DISABLE_KERNELS=DISABLED)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = np.load(out)
    return {n: (data[f"dense{n}"], data[f"moe{n}"]) for n in SHAPES.values()}


def _state(cp, weight, gu):
    from vtnumba.cuda.runtime import device

    cp.cuda.Device().synchronize()
    gc.collect()  # an earlier failure's traceback may still hold arrays

    plans = device.current().cublaslt().plans
    return (
        dict(weight.weight.bound_calls or {}),
        dict(se._bound_holder(gu).bound_calls or {}),
        {k for k, v in plans.items() if isinstance(v, str)},
        cp.get_default_memory_pool().used_bytes(),
    )


def _assert_nothing_left(cp, before, weight, gu):
    after = _state(cp, weight, gu)
    assert after[0].keys() == before[0].keys(), "a failed dense call left a bound entry"
    assert after[1].keys() == before[1].keys(), "a failed MoE call left a bound entry"
    assert after[2] == before[2], "a failed call left cuBLASLt's plan table an 'impossible' verdict"
    assert after[3] == before[3], f"cupy's pool holds {after[3] - before[3]} bytes more"


def _failing_calls(step, cp, weight, x, moe):
    """Each (name, call) that a fault at ``step`` can interrupt: the first dense call (full path),
    then its bound call, then the MoE layer's first and bound calls."""
    gu, dn, xm, ids, w = moe
    return [
        ("dense", lambda: seam.matmul_fp8(x, weight)),
        ("moe", lambda: seam.moe_fp8(xm, gu, dn, ids, w)),
    ]


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def _warm(cp):
    """Make what the library keeps for good on first use (compiled kernels, the device's placeholders,
    the stream's cuBLASLt workspace) with layers of their own, so that the memory a failed call leaves
    is measured against a warm process."""
    weight, x, (gu, dn, xm, ids, w) = _operands(cp, 336)
    for _ in range(2):
        seam.matmul_fp8(x, weight)
        seam.moe_fp8(xm, gu, dn, ids, w)
    cp.cuda.Device().synchronize()


@pytest.mark.parametrize("step", ["cuda.launch", "cublaslt.heuristic", "cublaslt.matmul"])
def test_an_injected_fault_leaves_no_trace(cp, step, fresh):
    n = SHAPES[step]
    _warm(cp)
    weight, x, moe = _operands(cp, n)
    want = fresh[n]
    fired = 0
    for round_ in ("first call", "bound call"):
        for (name, call), ref in zip(_failing_calls(step, cp, weight, x, moe), want):
            returned = got = None  # no earlier result alive across the measurement
            before = _state(cp, weight, moe[0])
            with _faults.inject(step) as fault:
                try:
                    returned = call()
                except _faults.InjectedFault as exc:
                    assert step in str(exc) and exc.detail, exc
                    returned = None
            fired += fault.fired
            if returned is None:  # the call failed: it left nothing behind
                _assert_nothing_left(cp, before, weight, moe[0])
            else:  # the step is not on this call's path: it ran as it would have
                assert fault.calls == 0, f"{step} ran {fault.calls} times and the call still returned"
                np.testing.assert_array_equal(_bits(cp.asnumpy(returned)), _bits(ref))
            got = call()  # the next call: bitwise what a fresh process gives
            np.testing.assert_array_equal(_bits(cp.asnumpy(got)), _bits(ref), err_msg=f"{name}, {round_}")
    assert fired > 0, f"no call went through {step}"


def test_a_failing_allocator_leaves_no_trace(cp, fresh):
    n = SHAPES["alloc"]
    _warm(cp)
    weight, x, moe = _operands(cp, n)
    pool = cp.get_default_memory_pool()
    refused = 0
    for (name, call), ref in zip(_failing_calls("alloc", cp, weight, x, moe), fresh[n]):
        for due in range(4):  # the due-th allocation of the call fails
            count = [0]

            def malloc(nbytes, count=count, due=due):
                count[0] += 1
                if count[0] == due + 1:
                    raise cp.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
                return pool.malloc(nbytes)

            returned = got = None
            before = _state(cp, weight, moe[0])
            try:
                with cp.cuda.using_allocator(malloc):
                    returned = call()
            except cp.cuda.memory.OutOfMemoryError:
                refused += 1  # checked below, once the exception (and its frames' arrays) is gone
            if returned is None:
                _assert_nothing_left(cp, before, weight, moe[0])
            else:  # fewer allocations than due: the call ran as it would have
                np.testing.assert_array_equal(_bits(cp.asnumpy(returned)), _bits(ref))
            got = call()
            np.testing.assert_array_equal(_bits(cp.asnumpy(got)), _bits(ref), err_msg=f"{name}, allocation {due}")
    assert refused > 0


def test_a_real_out_of_memory_error_then_the_same_call(cp):
    """torch's allocator runs out for real (the GPU filled with tensors): the converted layer's
    forward raises torch's OutOfMemoryError; with the memory freed, the same forward gives the bytes
    it gave before."""
    torch = pytest.importorskip("torch")
    import vtnumba.torch as vtt

    torch.manual_seed(0)
    model = vtt.convert(torch.nn.Sequential(torch.nn.Linear(512, 4096)).cuda().bfloat16(), "per_token")
    xt = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(xt).clone()
        model(xt)  # bound
        hog, size = [], 1 << 30
        while size >= 1 << 12:  # fill the device: 1 GiB blocks, then ever smaller ones
            try:
                hog.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                size //= 4
        failed = None
        try:
            model(xt)
        except (torch.OutOfMemoryError, RuntimeError) as exc:  # torch's, or cupy's surfaced as RuntimeError
            failed = type(exc).__name__
        hog.clear()
        torch.cuda.empty_cache()
        got = model(xt)
    assert failed is not None, "the forward found memory on a full device"
    assert torch.equal(got, want)
