"""Threads on one GPU (marker ``gpu``; the H200 run proves it): 8 Python threads share one dense layer
and one MoE layer, each thread on a stream of its own or all on one stream, 200 calls each over more
input shapes than a layer keeps bound (so the bound-call tables fill and are cleared while other
threads read them). Every result is bitwise the serial result of the same input.

Why it holds: a bound call's prepared parameters are rewritten under its own lock
(``BoundLinear._lock``, ``BoundMoe._lock``) and enqueued on the caller's stream before the lock is
released; each call's temporaries are its own allocations; the tables of bound calls are dicts read
and written by single operations (a lost race binds a signature twice, which gives the same
launches); a binding's recording is thread-local (``cuda.experts.recording``, cupy's memory
hooks)."""

import threading

import numpy as np
import pytest

from vtnumba import seam
from vtnumba.seam import bound as seam_bound
from vtnumba.seam import experts as se
from vtnumba.seam import matmul as seam_matmul

pytestmark = pytest.mark.gpu
THREADS, CALLS = 8, 200
E, H, I = 8, 256, 128


def _inputs(cp, rng, rows, k):
    return [cp.asarray(rng.standard_normal((m, k)).astype(np.float32)) for m in rows]


def _run_threads(cp, work, own_streams):
    """Run ``work(thread_index)`` -> list of device arrays in THREADS threads; their results, on the host."""
    results, errors = [None] * THREADS, []
    barrier = threading.Barrier(THREADS)

    def body(i):
        try:
            stream = cp.cuda.Stream(non_blocking=True) if own_streams else shared
            with stream:
                barrier.wait()
                out = work(i)
                stream.synchronize()
            results[i] = [cp.asnumpy(y) for y in out]
        except Exception as exc:  # surfaced below, with the thread that raised it
            errors.append((i, exc))

    shared = cp.cuda.Stream(non_blocking=True)
    threads = [threading.Thread(target=body, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize("own_streams", [True, False])
def test_threads_share_a_dense_layer_bitwise(cp, own_streams):
    rng = np.random.default_rng(81)
    w = (rng.standard_normal((256, 512)) / np.sqrt(512)).astype(np.float32)
    weight = seam.ResidentFp8(seam.Fp8Weight.from_float(w, per_channel=True, activation_scheme="per_token"), "cuda")
    rows = list(range(1, 2 + seam_bound.MAX_SIGNATURES + 4))  # more shapes than stay bound
    xs = _inputs(cp, rng, rows, 512)
    want = [cp.asnumpy(seam_matmul._matmul_fp8(x, weight, None)[0]) for x in xs]  # the full path, serial

    def work(i):
        return [seam.matmul_fp8(xs[(i + c) % len(xs)], weight) for c in range(CALLS)]

    compared = 0
    for i, got in enumerate(_run_threads(cp, work, own_streams)):
        for c, y in enumerate(got):
            np.testing.assert_array_equal(y.view(np.uint32), want[(i + c) % len(xs)].view(np.uint32))
            compared += 1
    assert compared == THREADS * CALLS
    assert weight.weight.bound_calls  # the bound path ran, and its table was refilled after clears


@pytest.mark.parametrize("own_streams", [True, False])
def test_threads_share_a_moe_layer_bitwise(cp, own_streams):
    rng = np.random.default_rng(82)
    gu = seam.Fp8Experts.from_float(
        (rng.standard_normal((E, 2 * I, H)) / np.sqrt(H)).astype(np.float32),
        per_channel=True,
        activation_scheme="per_token",
    )
    dn = seam.Fp8Experts.from_float(
        (rng.standard_normal((E, H, I)) / np.sqrt(I)).astype(np.float32),
        per_channel=True,
        activation_scheme="per_token",
    )
    gu, dn = seam.ResidentFp8(gu, "cuda"), seam.ResidentFp8(dn, "cuda")
    tokens = list(range(1, 2 + seam_bound.MAX_SIGNATURES + 2))  # more signatures than stay bound
    xs = _inputs(cp, rng, tokens, H)
    routes = [
        (
            cp.asarray(np.stack([rng.choice(E, 2, replace=False) for _ in range(t)]).astype(np.int64)),
            cp.asarray(rng.uniform(0.1, 1, size=(t, 2)).astype(np.float32)),
        )
        for t in tokens
    ]
    want = [cp.asnumpy(se.MoeCall(x, gu, dn, *r).run()) for x, r in zip(xs, routes)]  # unbound, serial

    def work(i):
        out = []
        for c in range(CALLS):
            j = (i + c) % len(xs)
            out.append(seam.moe_fp8(xs[j], gu, dn, *routes[j]))
        return out

    compared = 0
    for i, got in enumerate(_run_threads(cp, work, own_streams)):
        for c, y in enumerate(got):
            np.testing.assert_array_equal(y.view(np.uint32), want[(i + c) % len(xs)].view(np.uint32))
            compared += 1
    assert compared == THREADS * CALLS
    assert any(b is not None for b in se._bound_holder(gu).bound_calls.values())
