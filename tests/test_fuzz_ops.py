"""The public ops and the seam's entry points, fuzzed: every draw is answered correctly or refused by name.

Each example draws one call of an op (``vt.quantize_fp8``, ``vt.encode_e4m3`` / ``vt.decode_e4m3``,
``vt.dequantize_fp8``, ``vt.scaled_mm``, ``vt.fp8_linear``, and the seam's ``Fp8Weight``,
``Fp8Weight.from_float``, ``matmul_fp8``, ``matmul_fp8_prequant``, ``quantize_activation`` and
``make_linear_method``): shapes (0 rows, 1 column, K a multiple of nothing, 0-d and 3-d arrays),
dtypes, memory layouts (transposed, stepped, reversed, Fortran order), input kinds (numpy arrays,
torch CPU tensors, Python numbers and lists) and scale kinds (scalars, 0-d, [1] and [1, 1] arrays,
per-token, per-channel, 1 x g groups, bn x bk blocks, E8M0 bytes). The values come from
``vtnumba.testing.strategies``' joint cases (values landed on e4m3 ties under their scale).

Whether a draw is legal is decided before the call, from the documented contract alone. A legal draw
must return, and its result must match ``vtnumba.testing.reference`` within the documented gate:
bitwise for quantization and the codec (G1), ``vtnumba.testing.gates`` for GEMMs (G3, per block for
block-scaled ones). An illegal draw is a legal one with exactly one defect applied (a bad dtype,
value, shape, type or combination of arguments); it must be refused with a TypeError or ValueError
whose message names the argument and shows the offending value, dtype or shape. Each test counts its
draws per op (drawn / correct / refused; ``-s`` prints them) and asserts both outcomes happened, so
neither half of the gate is vacuous.

The default (fast) tier runs a fixed, derandomized set of examples (15-40 s on two cores, kernels cached).
``VT_FUZZ_EXAMPLES=N`` runs N examples per test from a fresh random seed instead (hypothesis prints
how to reproduce a failure), e.g. ``VT_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_ops.py -s``.
"""

import math
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vtnumba as vt
from vtnumba import seam
from vtnumba.testing import reference
from vtnumba.testing import strategies as fst
from vtnumba.testing.gates import assert_block_g3, assert_g3

try:
    import torch
except ImportError:  # the torch input kind is then not drawn
    torch = None

F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
U8 = np.dtype(np.uint8)
FRAMEWORKS = ("numpy", "torch") if torch is not None else ("numpy",)

_LONG = os.environ.get("VT_FUZZ_EXAMPLES")


def _settings(examples):
    return settings(
        max_examples=int(_LONG) if _LONG else examples,
        derandomize=not _LONG,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )


# -- counting and judging ------------------------------------------------------------------------


@dataclass
class Tally:
    drawn: int = 0
    correct: int = 0
    refused: int = 0


@dataclass(frozen=True)
class Defect:
    """The one thing wrong with a draw: the argument its refusal must name, and what the message must
    show of it (any one of ``evidence``: the value, the dtype, the shape or the type)."""

    name: str
    evidence: tuple


def _defect(name, *evidence):
    return Defect(name, tuple(str(e) for e in evidence))


def fuzz(examples, ops, body):
    """Run ``body(data, judge)`` over ``examples`` hypothesis draws; ``judge(op, call, verify, defect)``
    calls and judges one draw. Then every op in ``ops`` must have been both answered and refused."""
    tallies = {op: Tally() for op in ops}

    def judge(op, call, verify=None, defect=None):
        t = tallies[op]
        t.drawn += 1
        if defect is None:
            result = call()
            if verify is not None:
                verify(result)
            t.correct += 1
            return result
        with pytest.raises((TypeError, ValueError)) as info:
            call()
        msg = str(info.value)
        named = re.search(rf"(?<![\w.]){re.escape(defect.name)}(?!\w)", msg)
        assert named, f"{op}: the refusal does not name {defect.name!r}: {msg}"
        assert any(e in msg for e in defect.evidence), f"{op}: the refusal shows none of {defect.evidence}: {msg}"
        t.refused += 1
        return None

    @_settings(examples)
    @given(st.data())
    def run(data):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the draws' own casts (inf, nan) warn
            body(data, judge)

    run()
    for op, t in tallies.items():
        print(f"{op:34s} drawn {t.drawn:5d}  correct {t.correct:5d}  refused {t.refused:5d}")
    for op, t in tallies.items():
        assert t.correct > 0 and t.refused > 0, f"{op}: {t} (a gate half that never ran)"
        assert t.correct + t.refused == t.drawn


# -- arguments in a drawn memory layout and framework ------------------------------------------------


@dataclass
class Arr:
    """An array argument: ``base`` (numpy) and ``view`` (base -> the argument) rebuild ``value``'s
    elements in a drawn memory layout, as numpy or (``torch_of``) torch. ``numpy=True`` keeps it a numpy
    array in a torch call (the mixed-framework defect)."""

    base: np.ndarray
    view: Any = None
    numpy: bool = False

    @property
    def value(self):
        return self.base if self.view is None else self.view(self.base)


@dataclass
class Lazy:
    """An argument made at call time from the other arguments' framework (a QuantizedActivation)."""

    make: Any


def torch_of(a):
    """A torch tensor on numpy array ``a``'s memory; the dtypes torch lacks in numpy are views."""
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == FP8:
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    if a.dtype == E8M0:
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e8m0fnu)
    return torch.from_numpy(a)


def build(obj, fw):
    if isinstance(obj, Arr):
        base = obj.base if fw == "numpy" or obj.numpy else torch_of(obj.base)
        return base if obj.view is None else obj.view(base)
    if isinstance(obj, Lazy):
        return obj.make(fw)
    return obj


def caller(fw, fn, *args, **kwargs):
    """The call of ``fn`` with its arguments built for framework ``fw`` (built now: a failure to build
    is the harness's, not the op's)."""
    a = [build(v, fw) for v in args]
    k = {key: build(v, fw) for key, v in kwargs.items()}
    return lambda: fn(*a, **k)


def _is_torch(b):
    return torch is not None and isinstance(b, torch.Tensor)


def laid_out(data, x, fw):
    """An Arr with x's elements in a drawn layout: C order, transposed, every 2nd or 3rd element,
    reversed along every axis (negative strides: numpy only, torch has none) or Fortran order."""
    kinds = ["c"] if x.ndim == 0 else ["c", "c", "t", "step", "f"] + (["neg"] if fw == "numpy" else [])
    kind = data.draw(st.sampled_from(kinds), label="layout")
    if kind == "t":
        return Arr(np.ascontiguousarray(x.transpose()), _transpose)
    if kind == "step":
        s = data.draw(st.sampled_from([2, 3]), label="step")
        sl = (slice(None, None, s),) * x.ndim
        base = np.zeros(tuple(d * s for d in x.shape), dtype=x.dtype)
        base[sl] = x
        return Arr(base, lambda b: b[sl])
    if kind == "neg":
        rev = (slice(None, None, -1),) * x.ndim
        return Arr(np.ascontiguousarray(x[rev]), lambda b: b[rev])
    if kind == "f":
        return Arr(np.asfortranarray(x))
    return Arr(x.copy(order="C"))  # np.ascontiguousarray would make a 0-d x 1-d


def _transpose(b):
    return b.permute(*range(b.ndim)[::-1]) if _is_torch(b) else b.transpose()


def host(r, fw):
    """A result as numpy, after checking it came back as the caller's kind (torch in, torch out)."""
    if fw == "torch":
        assert _is_torch(r), f"a torch call returned {type(r).__name__}"
        return r.view(torch.int16).numpy().view(BF16) if r.dtype == torch.bfloat16 else r.numpy()
    assert isinstance(r, np.ndarray), f"a numpy call returned {type(r).__name__}"
    return r


def bits(a):
    """Bit patterns of a float array (NaN payloads and the sign of zero compared too)."""
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_floats(got, want):
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != {want.dtype}"
    gnan, wnan = np.isnan(got.astype(F32)), np.isnan(want.astype(F32))
    np.testing.assert_array_equal(gnan, wnan, err_msg="NaN in other places")
    np.testing.assert_array_equal(bits(got)[~gnan], bits(want)[~wnan])


# -- values ----------------------------------------------------------------------------------------

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7)
FLOAT_DTYPES = (F32, F32, F16, BF16, F64)


def as_dtype(data, x32, dt):
    """(x in dtype dt, what the op computes on). float64 is cast to float32 (RNE) by the op, so the
    values are nudged off float32 first and the oracle reads the cast."""
    if dt == F64:
        nudge = data.draw(st.sampled_from([0.0, 2.0**-26, -(2.0**-26), 0.75 * 2.0**-24, -0.75 * 2.0**-24]))
        x = np.asarray(x32.astype(F64) * (1.0 + nudge))  # a 0-d product is a numpy scalar
        return x, x.astype(F32)
    x = x32.astype(dt)
    return x, x


def bad_dtype_array(data, shape, fw):
    """An array of a dtype no op takes as floats or codes (and its dtype's name)."""
    choices = [np.int32, np.bool_, np.complex64, np.int8] + ([object] if fw == "numpy" else [])
    dt = np.dtype(data.draw(st.sampled_from(choices), label="bad dtype"))
    return Arr(np.zeros(shape, dtype=dt)), str(dt)


def f32(v):
    return float(np.float32(v))


