"""Tests over the devices present: parameters, and moving arrays to and from a device.

    @pytest.mark.parametrize("device", devices.params())    # 'cpu', and 'cuda' marked ``gpu``
    def test_x(device):
        y = vt.quantize_fp8(devices.to_device(x, device)).data
        assert (devices.to_host(y) == want).all()

A 'cuda' parameter carries the ``gpu`` marker, so a suite that skips ``gpu`` tests without a GPU
(as vtnumba's conftest does) skips it for exactly the reason a user's call would fail.
"""

import numpy as np

__all__ = ["params", "to_device", "to_host"]


def params():
    """pytest parameters for every device vtnumba runs on: 'cpu', and 'cuda' (marked ``gpu``)."""
    import pytest

    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def to_device(x, device):
    """A numpy array (or None, or a scalar) on ``device``: itself on 'cpu', a cupy copy on a GPU."""
    if x is None or device == "cpu" or np.isscalar(x):
        return x
    import cupy

    x = np.asarray(x)
    if x.dtype.itemsize == 2 and x.dtype != np.float16:  # bfloat16: cupy moves its bits
        return cupy.asarray(x.view(np.uint16)).view(x.dtype)
    return cupy.asarray(x)


def to_host(y):
    """A result as a numpy array (cupy results copied back, bfloat16 as bits viewed back)."""
    if isinstance(y, np.ndarray):
        return y
    if hasattr(y, "get"):
        dt = np.dtype(y.dtype)
        if dt.itemsize == 2 and dt != np.float16:
            return y.view(np.uint16).get().view(dt)
        return y.get()
    return np.asarray(y)
