"""The answers the page shows, computed fast enough to feel live: analytic at once, simulate in the background.

One setup asked on the page is answered for every catalog card at once (one rank's answer when the setup
spans several GPUs, as `trainmem estimate --gpus N --shard S` gives it). The answer comes in passes:
- a hub id's config.json, looked up in its own threads (`lookup.Lookups`), never holding another answer;
- a new model or setup's first answer, on the server's one estimator thread (`first`): the analytic estimate
  on every card (`search.cards.estimate_cards(.., "analytic")`, milliseconds a card once the model's
  parameter inventory is built) and each card's largest micro-batch (`largest_batches`, cached per setup
  without its micro-batch, so a change of micro-batch or card costs only the first);
- in the background (spawned worker processes, `workers.Workers`), once the page asks for the same setup
  again (it polls while anything is pending: a setup left alone for 0.8 s): the simulate method, one job per
  runtime group (`search.cards.groups`: one simulated step serves every card of a group, each card then
  replays it under its own cap), the chosen card's group first; each row says which method its numbers come
  from and is swapped for the simulated one when its group is done. `plan` runs there too.
`ask` answers a setup whose every part is cached at once, in the caller's thread and under no lock, so that
neither a pending lookup nor a new model's first answer delays it; anything else it hands to a thread and
returns as `Waiting` (the route waits a moment, then tells the page what is being done, and the page polls).
A simulation past its time limit is killed with its process; its rows keep the analytic answer, marked so,
and `retry` runs it again with twice the limit.

The estimator thread is one thread because the estimator patches module functions while it counts kernels
(`estimator.kernels`): two estimates at once in one process could leave a patch behind. Processes share nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .. import GPU, GPUS, SetupError, find_gpu
from .inputs import DEFAULTS, Query, model_of, model_ref, read_query, resolve
from .lookup import Lookups
from .workers import KEEP, PLAN_TIMEOUT, SIMULATE_TIMEOUT, Workers, plan_job, simulate_job

@dataclass
class Row:
    """One card's line of the table."""

    card: GPU
    answer: Any
    """The card's Breakdown, or its problems (a list of lines), or None while nothing is known yet."""
    method: str
    """`analytic`, `simulate`, `pending`, or `stopped` (its simulation failed and there is no analytic answer)."""
    max_batch: int | None = None
    smallest: bool = False
    """The smallest card (by capacity) on which the setup fits: the cheapest, capacity standing for price."""
    stopped: str | None = None
    """Why the row is not simulated though its setup is: its group's simulation timed out or failed (one line)."""


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
    timed_out: int = 0
    """Runtime groups whose simulation ran past its limit (their rows analytic, marked; `Answers.retry`)."""
    retry_limit: float = 0.0
    """The limit a retry of those groups runs under, in seconds."""

    @property
    def chosen(self) -> Row:
        return next(r for r in self.rows if r.card.name == self.query.card)


@dataclass
class Waiting:
    """A setup whose answer is being worked out: what is being done (one line) and the work's future."""

    what: str
    future: Future


def form_key(form: dict[str, str], card: bool = True) -> str:
    """The cache key of a request's form, as sent, with or without the card it looks at."""
    return json.dumps(sorted((k, v) for k, v in form.items() if card or k != "card"))


