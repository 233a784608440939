#!/usr/bin/env bash
# vtnumba's CPU path on aarch64, by emulation (qemu-user-static), repeatable.
#
#   sudo tools/arm64/run.sh [ROOTFS_DIR]      # default: $VT_ARM64_ROOT or /var/tmp/vtnumba-arm64
#
# Sets up a Debian arm64 userland (the recipe of the project's DEVICE.md: qemu-user-static,
# debootstrap, binfmt_misc), installs aarch64 wheels of vtnumba's dependencies in a venv there,
# copies this working tree in, and runs tools/arm64/check.py (G1, G3 on a few GEMM shapes per CPU
# path, what the inner loops compile to for the emulated CPU, a NEON-only Neoverse N1 and the GB10's
# SVE2 Cortex-X925; VT_ARM64_TARGETS names others) and the main job (`python -m vtnumba --reduce 16`).
# A userland left by an earlier run is reused (its marker file says it is complete).
#
# Exit status: 0 all passed; 1 a check failed; 3 the userland could not be set up here (not root,
# no apt, no binfmt_misc ...): tests/test_arm64.py skips on 3 with the reason printed last.
# Emulated speed means nothing: the timings printed inside are qemu's, not an Arm core's.
set -uo pipefail

ROOT="${1:-${VT_ARM64_ROOT:-/var/tmp/vtnumba-arm64}}"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
SUITE=bookworm
start=$(date +%s)

cannot() { echo "arm64: cannot set up here: $*" >&2; exit 3; }
step() { echo "arm64 [$(( $(date +%s) - start )) s] $*"; }

[ "$(uname -m)" = x86_64 ] || [ "$(uname -m)" = aarch64 ] || cannot "host is $(uname -m)"
[ "$(id -u)" = 0 ] || cannot "needs root (apt-get, debootstrap, chroot, binfmt_misc)"

if [ "$(uname -m)" != aarch64 ]; then
    need=()
    [ -x /usr/bin/qemu-aarch64-static ] || need+=(qemu-user-static)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v update-binfmts >/dev/null || need+=(binfmt-support)
    if [ ${#need[@]} -gt 0 ]; then
        command -v apt-get >/dev/null || cannot "no apt-get to install ${need[*]}"
        step "apt-get install ${need[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"; } \
            >/dev/null 2>&1 || cannot "apt-get install ${need[*]} failed"
    fi
    if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
            || cannot "binfmt_misc cannot be mounted (a container without the privilege?)"
    fi
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || cannot "qemu-aarch64 is not registered in binfmt_misc"
fi

if [ ! -e "$ROOT/.vtnumba-ready" ]; then
    # the host's own Debian mirror (deb822 or one-line sources), else Debian's default
    mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)\/\?$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    rm -rf "$ROOT"
    step "debootstrap arm64 $SUITE from $mirror into $ROOT"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv,python3-pip \
        "$SUITE" "$ROOT" "$mirror" > "$ROOT.debootstrap.log" 2>&1 \
        || cannot "debootstrap failed (log: $ROOT.debootstrap.log)"
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
    mkdir -p "$ROOT/etc/ssl/certs"
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/" 2>/dev/null || true
    [ -e /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
    step "venv + aarch64 wheels"
    # the host's pip settings that name files on this host (find-links, local indexes) do not
    # exist inside the chroot; only the index and the CA bundle travel
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root PIP_DISABLE_PIP_VERSION_CHECK=1 \
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_CONFIG_FILE=/dev/null PIP_DEFAULT_TIMEOUT=180 \
        sh -c "python3 -m venv /opt/vt && /opt/vt/bin/pip install -q --only-binary=:all: \
               'numpy>=1.26,<2.5' 'numba>=0.61' 'llvmlite>=0.44' 'scipy>=1.11' 'ml_dtypes>=0.5' \
               'hypothesis>=6.100' 'pytest>=8'" || cannot "pip install in the arm64 venv failed"
    touch "$ROOT/.vtnumba-ready"
else
    step "reusing the arm64 userland in $ROOT"
fi

step "copy the working tree"
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
(cd "$REPO" && tar --exclude=.git --exclude='.ci-venv' --exclude='__pycache__' -cf - vtnumba tools tests pyproject.toml) \
    | tar -C "$ROOT/src" -xf -

# numba reads /proc (cpuinfo, meminfo); mounted for the run, unmounted on any exit
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc" || cannot "cannot mount /proc in the userland"
trap 'umount "$ROOT/proc" 2>/dev/null' EXIT
OUT="${VT_ARM64_OUT:-$ROOT/out}"
rm -rf "$ROOT/out" && mkdir -p "$ROOT/out"
in_arm64() {
    # VT_NUMBA_CACHE=0: assembly can only be read from code compiled in this process
    chroot "$ROOT" /usr/bin/env -i PATH=/opt/vt/bin:/usr/bin:/bin HOME=/root PYTHONPATH=/src \
        VT_NUMBA_CACHE=0 VT_ARM64_ASM_DIR=/out "$@"
}
step "$(in_arm64 python -c 'import platform, numpy, numba; print(platform.machine(), "python", platform.python_version(), "numpy", numpy.__version__, "numba", numba.__version__)')"
rc=0
step "check.py on the emulated CPU: G1, G3, inner-loop assembly"
(cd / && in_arm64 sh -c 'cd /src && python tools/arm64/check.py') || rc=1
step "check.py for real Arm cores (qemu runs their SVE code too): G3, inner-loop assembly"
(cd / && in_arm64 sh -c "cd /src && python tools/arm64/check.py --targets ${VT_ARM64_TARGETS:-neoverse-n1,cortex-x925}") || rc=1
step "python -m vtnumba --reduce 16"
(cd / && in_arm64 sh -c 'cd /src && python -m vtnumba --reduce 16 --no-progress') || rc=1
if [ "$OUT" != "$ROOT/out" ]; then mkdir -p "$OUT" && cp "$ROOT"/out/*.s "$OUT"/ 2>/dev/null; fi
step "done, rc=$rc; assembly in $OUT (emulated: the timings above are qemu's and mean nothing)"
exit $rc
