"""How work reaches a GPU, and what vtnumba keeps per GPU.

    launch.py     cheap kernel launches: Numba compiles to PTX, cupy loads it, the driver launches it
    device.py     one cached record per GPU (compute capability, SM count, small device buffers,
                  cuBLASLt's state)
    cublaslt.py   cuBLASLt through nvmath-python's bindings: plans, workspaces, the matmul call

Above ``ptx`` (it may import it), below the kernels (``tests/test_cuda_layers.py``).
"""
