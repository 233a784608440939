"""CPU GEMM mutations (DESIGN.md's list plus the CPU GEMM's own): each must be killed by tests/test_cpu_gemm.py."""

from tools.mutate import Mutation

GEMM = "vtnumba/cpu/gemm.py"
GEMM_TESTS = ("tests/test_cpu_gemm.py",)
# gemv_kernel runs at M = 1 only on the paths without a byte-lookup decode (vtnumba.cpu.paths): the
# paths test runs every path this CPU has
M1_TESTS = GEMM_TESTS + ("tests/test_cpu_paths.py::test_g3_gemm",)
SMOKE = (
    "import numpy as np, vtnumba as vt\n"
    "a = np.arange(3 * 40, dtype=np.uint8).reshape(3, 40) % 0x70\n"
    "b = np.arange(70 * 40, dtype=np.uint8).reshape(70, 40) % 0x70\n"
    "for kernel in ('reference', 'small_m', 'blas'):\n"
    "    for rows in (a, a[:1]):\n"
    "        vt.scaled_mm(rows, b, 0.5, np.ones(70, np.float32), bias=np.ones(70, np.float32),\n"
    "                     out_dtype='bfloat16', kernel=kernel)\n"
)
# keep the top 16 bits of the float32 accumulator after every add: a bfloat16-precision sum
_IMPORT_BITS = ((GEMM, "from .codec import decode_e4m3", "from .codec import bits_float32, decode_e4m3, float32_bits"),)


def _narrowed(acc, term):
    return f"{acc} = bits_float32(float32_bits({acc} + {term}) & np.uint32(0xFFFF0000))"


MUTATIONS = [
    Mutation(
        name="GEMM ignores alpha",
        path=GEMM, old="y = acc * (sa * sb)", new="y = acc",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="alpha folds only the weight scale",
        path=GEMM, old="y = acc * (sa * sb)", new="y = acc * sb",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="alpha folds only the activation scale",
        path=GEMM, old="y = acc * (sa * sb)", new="y = acc * sa",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="per-row / per-channel scales read as per-tensor",
        path=GEMM, old="return scale[0] if scale.size == 1 else scale[i]", new="return scale[0]",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="bias dropped",
        path=GEMM, old="y += bias[n]", new="y += np.float32(0.0)",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="reference kernel accumulates in bfloat16 precision",
        path=GEMM,
        old="acc += decode_e4m3(a[m, k]) * decode_e4m3(b[n, k])",
        new=_narrowed("acc", "decode_e4m3(a[m, k]) * decode_e4m3(b[n, k])"),
        extra_edits=_IMPORT_BITS, tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="M = 1 kernel accumulates in bfloat16 precision",
        path=GEMM,
        old="a0 += u * decode_e4m3(w0[k])",
        new=_narrowed("a0", "u * decode_e4m3(w0[k])"),
        extra_edits=_IMPORT_BITS, tests=M1_TESTS, smoke=SMOKE),
    Mutation(
        name="small-M kernel accumulates in bfloat16 precision",
        path=GEMM,
        old="a00 += u * p;",
        new=_narrowed("a00", "u * p") + ";",
        extra_edits=_IMPORT_BITS, tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="blas epilogue indexes every panel as the first",
        path=GEMM, old="dst = out[m0 + i, n0:n0 + nb]", new="dst = out[m0 + i, 0:nb]",
        tests=GEMM_TESTS, smoke=SMOKE),
    Mutation(
        name="out rounding by truncation",
        path=GEMM,
        old="            out = out.astype(out_dtype)\n",
        new=("            nearest = out.astype(out_dtype)\n"
             "            out = np.where(np.abs(nearest.astype(np.float32)) > np.abs(out),\n"
             "                           np.nextafter(nearest, np.zeros((), out_dtype)), nearest)\n"),
        tests=GEMM_TESTS, smoke=SMOKE),
]
