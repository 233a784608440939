"""What the GPU here can run, path by path: ``vtnumba.cuda.capabilities()``.

    import vtnumba.cuda
    caps = vtnumba.cuda.capabilities()   # a table in Jupyter, text in print(); caps.as_dict() for JSON
    caps.available("cublaslt_outer_vector")

It names the GPU (name, compute capability, SM count), the CUDA runtime, driver and cuBLASLt
versions, and for each path either that it runs here or why it does not. The paths:

``cublaslt_per_tensor``     cuBLASLt's FP8 GEMM with one scale per operand
``cublaslt_outer_vector``   cuBLASLt's FP8 GEMM with per-row x per-channel scales (OUTER_VEC_32F)
``cublaslt_block_128x128``  cuBLASLt's FP8 GEMM with 1 x 128 activation groups and 128 x 128 weight
                            blocks (VEC128_32F x BLK128x128_32F, the DeepSeek-V3 / Qwen3-FP8 format)
``hardware_e4m3_cvt``       the hardware e4m3 conversion (``cvt ... e4m3x2``), vtnumba's default encoder
``tensor_core_mma``         FP8 tensor-core mma (``mma.sync ... e4m3``)
``tensor_core_wgmma``       Hopper's native FP8 warpgroup MMA (``wgmma.mma_async ... e4m3``, sm_90a)
``tensor_core_block_scaled_mma``  the block-scaled FP8 mma of Blackwell workstations and GB10
                            (``mma.sync ... kind::mxf8f6f4.block_scale``, sm_120a / sm_121a): the
                            tensor-core kernels issue it for every FP8 GEMM there, MXFP8 with its real
                            scales, the other formats with unit scales -- the plain FP8 mma runs at half
                            its rate on these GPUs
``mxfp8_tensor_core``       the MXFP8 GEMM (E8M0 scales per 1 x 32, both operands) on tensor cores: the
                            block-scaled mma on sm_12x, the plain mma with the scales applied per k32
                            in float32 on sm_89 / sm_90

The rules are one pure function of (compute capability, cuBLASLt version, simulator flag),
``path_rules``, so they can be read, and tested, for GPUs that are not here. ``capabilities()`` adds
what only this machine knows: whether cuBLASLt loads at all and whether the lever
(``VT_DENSE_CUBLASLT_FP8=0``) has turned it off. A path the rules allow can still meet a shape
cuBLASLt has no plan for; the GEMM then takes the next kernel (``vtnumba.cuda.gemm``).
"""

import html
from dataclasses import dataclass, field

from .. import _config
from .ptx.target import SIMULATOR, TARGET, gpu_unavailable_reason
from .runtime import cublaslt


def compiler_text():
    """The compiler the GPU kernels are built with, as 'numba-cuda 0.30.4': numba-cuda by default,
    numba-cuda-mlir with VTNUMBA_CUDA_TARGET=numba-cuda-mlir (cuda/ptx/target.py)."""
    from importlib import metadata

    try:
        return f"{TARGET} {metadata.version(TARGET)}"
    except metadata.PackageNotFoundError:
        return f"{TARGET} (no version: not installed as a distribution)"


# (key, what it is), in the order every report lists them.
PATHS = (
    ("cublaslt_per_tensor", "cuBLASLt FP8 GEMM, per-tensor scales"),
    ("cublaslt_outer_vector", "cuBLASLt FP8 GEMM, per-row x per-channel scales"),
    ("cublaslt_block_128x128", "cuBLASLt FP8 GEMM, 128x128 block scales"),
    ("hardware_e4m3_cvt", "hardware e4m3 conversion (cvt)"),
    ("tensor_core_mma", "tensor-core FP8 mma (mma.sync e4m3)"),
    ("tensor_core_wgmma", "tensor-core FP8 warpgroup MMA (wgmma e4m3, sm_90a)"),
    ("tensor_core_block_scaled_mma", "tensor-core block-scaled FP8 mma (kind::mxf8f6f4, sm_120a/121a)"),
    ("mxfp8_tensor_core", "MXFP8 GEMM (E8M0 scales per 1x32) on tensor cores"),
)
# The mixture-of-experts paths (vtnumba.cuda.experts.moe_paths()), reported apart from PATHS: which
# kernels a grouped GEMM of seam.moe_fp8 / grouped_matmul_fp8 can take here.
MOE_PATHS = (
    ("moe_routing", "MoE align, gather, SiLU-and-quantize, combine (Numba, no host sync)"),
    ("moe_grouped_cuda_core", "MoE grouped GEMM on CUDA cores (one launch, counts on the device)"),
    ("moe_grouped_tensor_core", "MoE grouped GEMV on FP8 tensor cores"),
    ("moe_grouped_tiled_mma", "MoE prefill: grouped tiled GEMM on mma.sync (one launch, strict G3)"),
    ("moe_grouped_tiled_wgmma", "MoE prefill: grouped tiled GEMM on wgmma (sm_90, one launch)"),
    ("moe_per_expert_cublaslt", "MoE prefill: cuBLASLt expert by expert (one offsets read-back)"),
)
CUBLASLT_PATHS = ("cublaslt_per_tensor", "cublaslt_outer_vector", "cublaslt_block_128x128")