def scalar_form(data, s, fw):
    """A float32 value ``s`` as one of the scalar kinds a scale takes: Python float, numpy scalar, or a
    0-d / [1] / [1, 1] array (a tensor in a torch call), float16 where that is exact."""
    forms = ["float", "f32", "f64", "0d", "1", "11"]
    if float(s).is_integer() and 1 <= s <= 64:
        forms.append("int")
    if np.isfinite(s) and float(np.float16(s)) == s:
        forms.append("f16")
    form = data.draw(st.sampled_from(forms), label="scalar form")
    if form == "int":
        return int(s)
    if form == "f32":
        return np.float32(s)
    if form == "f64":
        return np.float64(s)
    if form == "0d":
        return Arr(np.array(s, F32))
    if form == "1":
        return Arr(np.array([s], F32))
    if form == "11":
        return Arr(np.array([[s]], F32))
    if form == "f16":
        return Arr(np.array([s], F16))
    return float(s)


def bad_quant_scale(data, name, s, fw):
    """(a bad quantization scale near s, its Defect): not positive, not finite, past float32's range,
    a shape that is no scalar, or a kind that is no real number."""
    kind = data.draw(st.sampled_from(["value", "value", "shape", "type"]), label=f"bad {name}")
    if kind == "value":
        v = data.draw(st.sampled_from([0.0, -0.0, -s, math.nan, math.inf, -math.inf, 1e-50, 1e39]))
        return scalar_form(data, v, fw), _defect(name, repr(np.float32(v)), f"float32 {np.float32(v)}")
    if kind == "shape":
        shape = data.draw(st.sampled_from([(2,), (1, 1, 1), (2, 1), (0,)]))
        return Arr(np.full(shape, s, F32)), _defect(name, shape)
    choices = [([s], "list"), (str(s), "str"), (True, "bool"), (complex(s, 1.0), "complex")]
    choices += [(Arr(np.array([s], np.complex64)), "complex64"), (Arr(np.array([True])), "bool")]
    if fw == "numpy":
        choices.append((Arr(np.array([s], object)), "object"))
    value, evidence = data.draw(st.sampled_from(choices))
    return value, _defect(name, evidence)


def flag_form(data, value):
    return data.draw(st.sampled_from([value, np.bool_(value)]))


def bad_flag(data, name):
    v = data.draw(st.sampled_from(["yes", "False", 1, None, 0.0]), label=f"bad {name}")
    return v, _defect(name, repr(v))


# -- the oracle's quantization (vtnumba.testing.reference) -----------------------------------------


def oracle_quantize(x, mode, kw):
    """(codes, scale) the reference gives for float values x under ``mode`` and its plain keywords
    (``kw``: scale / scale_ub floats, group_size, scale_ue8m0, scale_rounding)."""
    if mode == "static":
        r = reference.quantize(x, scale=kw["scale"])
    elif mode == "dynamic":
        if x.size == 0:  # amax over no elements is 0: the floor scale, and no codes
            return np.zeros(x.shape, U8), reference.quantize(np.zeros(1, F32)).scale
        r = reference.quantize(x)
    elif mode == "per_token":
        r = reference.quantize(x, per_token=True, scale_ub=kw.get("scale_ub"))
    elif mode == "group":
        r = reference.quantize_per_group(x, kw["group_size"], kw.get("scale_ue8m0", False))
    else:
        r = reference.quantize_mx(x, kw["group_size"], kw.get("scale_rounding") or "rceil")
    return r.data, r.scale


def draw_values(data, mode):
    """(x32, plain keywords) for ``mode``: values landed on e4m3 ties under their scale, from
    vtnumba.testing.strategies' joint cases; the group modes' K is cut to a multiple of nothing at
    times, and some row counts are 0."""
    if mode in ("static", "dynamic"):
        dims = data.draw(SHAPES, label="shape")
        if mode == "dynamic" and math.prod(dims) == 0:
            return np.zeros(dims, F32), {}
        strategy = fst.static_quant_cases(shape=dims) if mode == "static" else fst.dynamic_quant_cases(shape=dims)
        x, kw = data.draw(strategy, label="x")
        return x, dict(kw)
    if mode == "per_token":
        x, kw = data.draw(fst.per_token_cases(max_rows=6, max_cols=40), label="x")
        kw = dict(kw)
    else:
        g = data.draw(st.sampled_from([1, 3, 8, 32, 128] if mode == "group" else [32, 32, 16, 7]), label="g")
        groups = 2 if g == 128 else 3
        if mode == "group":
            x, kw = data.draw(fst.group_quant_cases(g, max_rows=3, max_groups=groups), label="x")
            kw = dict(kw, scale_ue8m0=data.draw(st.booleans()))
        else:
            x, kw = data.draw(fst.mx_quant_cases(g, max_rows=3, max_groups=groups), label="x")
            kw = dict(kw)
        cut = data.draw(st.integers(0, min(g, x.shape[1]) - 1), label="cut K")
        x = x[:, : x.shape[1] - cut]
    if data.draw(st.integers(0, 7), label="no rows") == 0:
        x = x[:0]
    return x, kw


# -- quantize_fp8 ---------------------------------------------------------------------------------

MODES = ("static", "dynamic", "per_token", "group", "mx")


def _quantize_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    mode = data.draw(st.sampled_from(MODES), label="mode")
    x32, plain = draw_values(data, mode)
    dt = data.draw(st.sampled_from(FLOAT_DTYPES), label="dtype")
    x, x_op = as_dtype(data, x32, dt)
    args = [laid_out(data, x, fw)]
    kwargs = {}
    if mode == "static":
        kwargs["scale"] = scalar_form(data, plain["scale"], fw)
    elif mode == "per_token":
        kwargs["per_token"] = flag_form(data, True)
        if "scale_ub" in plain:
            kwargs["scale_ub"] = scalar_form(data, plain["scale_ub"], fw)
    elif mode in ("group", "mx"):
        kwargs["group_size"] = plain["group_size"]
        kwargs["column_major_scales"] = column_major = flag_form(data, data.draw(st.booleans()))
        if mode == "group":
            kwargs["scale_ue8m0"] = flag_form(data, plain["scale_ue8m0"])
        else:
            kwargs["scale_format"] = "e8m0"
            if plain["scale_rounding"] != "rceil" or data.draw(st.booleans()):
                kwargs["scale_rounding"] = plain["scale_rounding"]

    defect = None
    if data.draw(st.integers(0, 9), label="defect?") < 4:
        defect = _quantize_defect(data, mode, fw, x32, args, kwargs, plain)

    def verify(q):
        want_codes, want_scale = oracle_quantize(x_op, mode, plain)
        codes, scale = host(q.data, fw), host(q.scale, fw)
        assert codes.dtype == U8 and codes.shape == want_codes.shape, (codes.dtype, codes.shape, want_codes.shape)
        np.testing.assert_array_equal(codes, want_codes)
        assert scale.shape == want_scale.shape and scale.dtype == want_scale.dtype, (scale.shape, want_scale.shape)
        np.testing.assert_array_equal(bits(scale), bits(want_scale))
        assert q.scheme == {"group": "per_group", "mx": "per_group"}.get(mode, mode)
        if mode in ("group", "mx"):
            assert q.group_size == plain["group_size"]
            if column_major and min(scale.shape) > 1:
                assert scale.strides[0] == scale.itemsize, "column-major scales must be m-contiguous"

    judge("quantize_fp8", caller(fw, vt.quantize_fp8, *args, **kwargs), verify, defect)


def _quantize_defect(data, mode, fw, x32, args, kwargs, plain):
    """Apply one defect to a legal quantize_fp8 call (in place); return it."""
    choices = ["x dtype", "x kind", "scale_format", "flag"]
    choices += {
        "static": ["scale", "scale", "scale_ub given", "e8m0 without groups", "rounding without e8m0"],
        "dynamic": ["scale_ub given", "group flags", "e8m0 without groups", "rounding without e8m0"],
        "per_token": ["x ndim", "scale_ub", "scale with per_token", "group flags"],
        "group": ["x ndim", "group_size", "group with scale", "rounding without e8m0"],
        "mx": ["x ndim", "group_size", "group with scale", "bad rounding", "ue8m0 with e8m0"],
    }[mode]
    if fw == "torch" and mode == "static" and isinstance(kwargs["scale"], Arr):
        choices.append("mixed")
    what = data.draw(st.sampled_from(choices), label="defect")
    if what == "x dtype":
        args[0], evidence = bad_dtype_array(data, x32.shape, fw)
        return _defect("x", evidence)
    if what == "x kind":
        args[0] = x32.tolist() if x32.ndim else float(x32)
        return _defect("x", type(args[0]).__name__)
    if what == "x ndim":
        bad = x32.reshape(-1) if data.draw(st.booleans()) else x32[None]
        args[0] = Arr(np.ascontiguousarray(bad))
        return _defect("x", bad.shape)
    if what == "scale":
        kwargs["scale"], defect = bad_quant_scale(data, "scale", plain["scale"], fw)
        return defect
    if what == "scale_ub":
        kwargs["scale_ub"], defect = bad_quant_scale(data, "scale_ub", plain.get("scale_ub", 10.0), fw)
        return defect
    if what == "scale_ub given":
        kwargs["scale_ub"] = 2.0
        return _defect("scale_ub", "per_token")
    if what == "scale with per_token":
        kwargs["scale"] = 0.5
        return _defect("scale", "per_token=True")
    if what == "group flags":
        name = data.draw(st.sampled_from(["scale_ue8m0", "column_major_scales"]))
        kwargs[name] = True
        return _defect(name, f"{name}=True")
    if what == "flag":
        name = {"group": "scale_ue8m0", "mx": "column_major_scales"}.get(mode, "per_token")
        kwargs[name], defect = bad_flag(data, name)
        return defect
    if what == "scale_format":
        kwargs["scale_format"] = v = data.draw(st.sampled_from(["fp32", "E8M0", None, "float16"]))
        return _defect("scale_format", repr(v))
    if what == "e8m0 without groups":
        kwargs["scale_format"] = "e8m0"
        return _defect("scale_format", "group_size=None")
    if what == "rounding without e8m0":
        kwargs["scale_rounding"] = v = data.draw(st.sampled_from(["rceil", "floor"]))
        return _defect("scale_rounding", repr(v))
    if what == "bad rounding":
        kwargs["scale_rounding"] = v = data.draw(st.sampled_from(["nearest", "RCEIL", "ceil"]))
        return _defect("scale_rounding", repr(v))
    if what == "ue8m0 with e8m0":
        kwargs["scale_ue8m0"] = True
        return _defect("scale_ue8m0", "True")
    if what == "group_size":
        kwargs["group_size"] = v = data.draw(st.sampled_from([0, -8, True, 2.5, "32", np.float32(8)]))
        return _defect("group_size", repr(v))
    if what == "group with scale":
        name = data.draw(st.sampled_from(["scale", "per_token", "scale_ub"]))
        kwargs[name] = {"scale": 0.5, "per_token": True, "scale_ub": 4.0}[name]
        return _defect(name, f"{name}=")
    assert what == "mixed"
    kwargs["scale"].numpy = True
    return _defect("scale", "numpy.ndarray")


