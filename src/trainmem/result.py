"""The result object: one row per experiment, the same schema for measurements and estimates.

`memory` is the composition at the peak, each part the bytes of that kind live at the moment of the peak.
`weights + gradients + optimizer + activations + other == peak_allocated` on the CPU (the ledger's peak), and
on CUDA while the parts live in PyTorch's allocator: paged 8-bit AdamW's states live in CUDA managed memory,
counted in `optimizer` but not in the allocator's `peak_allocated`, so there the parts can exceed it. `model_states` holds the
seed's figures, the sizes of weights, gradients and optimizer states after an optimizer step (always
defined: zero where a run died before they existed). All sizes are bytes.

Result files are JSONL, one row per line. `append_line` writes a row whole (one write, then fsync);
`repair_tail` moves a line cut by a killed writer aside before rows are added after it; `OutLock` keeps
one writer per file; `read_rows` reads rows back and says which lines it could not read; `out_problems`
checks a file can take rows before any work is done.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "trainmem.result/1"
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "other",
               "peak_allocated", "peak_reserved", "device_used")


def empty_memory() -> dict[str, int]:
    """Every memory key at zero: the composition of a run that died before it measured anything."""
    return {k: 0 for k in MEMORY_KEYS}


@dataclass
class Result:
    """One experiment's row, measured or estimated: the same schema for both so that they sit side by side."""
    kind: str
    """`measurement` (trainmem run) or `estimate`."""
    status: str
    """`ok`, `oom` (a result, not a crash) or `error` (the run itself failed; see `error`)."""
    setup: dict[str, Any]
    """Every resolved setting, so the row can be reproduced."""
    model: dict[str, Any]
    memory: dict[str, int] = field(default_factory=empty_memory)
    model_states: dict[str, int] = field(default_factory=lambda: {"weights": 0, "gradients": 0, "optimizer": 0})
    phases: list[dict[str, Any]] = field(default_factory=list)
    throughput: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    effective_batch: int = 0
    steps_done: int = 0
    peak_phase: str = ""
    """The phase in which the peak happened, e.g. `step2.micro1.backward` or `step1.optimizer`."""
    losses: list[float] = field(default_factory=list)
    oom: dict[str, Any] | None = None
    """For status `oom`: the phase, the bytes it tried to allocate, the peak reached."""
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    method: str | None = None
    """For estimates: `analytic` or `simulate`."""
    terms: dict[str, int] = field(default_factory=dict)
    """For estimates: the named terms behind the breakdown."""
    verdict: dict[str, Any] | None = None
    """For estimates with a card: fits, headroom in bytes, the component to cut first."""
    time: dict[str, Any] = field(default_factory=dict)
    """For estimates: the predicted step time (step_s, tokens_per_s, mfu) on the modelled card."""
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """Multi-process runs: per rank its `memory` and `model_states`; the top level is the worst rank."""
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """The row as plain data (what the JSONL line holds)."""
        return asdict(self)

    def to_json(self) -> str:
        """The row as one JSON line; NaN losses are kept (pure fp16 overflows)."""
        return json.dumps(self.to_dict(), allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        """A row read back; refuses a row of another schema rather than misreading it."""
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} row: schema={d.get('schema')!r}")
        return cls(**d)

    def append_to(self, path: str | Path, wait: float = 10.0) -> list[str]:
        """Append as one JSON line (`append_line`: whole, on disk when this returns), holding the file's
        `OutLock` for up to `wait` seconds to get it; a cut last line is moved aside first (`repair_tail`).
        Returns the warnings to show. When another writer (a sweep) keeps the lock past `wait`, the row is
        appended anyway, whole and on a line of its own, and a warning says so: a row is never lost."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = OutLock(path, wait)
        if not lock.acquire():
            # a cut last line stays (readers report it) and this row starts on a line of its own
            append_line(path, ("" if _ends_at_line_end(path) else "\n") + self.to_json())
            return [(f"{path} is locked by another trainmem ({lock.who()}) for longer than {wait:g} s: "
                     "appended this row without the lock, whole and on its own line")]
        try:
            notes = [note for note in [repair_tail(path)] if note]
            append_line(path, self.to_json())
        finally:
            lock.release()
        return notes


def merge_ranks(rows: list[dict[str, Any]]) -> Result:
    """One row of a run of several ranks: the rank with the largest peak becomes the top level and every rank's
    memory goes to `ranks`; a rank that failed makes the run fail. The gloo ranks, the fake-group ranks run in
    turn and the ranks under torchrun are merged alike."""
    worst = max(rows, key=lambda r: r["memory"]["peak_allocated"])
    top = dict(worst)
    top["ranks"] = [{"rank": r["env"].get("rank", i), "status": r["status"], "peak_phase": r["peak_phase"],
                     "memory": r["memory"], "model_states": r["model_states"]} for i, r in enumerate(rows)]
    failed = [r for r in rows if r["status"] != "ok"]
    if failed and top["status"] == "ok":
        for key in ("status", "oom", "error"):
            top[key] = failed[0][key]
    top["env"] = {**top["env"], "rank": None, "peak_rank": worst["env"].get("rank")}
    return Result.from_dict(top)


# --- result files: JSONL, one row per line, appended whole by one writer at a time ------------------------
ROW_KINDS = ("measurement", "estimate")


@dataclass(frozen=True)
class Unreadable:
    """A line of a result file that is not a trainmem result row, and why (`read_rows(path, problems)`)."""
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.reason})"


def row_problem(row: Any) -> str | None:
    """Why a parsed JSON value is not a trainmem result row; None when it is one. Checks what the readers
    (report, resume) index without a default: the schema, `kind`, `status`, `model.name`, `setup`, `memory`."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if row.get("schema") != SCHEMA:
        return f"schema {row.get('schema')!r}, not {SCHEMA!r}"
    if not isinstance(row.get("model"), dict) or not isinstance(row["model"].get("name"), str):
        return "no model name"
    if not isinstance(row.get("setup"), dict):
        return "no setup"
    if row.get("kind") not in ROW_KINDS or not isinstance(row.get("status"), str):
        return f"kind {row.get('kind')!r} / status {row.get('status')!r} is not a result's"
    if not isinstance(row.get("memory"), dict):
        return "no memory"
    return None


