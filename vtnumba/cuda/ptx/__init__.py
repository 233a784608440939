"""What a GPU kernel is written with: numba-cuda's target and the bit and instruction primitives.

    target.py       the one import of numba-cuda (``cuda``, ``types``, ``intrinsic``); why the GPU
                    path can or cannot run here
    codec.py        bit-level primitives: bit casts, 16-bit floats, e4m3 encode / decode, 16-byte loads
    mma.py          tensor-core primitives (sm_89+): ``mma.sync`` e4m3 and f16, ``ldmatrix``, ``cp.async``
    sm90_wgmma.py   Hopper's warpgroup MMA (sm_90a only): ``wgmma``, its fences, mbarriers
    views.py        array windows a kernel knows lie inside the array: no slice bounds arithmetic

Each primitive is an llvmlite ``InlineAsm`` intrinsic or a libdevice call on a GPU and portable
Python under the CUDA simulator (sm90_wgmma.py has no emulation). The bottom layer: it imports
nothing else of ``vtnumba.cuda`` (``tests/test_cuda_layers.py``). Nothing is imported here, so that
``vtnumba.cuda`` imports without numba-cuda and says why the GPU path cannot run.
"""
