"""Where the repository's docs/ are, for the validation code that reads the measurements committed there and
rewrites the generated blocks of the docs.

That code works in a checkout of the repository (an editable install, or PYTHONPATH=src), where this file is
src/trainmem/validation/repository.py and the root is three folders up. An installed wheel holds the package
without docs/: `root` then says so, with the fix, rather than letting a later `open` fail on a path that
names no reason.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve()
CHECKOUT = HERE.parents[3]
"""The repository root when the package is imported from a checkout: src/trainmem/validation -> root."""


def root() -> Path:
    """The repository root. Raises FileNotFoundError, saying how to fix it, where the package was not imported
    from a checkout's src/ or the checkout has no docs/."""
    if HERE.parents[2].name != "src" or not (CHECKOUT / "docs").is_dir():
        raise FileNotFoundError(
            f"trainmem.validation reads the repository's docs/ and there is none at {CHECKOUT / 'docs'} (trainmem "
            f"was imported from {HERE.parents[1]}): run it from a git checkout of trainmem, installed with "
            "`pip install -e .` or with PYTHONPATH=src; an installed wheel has no docs/")
    return CHECKOUT


def docs(*parts: str) -> Path:
    """A path under the repository's docs/ (`docs("lab", "data")`), checked as `root` checks it."""
    return root().joinpath("docs", *parts)
