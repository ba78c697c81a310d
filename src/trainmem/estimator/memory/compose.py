"""A deep model's simulated step composed from the steps of cut models, so that an 80-layer model costs the
simulation of a few layers.

The simulation records every allocation and free of the step in order (`TensorLedger.events`). A model of
uniform decoder layers makes that list periodic: each phase (the build, each forward, backward and optimizer
step) holds one run of equal blocks, one block per layer. The steps of the model cut to `CUTS` = 3, 4 and 5
layers show it: the 4-layer list is the 3-layer one with one block inserted in each run (`insertions`), and
which allocation each free releases follows a rule in the block's position (the same layer's, the previous
layer's, the mirror layer's in backward; `_rule`). `compose` extends every run to the full depth with those
rules. It is used only when it reproduces a simulation it did not see: the 5-layer step composed from the 3-
and 4-layer ones must equal the simulated 5-layer step event for event (`composed_step`); where two layers
leave a rule open (an FSDP2 rank's prefetch), the 6-layer step is simulated and composed from the 4- and
5-layer ones; otherwise the whole model is simulated as before.

The peak is the composed events' own. Its split (weights, gradients, optimizer states, activations) is read
where the cut steps recorded it for each allocation (`TensorLedger.splits`), at the same place of the three
cut steps (counted from the start or the end of its run), and grown by the bytes a layer adds there, which
must be the same over the three depths; a peak in the middle of a long run, which no cut step reaches from
either end, leaves the model to be simulated whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from trainmem.forked import at_once

CUTS = (3, 4, 5)
"""Depths of the cut models simulated: two to infer the runs and rules, the third to check them (with two
layers a run can hold a single period, and which of its rules holds is left open)."""
SHARDED_FIRST = 4
"""The first depth for an FSDP2 rank, whose prefetch rules need two periods of a run to tell apart."""

UNIFORM_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "gpt_neox", "phi3", "olmo",
    "olmo2", "olmoe", "granite", "granitemoe", "stablelm", "phi", "opt", "bloom", "falcon", "gpt2", "gemma",
    "mistral3", "starcoder2", "internlm2", "cohere", "exaone", "helium", "glm", "smollm3"})
"""Model types whose decoder layers are alike when every per-layer setting of the config is (`uniform`)."""

_PER_LAYER = ("layer_types", "no_rope_layers", "layers_block_type", "block_types")
"""Config lists with one value per layer: the layers are alike where every value is."""
_INDICES = ("mlp_only_layers", "attn_layer_indices", "full_attn_idxs")
"""Config lists of the layers that differ: alike where empty."""
_SPARSE = (("decoder_sparse_step", 1), ("first_k_dense_replace", 0), ("moe_layer_freq", 1),
           ("use_sliding_window", False))


class ComposeError(Exception):
    """The steps of the cut models do not compose: the whole model is simulated instead."""


def uniform(model_type: str, config: dict[str, Any]) -> bool:
    """Whether every decoder layer of this config is built and runs alike, so that cut models compose."""
    if model_type not in UNIFORM_TYPES:
        return False
    for key in _PER_LAYER:
        values = config.get(key)
        if isinstance(values, list) and len({repr(v) for v in values}) > 1:
            return False
    if any(config.get(key) for key in _INDICES):
        return False
    for key, plain in _SPARSE:
        if config.get(key, plain) not in (plain, None):
            return False
    sliding = config.get("sliding_window")
    return not (model_type == "qwen2" and sliding and config.get("use_sliding_window"))


@dataclasses.dataclass
class Trace:
    """A step's events in a form that compares across depths: each event's signature and, for a free, the
    index of the allocation it releases."""

    sig: list[tuple]
    ref: list[int]
    marks: dict[str, int]

    @classmethod
    def of(cls, events: Iterable[tuple[Any, int]], marks: dict[str, int], holds: Iterable[Any] = ()) -> Trace:
        """`holds`: the keys of the ledger's held allocations (`TensorLedger.holds`), whose signature says so
        (`("A", n, "H")`), so that the composed step knows its own (`ComposedStep.holds`)."""
        sig: list[tuple] = []
        ref: list[int] = []
        where: dict[Any, int] = {}
        held = set(holds)
        for key, n in events:
            if isinstance(key, str):
                sig.append(("S", key, n))
                ref.append(-1)
            elif n >= 0:
                where[key] = len(sig)
                sig.append(("A", n, "H") if key in held else ("A", n))
                ref.append(-1)
            else:
                at = where.pop(key)
                sig.append(("F", sig[at][1]))
                ref.append(at)
        return cls(sig, ref, dict(marks))

    def events(self) -> list[tuple[Any, int]]:
        """The ledger's events again, an allocation's key its index plus one."""
        return [(s[1], s[2]) if s[0] == "S" else (i + 1, s[1]) if s[0] == "A" else (self.ref[i] + 1, -1)
                for i, s in enumerate(self.sig)]

    def peak(self) -> tuple[int, int]:
        """The largest live bytes of the events, and the index of the allocation that reached it."""
        live = top = at = 0
        for i, s in enumerate(self.sig):
            if s[0] == "A":
                live += s[1]
                if live > top:
                    top, at = live, i
            elif s[0] == "F":
                live -= s[1]
        return top, at


class _Hashes:
    """Prefix hashes of a signature list, so that any two stretches of it compare in constant time."""

    MOD = (1 << 61) - 1
    BASE = 1_000_003

    def __init__(self, sig: list[tuple], ids: dict[tuple, int]):
        self.h = [0]
        self.p = [1]
        for s in sig:
            self.h.append((self.h[-1] * self.BASE + ids.setdefault(s, len(ids) + 1)) % self.MOD)
            self.p.append(self.p[-1] * self.BASE % self.MOD)

    def of(self, i: int, j: int) -> int:
        """The hash of the stretch [i, j)."""
        return (self.h[j] - self.h[i] * self.p[j - i]) % self.MOD


def _common(a: _Hashes, i: int, b: _Hashes, j: int, most: int) -> int:
    """How many events from a's `i` and b's `j` on are the same, at most `most` (by bisection on the hashes)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.of(i, i + mid) == b.of(j, j + mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def insertions(small: list[tuple], big: list[tuple]) -> list[tuple[int, int]]:
    """(index in `big`, length) of the blocks that make `big` from `small`, each a repetition of the block
    before it (one more layer in a run): found where the two first differ, as the repeated block after which
    they agree longest (the shortest of those), so that a block with repeats inside it (a mixture of experts'
    layer) is taken whole."""
    ids: dict[tuple, int] = {}
    hs, hb = _Hashes(small, ids), _Hashes(big, ids)
    out: list[tuple[int, int]] = []
    i = j = 0
    while True:
        same = _common(hs, i, hb, j, min(len(small) - i, len(big) - j))
        i, j = i + same, j + same
        if j == len(big):
            break
        extra = (len(big) - j) - (len(small) - i)  # events still to insert
        best, m = -1, 0
        for size in range(1, min(j, extra) + 1):
            if hb.of(j - size, j) != hb.of(j, j + size):
                continue
            agree = _common(hs, i, hb, j + size, min(len(small) - i, len(big) - j - size))
            if i + agree == len(small) and j + size + agree == len(big):
                agree = len(big)  # both end here: nothing is left to explain
            if agree > best:
                best, m = agree, size
        if m == 0 or (best == 0 and i < len(small)):
            raise ComposeError(f"the steps differ at event {j} by more than a repeated block")
        out.append((j, m))
        j += m
    if i != len(small):
        raise ComposeError("the smaller step has events the bigger one lacks")
    return out


@dataclasses.dataclass
class _Run:
    start: int
    length: int
    periods: int

    def label(self, i: int) -> tuple[int, int] | None:
        """(period from the start, offset) of event `i` inside the run, else None."""
        k = i - self.start
        if 0 <= k < self.length * self.periods:
            return divmod(k, self.length)
        return None


def _runs(big: Trace, inserted: list[tuple[int, int]]) -> list[_Run]:
    runs: list[_Run] = []
    for j, m in inserted:
        block, start = big.sig[j:j + m], j
        bound = runs[-1].start + runs[-1].length * runs[-1].periods if runs else 0
        while start - m >= bound and big.sig[start - m:start] == block:  # runs of one block side by side:
            start -= m                                                    # each keeps its own layers
        runs.append(_Run(start, m, (j + m - start) // m))
    for a, b in zip(runs, runs[1:]):
        if a.start + a.length * a.periods > b.start:
            raise ComposeError("two runs overlap")
    return runs


def _target(trace: Trace, runs: list[_Run], i: int) -> Any:
    """What the free at `i` releases: its run position (run, period, offset), or its index outside the runs."""
    a = trace.ref[i]
    at = _locate(runs, a)
    return a if at is None else at


def _locate(runs: list[_Run], i: int) -> tuple[int, int, int] | None:
    for r, run in enumerate(runs):
        at = run.label(i)
        if at is not None:
            return r, at[0], at[1]
    return None


_FORMS: dict[str, Callable[[int, int, int, int], int]] = {
    # the target's period from the start, given the free's (t, u) and a shift d and the target run's periods p
    "t+d": lambda t, u, d, p: t + d,
    "end u+d": lambda t, u, d, p: p - 1 - (u + d),
    "mirror u+d": lambda t, u, d, p: u + d,
    "mirror end t+d": lambda t, u, d, p: p - 1 - (t + d),
    "d-t": lambda t, u, d, p: d - t,
    "end d-u": lambda t, u, d, p: p - 1 - (d - u),
}


def _rule(targets: list[Any], small: list[Any], runs: list[_Run], r: int) -> Callable[[int, int], Any]:
    """How the free at offset o of run r's period t (of p periods) finds its allocation, fitted over the big
    step's periods (`targets`) and the small step's (`small`, one period fewer in every run): a fixed event
    outside the runs, or a period of a run by one of `_FORMS`; the periods it does not explain must be the first
    or last few, where the big step's own target is kept (outside the runs) or counted from the same end (inside)."""
    p = runs[r].periods
    if all(isinstance(x, int) for x in targets) and len(set(targets)) == 1:
        fixed = targets[0]
        return lambda t, n: ("fixed", fixed)

    def hits(form: Callable[[int, int, int, int], int], r2: int, o2: int, d: int, seen: list[Any],
             fewer: int) -> list[bool]:
        q = runs[r2].periods - fewer
        return [isinstance(y, tuple) and y[0] == r2 and y[2] == o2 and form(t, len(seen) - 1 - t, d, q) == y[1]
                for t, y in enumerate(seen)]

    best: tuple[int, Any] | None = None
    for name, form in _FORMS.items():
        for t, x in enumerate(targets):
            if isinstance(x, int):
                continue
            r2, t2, o2 = x
            d = _shift(name, t, p - 1 - t, t2, runs[r2].periods)
            big = hits(form, r2, o2, d, targets, 0)
            score = sum(big) + sum(hits(form, r2, o2, d, small, 1))
            if best is None or score > best[0]:
                best = (score, (name, r2, o2, d, big))
    if best is None:
        raise ComposeError("a free in a run releases nothing that repeats")
    name, r2, o2, d, hits = best[1]
    lead = next((k for k, h in enumerate(hits) if h), p)
    tail = next((k for k, h in enumerate(reversed(hits)) if h), p)
    if lead + tail < p and not all(hits[lead:p - tail]):
        raise ComposeError("a free in a run follows no rule")
    form = _FORMS[name]

    def find(t: int, n: int) -> Any:  # n: the composed run's periods
        u = n - 1 - t
        if t < lead:
            return _edge(targets[t], runs, from_end=False)
        if u < tail:
            return _edge(targets[p - 1 - u], runs, from_end=True)
        return ("run", r2, form(t, u, d, runs[r2].periods + n - p), o2)
    return find


def _shift(name: str, t: int, u: int, t2: int, q: int) -> int:
    if name == "t+d":
        return t2 - t
    if name == "end u+d":
        return q - 1 - t2 - u
    if name == "mirror u+d":
        return t2 - u
    if name == "mirror end t+d":
        return q - 1 - t2 - t
    if name == "d-t":
        return t2 + t
    return q - 1 - t2 + u


def _edge(target: tuple[int, int, int] | int, runs: list[_Run], from_end: bool) -> Any:
    if isinstance(target, int):
        return ("fixed", target)
    r2, t2, o2 = target
    return ("end", r2, runs[r2].periods - 1 - t2, o2) if from_end else ("start", r2, t2, o2)


def compose(small: Trace, big: Trace, layers: int, big_layers: int) -> Trace:
    """The trace of `layers` layers from those of `big_layers - 1` (`small`) and `big_layers` (`big`)."""
    runs = _runs(big, insertions(small.sig, big.sig))
    extra = layers - big_layers
    if extra < 0:
        raise ComposeError("fewer layers than the cut models")
    grow = [run.length * extra for run in runs]

    def out_index(i: int) -> int:
        shift = 0
        for run, g in zip(runs, grow):
            if i >= run.start + run.length * run.periods:
                shift += g
            elif i >= run.start:
                at = run.label(i)
                assert at is not None
                return run.start + shift + at[0] * run.length + at[1]
        return i + shift

    def run_index(r: int, t: int, o: int) -> int:
        run = runs[r]
        if not 0 <= t < run.periods + extra:
            raise ComposeError("a rule points outside its run")
        return run.start + sum(grow[:r]) + t * run.length + o

    # each free's target in the big step, as a fixed index or a run position
    rules: dict[tuple[int, int], Callable[[int, int], Any]] = {}
    small_runs = [_Run(run.start - sum(x.length for x in runs[:r]), run.length, run.periods - 1)
                  for r, run in enumerate(runs)]
    for r, run in enumerate(runs):
        for o in range(run.length):
            if big.sig[run.start + o][0] != "F":
                continue
            targets = [_target(big, runs, run.start + t * run.length + o) for t in range(run.periods)]
            shift = sum(x.length for x in runs[:r])
            fewer = [_target(small, small_runs, run.start - shift + t * run.length + o) for t in range(run.periods - 1)]
            rules[(r, o)] = _rule(targets, fewer, runs, r)
    small_of = _small_index(runs, big)

    sig: list[tuple] = []
    ref: list[int] = []
    starts = {run.start: r for r, run in enumerate(runs)}
    i = 0
    while i < len(big.sig):
        if i in starts:
            r = starts[i]
            _emit_run(sig, ref, big, runs, r, extra, rules, run_index, out_index)
            i += runs[r].length * runs[r].periods
            continue
        s = big.sig[i]
        sig.append(s)
        target = big.ref[i]
        where = _locate(runs, target) if s[0] == "F" else None
        if s[0] != "F":
            ref.append(-1)
        elif where is None:
            ref.append(out_index(target))
        else:
            ref.append(run_index(where[0], _outside_period(small, small_of, i, where, runs, extra), where[2]))
        i += 1
    marks = {k: out_index(v) if v < len(big.sig) else len(sig) for k, v in big.marks.items()}
    for i, a in enumerate(ref):
        if a >= 0 and not (sig[i][0] == "F" and sig[a] == ("A", sig[i][1])):
            raise ComposeError("a composed free does not release an allocation of its size")
    return Trace(sig, ref, marks)


def _emit_run(sig: list[tuple], ref: list[int], big: Trace, runs: list[_Run], r: int, extra: int,
              rules: dict[tuple[int, int], Callable[[int, int], Any]], run_index: Callable[[int, int, int], int],
              out_index: Callable[[int], int]) -> None:
    run = runs[r]
    n = run.periods + extra
    block = big.sig[run.start:run.start + run.length]
    for t in range(n):
        for o, s in enumerate(block):
            sig.append(s)
            if s[0] != "F":
                ref.append(-1)
                continue
            found = rules[(r, o)](t, n)
            if found[0] == "fixed":
                ref.append(out_index(found[1]))
            elif found[0] in ("run", "start"):  # a period counted from its run's start
                ref.append(run_index(found[1], found[2], found[3]))
            else:
                ref.append(run_index(found[1], runs[found[1]].periods + extra - 1 - found[2], found[3]))


def _small_index(runs: list[_Run], big: Trace) -> Callable[[int], int]:
    """The small step's index of an event of the big step outside the runs (the runs have one period less)."""
    def small(i: int) -> int:
        return i - sum(run.length for run in runs if i >= run.start + run.length * run.periods)
    return small


def _outside_period(small: Trace, small_of: Callable[[int], int], i: int,
                    where: tuple[int, int, int], runs: list[_Run], extra: int) -> int:
    """The period, in the composed run, that a free outside the runs releases: counted from the start or from
    the end of its run, whichever the small step agrees with."""
    r2, t2, o2 = where
    p = runs[r2].periods
    a = small.ref[small_of(i)]
    run = runs[r2]
    k = a - (run.start - sum(x.length for x in runs[:r2]))  # the small step's run: p - 1 periods
    if not 0 <= k < run.length * (p - 1) or k % run.length != o2:
        raise ComposeError("a free outside the runs releases something else in the smaller step")
    ts = k // run.length
    if ts == t2:
        return t2
    if (p - 2) - ts == p - 1 - t2:
        return p + extra - 1 - (p - 1 - t2)
    raise ComposeError("a free outside the runs follows no end of its run")


@dataclasses.dataclass
class Recorded:
    """What composing reads of a cut model's simulated ledger (`TensorLedger`), without its tensors, so that it
    comes back from the forked process that simulated it (`forked.at_once`: the cut models at once)."""

    events: list[tuple[Any, int]] | None
    marks: dict[str, int]
    splits: dict[int, tuple[int, int, int, int]] | None
    balanced_routing: bool
    holds: list[Any] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, ledger: Any) -> Recorded:
        return cls(ledger.events, dict(ledger.marks), ledger.splits, bool(getattr(ledger, "balanced_routing", False)),
                   list(getattr(ledger, "holds", ())))


@dataclasses.dataclass
class ComposedStep:
    """What the estimate reads of a simulated step's ledger (`TensorLedger`), for the composed model."""

    events: list[tuple[Any, int]]
    marks: dict[str, int]
    peak: int
    peak_split: dict[str, int]
    peak_phase: str
    balanced_routing: bool
    holds: tuple[Any, ...] = ()
    """The keys in `events` of the held allocations (`TensorLedger.holds`: the cuBLAS workspaces)."""


MIN_LAYERS = 24
"""Models with fewer decoder layers are simulated whole: the three cut models would cost about as much."""


def composable(config: dict[str, Any], layers: int) -> bool:
    """Whether a model of this config and `layers` decoder layers is priced from cut models: deep enough to gain
    (`MIN_LAYERS`) and its layers alike (`uniform`)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return layers >= MIN_LAYERS and uniform(str(text.get("model_type", config.get("model_type"))), text)


def first_depths(first: int = CUTS[0]) -> tuple[int, int, int]:
    """The cut models `composed_step` simulates first: two to compose from, the third to check them against."""
    return first, first + 1, first + 2


def composed_step(config: dict[str, Any], layers: int, simulate: Callable[[int], Any],
                  first: int = CUTS[0], ready: dict[int, Recorded] | None = None) -> ComposedStep | None:
    """The step of the model of `layers` decoder layers composed from `simulate(k)`, the simulated ledger of
    the model cut to k layers: from the steps of `first` and `first + 1` layers, checked against the step of
    `first + 2`, and from one layer more each where those leave a rule open (once); None where the model's
    layers differ (`uniform`), it is too shallow to gain, or no two cut steps compose into the next one exactly.
    An FSDP2 rank starts at 4 layers (`SHARDED_FIRST`): its prefetch needs two periods in every run. `ready`: cut
    models simulated already, by depth (`estimator.cut_steps`: several setups' at once)."""
    if not composable(config, layers):
        return None
    ledgers: dict[int, Any] = dict(ready or {})
    traces: dict[int, Trace] = {}
    for small in (first, first + 1):
        depths = [k for k in reversed(first_depths(small)) if k not in ledgers]  # the deepest, the longest, first
        for k, ledger in zip(depths, at_once(lambda k: Recorded.of(simulate(k)), depths)):
            ledgers[k] = ledger
        for k in first_depths(small):
            if k not in traces:
                traces[k] = Trace.of(ledgers[k].events or [], ledgers[k].marks, getattr(ledgers[k], "holds", ()))
        big, check = small + 1, small + 2
        try:
            seen = compose(traces[small], traces[big], check, big)
            if (seen.sig, seen.ref, seen.marks) == (traces[check].sig, traces[check].ref, traces[check].marks):
                return _whole(traces[small], traces[big], big, [ledgers[k] for k in (small, big, check)], layers)
        except ComposeError:
            pass
    return None


def _whole(small: Trace, big: Trace, big_layers: int, ledgers: list[Any], layers: int) -> ComposedStep | None:
    """The composed step, with its peak and the peak's split. The peak is the composed events' own; its split
    (`TensorLedger.splits`) is read at the same place of the three cut steps, counted from the start or the end
    of its run, and grown by the bytes a layer adds there (equal over the three depths); where neither count
    gives that, None."""
    try:
        runs = _runs(big, insertions(small.sig, big.sig))
        whole = compose(small, big, layers, big_layers)
    except ComposeError:
        return None
    peak, at = whole.peak()
    values = []
    for place in _places(runs, big_layers, layers, at):
        found = [ledger.splits.get(place(delta)) for delta, ledger in zip((-1, 0, 1), ledgers)]
        if all(found) and all(b - a == c - b for a, b, c in zip(*found)):
            values = [c + (c - b) * (layers - big_layers - 1) for b, c in zip(found[1], found[2])]
            break
    if not values:
        return None
    weights, gradients, optimizer, activations = values
    split = {"weights": weights, "gradients": gradients, "optimizer": optimizer, "activations": activations,
             "other": max(peak - weights - gradients - optimizer - activations, 0)}
    phase = max(((i, name) for name, i in whole.marks.items() if i <= at), default=(0, "build"))[1]
    return ComposedStep(whole.events(), whole.marks, peak, split, phase,
                        any(getattr(ledger, "balanced_routing", False) for ledger in ledgers),
                        tuple(i + 1 for i, s in enumerate(whole.sig) if len(s) == 3 and s[0] == "A"))


def _places(runs: list[_Run], big_layers: int, layers: int, at: int) -> list[Callable[[int], int]]:
    """Where the composed event `at` is in the steps of `big_layers + delta` layers, as functions of delta: one
    for an event outside the runs, else one counted from its run's start and one from its end, each where the
    smallest step has that period."""
    extra = layers - big_layers
    shift = 0
    for r, run in enumerate(runs):
        start, n = run.start + shift, run.periods + extra
        if at < start:
            break
        if at < start + run.length * n:
            t, o = divmod(at - start, run.length)
            before = sum(x.length for x in runs[:r])

            def index(delta: int, period: int) -> int:
                return run.start + delta * before + period * run.length + o
            u = n - 1 - t
            out = []
            if t <= run.periods - 2:
                out.append(lambda delta, t=t: index(delta, t))
            if u <= run.periods - 2:
                out.append(lambda delta, u=u: index(delta, run.periods + delta - 1 - u))
            return out
        shift += run.length * extra
    i = at - shift  # the big step's index of an event outside the runs
    before = sum(run.length for run in runs if run.start + run.length * run.periods <= i)
    return [lambda delta: i + delta * before]
