"""Every catalog card at once: the estimate of one setup on each card, from one simulated step per runtime group.

    >>> import trainmem
    >>> from trainmem.estimator.cards import estimate_cards
    >>> spec, setup = trainmem.load_setup("polyglot-ko-1.3b", {"precision": "fp16", "batch_size": 16})
    >>> answers = estimate_cards(spec, setup, ["T4", "A100-40GB", "H100-80GB"])   # 3 simulations, not 3 x 18
    >>> answers["T4"].verdict("T4")["level"], answers["A100-40GB"].verdict("A100-40GB")["level"]
    ('no', 'fits')

`trainmem.estimate(spec, setup.replace(gpu=card))` models the card's runtime, and cards differ in the
simulated step only through it: the cuBLAS workspace per handle (`GPU.cublas_workspace`), whether flash SDPA
runs (`GPU.flash`) and, under QLoRA, transformers' warm-up allocation, which is capped at the card's capacity
(`quantized.warmup_bytes`). Cards alike in those form a runtime group (the T4 and V100s; the other pre-Hopper
cards; the H100 and H200), and one simulated step serves the group. What is each card's own is cheap: the
allocator replay of that step under the card's cap (`TrainSetup.cap_bytes`, 10-50 ms) and everything the
analytic estimate of the same setup on that card already holds, which is the same under both methods (model
states, the memory outside the allocator, the predicted step time, the setup and the model). The Breakdown
per card is composed from the two as `estimate` composes it; `tests/test_cards.py` checks it equals
`estimate(spec, setup.replace(gpu=card))` for the chapter's setups on every card.

`largest_batches` is `trainmem max-batch`'s search on the analytic estimate for every card, each batch
estimated once per runtime group (the analytic reserved bytes depend on the card only through its runtime;
each card judges them with `Breakdown.fits`).

Limitations: a model the analytic method does not know (`analytic.Traits`) is estimated card by card, one
simulation each; so is a setup whose notes are worded by the simulation (see `FSDP_NOTE`, copied from
`estimator._simulate`, which the equality test guards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..errors import SetupError
from ..gpus import CATALOG, GPU, find_gpu
from ..setup import TrainSetup
from ..specs import ModelSpec
from . import METHODS, _replay, analytic, estimate, quantized, runtime, sharded, states
from .breakdown import Breakdown
from .simulate import model_builder, simulate_step, steady_start

FSDP_NOTE = ("simulated: rank 0 of {gpus}, FSDP2 under PyTorch's fake process group on fake CPU tensors; "
             "not modelled: NCCL's buffers, overlap of communication with compute")
"""`estimator._simulate`'s note for a simulated FSDP2 rank, word for word."""

def cards_of(cards: Iterable[str | GPU] | None) -> list[GPU]:
    """The cards named (every catalog card when None), as records; SetupError for a name that is none."""
    out, problems = [], []
    for c in CATALOG.values() if cards is None else cards:
        card = c if isinstance(c, GPU) else find_gpu(c)
        if card is None:
            problems.append(f"--gpu: unknown card {c!r}; known: {', '.join(CATALOG)}")
        else:
            out.append(card)
    if problems:
        raise SetupError(problems)
    return out


def simulates(setup: TrainSetup, method: str) -> bool:
    """Whether `estimate(.., method)` simulates this setup (as its own dispatch decides)."""
    if method == "analytic":
        return False
    return (setup.gpus == 1 and setup.shard == "none") or sharded.simulates(setup)


