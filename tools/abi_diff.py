"""What each kernel parameter means, under each CUDA compiler, against what the launcher packs (offline).

    python tools/abi_diff.py both OUT_DIR [--label L ...] [--only SUBSTRING ...] [--family NAME ...] [--stride N]
    python tools/abi_diff.py run OUT.json [same filters]     # under the compiler VTNUMBA_CUDA_TARGET selects
    python tools/abi_diff.py diff NUMBA_CUDA.json NUMBA_CUDA_MLIR.json

The launcher (``cuda/runtime/launch.py``) packs each argument as a fixed list of parameters:
numba-cuda's array ABI (``meminfo, parent, nitems, itemsize, data, shape..., strides...`` in bytes,
``_ArrayArg``), numba-cuda-mlir's memref (``allocated, aligned, offset, shape..., strides...`` in
elements, ``_MemrefArg``), a scalar in its declared width. Its load-time check compares only the
parameter *widths*. This tool compiles the kernel variants of ``tools/compile_matrix.py``'s inventory
(``ptx_report``'s and the MoE kernels) to PTX, no GPU needed, names every ``.entry`` parameter by the
component the launcher puts there, and reads from the PTX what the body does with it: which
parameters it loads (``ld.param``) and with what width, and whether each loaded value reaches an
address (a pointer), is scaled into an index (``mul``/``shl``/``mad``), or is compared (``setp``,
``min``/``max``, ``selp``). It also reads the shared-memory declarations: dynamic shared memory must
be an ``.extern`` array, or the "dynamic" array is a static one-byte variable that ptxas places
among the static arrays (numba-cuda-mlir 0.6.0, docs/DEVICE.md, reproducer 9).

Mismatches (each kernel, each compiler, then between them):

- ``width``: a parameter's PTX width is not the width the launcher packs;
- ``load``: the body loads a parameter with another width than it is declared with;
- ``placeholder``: the body reads a component the launcher packs as 0 because a kernel has no use
  for it (numba-cuda's ``meminfo`` and ``parent``);
- ``pointer``: a component the launcher packs as a pointer is loaded but never reaches an address,
  or one it packs as an integer is the only thing an address is made of;
- ``dynamic_shared``: a dynamic shared array that is not ``.extern``;
- ``read_by_one``: (``diff``) an argument one compiler's kernel reads and the other's never does;
- ``pointer_use``: (``diff``) an argument's pointer reaches an address under one compiler only.

``both`` runs ``run`` under each compiler in its own interpreter (the target is chosen at import) and
then ``diff``; it exits 1 when any mismatch was found. Run it from the root of the tree.
"""

import argparse
import collections
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compile_matrix  # noqa: E402  (the inventory with the MoE kernels, the stand-in devices)
import ptx_report  # noqa: E402

