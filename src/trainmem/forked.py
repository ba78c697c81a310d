"""Independent pieces of one answer computed at once: the cut models an estimate composes its step from, the
changes the checked advice estimates. This process and one forked child per further core take the pieces in
order, each the next one left as it finishes the last, so that both cores of a two-core machine stay busy until
the last piece (a fixed share each left one idle while the other finished a longer one).

A forked child starts with torch, transformers and the model classes already imported, which a spawned one would
import again (seconds each on two cores); this process working too keeps what its pieces warmed (the fake tensor
dispatch cache, DTensor's sharding rules: most of a second for each process's first sharded simulation) for the
children of a later call, which inherit it.

Where a CUDA device exists, only children take pieces: a backward in this process would start autograd's device
threads, after which no forked child can run one (`_autograd_threads`). Only on Linux (fork), where there is more
than one core and more than one piece, not inside a piece (its cores are taken by the other pieces) and not after
this process started autograd's device threads; elsewhere the pieces run one after another in this process."""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import sys
from typing import Any, Callable, Sequence

_BUSY = False
"""Inside a piece (in a child, or in this process while children run): a nested call runs its pieces in turn."""


class PieceFailed(RuntimeError):
    """A child ended without answering its piece (killed, or its answer would not pickle)."""


def at_once(work: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """`[work(x) for x in items]`, the items shared between this process and forked children where that can gain
    (above); put the longest first. An exception a piece raises is raised here; the results must pickle, `work`
    and the items need not (the children inherit them at the fork)."""
    global _BUSY
    workers = min(len(items), os.cpu_count() or 1)
    if workers < 2 or _BUSY or not sys.platform.startswith("linux") or _autograd_threads():
        return [work(x) for x in items]
    here = not _device_threads_would_start()
    ctx = multiprocessing.get_context("fork")
    taken = ctx.Value("i", 0)
    answers = ctx.Queue()

    def next_item() -> int | None:
        with taken.get_lock():
            i = taken.value
            taken.value += 1
        return i if i < len(items) else None

    children = [ctx.Process(target=_child, args=(work, items, next_item, answers), daemon=True)
                for _ in range(workers - 1 if here else workers)]
    for child in children:
        child.start()
    out: dict[int, Any] = {}
    _BUSY = True
    try:
        while here and (i := next_item()) is not None:
            out[i] = work(items[i])
    except BaseException:
        for child in children:
            child.kill()
        raise
    finally:
        _BUSY = False
    owed = len(items) - len(out)  # the pieces the children took
    failed: BaseException | None = None
    while owed > 0:
        try:
            i, ok, value = answers.get(timeout=1.0)
        except queue.Empty:
            if not any(child.is_alive() for child in children) and answers.empty():
                failed = failed or PieceFailed("a child process ended without its answer")
                break
            continue
        owed -= 1
        if ok:
            out[i] = value
        else:
            failed = failed or value
    for child in children:
        child.join()
    if failed is not None:
        raise failed
    return [out[i] for i in range(len(items))]


def _autograd_threads() -> bool:
    """Whether autograd's engine runs device threads in this process (`pt_autograd_N`: it starts them at its first
    backward where a CUDA device exists, a real step's or a simulated one's): a forked child's backward then fails
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing"), so the pieces run
    here, in turn."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True  # cannot tell: do not fork
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("pt_autograd"):
                    return True
        except OSError:
            continue
    return False


def _device_threads_would_start() -> bool:
    """Whether a backward here would start autograd's device threads (a CUDA device exists), after which this
    process could fork no more: then only children take pieces, and this process waits."""
    import torch

    return torch.cuda.is_available()


def _child(work: Callable[[Any], Any], items: Sequence[Any], next_item: Callable[[], int | None],
           answers: Any) -> None:
    """A child: one thread (the other cores go to the other pieces), and output of its own, so that no lock a
    parent's thread held on stdout or stderr at the fork (a progress spinner's) can stop it; it answers each piece
    it takes, or the exception the piece raised, and prints nothing."""
    global _BUSY
    _BUSY = True
    import torch

    torch.set_num_threads(1)
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the child's own, for its lifetime)
    logging.disable(logging.CRITICAL)
    while (i := next_item()) is not None:
        try:
            answers.put((i, True, work(items[i])))
        except BaseException as e:  # noqa: BLE001 (sent to the parent, which raises it)
            answers.put((i, False, e))
    answers.close()
    answers.join_thread()
