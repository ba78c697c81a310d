"""The README's two set-up commands are what CI runs and what a new user types; its examples are real
commands, parsed by trainmem's own command line, and the cheap ones run here."""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DEMO = (ROOT / "scripts" / "demo.sh").read_text()


def test_readme_top_has_the_two_setup_commands_and_ci_runs_the_second():
    block = README.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    install_run, install_test = block
    # the CPU install is pinned (a plain torch pulls a CUDA build), with the plots' extra and the pinned set
    assert "pip install -q torch==2.13.0 -e '.[report]' -c constraints.txt" in install_run
    assert install_run.endswith("&& bash scripts/demo.sh")  # ... then the main job on its default
    assert "torch==2.13.0" in install_test and "-c constraints.txt" in install_test
    # the fast tier on two processes; CI runs `-m slow` after it
    assert install_test.endswith("-m pytest -q -m 'not slow' -n 2")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -m1 -- '-m pytest' README.md" in ci and "pytest -q -m slow" in ci
    assert [l for l in README.splitlines() if "-m pytest" in l][0] == install_test


def test_the_demo_is_the_chapter_on_a_t4_and_its_report():
    commands = [l.replace('"$trainmem" ', "trainmem ", 1) for l in DEMO.splitlines() if l.startswith('"$trainmem" ')]
    assert commands == [
        "trainmem sweep --preset chapter --gpu T4 --resume --out trainmem-out/chapter.jsonl",
        "trainmem report trainmem-out/chapter.jsonl --gpu T4 --out trainmem-out/chapter-report"]
    assert DEMO.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in DEMO


def test_constraints_pin_what_ci_installs():
    pins = dict(l.split("==") for l in (ROOT / "constraints.txt").read_text().splitlines()
                if l and not l.startswith("#"))
    assert pins["torch"] == "2.13.0"
    assert {"transformers", "peft", "accelerate", "rich", "pytest"} <= set(pins)


def commands(text: str, table: bool = False) -> list[str]:
    """Every `trainmem ...` line of the text's bash blocks (comments dropped), and with `table` every
    `trainmem ...` in backticks on a table row."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [" ".join(shlex.split(l, comments=True)) for l in block.splitlines() if l.startswith("trainmem ")]
    if table:
        for line in text.splitlines():
            if line.startswith("|"):
                found += re.findall(r"`(trainmem [^`]+)`", line)
    return found


def parse_all(lines: list[str], monkeypatch) -> list[str]:
    """Parse each command line with trainmem's own parser (each subcommand's `main` stubbed out); fail on any
    flag or value the parser refuses. Returns the subcommands not registered (yet), which are not parsed."""
    from trainmem import cli

    parsed = []
    for module in set(cli.COMMANDS.values()):
        monkeypatch.setattr(module, "main", lambda args: parsed.append(args) or 0)
    missing = []
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[0] not in cli.COMMANDS:
            missing.append(argv[0])
            continue
        try:
            assert cli.main(argv) == 0
        except SystemExit as e:
            pytest.fail(f"{line!r}: the command line refuses it (exit {e.code})")
        assert parsed[-1].command == argv[0]
    return missing


def test_every_readme_command_is_a_real_command(monkeypatch):
    lines = commands(README, table=True) + commands("```bash\n" + DEMO.replace('"$trainmem" ', "trainmem ") + "```")
    assert len(lines) >= 9
    # `trainmem serve` is being added by its own change; once it is registered, its line is parsed too
    assert set(parse_all(lines, monkeypatch)) <= {"serve"}


def test_readme_quick_start_commands_run(capsys):
    """The quick start's cheap commands, run for real on the CPU (the estimate runs in the Python example)."""
    from trainmem import cli

    table = commands(README, table=True)
    max_batch = next(l for l in table if l.startswith("trainmem max-batch"))
    assert cli.main(shlex.split(max_batch)[1:]) == 0
    assert "Largest micro-batch for llama-3.2-1b on the A10G" in capsys.readouterr().out
    verify = next(l for l in table if l.startswith("trainmem verify-accumulation"))
    assert cli.main(shlex.split(verify)[1:]) == 0
    assert "PASS" in capsys.readouterr().out


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {})
    level, reserved, step_s = capsys.readouterr().out.split()
    assert level in ("fits", "tight", "no") and int(reserved) > 2**30 and float(step_s) > 0


def test_readme_is_for_users():
    """Short, and no validation history: that is docs/accuracy.md's and the lab book's."""
    assert len(README.splitlines()) <= 160
    assert not re.search(r"held-out|change [0-9]", README)


def test_readme_estimate_example_prints_its_first_line_and_no_warning():
    """The README's example output is what the command prints first, and a new user's run shows no
    third-party warning (transformers', peft's, torch's are filtered unless --verbose)."""
    import subprocess
    import sys

    block = re.search(r"```text\n\$ (trainmem estimate [^\n]+)\n((?:[^\n]+\n)+)```", README)
    assert block, "the README's example of an estimate's first lines"
    command, sample = block.group(1), block.group(2).splitlines()
    p = subprocess.run([sys.executable, "-m", "trainmem.cli", *shlex.split(command)[1:]], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert not re.search(r"warn", p.stderr, re.I), p.stderr
    for printed, first in zip(p.stdout.splitlines(), sample, strict=False):
        if _pinned_transformers():
            assert printed == first
        else:  # a newer transformers may move the model's memory a little: the same words, figures within 1%
            number = r"\d+(?:\.\d+)?"
            assert re.sub(number, "N", printed) == re.sub(number, "N", first), printed
            for a, b in zip(re.findall(number, printed), re.findall(number, first)):
                assert abs(float(a) - float(b)) <= 0.01 * max(float(b), 1.0), (printed, first)
    assert len(p.stdout.splitlines()) >= len(sample)


def _pinned_transformers() -> bool:
    """Whether the installed transformers is the release constraints.txt pins, which the README's output shows."""
    import transformers

    pins = dict(line.strip().split("==", 1) for line in open(ROOT / "constraints.txt") if "==" in line)
    return transformers.__version__ == pins.get("transformers")