def test_fuzz_quantize_fp8():
    fuzz(260, ["quantize_fp8"], _quantize_draw)


# -- encode_e4m3 / decode_e4m3 ---------------------------------------------------------------------


def _codec_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    dims = data.draw(SHAPES, label="shape")
    if data.draw(st.booleans(), label="encode?"):
        x32 = data.draw(hnp.arrays(F32, dims, elements=fst.float32_values()), label="x")
        x, x_op = as_dtype(data, x32, data.draw(st.sampled_from(FLOAT_DTYPES), label="dtype"))
        arg, defect = laid_out(data, x, fw), None
        if data.draw(st.integers(0, 3)) == 0:
            if data.draw(st.booleans()):
                arg, evidence = bad_dtype_array(data, dims, fw)
                defect = _defect("x", evidence)
            else:
                arg = x32.tolist() if x32.ndim else float(x32)
                defect = _defect("x", type(arg).__name__)

        def verify(codes):
            codes = host(codes, fw)
            want = reference.encode(x_op)
            assert codes.dtype == U8 and codes.shape == want.shape, (codes.dtype, codes.shape, want.shape)
            np.testing.assert_array_equal(codes, want)

        judge("encode_e4m3", caller(fw, vt.encode_e4m3, arg), verify, defect)
        return
    codes = data.draw(hnp.arrays(U8, dims, elements=st.integers(0, 255)), label="codes")
    typed = codes.view(FP8) if data.draw(st.booleans(), label="float8 dtype") else codes
    arg, defect = laid_out(data, typed, fw), None
    if data.draw(st.integers(0, 3)) == 0:
        if data.draw(st.booleans()):
            choices = [np.int8, np.int32, np.float32, np.bool_] + ([object] if fw == "numpy" else [])
            dt = np.dtype(data.draw(st.sampled_from(choices)))
            arg, defect = Arr(codes.astype(dt)), _defect("codes", dt)
        else:
            arg = codes.tolist() if codes.ndim else int(codes)
            defect = _defect("codes", type(arg).__name__)

    def verify(values):
        assert_same_floats(host(values, fw), reference.decode(codes).astype(F32))

    judge("decode_e4m3", caller(fw, vt.decode_e4m3, arg), verify, defect)


def test_fuzz_codec():
    fuzz(160, ["encode_e4m3", "decode_e4m3"], _codec_draw)


# -- dequantize_fp8 -------------------------------------------------------------------------------

OUT_DTYPES = (F32, F16, BF16)


def out_dtype_form(data, dt):
    """An out dtype as a numpy type, a dtype, a name, or (torch present) a torch dtype."""
    names = {F32: ["float32", "fp32"], F16: ["float16", "half"], BF16: ["bfloat16", "bf16"]}[dt]
    forms = [dt, dt.type, *names]
    if torch is not None:
        forms.append({F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[dt])
    return data.draw(st.sampled_from(forms), label="out dtype form")


def bad_out_dtype(data, name):
    choices = [(np.float64, "float64"), (np.int8, "int8"), ("float64", "'float64'"), ("fp8", "'fp8'")]
    choices += [(object, "object"), (5, "5")]
    if torch is not None:
        choices.append((torch.int32, "'torch.int32'"))
    v, evidence = data.draw(st.sampled_from(choices), label=f"bad {name}")
    return v, _defect(name, evidence)


def _round_to(y32, dt):
    return np.asarray(y32.astype(dt))  # a 0-d result stays an array


def expand_scale(scale, mode, group_size, k):
    """A quantized activation's scale over its elements (each group's over its group)."""
    if mode == "mx":
        scale = reference.decode_e8m0(scale).astype(F32)
    if mode in ("group", "mx"):
        scale = np.repeat(scale, group_size, axis=-1)[..., :k]
    return scale


def _dequantize_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    dt = data.draw(st.sampled_from(OUT_DTYPES), label="out dtype")
    dtype = out_dtype_form(data, dt)
    if data.draw(st.integers(0, 3), label="activation?") == 0:  # a QuantizedActivation as codes
        mode = data.draw(st.sampled_from(MODES), label="mode")
        x32, plain = draw_values(data, mode)
        if x32.size == 0 or x32.ndim == 0:  # QuantizedActivation.dequantize reads K from a last axis
            x32 = np.full((2, 3), 0.75, F32)
        qkw = {k: v for k, v in plain.items() if k in ("scale", "scale_ub", "group_size", "scale_ue8m0")}
        if mode == "per_token":
            qkw["per_token"] = True
        if mode == "mx":
            qkw.update(scale_format="e8m0", scale_rounding=plain["scale_rounding"])
        x_arr = Arr(x32)
        q = Lazy(lambda fw_: vt.quantize_fp8(build(x_arr, fw_), **qkw))
        kwargs, defect = {"dtype": dtype}, None
        if data.draw(st.integers(0, 4)) == 0:
            kwargs["scale"] = v = data.draw(st.sampled_from([1.0, Arr(np.ones(1, F32))]))
            defect = _defect("scale", "float" if isinstance(v, float) else "ndarray", "Tensor")

        def verify(y):
            codes, scale = oracle_quantize(x32, mode, plain)
            s = expand_scale(scale, mode, plain.get("group_size"), x32.shape[-1])
            want = (reference.decode(codes) * s.astype(F64)).astype(F32)
            assert_same_floats(host(y, fw), _round_to(want, dt))

        judge("dequantize_fp8", caller(fw, vt.dequantize_fp8, q, **kwargs), verify, defect)
        return

    dims = data.draw(SHAPES, label="shape")
    codes = data.draw(hnp.arrays(U8, dims, elements=st.integers(0, 255)), label="codes")
    codes_arr = laid_out(data, codes.view(FP8) if data.draw(st.booleans()) else codes, fw)
    kind = data.draw(st.sampled_from(["scalar", "array"]), label="scale kind")
    if kind == "scalar":
        s = f32(data.draw(st.one_of(fst.mm_scales(), st.just(0.0), st.just(3.0)), label="scale"))
        scale = scalar_form(data, s, fw)
        s_np = np.asarray(scale.value if isinstance(scale, Arr) else s, F32)  # a [1] scale broadcasts to (1,)
    else:  # any shape that broadcasts against the codes: (), (1,), the last axis, a column, the whole
        shapes = [(), (1,)] + ([dims[-1:], dims[:-1] + (1,), dims] if dims else [])
        sshape = data.draw(st.sampled_from(shapes), label="scale shape")
        sdt = data.draw(st.sampled_from([F32, F32, F16, BF16, np.dtype(np.int32)]), label="scale dtype")
        elements = st.one_of(fst.mm_scales(), st.sampled_from([0.0, math.nan, math.inf]))
        if sdt == np.int32:
            elements = st.integers(-5, 5)
        s_vals = data.draw(hnp.arrays(F32, sshape, elements=elements), label="scale values")
        s_typed = s_vals.astype(sdt)
        scale, s_np = laid_out(data, s_typed, fw), s_typed.astype(F32)
    args, kwargs, defect = [codes_arr, scale], {"dtype": dtype}, None
    if data.draw(st.integers(0, 9), label="defect?") < 4:
        defect = _dequantize_defect(data, fw, codes, dims, args, kwargs)

    def verify(y):
        want = (reference.decode(codes) * np.asarray(s_np).astype(F64)).astype(F32)
        assert_same_floats(host(y, fw), _round_to(want, dt))

    judge("dequantize_fp8", caller(fw, vt.dequantize_fp8, *args, **kwargs), verify, defect)


def _dequantize_defect(data, fw, codes, dims, args, kwargs):
    what = data.draw(
        st.sampled_from(["codes", "codes kind", "scale value", "scale kind", "scale dtype", "shape", "none", "dtype"]),
        label="defect",
    )
    if what == "codes":
        choices = [np.int8, np.int32, np.float32, np.bool_]
        dt = np.dtype(data.draw(st.sampled_from(choices)))
        args[0] = Arr(codes.astype(dt))
        return _defect("codes", dt)
    if what == "codes kind":
        args[0] = codes.tolist() if codes.ndim else int(codes)
        return _defect("codes", type(args[0]).__name__)
    if what == "scale value":  # a scalar scale must be finite (an array is taken as it is)
        v = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e39]))
        args[1] = data.draw(st.sampled_from([v, np.float32(v), np.float64(v)]))
        return _defect("scale", "nan", "inf")
    if what == "scale kind":
        choices = [([2.0], "list"), ("2.0", "str"), (True, "bool"), (np.True_, "bool"), (2j, "complex")]
        args[1], evidence = data.draw(st.sampled_from(choices))
        return _defect("scale", evidence)
    if what == "scale dtype":
        choices = [np.complex64, np.bool_] + ([object] if fw == "numpy" else [])
        dt = np.dtype(data.draw(st.sampled_from(choices)))
        args[1] = Arr(np.ones((1,), dt))
        return _defect("scale", dt)
    if what == "shape":
        bad = _unbroadcastable(dims)
        if bad is None:  # every axis is 1 (or none): any scale broadcasts; refuse a missing one instead
            del args[1]
            return _defect("scale", "None")
        args[1] = Arr(np.ones(bad, F32))
        return _defect("scale", bad)
    if what == "none":
        del args[1]
        return _defect("scale", "None")
    kwargs["dtype"], defect = bad_out_dtype(data, "dtype")
    return defect


