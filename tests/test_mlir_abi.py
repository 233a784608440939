"""What each kernel parameter means under both compilers, against what the launcher packs, on the CPU.

``tools/abi_diff.py`` names every ``.entry`` parameter of a kernel's PTX by the component
``runtime/launch.py`` packs there (numba-cuda's array ABI or numba-cuda-mlir's memref descriptor),
reads which of them the body loads and how it uses them, and the shared-memory declarations. The
fast tier runs it on the two kernels whose wrong results opened issue 42, under both compilers:
the fused tensor-core GEMV at M = 1, static scale (test_fused_linear[static-1-float32]: err inf)
and the MoE align (its counters are dynamic shared memory). Both declare dynamic shared memory,
which numba-cuda-mlir 0.6.0 writes as a static one-byte variable overlapping the static arrays
(docs/DEVICE.md, reproducer 9): the tool must find that in the compiler's own PTX and nothing in
the PTX vtnumba loads (``launch.extern_dynamic_shared``). About 25 s on a loaded 2-core machine,
most of it the two compilers' imports.
"""

import json
import os
import pathlib
import subprocess
import sys

from test_mlir_compile import _require_compilers

from vtnumba.cuda.runtime.launch import extern_dynamic_shared

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "abi_diff.py"
LABELS = [
    "tc_gemv r16_w4_d2 m=1 mode=1 block=False hardware=True chain=True f32=False",
    "moe align ids_int64=False",
]

# the shape of numba-cuda-mlir 0.6.0's PTX for a kernel with dynamic shared memory (reproducer 9)
_MLIR_PTX = """.version 9.5
.target sm_90
.address_size 64

\t// .globl\tk
// __dynamic_shmem__0 has been demoted
.shared .align 8 .b8 static_shared_memory_0[16];

.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.reg .b64 \t%rd<4>;
\t// demoted variable
\t.shared .align 16 .b8 __dynamic_shmem__0;
\tmov.u64 \t%rd1, __dynamic_shmem__0;
\tret;
}
"""


def test_the_dynamic_shared_variable_becomes_an_extern_array_at_module_scope():
    fixed = extern_dynamic_shared(_MLIR_PTX)
    lines = fixed.splitlines()
    assert lines[3] == ".extern .shared .align 16 .b8 __dynamic_shmem__0[];", lines[:5]
    assert "\t.shared .align 16 .b8 __dynamic_shmem__0;" not in fixed
    # nothing else moved: the other lines are the original's, in order
    assert [ln for ln in lines if "__dynamic_shmem__0[]" not in ln] == [
        ln for ln in _MLIR_PTX.splitlines() if ln != "\t.shared .align 16 .b8 __dynamic_shmem__0;"
    ]
    numba_cuda = ".address_size 64\n.extern .shared .align 16 .b8 _cudapy_smem_7[];\n"
    assert extern_dynamic_shared(numba_cuda) == numba_cuda  # numba-cuda's declaration is already extern


def _run(target, out):
    env = {k: v for k, v in os.environ.items() if k not in ("VTNUMBA_CUDA_TARGET", "NUMBA_ENABLE_CUDASIM")}
    env["VTNUMBA_CUDA_TARGET"] = target
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    path = out / f"{target}.json"
    done = subprocess.run(
        [sys.executable, str(TOOL), "run", str(path)] + [a for label in LABELS for a in ("--label", label)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(path.read_text())


def test_the_launcher_packs_what_both_compilers_kernels_read(tmp_path):
    _require_compilers()
    sys.path.insert(0, str(ROOT / "tools"))
    import abi_diff

    nc, ml = _run("numba-cuda", tmp_path), _run("numba-cuda-mlir", tmp_path)
    assert sorted(nc) == sorted(ml) == sorted(LABELS)
    found = abi_diff.diff(nc, ml)
    assert found == {label: [] for label in LABELS}, found
    for label in LABELS:
        for rec in (nc[label], ml[label]):
            # non-vacuous: parameters were named and read, and the kernel declares dynamic shared memory
            assert sum(bool(r["loads"]) for r in rec["params"]) >= 5, (label, rec["params"])
            assert any(s["dynamic"] and s["extern"] for s in rec["shared"]), (label, rec["shared"])
        assert nc[label]["compiler_mismatches"] == [], label
        # numba-cuda-mlir's own PTX places the dynamic array among the static ones; vtnumba's rewrite answers it
        kinds = [k for k, _ in ml[label]["compiler_mismatches"]]
        assert kinds == ["dynamic_shared"], (label, ml[label]["compiler_mismatches"])
    # the fused GEMV's activation x: numba-cuda's data pointer, numba-cuda-mlir's aligned pointer, both
    # reaching an address; the memref's offset (packed 0) read as an index
    fused = LABELS[0]
    nc_x = {r["name"]: r for r in nc[fused]["params"] if r["name"].startswith("x.")}
    ml_x = {r["name"]: r for r in ml[fused]["params"] if r["name"].startswith("x.")}
    assert "address" in nc_x["x.data"]["uses"] and "address" in ml_x["x.aligned"]["uses"], (nc_x, ml_x)
    assert not nc_x["x.meminfo"]["loads"] and not ml_x["x.allocated"]["loads"]
