"""Independent pieces of one answer computed at once, one forked process each: the cut models an estimate composes
its step from, the changes the checked advice estimates. A forked child starts with torch, transformers and the
model classes already imported, which a spawned one would import again (seconds each on two cores).

Only where the platform can fork, there is more than one core and more than one piece, and not inside a child
(its cores are taken by its siblings); elsewhere the pieces run one after another in this process."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence

_WORK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
"""The function the children call and its items: set before they fork, so that they inherit both (closures and
fake tensors do not pickle); only an item's index goes to a child, and its result comes back."""
_CHILD = False


def at_once(work: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """`[work(x) for x in items]`, each in a forked process where that can gain (above); the results must pickle,
    `work` and the items need not."""
    global _WORK
    workers = min(len(items), os.cpu_count() or 1)
    if workers < 2 or _CHILD or "fork" not in multiprocessing.get_all_start_methods():
        return [work(x) for x in items]
    _WORK = (work, items)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_quiet) as pool:
            return list(pool.map(_run, range(len(items))))
    finally:
        _WORK = None


def _run(i: int) -> Any:
    assert _WORK is not None
    work, items = _WORK
    return work(items[i])


def _quiet() -> None:
    """A child: one thread (the cores go to its siblings), and output of its own, so that no lock a parent's
    thread held on stdout or stderr at the fork (a progress spinner's) can stop it; it returns its answer and
    prints nothing."""
    global _CHILD
    _CHILD = True
    import torch

    torch.set_num_threads(1)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child's own, for its lifetime)
    logging.disable(logging.CRITICAL)