# FP8 tensor cores arrived with Ada (sm_89); cuBLASLt's FP8 matmul runs on them and on Hopper and
# Blackwell, and PTX's mma.sync with .e4m3 operands needs sm_89 too (PTX ISA 7.8).
FP8_TENSOR_CORE_MIN_CC = (8, 9)
# cuBLASLt's FP8 matmul shipped in cuBLAS 11.11 (CUDA 11.8); versions as cublasLtGetVersion gives
# them: major * 10000 + minor * 100 + patch.
CUBLASLT_FP8_MIN_VERSION = 111100


def sm(cc):
    """'sm_90' for (9, 0)."""
    return f"sm_{cc[0]}{cc[1]}"


def version_text(version, parts=3):
    """A CUDA-style integer version as text: cuBLASLt's 120901 -> '12.9.1' (parts=3), the CUDA
    runtime's / driver's 12080 -> '12.8' (parts=2)."""
    if version is None:
        return None
    version = int(version)
    if parts == 3:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 10}"


def path_rules(cc, cublaslt_version, simulator=False, cublaslt_reason=None):
    """For each path of ``PATHS``: None when it runs on compute capability ``cc`` (a (major, minor)
    tuple) with this cuBLASLt (``cublaslt_version`` as cublasLtGetVersion gives it, or None when
    cuBLASLt cannot be loaded, ``cublaslt_reason`` saying why), else one sentence saying why not.
    ``simulator``: running under the CUDA simulator, which has neither cuBLASLt nor inline PTX."""
    from .ptx.codec import HARDWARE_MIN_CC  # here, not at import: codec needs numba-cuda
    from .ptx.sm90_wgmma import MIN_CC as WGMMA_CC  # sm_90a, arch-specific: exactly Hopper
    from .ptx.sm120_mma import CCS as BLOCK_SCALED_CCS  # sm_120a / sm_121a, arch-specific

    if simulator:
        no_lt = "the CUDA simulator has no cuBLASLt (the Numba GEMM kernels run)"
        no_ptx = "the CUDA simulator runs no inline PTX"
        return {
            "cublaslt_per_tensor": no_lt,
            "cublaslt_outer_vector": no_lt,
            "cublaslt_block_128x128": no_lt,
            "hardware_e4m3_cvt": no_ptx + " (the portable encoder runs)",
            "tensor_core_mma": no_ptx,
            "tensor_core_wgmma": no_ptx,
            "tensor_core_block_scaled_mma": no_ptx,
            "mxfp8_tensor_core": no_ptx + " (the tiled CUDA-core kernel reads the E8M0 scales)",
        }
    cc = tuple(int(v) for v in cc)
    rules = {}
    if cc < FP8_TENSOR_CORE_MIN_CC:
        rules["cublaslt_per_tensor"] = f"cuBLASLt's FP8 GEMM needs FP8 tensor cores (sm_89+), this GPU is {sm(cc)}"
    elif cublaslt_version is None:
        rules["cublaslt_per_tensor"] = cublaslt_reason or "cuBLASLt could not be loaded"
    elif cublaslt_version < CUBLASLT_FP8_MIN_VERSION:
        rules["cublaslt_per_tensor"] = (
            f"cuBLASLt's FP8 GEMM needs cuBLASLt >= 11.11 (CUDA 11.8), found {version_text(cublaslt_version)}"
        )
    else:
        rules["cublaslt_per_tensor"] = None
    base = rules["cublaslt_per_tensor"]
    rules["cublaslt_outer_vector"] = base or cublaslt.outer_vec_reason(cc, cublaslt_version)
    rules["cublaslt_block_128x128"] = base or cublaslt.block_reason(cc, cublaslt_version)
    rules["hardware_e4m3_cvt"] = (
        None
        if cc >= tuple(HARDWARE_MIN_CC)
        else f"the e4m3 cvt instructions need {sm(HARDWARE_MIN_CC)}+, this GPU is {sm(cc)} "
        f"(the portable encoder runs, same bytes)"
    )
    rules["tensor_core_mma"] = (
        None if cc >= FP8_TENSOR_CORE_MIN_CC else f"mma.sync with e4m3 operands needs sm_89+, this GPU is {sm(cc)}"
    )
    rules["tensor_core_wgmma"] = (
        None if cc == WGMMA_CC else f"wgmma is an sm_90a instruction (arch-specific: Hopper only), this GPU is {sm(cc)}"
    )
    rules["tensor_core_block_scaled_mma"] = (
        None
        if cc in BLOCK_SCALED_CCS
        else f"the block-scaled mma (kind::mxf8f6f4) is an sm_120a / sm_121a instruction (Blackwell workstations, GB10), "
        f"this GPU is {sm(cc)}"
    )
    rules["mxfp8_tensor_core"] = (
        None
        if cc >= FP8_TENSOR_CORE_MIN_CC
        else f"FP8 tensor cores need sm_89+, this GPU is {sm(cc)} (the tiled CUDA-core kernel reads the E8M0 scales)"
    )
    return rules


