"""`trainmem estimate`'s answers kept on disk, so that asking again costs a fraction of a second instead of the
imports of torch and transformers and a simulated step.

An answer is kept under a key made of everything that decides it: the model (a preset's name; a local folder's or
file's config.json by its bytes), the flags given and the bytes of `--config` and `--training-args`, the method
and margin, trainmem's own source (every module's bytes) and the installed torch, transformers, peft and
accelerate. A change to any of them is a new key; nothing is ever invalidated by hand. Hub ids (their config can
change under the same name) and setups without `--gpu` (on a CUDA machine that means the card in it) are not
kept. `TRAINMEM_CACHE=off` turns it off; `TRAINMEM_CACHE_DIR` moves it (default `~/.cache/trainmem/estimates`).

Limitation: an answer read back is the row it was made as, `env.utc` included: the time it was computed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from trainmem.config.presets import HUB_IDS, PRESETS
from trainmem.result import Result

from .options import given_values

PACKAGES = ("torch", "transformers", "peft", "accelerate")
"""The libraries whose modelling code the estimate runs."""


def folder() -> Path | None:
    """Where answers are kept, or None where caching is off."""
    if os.environ.get("TRAINMEM_CACHE", "").lower() in ("off", "0", "no", "false"):
        return None
    base = os.environ.get("TRAINMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trainmem", "estimates")
    return Path(base)


@functools.lru_cache(maxsize=1)
def _source() -> str:
    """A hash of trainmem's own modules: a new release or a local edit is a new key."""
    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _model(name: str | None) -> str | None:
    """The model's identity: a preset's name, or a local config.json's bytes; None where it cannot be known
    without resolving it (a hub id, or no model named on the command line)."""
    if name is None:
        return None
    path = Path(name)
    config = path / "config.json" if path.is_dir() else path
    if config.is_file():
        return hashlib.sha256(config.read_bytes()).hexdigest()
    return name if name in PRESETS and name not in HUB_IDS else None


def key(args: argparse.Namespace) -> str | None:
    """The key of this `estimate` command's answer, or None where it is not kept."""
    if folder() is None or not getattr(args, "gpu", None) or getattr(args, "out", None):
        return None
    model = _model(getattr(args, "model", None))
    if model is None:
        return None
    files = {}
    for flag in ("config", "training_args"):
        name = getattr(args, flag, None)
        if name is not None:
            try:
                files[flag] = hashlib.sha256(Path(name).read_bytes()).hexdigest()
            except OSError:
                return None  # the setup's own reading says what is wrong with it
    request = {"model": model, "values": {k: str(v) for k, v in sorted(given_values(args).items())},
               "files": files, "method": args.method, "margin": str(args.margin), "source": _source(),
               "versions": _versions()}
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def load(answer_key: str | None) -> Result | None:
    """The answer kept under the key, or None (none kept, or unreadable: it is then made anew)."""
    where = folder()
    if answer_key is None or where is None:
        return None
    try:
        return Result.from_dict(json.loads((where / f"{answer_key}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def store(answer_key: str | None, result: Result) -> None:
    """Keep the answer (whole or not at all: written aside, then renamed); a folder that cannot be written is
    no reason to fail an estimate."""
    where = folder()
    if answer_key is None or where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / f"{answer_key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(result.to_dict(), allow_nan=True))
        tmp.replace(where / f"{answer_key}.json")
    except OSError:
        pass


__all__ = ["key", "load", "store", "folder"]
