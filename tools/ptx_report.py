"""Offline PTX inventory of every GPU kernel variant vtnumba builds, for comparing two trees.

No GPU is needed: each kernel is compiled to PTX for compute capability 9.0 (sm_90a for the wgmma
kernels) with numba-cuda's "current device" stood in for, then assembled by ``ptxas -v`` (from the
``nvidia-cuda-nvcc`` wheel) for its registers, spills, stack frame and shared memory. Per variant
it records the PTX's instruction count per opcode and a hash of the PTX with Numba's mangled names
(which carry the module path and a compile-order counter) replaced by their order of appearance, so
a module that only moved gives the same hash.

    python tools/ptx_report.py snapshot OUT.json [--only SUBSTRING] [--ptx-dir DIR] [--cc 12.1] [--sass]
                                   [--family NAME ...] [--stride N]
    python tools/ptx_report.py compare BEFORE.json AFTER.json     # a markdown table per family
    python tools/ptx_report.py rehash OUT.json PTX_DIR             # hashes again from the saved PTX

Run it from the root of the tree to measure (it imports ``vtnumba`` from the current directory).
The variants are those the dispatch can build on a GPU (``chain``: only where
``chains_in_float32`` makes it, sm_90; ``hardware``: the inline-PTX loads and encoder, or the
portable ones of GPUs before sm_89 for the kernels that run there), every tile configuration except
the simulator's, both output kinds. ``compare`` takes the variants both snapshots hold.

``--cc 12.1`` (or 12.0) builds the inventory for GB10 (Blackwell workstations): every variant that
runs there (not the sm_90a wgmma kernels), the block-scaled mma's kernels (``unit``, ``mx``) for the
arch-specific sm_121a. ``--sass`` adds, per variant, the SASS's mma instructions and its F2FP
conversions (``cuobjdump -sass``; needs ``nvdisasm`` on PATH: the ``nvidia-cuda-nvdisasm`` wheel, or
the one triton ships, which this script also looks for).

``--family`` (repeatable) keeps the variants of the named families only (quant, epilogue, tiled, gemv,
tc_gemm, tc_gemv, wg_gemm), and ``--stride N`` every N-th variant of each family after the other
filters: a sample of the whole inventory that a slow machine builds in minutes. Both leave each
variant's record as the full snapshot writes it, so a sampled snapshot compares with a full one.
"""

import argparse
import collections
import gzip
import hashlib
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

CC = (9, 0)
# Numba's mangled names (module path, compile-order counter) and its shared arrays' symbols
# (numbered in compile order): renamed F0, F1, ... in order of appearance before hashing; an F name
# is renamed again, so PTX saved by an earlier version of this normalization hashes the same
_MANGLED = re.compile(r"_ZN[\w$]+|_cudapy_smem_\d+|\bF\d+\b")
_REGISTERS = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")

# where each kernel module lives: its path since vtnumba.cuda's layers, then its path before them (so
# a snapshot of an older tree still finds it)
_MODULES = {
    "quant": ("vtnumba.cuda.kernels.quant", "vtnumba.cuda.quant"),
    "epilogue": ("vtnumba.cuda.kernels.epilogue", "vtnumba.cuda.epilogue"),
    "tiled": ("vtnumba.cuda.kernels.tiled", "vtnumba.cuda.tiled"),
    "gemv": ("vtnumba.cuda.kernels.gemv", "vtnumba.cuda.gemv"),
    "tc_gemm": ("vtnumba.cuda.kernels.tc_gemm", "vtnumba.cuda.tc_gemm"),
    "tc_gemv": ("vtnumba.cuda.kernels.tc_gemv", "vtnumba.cuda.tc_gemv"),
    "wg_gemm": ("vtnumba.cuda.kernels.sm90_wgmma_gemm", "vtnumba.cuda.wg_gemm"),
}


