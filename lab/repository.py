"""Where the repository's docs/ are, for the lab code that reads the measurements committed there and rewrites
the generated blocks of the docs: lab/ sits at the root of a checkout, beside docs/ and src/."""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
"""The repository root: lab/ -> root."""


def root() -> Path:
    """The repository root. Raises FileNotFoundError, saying how to fix it, where the checkout has no docs/."""
    if not (CHECKOUT / "docs").is_dir():
        raise FileNotFoundError(f"lab/ reads the repository's docs/ and there is none at {CHECKOUT / 'docs'}: run "
                                "it from a whole git checkout of trainmem")
    return CHECKOUT


def docs(*parts: str) -> Path:
    """A path under the repository's docs/ (`docs("lab", "data")`), checked as `root` checks it."""
    return root().joinpath("docs", *parts)
