"""One kernel source, two compilers: kernel variants compiled to PTX under numba-cuda and under
numba-cuda-mlir (``VTNUMBA_CUDA_TARGET``, ``cuda/ptx/target.py``), on the CPU, and the inline-PTX
statements of vtnumba's intrinsics (the e4m3 cvt, the 16-byte loads, mma.sync, ldmatrix, cp.async,
wgmma, ...) compared between them: the same intrinsic must give the same instruction with the same
operand kinds. How often a statement appears in the PTX text is not compared: the two compilers
unroll and duplicate code differently (``tc_gemv r16_w4_d4`` at m = 16 holds 32 mma.sync under
numba-cuda and 8 under numba-cuda-mlir).

Each compiler runs in its own interpreter (the target is chosen when target.py is imported), through
``tools/compile_matrix.py run``, which stands in for the GPU each compiler asks about. Skips where
numba-cuda-mlir is not installed (it is not in the test extra) or numba-cuda does not import. The
fast tier takes one quantization kernel (17 s on a loaded 2-core machine, most of it the two
compilers' imports); the full tier one variant of every other kernel family, the sm_90a wgmma kernel
and the MoE kernels included.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "compile_matrix.py"

# float16 in: the e4m3 cvt and cvt.f32.f16, both inline PTX
FAST = ["per_token float16 hardware device_ub=True"]
FULL = [
    "static float32 hardware device_scale=False",
    "dynamic bfloat16 hardware",
    "epilogue_vector f32=True",
    "tiled_block f32=False e8m0_a=True e8m0_b=True",
    "gemv m=1 hardware=True f32=False PER_TOKEN",
    "tc_gemv r16_w4_d2 m=16 mode=3 block=False hardware=True chain=True f32=False",
    "tc_gemm 128x128_w8_32x64 per_mma block=False chain=False f32=False",
    "tc_gemm f16b_128x128_w8_32x64 per_mma block=True chain=False f32=False",
    "wg_gemm 128x128_s4 per_128 block=False f32=False",
    "moe silu PER_GROUP hardware",
    "grouped m_tile=2 blocked=True hardware=True",
]


def _missing():
    if importlib.util.find_spec("numba_cuda_mlir") is None:
        return "numba-cuda-mlir is not installed (pip install numba-cuda-mlir; not in the test extra)"
    if importlib.util.find_spec("numba") is None or importlib.util.find_spec("numba.cuda") is None:
        return "numba-cuda is not installed"
    return None


def _compile(target, labels, out):
    """The records ``compile_matrix.py run`` writes for ``labels`` under ``target``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VTNUMBA_CUDA_TARGET", "NUMBA_ENABLE_CUDASIM")}
    env["VTNUMBA_CUDA_TARGET"] = target
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    path = out / f"{target}.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "run", str(path)] + [arg for label in labels for arg in ("--label", label)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if "does not import here" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(path.read_text())
    assert sorted(records) == sorted(labels), (sorted(records), sorted(labels))
    return records


def _check(labels, tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    nc = _compile("numba-cuda", labels, tmp_path)
    ml = _compile("numba-cuda-mlir", labels, tmp_path)
    for label in labels:
        a, b = nc[label], ml[label]
        assert a.get("ok"), (label, a.get("cause"))
        assert b.get("ok"), (label, b.get("cause"), b.get("where"))
        assert b["arch"] == a["arch"], label
        # the launcher packs each compiler's array ABI (numba-cuda's 5 + 2 ndim words, the memref's 3 + 2 ndim)
        assert a["abi"] and b["abi"], label
        # the same statements of vtnumba's intrinsics under both compilers
        assert set(b["inline_asm"]) == set(a["inline_asm"]), (label, a["inline_asm"], b["inline_asm"])
        if a.get("ptxas") is not None:  # ptxas (nvidia-cuda-nvcc) is here: both assemble
            assert a["ptxas"] and b["ptxas"], (label, a.get("ptxas_error"), b.get("ptxas_error"))
    # non-vacuous: the sample holds vtnumba's inline PTX (a portable-only kernel may hold none)
    assert all(nc[label]["inline_asm"] for label in labels[:1]), nc[labels[0]]
    assert sum(bool(nc[label]["inline_asm"]) for label in labels) >= len(labels) - 2, {
        k: v["inline_asm"] for k, v in nc.items()
    }


def test_quant_kernels_give_the_same_inline_ptx_under_both_compilers(tmp_path):
    _check(FAST, tmp_path)


@pytest.mark.full
def test_every_kernel_family_gives_the_same_inline_ptx_under_both_compilers(tmp_path):
    _check(FULL, tmp_path)
