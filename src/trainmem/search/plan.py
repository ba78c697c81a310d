"""The fastest setup that fits: search micro-batch x accumulation (and what else the user allows) on the
estimate, keep what fits the card, rank by the predicted step time.

The search is the analytic estimate (milliseconds a setup once the model's inventory is built) and the
step-time model (`estimator.timing`); the fastest, the finalists (by default every setup listed), are then
simulated, and a finalist that simulate says does not fit is dropped and the next one moves up. Every setup
reaches the target batch exactly: the micro-batch divides it. What the user does not allow stays as given, so
the answer trains the same model the same way, only faster; checkpointing is allowed by default because it
changes time and memory, never the result.

`estimate_fn` and `time_fn` are injectable so that the search can be tested against stub models.
`make_plan` is the entry point `trainmem plan` calls: the search, cut to the `top` few, and with `confirm`
the winner and the runner-up run for real; `read_flags` turns the command's own flags into its arguments.
The module imports no torch (the estimator and the runner load inside the functions that use them).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from trainmem.config.commands import describe, run_command, training_arguments
from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.gpus import (
    GPU,
    find_gpu,
    gpu_problem,
    margin_problem,
    speed_of,
    this_card,
)

if TYPE_CHECKING:  # the estimator imports torch: `trainmem --help` and `trainmem report` import this module
    from trainmem.estimator.breakdown import Breakdown

DIMENSIONS = ("checkpointing", "peft", "optimizer", "precision")
"""What `--allow` may open to the search besides micro-batch x accumulation."""
DEFAULT_ALLOW = ("checkpointing",)
ADAMS = tuple(name for name, o in OPTIMIZERS.items() if o.adam and not o.paged)
"""The Adam family: the same update rule (8-bit quantizes its states; paged states are a choice of where they
live, not of memory to save). SGD and Adafactor train differently, so they are never proposed in place of the
user's optimizer."""
PRECISIONS = ("bf16", "fp16", "amp-bf16", "amp-fp16", "fp32")
PEFTS = ("none", "lora", "qlora")
TOP = 6
"""Setups `trainmem plan` lists by default."""
FINALISTS = TOP
"""Setups confirmed by the simulate method, fastest first: by default every one listed, so that each verdict
`plan` prints is the one `trainmem estimate` gives (the analytic search misjudges some: gpt2 full fine-tuning
in amp-fp16 at 12 x 2 on the RTX-4080, 15.5 GiB by the analytic method, 21.0 GiB and `no` by simulate)."""
SIMULATE_ACCUM = 2
"""Finalists are simulated with at most this much accumulation: from the second micro-batch on, every
micro-batch holds the same memory (gradients resident), so more micro-batches repeat it."""

EstimateFn = Callable[[TrainSetup, str], "Breakdown"]
TimeFn = Callable[[TrainSetup, "Breakdown"], dict[str, float]]


@dataclass(frozen=True)
class Option:
    """One setup that fits, with its memory on the card and its predicted time."""

    setup: TrainSetup
    level: str
    """`fits`, or `tight` (fits the capacity with less than the margin free)."""
    need: int
    """Bytes the card must hold at the peak: peak reserved + the memory outside the allocator."""
    headroom: int
    """Budget (capacity less the margin) minus `need`; negative when tight."""
    step_s: float
    tokens_per_s: float
    mfu: float
    checked: str
    """The estimate method the verdict comes from: `simulate` for confirmed finalists, else `analytic`."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["setup"] = self.setup.to_dict()
        return d


@dataclass
class Plan:
    model: str
    gpu: str
    target_batch: int
    seq_len: int
    job_tokens: int | None
    """Tokens the whole job trains (None: no job given, times are per step)."""
    options: list[Option] = field(default_factory=list)
    """Fitting setups, fastest first."""
    searched: int = 0
    not_fitting: int = 0
    dropped: list[dict[str, Any]] = field(default_factory=list)
    """Finalists the analytic estimate admitted and simulate rejected, with simulate's verdict."""
    notes: list[str] = field(default_factory=list)
    confirmed: list[dict[str, Any]] = field(default_factory=list)
    """With `confirm`: the winner and the runner-up run for real, measured against predicted step time."""

    def job_s(self, option: Option) -> float | None:
        """Seconds for the job: its optimizer steps (the last one may be partial, counted whole)."""
        if self.job_tokens is None:
            return None
        return math.ceil(self.job_tokens / (self.target_batch * self.seq_len)) * option.step_s

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "target_batch": self.target_batch, "seq_len": self.seq_len,
                "job_tokens": self.job_tokens, "searched": self.searched, "not_fitting": self.not_fitting,
                "options": [{**o.to_dict(), "job_s": self.job_s(o), "command": run_command(self.model, o.setup),
                             "training_arguments": training_arguments(o.setup)} for o in self.options],
                "dropped": self.dropped, "notes": self.notes, "confirmed": self.confirmed}


