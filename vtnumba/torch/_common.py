"""What the package's modules share: dtype names, argument checks, views of tensors."""

import numpy as np
import torch

from .. import _arrays
from .._interop import to_native, to_torch
from ..ops import ActivationScheme

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_NUMPY_OUT = {
    torch.float32: np.dtype(np.float32),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: _arrays.BFLOAT16,
}


def _scheme(scheme, name="scheme"):
    try:
        return ActivationScheme(scheme)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(ActivationScheme)}, got {scheme!r}") from None


def _host_scalar(value, name):
    """A scale given as a number or a one-element tensor / array, as a Python float."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar or a one-element tensor, got shape {tuple(value.shape)}")
        return float(value.detach().reshape(()).cpu())
    return value


def _out_dtype(out_dtype):
    """A torch float dtype, a numpy dtype or a name, as a torch dtype (None stays None)."""
    if out_dtype is None or isinstance(out_dtype, torch.dtype) and out_dtype in _DTYPE_NAMES:
        return out_dtype
    try:
        return _DTYPES[_arrays.out_dtype_of(out_dtype).name]
    except (TypeError, ValueError, KeyError):
        raise ValueError(
            f"out_dtype must be torch.float32, torch.float16 or torch.bfloat16 (or None: x's dtype), got {out_dtype!r}"
        ) from None


def _tensor(arr):
    """A torch tensor owning a copy of a host array, or sharing a device array's memory."""
    if isinstance(arr, np.ndarray):
        return to_torch(np.array(arr, copy=True), torch)
    return to_torch(arr, torch)


def _torch_bytes(device):
    """alloc(nbytes) -> a torch uint8 tensor on ``device`` (a temporary a bound call may need)."""
    return lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, device=device)


def _view(t):
    """A numpy (CPU) or cupy (GPU) array viewing tensor ``t`` (float8 as uint8 codes, bfloat16
    through its bits)."""
    return to_native(t.detach(), "tensor")


def _host_array(t):
    """A numpy array viewing CPU tensor ``t`` of float32 or float16, or bfloat16 through its bits
    (ml_dtypes.bfloat16, as ``_view`` gives it) without the interop layer's checks."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_arrays.BFLOAT16)
    return t.numpy()


def _on_device(index, fn):
    import cupy

    with cupy.cuda.Device(index):
        return fn()


_grad_enabled = torch.is_grad_enabled
_torch_threads = torch.get_num_threads  # torch's intra-op threads: vtnumba's cap inside a CPU forward
_current_device = torch._C._cuda_getDevice if hasattr(torch._C, "_cuda_getDevice") else torch.cuda.current_device
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _refuse_grad(x, name="x", layer="Fp8Linear"):
    """Refuse an input that requires grad, naming the layer's argument: inside a model the tensor is
    a hidden state the model made, which requires grad because the model ran in grad mode (its
    float layers' parameters require grad), so the fix is the mode of the model's call."""
    raise ValueError(
        f"{name} (the input of a vtnumba {layer}) must not require grad, got a tensor with "
        f"requires_grad=True: vtnumba's FP8 layers are not differentiable, so its gradient would be "
        f"lost. Inside a model this is a hidden state made in grad mode: call the model under "
        f"torch.no_grad() or torch.inference_mode() (or pass {name}.detach() when calling the layer)"
    )


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)
