"""The answers the page shows, computed fast enough to feel live: analytic at once, simulate in the background.

One setup asked on the page is answered for every catalog card at once. The answer comes in two passes:
- at once (in the server's process, on its one estimator thread): the analytic estimate on every card
  (`search.cards.estimate_cards(.., "analytic")`, milliseconds a card once the model's parameter
  inventory is built) and each card's largest micro-batch (`largest_batches`, cached per setup without its
  micro-batch, so a change of micro-batch or card costs only the first);
- in the background (spawned worker processes, `Workers`), once the page asks for the same setup again (it
  polls while anything is pending: a setup left alone for 0.8 s): the simulate method, one job per runtime
  group (`search.cards.groups`: one simulated step serves every card of a group, each card then replays it
  under its own cap), the chosen card's group first; each row says which method its numbers come from and
  is swapped for the simulated one when its group is done. `plan` runs there too.
Everything is cached per model and setup (`Answers`); a job past its time limit is killed with its process,
so one slow request cannot hold the others, and its rows keep the analytic answer and say why.

The estimator thread is one thread because the estimator patches module functions while it counts kernels
(`estimator.kernels`): two estimates at once in one process could leave a patch behind. Processes share nothing.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from .. import GPU, GPUS, SetupError, TrainSetup
from .inputs import Query, model_of, model_ref, read_query, resolve

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
    and import the estimator once, so that the first job does not pay for torch's import."""
    pids.put(os.getpid())
    if hasattr(os, "nice"):
        os.nice(5)
    import torch

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
        """The job's answer, None while it runs (or, with `submit` False, before it was submitted)."""
        from concurrent.futures.process import BrokenProcessPool

        with self.lock:
            self.reap()
            if key in self.done:
                return self.done[key]
            job = self.jobs.get(key)
            if job is None:
                if submit:
                    self.jobs[key] = Job(self.pool.submit(fn, *args), limit, what)
                return None
            if not job.future.done():
                return None
            del self.jobs[key]
            try:
                answer = job.future.result()
            except (BrokenProcessPool, CancelledError):  # killed with another job's workers: run it again
                self.jobs[key] = Job(self.pool.submit(fn, *args), limit, what)
                return None
            except Exception as e:  # noqa: BLE001 (e.g. an answer that could not be sent back)
                answer = ("problems", [f"{what}: {_problems(e)[0]}"])
            self._keep(key, answer)
            return answer

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
            stopped = f"{job.what}: stopped after {job.limit:.0f} s (trainmem serve's limit a job)"
            self._keep(key, ("problems", [stopped]))
        self.kill()

    def _kill_workers(self) -> None:
        while not self.pids.empty():
            pid = self.pids.get_nowait()
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


@dataclass
class Row:
    """One card's line of the table."""

    card: GPU
    answer: Any
    """The card's Breakdown, or its problems (a list of lines), or None while nothing is known yet."""
    method: str
    """`analytic`, `simulate`, or `pending`."""
    max_batch: int | None = None
    smallest: bool = False
    """The smallest card (by capacity) on which the setup fits: the cheapest, capacity standing for price."""


@dataclass
class Answer:
    query: Query
    rows: list[Row]
    pending: int
    """Runtime groups whose simulation is still running."""
    groups: int
    problems: list[str] = field(default_factory=list)
    """Jobs that failed, one line each (their rows keep the analytic answer)."""
    seconds: float = 0.0

    @property
    def chosen(self) -> Row:
        return next(r for r in self.rows if r.card.name == self.query.card)


