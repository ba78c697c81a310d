"""The page's slow work, in spawned worker processes: one runtime group's simulated step, a plan.

A job past its time limit is killed with its process (a process pool cannot stop one task), so one slow
request cannot hold the others; its answer is then ("timeout", [one line]), which the page shows as the
analytic row, marked so, with a retry (`Workers.forget` drops the answer so the job can run again).
Processes share nothing: the estimator patches module functions while it counts kernels, which one process
at a time may do (see `answers`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from .. import SetupError, TrainSetup
from .inputs import resolve

SIMULATE_TIMEOUT = 240.0
"""Seconds a simulate job (one runtime group) may run: 2-25 s a setup up to 8B parameters on 2 cores, times
the accumulation's micro-batches."""
PLAN_TIMEOUT = 300.0
"""Seconds a plan may run: its analytic search takes seconds, its six simulated finalists (in parallel) up to a
few minutes."""
KEEP = 512
"""Answers kept per cache (oldest dropped first)."""


# --- in the worker processes ----------------------------------------------------------------------------
def _start(pids: Any) -> None:
    """Worker initializer: say which process this is (so that a job past its deadline can be killed), yield the
    CPU to the server's own process (the live answers come first: background work runs at a lower priority),
    and import the estimator and what every model class and adapter needs once, so that the first job does not
    pay for them (transformers' `modeling_utils` alone takes about 3 s on two cores)."""
    pids.put(os.getpid())
    if hasattr(os, "nice"):
        os.nice(5)
    import peft  # noqa: F401
    import torch
    import transformers.modeling_utils  # noqa: F401

    import trainmem.estimator  # noqa: F401

    torch.set_num_threads(1)  # meta tensors compute nothing; the server's other process needs the other core


@lru_cache(maxsize=16)
def _spec(ref: tuple[str, ...]) -> Any:
    return resolve(ref)


def _problems(e: BaseException) -> list[str]:
    """An exception as the page's one-line messages (a SetupError's own lines; anything else in one line)."""
    if isinstance(e, SetupError):
        return e.problems
    text = (str(e).strip().splitlines() or [""])[0][:300]
    return [f"internal error ({type(e).__name__}): {text}" if text else f"internal error ({type(e).__name__})"]


def simulate_job(ref: tuple[str, ...], setup: dict[str, Any], cards: list[str]) -> tuple[str, Any]:
    """The simulate method on `cards` (one runtime group): ('ok', card -> Breakdown or its problems)."""
    from trainmem.search.cards import estimate_cards

    try:
        found = estimate_cards(_spec(ref), TrainSetup.from_dict(setup), cards, "simulate")
    except Exception as e:  # noqa: BLE001 (the page gets one line, the log the traceback)
        import traceback

        traceback.print_exc()
        return "problems", _problems(e)
    return "ok", {k: (v.problems if isinstance(v, SetupError) else v) for k, v in found.items()}


def plan_job(ref: tuple[str, ...], setup: dict[str, Any], target: int, allow: tuple[str, ...]) -> tuple[str, Any]:
    """`trainmem plan` for `setup.gpu`: ('ok', Plan.to_dict()) or ('problems', lines)."""
    from .. import make_plan

    try:
        plan = make_plan(_spec(ref), TrainSetup.from_dict(setup), target, allow=allow)
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        return "problems", _problems(e)
    return "ok", plan.to_dict()


# --- in the server's process ----------------------------------------------------------------------------
@dataclass
class Job:
    future: Future
    limit: float
    what: str
    started: float | None = None


class Workers:
    """Slow jobs in spawned processes (not forked: the server runs threads), `processes` at a time. A job past
    its limit kills every worker (a process pool cannot stop one task): the others' jobs are lost too and
    are submitted again by the next request that wants them."""

    def __init__(self, processes: int = 2):
        self.processes = processes
        self.lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.done: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._pool()

    def _pool(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.pids = context.Queue()
        self.pool = ProcessPoolExecutor(self.processes, mp_context=context, initializer=_start, initargs=(self.pids,))

    def result(self, key: str, fn: Callable[..., tuple[str, Any]], *args: Any, limit: float = SIMULATE_TIMEOUT,
               what: str = "simulate", submit: bool = True) -> tuple[str, Any] | None:
        """The job's answer, None while it runs (or, with `submit` False, before it was submitted):
        ('ok', value), ('problems', lines), or ('timeout', [line]) when it ran past `limit` seconds."""
        from concurrent.futures.process import BrokenProcessPool

        with self.lock:
            self.reap()
            if key in self.done:
                return self.done[key]
            job = self.jobs.get(key)
            if job is None:
                if submit:
                    self.jobs[key] = Job(self._submit(fn, *args), limit, what)
                return None
            if not job.future.done():
                return None
            del self.jobs[key]
            try:
                answer = job.future.result()
            except (BrokenProcessPool, CancelledError):  # killed with another job's workers: run it again
                self.jobs[key] = Job(self._submit(fn, *args), limit, what)
                return None
            except Exception as e:  # noqa: BLE001 (e.g. an answer that could not be sent back)
                answer = ("problems", [f"{what}: {_problems(e)[0]}"])
            self._keep(key, answer)
            return answer

    def _submit(self, fn: Callable[..., tuple[str, Any]], *args: Any) -> Future:
        """Submit to the pool; a pool broken by a worker that died (killed from outside, out of memory) is
        replaced by a new one first, so that one lost worker does not fail every later job."""
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self.pool.submit(fn, *args)
        except BrokenProcessPool:
            self.kill()
            return self.pool.submit(fn, *args)

    def forget(self, key: str) -> None:
        """Drop a job's kept answer, so that the next `result` with `submit` runs it again (a retry)."""
        with self.lock:
            self.done.pop(key, None)

    def _keep(self, key: str, answer: tuple[str, Any]) -> None:
        self.done[key] = answer
        while len(self.done) > KEEP:
            self.done.popitem(last=False)

    def reap(self) -> None:
        """Kill the workers where a job has run past its limit (timed from when it started running); its
        answer is a one-line message."""
        now = time.monotonic()
        late = []
        for key, job in self.jobs.items():
            if job.started is None and job.future.running():
                job.started = now
            if job.started is not None and now - job.started > job.limit and not job.future.done():
                late.append(key)
        if not late:
            return
        for key in late:
            job = self.jobs.pop(key)
            stopped = f"{job.what}: stopped after {job.limit:g} s (trainmem serve's limit a job)"
            self._keep(key, ("timeout", [stopped]))
        self.kill()

    def _kill_workers(self) -> None:
        """Kill the pool's workers: those that said their pid, and those still starting (the pool's own list of
        its processes, a private attribute of ProcessPoolExecutor read only if it is there), which would
        otherwise import torch and run a job nobody waits for."""
        pids = set()
        while not self.pids.empty():
            pids.add(self.pids.get_nowait())
        pids.update(p.pid for p in list((getattr(self.pool, "_processes", None) or {}).values()) if p.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Kill the worker processes and start a new pool."""
        self._kill_workers()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self._pool()

    def close(self) -> None:
        """Kill the workers (a running simulation is not worth waiting for) and wait for the pool to wind up."""
        self._kill_workers()
        self.pool.shutdown(wait=True, cancel_futures=True)


__all__ = ["Workers", "simulate_job", "plan_job", "SIMULATE_TIMEOUT", "PLAN_TIMEOUT", "KEEP"]
