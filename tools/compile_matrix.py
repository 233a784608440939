"""Which kernel variants compile to PTX under each CUDA compiler, offline (no GPU).

    python tools/compile_matrix.py run OUT.json [--family NAME ...] [--stride N] [--only SUBSTRING ...] [--label L ...]
                                           [--cc 12.1]
    python tools/compile_matrix.py table NUMBA_CUDA.json NUMBA_CUDA_MLIR.json

``run`` compiles the variants of ``tools/ptx_report.py`` (the same filters as its snapshot; at 9.0 also
the mixture-of-experts kernels it leaves out, families ``moe`` and ``grouped``) under the compiler
``VTNUMBA_CUDA_TARGET`` selects (``cuda/ptx/target.py``), for compute capability 9.0 (or ``--cc``,
with ptx_report's variants for it), one at a time, and records per variant whether it compiled, the
error's type and first line where it did not, the PTX's opcode counts and whether ``ptxas``
assembles it (registers, spills). It keeps going past failures. Under numba-cuda the "current
device" is stood in for as ptx_report does; under numba-cuda-mlir its cached compute capability
(``numba_cuda_mlir.tools._cached_cc``, private in 0.6.0) is set instead, which is all its compiler
asks the driver for.

It also records whether the PTX's ``.entry`` parameters are those the launcher packs for that
compiler (``runtime/launch.py``'s load-time check) and vtnumba's inline-PTX statements
(``inline_asm``).

``table`` prints the pass table by family (compiles / assembles / launcher ABI under each), the
failures grouped by cause, and for the variants both built how many have the same opcode totals, the
same inline-PTX statements (the distinct statements) and the same statements as often (the count in
the PTX text, which loop unrolling and tail duplication change, not how often one runs).

Run it from the root of the tree to measure (it imports ``vtnumba`` from the current directory).
"""

import argparse
import collections
import json
import os
import pathlib
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ptx_report  # noqa: E402  (the variants, the opcode counter, ptxas)

CC = (9, 0)
# the instructions vtnumba writes as inline PTX (cuda/ptx/): their statements are compared across the
# compilers, not the compilers' own inline asm (numba-cuda-mlir reads %tid.x through one)
VTNUMBA_ASM = (
    "cvt.rn.satfinite.e4m3x2.f32",
    "cvt.f32.f16",
    "cvt.rn.f16x2.e4m3x2",
    "ld.global.nc.v4.u32",
    "mma.sync.aligned",
    "ldmatrix.sync.aligned",
    "cp.async",
    "wgmma.",
    "mbarrier.",
    "fence.proxy.async",
)
_REGISTER = re.compile(r"%([a-z]+)\d+")


def inline_asm(ptx):
    """{statement: count} of vtnumba's inline-PTX statements in ``ptx`` (the text between the
    compiler's "begin inline asm" / "end inline asm" markers, whitespace collapsed), registers
    renamed to their class (``%f12`` -> ``%f``): what the same intrinsic gives under either compiler."""
    counts = collections.Counter()
    inside, text = False, []
    for line in ptx.splitlines():
        s = line.strip()
        if s == "// begin inline asm":
            inside, text = True, []
        elif s == "// end inline asm":
            inside = False
            statement = " ".join(" ".join(text).split())
            if any(op in statement for op in VTNUMBA_ASM):
                counts[_REGISTER.sub(lambda m: "%" + m.group(1), statement)] += 1
        elif inside:
            text.append(s)
    return dict(counts)


