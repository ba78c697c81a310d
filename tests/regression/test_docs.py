"""The user docs say what the code and the committed tables say.

Generated blocks (the step-time constants, the card catalog, every accuracy figure) are rendered again by
lab.docs (`python benchmarks/docs_tables.py`) and must equal the committed text; the few figures
typed by hand are recomputed from their sources; links resolve; the code's paths into docs/ exist; and the
examples of the guides are real commands and runnable code."""

import json
import re
from pathlib import Path

import pytest
from test_readme import commands, parse_all

from lab import docs as docs_tables
from lab import manifest

ROOT = Path(__file__).resolve().parents[2]

USER_DOCS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "lab" not in p.parts)


@pytest.mark.parametrize("name", list(docs_tables.BLOCKS))
def test_generated_blocks_are_what_the_code_and_tables_say(name):
    path, render = docs_tables.BLOCKS[name]
    assert docs_tables.block(path, name) == render(), f"{path}: re-run python benchmarks/docs_tables.py"


def test_time_figures_match_their_rows():
    """The step-time summaries the docs quote (computed from unrounded times when they were reported) agree with
    the rows they summarise, as printed to 0.1 ms."""
    tables = docs_tables.time_tables()
    assert len(tables) >= 4
    for (card, path), (_, n, median, worst) in zip(tables, docs_tables.time_held_out()):
        rows, rmedian, rworst = docs_tables.errors(docs_tables.time_rows(path))
        assert rows == n and rows >= 3 and card in ("H200", "H100")
        assert abs(rmedian - median) < 0.15 and abs(rworst - worst) < 0.15, path
    n, median, worst = docs_tables.time_in_sample()
    rows, rmedian, rworst = docs_tables.errors(docs_tables.time_in_sample_rows())
    assert rows == n and abs(rmedian - median) < 0.15 and abs(rworst - worst) < 0.15


def test_figures_typed_by_hand_are_the_tables():
    readme = (ROOT / "README.md").read_text()
    # the autocast Gemma-3 row: today's worst peak_reserved of any set
    reserved = {name: docs_tables.Table(str(ROOT / "docs" / "data" / f"errors-{name.replace(' ', '-')}.md"))
                .summary["reserved"][2] for name in manifest.memory_sets()}
    assert max(reserved, key=reserved.get) == "held-out 12"
    assert f"`peak_reserved` {reserved['held-out 12']:.2f}% low" in readme
    # the step-time model's worst row on runs it was not fitted on
    worst = max(w for *_, w in docs_tables.time_held_out())
    assert f"off by up to {worst:.1f}%" in readme
    # the host yardstick of docs/time-model.md: the same setup on two lent machines
    def yardstick(name: str) -> str:
        for line in (ROOT / "docs" / "lab" / "data" / name).read_text().splitlines():
            r = json.loads(line)
            if r["model"]["name"] == "qwen2.5-0.5b" and r["setup"]["batch_size"] == 1:
                return f"{1e3 * r['throughput']['step_time_median_s']:.1f} ms"
    time_model = (ROOT / "docs" / "time-model.md").read_text()
    assert f"took {yardstick('validation-held-out-14-h100-2026-12-05.jsonl')} a step on one lent H100" in time_model
    assert f"and {yardstick('validation-held-out-14-row-0-h200-2026-12-05.jsonl')} on an H200" in time_model


def test_links_between_docs_resolve():
    broken = []
    for doc in [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_paths_the_code_names_in_docs_exist():
    """Every docs/ file that src/, tests/ and benchmarks/ name (in code or in prose) is where they say."""
    missing = set()
    sources = [*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
               *(ROOT / "benchmarks").glob("*.sh"), *(ROOT / "scripts").glob("*.sh"), ROOT / ".ci" / "run"]
    for source in sources:
        for path in re.findall(r"docs/[\w./-]+\.(?:json\.gz|jsonl|json|md|png)", source.read_text()):
            if not (ROOT / path).exists() and "COMMIT" not in path:
                missing.add(f"{source.relative_to(ROOT)}: {path}")
    assert sorted(missing) == []


def test_user_docs_say_what_is_true_now():
    """The history of each figure is the lab book's: the guides, the reference pages and the README narrate
    no held-out set or change (the accuracy page names the sets its tables list), and nothing says a path that
    ran on a GPU has not."""
    for doc in USER_DOCS:
        text = doc.read_text()
        assert not re.search(r"\b[Cc]hange [0-9]", text), doc
        assert "not yet run" not in text, doc
        if doc.name != "accuracy.md":
            assert not re.search(r"[Hh]eld-out [0-9]", text), doc
    assert len((ROOT / "docs" / "time-model.md").read_text().splitlines()) <= 200


def test_docs_data_holds_only_what_is_regenerated():
    """docs/data/ is what benchmarks/ regenerate at today's code; dated measurements and tables kept as
    reported live in docs/lab/data/."""
    names = sorted(p.name for p in (ROOT / "docs" / "data").iterdir())
    assert not [n for n in names if re.search(r"20\d\d-\d\d-\d\d|-at-[0-9a-f]+\.md$", n)]
    assert {f"errors-{s.replace(' ', '-')}.md" for s in manifest.memory_sets()} <= set(names)


def test_every_guide_command_is_a_real_command(monkeypatch):
    lines = [l for doc in USER_DOCS if doc.name != "README.md" for l in commands(doc.read_text())]
    assert len(lines) >= 25
    assert set(parse_all(lines, monkeypatch)) <= {"serve"}


def python_blocks(doc: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)


def test_guide_python_examples_compile():
    blocks = [(doc, b) for doc in USER_DOCS for b in python_blocks(doc)]
    assert len(blocks) >= 4
    for doc, block in blocks:
        compile(block, str(doc), "exec")


def test_the_trainer_example_runs(tmp_path, monkeypatch, capsys):
    """docs/guide/python.md's MemoryCallback example, in a real Trainer on the CPU."""
    monkeypatch.chdir(tmp_path)
    block = next(b for b in python_blocks(ROOT / "docs" / "guide" / "python.md") if "MemoryCallback(" in b)
    exec(compile(block, "python.md", "exec"), {})
    allocated, error = capsys.readouterr().out.split()[-2:]
    assert int(allocated) > 0 and float(error) > -1  # a CUDA estimate against a CPU run: no closeness to ask
    rows = [json.loads(l) for l in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["measurement", "estimate"]


def test_the_time_model_example_runs(capsys):
    block = python_blocks(ROOT / "docs" / "time-model.md")[0]
    exec(compile(block, "time-model.md", "exec"), {})
    assert "'compute'" in capsys.readouterr().out


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("page,command", [
    ("estimate.md", "trainmem estimate --model llama-3.2-1b --peft lora --batch-size 8 --seq-len 1024 --gpu A10G"),
    ("plan.md", "trainmem plan --model llama-3.2-1b --gpu A10G --target-batch 64 --seq-len 1024 "
                "--allow checkpointing,peft")])
def test_the_guides_sample_output_is_todays(page, command, capsys):
    """A guide's sample output is what its command prints now (line by line, wrapping aside)."""
    from trainmem import cli

    text = (ROOT / "docs" / "guide" / page).read_text()
    assert f"\n{command}\n" in text
    sample = re.findall(r"```text\n(.*?)```", text, re.S)[0]
    assert cli.main(command.split()[1:]) == 0
    out = _words(capsys.readouterr().out)
    lines = [l for l in sample.splitlines() if l.strip() and l != "..." and not set(l) <= set("─ ")]
    assert len(lines) >= 2
    for line in lines:
        assert _words(line) in out, line