def analytic_knows(spec: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the analytic method knows the model's modules; where it does not, `estimate` simulates instead,
    so an 'analytic' answer costs seconds, not milliseconds."""
    setup = setup.resolved(spec)
    try:
        analytic.Traits.of(states.inventory(spec, setup, setup.resolved_precision(spec, "cuda")).model)
    except ValueError:
        return False
    return True


def runtime_key(card: GPU) -> tuple[int, bool]:
    """What the analytic estimate takes from the card's runtime: the cuBLAS workspace and the flash kernel."""
    return card.cublas_workspace, card.flash


def groups(spec: ModelSpec, setup: TrainSetup, cards: Iterable[str | GPU] | None = None) -> list[list[GPU]]:
    """The cards in runtime groups whose simulated step is the same, in catalog order: by `runtime_key`, and
    under QLoRA by the warm-up allocation the card caps; one group for FSDP2, which simulates no card."""
    cards = cards_of(cards)
    setup = setup.resolved(spec)
    if setup.shard == "fsdp":
        return [cards] if cards else []
    warmup = None
    if setup.peft == "qlora":
        precision = setup.resolved_precision(spec, "cuda")
        base = states.meta_model(spec, setup.replace(peft="none"), precision)
        warmup = quantized.warmup_bytes(base, states.quantizable(base))
    by: dict[tuple[Any, ...], list[GPU]] = {}
    for card in cards:
        capped = None if warmup is None else min(warmup, card.capacity - quantized.WARMUP_HEADROOM)
        by.setdefault((*runtime_key(card), capped), []).append(card)
    return list(by.values())


def estimate_cards(spec: ModelSpec | str, setup: TrainSetup, cards: Iterable[str | GPU] | None = None,
                   method: str = "auto") -> dict[str, Breakdown | SetupError]:
    """card name -> what `estimate(spec, setup.replace(gpu=card), method)` returns, or the SetupError it raises
    (bf16 on a card without it), for each of `cards` (the whole catalog when None), in their order. A
    simulated setup costs one simulated step per runtime group (`groups`), not one per card."""
    spec = ModelSpec.resolve(spec) if isinstance(spec, str) else spec
    if method not in METHODS:
        raise SetupError([f"--method: {method!r} is not one of {', '.join(METHODS)}"])
    cards = cards_of(cards)
    setup = setup.replace(gpu=None).validate(spec)
    composed = simulates(setup, method) and analytic_knows(spec, setup)
    out: dict[str, Breakdown | SetupError] = {}
    for card in cards:
        try:
            out[card.name] = estimate(spec, setup.replace(gpu=card.name), "analytic" if composed else method)
        except SetupError as e:
            out[card.name] = e
    if not composed:
        return out
    for group in groups(spec, setup, [c for c in cards if isinstance(out[c.name], Breakdown)]):
        ledger = _simulated_step(spec, setup, group[0])
        for card in group:
            answer = out[card.name]
            assert isinstance(answer, Breakdown)
            out[card.name] = _compose(answer, ledger, spec, setup.replace(gpu=card.name))
    return out


def _simulated_step(spec: ModelSpec, setup: TrainSetup, card: GPU) -> Any:
    """The ledger of `estimator._simulate`'s step for `card`'s runtime group."""
    setup = setup.replace(gpu=card.name).validate(spec)
    precision = setup.resolved_precision(spec, "cuda")
    if setup.shard == "fsdp":
        return sharded.simulate_fsdp_rank(spec, setup, precision)[0]
    return simulate_step(model_builder(spec, setup, precision, card), setup, precision,
                         workspace=card.cublas_workspace, flash=card.flash)[0]


def _compose(a: Breakdown, ledger: Any, spec: ModelSpec, setup: TrainSetup) -> Breakdown:
    """The simulate method's Breakdown on `setup.gpu`: the group's simulated step replayed under this card's cap,
    the rest from `a`, the analytic estimate of the same setup on this card (as `estimate` composes them)."""
    setup = setup.validate(spec)
    card = find_gpu(setup.gpu)  # type: ignore[arg-type]
    precision = setup.resolved_precision(spec, "cuda")
    notes: list[str] = [FSDP_NOTE.format(gpus=setup.gpus)] if setup.shard == "fsdp" else []
    reserved, blocks = _replay(ledger.events or [], steady_start(ledger), setup.cap_bytes(precision), notes)
    memory = dict(ledger.peak_split)
    memory["peak_allocated"] = max(ledger.peak, blocks or 0)
    memory["other"] += memory["peak_allocated"] - ledger.peak
    assert card is not None
    terms = {"simulated_peak": ledger.peak, "cublas_workspace": runtime.CUBLAS_HANDLES * card.cublas_workspace,
             "replayed_reserved": reserved}
    paged = a.memory["device_used"] - a.memory["peak_reserved"] - a.device_overhead
    if setup.optimizer == "paged-adamw-8bit":
        memory["peak_allocated"] -= memory["optimizer"]
        memory["optimizer"] = 0
    else:
        terms["analytic_reserved"] = a.memory["peak_reserved"]
    memory["peak_reserved"] = reserved
    memory["device_used"] = reserved + a.device_overhead + paged
    phase = "optimizer step" if ledger.peak_phase.endswith("optimizer") else "forward/backward"
    # estimate's notes: the setup's, then the method's, then the step time's and the versions'; the analytic
    # estimate of a sharded setup says it was modelled analytically, which the simulated one was not
    split = next((i for i, n in enumerate(a.notes) if n.startswith(("time:", "no step time", "installed "))),
                 len(a.notes))
    analytic_only = f"--shard {setup.shard}: modelled by the analytic method only"
    before = tuple(n for n in a.notes[:split] if not n.startswith(analytic_only))
    return Breakdown("simulate", memory, dict(a.model_states), phase, dict(a.setup), dict(a.model),
                     a.device_overhead, terms, (*before, *notes, *a.notes[split:]), dict(a.env),
                     None if a.time is None else dict(a.time))


def largest_batches(spec: ModelSpec, setup: TrainSetup, cards: Iterable[str | GPU] | None = None,
                    margin: float = 0.02) -> dict[str, int]:
    """card name -> the largest micro-batch whose analytic estimate fits it (0: none; a card that cannot run the
    setup, e.g. bf16 on a T4, is left out), searched as `trainmem max-batch` searches the estimate."""
    setup = setup.replace(gpu=None).validate(spec)
    out: dict[str, int] = {}
    for group in _analytic_groups(cards_of(cards)):
        out.update(_largest_in_group(spec, setup, group, margin))
    return out


def _largest_in_group(spec: ModelSpec, setup: TrainSetup, group: list[GPU], margin: float) -> dict[str, int]:
    """Each card's search, every batch estimated once for the group (on its first card's runtime)."""
    from ..maxbatch import largest

    seen: dict[int, Breakdown | None] = {}

    def at(b: int) -> Breakdown | None:
        if b not in seen:
            try:
                seen[b] = estimate(spec, setup.replace(batch_size=b, gpu=group[0].name), "analytic")
            except SetupError:
                seen[b] = None
        return seen[b]

    def fits(card: GPU) -> Callable[[int], bool]:
        return lambda b: (found := at(b)) is not None and found.fits(card, margin)

    return {card.name: largest(fits(card)) for card in group if not setup.replace(gpu=card.name).problems(spec)}


def _analytic_groups(cards: list[GPU]) -> list[list[GPU]]:
    by: dict[tuple[int, bool], list[GPU]] = {}
    for card in cards:
        by.setdefault(runtime_key(card), []).append(card)
    return list(by.values())


__all__ = ["estimate_cards", "largest_batches", "groups", "simulates", "analytic_knows", "cards_of", "runtime_key"]