def moe_variants():
    """(family, label, make) for the mixture-of-experts kernels, which ptx_report's inventory leaves
    out: the routing maps, gather, SiLU and combine (``moe``), the decode grouped GEMV (``grouped``)."""
    from vtnumba.cuda.kernels import grouped_gemm, moe

    out = [("moe", f"moe align ids_int64={b}", lambda b=b: moe.align_kernel(b)) for b in (False, True)]
    out += [("moe", f"moe align_counts ids_int64={b}", lambda b=b: moe.align_counts_kernel(b)) for b in (False, True)]
    out += [("moe", "moe active_experts", moe.active_experts_kernel), ("moe", "moe row_tiles", moe.row_tiles_kernel)]
    out += [("moe", f"moe gather unit={u}", lambda u=u: moe.gather_kernel(u)) for u in (16, 2)]
    for kind in ("float32", "bfloat16"):
        for enc in ("hardware", "portable"):
            out.append(("moe", f"moe static_rows {kind} {enc}", lambda k=kind, e=enc: moe.static_rows_kernel(k, e)))
    for mode in moe.SiluMode:
        out.append(("moe", f"moe silu {mode.name} hardware", lambda m=mode: moe.silu_kernel(m, "hardware")))
    out.append(
        ("moe", "moe silu PER_TOKEN width=1", lambda: moe.silu_kernel(moe.SiluMode.PER_TOKEN, "hardware", width=1))
    )
    for segment in (8, 32):  # g = 32 (MXFP8) and 128 at four columns a lane
        out.append(
            (
                "moe",
                f"moe silu PER_GROUP segment={segment}",
                lambda s=segment: moe.silu_kernel(moe.SiluMode.PER_GROUP, "hardware", segment=s),
            )
        )
    out.append(
        (
            "moe",
            "moe silu PER_GROUP e8m0=rceil",
            lambda: moe.silu_kernel(moe.SiluMode.PER_GROUP, "hardware", False, "rceil", segment=8),
        )
    )
    for w in moe.WeightKind:
        for f32 in (False, True):
            out.append(("moe", f"moe combine {w.name} f32={f32}", lambda w=w, f=f32: moe.combine_kernel(w, f)))
            out.append(
                (
                    "moe",
                    f"moe combine {w.name} f32={f32} k=8 width=4",
                    lambda w=w, f=f32: moe.combine_kernel(w, f, 8, 4),
                )
            )
    for m_tile in (1, 2, 4):
        for blocked in (False, True):
            for hardware in (True, False):
                rows, segment = grouped_gemm.rows_for(m_tile), grouped_gemm.segment_for(128) if blocked else 1
                out.append(
                    (
                        "grouped",
                        f"grouped m_tile={m_tile} blocked={blocked} hardware={hardware}",
                        lambda m=m_tile, r=rows, s=segment, b=blocked, h=hardware: grouped_gemm.grouped_launcher(
                            m, r, 128, s, b, False, False, h, False
                        ),
                    )
                )
    for sa, sb in ((False, False), (True, True)):
        out.append(
            ("grouped", f"grouped general e8m0={sa}", lambda a=sa, b=sb: grouped_gemm.general_launcher(a, b, True))
        )
    return out


def _stand_in(target):
    if target == "numba-cuda-mlir":
        import numba_cuda_mlir.tools as tools

        tools._cached_cc = CC
    else:
        ptx_report._stand_in_device()


def _root(exc):
    """The innermost exception of a chain: numba-cuda-mlir wraps its internal errors ("This line in
    your program has triggered a compiler bug") around the one that names the cause."""
    seen = {id(exc)}
    while (exc.__cause__ or exc.__context__) is not None and id(exc.__cause__ or exc.__context__) not in seen:
        exc = exc.__cause__ or exc.__context__
        seen.add(id(exc))
    return exc


def _where(exc):
    """The innermost frame of the traceback inside vtnumba (file:line), else the innermost one."""
    frames = traceback.extract_tb(_root(exc).__traceback__)
    ours = [f for f in frames if "vtnumba" in f.filename]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return ""
    path = frame.filename
    cut = path.rfind("vtnumba" + os.sep)
    return f"{path[cut:] if cut >= 0 else os.path.basename(path)}:{frame.lineno}"


def _cause(exc):
    """One line naming the failure: the exception's type and the first meaningful line of its text."""

    def first_line(e):
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        return next((ln for ln in lines if not ln.startswith(("During:", "File", "^", "Failed in"))), "")[:300]

    root = _root(exc)
    text = f"{type(exc).__name__}: {first_line(exc)}"
    return text if root is exc else f"{text} <- {type(root).__name__}: {first_line(root)}"


def run(path, families=(), stride=1, only=("",), labels=()):
    os.environ["PATH"] = ptx_report.tool_path()
    sys.path.insert(0, os.getcwd())
    from vtnumba.cuda.ptx import target

    if target.IMPORT_ERROR is not None:
        raise SystemExit(f"{target.TARGET} does not import here: {target.IMPORT_ERROR!r}")
    _stand_in(target.TARGET)
    inventory = ptx_report.variants() + (moe_variants() if CC == (9, 0) else [])
    todo = [v for v in inventory if any(o in v[1] for o in only) and (not labels or v[1] in labels)]
    todo = ptx_report._sample(todo, families, stride)
    records = {}
    start = time.time()
    for i, (family, label, make) in enumerate(todo):
        t0 = time.time()
        record = {"family": family, "target": target.TARGET}
        try:
            kernel = make()  # the factory: nothing is compiled yet
        except ValueError as exc:  # a configuration it refuses (ptx_report records it too)
            record.update(refused=str(exc))
            records[label] = record
            continue
        arch = f"sm_{CC[0]}{CC[1]}{getattr(kernel, '_arch', '')}"
        try:
            ptx = kernel.ptx(CC)
        except Exception as exc:
            record.update(ok=False, cause=_cause(exc), where=_where(exc))
        else:
            record.update(ok=True, arch=arch, opcodes=dict(ptx_report.opcodes(ptx)), inline_asm=inline_asm(ptx))
            record["abi"] = _abi_matches(kernel, ptx)
            try:
                record.update(ptxas=True, **ptx_report._ptxas(ptx, arch))
            except RuntimeError as exc:
                record.update(ptxas=False, ptxas_error=str(exc)[-500:])
            except FileNotFoundError:  # no ptxas here (the nvidia-cuda-nvcc wheel)
                record.update(ptxas=None)
        record["seconds"] = round(time.time() - t0, 2)
        records[label] = record
        state = "ok" if record.get("ok") else f"FAIL {record.get('cause', '')[:160]} ({record.get('where')})"
        print(f"[{i + 1}/{len(todo)} {time.time() - start:.0f}s] {label}: {state}", flush=True)
    pathlib.Path(path).write_text(json.dumps(records, indent=1, sort_keys=True))


