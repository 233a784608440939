"""What an input is: which device it lives on, and which of vtnumba's dtypes it holds.

numpy arrays run on the CPU. Objects exposing ``__cuda_array_interface__`` (cupy arrays, numba
device arrays, torch CUDA tensors) run on the GPU. bfloat16 and float8_e4m3fn are the ml_dtypes
types users hold; kernels see them as uint16 / uint8 bits.
"""

import sys

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
_OUT_DTYPE_NAMES = {
    "float32": np.dtype(np.float32), "f32": np.dtype(np.float32), "fp32": np.dtype(np.float32),
    "float16": np.dtype(np.float16), "f16": np.dtype(np.float16), "fp16": np.dtype(np.float16),
    "half": np.dtype(np.float16),
    "bfloat16": BFLOAT16, "bf16": BFLOAT16,
}


def _cupy_ndarray():
    """cupy's ndarray type if cupy is already imported (never imports it: CPU users pay nothing)."""
    cupy = sys.modules.get("cupy")
    return getattr(cupy, "ndarray", None)


def device_of(x, name):
    """'cpu' for a numpy array, 'cuda' for a GPU array; TypeError naming ``name`` otherwise."""
    if isinstance(x, np.ndarray):
        return "cpu"
    cupy_ndarray = _cupy_ndarray()
    # isinstance first: hasattr on __cuda_array_interface__ builds the interface dict (0.6 us)
    if cupy_ndarray is not None and isinstance(x, cupy_ndarray):
        return "cuda"
    if hasattr(x, "__cuda_array_interface__"):
        return "cuda"
    raise TypeError(
        f"{name} must be a numpy array (CPU) or a GPU array such as a cupy array, got {type(x).__name__}")


_SCALAR_TYPES = (float, int, np.generic)


def same_device(named_arrays):
    """The one device of several arrays (None entries and scalars skipped); ValueError if they
    differ. Written for the per-call path: a type check per argument, no numpy helpers."""
    found = None
    first = None
    for name, arr in named_arrays:
        if arr is None or isinstance(arr, _SCALAR_TYPES):
            continue
        device = device_of(arr, name)
        if found is None:
            found, first = device, name
        elif device != found:
            raise ValueError(f"arrays must all be on one device, got {first} on {found}, {name} on {device}")
    return found or "cpu"


_TORCH_DTYPES = {"torch.float32": np.dtype(np.float32), "torch.float16": np.dtype(np.float16),
                 "torch.bfloat16": BFLOAT16, "torch.uint8": np.dtype(np.uint8)}


def dtype_of(x):
    """numpy dtype of an array; torch tensors' dtypes are mapped by name (np.dtype refuses them)."""
    dt = x.dtype
    if isinstance(dt, np.dtype):
        return dt
    name = str(dt)
    if name in _TORCH_DTYPES:
        return _TORCH_DTYPES[name]
    try:
        return np.dtype(dt)
    except TypeError:
        raise TypeError(f"dtype {name} is not one vtnumba handles") from None


def float_dtype(x, name):
    """The float dtype of ``x`` (float32, float16 or ml_dtypes.bfloat16); TypeError otherwise."""
    dt = dtype_of(x)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float32, float16 or bfloat16 array, got dtype {dt}")
    return dt


def codes_uint8(x, name):
    """e4m3 codes as uint8 (a float8_e4m3fn array is viewed, not copied); TypeError otherwise."""
    dt = dtype_of(x)
    if dt == FLOAT8_E4M3:
        return x.view(np.uint8)
    if dt != np.dtype(np.uint8):
        raise TypeError(f"{name} must be e4m3 codes (uint8 or ml_dtypes.float8_e4m3fn), got dtype {dt}")
    return x


def out_dtype_of(out_dtype, name="out_dtype"):
    """np.float32 / np.float16 / ml_dtypes.bfloat16, given any of them or their names."""
    if isinstance(out_dtype, str):
        key = out_dtype.lower()
        if key in _OUT_DTYPE_NAMES:
            return _OUT_DTYPE_NAMES[key]
        raise ValueError(f"{name} must be one of float32, float16, bfloat16, got {out_dtype!r}")
    try:
        dt = np.dtype(out_dtype)
    except TypeError:
        raise TypeError(f"{name} must be a dtype (float32, float16 or bfloat16), got {out_dtype!r}") from None
    if dt not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16, got {dt}")
    return dt
