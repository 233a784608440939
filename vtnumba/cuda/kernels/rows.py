"""Device helpers the CUDA-core GEMVs share (kernels/gemv.py's dense one and kernels/grouped_gemm.py's
grouped one): one definition, compiled into each kernel that calls it."""

import functools

from ..ptx.codec import e4m3x4_scaled, nan_code_bits
from ..ptx.target import DEVICE_INLINE, cuda


@functools.cache
def fma_rows_for(rows, m_tile):
    """The device function ``fma_rows(words, xv, acc, w_nan)`` for ``rows`` weight rows and
    ``m_tile`` activation rows (compiled per pair, so its loops unroll and ``acc`` stays in
    registers): ``acc[r * m_tile + m] += w[r] . x[m]`` in float32, 16 products per weight row and
    activation row, the weight bytes (``words``: 4 words a row) decoded by bit placement and ``xv``
    the 16 activation values of each row scaled alike (``e4m3x4_scaled``); NaN codes flagged per
    weight row in ``w_nan``."""

    @cuda.jit(**DEVICE_INLINE)
    def fma_rows(words, xv, acc, w_nan):
        for r in range(rows):
            for q in range(4):
                w = words[4 * r + q]
                w_nan[r] |= nan_code_bits(w)
                f0, f1, f2, f3 = e4m3x4_scaled(w)
                for m in range(m_tile):
                    s = acc[r * m_tile + m]
                    s += f0 * xv[16 * m + 4 * q]
                    s += f1 * xv[16 * m + 4 * q + 1]
                    s += f2 * xv[16 * m + 4 * q + 2]
                    s += f3 * xv[16 * m + 4 * q + 3]
                    acc[r * m_tile + m] = s

    return fma_rows


__all__ = ["fma_rows_for"]