def job_tokens(tokens: int | None, epochs: float | None, dataset_size: int | None, seq_len: int) -> int | None:
    """Tokens of the job: `tokens`, or epochs x dataset_size samples of `seq_len` tokens."""
    if tokens is not None:
        return tokens
    if epochs is not None and dataset_size is not None:
        return math.ceil(epochs * dataset_size) * seq_len
    return None


def grid(base: TrainSetup, target: int, allow: Iterable[str], card: GPU) -> list[TrainSetup]:
    """Every setup the search considers: each micro-batch dividing `target` (accumulation makes up the
    rest), times the allowed dimensions; precisions only where the card runs them (no bf16 before sm80)."""
    allow = set(allow)
    micro = [d for d in range(1, target + 1) if target % d == 0]
    ckpt = (False, True) if "checkpointing" in allow else (base.checkpointing,)
    pefts = PEFTS if "peft" in allow else (base.peft,)
    optimizers = tuple(dict.fromkeys((base.optimizer, *ADAMS))) if "optimizer" in allow else (base.optimizer,)
    precisions = (tuple(p for p in PRECISIONS if card.bf16 or "bf16" not in p) if "precision" in allow
                  else (base.precision,))
    return [base.replace(batch_size=b, grad_accum=target // b, checkpointing=c, peft=p, optimizer=o, precision=x)
            for p in pefts for x in precisions for o in optimizers for c in ckpt for b in micro]


def _default_time(setup: TrainSetup, b: Breakdown) -> dict[str, float]:
    return b.time or {}


def search(spec: ModelSpec, base: TrainSetup, card: GPU, target: int, allow: Iterable[str] = DEFAULT_ALLOW,
           margin: float = 0.02, finalists: int = FINALISTS, job: int | None = None,
           estimate_fn: EstimateFn | None = None, time_fn: TimeFn | None = None, every: bool = False) -> Plan:
    """The fitting setups of `grid`, fastest first; the first `finalists` confirmed by simulate. Unless
    `every`, only the fastest micro-batch of each way to train (method, checkpointing, optimizer, precision)
    is kept, so that the list shows the trade-offs rather than five micro-batches of one."""
    if target < 1:
        raise SetupError([f"--target-batch: expected a whole number >= 1, got {target}"])
    from trainmem.estimator import estimate

    if time_fn is None and speed_of(card) is None:
        raise SetupError([f"--gpu: the catalog has no speed figures for the {card.name} (gpus.SPEEDS), so plan "
                          "cannot rank setups by time; pass a catalog card of the same kind"])
    parallel = None if estimate_fn else (lambda setups: _simulate_in_parallel(spec, setups))
    estimate_fn = estimate_fn or (lambda s, m: estimate(spec, s, m))
    time_fn = time_fn or _default_time
    # `auto` made the checkpoint's dtype, as a CUDA run resolves it, so the command says what will run
    base = base.replace(gpu=card.name, precision=base.resolved_precision(spec, "cuda"))
    plan = Plan(spec.name, card.name, target, base.seq_len, job)
    if not card.measured:
        plan.notes.append(f"times on the {card.name} are derived from its datasheet figures with efficiencies fitted "
                          "on H200 runs (docs/time-model.md), and its host time is the H200 machine's")
    fitting: list[tuple[Option, TrainSetup]] = []
    invalid: set[str] = set()
    failed: dict[str, int] = {}
    untimed: dict[str, int] = {}
    for setup in grid(base, target, allow, card):
        problems = setup.problems(spec)
        if problems:
            invalid.update(problems)
            continue
        plan.searched += 1
        try:
            b = estimate_fn(setup, "analytic")
        except SetupError:
            raise
        except Exception as e:  # noqa: BLE001 - a setup the estimate cannot make is said, never a "does not fit"
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            failed[why] = failed.get(why, 0) + 1
            continue
        v = b.verdict(card, margin)
        t = time_fn(setup, b) if v["level"] != "no" else {}
        if v["level"] == "no":
            plan.not_fitting += 1
        elif not t.get("step_s"):
            why = next((n for n in b.notes if n.startswith("no step time")), "no step time")
            untimed[why] = untimed.get(why, 0) + 1
        else:
            option = Option(setup, v["level"], v["need"], v["headroom"], t["step_s"], t.get("tokens_per_s", 0.0),
                            t.get("mfu", 0.0), "analytic")
            fitting.append((option, setup))
    if invalid and not plan.searched:
        raise SetupError(sorted(invalid))
    plan.notes += [f"not searched: {p}" for p in sorted(invalid)]
    plan.notes += [f"{n} setups could not be estimated ({why})" for why, n in failed.items()]
    plan.notes += [f"{n} setups fit but are not ranked: {why}" for why, n in untimed.items()]
    # near-ties (equal to 3 significant digits) go to the setup that changes less of what the user gave
    fitting.sort(key=lambda o: (float(f"{o[0].step_s:.3g}"), _changes(o[1], base), o[0].level != "fits", o[0].need))
    plan.options = _confirm(fitting, card, margin, finalists, estimate_fn, plan, every, parallel)
    return plan


def family(s: TrainSetup) -> tuple:
    """The kind of setup a row of the plan stands for: method, checkpointing, precision (micro-batch,
    accumulation and optimizer are what the row picks the fastest of)."""
    return (s.peft, s.checkpointing, s.precision)


def _changes(s: TrainSetup, base: TrainSetup) -> int:
    return sum(getattr(s, f) != getattr(base, f) for f in ("peft", "checkpointing", "optimizer", "precision"))


def _simulated(setup: TrainSetup) -> TrainSetup:
    return setup.replace(grad_accum=min(setup.grad_accum, SIMULATE_ACCUM))


def _confirm(fitting: list[tuple[Option, TrainSetup]], card: GPU, margin: float, finalists: int,
             estimate_fn: EstimateFn, plan: Plan, every: bool,
             parallel: Callable[[list[TrainSetup]], dict[str, Breakdown]] | None = None) -> list[Option]:
    """Simulate the fastest until `finalists` are confirmed; a rejected one is dropped and the next moves up
    (under `every=False`, the next of its own family can take its place). `parallel` simulates the likely
    finalists at once beforehand (each simulation takes seconds; the rest of the plan, milliseconds)."""
    out: list[Option] = []
    confirmed = 0
    families: set[tuple] = set()
    likely: dict[tuple, TrainSetup] = {}
    for _, setup in fitting:
        if len(likely) < finalists and (every or family(setup) not in likely):
            likely[family(setup) if not every else (repr(setup),)] = _simulated(setup)
    done = parallel(list(likely.values())) if parallel and len(likely) > 1 else {}
    for option, setup in fitting:
        if not every and family(setup) in families:
            continue
        if confirmed >= finalists:
            families.add(family(setup))
            out.append(option)
            continue
        simulated = _simulated(setup)
        b = done.get(repr(simulated)) or estimate_fn(simulated, "simulate")
        v = b.verdict(card, margin)
        if v["level"] == "no":
            plan.dropped.append({"setup": setup.to_dict(), "analytic": option.level, "simulate": v["level"],
                                 "need": v["need"]})
            continue
        out.append(Option(setup, v["level"], v["need"], v["headroom"], option.step_s, option.tokens_per_s,
                          option.mfu, "simulate"))
        families.add(family(setup))
        confirmed += 1
    return out


def _simulate_one(spec: ModelSpec, setup: TrainSetup) -> Breakdown:
    import torch

    from trainmem.estimator import estimate

    torch.set_num_threads(1)
    return estimate(spec, setup, "simulate")


def _simulate_in_parallel(spec: ModelSpec, setups: list[TrainSetup]) -> dict[str, Breakdown]:
    """Simulate `setups` in forked processes (the parent's imports and inventories come along); an empty
    answer where forking is not available, so that the caller simulates them one by one."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(len(setups), mp_context=context) as pool:
            found = list(pool.map(_simulate_one, [spec] * len(setups), setups))
    except (ValueError, OSError, RuntimeError):
        return {}
    return {repr(s): b for s, b in zip(setups, found)}


def make_plan(spec: ModelSpec, base: TrainSetup, target: int, allow: Iterable[str] = DEFAULT_ALLOW,
              margin: float = 0.02, finalists: int = FINALISTS, tokens: int | None = None,
              epochs: float | None = None, dataset_size: int | None = None, top: int | None = TOP,
              every: bool = False, confirm: bool = False, searching: Callable[[str], Any] | None = None,
              confirmed: Callable[[TrainSetup, dict[str, Any]], None] | None = None) -> Plan:
    """`trainmem plan`: the fastest setups of `base` that reach the effective batch `target` on `base.gpu`
    (this machine's card when None), as `search` finds them, the `top` first (all with None).

    Args:
        tokens, or epochs with dataset_size (samples of `base.seq_len` tokens): the whole job, for its time
            (`Plan.job_s`); none of them: times per step.
        every: list every micro-batch, not only the fastest of each kind.
        confirm: run the winner and the runner-up with `trainmem.run` (needs CUDA); their measured step
            time beside the predicted one lands in `Plan.confirmed`.
        searching: a context factory given what is being done, the search and each confirming run (the CLI
            shows a spinner with it).
        confirmed: called with each confirming run's setup and its `Plan.confirmed` entry once measured.
    Raises SetupError for a card it cannot plan for, or `confirm` without CUDA.
    """
    status = searching or (lambda what: contextlib.nullcontext())
    gpu = base.gpu or this_card()
    problems = [p for p in (NO_GPU if gpu is None else gpu_problem(gpu), margin_problem(margin),
                            confirm_problem() if confirm else None) if p]
    card = find_gpu(gpu) if gpu else None
    if problems or card is None:
        raise SetupError(problems)
    job = job_tokens(tokens, epochs, dataset_size, base.seq_len)
    with status(f"planning {spec.name} on the {card.name}..."):
        plan = search(spec, base, card, target, allow, margin, finalists, job, every=every)
    plan.options = plan.options[:top]
    if confirm and plan.options:
        plan.confirmed = run_confirmations(spec, plan, status, confirmed)
    return plan


def run_confirmations(spec: ModelSpec, plan: Plan, running: Callable[[str], Any] | None = None,
                      confirmed: Callable[[TrainSetup, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the winner and the runner-up for real and set their measured step time beside the prediction for
    this machine's card (the plan's card when it is the same, else re-predicted here)."""
    from trainmem.estimator import estimate
    from trainmem.isolation.runner import run

    status = running or (lambda what: contextlib.nullcontext())
    here = this_card()
    out = []
    for option in plan.options[:2]:
        setup = option.setup.replace(steps=8)
        with status(f"running {describe(setup)} on this GPU..."):
            row = run(spec, setup)
        tp = row.throughput or {}
        measured = tp.get("step_time_median_s") or tp.get("step_time_s")
        predicted = option.step_s if here == plan.gpu else (estimate(spec, setup.replace(gpu=here), "analytic").time or {}).get("step_s")
        entry = {"setup": setup.to_dict(), "status": row.status, "measured_step_s": measured,
                 "predicted_step_s": predicted, "card": here,
                 "error": (predicted - measured) / measured if measured and predicted else None}
        out.append(entry)
        if confirmed:
            confirmed(setup, entry)
    return out


NO_GPU = "--gpu: the card to plan for, e.g. --gpu T4 (with CUDA it defaults to this machine's card)"


def confirm_problem() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return ("--confirm: runs the winner and the runner-up with `trainmem run`, which needs a CUDA "
            "device, and none is visible here; drop --confirm for the plan from the estimate alone")


__all__ = ["Option", "Plan", "make_plan", "search", "grid", "family", "job_tokens", "run_confirmations",
           "confirm_problem", "DIMENSIONS", "DEFAULT_ALLOW", "FINALISTS", "TOP", "NO_GPU"]