def read_rows(path: str | Path, problems: list[Unreadable] | None = None) -> list[dict[str, Any]]:
    """The result rows of a JSONL file, as dicts in file order. The one reader of result files (report,
    sweep's resume). Lines that are not rows (cut short by a killed writer, not JSON, JSON but not a
    trainmem.result/1 row) are left out, and each is added to `problems` when a list is given, with its line
    number and why; blank lines are nothing. `unreadable_note(problems)` says it in one line."""
    rows = []
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                why = row_problem(row)
            except json.JSONDecodeError as e:
                cut = "" if line.endswith("\n") else ", the last line, cut short"
                why = f"not JSON at column {e.colno}: {e.msg}{cut}"
            if why is None:
                rows.append(row)
            elif problems is not None:
                problems.append(Unreadable(str(path), number, why))
    return rows


def unreadable_note(problems: list[Unreadable], shown: int = 3) -> str:
    """One line: how many lines could not be read and where (the first `shown`); '' when none."""
    if not problems:
        return ""
    where = ", ".join(str(p) for p in problems[:shown])
    more = f" and {len(problems) - shown} more" if len(problems) > shown else ""
    lines = "line" if len(problems) == 1 else "lines"
    return f"left out {len(problems)} unreadable {lines}: {where}{more}"


def append_line(path: str | Path, text: str) -> None:
    """Append `text` as one line: one `write` of the whole line to a file opened for appending (O_APPEND:
    another process's line never lands inside it), then fsync, so that a row is on disk once this returns."""
    data = memoryview((text.rstrip("\n") + "\n").encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # one write for a regular file; the loop only finishes a short write (a full disk)
            data = data[os.write(fd, data):]
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_tail(path: str | Path) -> str | None:
    """Make `path` end at a line end before rows are appended, so that a new row starts on its own line.

    A last line without its newline (a writer killed mid-line) is copied to `<path>.partial-<UTC time>`
    and cut off the file; a last line that is a whole row and lacks only the newline gets it. Returns the
    warning to show (how many bytes went where), or None when nothing was moved. Call it holding the
    file's `OutLock`."""
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return None
    with open(p, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return None
        start = pos = f.tell()
        while pos > 0:  # the last line's start: after the last newline, read backwards in blocks
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            found = f.read(step).rfind(b"\n")
            if found >= 0:
                start = pos + found + 1
                break
        else:
            start = 0
        f.seek(start)
        tail = f.read()
        try:
            whole = row_problem(json.loads(tail)) is None
        except ValueError:
            whole = False
        if whole:
            f.write(b"\n")
        else:
            aside = _side_file(p, "partial")
            aside.write_bytes(tail)
            with open(aside, "rb") as side:
                os.fsync(side.fileno())
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    if whole:
        return None
    return (f"{p} ended in a cut line: moved its {len(tail)} bytes to {aside}, so that new rows start on "
            "their own line")


def _ends_at_line_end(path: str | Path) -> bool:
    """Whether appending to `path` starts a new line: it is missing, empty or ends in a newline."""
    try:
        with open(path, "rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return True
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"
    except FileNotFoundError:
        return True


def _side_file(p: Path, what: str) -> Path:
    """`<p>.<what>-<UTC time>`, not yet taken."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1, 1000):
        candidate = Path(f"{p}.{what}-{stamp}" + (f"-{n}" if n > 1 else ""))
        if not candidate.exists():
            return candidate
    raise FileExistsError(f"{p}.{what}-{stamp}")


class OutLock:
    """One writer per result file: an exclusive, non-blocking `flock` on `<path>.lock`, which holds the
    holder's pid. The kernel drops the lock when its process dies, so a killed sweep leaves none behind;
    the holder removes the file when it lets go (and a waiter that locked a removed file tries again).

        lock = OutLock("sweep.jsonl")
        if not lock.acquire():
            print(lock.busy())   # "--out: sweep.jsonl is being written by another trainmem (pid 4242) ..."
    """

    def __init__(self, path: str | Path, wait: float = 0.0):
        self.target, self.path, self.wait = Path(path), Path(f"{path}.lock"), wait
        self.fd: int | None = None
        self.holder = ""

    def acquire(self) -> bool:
        """Take the lock, trying for up to `wait` seconds; False (and `holder` read) when another has it."""
        import fcntl

        deadline = time.monotonic() + self.wait
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.holder = os.read(fd, 64).decode(errors="replace").strip()
                os.close(fd)
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)
                continue
            try:
                here, now = os.fstat(fd), os.stat(self.path)
                same = (here.st_dev, here.st_ino) == (now.st_dev, now.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # its holder removed it while we waited: lock the file now at the path
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self.fd = fd
            return True

    def release(self) -> None:
        """Let go (removing the lock file first, while it is still ours)."""
        if self.fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None

    def who(self) -> str:
        """The holder, as `acquire` last read it: `pid N`."""
        return f"pid {self.holder}" if self.holder.isdigit() else "pid unknown"

    def busy(self, flag: str = "--out") -> str:
        """The one line that says who holds the lock, and the fix."""
        return (f"{flag}: {self.target} is being written by another trainmem ({self.who()}, lock {self.path}); "
                f"wait for it to finish, or pass another {flag}")


def folder_problem(folder: str | Path, flag: str) -> str | None:
    """Why files cannot be written in `folder` (made when missing): the nearest folder that exists, it or
    one above it, must be a folder this process can create a file in (tried, not guessed from the mode
    bits, which root ignores). One line naming `flag` and the fix; None when fine."""
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag}: {existing} is a file, not a folder; pass {flag} a path in a folder"
    try:
        fd, name = tempfile.mkstemp(dir=existing, prefix=".trainmem-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        return f"{flag}: cannot write in {existing} ({e.strerror}); pass {flag} a path in a folder you can write"
    return None


def out_problems(path: str | Path, flag: str = "--out") -> list[str]:
    """Why rows cannot be appended to the JSONL file `path`, checked before any work: a folder, a file or a
    folder that cannot be written, or another trainmem writing it now. One line per problem naming `flag`."""
    p = Path(path)
    if p.is_dir():
        return [f"{flag}: {p} is a folder; pass a file in it, e.g. {flag} {p / 'results.jsonl'}"]
    if p.exists():
        try:
            open(p, "ab").close()
        except OSError as e:
            return [f"{flag}: cannot write to {p} ({e.strerror}); pass {flag} a file you can write"]
    else:
        problem = folder_problem(p.parent, flag)
        if problem:
            return [problem]
    if p.parent.is_dir():
        lock = OutLock(p)
        if not lock.acquire():
            return [lock.busy(flag)]
        lock.release()
    return []
