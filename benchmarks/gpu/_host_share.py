"""Where an eager decode step's host time goes: the share spent inside given module classes.

Each module of those classes has its forward wrapped by a pair of host clock reads (about 0.1 us)
for the measurement only, then restored. Used by bench_torch_model.py and bench_torch_moe.py to
explain an eager ``generate`` ratio: when a converted model's layers cost the host less than bf16's
and the model still does not run faster, the rest of the step (attention, norms, the KV cache,
``generate`` itself) holds the host."""

import time


def host_share(torch, model, classes, step, steps=20):
    """(host us per ``step()`` call, us of it inside ``classes``' forwards, how many modules) over
    ``steps`` calls after 3 warm-up calls, synchronized once at the end."""
    spent = [0.0]
    wrapped = []
    for module in model.modules():
        if isinstance(module, classes):
            inner = module.forward

            def timed(*args, _inner=inner, **kwargs):
                t0 = time.perf_counter()
                out = _inner(*args, **kwargs)
                spent[0] += time.perf_counter() - t0
                return out

            module.forward = timed  # an instance attribute: nn.Module.__call__ finds it first
            wrapped.append(module)
    try:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        spent[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        for module in wrapped:
            del module.forward
    return wall / steps * 1e6, spent[0] / steps * 1e6, len(wrapped)
