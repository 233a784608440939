"""One kernel source, two compilers: kernel variants compiled to PTX under numba-cuda and under
numba-cuda-mlir (``VTNUMBA_CUDA_TARGET``, ``cuda/ptx/target.py``), on the CPU, and the inline-PTX
statements of vtnumba's intrinsics (the e4m3 cvt, the 16-byte loads, mma.sync, ldmatrix, cp.async,
wgmma, ...) compared between them: the same intrinsic must give the same instruction with the same
operand kinds. How often a statement appears in the PTX text is not compared: the two compilers
unroll and duplicate code differently (``tc_gemv r16_w4_d4`` at m = 16 holds 32 mma.sync under
numba-cuda and 8 under numba-cuda-mlir).

Each compiler runs in its own interpreter (the target is chosen when target.py is imported), through
``tools/compile_matrix.py run``, which stands in for the GPU each compiler asks about. The test
extra installs numba-cuda-mlir on Linux, so there a missing compiler fails the test; elsewhere (no
wheel) it skips. The fast tier takes one quantization kernel (17 s on a loaded 2-core machine, most
of it the two compilers' imports); the full tier one variant of every other kernel family named
below, then every ``FULL_STRIDE``-th variant of each family of the inventory for 9.0 (the sm_90a
wgmma kernels and the MoE kernels included) and every ``GB10_STRIDE``-th block-scaled variant for
12.1 (GB10's sm_121a). The whole inventory under both compilers is ``tools/compile_matrix.py run``
without ``--stride``, at 9.0 and with ``--cc 12.1`` (about two and a half hours on two cores).
"""

import importlib.util
import json
import os
import pathlib
import platform
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


# FULL_STRIDE 30 is 30 of the 742 variants at 9.0, every family: about 3 minutes for both compilers
# on one core (numba-cuda-mlir takes 2-28 s a kernel, 7 on average; numba-cuda about 1.5)
FULL_STRIDE = 30
# GB10_STRIDE 12 is 16 of the 182 block-scaled variants for sm_121a (unit and mx scales, the
# grouped MoE tiles among them): under 2 minutes
GB10_STRIDE = 12


def _unavailable(why):
    """A compiler that is missing or does not import: on Linux, where the test extra installs both, a
    failure, so CI cannot pass by skipping; elsewhere (no wheel) a skip."""
    if platform.system() == "Linux":
        pytest.fail(why)
    pytest.skip(why)


def _require_compilers():
    for module, name in (("numba_cuda_mlir", "numba-cuda-mlir"), ("numba.cuda", "numba-cuda")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # numba itself is absent
            found = False
        if not found:
            _unavailable(f"{name} is not installed (pip install '.[test]' installs it on Linux)")


def _compile(target, out, labels=(), flags=()):
    """The records ``compile_matrix.py run`` writes under ``target``, for ``labels`` (every one of them
    recorded) or for what ``flags`` select."""
    env = {k: v for k, v in os.environ.items() if k not in ("VTNUMBA_CUDA_TARGET", "NUMBA_ENABLE_CUDASIM")}
    env["VTNUMBA_CUDA_TARGET"] = target
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    path = out / f"{target}.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "run", str(path), *flags] + [arg for label in labels for arg in ("--label", label)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    if "does not import here" in done.stderr:
        _unavailable(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(path.read_text())
    if labels:
        assert sorted(records) == sorted(labels), (sorted(records), sorted(labels))
    return records


def _check(tmp_path, labels=(), flags=()):
    _require_compilers()
    nc = _compile("numba-cuda", tmp_path, labels, flags)
    ml = _compile("numba-cuda-mlir", tmp_path, labels, flags)
    assert sorted(nc) == sorted(ml), sorted(set(nc) ^ set(ml))
    # a configuration the factory refuses is refused by both (the factory runs before any compiler)
    refused = [label for label in nc if "refused" in nc[label]]
    assert refused == [label for label in ml if "refused" in ml[label]], refused
    labels = [label for label in nc if label not in refused]
    assert labels, "nothing compiled"
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
    # non-vacuous: most of the sample holds vtnumba's inline PTX (a portable kernel holds none, nor do
    # the amax, routing and general grouped kernels, which use no intrinsic)
    holding = [label for label in labels if nc[label]["inline_asm"]]
    assert len(holding) >= 3 * len(labels) // 4, sorted(set(labels) - set(holding))
    return {label: nc[label] for label in labels}


def test_quant_kernels_give_the_same_inline_ptx_under_both_compilers(tmp_path):
    _check(tmp_path, FAST)


@pytest.mark.full
def test_every_kernel_family_gives_the_same_inline_ptx_under_both_compilers(tmp_path):
    _check(tmp_path, FULL)


@pytest.mark.full
def test_a_sample_of_every_family_compiles_alike_under_both_compilers(tmp_path):
    """Every ``FULL_STRIDE``-th variant of each family builds, assembles and fits the launcher under
    both compilers, for the H200 (9.0, the sm_90a wgmma kernels and the MoE kernels included)."""
    _check(tmp_path, flags=("--stride", str(FULL_STRIDE)))


@pytest.mark.full
def test_the_gb10_block_scaled_kernels_compile_alike_under_both_compilers(tmp_path):
    """GB10's own kernels, the block-scaled mma (``unit``: e4m3 with unit scales; ``mx``: E8M0 scales)
    for sm_121a, every ``GB10_STRIDE``-th of them: the tiled GEMM, the tensor-core GEMV and the
    grouped MoE tiles."""
    records = _check(tmp_path, flags=("--cc", "12.1", "--only", "unit", "--only", " mx ", "--stride", str(GB10_STRIDE)))
    assert {r["arch"] for r in records.values()} == {"sm_121a"}, {r["arch"] for r in records.values()}
    assert any("grouped" in label for label in records), sorted(records)