def moe_path_rules(cc, cublaslt_reason, simulator=False, tensor_core_reason=None):
    """For each path of ``MOE_PATHS``: None when it runs on compute capability ``cc``, else why not.
    ``cublaslt_reason``: the ``cublaslt_per_tensor`` rule's answer here (None: cuBLASLt runs);
    ``tensor_core_reason``: why the tensor-core grouped GEMV is missing (None: its kernel exists)."""
    rules = {"moe_routing": None, "moe_grouped_cuda_core": None}
    if simulator:
        rules["moe_grouped_tensor_core"] = "the CUDA simulator runs no inline PTX"
        rules["moe_grouped_tiled_mma"] = "the CUDA simulator runs it only through its emulation, when named"
        rules["moe_grouped_tiled_wgmma"] = "the CUDA simulator runs no inline PTX"
        rules["moe_per_expert_cublaslt"] = "the CUDA simulator has no cuBLASLt (the grouped CUDA-core kernel runs)"
        return rules
    cc = tuple(int(v) for v in cc)
    mma = None if cc >= FP8_TENSOR_CORE_MIN_CC else f"FP8 tensor cores need sm_89+, this GPU is {sm(cc)}"
    rules["moe_grouped_tensor_core"] = tensor_core_reason or mma
    rules["moe_grouped_tiled_mma"] = mma
    rules["moe_grouped_tiled_wgmma"] = None if cc == (9, 0) else f"wgmma is an sm_90a instruction, this GPU is {sm(cc)}"
    rules["moe_per_expert_cublaslt"] = cublaslt_reason
    return rules


