"""Captures that fail leave the process usable (marker ``gpu``; the H200 run proves it). Each case runs
in a fresh Python process, so a poisoned CUDA context could not hide behind the rest of the suite:

- ``vtnumba.cuda.capture`` of a function that synchronizes (a copy to the host inside the capture)
  raises a RuntimeError that names the function and says why; then an eager call and a new capture of
  the same layer work, and the new graph replays the eager bytes;
- ``torch.cuda.graph`` around a converted model whose forward meets a synchronization (``.item()``)
  raises torch's error; then the model's eager forward and a fresh ``torch.cuda.graph`` capture of it
  work, and the replay equals eager bitwise."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _run(code):
    # the decode path forced to one side: by default an eager call at decode is the fused launch and
    # a captured one the split path, which agree within the tensor cores' bound only, while these
    # cases compare a replay with an eager call bitwise (docs/DESIGN.md, "Decode: one launch in eager")
    env = dict(os.environ, VT_DECODE_PATH="fused")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_a_failed_vtnumba_capture_leaves_the_process_usable(cp):
    out = _run(
        """
        import numpy as np, cupy as cp
        import vtnumba.cuda
        from vtnumba import seam
        rng = np.random.default_rng(0)
        w = seam.ResidentFp8(seam.Fp8Weight.from_float(rng.standard_normal((256, 512)).astype(np.float32),
                                                       per_channel=True, activation_scheme="per_token"), "cuda")
        x = cp.asarray(rng.standard_normal((4, 512)).astype(np.float32))

        def syncs(a):
            y = seam.matmul_fp8(a, w)
            cp.asnumpy(y)  # a copy to the host: illegal inside a capture
            return y

        try:
            vtnumba.cuda.capture(syncs, x)
        except RuntimeError as exc:
            assert "syncs" in str(exc) and "capture was ended" in str(exc), exc
            print("refused:", type(exc.__cause__).__name__)
        else:
            raise AssertionError("a synchronizing capture was not refused")
        eager = seam.matmul_fp8(x, w)
        step = vtnumba.cuda.capture(lambda a: seam.matmul_fp8(a, w), x)
        x2 = cp.asarray(rng.standard_normal((4, 512)).astype(np.float32))
        np.testing.assert_array_equal(cp.asnumpy(step(x2)).view(np.uint32),
                                      cp.asnumpy(seam.matmul_fp8(x2, w)).view(np.uint32))
        assert float(cp.abs(eager).max()) > 0
        print("usable")
        """
    )
    assert "refused:" in out and "usable" in out


def test_a_failed_torch_graph_capture_of_a_converted_model_leaves_the_process_usable(cp):
    torch = pytest.importorskip("torch")
    del torch
    out = _run(
        """
        import torch
        import vtnumba.torch as vtt
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.SiLU(), torch.nn.Linear(256, 512))
        model = vtt.convert(model.cuda().bfloat16(), "per_token")
        x = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            model(x)  # warm: kernels compiled, calls bound
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    y = model(x)
                    float(y.float().abs().max().item())  # a synchronization: the capture fails
            except Exception as exc:
                print("refused:", type(exc).__name__)
            else:
                raise AssertionError("a synchronizing capture was not refused")
            eager = model(x)
            torch.cuda.synchronize()
            static_x = x.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = model(static_x)
            x2 = torch.randn(4, 512, device="cuda", dtype=torch.bfloat16)
            static_x.copy_(x2)
            graph.replay()
            assert torch.equal(static_y, model(x2))
            assert float(eager.float().abs().max()) > 0
        print("usable")
        """
    )
    assert "refused:" in out and "usable" in out
