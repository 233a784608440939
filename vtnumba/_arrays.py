"""What an input is: which device it lives on, and which of vtnumba's dtypes it holds.

numpy arrays run on the CPU ('cpu'). Objects exposing ``__cuda_array_interface__`` (cupy arrays,
numba device arrays, torch CUDA tensors) run on the GPU they live on ('cuda:N'). bfloat16 and float8_e4m3fn are the ml_dtypes
types users hold; kernels see them as uint16 / uint8 bits.
"""

import re
import sys
from typing import Any, TypeAlias

import ml_dtypes
import numpy as np
import numpy.typing as npt

# -- names for type hints ---------------------------------------------------------------------
# An array vtnumba takes: a numpy array (CPU), a cupy array (GPU), a torch tensor, or any object
# with ``__dlpack__`` / ``__cuda_array_interface__`` (vtnumba._interop). No static type covers them
# all without importing cupy and torch, so the hint names the role and stays ``Any``.
Array: TypeAlias = Any
# A scale given by value or as an array: a Python or numpy float, or a size-1 / per-row array.
Scale: TypeAlias = float | Any
# An output dtype: np.float32, np.float16, ml_dtypes.bfloat16, their names ('bf16'...) or torch's.
DType: TypeAlias = npt.DTypeLike

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
FLOAT8_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)  # OCP MX scale bytes
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
_OUT_DTYPE_NAMES = {
    "float32": np.dtype(np.float32),
    "f32": np.dtype(np.float32),
    "fp32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "f16": np.dtype(np.float16),
    "fp16": np.dtype(np.float16),
    "half": np.dtype(np.float16),
    "bfloat16": BFLOAT16,
    "bf16": BFLOAT16,
}


def _cupy_ndarray():
    """cupy's ndarray type if cupy is already imported (never imports it: CPU users pay nothing)."""
    cupy = sys.modules.get("cupy")
    return getattr(cupy, "ndarray", None)


# -- devices ----------------------------------------------------------------------------------
# A device is named by one string everywhere: 'cpu', or 'cuda:N' with N the GPU's ordinal. The
# names are formatted once (device_of runs on every call's path).
CPU = "cpu"
_CUDA_NAMES = tuple(f"cuda:{i}" for i in range(64))
_DEVICE_NAME = re.compile(r"cuda(?::(\d+))?")


def cuda_device(index):
    """The name of GPU ``index``: 'cuda:N'."""
    return _CUDA_NAMES[index] if 0 <= index < len(_CUDA_NAMES) else f"cuda:{index}"


def is_cuda(device):
    return device != CPU


def cuda_index(device):
    """N of 'cuda:N'."""
    return int(device[5:])


def _gpu_index(x):
    """The ordinal of the GPU holding ``x``: cupy's and torch's arrays say it; for a bare
    ``__cuda_array_interface__`` object the driver is asked where its pointer lives."""
    dev = getattr(x, "device", None)
    for attr in ("id", "index"):  # cupy.cuda.Device.id, torch.device.index
        idx = getattr(dev, attr, None)
        if isinstance(idx, int):
            return idx
    try:
        import cupy

        ptr = x.__cuda_array_interface__["data"][0]
        return int(cupy.cuda.runtime.pointerGetAttributes(ptr).device) if ptr else cupy.cuda.runtime.getDevice()
    except Exception:  # no cupy: numba treats such arrays as on the current device, device 0 by default
        return 0


def device_of(x, name):
    """'cpu' for a numpy array, 'cuda:N' for an array on GPU N; TypeError naming ``name`` otherwise."""
    if isinstance(x, np.ndarray):
        return CPU
    cupy_ndarray = _cupy_ndarray()
    # isinstance first: hasattr on __cuda_array_interface__ builds the interface dict (0.6 us); a
    # cupy array's device ordinal is an int on its memory pointer (no Device object is built)
    if cupy_ndarray is not None and isinstance(x, cupy_ndarray):
        return cuda_device(x.data.device_id)
    if hasattr(x, "__cuda_array_interface__"):
        return cuda_device(_gpu_index(x))
    raise TypeError(
        f"{name} must be a numpy array (CPU), a GPU array such as a cupy array, a torch tensor, or any "
        f"__dlpack__ / __cuda_array_interface__ object, got {type(x).__name__}"
    )