def _stand_in_device():
    """numba-cuda 0.30 asks the driver for the current device when a kernel calls device functions;
    an object with the target's compute capability gets past that (DEVICE.md, "Compiling for a GPU
    you do not have")."""
    import numba.cuda.dispatcher as dispatcher

    class _Device:
        compute_capability = CC  # the module's CC at the time of the call (--cc)

    dispatcher.get_current_device = lambda: _Device()


def _module(key):
    new, old = _MODULES[key]
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError:
        return importlib.import_module(old)


def variants():
    """(family, label, make) for every kernel variant; ``make()`` returns the launch.Kernel."""
    quant, epilogue, tiled = _module("quant"), _module("epilogue"), _module("tiled")
    gemv, tc_gemm, tc_gemv, wg_gemm = _module("gemv"), _module("tc_gemm"), _module("tc_gemv"), _module("wg_gemm")
    out = []
    kinds, encoders = ("float32", "float16", "bfloat16"), ("hardware", "portable")
    for kind in kinds:
        out.append(("quant", f"amax {kind}", lambda k=kind: quant.amax_kernel(k)))
        for enc in encoders:
            out.append(("quant", f"dynamic {kind} {enc}", lambda k=kind, e=enc: quant.dynamic_kernel(k, e)))
            out.append(("quant", f"dynamic_small {kind} {enc}", lambda k=kind, e=enc: quant.dynamic_small_kernel(k, e)))
            for flag in (False, True):
                out.append(
                    (
                        "quant",
                        f"static {kind} {enc} device_scale={flag}",
                        lambda k=kind, e=enc, f=flag: quant.static_kernel(k, e, f),
                    )
                )
                out.append(
                    (
                        "quant",
                        f"per_token {kind} {enc} device_ub={flag}",
                        lambda k=kind, e=enc, f=flag: quant.per_token_kernel(k, e, f),
                    )
                )
                out.append(
                    (
                        "quant",
                        f"per_group {kind} {enc} ue8m0={flag}",
                        lambda k=kind, e=enc, f=flag: quant.per_group_kernel(k, e, f)[0],
                    )
                )
                rule = "rceil" if flag else "floor"
                out.append(
                    (
                        "quant",
                        f"per_group {kind} {enc} e8m0={rule}",
                        lambda k=kind, e=enc, r=rule: quant.per_group_kernel(k, e, False, r)[0],
                    )
                )
                for width in (1, 2, 4, 8, 16, 32):
                    for one_read in (False, True):
                        out.append(
                            (
                                "quant",
                                f"per_group16 {kind} {enc} ue8m0={flag} width={width} one_read={one_read}",
                                lambda k=kind, e=enc, f=flag, w=width, o=one_read: quant.per_group_vector_kernel(
                                    k, e, f, w, o
                                )[0],
                            )
                        )
    for f32 in (False, True):
        out.append(("epilogue", f"epilogue f32={f32}", lambda f=f32: epilogue.epilogue_kernel(f)))
        out.append(("epilogue", f"epilogue_vector f32={f32}", lambda f=f32: epilogue.epilogue_vector_kernel(f)))
        out.append(("tiled", f"tiled f32={f32}", lambda f=f32: tiled.tiled_kernel(f)))
        out.append(("tiled", f"tiled_block f32={f32}", lambda f=f32: tiled.tiled_block_kernel(f)))
        for ea, eb in ((True, True), (False, True)):
            out.append(
                (
                    "tiled",
                    f"tiled_block f32={f32} e8m0_a={ea} e8m0_b={eb}",
                    lambda f=f32, a=ea, b=eb: tiled.tiled_block_kernel(f, a, b),
                )
            )
    for m in (1, 2, 4):
        for hardware in (True, False):
            for f32 in (False, True):
                for stage in gemv.GemvStage:
                    out.append(
                        (
                            "gemv",
                            f"gemv m={m} hardware={hardware} f32={f32} {stage.name}",
                            lambda m=m, h=hardware, f=f32, s=stage: gemv.gemv_launcher(m, h, f, s),
                        )
                    )
    for name, cfg in tc_gemm.GEMM_CONFIGS.items():
        if name.startswith("sim_"):
            continue
        for block_scaled in (False, True):
            for promotion, chain in (("per_mma", False), ("per_mma", True), ("per_128", False)):
                if chain and cfg.f16:
                    continue  # gemm_launch never chains the f16-staged kernel
                for f32 in (False, True):
                    out.append(
                        (
                            "tc_gemm",
                            f"tc_gemm {name} {promotion} block={block_scaled} chain={chain} f32={f32}",
                            lambda c=cfg, p=promotion, b=block_scaled, ch=chain, f=f32: tc_gemm.gemm_launcher(
                                c, p, b, ch, f
                            ),
                        )
                    )
                    if CC[0] == 12 and not chain and not cfg.f16:  # the block-scaled mma, unit scales
                        out.append(
                            (
                                "tc_gemm",
                                f"tc_gemm {name} {promotion} block={block_scaled} unit f32={f32}",
                                lambda c=cfg, p=promotion, b=block_scaled, f=f32: tc_gemm.gemm_launcher(
                                    c, p, b, False, f, "unit"
                                ),
                            )
                        )
        if not cfg.f16:
            for kind in ("mx", "mx_explicit") if CC[0] == 12 else ("mx_explicit",):
                for f32 in (False, True):
                    out.append(
                        (
                            "tc_gemm",
                            f"tc_gemm {name} {kind} f32={f32}",
                            lambda c=cfg, k=kind, f=f32: tc_gemm.gemm_launcher(c, "per_mma", False, False, f, k),
                        )
                    )
    modes = [
        (tc_gemv.MODE_CODES, False),
        (tc_gemv.MODE_STATIC, False),
        (tc_gemv.MODE_DYNAMIC, False),
        (tc_gemv.MODE_PER_TOKEN, False),
        (tc_gemv.MODE_CODES, True),
        (tc_gemv.MODE_PER_GROUP, True),
    ]
    for name, cfg in tc_gemv.GEMV_CONFIGS.items():
        if name.startswith("sim_"):
            continue
        for m in (1, 16):
            for mode, block_scaled in modes:
                # (hardware, chain) as _device_flags gives them on a GPU: sm_90, sm_89 / sm_12x (the
                # portable loads, (False, False), are the simulator's: no GPU without them runs mma)
                for hardware, chain in ((True, True), (True, False)):
                    for f32 in (False, True):
                        out.append(
                            (
                                "tc_gemv",
                                f"tc_gemv {name} m={m} mode={mode} block={block_scaled} "
                                f"hardware={hardware} chain={chain} f32={f32}",
                                lambda m=m, c=cfg, md=mode, b=block_scaled, h=hardware, ch=chain, f=f32: (
                                    tc_gemv.gemv_launcher(m, c, md, b, h, ch, f)
                                ),
                            )
                        )
                        if CC[0] == 12 and not chain:  # sm_12x: the block-scaled mma, unit scales
                            out.append(
                                (
                                    "tc_gemv",
                                    f"tc_gemv {name} m={m} mode={mode} block={block_scaled} "
                                    f"hardware={hardware} unit f32={f32}",
                                    lambda m=m, c=cfg, md=mode, b=block_scaled, h=hardware, f=f32: (
                                        tc_gemv.gemv_launcher(m, c, md, b, h, False, f, True)
                                    ),
                                )
                            )
    for name, cfg in wg_gemm.WG_CONFIGS.items() if CC == (9, 0) else ():  # sm_90a only
        for promotion in wg_gemm.PROMOTIONS:
            for block_scaled in (False, True):
                for f32 in (False, True):
                    out.append(
                        (
                            "wg_gemm",
                            f"wg_gemm {name} {promotion} block={block_scaled} f32={f32}",
                            lambda c=cfg, p=promotion, b=block_scaled, f=f32: wg_gemm.gemm_launcher(c, p, b, f),
                        )
                    )
    # the grouped tiled GEMMs (a mixture's experts at prefill), in the tile configuration they run
    if hasattr(tc_gemm, "grouped_gemm_signature"):
        kinds = ("unit", "mx") if CC[0] == 12 else ("plain", "mx_explicit")
        for kind in kinds:
            for block_scaled in (False, True) if kind not in tc_gemm.MX_KINDS else (False,):
                for f32 in (False, True):
                    chain = CC == (9, 0) and kind == "plain"
                    out.append(
                        (
                            "tc_gemm",
                            f"tc_gemm grouped {kind} block={block_scaled} chain={chain} f32={f32}",
                            lambda k=kind, b=block_scaled, ch=chain, f=f32: tc_gemm.gemm_launcher(
                                tc_gemm.GEMM_DEFAULT, "per_mma", b, ch, f, k, True
                            ),
                        )
                    )
        grouped_configs = getattr(wg_gemm, "GROUPED_CONFIGS", {"rows_128": wg_gemm.WG_DEFAULT})
        for rows, cfg in grouped_configs.items() if CC == (9, 0) else ():
            for block_scaled in (False, True):
                for f32 in (False, True):
                    # the 128-row label is the one snapshots before the 64-row tiles hold
                    tag = "" if rows == "rows_128" else f" {rows}"
                    out.append(
                        (
                            "wg_gemm",
                            f"wg_gemm grouped{tag} per_128 block={block_scaled} f32={f32}",
                            lambda c=cfg, b=block_scaled, f=f32: wg_gemm.gemm_launcher(c, "per_128", b, f, True),
                        )
                    )
    return out


