"""Fault injection for tests: make one named step of the library fail on a chosen call.

Private, and off unless a test arms it: nothing here reads the environment, and a hook point costs
one dict truthiness test while no fault is armed.

    from vtnumba import _faults

    with _faults.inject("checkpoint.host_copy", after=2) as fault:
        seam.load_fp8_linear(path, prefix)      # the 3rd host copy raises _faults.InjectedFault
    assert fault.fired == 1

A step is registered by the module that holds its hook point, at import, and the hook point is two
lines where the step happens::

    _faults.register("cublaslt.matmul", "the cublasLtMatmul call of a dense GEMM")
    ...
    if _faults.armed:
        _faults.fire("cublaslt.matmul", f"layer {name!r}")   # raises InjectedFault when armed and due

``armed`` is a module-level dict (step -> its armed fault), empty while no test has armed one, so
the hook's only cost is that test. Arming and counting hold a lock, so a fault armed in one thread
fires in whichever thread makes the call it is due on (loads that fan out to a thread pool included).
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["InjectedFault", "register", "steps", "inject", "fire", "armed"]


class InjectedFault(Exception):
    """The error an armed step raises. Not a ValueError, so no handler that turns a library's
    ValueErrors into its own messages can mistake it for bad input."""

    def __init__(self, step: str, call: int, detail: str = "") -> None:
        self.step, self.call, self.detail = step, call, detail
        where = f": {detail}" if detail else ""
        super().__init__(f"injected fault at step {step!r} (call {call}){where}")


@dataclass
class Fault:
    """One armed step: ``after`` calls pass, then ``times`` calls raise (None: every call after);
    ``calls`` and ``fired`` count what happened while it was armed."""

    step: str
    after: int
    times: int | None
    calls: int = 0
    fired: int = 0


_LOCK = threading.Lock()
_STEPS: dict[str, str] = {}  # step name -> what it is
armed: dict[str, Fault] = {}  # step name -> its armed fault; mutated in place, never rebound


def register(step: str, description: str) -> str:
    """Declare a hook point named ``step`` (dotted, 'area.what': 'checkpoint.host_copy'); returns the
    name. Registering the same step again with the same words is harmless (module reloads)."""
    if not isinstance(step, str) or not step or step != step.strip():
        raise ValueError(f"step must be a non-empty name, got {step!r}")
    with _LOCK:
        if _STEPS.get(step, description) != description:
            raise ValueError(f"step {step!r} must be registered once, got it again as {description!r}")
        _STEPS[step] = description
    return step


def steps() -> dict[str, str]:
    """{step: description} of every registered hook point."""
    with _LOCK:
        return dict(_STEPS)


@contextmanager
def inject(step: str, *, after: int = 0, times: int | None = 1) -> Iterator[Fault]:
    """Arm ``step`` for the block: its first ``after`` calls pass, the next ``times`` raise
    ``InjectedFault`` (``times=None``: every call from then on). Yields the ``Fault``, whose
    ``calls`` / ``fired`` say what the block did (``after`` larger than any load needs, and
    ``calls``, count a step's calls). One fault per step at a time; the step is disarmed on exit,
    however the block ends."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError(f"after must be an int >= 0 (the calls that pass first), got {after!r}")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
        raise ValueError(f"times must be a positive int or None (every call), got {times!r}")
    fault = Fault(step, after, times)
    with _LOCK:
        if step not in _STEPS:
            known = ", ".join(sorted(_STEPS)) or "none"
            raise ValueError(
                f"step must be a registered hook point, got {step!r} (registered: {known}; a step is "
                f"registered when the module holding it is imported)"
            )
        if step in armed:
            raise ValueError(f"step {step!r} must not be armed twice at once, got a second inject")
        armed[step] = fault
    try:
        yield fault
    finally:
        with _LOCK:
            armed.pop(step, None)


def fire(step: str, detail: str = "") -> None:
    """The hook point's call: counts it, and raises ``InjectedFault`` if ``step`` is armed and this
    call is due. Hook points test ``armed`` first, so this runs only while some fault is armed."""
    with _LOCK:
        fault = armed.get(step)
        if fault is None:
            return
        fault.calls += 1
        call = fault.calls
        due = call > fault.after and (fault.times is None or fault.fired < fault.times)
        if due:
            fault.fired += 1
    if due:
        raise InjectedFault(step, call, detail)
