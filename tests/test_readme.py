"""The README's two set-up commands are what CI runs and what a new user types."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_top_has_the_two_setup_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    install_run, install_test = block
    assert "torch==2.13.0" in install_run and "[report]" in install_run  # the plots need matplotlib
    assert "trainmem sweep --preset chapter --gpu T4" in install_run  # the chapter's table on a T4 ...
    assert install_run.endswith("trainmem report trainmem-out/chapter.jsonl --gpu T4 --out trainmem-out/chapter-report")
    assert "torch==2.13.0" in install_test and install_test.endswith("-m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -m1 -- '-m pytest' README.md" in ci
    assert [l for l in readme.splitlines() if "-m pytest" in l][0] == install_test


def test_constraints_pin_what_ci_installs():
    pins = dict(l.split("==") for l in (ROOT / "constraints.txt").read_text().splitlines()
                if l and not l.startswith("#"))
    assert pins["torch"] == "2.13.0"
    assert {"transformers", "peft", "accelerate", "rich", "pytest"} <= set(pins)
