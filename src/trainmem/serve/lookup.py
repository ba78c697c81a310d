"""A hub id typed on the page, looked up in its own threads, so that no other answer waits for the network.

The page sends a model when its field is committed (Enter, leaving the field, a pick from the list), never
each keystroke. A preset, a preset's hub id and an uploaded config need no lookup. Any other hub id is
looked up here, in a pool of its own (`LOOKUP_THREADS`), apart from the estimator's thread and the request
threads: the local Hugging Face cache first, then the Hub's config.json (`ModelSpec.from_hub`, through
`inputs.resolve`). Before going to the Hub, a TCP connection to it is tried with a short timeout
(`PROBE_TIMEOUT`): without a network, huggingface_hub retries five times over about 24 s, and the page
answers in about a second instead, with one line that says the Hub cannot be reached. That verdict is kept
for `OFFLINE_FOR` seconds (every lookup meanwhile is answered at once) and a failed lookup's answer for
`FAILED_FOR` seconds, after which the same id is asked again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable
from urllib.parse import urlsplit

from .. import ModelSpec, SetupError
from .inputs import model_problems, preset_hub_ids, model_ref, resolve

LOOKUP_THREADS = 2
PROBE_TIMEOUT = 3.0
"""Seconds the probe waits for a TCP connection to the Hub."""
OFFLINE_FOR = 30.0
"""Seconds an unreachable Hub is taken to stay unreachable."""
FAILED_FOR = 30.0
"""Seconds a failed lookup's one-line answer is kept before the id is looked up again."""
KEEP = 64
"""Looked-up specs kept (oldest dropped first)."""
PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def unreachable(endpoint: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why the Hub at `endpoint` cannot be reached from here (a DNS or TCP failure, in words), or None when
    a connection opens. Behind a proxy the Hub is not dialled directly, so nothing is said (None)."""
    if any(os.environ.get(p) for p in PROXIES):
        return None
    url = urlsplit(endpoint)
    try:
        with socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return None
    except OSError as e:
        return (str(e.strerror or e) or type(e).__name__)[:120]


class Lookups:
    """Hub ids being looked up or looked up already; `probe(endpoint)` says why the Hub is unreachable."""

    def __init__(self, probe: Callable[[str], str | None] | None = None, threads: int = LOOKUP_THREADS):
        self.probe = probe or unreachable
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="trainmem-lookup")
        self.lock = threading.Lock()
        self.running: dict[str, Future] = {}
        self.found: OrderedDict[str, tuple[float, ModelSpec | SetupError]] = OrderedDict()
        self.offline: tuple[float, str] = (0.0, "")
        self.before: Callable[[], None] = lambda: None
        """Run before a config is read (the server imports transformers there once, in one thread)."""

    @staticmethod
    def needed(model: str) -> bool:
        """Whether the model is a hub id that is not a preset's (the only kind that may go to the network)."""
        return not model_problems(model) and model_ref(model)[0] == "hub" and \
            model.split("@")[0] not in preset_hub_ids()

    def pending(self, model: str) -> Future | None:
        """The lookup of `model` while it runs (started here if it has not been, or if its failure is older
        than `FAILED_FOR`); None once its answer is known, or when it needs no lookup."""
        if not self.needed(model):
            return None
        with self.lock:
            job = self.running.get(model)
            if job is None:
                kept = self.found.get(model)
                if kept is not None and (isinstance(kept[1], ModelSpec) or time.monotonic() - kept[0] < FAILED_FOR):
                    return None
                job = self.running[model] = self.pool.submit(self._lookup, model)
            if not job.done():
                return job
            del self.running[model]
            error = job.exception()
            self.found[model] = (time.monotonic(), job.result() if error is None else _as_problem(error))
            while len(self.found) > KEEP:
                self.found.popitem(last=False)
            return None

    def spec(self, model: str) -> ModelSpec:
        """The looked-up spec (SetupError: why not); a hub id not looked up yet is looked up now, here."""
        kept = self.found.get(model)
        if kept is None:
            return self._lookup(model)
        if isinstance(kept[1], SetupError):
            raise kept[1]
        return kept[1]

    def _lookup(self, model: str) -> ModelSpec:
        from huggingface_hub import constants

        self.before()
        if ModelSpec.from_hub_cache(model) is None and not constants.is_offline_mode():
            since, why = self.offline
            if time.monotonic() - since > OFFLINE_FOR:
                why = self.probe(constants.ENDPOINT) or ""
                self.offline = (time.monotonic(), why)
            if why:
                raise SetupError([f"--model: {model!r} is not in this server's Hugging Face cache and the Hub "
                                  f"({constants.ENDPOINT}) cannot be reached from it ({why}); upload the model's "
                                  "config.json, or pick a preset"])
        return resolve(model_ref(model))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _as_problem(error: BaseException) -> SetupError:
    if isinstance(error, SetupError):
        return error
    return SetupError([f"--model: the lookup failed ({type(error).__name__}: "
                       f"{(str(error).splitlines() or [''])[0][:200]})"])


__all__ = ["Lookups", "unreachable", "PROBE_TIMEOUT", "OFFLINE_FOR", "FAILED_FOR"]
