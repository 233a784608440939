"""Array views a kernel takes where it already knows they lie inside the array.

A Numba slice ``b[r0 : r0 + rows]`` inside a kernel normalizes its bounds as Python does: a negative
start counts from the end, both ends are clamped to the length, and the length follows from them,
all in signed 64-bit arithmetic. For the routed MoE decode that was about 440 of the per-token
gate_up kernel's 2,408 SASS instructions (sm_90a), paid by every block before its first weight copy
(docs/DESIGN.md, "Host cost, counted" has the device-side twin: a routed block's time follows the
instructions each warp issues). The views here do none of it: the caller states that the window
lies inside the array, and the view is the array's own descriptor with its data pointer moved and
its leading lengths replaced.

- ``rows_of(a, start, count)``: ``a[start : start + count]`` for ``0 <= start`` and
  ``start + count <= a.shape[0]``, any number of dimensions; the layout of ``a`` is kept (a run of
  whole rows of a C-contiguous array is C-contiguous).
- ``block_of(a, r0, rows, c0, cols)``: ``a[r0 : r0 + rows, c0 : c0 + cols]`` of a 2-D ``a``, inside
  it likewise; layout 'A', as Numba types that slice.

Under the CUDA simulator and under numba-cuda-mlir they are those slices (same values; the
simulator runs Python, and numba-cuda-mlir's arrays are memrefs this module does not build).
"""

from .target import DEVICE_INLINE, MLIR, SIMULATOR, cuda, intrinsic, types

if SIMULATOR or MLIR:

    @cuda.jit(**DEVICE_INLINE)
    def rows_of(a, start, count):
        return a[start : start + count]

    @cuda.jit(**DEVICE_INLINE)
    def block_of(a, r0, rows, c0, cols):
        return a[r0 : r0 + rows, c0 : c0 + cols]

else:
    from llvmlite import ir
    from numba.core import cgutils

    try:
        from numba.cuda.core.imputils import impl_ret_borrowed
        from numba.cuda.np.arrayobj import make_array, populate_array
    except ImportError:  # numba-cuda before the core was vendored
        from numba.core.imputils import impl_ret_borrowed
        from numba.np.arrayobj import make_array, populate_array

    def _window(context, builder, aryty, outty, value, starts, counts):
        """The view of ``value`` (of ``aryty``) whose first len(starts) dimensions start at
        ``starts`` and have lengths ``counts`` (intp values): data moved by sum(start * stride)
        bytes, the other lengths and every stride kept."""
        ary = make_array(aryty)(context, builder, value)
        shapes = cgutils.unpack_tuple(builder, ary.shape)
        strides = cgutils.unpack_tuple(builder, ary.strides)
        offset = builder.mul(starts[0], strides[0])
        for start, stride in zip(starts[1:], strides[1:]):
            offset = builder.add(offset, builder.mul(start, stride))
        byte_ptr = builder.bitcast(ary.data, ir.IntType(8).as_pointer())
        data = builder.bitcast(builder.gep(byte_ptr, [offset], inbounds=True), ary.data.type)
        out = make_array(outty)(context, builder)
        populate_array(
            out,
            data=data,
            shape=list(counts) + shapes[len(counts) :],
            strides=strides,
            itemsize=ary.itemsize,
            meminfo=ary.meminfo,
            parent=ary.parent,
        )
        # a view shares its array's memory: a new reference where references are counted (Numba's
        # slices do the same; without the runtime's counting this adds nothing)
        return impl_ret_borrowed(context, builder, outty, out._getvalue())

    def _intp(context, builder, value, ty):
        return context.cast(builder, value, ty, types.intp)

    @intrinsic
    def rows_of(typingctx, a, start, count):
        if not (isinstance(a, types.Array) and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            aryty, startty, countty = sig.args
            return _window(
                context,
                builder,
                aryty,
                sig.return_type,
                args[0],
                [_intp(context, builder, args[1], startty)],
                [_intp(context, builder, args[2], countty)],
            )

        return a(a, start, count), codegen

    @intrinsic
    def block_of(typingctx, a, r0, rows, c0, cols):
        if not (isinstance(a, types.Array) and a.ndim == 2):
            return None
        if not all(isinstance(v, types.Integer) for v in (r0, rows, c0, cols)):
            return None
        out = a.copy(layout="A")

        def codegen(context, builder, sig, args):
            ints = [_intp(context, builder, v, t) for v, t in zip(args[1:], sig.args[1:])]
            return _window(context, builder, sig.args[0], out, args[0], [ints[0], ints[2]], [ints[1], ints[3]])

        return out(a, r0, rows, c0, cols), codegen


__all__ = ["block_of", "rows_of"]
