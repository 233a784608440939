"""Tensor parallelism simulated in one process: R ranks as R threads, and an all-reduce that sums
their float32 partials, for testing the seam's shard arithmetic (``vtnumba.seam.parallel``) on a
CPU without a process group.

    from vtnumba.testing.parallel import SimulatedGroup
    group = SimulatedGroup(world_size=2)
    outputs = group.run(lambda rank, all_reduce: my_layer(rank, all_reduce))   # [rank 0's, rank 1's]
    assert group.calls == 1                                                    # all-reduces per rank

Only one rank computes at a time (a rank hands over while it waits in the all-reduce), so the
kernels are never called from two threads at once and every run is deterministic. The sum is taken
in rank order in float32, a different order from NCCL's ring, and within the same bound.
"""

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SimulatedGroup"]


class _Unjoined(RuntimeError):
    """An all-reduce that another rank will never join (it finished or failed first)."""


class SimulatedGroup:
    """``world_size`` ranks run as threads; ``run(fn)`` calls ``fn(rank, all_reduce)`` on each and
    returns their results in rank order. ``all_reduce(partial)`` returns a new array holding the
    float32 sum over the ranks of their ``partial`` (same shape on every rank, float32).
    ``calls`` counts the all-reduces each rank made in the last run (the same for every rank, or
    the run fails)."""

    def __init__(self, world_size: int) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        self.world_size = int(world_size)
        self.calls = 0

    def run(self, fn: Callable[[int, Callable[[Any], Any]], Any]) -> list:
        r = self.world_size
        # One condition serves as the turn (held by the rank that computes, released while it waits
        # in an all-reduce) and as the meeting point of the all-reduce.
        cond = threading.Condition(threading.RLock())
        state = {"arrived": 0, "generation": 0, "finished": 0, "failed": False, "total": None}
        slots = [None] * r
        counts = [0] * r
        results = [None] * r
        errors = []

        def all_reduce(rank, partial):
            partial = np.asarray(partial)
            if partial.dtype != np.float32:
                raise TypeError(f"partial must be float32, got {partial.dtype}")
            counts[rank] += 1
            slots[rank] = partial.copy()
            generation = state["generation"]
            state["arrived"] += 1
            if state["arrived"] == r:
                if len({s.shape for s in slots}) != 1:
                    state["failed"] = True
                    cond.notify_all()
                    raise ValueError(f"partials must have one shape on every rank, got {[s.shape for s in slots]}")
                total = slots[0].copy()
                for s in slots[1:]:
                    total += s  # float32, in rank order
                state.update(arrived=0, generation=generation + 1, total=total)
                cond.notify_all()
            else:
                # a rank that finished, or failed, will never join: fail instead of hanging
                cond.wait_for(lambda: state["generation"] != generation or state["finished"] or state["failed"])
                if state["generation"] == generation:
                    raise _Unjoined(f"rank {rank}: all-reduce {counts[rank]} was not joined by every rank")
            return state["total"].copy()

        def body(rank):
            with cond:
                try:
                    results[rank] = fn(rank, lambda partial: all_reduce(rank, partial))
                    state["finished"] += 1
                except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
                    errors.append((rank, exc))
                    state["failed"] = True
                cond.notify_all()

        threads = [threading.Thread(target=body, args=(rank,), name=f"rank{rank}") for rank in range(r)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # a rank's own error first (failing before its all-reduce, it also left the others unjoined),
        # then a mismatch of the all-reduce counts, then the unjoined all-reduces it caused
        causes = [e for e in errors if not isinstance(e[1], _Unjoined)]
        if causes:
            rank, exc = causes[0]
            raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
        if len(set(counts)) != 1:
            raise AssertionError(f"ranks made different numbers of all-reduces: {counts} (they would hang)")
        if errors:
            rank, exc = errors[0]
            raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
        self.calls = counts[0]
        return results
