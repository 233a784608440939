"""Block-scaled FP8 mutations on the CPU (issue 12): each must be killed by tests/test_block_cpu.py."""

from tools.mutate import Mutation

BLOCK = "vtnumba/cpu/block.py"
FORMAT = "vtnumba/_format.py"
BLOCK_TESTS = ("tests/test_block_cpu.py",)
SMOKE = (
    "import numpy as np, ml_dtypes\n"
    "from vtnumba.cpu import block\n"
    "x = np.linspace(-3, 3, 3 * 300, dtype=np.float32).reshape(3, 300)\n"
    "for xs in (x, x.astype(ml_dtypes.bfloat16)):\n"
    "    for ue8m0 in (False, True):\n"
    "        block.quantize_per_group(xs, 128, ue8m0)\n"
    "a = np.arange(3 * 40, dtype=np.uint8).reshape(3, 40) % 0x70\n"
    "b = np.arange(70 * 40, dtype=np.uint8).reshape(70, 40) % 0x70\n"
    "sb = np.ones((5, 3), np.float32)\n"
    "for kernel in ('reference', 'small_m', 'blas'):\n"
    "    for rows in (a, a[:1]):\n"
    "        block.block_scaled_mm(rows, b, np.ones((len(rows), 3), np.float32), sb, (16, 16),\n"
    "                              np.dtype(np.float32), np.ones(70, np.float32), kernel)\n"
)

MUTATIONS = [
    Mutation(
        name="block step folds sa * sb into one factor (small_m kernel)",
        path=BLOCK, old="t[m] = t[m] + (q[m] * sa[m]) * sb", new="t[m] = t[m] + q[m] * (sa[m] * sb)",
        tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="block step drops the weight scale (small_m kernel)",
        path=BLOCK, old="t[m] = t[m] + (q[m] * sa[m]) * sb", new="t[m] = t[m] + q[m] * sa[m]",
        tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="block tile rows all read the first row-block's weight scale",
        path=BLOCK, old="sb = scale_b[nb0 if j == 0 else nb1 if j == 1 else nb2 if j == 2 else nb3, kb]",
        new="sb = scale_b[nb0, kb]", tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="block step at M = 1 folds sa * sb into one factor",
        path=BLOCK, old="(p[kb, j] * sa) * scale_b[nb0 if j == 0 else nb1 if j == 1 else nb2 if j == 2 else nb3, kb]",
        new="p[kb, j] * (sa * scale_b[nb0 if j == 0 else nb1 if j == 1 else nb2 if j == 2 else nb3, kb])",
        tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="block blas epilogue drops the weight scale",
        path=BLOCK, old="dst[j] = dst[j] + (src[j] * sa) * sb_row[j]", new="dst[j] = dst[j] + src[j] * sa",
        tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="block reference kernel sums all of K in every block",
        path=BLOCK, old="for k in range(kb * bk, min(k_len, (kb + 1) * bk)):", new="for k in range(k_len):",
        tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="group scale floors the scale instead of amax",
        path=FORMAT, old="scale = np.float32(max(amax, F32_GROUP_EPS) / F32_E4M3_MAX)",
        new="scale = np.float32(max(amax / F32_E4M3_MAX, F32_GROUP_EPS))", tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="group UE8M0 scale rounds down",
        path=FORMAT, old="exponent = np.uint32(exponent + np.uint32(1)) if",
        new="exponent = np.uint32(exponent + np.uint32(0)) if", tests=BLOCK_TESTS, smoke=SMOKE),
    Mutation(
        name="group amax misses each group's last element",
        path=BLOCK, old="xs = x[r, lo:hi]", new="xs = x[r, lo:max(lo + 1, hi - 1)]",
        tests=BLOCK_TESTS, smoke=SMOKE),
]
