"""vtnumba's CPU path checked where it runs (tools/arm64/run.sh runs this inside an emulated arm64
userland; it runs on any CPU): G1 and G3 on every CPU path this CPU can run, serial and parallel,
and what the GEMM's inner loop compiles to for a few Arm targets.

    python tools/arm64/check.py                  # the host target: G1, G3, the assembly summary
    python tools/arm64/check.py --target NAME    # one LLVM CPU (e.g. cortex-x925): G3 + assembly
    python tools/arm64/check.py --targets A,B    # each in a child process (run.sh: neoverse-n1,cortex-x925)

Each --target runs in a child process (Numba reads NUMBA_CPU_NAME once, at start). Under qemu the
host target is what LLVM makes of the emulated CPU; the named ones are real Arm cores whose code qemu
can still execute (its "max" CPU has SVE2), so their G3 runs too. Timings are not taken: emulated
speed means nothing. Exit status 1 when a check fails.
"""

import argparse
import collections
import os
import platform
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def g1(report):
    """Quantization against the oracle, bitwise: the G1 population of tests/test_quant_cpu.py at every
    DESIGN.md scale, dynamic, per-token and per-group 32, on every path, serial and parallel."""
    import vtnumba as vt
    from tests.test_quant_cpu import population
    from vtnumba.cpu import paths
    from vtnumba.testing import reference
    from vtnumba.testing import strategies as fst

    rng = np.random.default_rng(0)
    total = 0
    np.seterr(over="ignore", invalid="ignore")  # the oracle's float64 arithmetic on inf / huge inputs
    for path in paths.runnable():
        for threads in ("0", str(1 << 62)):
            os.environ["VT_CPU_PARALLEL_MIN_WORK"] = threads
            with paths.use(path.name):
                bad = 0
                for scale in fst.DESIGN_SCALES:
                    x, _ = population(scale, rng)
                    bad += int(
                        np.count_nonzero(
                            vt.quantize_fp8(x, scale=scale).data != reference.quantize(x, scale=scale).data
                        )
                    )
                    total += x.size
                x = (rng.standard_normal((64, 512)) * 3).astype(np.float32)
                for kwargs in ({}, {"per_token": True}):
                    q, ref = vt.quantize_fp8(x, **kwargs), reference.quantize(x, **kwargs)
                    bad += int(np.count_nonzero(q.data != ref.data)) + int(np.count_nonzero(q.scale != ref.scale))
                q, ref = vt.quantize_fp8(x, group_size=32), reference.quantize_per_group(x, 32)
                bad += int(np.count_nonzero(q.data != ref.data)) + int(np.count_nonzero(q.scale != ref.scale))
                total += 3 * x.size
            label = f"{path.name}, {'parallel' if threads == '0' else 'serial'}"
            report(
                f"G1 {label}: static at {len(fst.DESIGN_SCALES)} scales, dynamic, per-token, group 32",
                bad == 0,
                f"{bad} mismatches",
            )
    os.environ.pop("VT_CPU_PARALLEL_MIN_WORK", None)
    return total


SHAPES = ((1, 70, 300), (1, 256, 1024), (16, 64, 1100), (5, 33, 96), (40, 96, 256))


