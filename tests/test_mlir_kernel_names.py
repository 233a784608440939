"""Profiled kernel names, made the same under both compilers (``tests/kernel_names.py``): the
GPU tests that check which kernels ran (tests/test_torch_gpu.py) tell vtnumba's kernels from
cuBLASLt's by these, where they once looked for the module path numba-cuda-mlir's names lack."""

import kernel_names as profiled

# as torch.profiler listed them on the H200 (2026-12-02): numba-cuda-mlir's demangled name, numba-cuda's
MLIR_NAME = "static_kernel::_3clocals_3e::quantize_static(Array<unsigned short, 1, C, mutable, aligned>, float)"
NUMBA_CUDA_NAME = (
    "vtnumba::cuda::kernels::quant::static_kernel::<locals>::quantize_static[abi:v1][abi:cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3"
    "CwAkMXLaJtQYkOIgxJU0gCqOkEJoHkbttqdVhoqlspQGNFHSgJ5BnXagIAE](Array<float, 1, C, mutable, aligned>, "
    "Array<unsigned char, 1, C, mutable, aligned>, float, long long)"
)
CUBLAS_NAME = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_s161616gemm_f16_32x32_128x2_tn_align8>(Params)"


def test_both_compilers_names_give_the_python_qualname():
    want = "static_kernel.<locals>.quantize_static"
    assert profiled.qualname(MLIR_NAME) == want
    assert profiled.qualname(NUMBA_CUDA_NAME) == "vtnumba.cuda.kernels.quant." + want
    # the mangled PTX entry names (nsys lists them so), with numba-cuda's ABI tags
    assert (
        profiled.qualname("_ZN13static_kernel12_3clocals_3e15quantize_staticE5ArrayItLi1E1C7mutable7alignedE") == want
    )
    mangled = "_ZN7vtnumba4cuda7kernels5quant13static_kernel12_3clocals_3e15quantize_staticB2v1B4cw51E5ArrayIf"
    assert profiled.qualname(mangled) == "vtnumba.cuda.kernels.quant." + want
    assert "_80_" in profiled.qualname(CUBLAS_NAME)  # only Numba's escapes are decoded


def test_ours_are_the_kernels_vtnumba_compiled_in_this_process():
    from vtnumba.cuda.kernels import quant

    kernel = quant.static_kernel("float32", "hardware", False)  # made, not compiled
    assert kernel.name == "static_kernel.<locals>.quantize_static"
    names = [CUBLAS_NAME, MLIR_NAME, NUMBA_CUDA_NAME]
    assert profiled.ours(names) == [kernel.name, kernel.name]
    assert [profiled.is_ours(n) for n in names] == [False, True, True]
    assert not profiled.is_ours("at::native::quantize_static_other(float)")
