"""Does this GPU's cuBLASLt take MXFP8 -- e4m3 operands with one E8M0 scale byte per 32 elements
along K (``CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0``) -- for the TN FP8 GEMM vtnumba runs? Asks the
heuristic for a plan at a few shapes (scale pointers set first, as block scaling needs) and prints
what it answers, with cuBLASLt's version and the GPU. A question of support only: no result is
computed (the scale layout cuBLASLt then reads is not set up here).

    python3 benchmarks/probes/probe_cublaslt_mxfp8.py
"""

import numpy as np


def main():
    import cupy
    import nvmath
    from nvmath.bindings import cublas
    from nvmath.bindings import cublasLt as lt

    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"GPU: {props['name'].decode()}, sm_{props['major']}{props['minor']}; cuBLASLt {lt.get_version()}")
    handle = lt.create()
    A = lt.MatmulDescAttribute
    modes = lt.MatmulMatrixScale
    if not hasattr(modes, "VEC32_UE8M0"):
        print("this cuBLASLt binding has no VEC32_UE8M0 scale mode")
        return
    e4m3 = nvmath.CudaDataType.CUDA_R_8F_E4M3
    for m, n, k in [(128, 128, 128), (256, 4096, 4096), (4096, 4096, 4096)]:
        desc = lt.matmul_desc_create(cublas.ComputeType.COMPUTE_32F, nvmath.CudaDataType.CUDA_R_32F)

        def set_attr(attr, value, dtype=None):
            buf = np.array([value], dtype=dtype or lt.get_matmul_desc_attribute_dtype(attr))
            lt.matmul_desc_set_attribute(desc, attr, buf.ctypes.data, buf.nbytes)

        set_attr(A.TRANSA, cublas.Operation.T)
        set_attr(A.TRANSB, cublas.Operation.N)
        set_attr(A.A_SCALE_MODE, modes.VEC32_UE8M0)
        set_attr(A.B_SCALE_MODE, modes.VEC32_UE8M0)
        scales_a = cupy.full(n * k // 32 + 4096, 127, dtype=cupy.uint8)  # 2^0 everywhere, generous
        scales_b = cupy.full(m * k // 32 + 4096, 127, dtype=cupy.uint8)
        set_attr(A.A_SCALE_POINTER, scales_a.data.ptr, np.uint64)
        set_attr(A.B_SCALE_POINTER, scales_b.data.ptr, np.uint64)
        layouts = [
            lt.matrix_layout_create(e4m3, k, n, k),
            lt.matrix_layout_create(e4m3, k, m, k),
            lt.matrix_layout_create(nvmath.CudaDataType.CUDA_R_16BF, n, m, n),
        ]
        pref = lt.matmul_preference_create()
        ws = np.array([32 << 20], dtype=np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.ctypes.data, 8)
        heuristic = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, dtype=np.int32)
        try:
            lt.matmul_algo_get_heuristic(
                handle,
                desc,
                layouts[0],
                layouts[1],
                layouts[2],
                layouts[2],
                pref,
                1,
                heuristic.ctypes.data,
                count.ctypes.data,
            )
            answer = f"{count[0]} plan(s)"
        except lt.cuBLASLtError as exc:
            answer = f"refused: {exc}"
        print(f"M={m} N={n} K={k}, A and B VEC32_UE8M0, bf16 out: {answer}")
        lt.matmul_preference_destroy(pref)
        for layout in layouts:
            lt.matrix_layout_destroy(layout)
        lt.matmul_desc_destroy(desc)


if __name__ == "__main__":
    main()
