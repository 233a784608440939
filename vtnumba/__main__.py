"""``python -m vtnumba``: a quantization self-check and speed table on an embedded default tensor."""

import sys
import time

import numpy as np


def _best_of(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv=None):
    import vtnumba as vt
    from vtnumba.testing import reference

    rng = np.random.default_rng(2026)
    x = (rng.standard_normal((1024, 4096), dtype=np.float32) * 3.0).astype(np.float32)
    failures = 0
    print("vtnumba self-check: e4m3 quantization against the independent oracle")
    for label, kwargs in [("static scale 0.0092", dict(scale=0.0092)), ("dynamic per-tensor", {}),
                          ("dynamic per-token", dict(per_token=True))]:
        q = vt.quantize_fp8(x, **kwargs)
        ref = reference.quantize(x, **kwargs)
        bad = int(np.count_nonzero(q.data != ref.data)) + int(np.count_nonzero(q.scale != ref.scale))
        failures += bad
        print(f"  {label:22s} {x.size:>9,d} values  mismatches {bad}")
    print()
    print(f"{'op (1024 x 4096 float32)':34s} {'ms':>8s} {'GB/s':>8s}")
    moved = x.size * 5  # 4 bytes read, 1 written
    t = _best_of(lambda: vt.quantize_fp8(x, scale=0.0092))
    print(f"{'vtnumba quantize_fp8 static':34s} {t * 1e3:8.2f} {moved / t / 1e9:8.2f}")
    try:
        import ml_dtypes

        inv = np.float32(1) / np.float32(0.0092)
        t = _best_of(lambda: np.clip(x * inv, -448, 448).astype(ml_dtypes.float8_e4m3fn))
        print(f"{'numpy clip + ml_dtypes cast':34s} {t * 1e3:8.2f} {moved / t / 1e9:8.2f}")
    except ImportError:
        pass
    y = np.empty_like(x)
    t = _best_of(lambda: np.copyto(y, x))
    print(f"{'memcpy (numpy copyto, 8 B/value)':34s} {t * 1e3:8.2f} {x.size * 8 / t / 1e9:8.2f}")
    if failures:
        print(f"SELF-CHECK FAILED: {failures} mismatches", file=sys.stderr)
        return 1
    print("self-check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