class Answers:
    """The page's answers, cached per model and setup."""

    def __init__(self, workers: Workers, timeout: float = SIMULATE_TIMEOUT, lookups: Lookups | None = None):
        self.workers = workers
        self.timeout = timeout
        """Seconds a runtime group's simulation may run (a retry doubles it, per group: `limits`)."""
        self.limits: dict[str, float] = {}
        self.lookups = lookups or Lookups()
        self.lookups.before = self._import
        self.first_thread = ThreadPoolExecutor(1, thread_name_prefix="trainmem-estimator")
        self.first: dict[str, Future] = {}
        """A form's first answer while it is worked out on the estimator thread."""
        self.queries: OrderedDict[str, Query] = OrderedDict()
        """Forms validated before: a form seen again is not validated again."""
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

    def ask(self, form: dict[str, str]) -> Answer | Waiting:
        """The form's answer: at once, under no lock, when every part of it is cached; else `Waiting` for a
        hub id's lookup or for the first answer on the estimator thread. SetupError: the form's problems."""
        key = form_key(form)
        job = self.first.get(key)
        if job is not None and job.done():  # its answer, computed once (a second estimate would count as a poll)
            del self.first[key]
            return job.result()
        q = self.known(form)
        if q is not None and self._ready(q):
            return self.estimate(q)
        model = model_of(form)
        looking = self.lookups.pending(model)
        if looking is not None:
            return Waiting(f"looking up {model}'s config.json on the Hugging Face Hub", looking)
        if job is None:
            for old in [k for k, j in self.first.items() if j.done()][:-KEEP or None]:  # answers nobody came back for
                del self.first[old]
            job = self.first[key] = self.first_thread.submit(lambda: self.estimate(self.query(form)))
        return Waiting(f"working out the first answer for {model} (a new model's parameters are counted once)", job)

    def known(self, form: dict[str, str]) -> Query | None:
        """The form's query if its setup was validated before (on any card: a change of card is no new setup)."""
        q = self.queries.get(form_key(form, card=False))
        card = find_gpu(form.get("card") or DEFAULTS["card"])
        return None if q is None or card is None else replace(q, card=card.name)

    def _ready(self, q: Query) -> bool:
        """Whether `estimate(q)` would compute nothing in this process (every part of it cached)."""
        from trainmem.search.cards import simulates

        key = q.key
        if f"knows {key}" not in self.cache:
            return False
        needed = [f"groups {key}"] if simulates(q.setup, "auto") else []
        if self.cache[f"knows {key}"]:
            needed += [f"analytic {key}", f"largest {_unbatched(q)}"]
        return all(k in self.cache for k in needed)

    def query(self, form: dict[str, str]) -> Query:
        """The request read and validated (`inputs.read_query`) under the estimator lock (validation builds a
        meta model), its hub id looked up already (`lookups`); kept, so that the same form is read once."""
        with self.estimator:
            self._import()
            q = read_query(form, self.spec)
        self.queries[form_key(form, card=False)] = q
        while len(self.queries) > KEEP:
            self.queries.popitem(last=False)
        return q

    def _import(self) -> None:
        """transformers' lazy module fails when two threads import it first at once ("cannot import name
        'CONFIG_MAPPING'", seen on a fresh server): the first to need it imports it alone."""
        if self.imported:
            return
        with self.estimator:
            if not self.imported:
                import transformers  # noqa: F401
                from transformers import CONFIG_MAPPING, AutoModelForCausalLM  # noqa: F401

                import trainmem.estimator  # noqa: F401
                self.imported = True

    def spec(self, model: str) -> Any:
        if self.lookups.needed(model):
            return self.lookups.spec(model)
        return self._cached(f"spec {model}", lambda: resolve(model_ref(model)), self.specs)

    def retry(self, q: Query) -> int:
        """Run the query's timed-out simulations again, each with twice its last limit; how many."""
        again = 0
        for key in self._group_keys(q):
            if (self.workers.done.get(key) or ("",))[0] == "timeout":
                self.limits[key] = 2 * self.limits.get(key, self.timeout)
                self.workers.forget(key)
                again += 1
        return again

    def _group_keys(self, q: Query) -> list[str]:
        return [f"simulate {q.key} {[c.name for c in group]}" for group in self.cache.get(f"groups {q.key}", [])]

    def close(self) -> None:
        self.first_thread.shutdown(wait=False, cancel_futures=True)
        self.lookups.close()

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
        largest = self._cached(f"largest {_unbatched(q)}", lambda: largest_batches(q.spec, q.setup)) if knows else {}
        simulated: dict[str, Any] = {}
        stopped: dict[str, str] = {}
        problems: list[str] = []
        pending = timed_out = 0
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
                job = f"simulate {key} {names}"
                found = self.workers.result(job, simulate_job, model_ref(q.model), q.setup.to_dict(), names,
                                            submit=again, limit=self.limits.get(job, self.timeout))
                if found is None:
                    pending += 1
                elif found[0] == "ok":
                    simulated.update(found[1])
                else:
                    problems += found[1]
                    timed_out += found[0] == "timeout"
                    stopped.update((name, found[1][0]) for name in names)
        rows = []
        for card in GPUS.values():
            got = simulated.get(card.name)
            answer = got if got is not None else quick.get(card.name)
            method = ("simulate" if got is not None else "analytic" if answer is not None
                      else "stopped" if card.name in stopped else "pending")
            if isinstance(answer, SetupError):
                answer = answer.problems
            rows.append(Row(card, answer, method, largest.get(card.name), stopped=stopped.get(card.name)))
        fitting = [r for r in rows if not isinstance(r.answer, (list, type(None))) and r.answer.fits(r.card)]
        if fitting:
            min(fitting, key=lambda r: r.card.capacity).smallest = True
        limit = max([self.limits.get(k, self.timeout) for k in self._group_keys(q)] or [self.timeout])
        return Answer(q, rows, pending, len(grouped), list(dict.fromkeys(problems)), time.monotonic() - start,
                      timed_out, 2 * limit)

    def plan(self, q: Query, target: int, allow: tuple[str, ...]) -> tuple[str, Any] | None:
        """`trainmem plan` on the chosen card, in a worker; None while it searches."""
        setup = q.setup.replace(gpu=q.card).to_dict()
        key = f"plan {json.dumps([q.model, setup, target, allow], sort_keys=True)}"
        return self.workers.result(key, plan_job, model_ref(q.model), setup, target, allow, limit=PLAN_TIMEOUT,
                                   what="plan")


def _unbatched(q: Query) -> str:
    """The key of the query's setup without its micro-batch (the largest micro-batches are searched once)."""
    return json.dumps([q.model, q.setup.replace(batch_size=1).to_dict()], sort_keys=True)


__all__ = ["Answers", "Answer", "Row", "Waiting", "form_key"]