TARGETS = ("numba-cuda", "numba-cuda-mlir")
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\((.*?)\)\s*(?:\.\w+[^{]*)?\{", re.S)
_PARAM_DECL = re.compile(r"\.param\s+\.(\w+)\s+([\w$]+)")
_LD_PARAM = re.compile(r"ld\.param\.(\w+)\s+(%\w+)\s*,\s*\[([\w$]+)(?:\+(\d+))?\]")
_REG = re.compile(r"%[a-z]+\d+")
_ADDRESS = re.compile(r"\[([^\]]+)\]")
_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
_SHARED_DECL = re.compile(
    r"^\s*((?:\.extern|\.visible)\s+)?\.shared\s+(?:\.align\s+\d+\s+)?\.\w+\s+([\w$]+)(\[\d*\])?\s*;", re.M
)
# ops through which a value passes on unscaled (a base pointer plus offsets stays a pointer)
_ADDITIVE = ("add", "sub", "mov", "cvta", "cvt")
_SCALING = ("mul", "shl", "mad")
_COMPARE = ("setp", "min", "max", "selp", "slct")


def components(arg):
    """[(component name, packed value kind)] of one launcher argument: kind is 'pointer', 'int',
    'zero' (packed as 0 since kernels have no use for it) or the scalar's type."""
    from vtnumba.cuda.runtime import launch

    if isinstance(arg, launch._MemrefArg):
        dims = range(arg.ndim)
        return (
            [("allocated", "pointer"), ("aligned", "pointer"), ("offset", "int")]
            + [(f"shape[{d}]", "int") for d in dims]
            + [(f"strides[{d}]", "int") for d in dims]
        )
    if isinstance(arg, launch._ArrayArg):
        dims = range(arg.ndim)
        return (
            [("meminfo", "zero"), ("parent", "zero"), ("nitems", "int"), ("itemsize", "int"), ("data", "pointer")]
            + [(f"shape[{d}]", "int") for d in dims]
            + [(f"strides[{d}]", "int") for d in dims]
        )
    return [("value", "scalar")]


def _body(ptx, name):
    start = ptx.index(f".entry {name}")
    brace = ptx.index("{", ptx.index(")", start))
    depth, i = 0, brace
    while True:
        c = ptx[i]
        depth += c == "{"
        depth -= c == "}"
        if depth == 0:
            return ptx[brace + 1 : i]
        i += 1


def _split_operands(rest):
    """The operands of one instruction, split at the commas outside braces and brackets."""
    out, depth, cur = [], 0, []
    for c in rest:
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    out.append("".join(cur))
    return [o.strip() for o in out if o.strip()]


def _instructions(body):
    """(opcode, [destination registers], [source registers], [registers inside [...]]) per
    instruction of the body (inline asm included: its statements carry the registers it was given)."""
    out = []
    for piece in body.split(";"):
        s = piece.strip()
        s = s.rsplit("\n", 1)[-1].strip()
        s = s.lstrip("{").strip()
        if not s or s.startswith(("//", ".")) or s.endswith(":"):
            continue
        if s.startswith("@"):
            s = s.split(None, 1)[1] if " " in s else ""
        parts = s.split(None, 1)
        if not parts or not re.match(r"[a-z]", parts[0]):
            continue
        op, rest = parts[0], parts[1] if len(parts) > 1 else ""
        operands = _split_operands(rest)
        addressed = [r for o in operands for inner in _ADDRESS.findall(o) for r in _REG.findall(inner)]
        family = op.split(".")[0]
        writes = family not in ("st", "red", "bar", "bra", "ret", "membar", "fence", "prefetch", "call", "cp")
        first = operands[0] if operands else ""
        dsts = _REG.findall(first) if writes and "[" not in first else []
        srcs = [r for o in (operands[1:] if writes else operands) for r in _REG.findall(_ADDRESS.sub(" ", o))]
        out.append((op, dsts, srcs, addressed))
    return out


def _uses(instructions, reg):
    """How the value in ``reg`` is used: 'address' (reaches an address through additions only),
    'index' (scaled by a mul / shl / mad on its way, or reaching one through other arithmetic),
    'compare' (in a compare / select / min / max)."""
    uses = set()
    seen = {(reg, False)}
    todo = [(reg, False)]
    while todo:
        r, scaled = todo.pop()
        for op, dsts, srcs, addressed in instructions:
            family = op.split(".")[0]
            if r in addressed:
                uses.add("index" if scaled else "address")
            if r not in srcs:
                continue
            if family in _COMPARE:
                uses.add("compare")
            if family == "cvta":
                uses.add("index" if scaled else "address")
            if family == "setp":
                continue
            if family in _SCALING:
                # mad's addend (its third source) passes on unscaled
                addend_only = family == "mad" and len(srcs) >= 3 and srcs[2] == r and r not in srcs[:2]
                step_scaled = scaled or not addend_only
            elif family in _ADDITIVE or family in ("and", "or", "xor", "neg", "abs", "selp"):
                step_scaled = scaled
            else:
                step_scaled = True
            for dst in dsts:
                key = (dst, step_scaled)
                if key not in seen:
                    seen.add(key)
                    todo.append(key)
    return uses


def analyze(kernel, ptx):
    """The record of one compiled kernel: its parameters, each named by what the launcher packs
    there, what the body does with it, the shared-memory declarations, and the mismatches."""
    from vtnumba.cuda.runtime.launch import _PTX_PARAM_BYTES

    entries = _ENTRY.findall(ptx)
    if len(entries) != 1:
        return {"mismatches": [["entries", f"{len(entries)} .entry in the PTX"]]}
    name, decl = entries[0]
    params = _PARAM_DECL.findall(decl)
    body = _body(ptx, name)
    instructions = _instructions(body)
    loads = collections.defaultdict(list)
    for ty, reg, pname, off in _LD_PARAM.findall(body):
        loads[pname].append((ty, reg, int(off or 0)))
    try:
        names = list(inspect.signature(kernel.pyfunc).parameters)
    except (TypeError, ValueError):
        names = []
    plan = kernel._plan
    rows, mismatches = [], []
    slot = 0
    for i, (arg, argtype) in enumerate(zip(plan, kernel.signature)):
        argname = names[i] if i < len(names) else f"arg{i}"
        for (component, kind), width in zip(components(arg), arg.ptx_widths):
            label = f"{argname}.{component}" if kind != "scalar" else argname
            if slot >= len(params):
                mismatches.append(["width", f"{label}: the launcher packs a parameter the PTX does not declare"])
                slot += 1
                continue
            ptype, pname = params[slot]
            declared = _PTX_PARAM_BYTES.get(ptype)
            row = {"slot": slot, "arg": i, "name": label, "kind": kind, "type": str(argtype), "ptx": ptype}
            if declared != width:
                mismatches.append(["width", f"{label}: PTX .{ptype} ({declared} bytes), the launcher packs {width}"])
            read = loads.get(pname, [])
            row["loads"] = sorted({ty for ty, _, _ in read})
            for ty, _, off in read:
                bits = re.sub(r"\D", "", ty)
                if off or _BYTES.get(bits) != declared:
                    mismatches.append(
                        ["load", f"{label}: declared .{ptype}, loaded as .{ty}{f' at +{off}' if off else ''}"]
                    )
            uses = set()
            for _, reg, _ in read:
                uses |= _uses(instructions, reg)
            row["uses"] = sorted(uses)
            if read and kind == "zero":
                mismatches.append(["placeholder", f"{label}: read by the kernel, packed as 0 by the launcher"])
            if read and kind == "pointer" and "address" not in uses and uses - {"compare"}:
                mismatches.append(["pointer", f"{label}: packed as a pointer, used only as {sorted(uses)}"])
            rows.append(row)
            slot += 1
    if slot < len(params):
        mismatches.append(["width", f"the PTX declares {len(params)} parameters, the launcher packs {slot}"])
    # an integer component that is the only base of an address: some argument's meaning is shifted
    for arg in {r["arg"] for r in rows}:
        mine = [r for r in rows if r["arg"] == arg]
        pointers = [r for r in mine if r["kind"] == "pointer"]
        if pointers and not any("address" in r["uses"] for r in pointers):
            ints = [
                r["name"]
                for r in mine
                if r["kind"] in ("int", "zero") and "address" in r["uses"] and "index" not in r["uses"]
            ]
            if ints:
                mismatches.append(
                    ["pointer", f"{', '.join(ints)}: an address is made of it, not of the array's pointer"]
                )
    shared = []
    for prefix, sym, _brackets in _SHARED_DECL.findall(ptx):
        extern = (prefix or "").strip() == ".extern"
        dynamic = extern or "dynamic_shmem" in sym
        shared.append({"name": sym, "extern": extern, "dynamic": dynamic})
        if dynamic and not extern:
            mismatches.append(
                ["dynamic_shared", f"{sym}: a static .shared variable, not the .extern array dynamic shared memory is"]
            )
    return {"params": rows, "shared": shared, "mismatches": mismatches, "nparams": len(params)}


def run(path, families=(), stride=1, only=("",), labels=()):
    os.environ["PATH"] = ptx_report.tool_path()
    sys.path.insert(0, os.getcwd())
    from vtnumba.cuda.ptx import target

    if target.IMPORT_ERROR is not None:
        raise SystemExit(f"{target.TARGET} does not import here: {target.IMPORT_ERROR!r}")
    compile_matrix._stand_in(target.TARGET)
    from vtnumba.cuda.runtime import launch

    # the compiler's own PTX too, before Kernel.ptx rewrites it: what the rewrites answer is recorded
    # apart (``compiler_mismatches``), so a rewrite that stops being needed, or stops working, shows
    raw = {}
    rewrite = launch.extern_dynamic_shared

    def capture(ptx):
        raw["ptx"] = ptx
        return rewrite(ptx)

    launch.extern_dynamic_shared = capture
    inventory = ptx_report.variants() + compile_matrix.moe_variants()
    todo = [v for v in inventory if any(o in v[1] for o in only) and (not labels or v[1] in labels)]
    todo = ptx_report._sample(todo, families, stride)
    missing = sorted(set(labels) - {v[1] for v in todo})
    if missing:
        raise SystemExit(f"no such variant: {missing}")
    records = {}
    for family, label, make in todo:
        t0 = time.time()
        try:
            kernel = make()
        except ValueError as exc:  # a configuration the factory refuses
            records[label] = {"family": family, "refused": str(exc)}
            continue
        raw.clear()
        try:
            ptx = kernel.ptx(compile_matrix.CC)
        except Exception as exc:
            records[label] = {"family": family, "error": compile_matrix._cause(exc)}
            continue
        record = analyze(kernel, ptx)
        own = analyze(kernel, raw.get("ptx", ptx))["mismatches"]
        record["compiler_mismatches"] = [m for m in own if m not in record["mismatches"]]
        record.update(family=family, target=target.TARGET, seconds=round(time.time() - t0, 2))
        records[label] = record
        answered = len(record["compiler_mismatches"])
        print(
            f"{target.TARGET}: {label}: {len(record['mismatches'])} mismatches, {answered} in the compiler's own "
            f"PTX that vtnumba's rewrites answer ({record['seconds']} s)",
            flush=True,
        )
    pathlib.Path(path).write_text(json.dumps(records, indent=1, sort_keys=True))


def diff(nc, ml):
    """{label: [[kind, text], ...]} of both records' own mismatches and those between them."""
    out = {}
    for label in sorted(set(nc) | set(ml)):
        a, b = nc.get(label, {}), ml.get(label, {})
        found = [[k, f"numba-cuda: {t}"] for k, t in a.get("mismatches", [])]
        found += [[k, f"numba-cuda-mlir: {t}"] for k, t in b.get("mismatches", [])]
        for rec, who in ((a, "numba-cuda"), (b, "numba-cuda-mlir")):
            if "error" in rec:
                found.append(["compile", f"{who}: {rec['error']}"])
        if "params" in a and "params" in b:
            by_arg = collections.defaultdict(lambda: [[], []])
            for side, rec in enumerate((a, b)):
                for row in rec["params"]:
                    by_arg[row["arg"]][side].append(row)
            for _arg, (rows_a, rows_b) in sorted(by_arg.items()):
                argname = (rows_a or rows_b)[0]["name"].split(".")[0]
                read_a = any(r["loads"] for r in rows_a)
                read_b = any(r["loads"] for r in rows_b)
                if read_a != read_b:
                    who = "numba-cuda" if read_a else "numba-cuda-mlir"
                    found.append(["read_by_one", f"{argname}: only {who}'s kernel reads it"])
                addr_a = any("address" in r["uses"] for r in rows_a if r["kind"] == "pointer")
                addr_b = any("address" in r["uses"] for r in rows_b if r["kind"] == "pointer")
                if read_a and read_b and addr_a != addr_b:
                    who = "numba-cuda" if addr_a else "numba-cuda-mlir"
                    found.append(["pointer_use", f"{argname}: its pointer reaches an address under {who} only"])
        out[label] = found
    return out


def table(nc, ml):
    """The per-variant report (markdown) and the number of mismatches."""
    found = diff(nc, ml)
    lines = [
        "| variant | numba-cuda params | numba-cuda-mlir params | mismatches | in the compiler's PTX, answered by vtnumba |",
        "|---|---|---|---|---|",
    ]
    total = 0
    for label, items in found.items():
        total += len(items)
        text = "; ".join(f"{k}: {t}" for k, t in items).replace("|", "\\|") or "none"
        answered = [
            f"{who}: {k}: {t}"
            for who, rec in (("numba-cuda", nc), ("numba-cuda-mlir", ml))
            for k, t in rec.get(label, {}).get("compiler_mismatches", [])
        ]
        answered = "; ".join(answered).replace("|", "\\|") or "none"
        n_nc, n_ml = nc.get(label, {}).get("nparams", "-"), ml.get(label, {}).get("nparams", "-")
        lines.append(f"| {label} | {n_nc} | {n_ml} | {text} | {answered} |")
    return "\n".join(lines), total


def _filters(p):
    p.add_argument("--family", action="append", default=[])
    p.add_argument("--stride", type=int, default=1)
    p.add_argument("--only", action="append", help="keep variants whose label holds this (repeatable)")
    p.add_argument("--label", action="append", default=[], help="exactly this variant (repeatable)")


def _filter_args(args):
    argv = [f"--stride={args.stride}"]
    for flag in ("family", "only", "label"):
        for value in getattr(args, flag) or ():
            argv += [f"--{flag}", value]
    return argv


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    _filters(r)
    b = sub.add_parser("both")
    b.add_argument("out_dir")
    _filters(b)
    d = sub.add_parser("diff")
    d.add_argument("numba_cuda")
    d.add_argument("numba_cuda_mlir")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.out, tuple(args.family), max(1, args.stride), tuple(args.only or ("",)), tuple(args.label))
        return 0
    if args.command == "both":
        out = pathlib.Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for t in TARGETS:
            env = {k: v for k, v in os.environ.items() if k not in ("VTNUMBA_CUDA_TARGET", "NUMBA_ENABLE_CUDASIM")}
            env["VTNUMBA_CUDA_TARGET"] = t
            env["PYTHONPATH"] = os.pathsep.join([os.getcwd()] + [p for p in [env.get("PYTHONPATH")] if p])
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "run", str(out / f"{t}.json")] + _filter_args(args), env=env
            )
            if done.returncode:
                return done.returncode
        nc_path, ml_path = out / f"{TARGETS[0]}.json", out / f"{TARGETS[1]}.json"
    else:
        nc_path, ml_path = pathlib.Path(args.numba_cuda), pathlib.Path(args.numba_cuda_mlir)
    text, total = table(json.loads(nc_path.read_text()), json.loads(ml_path.read_text()))
    print(text)
    print(f"\n{total} mismatches")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
