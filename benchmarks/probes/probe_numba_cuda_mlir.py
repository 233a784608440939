"""numba-cuda-mlir behind vtnumba's one import, measured on a GPU, against numba-cuda.

    VT_COMMIT=<commit> python3 benchmarks/probes/probe_numba_cuda_mlir.py "$OUT" [--budget 520]

Needs numba-cuda-mlir importable (``numba_cuda_mlir``), numba-cuda, cupy and a GPU; torch for the
bfloat16 and per-token rows. Everything lands in the output folder: one ``<part>.log`` and
``<part>.json`` per part, ``suite.xml`` (junit) and ``summary.md``, which is printed last.

Each part runs in its own Python process with its own time box, so a crash, a hang or a CUDA context
a failed capture poisoned loses that part only. The small parts run first and the test suite last,
with what is left of ``--budget`` seconds (at most ``--suite-seconds``, 300 unless told):

- env      versions; ``vtnumba.cuda`` under each target; both targets in one process (do they clash?);
           vtnumba's quantization kernels compiled to PTX one by one under numba-cuda-mlir, with the
           first error and the vtnumba frame it came from; vtnumba's launcher on a plain kernel
- g2       G2 exhaustive (all 2^32 float32 patterns at scale 1, against the CPU kernel's codes) for
           vtnumba's own ``quantize_static`` and for a plain one-element-per-thread kernel launched by
           each target's own dispatcher, with the portable encoder (vtnumba's device code, unchanged)
           and the hardware one (under numba-cuda-mlir ported to ``cuda.experimental.inline_ptx``)
- speed    4096 x 4096 float32 / bfloat16 quantization: vtnumba's kernels (static per-tensor and
           per-token) and the plain kernels; device time (``vtnumba.timing.device_us``) and host cost
           per call (``vtnumba.timing.host_us``), each target in its own process
- graph    a CUDA graph capture of one quantization: ``vtnumba.cuda.capture`` and the plain kernel's
           dispatcher launch on a capturing cupy stream, each in its own process
- suite    ``pytest -m gpu`` over tests/ with VTNUMBA_CUDA_TARGET=numba-cuda-mlir (xdist, a time box
           per test), junit XML, a pass / fail / skip table per file and the failures grouped by cause
- files    every GPU test file (``--files``, else each tests/*.py that marks tests ``gpu``) in its own
           pytest process per target (``--targets``, numba-cuda-mlir first), ``--file-workers`` at a
           time, each in its own time box (``--file-seconds``; the largest files split over xdist
           workers, ``--split``), so a context one failure poisons fails the rest of that process
           only: ``files.md``, passed / failed / error / skipped per file under each target, and the
           failures grouped by cause per target (junit XML per file, else its -v log)
- sanitizer ``compute-sanitizer --tool memcheck`` on one test per cause found offline (``SANITIZED``:
           the fused GEMV and the MoE steps, issue 42) under numba-cuda-mlir, and the same tests
           without the sanitizer and without vtnumba's PTX rewrite of the dynamic shared memory
           (docs/DEVICE.md, reproducer 9), which must fail: the cause, confirmed on the GPU

``--parts files,sanitizer`` is the issue-42 run: about 5 minutes on a 16-core H200 host.
"""

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MLIR, NC = "numba-cuda-mlir", "numba-cuda"
SIZE = 4096
CHUNK = 1 << 28  # G2: float32 patterns per launch (1 GiB in, 256 MiB out)


# ================================================================================================
# the parts (each runs in a child: python3 probe_numba_cuda_mlir.py --part NAME --target T ...)


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _where(exc):
    """The innermost vtnumba frame of ``exc``'s traceback: file:line in function."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "vtnumba" in f.filename.replace("\\", "/")]
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename.replace("\\", "/")
    return f"{path[path.rindex('vtnumba/') :]}:{f.lineno} in {f.name}"


def _attempt(record, key, fn):
    """record[key] = fn()'s value, or the error (first line, vtnumba frame) it raised."""
    t0 = time.perf_counter()
    try:
        value = fn()
        record[key] = {"ok": True, "value": value, "s": round(time.perf_counter() - t0, 2)}
    except BaseException as exc:  # noqa: BLE001 -- every failure is a result here
        record[key] = {
            "ok": False,
            "error": _first_line(exc),
            "where": _where(exc),
            "s": round(time.perf_counter() - t0, 2),
        }
        traceback.print_exc()
    print(key, json.dumps(record[key])[:400], flush=True)
    return record[key]