@dataclass(frozen=True)
class Capabilities:
    """The GPU here and what runs on it. ``gpu`` is None when there is none, ``reason`` then says
    why; ``paths`` maps each key of ``PATHS`` to None (runs here) or why not."""

    gpu: str | None
    cc: tuple | None
    sm_count: int | None
    cuda_runtime: str | None
    cuda_driver: str | None
    cublaslt: str | None
    paths: dict = field(default_factory=dict)
    reason: str | None = None
    moe_paths: dict = field(default_factory=dict)  # MOE_PATHS' keys -> None (runs here) or why not
    compiler: str | None = None  # compiler_text(): which compiler builds the kernels, and its version

    def available(self, path):
        """Whether ``path`` (a key of ``PATHS``) runs here."""
        if path not in self.paths:
            raise ValueError(f"path must be one of {[p for p, _ in PATHS]}, got {path!r}")
        return self.paths[path] is None

    def as_dict(self):
        return dict(
            gpu=self.gpu,
            cc=None if self.cc is None else list(self.cc),
            sm_count=self.sm_count,
            cuda_runtime=self.cuda_runtime,
            cuda_driver=self.cuda_driver,
            cublaslt=self.cublaslt,
            reason=self.reason,
            compiler=self.compiler,
            paths={key: dict(available=self.paths[key] is None, why_not=self.paths[key]) for key, _ in PATHS},
            moe_paths={
                key: dict(available=self.moe_paths[key] is None, why_not=self.moe_paths[key])
                for key, _ in MOE_PATHS
                if key in self.moe_paths
            },
        )

    def header(self):
        """One line: the GPU and the versions (or why there is no GPU)."""
        compiler = "" if self.compiler is None else f"; kernels built by {self.compiler}"
        if self.gpu is None:
            return f"no GPU: {self.reason}{compiler}"
        arch = "" if self.cc is None else f", {sm(self.cc)}"
        sms = "" if self.sm_count is None else f", {self.sm_count} SMs"
        versions = ", ".join(
            f"{label} {value or 'n/a'}"
            for label, value in (
                ("CUDA runtime", self.cuda_runtime),
                ("driver", self.cuda_driver),
                ("cuBLASLt", self.cublaslt),
            )
        )
        return f"{self.gpu}{arch}{sms}; {versions}{compiler}"

    def lines(self):
        rows = [(label, self.paths[key]) for key, label in PATHS]
        rows += [(label, self.moe_paths[key]) for key, label in MOE_PATHS if key in self.moe_paths]
        width = max(len(label) for label, _ in rows)
        return [self.header()] + [
            f"  {label:{width}s}  {'yes' if why is None else 'no: ' + why}" for label, why in rows
        ]

    def __str__(self):
        return "\n".join(self.lines())

    def _repr_html_(self):
        rows = "".join(
            f"<tr><td>{html.escape(label)}</td><td>{'yes' if self.paths[key] is None else 'no'}</td>"
            f"<td>{html.escape(self.paths[key] or '')}</td></tr>"
            for key, label in PATHS
        )
        return (
            f"<p>{html.escape(self.header())}</p><table><thead><tr><th>path</th><th>here</th>"
            f"<th>why not</th></tr></thead><tbody>{rows}</tbody></table>"
        )


def _cublaslt_version(dev):
    """(version or None, why not) of the cuBLASLt this device's record uses."""
    reason = cublaslt.unavailable_reason()
    if reason is not None:
        return None, reason
    return dev.cublaslt().version, None


def capabilities():
    """The capabilities of cupy's current GPU (see the module docstring): never raises for a
    missing GPU, says why instead."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        why = "no usable GPU here (see reason)"
        return Capabilities(
            None, None, None, None, None, None, {key: why for key, _ in PATHS}, reason, compiler=compiler_text()
        )
    from .runtime import device

    dev = device.current()
    if SIMULATOR:
        return Capabilities(
            dev.name,
            None,
            dev.sm_count,
            None,
            None,
            None,
            path_rules(None, None, simulator=True),
            moe_paths=moe_path_rules(None, None, simulator=True),
            compiler=compiler_text(),
        )
    runtime = device.xp.cuda.runtime
    version, why = _cublaslt_version(dev)
    paths = path_rules(dev.cc, version, cublaslt_reason=why)
    if not _config.dense_cublaslt_fp8_enabled():
        for key in CUBLASLT_PATHS:
            if paths[key] is None:
                paths[key] = "turned off by the lever VT_DENSE_CUBLASLT_FP8=0 (the Numba GEMM kernels run)"
    return Capabilities(
        dev.name,
        dev.cc,
        dev.sm_count,
        version_text(runtime.runtimeGetVersion(), 2),
        version_text(runtime.driverGetVersion(), 2),
        version_text(version),
        paths,
        moe_paths=moe_path_rules(dev.cc, paths["cublaslt_per_tensor"]),
        compiler=compiler_text(),
    )


__all__ = [
    "capabilities",
    "compiler_text",
    "Capabilities",
    "path_rules",
    "PATHS",
    "version_text",
    "MOE_PATHS",
    "moe_path_rules",
]
