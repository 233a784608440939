"""The prepared host call: a host ``Fp8Weight``'s quantize-then-GEMM with its checks done once.

``seam.matmul_fp8`` checks and converts every argument on every call (the interop layer, the
weight's device, ``vt.quantize_fp8``'s and ``vt.scaled_mm``'s checks, each scale's dtype, shape and
finiteness), about 50 us a call on the CPU where a 256-wide layer's kernels take 10. A layer calls
with the same weight token after token, so ``HostLinear`` takes the weight's arrays as they are
(already validated when the weight was built) and calls the CPU backend's quantizer and GEMM
directly: the very functions, arguments and kernel choice of the full path, so the same bytes
(tests/test_host_linear.py holds every scheme to the full path bitwise), in a fifth of the host time.

It keeps views, never copies: a weight whose arrays are written in place (a torch buffer updated
by ``load_state_dict``) is read as it is at each call, as the full path reads it. The backend
converts what is not float32 (a float16 bias) per call, as it does for the full path.

Its caller checks x: a host array [M, K] of float32, float16 or bfloat16 with K the weight's. The
callers: ``seam.matmul_fp8`` for numpy x and a host weight (the call is kept on the weight,
``Fp8Weight.host_call``, and dropped when its codes are released after an upload), and
``vtnumba.torch``'s ``Fp8Linear`` on the CPU (kept on the layer, ``Fp8Linear._host_linear``). The
GPU's counterpart is the bound call (``seam.bound``).
"""

from typing import Any

import numpy as np

from .. import _arrays, cpu

__all__ = ["HostLinear"]


class HostLinear:
    """A host weight's linear call, prepared (module docstring). ``HostLinear.of(w)`` is None for a
    weight that is not on the host."""

    __slots__ = ("format", "codes", "weight_scale", "input_scale", "bias", "block_size", "tiles")

    def __init__(self, weight: Any) -> None:
        self.format = weight.format
        self.codes = weight.data
        # E8M0 bytes as uint8 (a float8_e8m0fnu array viewed, as the full path's scale check does): the
        # CPU backend tells them from float32 scales by that dtype (MXFP8's kernels, or decoded)
        e8m0 = weight.format.weight_scale_format == "e8m0"
        self.weight_scale = _arrays.e8m0_bytes(weight.weight_scale, "weight_scale") if e8m0 else weight.weight_scale
        # 'static': the weight's scale as the full path hands it to the quantizer (float32)
        self.input_scale = None if weight.input_scale is None else np.float32(weight.input_scale)
        self.bias = weight.bias
        self.block_size = weight.block_size
        self.tiles = self._tiles_call()

    @classmethod
    def of(cls, weight: Any) -> "HostLinear | None":
        return cls(weight) if weight.device == "cpu" else None

    def __call__(self, x: np.ndarray, out_dtype: np.dtype, input_scale: Any = None) -> np.ndarray:
        """y [M, N] of x [M, K] (checked by the caller), rounded to ``out_dtype``. ``input_scale``
        (float32; 'static' only) replaces the weight's: a torch layer's scale buffer, read per call."""
        codes, scale_a = self.format.quantize_host(x, self.input_scale if input_scale is None else input_scale)
        tiles = self.tiles
        if tiles is not None:
            y = tiles(codes, scale_a, out_dtype)
            if y is not None:
                return y
        if self.block_size is None:
            return cpu.scaled_mm(codes, self.codes, scale_a, self.weight_scale, out_dtype, self.bias, None)
        return cpu.block_scaled_mm(
            codes, self.codes, scale_a, self.weight_scale, self.block_size, out_dtype, self.bias, None
        )

    def _tiles_call(self) -> Any:
        """The register tiles' shortcut for a weight with float32 scales, or None: ``call(codes,
        scale_a, out_dtype)`` runs the tiled kernel on the quantized activation when the full path's
        GEMM entry would choose it for its row count, with that entry's arguments (else it returns
        None): ``gemm.tiled_kernel`` (per-tensor or per-channel weight scales), ``block.tiled_kernel``
        (weight blocks beside float32 activation group scales, which ``quantize_host`` lays out
        column-major: their transpose, the [K-blocks, M] the kernel reads, is a view). Without the
        entry's conversions and checks between, which inside a torch forward cost more than their
        count suggests (the kernels' data has pushed the interpreter's out of the caches): the tiny
        Llama's per_token forward at 64 / 128 / 512 tokens took 4.58 / 6.36 / 17.76 ms with it and
        4.80 / 6.30 / 18.21 without, per_group 5.01 / 6.78 / 18.87 and 5.11 / 6.78 / 18.88, in one
        run (benchmarks/RESULTS.md, 2026-12-07 15:35-15:56)."""
        from ..cpu import block, gemm, paths  # the CPU kernels' modules, imported when first used

        if self.weight_scale.dtype != np.float32:
            return None
        n, k = self.codes.shape
        if self.block_size is None:

            def dense(codes, scale_a, out_dtype):
                m = len(codes)
                if not paths.takes_register_tiles(m) or gemm.choose_kernel(m, n, k) != "small_m":
                    return None
                sa = np.ascontiguousarray(scale_a.reshape(-1), dtype=np.float32)
                sb = np.ascontiguousarray(self.weight_scale.reshape(-1))
                out = np.empty((m, n), dtype=np.float32)
                gemm.tiled_kernel(codes, self.codes, sa, sb, gemm.bias_vector(self.bias), out)
                return gemm.to_out_dtype(out, out_dtype)

            return dense
        bn, bk = self.block_size

        def blocks(codes, scale_a, out_dtype):
            m = len(codes)
            sat = scale_a.T  # [K-blocks, M]
            if (
                scale_a.dtype != np.float32
                or not sat.flags.c_contiguous
                or not paths.takes_register_tiles(m)
                or not block.takes_small_m(m, n, k)
            ):
                return None
            out = np.empty((m, n), dtype=np.float32)
            sb = np.ascontiguousarray(self.weight_scale)
            block.tiled_kernel(codes, self.codes, sat, sb, bn, bk, gemm.bias_vector(self.bias), out)
            return gemm.to_out_dtype(out, out_dtype)

        return blocks
