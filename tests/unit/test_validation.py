"""The lab finds the checkout's docs/ and reads one manifest of measured sets (lab/sets.json): every file it
names is committed, each memory set has its error table, and the step-time fit reads its files from it."""

from pathlib import Path

import pytest

from lab import manifest, repository, timing


def test_the_docs_are_found_from_the_lab():
    assert (repository.root() / "pyproject.toml").is_file()
    assert timing.fit_paths() == [manifest.path(f) for f in manifest.fit_files()]
    assert all(Path(p).is_file() for p in timing.fit_paths())


def test_the_manifest_names_committed_files_once():
    files = [e["file"] for e in manifest.sets()]
    assert len(files) == len(set(files))
    assert all(Path(manifest.path(f)).is_file() for f in files)
    tables = [r["table"] for _, r in manifest.reports() + manifest.time_reports()] + \
             [r["table"] for _, r in manifest.sharded_reports()]
    assert all(Path(manifest.path(t)).is_file() for t in tables)
    assert all(e["gpu"] in ("H200", "H100") and e.get("time") in ("fit", "held-out", "sharded")
               for e in manifest.sets())


def test_a_held_out_set_is_never_fitted_on():
    """A memory set reported as held out may join the step-time fit only after it was reported; a set whose
    step times are reported as held out is not in the fit."""
    timed = {e["file"] for e in manifest.sets() if "time_reported" in e}
    assert timed and not timed & set(manifest.fit_files())
    assert list(manifest.memory_sets())[0] != "held-out 17" and "held-out 17" in manifest.memory_sets()
    assert manifest.number("held-out 17") == 17 and manifest.number("in-sample") == 0


def test_without_docs_the_error_says_why_and_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(repository, "CHECKOUT", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"run it from a whole git checkout of trainmem"):
        timing.fit_paths()
