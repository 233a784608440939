"""vtnumba's CPU path on aarch64, by emulation (no Arm machine runs CI): tools/arm64/run.sh sets up a Debian arm64
userland under qemu-user-static (once; later runs reuse it), then runs G1, G3 on a few GEMM shapes
for every path and thread twin, the inner loop's assembly for real Arm cores, and the main job.

Skipped only where the userland cannot be set up here (not root, no apt, no binfmt_misc: the script
exits 3 and says why). Measured on two cores: the setup 4 minutes (apt, debootstrap, wheels; reused
afterwards), the checks and the main job under emulation 15-24 minutes (tools/arm64/last_run.log);
timings inside are qemu's and mean nothing.
"""

import os
import pathlib
import platform
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CANNOT_SET_UP = 3


@pytest.mark.full
@pytest.mark.slow
def test_aarch64_by_emulation(tmp_path):
    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip(
            f"the emulation recipe is for x86-64 hosts (and runs natively on aarch64), got {platform.machine()}"
        )
    proc = subprocess.run(
        ["bash", str(ROOT / "tools" / "arm64" / "run.sh")],
        capture_output=True,
        text=True,
        timeout=2700,
        env=dict(os.environ, VT_ARM64_OUT=str(tmp_path)),
    )
    if proc.returncode == CANNOT_SET_UP:
        pytest.skip((proc.stderr.strip().splitlines() or ["tools/arm64/run.sh could not set up"])[-1])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    # what ran: G1 and G3 on the emulated CPU, the Arm targets' G3 and assembly, the main job's pass line
    assert "ok   G1 portable, parallel" in log and "ok   G1 portable, serial" in log, log[-3000:]
    assert log.count("ok   G3 portable") >= 2 * 3, log[-3000:]  # the emulated CPU and two Arm targets
    assert "ok   byte-lookup decode neon_tbl, parallel" in log and "ok   byte-lookup decode neon_tbl, serial" in log
    assert "-- target cortex-x925" in log and "all checks passed" in log
    assert sorted(p.name for p in tmp_path.glob("gemv-*.s")), "no assembly was written"
