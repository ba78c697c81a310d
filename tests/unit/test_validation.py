"""trainmem.validation finds the repository's docs/ from where the package is, and says why and what to do where
there are none (an installed wheel)."""

from pathlib import Path

import pytest

from trainmem.validation import repository, timing


def test_the_docs_are_found_from_the_package():
    assert (repository.root() / "pyproject.toml").is_file()
    assert len(timing.fit_paths()) == len(timing.FIT_FILES) and all(Path(p).is_file() for p in timing.fit_paths())


def test_without_docs_the_error_says_why_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(repository, "CHECKOUT", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"pip install -e \.` or with PYTHONPATH=src; an installed wheel"):
        timing.fit_paths()
