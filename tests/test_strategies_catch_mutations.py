"""The guide's property tests (docs/GUIDE.md), run as written, must catch every mutation DESIGN.md lists within
hypothesis's default budget (100 examples, derandomized so CI is stable), and must pass on vtnumba.

The mutants are plain numpy: a quantizer and a GEMM that follow DESIGN.md except for one change each
(tools/mutate.py mutates vtnumba's own kernels for its gates; these stand in for a user's code).
The unmutated numpy pair must pass too, so each kill is the mutation's. Run with ``-s`` to see how
many examples each mutation took; tools/MUTATIONS.md keeps the table.
"""

import inspect
import re
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

import vtnumba as vt
from vtnumba.testing import reference
from vtnumba.testing import strategies as fst

F32 = np.float32
# the guide's property tests (docs/GUIDE.md, "Property tests with hypothesis"); the README's tour
# shows the quantizer one of them
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "GUIDE.md"

# hypothesis's default budget, a fixed seed, no shrinking (the first failure is the catch)
BUDGET = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("vtnumba-mutation-budget", BUDGET)


def readme_properties():
    """The guide's property-test snippet, executed: (its namespace, {test name: the @given test})."""
    text = GUIDE.read_text()
    section = text[text.index("## Property tests with hypothesis") :]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace = {}
    exec(compile(source, "docs/GUIDE.md", "exec"), namespace)
    tests = {name: fn for name, fn in namespace.items() if name.startswith("test_")}
    assert set(tests) == {"test_my_quantizer", "test_my_gemm"}, f"README's property tests changed: {sorted(tests)}"
    return namespace, tests


def run_readme_test(name, quantize_fp8=None, scaled_mm=None, profile="vtnumba-mutation-budget"):
    """Run README's test ``name`` under the settings ``profile`` (the README's own @settings sit on
    top of it), with ``vt``'s functions swapped for the given ones (None: vtnumba's own). Returns
    (examples run, the 1-based example that failed first or None, the error)."""
    # get_current_profile_name is newer than the hypothesis>=6.100 the project allows; nothing here
    # loads a profile but "default" otherwise
    previous = getattr(settings, "get_current_profile_name", lambda: "default")()
    settings.load_profile(profile)  # a settings object takes the profile loaded when it is made
    try:
        namespace, tests = readme_properties()
        if quantize_fp8 is not None or scaled_mm is not None:
            namespace["vt"] = types.SimpleNamespace(quantize_fp8=quantize_fp8, scaled_mm=scaled_mm)
        test = tests[name]
        used = getattr(test, "_hypothesis_internal_use_settings", settings.default)
        assert used.max_examples == 100 and used.derandomize, f"{name} does not run under the budget: {used}"
        inner = test.hypothesis.inner_test
        seen = {"calls": 0, "first": None}

        def counted(*args, **kwargs):
            seen["calls"] += 1
            try:
                inner(*args, **kwargs)
            except AssertionError:
                if seen["first"] is None:
                    seen["first"] = seen["calls"]
                raise

        test.hypothesis.inner_test = counted  # hypothesis's documented hook for wrapping the inner test
        error = None
        try:
            test()
        except AssertionError as exc:
            error = exc
        return seen["calls"], seen["first"], error
    finally:
        settings.load_profile(previous)


# -- plain-numpy quantizer and GEMM, with DESIGN.md's mutations as switches ----------------------------


def encode(x, *, saturate=True, rne=True, nan_code=0x7F):
    """DESIGN.md's encode: clamp to +-448, cast with RNE (ml_dtypes), every NaN -> 0x7F."""
    x = np.asarray(x, dtype=F32)
    v = np.clip(x, -448, 448) if saturate else x
    codes = v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    if not rne:  # truncation: one code back toward zero wherever RNE rounded away from it
        away = np.abs(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)) > np.abs(v.astype(np.float64))
        codes = np.where(away & ((codes & 0x7F) > 0), codes - 1, codes).astype(np.uint8)
    return np.where(np.isnan(x), nan_code, codes).astype(np.uint8)


def finite_amax(x, axis=None):
    a = np.abs(x)
    return np.max(np.where(np.isfinite(a), a, F32(0)), axis=axis, keepdims=axis is not None).astype(F32)


def make_quantizer(encoder=encode, static="multiply", per_token_op="divide"):
    """vt.quantize_fp8's three modes; ``static``: "multiply" (x * (1 / scale)), "divide" or "ignore"
    the scale; ``per_token_op``: "divide" or "multiply"."""

    def quantize_fp8(x, scale=None, *, per_token=False, scale_ub=None):
        x = np.asarray(x, dtype=F32)
        if per_token:
            t = finite_amax(x, axis=1)
            if scale_ub is not None:
                t = np.minimum(t, F32(scale_ub))
            s = np.maximum(t / F32(448), reference.FLOOR).astype(F32)
            scaled = x / s if per_token_op == "divide" else x * (F32(1) / s)
            return reference.Quantized(encoder(scaled), s)
        s = np.maximum(finite_amax(x) / F32(448), reference.FLOOR) if scale is None else F32(scale)
        scaled = {"multiply": lambda: x * (F32(1) / s), "divide": lambda: x / s, "ignore": lambda: x}[static]()
        return reference.Quantized(encoder(scaled), np.array([s], dtype=F32))

    return quantize_fp8