def g3(report):
    """The GEMM against the float64 reference (G3) on a few shapes, every path, serial and parallel,
    every kernel, and the block-scaled GEMM."""
    import vtnumba as vt
    from vtnumba.cpu import paths
    from vtnumba.testing.gates import assert_block_g3, assert_g3

    rng = np.random.default_rng(1)
    for path in paths.runnable():
        for threads in ("0", str(1 << 62)):
            os.environ["VT_CPU_PARALLEL_MIN_WORK"] = threads
            compared, failure = 0, ""
            with paths.use(path.name):
                try:
                    for m, n, k in SHAPES:
                        a = rng.integers(0, 0x7E, size=(m, k), dtype=np.uint8) | (
                            rng.integers(0, 2, (m, k), np.uint8) << 7
                        )
                        b = rng.integers(0, 0x7E, size=(n, k), dtype=np.uint8) | (
                            rng.integers(0, 2, (n, k), np.uint8) << 7
                        )
                        sa, sb = np.float32(0.02), rng.uniform(0.001, 0.1, n).astype(np.float32)
                        for kernel in ("small_m", "blas", None):
                            compared += assert_g3(vt.scaled_mm(a, b, sa, sb, kernel=kernel), a, b, sa, sb)
                        if k % 64 == 0 and n % 32 == 0:
                            sab = rng.uniform(0.01, 1, (m, k // 64)).astype(np.float32)
                            sbb = rng.uniform(0.01, 1, (n // 32, k // 64)).astype(np.float32)
                            y = vt.scaled_mm(a, b, sab, sbb, block_size=(32, 64))
                            compared += assert_block_g3(y, a, b, sab, sbb, (32, 64))
                except AssertionError as exc:
                    failure = str(exc).splitlines()[0]
            label = f"{path.name}, {'parallel' if threads == '0' else 'serial'}"
            report(
                f"G3 {label}: {len(SHAPES)} shapes x (small_m, blas, auto) + block",
                not failure and compared > 0,
                failure or f"{compared} outputs compared",
            )
    os.environ.pop("VT_CPU_PARALLEL_MIN_WORK", None)


def lookup_decode(report):
    """The byte-lookup decode of each runnable path that has one, exhaustively: every code at every
    lane position of a 64-code step (and a 5-code tail), as tests/test_cpu_paths.py does."""
    import vtnumba as vt
    from vtnumba.cpu import gemm, paths

    k = 64 + 5
    b = np.ascontiguousarray(np.repeat(np.arange(256, dtype=np.uint8)[:, None], k, axis=1))
    want = vt.decode_e4m3(np.arange(256, dtype=np.uint8))
    one, bias = np.ones(1, np.float32), np.zeros(0, np.float32)
    for path in [p for p in paths.runnable() if p.byte_lookup_decode]:
        for threads in ("0", str(1 << 62)):
            os.environ["VT_CPU_PARALLEL_MIN_WORK"] = threads
            wrong = 0
            with paths.use(path.name):
                for position in range(k):
                    x = np.zeros((1, k), np.float32)
                    x[0, position] = 1.0
                    out = np.empty((1, 256), np.float32)
                    gemm.gemv_lookup_kernel(x, b, one, one, bias, out)
                    wrong += int(np.count_nonzero(~((out[0] == want) | (np.isnan(out[0]) & np.isnan(want)))))
            report(
                f"byte-lookup decode {path.name}, {'parallel' if threads == '0' else 'serial'}: 256 codes x "
                f"{k} positions",
                wrong == 0,
                f"{wrong} wrong",
            )
    os.environ.pop("VT_CPU_PARALLEL_MIN_WORK", None)


def inner_loop(asm):
    """The GEMM's hot loop: the basic block (label to backward branch) with the most FMAs."""
    blocks, current = [], []
    for line in asm.splitlines():
        if re.match(r"^\.?L?BB\d+_\d+:", line.strip()):  # a label starts a block
            blocks.append(current)
            current = []
        current.append(line)
        op = line.split()[0] if line.split() else ""
        if re.match(r"^(j[a-z]+|b\.[a-z]+|b|cbn?z|tbn?z)$", op):  # a branch ends it
            blocks.append(current)
            current = []
    blocks.append(current)
    fma = re.compile(r"\b(fmla|vfmadd\w*)\b")
    return max(blocks, key=lambda b: sum(bool(fma.search(line)) for line in b))


def summarize(asm_lines):
    """Instruction counts and the register kinds of a loop body."""
    ops = collections.Counter()
    for line in asm_lines:
        parts = line.split()
        if parts and not parts[0].endswith(":") and not parts[0].startswith("."):
            ops[parts[0]] += 1
    text = "\n".join(asm_lines)
    kinds = {
        "SVE z registers": len(re.findall(r"\bz\d+\.[bhsd]", text)),
        "SVE predicates": len(re.findall(r"\bp\d+/[zm]|\bp\d+\.[bhsd]", text)),
        "NEON v registers": len(re.findall(r"\bv\d+\.\d*[bhsd]", text)),
        "zmm": text.count("%zmm"),
        "ymm": text.count("%ymm"),
    }
    return ops, {k: v for k, v in kinds.items() if v}


def assembly(report):
    """What the M = 1 kernel's inner loop compiles to here, per path."""
    import vtnumba as vt
    from vtnumba.cpu import gemm, paths

    x = vt.decode_e4m3(np.arange(256, dtype=np.uint8).reshape(1, 256) % 0x7E)
    b = (np.arange(64 * 256) % 0x7E).astype(np.uint8).reshape(64, 256)
    one, out, bias = np.ones(1, np.float32), np.empty((1, 64), np.float32), np.zeros(0, np.float32)
    for path in paths.runnable():
        k = (gemm.gemv_lookup_kernel if path.byte_lookup_decode else gemm.gemv_kernel).variant(path.name, False)
        k(x, b, one, one, bias, out)
        asm = k.inspect_asm(k.signatures[0])
        loop = inner_loop(asm)
        ops, kinds = summarize(loop)
        top = ", ".join(f"{op} {n}" for op, n in ops.most_common(14))
        print(f"  M = 1 inner loop, path {path.name}: {len(loop)} lines; registers: {kinds}")
        print(f"    instructions: {top}")
        if os.environ.get("VT_ARM64_ASM_DIR"):
            name = os.environ.get("NUMBA_CPU_NAME") or "host"
            with open(os.path.join(os.environ["VT_ARM64_ASM_DIR"], f"gemv-{name}-{path.name}.s"), "w") as f:
                f.write(asm)
        report(
            f"assembly of the M = 1 kernel read ({path.name})",
            any(op == "fmla" or op.startswith("vfmadd") for op in ops),
            "an FMA loop found" if loop else "no loop found (cached code cannot be inspected: VT_NUMBA_CACHE=0)",
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="an LLVM CPU name: G3 and the assembly for it only")
    parser.add_argument("--targets", default=None, help="comma-separated LLVM CPU names, each in a child process")
    args = parser.parse_args()
    failures = []

    def report(what, ok, detail):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f" ({detail})" if detail else ""), flush=True)
        if not ok:
            failures.append(what)

    if args.targets:
        for name in args.targets.split(","):
            env = dict(os.environ, NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES="", VT_NUMBA_CACHE="0")
            print(f"-- target {name}", flush=True)
            rc = subprocess.run([sys.executable, __file__, "--target", name], env=env).returncode
            if rc:
                failures.append(f"target {name}")
        sys.exit(1 if failures else 0)

    import llvmlite.binding as ll
    import numba
    from numba.core import config

    from vtnumba.cpu import paths

    print(
        f"  {platform.machine()}, numba {numba.__version__}, LLVM CPU {config.CPU_NAME or ll.get_host_cpu_name()}, "
        f"vector ISA {paths.vector_isa()}, path {paths.active().name} (runnable: "
        f"{', '.join(p.name for p in paths.runnable())})",
        flush=True,
    )
    if args.target is None:
        values = g1(report)
        print(f"  G1 compared {values:,} values", flush=True)
    lookup_decode(report)
    g3(report)
    assembly(report)
    print(f"  {'all checks passed' if not failures else 'FAILED: ' + '; '.join(failures)}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
