"""Quantization mutations from DESIGN.md's list: each must be killed by the G1 gates."""

from tools.mutate import Mutation

QUANT_TESTS = ("tests/test_quant_cpu.py",)
SMOKE = (
    "import numpy as np, vtnumba as vt\n"
    "x = np.linspace(-500, 500, 64, dtype=np.float32).reshape(4, 16)\n"
    "vt.quantize_fp8(x, 0.5); vt.quantize_fp8(x); vt.quantize_fp8(x, per_token=True)\n"
)

MUTATIONS = [
    Mutation(
        name="quant ignores the scale",
        path="vtnumba/cpu/__init__.py",
        old="inv = np.float32(1.0) / np.float32(scale)  # formed once",
        new="inv = np.float32(1.0)  # formed once",
        tests=QUANT_TESTS, smoke=SMOKE),
    Mutation(
        name="divide instead of reciprocal multiply",
        path="vtnumba/cpu/__init__.py",
        old="quant.quantize_static(xin.reshape(-1), inv, out.reshape(-1))\n    return out",
        new="quant.quantize_static(xin.reshape(-1), np.float32(scale), out.reshape(-1))\n    return out",
        extra_edits=(("vtnumba/cpu/quant.py",
                      "out[i] = encode_e4m3(load_float32(x[i]) * inv_scale)",
                      "out[i] = encode_e4m3(load_float32(x[i]) / inv_scale)"),),
        tests=QUANT_TESTS, smoke=SMOKE),
    Mutation(
        name="saturation removed",
        path="vtnumba/_format.py",
        old="code = np.uint32(E4M3_MAX_CODE) if mag >= _U32_448_BITS else code",
        new="code = code",
        tests=QUANT_TESTS, smoke=SMOKE),
    Mutation(
        name="RNE replaced by truncation",
        path="vtnumba/_format.py",
        old="rounded = np.uint32(normal_mag + np.uint32(_U32_RNE_HALF + lsb))",
        new="rounded = normal_mag",
        tests=QUANT_TESTS, smoke=SMOKE),
    Mutation(
        name="per-token multiplies by the reciprocal instead of dividing",
        path="vtnumba/cpu/quant.py",
        old="return encode_e4m3(load_float32(v) / scale)",
        new="return encode_e4m3(load_float32(v) * (np.float32(1.0) / scale))",
        tests=QUANT_TESTS, smoke=SMOKE),
    Mutation(
        name="NaN mapped to 0x7E",
        path="vtnumba/_format.py",
        old="code = np.uint32(E4M3_NAN_CODE) if mag > _U32_INF_BITS else code",
        new="code = np.uint32(E4M3_MAX_CODE) if mag > _U32_INF_BITS else code",
        tests=QUANT_TESTS, smoke=SMOKE),
]
