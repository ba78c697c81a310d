"""The package version, and where the code that made a row came from, in a module of its own so that modules
below `trainmem/__init__` can record them without importing the package they are part of."""

from __future__ import annotations

import datetime
import functools
import os
import subprocess
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


@functools.lru_cache(maxsize=1)
def source() -> dict[str, Any]:
    """The git commit of the trainmem source this process runs, and whether its tree had uncommitted changes
    (`TRAINMEM_COMMIT` and `TRAINMEM_DIRTY=1` where a launcher says so: a copy of the tree on another machine
    may carry a .git that is not the tree's; None for both where neither is known, e.g. an installed wheel):
    every row records them,
    so that "measured at commit X" rests on the row, not on the order of commits."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    said = os.environ.get("TRAINMEM_COMMIT")
    if said:  # a copy whose .git is not the tree's (a GPU machine's working tree): what its launcher said
        return {"commit": said, "dirty": os.environ.get("TRAINMEM_DIRTY", "") == "1"}
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def stamp() -> dict[str, Any]:
    """What a row records about its making: trainmem's version, commit and dirty flag, and the UTC time."""
    return {"trainmem": __version__, **source(),
            "utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
