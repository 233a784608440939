"""The same GPU benchmarks under both CUDA compilers, numba-cuda and numba-cuda-mlir, side by side.

    python3 benchmarks/gpu/bench_compilers.py OUT [--only quant,decode,tensorcore] [--rounds 1]

Each benchmark runs in a process of its own per compiler (``VTNUMBA_CUDA_TARGET``, read when
``cuda/ptx/target.py`` is imported), the two compilers interleaved round by round (numba-cuda,
numba-cuda-mlir, numba-cuda, ...), so a host that drifts between runs drifts for both. Each output
is kept as ``OUT/<bench>.<compiler>.<round>.log``. Then every row of every table the benchmarks
print (lines of cells joined by ``|``) that both compilers printed under the same label gives one
line per column whose heading names microseconds: the best figure of each compiler over the rounds
and their ratio, numba-cuda-mlir over numba-cuda (below 1: numba-cuda-mlir is faster). The table
lands in ``OUT/compilers.md`` and is printed last. Needs a GPU, cupy, torch, numba-cuda and
numba-cuda-mlir.
"""

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPILERS = ("numba-cuda", "numba-cuda-mlir")
# the benchmarks whose shapes the compiler issue names, with arguments that keep each within minutes
BENCHES = {
    "quant": ["benchmarks/gpu/bench_gpu_quant.py"],
    "decode": ["benchmarks/gpu/bench_decode.py", "--calls", "1000", "--blocks", "150"],
    "tensorcore": ["benchmarks/gpu/bench_tensorcore.py", "gemm", "decode"],
}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?")
_MICROSECONDS = re.compile(r"\b(us|µs)\b|_us\b")


def tables(text):
    """{(heading, row label, column): value} for every table row of ``text`` with a number under a
    microseconds column. A table is a run of lines holding ``|``; its first line is the heading,
    ``---`` lines are skipped; a row's label is its cells up to the first number. The heading is
    numbered in print order, as two tables may share one (the same columns at another shape)."""
    found = {}
    block = []
    count = 0
    for line in text.splitlines() + [""]:
        if "|" in line:
            block.append(line)
            continue
        if len(block) >= 2:
            rows = [[c.strip() for c in row.strip().strip("|").split("|")] for row in block]
            rows = [r for r in rows if not all(set(c) <= set("-: ") for c in r)]
            head, body = rows[0], rows[1:]
            count += 1
            heading = f"{count}: " + " / ".join(head[:3])
            for row in body:
                numeric = [i for i, c in enumerate(row) if _NUMBER.match(c)]
                if not numeric:
                    continue
                label = " / ".join(row[: numeric[0]]) or row[0]
                for i in numeric:
                    if i < len(head) and _MICROSECONDS.search(head[i]):
                        found[(heading, label, head[i])] = float(_NUMBER.match(row[i]).group(0))
        block = []
    return found


def run(out, name, argv, compiler, round_):
    env = {k: v for k, v in os.environ.items() if k != "VTNUMBA_CUDA_TARGET"}
    env["VTNUMBA_CUDA_TARGET"] = compiler
    log = out / f"{name}.{compiler}.{round_}.log"
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"[{time.strftime('%H:%M:%S')}] {name} under {compiler}, round {round_}: rc {rc}, {time.time() - t0:.0f} s")
    return log.read_text(errors="replace") if rc == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"a comma-separated subset of {', '.join(BENCHES)}")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        ap.error(f"--only may name {', '.join(BENCHES)}, got {unknown}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    best = {c: {} for c in COMPILERS}
    failed = []
    for name in names:
        for round_ in range(args.rounds):
            for compiler in COMPILERS:
                text = run(out, name, BENCHES[name], compiler, round_)
                if text is None:
                    failed.append(f"{name} under {compiler} (round {round_}; its log in {out})")
                    continue
                for key, value in tables(text).items():
                    key = (name, *key)
                    best[compiler][key] = min(value, best[compiler].get(key, value))
    both = [k for k in best[COMPILERS[0]] if k in best[COMPILERS[1]]]
    lines = [
        f"# the same benchmarks under {COMPILERS[0]} and {COMPILERS[1]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"best of {args.rounds} round(s)",
        "",
        "| benchmark | table | row | column | numba-cuda | numba-cuda-mlir | mlir / numba-cuda |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in both:
        a, b = best[COMPILERS[0]][key], best[COMPILERS[1]][key]
        lines.append(
            f"| {' | '.join(key)} | {a:g} | {b:g} | {b / a:.3f} |"
            if a
            else f"| {' | '.join(key)} | {a:g} | {b:g} | - |"
        )
    lines += ["", f"{len(both)} figures under both compilers"]
    only = {c: len(best[c]) - len(both) for c in COMPILERS}
    lines += [f"- {n} figures only under {c}" for c, n in only.items() if n]
    lines += [f"- failed: {f}" for f in failed]
    text = "\n".join(lines) + "\n"
    (out / "compilers.md").write_text(text)
    print(text)
    if not both:
        raise SystemExit("no figure was printed under both compilers")


if __name__ == "__main__":
    main()