def _plain_kernels(target):
    """Plain grid-stride static quantization kernels (one element per thread step) for each encoder,
    written with ``target``'s own ``cuda``, for its own dispatcher: what vtnumba's device code
    becomes without vtnumba's 16-byte intrinsic loads and launcher."""
    import numpy as np

    from vtnumba._format import F32_E4M3_MAX
    from vtnumba.cuda.ptx import codec
    from vtnumba.cuda.ptx.target import DEVICE_INLINE, cuda

    if target == MLIR:
        nan_code, byte = np.uint32(0x7F), np.uint32(0xFF)

        @cuda.jit(**DEVICE_INLINE)
        def encode_hw(v):
            # codec.encode_pair_hardware's rule, its llvmlite cvt intrinsic ported to inline_ptx
            nan = v != v
            c = min(max(v, -F32_E4M3_MAX), F32_E4M3_MAX)
            pair = cuda.experimental.inline_ptx(
                "cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;", "=h", np.uint16(0), "f", np.float32(0), "f", c
            )
            return nan_code if nan else np.uint32(pair) & byte
    else:
        encode_hw = codec.encode_one("hardware")
    encoders = {"portable": codec.encode_e4m3, "hardware": encode_hw}
    bits_float32 = codec.bits_float32
    kernels = {}
    for name, enc in encoders.items():

        def make(enc):
            @cuda.jit
            def q_f32(x, out, inv, n):
                i = cuda.grid(1)
                step = cuda.gridsize(1)
                while i < n:
                    out[i] = np.uint8(enc(x[i] * inv))
                    i += step

            @cuda.jit
            def q_bf16(x, out, inv, n):  # x: the uint16 bits of bfloat16
                i = cuda.grid(1)
                step = cuda.gridsize(1)
                while i < n:
                    out[i] = np.uint8(enc(bits_float32(np.uint32(x[i]) << np.uint32(16)) * inv))
                    i += step

            return q_f32, q_bf16

        kernels[name] = make(enc)
    return kernels


def _launcher(kernel, cp):
    """call(x, out, inv) launching ``kernel`` through its target's dispatcher on cupy's current stream."""
    import numpy as np

    from vtnumba.cuda.ptx.target import cuda

    blocks = 132 * 8

    def call(x, out, inv=1.0):
        ptr = cp.cuda.get_current_stream().ptr
        if ptr:  # a cupy stream (a capture): the dispatcher must launch there
            kernel[blocks, 256, cuda.external_stream(ptr)](x, out, np.float32(inv), np.int64(x.size))
        else:  # cupy's null stream is the legacy default stream, the dispatcher's default too
            kernel[blocks, 256](x, out, np.float32(inv), np.int64(x.size))

    return call


