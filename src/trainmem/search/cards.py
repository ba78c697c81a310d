"""Every catalog card at once: the estimate of one setup on each card, from one simulated step per runtime group.

    >>> import trainmem
    >>> from trainmem.search.cards import estimate_cards
    >>> spec, setup = trainmem.load_setup("polyglot-ko-1.3b", {"precision": "fp16", "batch_size": 16})
    >>> answers = estimate_cards(spec, setup, ["T4", "A100-40GB", "H100-80GB"])   # 3 simulations, not 3 x 18
    >>> answers["T4"].verdict("T4")["level"], answers["A100-40GB"].verdict("A100-40GB")["level"]
    ('no', 'fits')

`trainmem.estimate(spec, setup.replace(gpu=card))` models the card's runtime, and cards differ in the
simulated step only through it: the cuBLAS workspace per handle (`GPU.cublas_workspace`), whether flash SDPA
runs (`GPU.flash`) and, under QLoRA, transformers' warm-up allocation, which is capped at the card's capacity
(`quantized.warmup_bytes`). Cards alike in all but the workspace form a runtime group (the T4 and V100s, without
the flash kernel; every other card), and one simulated step serves the group: the workspace is two allocations of
the step, resized for each card (`workspace.with_workspace`, exact; where the resize would move the peak to
another event, that card's step is simulated). What is each card's own is cheap: the allocator replay of that
step under the card's cap (`TrainSetup.cap_bytes`, 10-50 ms), the analytic terms (milliseconds) and the step time
(counted once per shape). Each card's Breakdown is `estimate`'s own, given the group's step
(`estimate(..., step=...)`); `tests/slow/test_estimate_cards.py` checks it equals
`estimate(spec, setup.replace(gpu=card))` for the chapter's setups on every card.

`largest_batches` is `trainmem max-batch`'s search on the analytic estimate for every card, each batch
estimated once per runtime group (the analytic reserved bytes depend on the card only through its runtime;
each card judges them with `Breakdown.fits`).

Limitations: a model the analytic method does not know (`analytic.Traits`) is estimated card by card, one
simulation each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.estimator import METHODS, estimate, reads_sms, simulated_only, simulated_step
from trainmem.estimator.breakdown import Breakdown
from trainmem.estimator.memory import analytic, quantized, sharded, states
from trainmem.estimator.memory.workspace import with_workspace
from trainmem.hardware.gpus import CATALOG, GPU, find_gpu, gpu_problem

from .maxbatch import largest


def cards_of(cards: Iterable[str | GPU] | None) -> list[GPU]:
    """The cards named (every catalog card when None), as records; SetupError for a name that is none."""
    out, problems = [], []
    for c in CATALOG.values() if cards is None else cards:
        card = c if isinstance(c, GPU) else find_gpu(c)
        if card is None:
            problems.append(gpu_problem(str(c)) or f"--gpu: unknown card {c!r}")
        else:
            out.append(card)
    if problems:
        raise SetupError(problems)
    return out


def simulates(setup: TrainSetup, method: str) -> bool:
    """Whether `estimate(.., method)` simulates this setup (as its own dispatch decides)."""
    if method == "analytic":
        return False
    return not setup.distributed or sharded.simulates(setup)


def analytic_knows(spec: ModelSpec, setup: TrainSetup) -> bool:
    """Whether the analytic method knows the model's modules; where it does not, `estimate` simulates instead,
    so an 'analytic' answer costs seconds, not milliseconds."""
    setup = setup.resolved(spec)
    try:
        analytic.Traits.of(states.inventory(spec, setup, setup.resolved_precision(spec, "cuda")).model)
    except ValueError:
        return False
    return True


def runtime_key(card: GPU, setup: TrainSetup | None = None) -> tuple[int, ...]:
    """What an estimate takes from the card's runtime: the cuBLAS workspace and the flash kernel, and the SM count
    where `setup`'s simulated kernels read it (`reads_sms`)."""
    return (card.cublas_workspace, card.flash, *((card.sms,) if setup is not None and reads_sms(setup) else ()))


def groups(spec: ModelSpec, setup: TrainSetup, cards: Iterable[str | GPU] | None = None) -> list[list[GPU]]:
    """The cards in runtime groups that one simulated step serves, in catalog order: by `runtime_key` but for the
    cuBLAS workspace (`workspace.with_workspace` resizes it in the step), and under QLoRA by the warm-up
    allocation the card caps; one group for FSDP2, which simulates no card."""
    cards = cards_of(cards)
    setup = setup.resolved(spec)
    if setup.shard == "fsdp":
        return [cards] if cards else []
    warmup, sms = None, reads_sms(setup)
    if setup.peft == "qlora":
        precision = setup.resolved_precision(spec, "cuda")
        base = states.meta_model(spec, setup.replace(peft="none"), precision)
        warmup = quantized.warmup_bytes(base, states.quantizable(base))
    by: dict[tuple[Any, ...], list[GPU]] = {}
    for card in cards:
        capped = None if warmup is None else min(warmup, card.capacity - quantized.WARMUP_HEADROOM)
        by.setdefault((card.flash, card.sms if sms else None, capped), []).append(card)
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
    composed = simulates(setup, method) and not simulated_only(setup) and analytic_knows(spec, setup)
    out: dict[str, Breakdown | SetupError] = {}
    for card in cards:
        try:
            out[card.name] = estimate(spec, setup.replace(gpu=card.name), "analytic" if composed else method)
        except SetupError as e:
            out[card.name] = e
    if not composed:
        return out
    for group in groups(spec, setup, [c for c in cards if isinstance(out[c.name], Breakdown)]):
        steps: dict[int, Any] = {}  # by the card's cuBLAS workspace: the group's first step, resized
        for card in group:
            ws = 0 if setup.shard == "fsdp" else card.cublas_workspace  # an FSDP2 rank simulates no card's
            if ws not in steps:
                step = with_workspace(steps[next(iter(steps))], ws) if steps else None
                if step is None:  # the group's first card, or a peak the resize moves: simulated on this card
                    this = setup.replace(gpu=card.name).validate(spec)
                    step = simulated_step(spec, this, this.resolved_precision(spec, "cuda"), card)
                steps[ws] = step
            out[card.name] = estimate(spec, setup.replace(gpu=card.name), method, step=steps[ws])
    return out


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
    by: dict[tuple[int, ...], list[GPU]] = {}
    for card in cards:
        by.setdefault(runtime_key(card), []).append(card)
    return list(by.values())


__all__ = ["estimate_cards", "largest_batches", "groups", "simulates", "analytic_knows", "cards_of", "runtime_key"]
