"""G1 exhaustive: the CPU encoder against the oracle for every one of the 2^32 float32 bit patterns
at scale 1.

The oracle scans 127 grid values per input, far too slow for 4.3e9 inputs, so the proof is by
segments. Over the positive bit patterns (ordered like their values), the kernel's codes must be a
non-decreasing step function; at both ends of every constant run the oracle must give the run's
code. The oracle (nearest grid value) is itself non-decreasing in the value, so agreeing at both
ends of a run means agreeing on all of it. Negative patterns must give the positive code with the
sign bit set, NaN patterns 0x7F. As a second, independent witness, every pattern is also compared
with ml_dtypes' clamp-then-cast.
"""

import ml_dtypes
import numpy as np
import pytest

import vtnumba as vt
from vtnumba.testing import reference

CHUNK = 1 << 26


@pytest.mark.full
@pytest.mark.exhaustive
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # ml_dtypes' cast of NaN/inf inputs
def test_all_float32_bit_patterns_at_scale_one():
    runs = []  # (first pattern, last pattern, code) of each constant run over the positives
    checked = 0
    prev_code = None
    for lo in range(0, 1 << 31, CHUNK):
        bits = np.arange(lo, lo + CHUNK, dtype=np.uint32)
        pos = bits.view(np.float32)
        codes = vt.encode_e4m3(pos)
        # negatives: same magnitude, sign bit set; NaN stays 0x7F
        neg_codes = vt.encode_e4m3((bits | np.uint32(0x80000000)).view(np.float32))
        nan = np.isnan(pos)
        expected_neg = np.where(nan, np.uint8(0x7F), codes | np.uint8(0x80))
        assert np.array_equal(neg_codes, expected_neg), f"sign symmetry broken in chunk at {lo:#x}"
        # second witness: ml_dtypes clamp + cast on non-NaN inputs, both signs
        for x, got in ((pos, codes), ((bits | np.uint32(0x80000000)).view(np.float32), neg_codes)):
            witness = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            witness = np.where(nan, np.uint8(0x7F), witness)
            assert np.array_equal(got, witness), f"ml_dtypes disagrees in chunk at {lo:#x}"
        # constant runs of the positive half
        change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change - 1, [CHUNK - 1]])
        for s, e in zip(starts, ends):
            code = int(codes[s])
            if prev_code is not None and s == 0 and runs and runs[-1][2] == code:
                runs[-1] = (runs[-1][0], lo + e, code)  # the run continues from the last chunk
            else:
                runs.append((lo + s, lo + e, code))
            prev_code = code
        checked += 2 * CHUNK

    assert checked == 1 << 32
    # non-decreasing over the non-NaN positives, then the NaN run
    codes_in_order = [c for _, _, c in runs]
    finite_runs = [c for c in codes_in_order if c != 0x7F]
    assert finite_runs == sorted(finite_runs) and finite_runs == list(range(0x7F)), "not a step function over all codes"
    assert codes_in_order[-1] == 0x7F
    run_ends = np.array([[first, last] for first, last, _ in runs], dtype=np.uint32).view(np.float32)
    oracle = reference.encode(run_ends.reshape(-1)).reshape(-1, 2)
    want = np.array(codes_in_order, dtype=np.uint8)
    assert np.array_equal(oracle[:, 0], want) and np.array_equal(oracle[:, 1], want)
    assert len(runs) == 128  # 127 finite codes and the NaN run
