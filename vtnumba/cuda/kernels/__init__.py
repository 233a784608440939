"""The ``@cuda.jit`` kernels, one module per operation, each with how it is launched.

    quant.py              the activation quantization kernels (every scheme)
    epilogue.py           the GEMM epilogue (scales, bias, rounding): device functions, the
                          f32-staged epilogue kernel, and the operands as every GEMM kernel takes them
    tiled.py              the tiled GEMM on CUDA cores (any shape, any GPU)
    gemv.py               the decode GEMV on CUDA cores (M <= 4), with fused quantization
    tc_gemm.py            the tiled GEMM on FP8 tensor cores (``mma.sync``, sm_89+)
    tc_gemv.py            the decode GEMV on FP8 tensor cores (M <= 16), with fused quantization
    sm90_wgmma_gemm.py    the GEMM on Hopper's warpgroup MMA (sm_90a only)
    sm120_block_scaled.py what tc_gemm's and tc_gemv's kernels issue on sm_12x's block-scaled mma
                          (sm_120a / sm_121a): the unit-scale mma, the MXFP8 step, the target

A kernel (or a kernel's part) for one architecture only is named for it (``sm90_``, ``sm120_``). Each module
offers its kernel factories (cached per variant), why it cannot take a call (``*_reason``) and the
launch for a call (``*_launch``); which kernel runs is decided above, in ``vtnumba.cuda.gemm`` and
``vtnumba.cuda.block``. Kernels import ``ptx`` and ``runtime``, never the dispatch above them
(``tests/test_cuda_layers.py``).
"""