def _unbroadcastable(dims):
    """A scale shape that does not broadcast against codes of shape ``dims``, or None."""
    for i in range(len(dims) - 1, -1, -1):
        if dims[i] != 1:
            return (dims[i] + 2,) + (1,) * (len(dims) - 1 - i)
    return None


def test_fuzz_dequantize_fp8():
    fuzz(150, ["dequantize_fp8"], _dequantize_draw)


# -- scaled_mm ------------------------------------------------------------------------------------


@dataclass
class Mm:
    """One GEMM draw: operands and scales as the oracle reads them (``block`` None: dense)."""

    a: np.ndarray
    b: np.ndarray
    sa: Any
    sb: Any
    bias: Any
    out: np.dtype
    block: Any = None


def _dense_problem(data):
    if data.draw(st.integers(0, 7), label="degenerate?") == 0:  # 0 rows, 0 weight rows or K = 0
        m, n, k = data.draw(st.sampled_from([(0, 3, 5), (2, 0, 5), (3, 4, 0), (1, 2, 0), (0, 0, 3)]))
        rng = np.random.default_rng(m * 100 + n * 10 + k)
        a = rng.integers(0, 0x7E, (m, k), dtype=np.uint8)
        b = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
        bias = None if n == 0 or data.draw(st.booleans()) else np.linspace(-1, 1, n).astype(F32)
        return Mm(a, b, 0.5, f32(-1.25), bias, data.draw(st.sampled_from(OUT_DTYPES)))
    case = data.draw(fst.gemm_cases(max_m=12, max_n=12, max_k=80), label="gemm case")
    return Mm(case.a, case.b, case.scale_a, case.scale_b, case.bias, case.out_dtype)