def parse_device(device, name="device"):
    """'cpu' or 'cuda:N' for a device named 'cpu', 'cuda' (cupy's current device) or 'cuda:N'."""
    if device == CPU:
        return CPU
    m = _DEVICE_NAME.fullmatch(device) if isinstance(device, str) else None
    if m is None:
        raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or a CUDA install without a usable driver
        raise RuntimeError(
            f"{name} {device!r} needs cupy and a CUDA GPU, got {exc.__class__.__name__}: {exc}"
        ) from None
    idx = int(m.group(1)) if m.group(1) is not None else cupy.cuda.runtime.getDevice()
    if idx >= count:
        raise ValueError(f"{name} must name one of the {count} CUDA devices (cuda:0..cuda:{count - 1}), got {device!r}")
    return cuda_device(idx)


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
    return found or CPU


_TORCH_DTYPES = {
    "torch.float32": np.dtype(np.float32),
    "torch.float16": np.dtype(np.float16),
    "torch.bfloat16": BFLOAT16,
    "torch.uint8": np.dtype(np.uint8),
}


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


def _array_dtype(x, name, what):
    """dtype_of(x), or a TypeError naming ``name`` when x is no array at all (a Python number or list
    carries no dtype to check)."""
    if not (hasattr(x, "dtype") and hasattr(x, "shape")):
        raise TypeError(f"{name} must be {what}, got {type(x).__name__}")
    return dtype_of(x)


def float_dtype(x, name):
    """The float dtype of ``x`` (float32, float16 or ml_dtypes.bfloat16); TypeError otherwise."""
    dt = _array_dtype(x, name, "a float32, float16 or bfloat16 array")
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float32, float16 or bfloat16 array, got dtype {dt}")
    return dt


def _bytes_of(x, name, typed, what):
    """x as uint8: an array of the one-byte type ``typed`` is viewed, not copied; TypeError naming
    ``what`` for any other dtype."""
    dt = _array_dtype(x, name, what)
    if dt == typed:
        return x.view(np.uint8)
    if dt != np.dtype(np.uint8):
        raise TypeError(f"{name} must be {what}, got dtype {dt}")
    return x


def codes_uint8(x, name):
    """e4m3 codes as uint8 (a float8_e4m3fn array is viewed, not copied); TypeError otherwise."""
    return _bytes_of(x, name, FLOAT8_E4M3, "e4m3 codes (uint8 or ml_dtypes.float8_e4m3fn)")


def e8m0_bytes(x, name):
    """E8M0 scale bytes as uint8 (an ml_dtypes.float8_e8m0fnu array is viewed, not copied); TypeError
    otherwise."""
    return _bytes_of(x, name, FLOAT8_E8M0, "E8M0 scale bytes (uint8 or ml_dtypes.float8_e8m0fnu)")


def decode_e8m0(b):
    """E8M0 bytes (uint8 numpy or cupy array) -> float32 2^(byte - 127), exact (byte 0: the subnormal
    2^-127); 0xFF -> NaN. Element-wise, on the array's own device (no synchronization)."""
    xp = array_module(b)
    u = b.astype(np.uint32)
    bits = xp.where(u == 0, np.uint32(0x00400000), u << np.uint32(23))
    return xp.where(u == 0xFF, np.uint32(0x7FC00000), bits).astype(np.uint32).view(np.float32)


def round_float32(values, dtype):
    """float32 ``values`` (numpy or cupy) rounded to nearest even to ``dtype`` (float32, float16 or
    bfloat16), on the array's own device. A cupy without a bfloat16 cast gets the bits by integer
    arithmetic (NaN as the quiet NaN 0x7FC0), viewed as bfloat16."""
    if dtype == np.float32:
        return values
    try:
        return values.astype(dtype)
    except (TypeError, ValueError, NotImplementedError):  # a cupy without a bfloat16 cast
        if dtype != BFLOAT16:
            raise
    return bfloat16_bits(values).view(BFLOAT16)


def bfloat16_bits(values):
    """The bfloat16 bits (uint16) of float32 ``values`` rounded to nearest even, NaN as the quiet NaN
    0x7FC0: integer arithmetic that runs alike on numpy and cupy."""
    bits = values.view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return array_module(values).where(values != values, np.uint32(0x7FC0), rounded).astype(np.uint16)


def array_module(x):
    """numpy for a numpy array, cupy for a cupy one (for element-wise work written once for both)."""
    if isinstance(x, np.ndarray):
        return np
    import cupy

    return cupy


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


def bias_vector(bias, n, name="bias"):
    """A bias for N outputs as a float vector (N,): float32, float16 or bfloat16, shape (N,) or (1, N)."""
    float_dtype(bias, name)
    if tuple(bias.shape) not in ((n,), (1, n)):
        raise ValueError(f"{name} must have shape ({n},), got shape {tuple(bias.shape)}")
    return bias.reshape(n)