def make_scaled_mm(alpha="both"):
    """vt.scaled_mm in float32 numpy; ``alpha``: which scales reach the result ("both", "a", "b", "none")."""

    def scaled_mm(a, b, scale_a, scale_b, *, out_dtype=np.float32, bias=None):
        acc = reference.decode(a).astype(F32) @ reference.decode(b).astype(F32).T
        sa = np.asarray(scale_a, dtype=F32).reshape(-1, 1)
        sb = np.asarray(scale_b, dtype=F32).reshape(1, -1)
        y = acc * {"both": sa * sb, "a": sa, "b": sb, "none": F32(1)}[alpha]
        if bias is not None:
            y = y + np.asarray(bias, dtype=F32).reshape(1, -1)
        with np.errstate(over="ignore"):  # past float16's top, RNE gives inf: the right answer
            return y.astype(out_dtype)

    return scaled_mm


QUANT_MUTANTS = {
    "quant ignores the scale": make_quantizer(static="ignore"),
    "divide instead of reciprocal multiply": make_quantizer(static="divide"),
    "saturation removed": make_quantizer(encoder=lambda v: encode(v, saturate=False)),
    "RNE replaced by truncation": make_quantizer(encoder=lambda v: encode(v, rne=False)),
    "per-token uses multiply instead of divide": make_quantizer(per_token_op="multiply"),
    "NaN mapped to 0x7E": make_quantizer(encoder=lambda v: encode(v, nan_code=0x7E)),
}
GEMM_MUTANTS = {
    "GEMM ignores alpha": make_scaled_mm("none"),
    "alpha folds only the activation scale": make_scaled_mm("a"),
    "alpha folds only the weight scale": make_scaled_mm("b"),
}


@pytest.mark.parametrize("implementation", ["vtnumba", "numpy, unmutated"])
def test_readme_properties_pass_on_correct_implementations(implementation):
    """Not vacuous: 100 examples each, and a correct quantizer and GEMM pass every one."""
    swap = {} if implementation == "vtnumba" else {"quantize_fp8": make_quantizer(), "scaled_mm": make_scaled_mm()}
    for name in ("test_my_quantizer", "test_my_gemm"):
        calls, first, error = run_readme_test(name, **swap)
        assert error is None and first is None, f"{name} failed on {implementation}: {error}"
        assert calls >= 100, f"{name} ran {calls} examples, wanted the 100 of the budget"


@pytest.mark.parametrize("mutation", list(QUANT_MUTANTS) + list(GEMM_MUTANTS))
def test_readme_properties_catch_design_mutation(mutation):
    if mutation in QUANT_MUTANTS:
        calls, first, error = run_readme_test("test_my_quantizer", quantize_fp8=QUANT_MUTANTS[mutation])
    else:
        calls, first, error = run_readme_test("test_my_gemm", scaled_mm=GEMM_MUTANTS[mutation])
    assert error is not None and first is not None, f"{mutation!r} survived {calls} examples"
    assert first <= 100
    print(f"\n{mutation}: caught at example {first}")


# -- per-group cases, against a local oracle until reference.py has the per-group quantizer -------------


def quantize_per_group(x, group_size, divide=True):
    """DESIGN.md "per-group activations": scale = max(amax_group, 1e-10) / 448 in float32 (amax over
    finite elements, as every vtnumba mode takes it), codes = encode(x / scale)."""
    m, k = x.shape
    groups = x.reshape(m, k // group_size, group_size)
    s = (np.maximum(finite_amax(groups, axis=2), F32(1e-10)) / F32(448)).astype(F32)
    scaled = groups / s if divide else groups * (F32(1) / s)
    return reference.encode(scaled.astype(F32)).reshape(m, k), s.reshape(m, -1)


@pytest.mark.parametrize("group_size", [8, 128])
def test_group_cases_catch_multiply_for_divide(group_size):
    """The group cases' values sit at ties under each group's scale: a reciprocal multiply in place of
    the divide is caught within the budget; the local oracle agrees with the numpy encoder above."""
    seen = {"calls": 0, "first": None, "compared": 0}

    vtnumba_has_groups = "group_size" in inspect.signature(vt.quantize_fp8).parameters

    @BUDGET
    @given(fst.group_quant_cases(group_size))
    def run(case):
        x, kwargs = case
        seen["calls"] += 1
        codes, scales = quantize_per_group(x, **kwargs)
        assert scales.shape == (x.shape[0], x.shape[1] // group_size)
        assert np.array_equal(codes, encode(x.reshape(x.shape[0], -1, group_size) / scales[..., None]).reshape(x.shape))
        if vtnumba_has_groups:
            assert np.array_equal(vt.quantize_fp8(x, **kwargs).data, codes)
        seen["compared"] += codes.size
        mutant, _ = quantize_per_group(x, divide=False, **kwargs)
        if seen["first"] is None and not np.array_equal(mutant, codes):
            seen["first"] = seen["calls"]

    run()
    assert seen["calls"] >= 100 and seen["compared"] > 0
    assert seen["first"] is not None, "group multiply-for-divide survived 100 examples"
    print(f"\nper-group (g = {group_size}) multiplies instead of dividing: caught at example {seen['first']}")
