"""One rule for non-finite float weights at quantization (``Fp8Weight.from_float``,
``Fp8Experts.from_float``, the torch layers' ``from_linear`` / ``from_experts`` and ``convert``):
refused, naming the tensor and the index of the first bad value, unless the caller opts in with
``allow_nonfinite=True``.

Why refuse: a NaN weight is stored as code 0x7F (e4m3's NaN), and every output of its row becomes
NaN; an Inf saturates to +-448 (and its block's scale is taken from the finite values), so the
weight silently changes. The checkpoint loaders refuse NaN codes already; quantization did not.
"""


def _first_nonfinite(w):
    """(index tuple, value) of the first non-finite element of ``w`` in C order, or None. Takes a
    numpy or cupy array or a torch tensor, and checks it where it lives (one device sync)."""
    if type(w).__module__.startswith("torch"):
        bad = ~w.detach().isfinite()
        if not bool(bad.any()):
            return None
        flat = int(bad.reshape(-1).nonzero()[0, 0])
        value = float(w.detach().reshape(-1)[flat].float().cpu())
        shape = tuple(w.shape)
    else:
        from .. import _arrays

        xp = _arrays.array_module(w)
        bad = ~xp.isfinite(w)
        if not bool(bad.any()):
            return None
        flat = int(xp.argmax(bad.reshape(-1)))
        value = float(w.reshape(-1)[flat : flat + 1].astype("float32")[0])
        shape = tuple(w.shape)
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index)), value


def refuse_nonfinite(w, name, allow_nonfinite):
    """Raise ValueError naming ``name`` when ``w`` holds a NaN or an Inf, unless ``allow_nonfinite``
    (then NaN becomes code 0x7F and Inf saturates to +-448, as the encoder does)."""
    if allow_nonfinite is not True and allow_nonfinite is not False:
        raise TypeError(f"allow_nonfinite must be True or False, got {allow_nonfinite!r}")
    if allow_nonfinite:
        return
    found = _first_nonfinite(w)
    if found is None:
        return
    index, value = found
    where = ", ".join(str(i) for i in index)
    raise ValueError(
        f"{name} must be finite to quantize to FP8, got {value} at index [{where}] (a NaN would be "
        f"stored as code 0x7F and make its output row NaN; an Inf would saturate to +-448); fix the "
        f"weight, or pass allow_nonfinite=True to quantize it as it is"
    )