def part_env(target, out):
    rec = {"target": target}
    import importlib.metadata as md

    rec["versions"] = {}
    for dist in (
        "numpy",
        "numba",
        "numba-cuda",
        "numba-cuda-mlir",
        "cupy-cuda13x",
        "cupy-cuda12x",
        "cuda-bindings",
        "cuda-core",
        "nvmath-python",
        "torch",
        "llvmlite",
        "pytest",
        "pytest-xdist",
        "pytest-timeout",
    ):
        try:
            rec["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            rec["versions"][dist] = None
    from vtnumba.cuda.ptx import target as tgt

    rec["vtnumba_target"] = [tgt.TARGET, getattr(tgt.cuda, "__name__", None), repr(tgt.IMPORT_ERROR)]
    rec["gpu_unavailable_reason"] = tgt.gpu_unavailable_reason()
    import cupy as cp

    other = "numba_cuda_mlir.cuda" if target == NC else "numba.cuda"

    def both():
        # the other target imported into this process, then a kernel of each launched: a clash shows here
        import importlib

        mod = importlib.import_module(other)
        x = cp.arange(1024, dtype=cp.float32)
        y = cp.zeros_like(x)

        def twice(a, b):
            i = mod.grid(1)
            if i < a.size:
                b[i] = a[i] * 2

        mod.jit(twice)[4, 256](x, y)
        cp.cuda.runtime.deviceSynchronize()
        ok_other = bool(cp.all(y == 2 * x))
        kernels = _plain_kernels(target)
        codes = cp.zeros(1024, dtype=cp.uint8)
        _launcher(kernels["portable"][0], cp)(x, codes)
        cp.cuda.runtime.deviceSynchronize()
        return {"other": other, "other_kernel_right": ok_other, "own_kernel_ran": int(codes[3]) != 0}

    _attempt(rec, "both_targets_in_one_process", both)

    from vtnumba.cuda.kernels import quant

    cc = tuple(int(c) for c in cp.cuda.Device().compute_capability)  # "90" -> (9, 0)
    rec["cc"] = list(cc)
    variants = {
        "static f32 hardware": lambda: quant.static_kernel("float32", "hardware", False),
        "static f32 portable": lambda: quant.static_kernel("float32", "portable", False),
        "static bf16 hardware": lambda: quant.static_kernel("bfloat16", "hardware", True),
        "amax f32": lambda: quant.amax_kernel("float32"),
        "per-token f32 hardware": lambda: quant.per_token_kernel("float32", "hardware", False),
    }
    rec["compile"] = {}
    for name, make in variants.items():
        _attempt(rec["compile"], name, lambda make=make: len(make().ptx(cc)))

    def launcher():
        # vtnumba's launcher on a kernel with no intrinsic: its ABI check against the PTX's .entry
        from vtnumba.cuda.ptx.target import types
        from vtnumba.cuda.runtime.launch import compile_kernel

        def plain(x, y):
            i = cuda_mod.grid(1)
            if i < x.size:
                y[i] = x[i] + 1

        from vtnumba.cuda.ptx.target import cuda as cuda_mod

        k = compile_kernel(plain, (types.float32[::1], types.float32[::1]))
        x = cp.arange(256, dtype=cp.float32)
        y = cp.zeros_like(x)
        k(1, 256, x, y)
        cp.cuda.runtime.deviceSynchronize()
        return bool(cp.all(y == x + 1))

    _attempt(rec, "vtnumba_launcher_plain_kernel", launcher)
    return rec


def _thresholds():
    """For c = 1..126, the smallest float32 magnitude pattern the CPU kernel encodes to >= c (as
    tests/test_cuda_quant.py: the CPU kernel is G1-exhaustive, so these steps reproduce it)."""
    import numpy as np

    import vtnumba as vt

    targets = np.arange(1, 127, dtype=np.int64)
    lo = np.zeros(targets.size, dtype=np.int64)
    hi = np.full(targets.size, 0x43E00000, dtype=np.int64)
    for _ in range(32):
        mid = (lo + hi) // 2
        up = vt.encode_e4m3(mid.astype(np.uint32).view(np.float32)).astype(np.int64) >= targets
        hi = np.where(up, mid, hi)
        lo = np.where(up, lo, mid + 1)
    return hi.astype(np.uint32)


def part_g2(target, out):
    import cupy as cp
    import numpy as np

    import vtnumba.cuda as backend

    rec = {"target": target}
    thr = cp.asarray(_thresholds())

    def reference(bits):
        mag = bits & np.uint32(0x7FFFFFFF)
        codes = cp.searchsorted(thr, mag, side="right").astype(cp.uint8)
        codes |= ((bits >> np.uint32(24)) & np.uint32(0x80)).astype(cp.uint8)
        return cp.where(mag > np.uint32(0x7F800000), np.uint8(0x7F), codes)

    runners = {}
    kernels = _plain_kernels(target)
    for enc in ("portable", "hardware"):
        runners[f"vtnumba quantize_static {enc}"] = lambda x, enc=enc: backend.quantize_static(
            x, np.float32(1.0), encoder=enc
        )
        launch = _launcher(kernels[enc][0], cp)

        def plain(x, launch=launch):
            got = cp.empty(x.size, dtype=cp.uint8)
            launch(x, got)
            return got

        runners[f"plain kernel {enc}"] = plain
    # a first small call per runner: one that cannot compile is recorded once, not per chunk
    probe = cp.arange(0, 1 << 20, dtype=cp.uint32).view(cp.float32)
    live = {}
    for name, fn in runners.items():
        r = _attempt(rec, name + " (first call)", lambda fn=fn: int(cp.count_nonzero(fn(probe))))
        if r["ok"]:
            live[name] = fn
    counts = {name: {"mismatches": 0, "nan_mismatches": 0, "pairs": Counter(), "first": []} for name in live}
    nonzero = 0
    for start in range(0, 1 << 32, CHUNK):
        bits = cp.arange(start, start + CHUNK, dtype=cp.uint64).astype(cp.uint32)
        want = reference(bits)
        nonzero += int(cp.count_nonzero(want))
        nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        for name, fn in live.items():
            got = fn(bits.view(cp.float32))
            bad = got != want
            n = int(cp.count_nonzero(bad))
            c = counts[name]
            c["mismatches"] += n
            if n:
                c["nan_mismatches"] += int(cp.count_nonzero(bad & nan))
                idx = cp.flatnonzero(bad)
                w, g = cp.asnumpy(want[idx]), cp.asnumpy(got[idx])
                pairs = np.unique(w.astype(np.uint32) << 8 | g, return_counts=True)
                for p, k in zip(*pairs):
                    c["pairs"][f"{int(p) >> 8:#04x}->{int(p) & 0xFF:#04x}"] += int(k)
                if len(c["first"]) < 5:
                    c["first"] += [f"{start + int(i):#010x}" for i in cp.asnumpy(idx[: 5 - len(c['first'])])]
            del got, bad
        del bits, want, nan
    rec["reference_nonzero_codes"] = nonzero
    rec["exhaustive"] = {
        name: {**c, "pairs": dict(c["pairs"].most_common(8)), "distinct_pairs": len(c["pairs"])}
        for name, c in counts.items()
    }
    return rec


def part_speed(target, out):
    import cupy as cp
    import numpy as np

    import vtnumba as vt
    from vtnumba import timing

    rec = {"target": target, "rows": {}}
    n = SIZE * SIZE
    rng = cp.random.default_rng(0)
    x32 = rng.standard_normal(n, dtype=cp.float32)
    x16 = (x32.view(cp.uint32) >> np.uint32(16)).astype(cp.uint16)  # bfloat16 bits (truncated)
    try:
        import torch

        t32 = torch.as_tensor(x32.reshape(SIZE, SIZE), device="cuda")
        tbf = t32.to(torch.bfloat16)
    except Exception as exc:  # noqa: BLE001
        torch = None
        rec["torch"] = _first_line(exc)

    def measure(call, nbytes):
        call()
        cp.cuda.runtime.deviceSynchronize()
        dev = min(timing.device_us(call, repeats=20) for _ in range(3))
        host = timing.host_us(call, repeats=200, warmup=10)
        return {"device_us": round(dev, 2), "GB/s": round(nbytes / dev / 1e3, 1), "host_us": round(host, 2)}

    cases = {
        "vtnumba static f32": (lambda: vt.quantize_fp8(x32, 0.5), 5 * n),
        "vtnumba per-token f32": (lambda: vt.quantize_fp8(x32.reshape(SIZE, SIZE), per_token=True), 5 * n),
    }
    if torch is not None:
        cases["vtnumba static bf16"] = (lambda: vt.quantize_fp8(tbf, 0.5), 3 * n)
        cases["vtnumba per-token bf16"] = (lambda: vt.quantize_fp8(tbf, per_token=True), 3 * n)
    kernels = _plain_kernels(target)
    for enc in ("hardware", "portable"):
        q32, q16 = (_launcher(k, cp) for k in kernels[enc])
        codes = cp.empty(n, dtype=cp.uint8)
        cases[f"plain static f32 {enc}"] = (lambda q32=q32, codes=codes: q32(x32, codes, 2.0), 5 * n)
        cases[f"plain static bf16 {enc}"] = (lambda q16=q16, codes=codes: q16(x16, codes, 2.0), 3 * n)
    for name, (call, nbytes) in cases.items():
        _attempt(rec["rows"], name, lambda call=call, nbytes=nbytes: measure(call, nbytes))
    return rec


def part_graph(target, out, which):
    import cupy as cp
    import numpy as np

    rec = {"target": target}
    x = cp.random.default_rng(0).standard_normal(1 << 20, dtype=cp.float32)
    if which == "vtnumba":
        import vtnumba as vt
        import vtnumba.cuda as backend

        def capture():
            step = backend.capture(lambda a: vt.quantize_fp8(a, 0.5).data, x)
            got = step(x)
            cp.cuda.runtime.deviceSynchronize()
            want = vt.quantize_fp8(cp.asnumpy(x), 0.5).data
            return {"replay_equals_cpu": bool(np.array_equal(cp.asnumpy(got), want))}

        _attempt(rec, "vtnumba.cuda.capture(quantize_fp8)", capture)
    else:
        kernels = _plain_kernels(target)
        launch = _launcher(kernels["portable"][0], cp)
        codes = cp.zeros(x.size, dtype=cp.uint8)

        def capture():
            launch(x, codes)  # compile outside the capture
            cp.cuda.runtime.deviceSynchronize()
            want = codes.copy()
            codes.fill(0)
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                try:
                    launch(x, codes)
                finally:
                    graph = stream.end_capture()
                graph.launch(stream)
            stream.synchronize()
            return {"replay_equals_direct": bool(cp.all(codes == want))}

        _attempt(rec, "plain kernel launch on a capturing cupy stream", capture)
    return rec


# ================================================================================================
# the suite

_TIMEOUT_PLUGIN = '''"""Per-test time box without pytest-timeout: a test running past VT_TEST_TIMEOUT seconds dumps its
stack and ends its (xdist worker) process, which xdist reports as a failure of that test."""
import faulthandler, os, sys
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    faulthandler.dump_traceback_later(float(os.environ.get("VT_TEST_TIMEOUT", "90")), exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
'''

_STATUS = re.compile(r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")
_NODE = re.compile(r"(tests/[\w/.-]+\.py)::(\S+)")


@functools.cache
def _have(module):
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def run_suite(out, seconds, per_test, workers):
    env = _child_env(MLIR)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/",
        "-m",
        "gpu",
        "-p",
        "no:cacheprovider",
        "-v",
        "-rfE",
        "--tb=short",
        f"--junitxml={out / 'suite.xml'}",
        "-o",
        "junit_family=xunit1",
    ]
    notes = []
    if workers > 1 and _have("xdist"):
        cmd += ["-n", str(workers)]
    else:
        notes.append("pytest-xdist missing: one process")
    if _have("pytest_timeout"):
        cmd += [f"--timeout={per_test}"]
    else:
        plugin_dir = out / "plugin"
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / "vt_probe_timeout.py").write_text(_TIMEOUT_PLUGIN)
        env["PYTHONPATH"] = f"{plugin_dir}{os.pathsep}{env['PYTHONPATH']}"
        env["VT_TEST_TIMEOUT"] = str(per_test)
        cmd += ["-p", "vt_probe_timeout"]
        notes.append(
            "pytest-timeout missing: the per-test box is faulthandler's exit (the worker dies, xdist reports it)"
        )
    print("suite:", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(out / "suite.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            notes.append(f"stopped at its {seconds:.0f} s box (SIGINT: pytest writes what it has)")
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    return {"rc": rc, "wall_s": round(time.time() - t0, 1), "notes": notes, "cmd": " ".join(cmd[1:])}


def _normalize(message):
    """A failure message with the parts that differ per test (numbers, addresses, names in
    quotes after 'kernel') blurred, so failures of one cause group together."""
    m = re.sub(r"0x[0-9a-fA-F]+", "0x…", message)
    m = re.sub(r"\d+", "N", m)
    return m[:200]


def summarize_suite(out):
    """(per-file table, failure classes) from the junit XML, else from the -v log."""
    import xml.etree.ElementTree as ET

    cases = []  # (file, name, status, message, where)
    xml = out / "suite.xml"
    if xml.exists() and xml.stat().st_size:
        for tc in ET.parse(xml).getroot().iter("testcase"):
            file = tc.get("file") or tc.get("classname", "").replace(".", "/") + ".py"
            status, message, where = "passed", "", ""
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = (el.get("message") or "").strip().splitlines()[0:1]
                    message = message[0] if message else ""
                    frames = re.findall(r"(vtnumba/[\w/]+\.py):(\d+)", el.text or "")
                    where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
                    break
            cases.append((file, tc.get("name"), status, message, where))
        source = "junit XML"
    else:
        seen = {}
        for line in (out / "suite.log").read_text(errors="replace").splitlines():
            node, status = _NODE.search(line), _STATUS.search(line)
            if node and status:
                seen[node.group(0)] = (node.group(1), node.group(2), status.group(1).lower(), "", "")
            elif node:  # started, no outcome yet: it hung or its process died
                seen.setdefault(
                    node.group(0), (node.group(1), node.group(2), "error", "no outcome (hung or killed)", "")
                )
        cases = list(seen.values())
        source = "the -v log (no junit XML: pytest was killed)"
    per_file = defaultdict(Counter)
    classes = defaultdict(lambda: {"n": 0, "files": set(), "where": Counter(), "example": ""})
    for file, name, status, message, where in cases:
        per_file[file][status] += 1
        if status in ("failed", "error"):
            c = classes[_normalize(message) or "(no message)"]
            c["n"] += 1
            c["files"].add(Path(file).name)
            if where:
                c["where"][where] += 1
            c["example"] = c["example"] or f"{Path(file).name}::{name}"
    lines = [
        f"Source: {source}; {len(cases)} tests.",
        "",
        "| file | passed | failed | error | skipped |",
        "|---|---|---|---|---|",
    ]
    total = Counter()
    for file in sorted(per_file):
        c = per_file[file]
        total.update(c)
        lines.append(f"| {Path(file).name} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    lines.append(f"| **all** | {total['passed']} | {total['failed']} | {total['error']} | {total['skipped']} |")
    lines += [
        "",
        "Failures by cause (message with numbers blurred; the vtnumba frames they came from):",
        "",
        "| n | cause | vtnumba frame (count) | files | example |",
        "|---|---|---|---|---|",
    ]
    for msg, c in sorted(classes.items(), key=lambda kv: -kv[1]["n"]):
        where = ", ".join(f"{w} ({k})" for w, k in c["where"].most_common(4))
        files = ", ".join(sorted(c["files"])[:6]) + (" …" if len(c["files"]) > 6 else "")
        lines.append(f"| {c['n']} | {msg.replace('|', '/')} | {where} | {files} | {c['example']} |")
    return "\n".join(lines)


# ================================================================================================
# per file, per target, in parallel; the sanitizer

# one failing test per cause found offline (issue 42): the fused GEMV's x codes over its scales, the MoE
# align's counters over its scan -- both numba-cuda-mlir's dynamic shared memory (DEVICE.md, 9)
SANITIZED = [
    "tests/test_tensorcore_gpu.py::test_fused_linear[static-1-float32]",
    "tests/test_experts_gpu.py::test_moe_fp8_on_the_gpu_step_by_step_against_the_cpu[dynamic-4]",
]
# the files of most GPU tests (2026-12-02: 124, 118, 98, 87 and 59) over several xdist workers, so
# none of them sets the wall time alone
SPLIT = "test_tensorcore_gpu.py:3,test_seam_gpu.py:3,test_cuda_gemm.py:2,test_experts_gpu.py:2,test_torch_gpu.py:2"
_GPU_MARK = re.compile(r"pytest\.mark\.gpu|devices\.params\(")

# A pytest plugin that undoes vtnumba's rewrite of numba-cuda-mlir's dynamic shared memory, so the
# sanitizer part can show the failure the rewrite answers on the GPU itself
_NO_REWRITE_PLUGIN = '''"""vtnumba's PTX as numba-cuda-mlir wrote it: no extern dynamic shared memory (DEVICE.md, 9)."""
from vtnumba.cuda.runtime import launch

launch.extern_dynamic_shared = lambda ptx: ptx
'''


# memcheck sees a write past an allocation only where the allocation ends: cupy's pool (and torch's
# caching allocator, PYTORCH_NO_CUDA_MEMORY_CACHING) hand out pieces of larger blocks, so the sanitized
# runs allocate every array with cudaMalloc
_NO_POOL_PLUGIN = '''"""Every cupy array its own cudaMalloc, so memcheck knows where each one ends."""
import cupy

cupy.cuda.set_allocator(None)
'''


def gpu_test_files():
    """tests/*.py that mark tests ``gpu`` (directly, or through ``vtnumba.testing.devices.params``)."""
    return sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if _GPU_MARK.search(p.read_text())
    )


def _cases_from(xml, log):
    """[(file, name, status, message, where)] of one pytest run: its junit XML, else its -v log (a run
    killed at its box writes no XML; a test started without an outcome counts as an error)."""
    import xml.etree.ElementTree as ET

    cases = []
    if xml.exists() and xml.stat().st_size:
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:
            root = None
        if root is not None:
            for tc in root.iter("testcase"):
                file = tc.get("file") or tc.get("classname", "").replace(".", "/") + ".py"
                status, message, where = "passed", "", ""
                for tag in ("failure", "error", "skipped"):
                    el = tc.find(tag)
                    if el is not None:
                        status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                        lines = (el.get("message") or "").strip().splitlines()
                        message = lines[0] if lines else ""
                        frames = re.findall(r"(vtnumba/[\w/]+\.py):(\d+)", el.text or "")
                        where = f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
                        break
                cases.append((file, tc.get("name"), status, message, where))
            return cases
    seen = {}
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            node, status = _NODE.search(line), _STATUS.search(line)
            if node and status:
                seen[node.group(0)] = (node.group(1), node.group(2), status.group(1).lower(), "", "")
            elif node:
                seen.setdefault(
                    node.group(0), (node.group(1), node.group(2), "error", "no outcome (hung or killed)", "")
                )
    return [(f, n, "passed" if st in ("xfail", "xpass") else st, m, w) for f, n, st, m, w in seen.values()]


def _pytest_cmd(args, xml, per_test, workers=1):
    cmd = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "-v", "-rfE", "--tb=short"]
    cmd += [f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if _have("pytest_timeout"):
        cmd += [f"--timeout={per_test}"]
    if workers > 1 and _have("xdist"):
        cmd += ["-n", str(workers)]
    return cmd


def _run_boxed(cmd, env, log_path, seconds):
    """Run ``cmd`` in its own session for at most ``seconds`` (then SIGINT, then SIGKILL): rc, wall."""
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = f"stopped at its {seconds:.0f} s box"
    return rc, round(time.time() - t0, 1)


def run_files(out, files, targets, deadline, file_seconds, per_test, workers, split):
    """Every file under every target, each in its own process (see ``files`` in the docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    folder = out / "files"
    folder.mkdir(exist_ok=True)
    size = {f: (ROOT / f).stat().st_size for f in files}
    # numba-cuda-mlir's runs first (the measurement); within a target the split files first, the
    # most workers first (they set the wall time), then the rest by size
    order = sorted(files, key=lambda f: (-split.get(Path(f).name, 1), -size[f]))
    tasks = [(t, f) for t in targets for f in order]
    results = {}

    def one(task):
        target, file = task
        left = deadline - time.time()
        tag = f"{target}__{Path(file).stem}"
        if left < 10:
            results[task] = {"rc": "not run: the budget is spent", "wall_s": 0, "cases": []}
            return
        xml, log = folder / f"{tag}.xml", folder / f"{tag}.log"
        n = split.get(Path(file).name, 1)
        cmd = _pytest_cmd([file, "-m", "gpu"], xml, per_test, n)
        rc, wall = _run_boxed(cmd, _child_env(target), log, min(file_seconds, left))
        results[task] = {"rc": rc, "wall_s": wall, "cases": _cases_from(xml, log), "workers": n}
        n = Counter(c[2] for c in results[task]["cases"])
        print(f"[{time.strftime('%H:%M:%S')}] {target} {file}: rc {rc}, {wall} s, {dict(n)}", flush=True)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, tasks))
    lines = ["| file | " + " | ".join(f"{t}: passed / failed / error / skipped (s)" for t in targets) + " |"]
    lines.append("|---|" + "---|" * len(targets))
    totals = {t: Counter() for t in targets}
    for file in files:
        cells = []
        for t in targets:
            r = results[(t, file)]
            c = Counter(case[2] for case in r["cases"])
            totals[t].update(c)
            note = "" if r["rc"] in (0, 1, 5) else f", {r['rc']}"
            cells.append(f"{c['passed']} / {c['failed']} / {c['error']} / {c['skipped']} ({r['wall_s']}{note})")
        lines.append(f"| {Path(file).name} | " + " | ".join(cells) + " |")
    cells = []
    for t in targets:
        c = totals[t]
        ran = c["passed"] + c["failed"] + c["error"]
        share = f", {100 * c['passed'] / ran:.1f}% of those run passed" if ran else ""
        cells.append(f"**{c['passed']} / {c['failed']} / {c['error']} / {c['skipped']}**{share}")
    lines.append("| **all** | " + " | ".join(cells) + " |")
    for t in targets:
        classes = defaultdict(lambda: {"n": 0, "files": set(), "where": Counter(), "example": ""})
        for file in files:
            for f, name, status, message, where in results[(t, file)]["cases"]:
                if status in ("failed", "error"):
                    c = classes[_normalize(message) or "(no message)"]
                    c["n"] += 1
                    c["files"].add(Path(f).name)
                    if where:
                        c["where"][where] += 1
                    c["example"] = c["example"] or f"{Path(f).name}::{name}"
        if not classes:
            continue
        lines += ["", f"Failures under {t} by cause:", "", "| n | cause | vtnumba frame (count) | files | example |"]
        lines.append("|---|---|---|---|---|")
        for msg, c in sorted(classes.items(), key=lambda kv: -kv[1]["n"]):
            where = ", ".join(f"{w} ({k})" for w, k in c["where"].most_common(3))
            names = ", ".join(sorted(c["files"])[:5]) + (" …" if len(c["files"]) > 5 else "")
            lines.append(f"| {c['n']} | {msg.replace('|', '/')} | {where} | {names} | {c['example']} |")
    text = "\n".join(lines)
    (out / "files.md").write_text(text + "\n")
    (out / "files.json").write_text(json.dumps({f"{t} {f}": r for (t, f), r in results.items()}, indent=1, default=str))
    return text


def _sanitizer():
    import glob
    import shutil

    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/compute-sanitizer", "/usr/local/cuda*/compute-sanitizer/compute-sanitizer"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def run_sanitizer(out, deadline, per_test, seconds=200):
    """memcheck on each SANITIZED test under numba-cuda-mlir, and each without vtnumba's PTX rewrite
    (DEVICE.md, 9) and without the sanitizer: that one must fail, the sanitized one pass with no error."""
    folder = out / "sanitizer"
    folder.mkdir(exist_ok=True)
    (folder / "vt_no_ptx_rewrite.py").write_text(_NO_REWRITE_PLUGIN)
    (folder / "vt_no_pool.py").write_text(_NO_POOL_PLUGIN)
    tool = _sanitizer()

    def one(job):
        i, node, mode = job
        left = deadline - time.time()
        if left < 15:
            return (node, mode, "not run: the budget is spent", "", 0)
        env = _child_env(MLIR)
        xml, log = folder / f"{mode}_{i}.xml", folder / f"{mode}_{i}.log"
        if mode == "memcheck":
            if tool is None:
                return (node, mode, "compute-sanitizer not found", "", 0)
            cmd = [
                tool,
                "--tool",
                "memcheck",
                "--target-processes",
                "all",
                "--error-exitcode",
                "99",
                "--print-limit",
                "20",
            ]
            cmd += _pytest_cmd([node, "-p", "vt_no_pool"], xml, per_test)
            env["PYTHONPATH"] = f"{folder}{os.pathsep}{env['PYTHONPATH']}"
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        else:
            env["PYTHONPATH"] = f"{folder}{os.pathsep}{env['PYTHONPATH']}"
            cmd = _pytest_cmd([node, "-p", "vt_no_ptx_rewrite"], xml, per_test)
        rc, wall = _run_boxed(cmd, env, log, min(seconds, left))
        summary = re.findall(r"ERROR SUMMARY: \d+ errors?", log.read_text(errors="replace"))
        outcome = Counter(c[2] for c in _cases_from(xml, log))
        print(f"[{time.strftime('%H:%M:%S')}] sanitizer {mode} {node}: rc {rc}, {wall} s", flush=True)
        return (node, mode, rc, f"{dict(outcome)} {summary[-1] if summary else ''}".strip(), wall)

    from concurrent.futures import ThreadPoolExecutor

    jobs = [(i, node, mode) for i, node in enumerate(SANITIZED) for mode in ("memcheck", "no_rewrite")]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:  # 4 processes beside the files' own
        rows = list(pool.map(one, jobs))
    lines = [
        f"compute-sanitizer: {tool or 'not found'}; under {MLIR}. memcheck: the test with vtnumba as it is "
        "(expected: passed, 0 errors); no_rewrite: the test with numba-cuda-mlir's own dynamic shared "
        "memory (expected: failed)",
        "",
        "| test | run | rc | outcome | s |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {m} | {rc} | {o} | {w} |" for n, m, rc, o, w in rows]
    text = "\n".join(lines)
    (out / "sanitizer.md").write_text(text + "\n")
    return text


# ================================================================================================
# the driver


def _child_env(target):
    env = dict(os.environ)
    env["VTNUMBA_CUDA_TARGET"] = target
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return env


def run_part(out, part, target, seconds, extra=()):
    """One part in its own process and time box; its JSON result, or why there is none."""
    tag = f"{part}{'_' + extra[0] if extra else ''}_{target}"
    result = out / f"{tag}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        str(out),
        "--part",
        part,
        "--target",
        target,
        "--result",
        str(result),
        *(["--which", extra[0]] if extra else []),
    ]
    t0 = time.time()
    with open(out / f"{tag}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=_child_env(target), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(seconds, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = f"killed at its {seconds:.0f} s box"
            proc.wait()
    wall = round(time.time() - t0, 1)
    if result.exists():
        data = json.loads(result.read_text())
    else:
        tail = (out / f"{tag}.log").read_text(errors="replace").strip().splitlines()[-3:]
        data = {"error": f"no result (rc {rc}); log ends: {' / '.join(tail)[-400:]}"}
    data["_rc"], data["_wall_s"] = rc, wall
    print(f"[{time.strftime('%H:%M:%S')}] {tag}: rc {rc}, {wall} s", flush=True)
    return tag, data


def _cell(r):
    if not isinstance(r, dict) or "ok" not in r:
        return str(r)
    if r["ok"]:
        return json.dumps(r["value"]) if not isinstance(r["value"], (int, float, str)) else str(r["value"])
    return f"FAIL {r['error']}" + (f" ({r['where']})" if r.get("where") else "")


def report(out, results, suite_md, suite_info, t_start):
    lines = [
        f"# numba-cuda-mlir probe, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"commit {os.environ.get('VT_COMMIT', '?')}, {round(time.time() - t_start)} s",
        "",
    ]
    for tag, data in results.items():
        lines.append(f"## {tag} (rc {data.get('_rc')}, {data.get('_wall_s')} s)")
        lines.append("")
        if "error" in data:
            lines += [f"- {data['error']}", ""]
        for key, value in data.items():
            if key.startswith("_") or key in ("error", "target"):
                continue
            if isinstance(value, dict) and value and all(isinstance(v, dict) and "ok" in v for v in value.values()):
                lines += [f"- {key}:"] + [f"  - {k}: {_cell(v)}" for k, v in value.items()]
            elif key == "exhaustive":
                for name, c in value.items():
                    lines.append(
                        f"- G2 {name}: {c['mismatches']} wrong codes of 2^32 ({c['nan_mismatches']} on NaN "
                        f"patterns), {c['distinct_pairs']} distinct want->got, most: {c['pairs']}, first: {c['first']}"
                    )
            else:
                lines.append(f"- {key}: {_cell(value)}")
        lines.append("")
    if suite_md is not None:
        lines += (
            [
                f"## suite under {MLIR} (rc {suite_info.get('rc')}, {suite_info.get('wall_s')} s)",
                "",
                f"`{suite_info.get('cmd', '')}`",
                "",
            ]
            + [f"- {n}" for n in suite_info.get("notes", [])]
            + ["", suite_md]
        )
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for logs, JSON, junit XML and summary.md")
    ap.add_argument(
        "--budget",
        type=float,
        default=510.0,
        help="seconds for everything (the suite gets what is left, <= --suite-seconds)",
    )
    ap.add_argument(
        "--parts",
        default="env,g2,speed,graph,suite",
        help="comma-separated subset of env,g2,speed,graph,suite,files,sanitizer",
    )
    ap.add_argument("--files", default="", help="files: the test files (comma-separated; default: every GPU file)")
    ap.add_argument("--targets", default=f"{MLIR},{NC}", help="files: the targets, in priority order")
    ap.add_argument("--file-workers", type=int, default=12, help="files: files (pytest runs) at a time")
    ap.add_argument("--file-seconds", type=float, default=240.0, help="files: the box of one file's process")
    ap.add_argument(
        "--split",
        default=SPLIT,
        help="files: FILE:N,... run over N xdist workers (each its own process and CUDA context)",
    )
    ap.add_argument("--suite-seconds", type=float, default=300.0, help="the most seconds the suite may take")
    ap.add_argument("--workers", type=int, default=8, help="pytest-xdist workers for the suite")
    ap.add_argument("--per-test", type=int, default=90, help="seconds one test may take in the suite")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--which", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.budget <= 0:
        ap.error(f"--budget must be > 0 seconds, got {args.budget}")
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - {"env", "g2", "speed", "graph", "suite", "files", "sanitizer"})
    if unknown:
        ap.error(f"--parts may name env, g2, speed, graph, suite, files and sanitizer, got {unknown}")
    targets = [t for t in args.targets.split(",") if t]
    if not targets or set(targets) - {MLIR, NC}:
        ap.error(f"--targets may name {MLIR} and {NC}, got {args.targets!r}")

    if args.part:  # a child: one part, its result as JSON
        fn = {"env": part_env, "g2": part_g2, "speed": part_speed}.get(args.part)
        data = fn(args.target, out) if fn else part_graph(args.target, out, args.which)
        Path(args.result).write_text(json.dumps(data, indent=1, default=str))
        return

    t_start = time.time()
    deadline = t_start + args.budget
    left = lambda: deadline - time.time()  # noqa: E731
    # (part, target, box in seconds, extra): numba-cuda-mlir first, numba-cuda as the control
    plan = [
        ("env", MLIR, 45),
        ("env", NC, 30),
        ("g2", MLIR, 50),
        ("g2", NC, 40),
        ("speed", NC, 40),
        ("speed", MLIR, 40),
        ("graph", MLIR, 20, "plain"),
        ("graph", MLIR, 20, "vtnumba"),
        ("graph", NC, 20, "plain"),
        ("graph", NC, 25, "vtnumba"),
    ]
    results = {}
    for part, target, box, *extra in plan:
        if part not in parts:
            continue
        # the suite keeps at least 120 s of the budget when it is asked for
        box = min(box, left() - (120 if {"suite", "files"} & set(parts) else 5))
        if box < 5:
            results[f"{part}_{target}"] = {"error": "skipped: the budget is spent"}
            continue
        tag, data = run_part(out, part, target, box, tuple(extra))
        results[tag] = data
    suite_md, suite_info = None, {}
    if "suite" in parts:
        seconds = min(args.suite_seconds, left() - 15)
        suite_info = run_suite(out, seconds, args.per_test, args.workers)
        try:
            suite_md = summarize_suite(out)
        except Exception as exc:  # noqa: BLE001
            suite_md = f"(no summary: {_first_line(exc)})"
        (out / "suite.md").write_text(suite_md + "\n")
    extra = []
    sanitized = {}
    if "sanitizer" in parts:  # beside the files, in a thread of its own: its 4 processes share the GPU
        import threading

        def sanitize():
            sanitized["md"] = run_sanitizer(out, deadline - 30, args.per_test)

        sanitizer = threading.Thread(target=sanitize)
        sanitizer.start()
    if "files" in parts:
        files = [f for f in args.files.split(",") if f] or gpu_test_files()
        t0 = time.time()
        split = {name: int(n) for name, n in (item.split(":") for item in args.split.split(",") if item)}
        table = run_files(
            out, files, targets, deadline - 10, args.file_seconds, args.per_test, args.file_workers, split
        )
        extra += [f"## every GPU test file in its own process ({round(time.time() - t0)} s)", "", table, ""]
    if "sanitizer" in parts:
        sanitizer.join()
        extra += ["## compute-sanitizer (issue 42's causes)", "", sanitized.get("md", "(no result)"), ""]
    text = report(out, results, suite_md, suite_info, t_start)
    if extra:
        text += "\n" + "\n".join(extra) + "\n"
        (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
