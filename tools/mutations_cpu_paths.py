"""CPU path and thread mutations (issue 22): each must be killed by tests/test_cpu_paths.py."""

from tools.mutate import Mutation

PATHS = "vtnumba/cpu/paths.py"
TESTS = "tests/test_cpu_paths.py"
SMOKE = (
    "import numpy as np, vtnumba as vt\n"
    "a, b = np.ones((1, 64), np.uint8), np.ones((8, 64), np.uint8)\n"
    "vt.scaled_mm(a, b, 1.0, 1.0); vt.scaled_mm(np.ones((5, 64), np.uint8), b, 1.0, 1.0)\n"
    "vt.quantize_fp8(np.ones((4, 64), np.float32))\n"
)

MUTATIONS = [
    Mutation(
        name="avx512 path without its 512-bit hint",
        path=PATHS, old="            if bits is not None:\n", new="            if False:\n",
        tests=(f"{TESTS}::test_avx512_path_gets_512_bit_vectors_under_intel_tuning",), smoke=SMOKE),
    Mutation(
        name="small problems go parallel (no work threshold)",
        path=PATHS, old="if self.work(*args) < min_work:", new="if False:",
        tests=(f"{TESTS}::test_small_work_runs_on_one_thread",), smoke=SMOKE),
    Mutation(
        name="parallel regions on a loaded machine (free CPUs ignored)",
        path=PATHS, old="free = None if min_work == 0 else free_cpus()", new="free = None",
        tests=(f"{TESTS}::test_a_loaded_machine_runs_serial",), smoke=SMOKE),
    Mutation(
        name="parallel and serial twins share one cache name",
        path=PATHS, old="twin.__qualname__ = fn.__qualname__ + suffix", new="twin.__qualname__ = fn.__qualname__",
        tests=(f"{TESTS}::test_variants_have_their_own_cache_names",), smoke=SMOKE),
    Mutation(
        name="Numba's OpenMP workers left spinning",
        path="vtnumba/_config.py", old='os.environ["OMP_WAIT_POLICY"] = "PASSIVE"', new="pass",
        tests=(f"{TESTS}::test_thread_pool_starts_with_passive_workers_unless_the_user_chose",), smoke=SMOKE),
]

VBMI_TESTS = (f"{TESTS}::test_byte_lookup_decode_is_exhaustively_exact", f"{TESTS}::test_g3_gemm")
MUTATIONS += [
    Mutation(
        name="byte-lookup decode drops the sign",
        path="vtnumba/cpu/vbmi.py",
        old="hi = builder.or_(builder.call(perm, [hi_low, codes, hi_high]), builder.and_(codes, sign))",
        new="hi = builder.call(perm, [hi_low, codes, hi_high])",
        tests=VBMI_TESTS, smoke=SMOKE),
    Mutation(
        name="byte-lookup M = 1 kernel skips the K % 64 tail",
        path="vtnumba/cpu/gemm.py", old="for k in range(k_tail, k_len):", new="for k in range(k_len, k_len):",
        tests=VBMI_TESTS, smoke=SMOKE),
]