class Answers:
    """The page's answers, cached per model and setup."""

    def __init__(self, workers: Workers):
        self.workers = workers
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.estimator = threading.RLock()
        """Held by everything in this process that touches transformers or the estimator (see the module's
        docstring); a hub id's config is fetched outside it, under `specs`."""
        self.specs = threading.Lock()
        self.imported = False
        self.asked: OrderedDict[str, None] = OrderedDict()
        """Setups asked for before: their simulation starts when the page asks again (it polls 0.8 s later),
        so a form changed key by key does not queue a simulation per keystroke."""

    def _cached(self, key: str, make: Callable[[], Any], lock: threading.Lock | None = None) -> Any:
        if key not in self.cache:
            with lock or self.estimator:
                if key not in self.cache:
                    self.cache[key] = make()
        self.cache.move_to_end(key)
        while len(self.cache) > KEEP:
            self.cache.popitem(last=False)
        return self.cache[key]

    def query(self, form: dict[str, str]) -> Query:
        """The request read and validated (`inputs.read_query`): its model fetched first, outside the estimator
        lock (a hub id goes to the network), then validated under it (validation builds a meta model)."""
        model = model_of(form)
        try:
            self.spec(model)
        except SetupError:
            pass  # read_query reports it with the rest
        with self.estimator:
            if not self.imported:
                # transformers' lazy module fails when two threads import it first at once ("cannot import name
                # 'CONFIG_MAPPING'", seen on a fresh server): the first request imports it alone
                import transformers  # noqa: F401
                from transformers import CONFIG_MAPPING, AutoModelForCausalLM  # noqa: F401

                import trainmem.estimator  # noqa: F401
                self.imported = True
            return read_query(form, self.spec)

    def spec(self, model: str) -> Any:
        return self._cached(f"spec {model}", lambda: resolve(model_ref(model)), self.specs)

    def estimate(self, q: Query) -> Answer:
        """Every card's answer for the query's setup: simulated where its group is done, else analytic."""
        from trainmem.search.cards import (
            analytic_knows,
            estimate_cards,
            groups,
            largest_batches,
            simulates,
        )

        start = time.monotonic()
        key = q.key
        knows = self._cached(f"knows {key}", lambda: analytic_knows(q.spec, q.setup))
        quick = (self._cached(f"analytic {key}", lambda: estimate_cards(q.spec, q.setup, None, "analytic"))
                 if knows else {})
        unbatched = json.dumps([q.model, q.setup.replace(batch_size=1).to_dict()], sort_keys=True)
        largest = self._cached(f"largest {unbatched}", lambda: largest_batches(q.spec, q.setup)) if knows else {}
        simulated: dict[str, Any] = {}
        problems: list[str] = []
        pending = 0
        grouped: list[list[GPU]] = []
        again = key in self.asked
        self.asked[key] = None
        while len(self.asked) > KEEP:
            self.asked.popitem(last=False)
        if simulates(q.setup, "auto"):
            grouped = self._cached(f"groups {key}", lambda: groups(q.spec, q.setup))
            grouped = sorted(grouped, key=lambda g: all(c.name != q.card for c in g))  # the chosen card's first
            for group in grouped:
                names = [c.name for c in group]
                found = self.workers.result(f"simulate {key} {names}", simulate_job, model_ref(q.model),
                                            q.setup.to_dict(), names, submit=again)
                if found is None:
                    pending += 1
                elif found[0] == "ok":
                    simulated.update(found[1])
                else:
                    problems += found[1]
        rows = []
        for card in GPUS.values():
            got = simulated.get(card.name)
            answer = got if got is not None else quick.get(card.name)
            method = "simulate" if got is not None else "analytic" if answer is not None else "pending"
            if isinstance(answer, SetupError):
                answer = answer.problems
            rows.append(Row(card, answer, method, largest.get(card.name)))
        fitting = [r for r in rows if not isinstance(r.answer, (list, type(None))) and r.answer.fits(r.card)]
        if fitting:
            min(fitting, key=lambda r: r.card.capacity).smallest = True
        return Answer(q, rows, pending, len(grouped), list(dict.fromkeys(problems)), time.monotonic() - start)

    def plan(self, q: Query, target: int, allow: tuple[str, ...]) -> tuple[str, Any] | None:
        """`trainmem plan` on the chosen card, in a worker; None while it searches."""
        setup = q.setup.replace(gpu=q.card).to_dict()
        key = f"plan {json.dumps([q.model, setup, target, allow], sort_keys=True)}"
        return self.workers.result(key, plan_job, model_ref(q.model), setup, target, allow, limit=PLAN_TIMEOUT,
                                   what="plan")


__all__ = ["Answers", "Answer", "Row", "Workers", "simulate_job", "plan_job", "SIMULATE_TIMEOUT", "PLAN_TIMEOUT"]