def normalize(ptx):
    """The PTX without comments, Numba's environment globals and blank lines, its mangled names
    renamed in order of appearance."""
    names = {}
    lines = []
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or "NumbaEnv" in s:
            continue
        lines.append(_MANGLED.sub(lambda m: names.setdefault(m.group(0), f"F{len(names)}"), s))
    return "\n".join(lines)


def opcodes(ptx):
    """Instruction count per full opcode (``ld.global.nc.v4.u32``), inline asm included."""
    counts = collections.Counter()
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s[0] in "./{}" or s.endswith(":") or s.startswith(")"):
            continue
        if s.startswith("@"):
            s = s.split(None, 1)[1] if " " in s else ""
        op = s.split(None, 1)[0].rstrip(";") if s else ""
        if op and re.match(r"[a-z]", op):
            counts[op] += 1
    return counts


_ADVISORY = re.compile(r"\((C75\d\d)\)")


def _ptxas(ptx, arch):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run(["ptxas", "-v", f"-arch={arch}", f.name, "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    text = res.stderr
    if res.returncode:
        raise RuntimeError(f"ptxas failed: {text[-2000:]}")
    regs = _REGISTERS.search(text)
    spills = _SPILLS.search(text)
    smem = _SMEM.search(text)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "stack": int(spills.group(1)) if spills else 0,
        "spill_stores": int(spills.group(2)) if spills else 0,
        "spill_loads": int(spills.group(3)) if spills else 0,
        "smem": int(smem.group(1)) if smem else 0,
        "warnings": sorted({line.strip() for line in text.splitlines() if "warning" in line.lower()}),
        # ptxas's wgmma advisories, printed as "ptxas info": C7514 (wgmmas serialized), C7517 (a
        # wgmma.wait_group injected); sm90_wgmma_gemm.py's docstring says what causes them
        "advisories": sorted(set(_ADVISORY.findall(text))),
    }


_SASS_OPS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")


def _sass(ptx, arch):
    """The SASS ptxas makes for ``arch``: its instruction count, its mma instructions by full name,
    its F2FP conversions (all, by name, and the e4m3 -> f16 unpacks among them)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        pathlib.Path(src).write_text(ptx)
        subprocess.run(["ptxas", f"-arch={arch}", src, "-o", cubin], check=True, capture_output=True)
        res = subprocess.run(["cuobjdump", "-sass", cubin], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"cuobjdump failed: {res.stderr.strip()[-500:]}")
    ops = [m.group(1) for m in _SASS_OPS.finditer(res.stdout)]
    mma = collections.Counter(op for op in ops if "MMA" in op)
    f2fp = collections.Counter(op for op in ops if op.startswith("F2FP"))
    # F2FP.F16.E4M3.UNPACK_B and kin: e4m3 -> f16, what sm_90 does to every FP8 mma operand; the
    # encoder's float32 -> e4m3 packs (F2FP.SATFINITE.E4M3.F32...) are conversions the kernel asks for
    unpack = sum(n for op, n in f2fp.items() if ".F16.E4M3" in op or "UNPACK" in op)
    return {
        "sass_instructions": len(ops),  # every instruction of the cubin's SASS (what a warp may issue)
        "sass_mma": dict(mma),
        "sass_f2fp": sum(f2fp.values()),
        "sass_f2fp_ops": dict(f2fp),
        "sass_fp8_unpack": unpack,
    }


def tool_path():
    """PATH with the CUDA wheels' tools (ptxas, cuobjdump, nvdisasm) in front, as the checks need them."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    extra = [os.path.join(site, "nvidia", "cu13", "bin"), os.path.join(site, "triton", "backends", "nvidia", "bin")]
    return os.pathsep.join([d for d in extra if os.path.isdir(d)] + [os.environ["PATH"]])


def _sample(todo, families=(), stride=1):
    """The variants of ``families`` (all where empty), every ``stride``-th of each family."""
    kept, seen = [], collections.Counter()
    for family, label, make in todo:
        if families and family not in families:
            continue
        if seen[family] % stride == 0:
            kept.append((family, label, make))
        seen[family] += 1
    return kept


def snapshot(path, only="", ptx_dir=None, sass=False, families=(), stride=1):
    os.environ["PATH"] = tool_path()
    sys.path.insert(0, os.getcwd())
    _stand_in_device()
    records = {}
    todo = _sample([v for v in variants() if only in v[1]], families, stride)
    start = time.time()
    for i, (family, label, make) in enumerate(todo):
        try:
            kernel = make()
        except ValueError as exc:  # a configuration the factory refuses (e.g. BN does not divide 128)
            records[label] = {"family": family, "refused": str(exc)}
            continue
        arch_suffix = getattr(kernel, "_arch", "")
        ptx = kernel.ptx(CC)
        norm = normalize(ptx)
        arch = f"sm_{CC[0]}{CC[1]}{arch_suffix}"
        record = {
            "family": family,
            "arch": arch,
            "sha": hashlib.sha256(norm.encode()).hexdigest()[:16],
            "opcodes": dict(opcodes(ptx)),
            **_ptxas(ptx, arch),
        }
        if sass:
            record.update(_sass(ptx, arch))
        record["instructions"] = sum(record["opcodes"].values())
        records[label] = record
        if ptx_dir:
            out = _ptx_file(ptx_dir, label)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(gzip.compress(norm.encode()))
        print(
            f"[{i + 1}/{len(todo)} {time.time() - start:.0f}s] {label} ({arch}): {record['registers']} registers, "
            f"{record['spill_stores']} B spilled, {record['instructions']} instructions"
            + "".join(f"\n    ptxas: {w}" for w in record.get("warnings", ()))
            + (f", SASS {record['sass_mma']} F2FP {record['sass_f2fp_ops']}" if sass else ""),
            flush=True,
        )
    pathlib.Path(path).write_text(json.dumps(records, indent=1, sort_keys=True))


def _ptx_file(ptx_dir, label):
    return pathlib.Path(ptx_dir) / (re.sub(r"[^\w.=-]+", "_", label) + ".ptx.gz")


def rehash(path, ptx_dir):
    """Recompute every variant's hash from the PTX saved with --ptx-dir (after a change to
    ``normalize``: normalizing normalized PTX again is harmless)."""
    records = json.loads(pathlib.Path(path).read_text())
    for label, record in records.items():
        if "sha" in record:
            norm = normalize(gzip.decompress(_ptx_file(ptx_dir, label).read_bytes()).decode())
            record["sha"] = hashlib.sha256(norm.encode()).hexdigest()[:16]
    pathlib.Path(path).write_text(json.dumps(records, indent=1, sort_keys=True))


def compare(before_path, after_path):
    before = json.loads(pathlib.Path(before_path).read_text())
    after = json.loads(pathlib.Path(after_path).read_text())
    families = collections.OrderedDict()
    only = sorted(set(before) ^ set(after))
    for label in sorted(set(before) & set(after), key=lambda label: (before[label]["family"], label)):
        b, a = before.get(label), after.get(label)
        families.setdefault((b or a)["family"], []).append((label, b, a))
    print(
        "| family | variants | PTX identical (names aside) | same opcode counts | registers before -> after "
        "| spills (bytes) before -> after | instructions before -> after |"
    )
    print("|---|---|---|---|---|---|---|")
    changed = []
    for family, rows in families.items():
        built = [(label, b, a) for label, b, a in rows if b and a and "sha" in b and "sha" in a]
        same = sum(b["sha"] == a["sha"] for _, b, a in built)
        same_ops = sum(b["opcodes"] == a["opcodes"] for _, b, a in built)
        regs_b = sum(b["registers"] for _, b, _ in built)
        regs_a = sum(a["registers"] for _, _, a in built)
        spill_b = sum(b["spill_stores"] + b["spill_loads"] for _, b, _ in built)
        spill_a = sum(a["spill_stores"] + a["spill_loads"] for _, _, a in built)
        ins_b = sum(b["instructions"] for _, b, _ in built)
        ins_a = sum(a["instructions"] for _, _, a in built)
        missing = (
            len(rows) - len(built) - sum(1 for _, b, a in rows if (b or {}).get("refused") and (a or {}).get("refused"))
        )
        print(
            f"| {family} | {len(built)}{f' ({missing} missing)' if missing else ''} | {same} | {same_ops} "
            f"| {regs_b} -> {regs_a} (sum) | {spill_b} -> {spill_a} | {ins_b} -> {ins_a} |"
        )
        changed += [(label, b, a) for label, b, a in built if b["sha"] != a["sha"]]
    if changed:
        print("\nVariants whose PTX changed (registers, spill bytes, instructions; opcodes whose count moved):\n")
        for label, b, a in changed:
            diff = {
                op: a["opcodes"].get(op, 0) - b["opcodes"].get(op, 0)
                for op in set(a["opcodes"]) | set(b["opcodes"])
                if a["opcodes"].get(op, 0) != b["opcodes"].get(op, 0)
            }
            moved = ", ".join(f"{op} {d:+d}" for op, d in sorted(diff.items())) or "none (order or registers only)"
            print(
                f"- {label}: {b['registers']} -> {a['registers']} registers, "
                f"{b['spill_stores'] + b['spill_loads']} -> {a['spill_stores'] + a['spill_loads']} B, "
                f"{b['instructions']} -> {a['instructions']} instructions; {moved}"
            )
    if only:
        print(f"\n{len(only)} variants in one snapshot only (left out above), e.g. {only[0]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("out")
    snap.add_argument("--only", default="")
    snap.add_argument("--ptx-dir", default=None)
    snap.add_argument("--cc", default="9.0", help="compute capability to build for (12.1: GB10)")
    snap.add_argument("--sass", action="store_true", help="also count the SASS's mma and F2FP instructions")
    snap.add_argument("--family", action="append", default=[], help="only this family's variants (repeatable)")
    snap.add_argument("--stride", type=int, default=1, help="every N-th variant of each family")
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before")
    cmp_.add_argument("after")
    again = sub.add_parser("rehash")
    again.add_argument("out")
    again.add_argument("ptx_dir")
    args = parser.parse_args(argv)
    if args.command == "snapshot":
        global CC
        CC = tuple(int(v) for v in args.cc.split("."))
        snapshot(args.out, args.only, args.ptx_dir, args.sass, tuple(args.family), max(1, args.stride))
    elif args.command == "rehash":
        rehash(args.out, args.ptx_dir)
    else:
        compare(args.before, args.after)


if __name__ == "__main__":
    main()