def _block_problem(data):
    if data.draw(st.booleans(), label="mx?"):
        case = data.draw(fst.mx_gemm_cases(max_m=6, max_n=10, max_k=100), label="mx case")
        sa, sb = case.scale_a, case.scale_b
        if data.draw(st.integers(0, 3)) == 0 and (sa != 0xFF).all():  # E8M0 on one side only (a float
            sa = reference.decode_e8m0(sa).astype(F32)  # scale must be finite: 0xFF stays a byte)
        return Mm(case.a, case.b, sa, sb, case.bias, case.out_dtype, case.block_size)
    bn = data.draw(st.sampled_from([1, 2, 3, 16, 128]), label="bn")
    bk = data.draw(st.sampled_from([1, 3, 8, 32, 128]), label="bk")
    m, n, k = data.draw(st.integers(0, 6)), data.draw(st.integers(1, 10)), data.draw(st.integers(1, 140))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a, b = (rng.integers(0, 256, size=s, dtype=np.uint8) for s in ((m, k), (n, k)))
    a[(a & 0x7F) == 0x7F] ^= 1
    b[(b & 0x7F) == 0x7F] ^= 1
    nkb = -(-k // bk)
    sa = (rng.standard_normal((m, nkb)) * 4).astype(F32)  # any finite value: signs and zeros too
    sb = (rng.standard_normal((-(-n // bn), nkb)) * 0.01).astype(F32)
    if data.draw(st.booleans()):
        sb = np.abs(sb).astype(data.draw(st.sampled_from([F32, F16, BF16])))
    if data.draw(st.integers(0, 3)) == 0:  # DeepSeek's UE8M0 weight blocks
        sb = rng.integers(110, 130, size=sb.shape, dtype=np.uint8)
    bias = None if data.draw(st.booleans()) else (rng.standard_normal(n) * 3).astype(F32)
    return Mm(a, b, sa, sb, bias, data.draw(st.sampled_from(OUT_DTYPES)), (bn, bk))


def _dense_scale_form(data, s, rows, fw, per):
    """A dense GEMM scale (a float, or [rows, 1] / [rows] values) in one of the forms scaled_mm takes."""
    if np.ndim(s) == 0:
        return scalar_form(data, f32(s), fw)
    v = np.asarray(s, F32).reshape(-1)
    shape = data.draw(st.sampled_from([(rows,), (rows, 1)]), label=f"{per} shape")
    dt = data.draw(st.sampled_from([F32, F32, F16, BF16]), label=f"{per} dtype")
    if dt != F32 and not np.array_equal(v.astype(dt).astype(F32), v):
        dt = F32
    return laid_out(data, v.reshape(shape).astype(dt), fw)


def _codes_form(data, codes, fw):
    return laid_out(data, codes.view(FP8) if data.draw(st.booleans(), label="float8 codes") else codes, fw)


def _scaled_mm_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    p = _block_problem(data) if data.draw(st.integers(0, 9), label="block?") < 3 else _dense_problem(data)
    m, k = p.a.shape
    n = p.b.shape[0]
    args = [_codes_form(data, p.a, fw), _codes_form(data, p.b, fw)]
    if p.block is None:
        args += [_dense_scale_form(data, p.sa, m, fw, "scale_a"), _dense_scale_form(data, p.sb, n, fw, "scale_b")]
    else:
        args += [laid_out(data, p.sa, fw), laid_out(data, p.sb, fw)]
    kwargs = {"out_dtype": out_dtype_form(data, p.out)}
    bias = p.bias
    if bias is not None:
        bdt = data.draw(st.sampled_from([F32, F32, F16, BF16]), label="bias dtype")
        bias = bias.astype(bdt)
        kwargs["bias"] = laid_out(data, bias.reshape(data.draw(st.sampled_from([(n,), (1, n)]))), fw)
    if p.block is not None:
        kwargs["block_size"] = data.draw(st.sampled_from([p.block, list(p.block)]))
    if data.draw(st.integers(0, 3), label="kernel?") == 0:
        kwargs["kernel"] = data.draw(st.sampled_from(["reference", "small_m", "blas"]))
    sa, sb = p.sa, p.sb
    q_mode = False
    if p.block is None and m > 0 and k > 0 and data.draw(st.integers(0, 5)) == 0:  # a QuantizedActivation
        x32 = np.random.default_rng(m * k).standard_normal((m, k)).astype(F32) * 7
        per_token = data.draw(st.booleans())
        codes, scale = oracle_quantize(x32, "per_token" if per_token else "dynamic", {})
        p.a, sa = codes, scale if per_token else float(scale[0])
        x_arr = Arr(x32)
        args[0] = Lazy(lambda fw_: vt.quantize_fp8(build(x_arr, fw_), per_token=per_token))
        args[2], q_mode = None, True
    defect = None
    if data.draw(st.integers(0, 9), label="defect?") < 4:
        defect = _scaled_mm_defect(data, p, fw, args, kwargs, q_mode)

    def verify(y):
        y = host(y, fw)
        b64 = None if bias is None else bias.astype(F64)
        if p.block is None:
            assert_g3(y, p.a, p.b, sa, sb, b64, p.out, require_nonzero=False)
        else:
            assert_block_g3(y, p.a, p.b, sa, sb, p.block, b64, p.out, require_nonzero=False)

    if q_mode:  # a QuantizedActivation as a: scale_a stays out (or is the defect)
        if args[2] is not None:
            kwargs["scale_a"] = args[2]
        judge("scaled_mm", caller(fw, vt.scaled_mm, args[0], args[1], scale_b=args[3], **kwargs), verify, defect)
    else:
        judge("scaled_mm", caller(fw, vt.scaled_mm, *args, **kwargs), verify, defect)


def _scaled_mm_defect(data, p, fw, args, kwargs, q_mode):
    m, k = p.a.shape
    n = p.b.shape[0]
    nkb = None if p.block is None else -(-k // p.block[1])
    choices = ["codes dtype", "codes ndim", "K", "out_dtype", "kernel", "bias shape", "bias dtype", "bias kind"]
    if q_mode:  # a QuantizedActivation as a
        choices += ["scale_a with q", "block for a per-tensor q"]
    elif p.block is None:
        choices += ["scale value", "scale shape", "scale dtype", "scale kind", "scale none"]
    else:
        choices += ["block scale shape", "block scale kind", "block scale value", "block scale dtype", "block_size"]
    if fw == "torch":
        choices.append("mixed")
    what = data.draw(st.sampled_from(choices), label="defect")
    side = 1 if q_mode and what in ("codes dtype", "codes ndim") else data.draw(st.sampled_from([0, 1]), label="side")
    name = "ab"[side] if what in ("codes dtype", "codes ndim") else ("scale_a", "scale_b")[side]
    rows = (m, n)[side]
    if what == "codes dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int8, np.int32, np.float32, np.bool_])))
        args[side] = Arr(np.zeros((p.a, p.b)[side].shape, dt))
        return _defect(name, dt)
    if what == "codes ndim":
        bad = (p.a, p.b)[side].reshape(-1)
        args[side] = Arr(bad)
        return _defect(name, bad.shape)
    if what == "K":
        bad = np.zeros((n, k + 1), U8)
        args[1] = Arr(bad)
        return _defect("b", bad.shape)
    if what == "out_dtype":
        kwargs["out_dtype"], defect = bad_out_dtype(data, "out_dtype")
        return defect
    if what == "kernel":
        kwargs["kernel"] = v = data.draw(st.sampled_from(["tiled", "cublaslt", "Reference", 3]))
        return _defect("kernel", repr(v))
    if what == "bias shape":
        bad = (n + 1,) if data.draw(st.booleans()) else (2, n)
        kwargs["bias"] = Arr(np.zeros(bad, F32))
        return _defect("bias", bad)
    if what == "bias dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int32, np.uint8, np.bool_])))
        kwargs["bias"] = Arr(np.zeros(n, dt))
        return _defect("bias", dt)
    if what == "bias kind":
        kwargs["bias"] = v = data.draw(st.sampled_from([1.0, [0.0] * n]))
        return _defect("bias", type(v).__name__)
    if what == "scale_a with q":
        args[2] = 1.0
        return _defect("scale_a", "float")
    if what == "block for a per-tensor q":
        kwargs["block_size"] = (128, 128)
        return _defect("a", "'dynamic'", "'per_token'")
    if what == "scale value":
        v = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e39]))
        if data.draw(st.booleans()):
            args[2 + side] = data.draw(st.sampled_from([v, np.float32(v)]))
        else:
            vals = np.ones(rows, F32)
            if rows:
                vals[data.draw(st.integers(0, rows - 1))] = v
            args[2 + side] = Arr(vals if rows else np.array([v], F32))
        return _defect(name, "nan", "inf")
    if what == "scale shape":
        bad = data.draw(st.sampled_from([(rows + 2,), (1, rows + 2), (2, 2, 1), (rows + 2, 1)]))  # not (1,)
        args[2 + side] = Arr(np.ones(bad, F32))
        return _defect(name, bad)
    if what == "scale dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int32, np.bool_, np.complex64])))
        args[2 + side] = Arr(np.ones(max(rows, 1), dt))
        return _defect(name, dt)
    if what == "scale kind":
        v, evidence = data.draw(st.sampled_from([(True, "bool"), ([1.0], "list"), ("1.0", "str"), (1j, "complex")]))
        args[2 + side] = v
        return _defect(name, evidence)
    if what == "scale none":
        args[2 + side] = None
        return _defect(name, "None")
    if what == "block scale shape":
        want = (m, nkb) if side == 0 else (-(-n // p.block[0]), nkb)
        bad = (want[0] + 1, want[1]) if data.draw(st.booleans()) else (want[0], want[1] + 1)
        args[2 + side] = Arr(np.ones(bad, F32))
        return _defect(name, bad)
    if what == "block scale kind":
        v = data.draw(st.sampled_from([1.0, Arr(np.ones(3, F32))]))
        args[2 + side] = v
        return _defect(name, "shape ()" if isinstance(v, float) else "(3,)")
    if what == "block scale value":
        want = (m, nkb) if side == 0 else (-(-n // p.block[0]), nkb)
        if math.prod(want) == 0:
            side, name, want = 1, "scale_b", (-(-n // p.block[0]), nkb)
        vals = np.ones(want, F32)
        vals.reshape(-1)[data.draw(st.integers(0, vals.size - 1))] = data.draw(st.sampled_from([math.nan, math.inf]))
        args[2 + side] = Arr(vals)
        return _defect(name, "nan", "inf")
    if what == "block scale dtype":
        want = (m, nkb) if side == 0 else (-(-n // p.block[0]), nkb)
        dt = np.dtype(data.draw(st.sampled_from([np.int32, np.int8, np.bool_])))
        args[2 + side] = Arr(np.ones(want, dt))
        return _defect(name, dt)
    if what == "block_size":
        v = data.draw(st.sampled_from([(0, 128), (128,), (128, 1.5), "ab", (True, 32), 5, (-1, 1)]))
        kwargs["block_size"] = v
        return _defect("block_size", str(tuple(v)) if isinstance(v, str) else str(v))
    assert what == "mixed"
    target = data.draw(st.sampled_from([1] + ([3] if isinstance(args[3], Arr) else [])))
    args[target].numpy = True
    return _defect("b" if target == 1 else "scale_b", "numpy.ndarray")


def test_fuzz_scaled_mm():
    fuzz(260, ["scaled_mm"], _scaled_mm_draw)


# -- fp8_linear -----------------------------------------------------------------------------------


def _fp8_linear_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    mode = data.draw(st.sampled_from(["static", "dynamic", "per_token"]), label="mode")
    if mode == "per_token":
        x32, plain = draw_values(data, "per_token")
    else:
        m, k = data.draw(st.integers(0, 6)), data.draw(st.integers(1, 48))
        strategy = fst.static_quant_cases(shape=(m, k)) if mode == "static" else fst.dynamic_quant_cases((m, k))
        if mode == "dynamic" and m == 0:
            x32, plain = np.zeros((0, k), F32), {}
        else:
            x32, plain = data.draw(strategy, label="x")
            plain = dict(plain)
    m, k = x32.shape
    n = data.draw(st.integers(1, 10), label="n")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    b = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    b[(b & 0x7F) == 0x7F] ^= 1
    sb = f32(data.draw(fst.mm_scales()))
    if data.draw(st.booleans(), label="per-channel?"):
        sb = np.array([data.draw(fst.mm_scales()) for _ in range(n)], F32)
    bias = None if data.draw(st.booleans()) else (rng.standard_normal(n) * 2).astype(F32)
    out = data.draw(st.sampled_from(OUT_DTYPES), label="out")
    x, x_op = as_dtype(data, x32, data.draw(st.sampled_from(FLOAT_DTYPES), label="dtype"))
    args = [laid_out(data, x, fw), _codes_form(data, b, fw), _dense_scale_form(data, sb, n, fw, "scale_b")]
    kwargs = {"out_dtype": out_dtype_form(data, out)}
    if mode == "static":
        kwargs["input_scale"] = scalar_form(data, plain["scale"], fw)
    elif mode == "per_token":
        kwargs["per_token"] = flag_form(data, True)
        if "scale_ub" in plain:
            kwargs["scale_ub"] = scalar_form(data, plain["scale_ub"], fw)
    if bias is not None:
        kwargs["bias"] = laid_out(data, bias, fw)
    defect = None
    if data.draw(st.integers(0, 9), label="defect?") < 4:
        defect = _fp8_linear_defect(data, mode, fw, x32, b, args, kwargs, plain)

    def verify(y):
        codes, scale = oracle_quantize(x_op, mode, plain)
        sa = scale if mode == "per_token" else float(scale[0])
        b64 = None if bias is None else bias.astype(F64)
        assert_g3(host(y, fw), codes, b, sa, sb, b64, out, require_nonzero=False)

    judge("fp8_linear", caller(fw, vt.fp8_linear, *args, **kwargs), verify, defect)


def _fp8_linear_defect(data, mode, fw, x32, b, args, kwargs, plain):
    m, k = x32.shape
    choices = ["x dtype", "x kind", "x ndim", "b shape", "b dtype", "scale_b", "out_dtype", "bias"]
    choices += {
        "static": ["input_scale", "input_scale", "scale_ub given", "per_token flag"],
        "dynamic": ["scale_ub given", "per_token flag"],
        "per_token": ["input_scale with per_token", "scale_ub", "per_token flag"],
    }[mode]
    what = data.draw(st.sampled_from(choices), label="defect")
    if what == "x dtype":
        args[0], evidence = bad_dtype_array(data, x32.shape, fw)
        return _defect("x", evidence)
    if what == "x kind":
        args[0] = x32.tolist()
        return _defect("x", "list")
    if what == "x ndim":
        bad = x32[None] if data.draw(st.booleans()) else x32.reshape(-1)
        args[0] = Arr(np.ascontiguousarray(bad))
        return _defect("x", bad.shape)
    if what == "b shape":
        bad = np.zeros((b.shape[0], k + 1), U8)
        args[1] = Arr(bad)
        return _defect("b", bad.shape)
    if what == "b dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int8, np.float32])))
        args[1] = Arr(b.astype(dt))
        return _defect("b", dt)
    if what == "scale_b":
        args[2] = v = data.draw(st.sampled_from([math.nan, math.inf, "1.0", True]))
        return _defect("scale_b", {str: "str", bool: "bool"}.get(type(v), "nan" if v != v else "inf"))
    if what == "out_dtype":
        kwargs["out_dtype"], defect = bad_out_dtype(data, "out_dtype")
        return defect
    if what == "bias":
        bad = (b.shape[0] + 1,)
        kwargs["bias"] = Arr(np.zeros(bad, F32))
        return _defect("bias", bad)
    if what == "input_scale":
        kwargs["input_scale"], defect = bad_quant_scale(data, "input_scale", plain["scale"], fw)
        return defect
    if what == "input_scale with per_token":
        kwargs["input_scale"] = 0.25
        return _defect("input_scale", "per_token")
    if what == "scale_ub given":
        kwargs["scale_ub"] = 3.0
        return _defect("scale_ub", "per_token")
    if what == "scale_ub":
        kwargs["scale_ub"], defect = bad_quant_scale(data, "scale_ub", plain.get("scale_ub", 8.0), fw)
        return defect
    kwargs["per_token"], defect = bad_flag(data, "per_token")
    return defect


def test_fuzz_fp8_linear():
    fuzz(150, ["fp8_linear"], _fp8_linear_draw)


# -- the seam: Fp8Weight, from_float, matmul_fp8, quantize_activation, prequant, make_linear_method ---

# weight kinds: (activation mode of the oracle, block-scaled?)
SEAM_KINDS = {
    "dynamic": ("dynamic", False),
    "static": ("static", False),
    "per_token": ("per_token", False),
    "channel_dynamic": ("dynamic", False),
    "block": ("group", True),
    "block_ue8m0": ("group", True),
    "ue8m0_weight": ("group", True),
    "mx": ("mx", True),
}
SEAM_OPS = [
    "seam.Fp8Weight",
    "seam.Fp8Weight.from_float",
    "seam.quantize_activation",
    "seam.matmul_fp8",
    "seam.matmul_fp8_prequant",
    "seam.make_linear_method",
]


@dataclass
class WeightSpec:
    """A legal weight: ``kwargs`` for Fp8Weight (or ``float_w`` and ``ff_kwargs`` for from_float), and
    what the oracle reads: codes, the weight scale (float, [N] or block scales), bias, the activation
    mode and its plain keywords."""

    kind: str
    n: int
    k: int
    codes: np.ndarray
    scale: Any
    bias: Any
    block: Any
    mode: str
    plain: dict
    kwargs: dict
    float_w: Any = None
    ff_kwargs: Any = None


def _positive(data, label):
    return f32(data.draw(st.floats(min_value=f32(1e-3), max_value=4.0, width=32), label=label))


def _draw_weight(data, fw):
    kind = data.draw(st.sampled_from(list(SEAM_KINDS)), label="weight kind")
    mode, blocked = SEAM_KINDS[kind]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="weight seed"))
    if blocked:
        bn, bk = data.draw(st.sampled_from([(1, 8), (4, 16), (16, 32), (128, 128), (1, 32), (2, 3)]), label="block")
        if kind == "mx":
            bn, bk = 1, data.draw(st.sampled_from([32, 32, 16]))
        if kind == "ue8m0_weight" and bn == 1:
            bn = 4
        n, k = data.draw(st.integers(1, 10), label="n"), data.draw(st.integers(1, 2 * bk + 5), label="k")
    else:
        bn = bk = None
        n, k = data.draw(st.integers(1, 10), label="n"), data.draw(st.integers(1, 72), label="k")
    block = None if bn is None else (bn, bk)
    plain, kwargs = {}, {}
    bias = None
    if data.draw(st.booleans(), label="bias?"):
        bias = (rng.standard_normal(n) * 2).astype(data.draw(st.sampled_from([F32, F16, BF16])))
        kwargs["bias"] = laid_out(data, bias.reshape(data.draw(st.sampled_from([(n,), (1, n)]))), fw)
    spec = WeightSpec(kind, n, k, None, None, bias, block, mode, plain, kwargs)

    # from_float where the reference quantizes the weight as from_float documents it
    float_ok = kind in ("dynamic", "static", "per_token", "channel_dynamic", "mx") or (blocked and bn == 1)
    if kind == "ue8m0_weight":
        float_ok = False
    if float_ok and data.draw(st.booleans(), label="from_float?"):
        w32 = (rng.standard_normal((n, k)) * data.draw(st.sampled_from([0.01, 1.0, 300.0]))).astype(F32)
        # from_float quantizes w in its own dtype (float64 cast to float32 first): the oracle reads the same values
        w, w_op = as_dtype(data, w32, data.draw(st.sampled_from(FLOAT_DTYPES), label="w dtype"))
        ff = {}
        if kind in ("per_token", "channel_dynamic"):
            ff["per_channel"] = flag_form(data, True)
            r = reference.quantize(w_op, per_token=True)
            spec.codes, spec.scale = r.data, r.scale.reshape(-1)
        elif kind in ("dynamic", "static"):
            r = reference.quantize(w_op)
            spec.codes, spec.scale = r.data, float(r.scale[0])
        elif kind == "mx":
            rounding = data.draw(st.sampled_from([None, "rceil", "floor"]), label="rounding")
            ff.update(block_size=block, scale_format="e8m0")
            if rounding is not None:
                ff["scale_rounding"] = rounding
            r = reference.quantize_mx(w_op, bk, rounding or "rceil")
            spec.codes, spec.scale = r.data, r.scale
            plain.update(group_size=bk, scale_rounding=rounding or "rceil")
        else:  # bn = 1: one block per 1 x bk group, the per-group rule
            ff["block_size"] = block
            r = reference.quantize_per_group(w_op, bk)
            spec.codes, spec.scale = r.data, r.scale
        if "bias" in kwargs:
            ff["bias"] = kwargs.pop("bias")
        spec.float_w, spec.ff_kwargs = w, ff
    else:
        codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] ^= 1
        spec.codes = codes
        kwargs["data"] = laid_out(data, codes.view(FP8) if data.draw(st.booleans()) else codes, fw)
        if not blocked:
            if kind in ("per_token", "channel_dynamic"):
                spec.scale = np.array([_positive(data, "channel scale") for _ in range(n)], F32)
                kwargs["weight_scale"] = _dense_scale_form(data, spec.scale, n, fw, "weight_scale")
            else:
                spec.scale = _positive(data, "weight scale")
                kwargs["weight_scale"] = scalar_form(data, spec.scale, fw)
        else:
            shape = (-(-n // bn), -(-k // bk))
            if kind in ("ue8m0_weight", "mx"):
                spec.scale = rng.integers(112, 135, size=shape, dtype=np.uint8)
                kwargs["weight_scale"] = laid_out(
                    data, spec.scale.view(E8M0) if data.draw(st.booleans()) else spec.scale, fw
                )
            else:
                dt = data.draw(st.sampled_from([F32, F16, BF16]), label="block scale dtype")
                spec.scale = (np.abs(rng.standard_normal(shape)) * 0.01 + 1e-4).astype(dt)
                kwargs["weight_scale"] = laid_out(data, spec.scale, fw)
            kwargs["block_size"] = data.draw(st.sampled_from([block, list(block)]))
    if kind == "static":
        s = f32(data.draw(fst.case_scales(), label="input scale"))
        plain["scale"] = s
        (spec.ff_kwargs if spec.float_w is not None else kwargs)["input_scale"] = scalar_form(data, s, fw)
    if kind == "block_ue8m0":
        (spec.ff_kwargs if spec.float_w is not None else kwargs)["scale_ue8m0"] = flag_form(data, True)
        plain["scale_ue8m0"] = True
    if blocked and kind != "mx":
        plain["group_size"] = bk
        plain.setdefault("scale_ue8m0", False)
    if kind == "mx" and spec.float_w is None:
        rounding = data.draw(st.sampled_from([None, "rceil", "floor"]), label="rounding")
        if rounding is not None:
            kwargs["activation_scale_rounding"] = rounding
        plain.update(group_size=bk, scale_rounding=rounding or "rceil")
    if kind == "ue8m0_weight" and data.draw(st.booleans()):
        kwargs["activation_scale_format"] = "float32"
    scheme = {"channel_dynamic": "dynamic", "block": "per_group", "block_ue8m0": "per_group"}.get(kind, kind)
    scheme = {"ue8m0_weight": "per_group", "mx": "per_group"}.get(scheme, scheme)
    if kind == "per_token" or data.draw(st.booleans(), label="explicit scheme?"):  # the default is dynamic
        target = spec.ff_kwargs if spec.float_w is not None else kwargs
        target["activation_scheme"] = data.draw(st.sampled_from([scheme, vt.ActivationScheme(scheme)]))
    return spec


def _seam_draw(data, judge):
    fw = data.draw(st.sampled_from(FRAMEWORKS), label="framework")
    spec = _draw_weight(data, fw)
    n, k = spec.n, spec.k
    entry = data.draw(
        st.sampled_from(["matmul_fp8", "prequant", "apply", "apply_prequant", "matmul_fp8"]), label="entry"
    )
    lead = data.draw(st.sampled_from([(), (3,), (1,), (0,), (2, 2), (4,)]), label="leading shape")
    if entry in ("prequant", "apply_prequant") and spec.mode in ("per_token", "group", "mx"):
        lead = lead if len(lead) == 1 else (2,)  # quantize_activation takes x [M, K] for these schemes
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="x seed"))
    x32 = (rng.standard_normal(lead + (k,)) * data.draw(st.sampled_from([0.01, 1.0, 50.0]))).astype(F32)
    if x32.size and data.draw(st.integers(0, 5)) == 0:
        x32.reshape(-1)[data.draw(st.integers(0, x32.size - 1))] = data.draw(st.sampled_from([math.nan, math.inf]))
    x_dt = data.draw(st.sampled_from(FLOAT_DTYPES), label="x dtype")
    x, x_op = as_dtype(data, x32, x_dt)
    x_arg = laid_out(data, x, fw)
    out = data.draw(st.sampled_from([None, F32, F16, BF16]), label="out dtype")
    out_arg = None if out is None else out_dtype_form(data, out)
    resident = data.draw(st.integers(0, 3), label="resident?") == 0

    # one defect at most, in the weight, in from_float or in the call
    where = data.draw(st.integers(0, 9), label="defect?")
    where = "none" if where >= 4 else data.draw(st.sampled_from(["weight", "call", "call"]), label="defect in")
    weight_op = "seam.Fp8Weight" if spec.float_w is None else "seam.Fp8Weight.from_float"
    defect = None
    if where == "weight":
        defect = (_weight_defect if spec.float_w is None else _from_float_defect)(data, spec, fw)
    if spec.float_w is None:
        make = caller(fw, lambda **kw: seam.Fp8Weight(**kw), **spec.kwargs)
    else:
        w_arg = laid_out(data, spec.float_w, fw) if isinstance(spec.float_w, np.ndarray) else spec.float_w
        make = caller(fw, seam.Fp8Weight.from_float, w_arg, **spec.ff_kwargs)

    def verify_weight(w):
        assert w.shape == (n, k) and w.device == "cpu"
        np.testing.assert_array_equal(w.data, spec.codes)
        want = np.asarray(spec.scale)
        got = np.asarray(w.weight_scale)
        if spec.block is None:
            np.testing.assert_array_equal(got.reshape(-1), want.astype(F32).reshape(-1))
        else:
            np.testing.assert_array_equal(got, want.astype(F32) if want.dtype != U8 else want)

    w = judge(weight_op, make, verify_weight, defect)
    if w is None:
        return
    weight = seam.ResidentFp8(w, "cpu") if resident else w
    if where == "call":
        defect, call_op, call = _seam_call_defect(data, spec, fw, entry, weight, x32, x_arg, out_arg)
        judge(call_op, call, None, defect)
        return

    rows = x_op.reshape(-1, k)
    default_out = F32 if entry in ("prequant", "apply_prequant") or x_dt == F64 else x_dt
    out_dt = default_out if out is None else out

    def verify(y):
        y = host(y, fw)
        assert y.shape == lead + (n,) and y.dtype == out_dt, (y.shape, lead + (n,), y.dtype, out_dt)
        codes, scale = oracle_quantize(rows, spec.mode, spec.plain)
        b64 = None if spec.bias is None else spec.bias.astype(F64)
        if spec.block is None:
            sa = scale if spec.mode == "per_token" else float(scale[0])
            assert_g3(y.reshape(-1, n), codes, spec.codes, sa, spec.scale, b64, out_dt, require_nonzero=False)
        else:
            assert_block_g3(
                y.reshape(-1, n), codes, spec.codes, scale, spec.scale, spec.block, b64, out_dt, require_nonzero=False
            )
        # the entry points are one computation: matmul_fp8 gives the same bits
        direct = host(build(Lazy(lambda fw_: seam.matmul_fp8(build(x_arg, fw_), weight, out_dt)), fw), fw)
        np.testing.assert_array_equal(bits(direct), bits(y))

    extra = {} if out_arg is None else {"out_dtype": out_arg}
    if entry in ("prequant", "apply_prequant"):

        def verify_q(q):
            codes, scale = oracle_quantize(x_op, spec.mode, spec.plain)
            np.testing.assert_array_equal(host(q.data, fw), codes)
            np.testing.assert_array_equal(bits(np.ascontiguousarray(host(q.scale, fw))), bits(scale))

        q = judge("seam.quantize_activation", caller(fw, seam.quantize_activation, x_arg, weight), verify_q)
        if entry == "prequant":
            call = lambda: seam.matmul_fp8_prequant(q, weight, **extra)  # noqa: E731
        else:
            call = lambda: seam.make_linear_method(weight).apply_prequant(q, **extra)  # noqa: E731
        judge("seam.matmul_fp8_prequant" if entry == "prequant" else "seam.make_linear_method", call, verify)
    elif entry == "apply":
        judge(
            "seam.make_linear_method",
            caller(fw, lambda xx: seam.make_linear_method(weight).apply(xx, **extra), x_arg),
            verify,
        )
    else:
        judge("seam.matmul_fp8", caller(fw, seam.matmul_fp8, x_arg, weight, **extra), verify)


def _weight_defect(data, spec, fw):
    """One defect in Fp8Weight's arguments (in place)."""
    kw, n, k = spec.kwargs, spec.n, spec.k
    blocked = spec.block is not None
    choices = ["data dtype", "data ndim", "data empty", "bias shape", "bias dtype", "bias kind", "bad scheme"]
    choices += ["scale format value"]
    if blocked:
        choices += ["block scale shape", "block scale value", "block scale dtype", "block_size", "scheme per-tensor"]
        if spec.kind == "mx":
            choices += ["bad rounding", "ue8m0 with e8m0"]
        elif spec.kind != "ue8m0_weight":
            choices += ["rounding without e8m0", "ue8m0 flag"]
    else:
        choices += ["scale value", "scale shape", "scale kind", "per_group without block", "ue8m0 without groups"]
        choices += ["e8m0 format without groups"]
        if spec.kind == "static":
            choices += ["input_scale", "static without input_scale"]
        else:
            choices += ["input_scale with dynamic"]
    what = data.draw(st.sampled_from(choices), label="weight defect")
    if what == "data dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int8, np.float32, np.bool_, np.int32])))
        kw["data"] = Arr(spec.codes.astype(dt))
        return _defect("data", dt)
    if what == "data ndim":
        bad = spec.codes.reshape(-1) if data.draw(st.booleans()) else spec.codes[None]
        kw["data"] = Arr(np.ascontiguousarray(bad))
        return _defect("data", bad.shape)
    if what == "data empty":
        bad = np.zeros((0, k), U8) if data.draw(st.booleans()) else np.zeros((n, 0), U8)
        kw["data"] = Arr(bad)
        return _defect("data", bad.shape)
    if what == "bias shape":
        kw["bias"] = Arr(np.zeros((n + 1,), F32))
        return _defect("bias", (n + 1,))
    if what == "bias dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int32, np.bool_])))
        kw["bias"] = Arr(np.zeros(n, dt))
        return _defect("bias", dt)
    if what == "bias kind":
        kw["bias"] = v = data.draw(st.sampled_from([1.0, [0.0] * n]))
        return _defect("bias", type(v).__name__)
    if what == "bad scheme":
        kw["activation_scheme"] = v = data.draw(st.sampled_from(["tensor", "STATIC", "per-token", 3]))
        return _defect("activation_scheme", repr(v))
    if what == "scale format value":
        kw["activation_scale_format"] = v = data.draw(st.sampled_from(["fp32", "E8M0", "ue8m0"]))
        return _defect("activation_scale_format", repr(v))
    if what == "block scale shape":
        nb, kb = -(-n // spec.block[0]), -(-k // spec.block[1])
        bad = (nb + 1, kb) if data.draw(st.booleans()) else (nb, kb + 1)
        kw["weight_scale"] = Arr(np.ones(bad, spec.scale.dtype))
        return _defect("weight_scale", bad)
    if what == "block scale value":
        bad = np.array(spec.scale)
        at = data.draw(st.integers(0, bad.size - 1))
        if bad.dtype == U8:
            bad.reshape(-1)[at] = 0xFF
            kw["weight_scale"] = Arr(bad)
            return _defect("weight_scale", "0xFF")
        bad.reshape(-1)[at] = data.draw(st.sampled_from([0.0, -1.0, math.nan, math.inf]))
        kw["weight_scale"] = Arr(bad)
        return _defect("weight_scale", "at block")
    if what == "block scale dtype":
        dt = np.dtype(data.draw(st.sampled_from([np.int32, np.bool_, np.int8])))
        kw["weight_scale"] = Arr(np.ones(spec.scale.shape, dt))
        return _defect("weight_scale", dt)
    if what == "block_size":
        v = data.draw(st.sampled_from([(0, 128), (128,), (128, 1.5), (True, 32), 7]))
        kw["block_size"] = v
        return _defect("block_size", str(v))
    if what == "scheme per-tensor":
        kw["activation_scheme"] = v = data.draw(st.sampled_from(["dynamic", "per_token"]))
        return _defect("activation_scheme", repr(v))
    if what == "bad rounding":
        kw["activation_scale_rounding"] = v = data.draw(st.sampled_from(["nearest", "RCEIL"]))
        return _defect("activation_scale_rounding", repr(v))
    if what == "ue8m0 with e8m0":
        kw["scale_ue8m0"] = True
        return _defect("scale_ue8m0", "True")
    if what == "rounding without e8m0":
        kw["activation_scale_rounding"] = v = data.draw(st.sampled_from(["rceil", "floor"]))
        return _defect("activation_scale_rounding", repr(v))
    if what == "ue8m0 flag":
        kw["scale_ue8m0"], defect = bad_flag(data, "scale_ue8m0")
        return defect
    if what == "scale value":
        v = data.draw(st.sampled_from([0.0, -0.5, math.nan, math.inf]))
        if np.ndim(spec.scale) == 0:
            kw["weight_scale"] = scalar_form(data, v, fw)
        else:
            bad = np.array(spec.scale)
            bad[data.draw(st.integers(0, n - 1))] = v
            kw["weight_scale"] = Arr(bad)
        return _defect("weight_scale", float(np.float32(v)))
    if what == "scale shape":
        bad = data.draw(st.sampled_from([(n + 1,), (2, n + 1), (n + 1, 1)]))
        kw["weight_scale"] = Arr(np.ones(bad, F32))
        return _defect("weight_scale", bad)
    if what == "scale kind":
        choices = [([0.5], "list"), (True, "bool"), ("0.5", "str"), (Arr(np.ones(1, np.int32)), "int32")]
        kw["weight_scale"], evidence = data.draw(st.sampled_from(choices))
        return _defect("weight_scale", evidence)
    if what == "per_group without block":
        kw["activation_scheme"] = "per_group"
        kw.pop("input_scale", None)
        return _defect("activation_scheme", "block_size=None")
    if what == "ue8m0 without groups":
        kw["scale_ue8m0"] = True
        return _defect("scale_ue8m0", "activation_scheme=")
    if what == "e8m0 format without groups":
        kw["activation_scale_format"] = "e8m0"
        return _defect("activation_scale_format", "activation_scheme=")
    if what == "input_scale":
        kw["input_scale"], defect = bad_quant_scale(data, "input_scale", spec.plain["scale"], fw)
        return defect
    if what == "static without input_scale":
        del kw["input_scale"]
        kw["activation_scheme"] = "static"
        return _defect("input_scale", "None")
    scheme = {"channel_dynamic": "dynamic"}.get(spec.kind, spec.kind)
    kw["activation_scheme"], kw["input_scale"] = scheme, 0.5
    return _defect("input_scale", repr(scheme))


def _from_float_defect(data, spec, fw):
    """One defect in Fp8Weight.from_float's arguments (in place)."""
    ff, w = spec.ff_kwargs, spec.float_w
    blocked = spec.block is not None
    choices = ["w dtype", "w kind", "w ndim", "w empty", "scale_format value", "bad scheme"]
    if blocked:
        choices += ["per_channel with block", "block_size"]
        if spec.kind != "mx":
            choices.append("rounding without e8m0")
    else:
        choices += ["e8m0 without block", "per_channel flag", "rounding without e8m0"]
    if spec.kind == "static":
        choices.append("input_scale")
    what = data.draw(st.sampled_from(choices), label="from_float defect")
    if what == "w dtype":
        spec.float_w, evidence = bad_dtype_array(data, w.shape, fw)
        spec.float_w = spec.float_w.base
        return _defect("w", evidence)
    if what == "w kind":
        spec.float_w = w.tolist()
        return _defect("w", "list")
    if what == "w ndim":
        spec.float_w = w.reshape(-1) if data.draw(st.booleans()) else w[None]
        return _defect("w", spec.float_w.shape)
    if what == "w empty":
        spec.float_w = w[:0]
        return _defect("w", spec.float_w.shape)
    if what == "scale_format value":
        ff["scale_format"] = v = data.draw(st.sampled_from(["fp32", "E8M0", None]))
        return _defect("scale_format", repr(v))
    if what == "bad scheme":
        ff["activation_scheme"] = v = data.draw(st.sampled_from(["tensor", "per-group"]))
        return _defect("activation_scheme", repr(v))
    if what == "per_channel with block":
        ff["per_channel"] = True
        return _defect("per_channel", "per_channel=True")
    if what == "block_size":
        ff["block_size"] = v = data.draw(st.sampled_from([(0, 32), (32,), (1, 2.0)]))
        return _defect("block_size", str(v))
    if what == "rounding without e8m0":
        ff["scale_rounding"] = v = data.draw(st.sampled_from(["rceil", "floor"]))
        return _defect("scale_rounding", repr(v))
    if what == "e8m0 without block":
        ff["scale_format"] = "e8m0"
        return _defect("scale_format", "block_size=None")
    if what == "per_channel flag":
        ff["per_channel"], defect = bad_flag(data, "per_channel")
        return defect
    ff["input_scale"], defect = bad_quant_scale(data, "input_scale", spec.plain["scale"], fw)
    return defect


def _seam_call_defect(data, spec, fw, entry, weight, x32, x_arg, out_arg):
    """(defect, op, call): one defect in a seam call."""
    k = spec.k
    choices = ["x dtype", "x kind", "x K", "out_dtype", "weight type"]
    if entry in ("prequant", "apply_prequant"):
        choices += ["q kind", "q scheme"]
        if spec.mode in ("per_token", "group", "mx"):
            choices.append("x 3-d")
        if spec.block is not None:
            choices += ["q group size", "q scale format"]
    if entry in ("apply", "apply_prequant"):
        choices.append("linear bias")
    what = data.draw(st.sampled_from(choices), label="call defect")
    out_kw = {} if out_arg is None else {"out_dtype": out_arg}
    quantizes = entry in ("prequant", "apply_prequant")
    op = {"matmul_fp8": "seam.matmul_fp8", "prequant": "seam.matmul_fp8_prequant"}.get(entry, "seam.make_linear_method")

    def on_x(bad_x, defect):
        """A bad x goes to the first call that reads it: quantize_activation for the prequant entries."""
        if quantizes:
            return defect, "seam.quantize_activation", caller(fw, seam.quantize_activation, bad_x, weight)
        if entry == "apply":
            return defect, op, caller(fw, lambda xx: seam.make_linear_method(weight).apply(xx), bad_x)
        return defect, op, caller(fw, seam.matmul_fp8, bad_x, weight)

    if what == "x dtype":
        bad, evidence = bad_dtype_array(data, x32.shape, fw)
        return on_x(bad, _defect("x", evidence))
    if what == "x kind":
        return on_x(x32.tolist(), _defect("x", "list"))
    if what == "x K":
        bad = np.zeros(x32.shape[:-1] + (k + 1,), F32)
        return on_x(Arr(bad), _defect("x", bad.shape))
    if what == "x 3-d":
        bad = np.zeros((2,) + x32.shape, F32)
        return on_x(Arr(bad), _defect("x", bad.shape))
    if what == "out_dtype":
        bad_out, defect = bad_out_dtype(data, "out_dtype")
        if entry == "matmul_fp8":
            return defect, op, caller(fw, seam.matmul_fp8, x_arg, weight, bad_out)
        if entry == "apply":
            return defect, op, caller(fw, lambda xx: seam.make_linear_method(weight).apply(xx, bad_out), x_arg)
        q = seam.quantize_activation(build(x_arg, fw), weight)
        if entry == "prequant":
            return defect, op, lambda: seam.matmul_fp8_prequant(q, weight, bad_out)
        return defect, op, lambda: seam.make_linear_method(weight).apply_prequant(q, bad_out)
    if what == "weight type":
        bad_w = data.draw(st.sampled_from(["w", None, 3.0]))
        if data.draw(st.booleans()) or entry == "apply":
            bad_w = Arr(spec.codes)  # codes without their scales
        if entry == "apply":
            # codes are refused as codes; a torch tensor as a type the dispatch does not know
            return _defect("weight", "uint8", "Tensor"), op, caller(fw, lambda ww: seam.make_linear_method(ww), bad_w)
        evidence = "ndarray" if isinstance(bad_w, Arr) else type(bad_w).__name__
        if quantizes:
            return (
                _defect("weight", evidence),
                "seam.quantize_activation",
                caller(fw, seam.quantize_activation, x_arg, bad_w),
            )
        return _defect("weight", evidence), op, caller(fw, seam.matmul_fp8, x_arg, bad_w)
    if what == "linear bias":
        return (
            _defect("bias", "ndarray"),
            "seam.make_linear_method",
            lambda: seam.make_linear_method(weight, np.ones(spec.n, F32)),
        )
    x_built = build(x_arg, fw)
    if what == "q kind":
        bad_q = x_built
        evidence = "ndarray"
    elif what == "q scheme":
        other = {"static": "dynamic", "dynamic": "per_token", "per_token": "dynamic"}.get(spec.mode, "per_token")
        xq = x_built.reshape(-1, k) if other == "per_token" else x_built
        bad_q = vt.quantize_fp8(xq, per_token=True) if other == "per_token" else vt.quantize_fp8(xq)
        return (
            _defect("q.scheme", repr(other)),
            op,
            _prequant_call(entry, bad_q, weight, out_kw),
        )
    elif what == "q group size":
        g = spec.block[1] * 2
        fmt = "e8m0" if spec.mode == "mx" else "float32"
        bad_q = vt.quantize_fp8(x_built, group_size=g, scale_format=fmt)
        evidence = str(g)
        return _defect("q.group_size", evidence), op, _prequant_call(entry, bad_q, weight, out_kw)
    else:  # q scale format: the other of float32 and E8M0 group scales
        fmt = "float32" if spec.mode == "mx" else "e8m0"
        bad_q = vt.quantize_fp8(x_built, group_size=spec.block[1], scale_format=fmt)
        return _defect("q.scale_format", repr(fmt)), op, _prequant_call(entry, bad_q, weight, out_kw)
    return _defect("q", evidence), op, _prequant_call(entry, bad_q, weight, out_kw)


def _prequant_call(entry, q, weight, out_kw):
    if entry == "prequant":
        return lambda: seam.matmul_fp8_prequant(q, weight, **out_kw)
    return lambda: seam.make_linear_method(weight).apply_prequant(q, **out_kw)


def test_fuzz_seam():
    fuzz(260, SEAM_OPS, _seam_draw)