def _abi_matches(kernel, ptx):
    """Whether the PTX's .entry parameters are the widths the launcher packs for this compiler (the
    check ``launch.Kernel`` makes at load time, made here without a GPU)."""
    from vtnumba.cuda.runtime.launch import entry_params

    _, widths = entry_params(ptx)
    return widths == [w for arg in kernel._plan for w in arg.ptx_widths]


def _normalized_cause(cause):
    """A failure's cause without the parts that vary per kernel (names, numbers, types)."""
    cause = re.sub(r"\b_?Z\w+|0x[0-9a-f]+|\d+", "#", cause)
    return cause[:160]


def table(nc_path, mlir_path):
    nc = json.loads(pathlib.Path(nc_path).read_text())
    ml = json.loads(pathlib.Path(mlir_path).read_text())
    labels = [label for label in nc if label in ml and "refused" not in nc[label] and "refused" not in ml[label]]
    families = collections.OrderedDict()
    for label in sorted(labels, key=lambda label: (nc[label]["family"], label)):
        families.setdefault(nc[label]["family"], []).append(label)
    print(
        "| family | variants | numba-cuda: compiles / ptxas / ABI | numba-cuda-mlir: compiles / ptxas / ABI "
        "| both built: same opcode totals | both built: same inline-PTX statements | ... and as often |"
    )
    print("|---|---|---|---|---|---|---|")
    causes = collections.Counter()
    where = {}
    for family, rows in families.items():
        n_ok = sum(bool(nc[lb].get("ok")) for lb in rows)
        n_as = sum(bool(nc[lb].get("ptxas")) for lb in rows)
        m_ok = sum(bool(ml[lb].get("ok")) for lb in rows)
        m_as = sum(bool(ml[lb].get("ptxas")) for lb in rows)
        n_abi = sum(bool(nc[lb].get("abi")) for lb in rows)
        m_abi = sum(bool(ml[lb].get("abi")) for lb in rows)
        both = [lb for lb in rows if nc[lb].get("ok") and ml[lb].get("ok")]
        same = sum(nc[lb]["opcodes"] == ml[lb]["opcodes"] for lb in both)
        same_asm = sum(set(nc[lb].get("inline_asm", ())) == set(ml[lb].get("inline_asm", ())) for lb in both)
        same_counts = sum(nc[lb].get("inline_asm") == ml[lb].get("inline_asm") for lb in both)
        print(
            f"| {family} | {len(rows)} | {n_ok} / {n_as} / {n_abi} | {m_ok} / {m_as} / {m_abi} | {same} of {len(both)} "
            f"| {same_asm} of {len(both)} | {same_counts} of {len(both)} |"
        )
        for lb in rows:
            if not ml[lb].get("ok"):
                key = (family, _normalized_cause(ml[lb]["cause"]))
                causes[key] += 1
                where.setdefault(key, ml[lb].get("where"))
            elif not ml[lb].get("ptxas"):
                key = (family, "ptxas refused the PTX: " + _normalized_cause(ml[lb].get("ptxas_error", "")))
                causes[key] += 1
    if causes:
        print("\nnumba-cuda-mlir's failures by cause:\n")
        print("| family | variants | cause | where |")
        print("|---|---|---|---|")
        for (family, cause), n in sorted(causes.items(), key=lambda kv: (kv[0][0], -kv[1])):
            text = cause.replace("|", "\\|")
            print(f"| {family} | {n} | {text} | {where.get((family, cause)) or ''} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--family", action="append", default=[])
    r.add_argument("--stride", type=int, default=1)
    r.add_argument("--only", action="append", help="keep variants whose label holds this (repeatable: any of them)")
    r.add_argument("--label", action="append", default=[], help="exactly this variant (repeatable)")
    r.add_argument("--cc", default="9.0", help="compute capability to build for (12.1: GB10)")
    t = sub.add_parser("table")
    t.add_argument("numba_cuda")
    t.add_argument("numba_cuda_mlir")
    args = parser.parse_args(argv)
    if args.command == "run":
        global CC
        CC = ptx_report.CC = tuple(int(v) for v in args.cc.split("."))
        run(args.out, tuple(args.family), max(1, args.stride), tuple(args.only or ("",)), tuple(args.label))
    else:
        table(args.numba_cuda, args.numba_cuda_mlir)


if __name__ == "__main__":
    main()
