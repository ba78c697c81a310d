"""The simulate method for `--shard fsdp`: rank 0 of the N-rank FSDP2 step, with no GPU and no storage.

The model is built on the meta device and wrapped as `trainmem run` wraps it (`trainmem.fsdp.shard_model`:
`fully_shard` per decoder layer and on the root, the precision's MixedPrecisionPolicy) inside PyTorch's
fake process group of N ranks; then, under `FakeTensorMode`, its sharded parameters are materialised
on the (fake) CPU device and `simulate.simulate_step` runs its optimizer steps (`STEPS`) under the TensorLedger,
which follows FSDP2's sharded and unsharded storages through the same hooks as the gloo and fake-group
runs (`trainmem.fsdp.follow_fsdp_storage`). The group is destroyed when the simulation ends.

Why fake CPU tensors and not meta ones: FSDP2 refuses meta parameters at its first forward
(`FSDPParamGroup._validate_no_meta_params`, "FSDP parameters should be materialized from meta device
before training"), and its all-gather / reduce-scatter buffers and the inputs it moves are placed on the
mesh's device type, which must be a real one (`init_device_mesh("meta")` has no device handle): with the
check patched out, the forward fails copying a meta buffer onto the CPU. Fake tensors carry a CPU device
and no storage, and the fake group's collectives accept them.
"""

from __future__ import annotations

from typing import Any

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.measure.ledger import StateBytes, TensorLedger

from . import states, zero
from .simulate import simulate_step


def simulates(setup: TrainSetup) -> bool:
    """Which sharded setups the simulate method runs: FSDP2 without offload or QLoRA (here), and ZeRO-1/2 ranks,
    whose forward and backward are one GPU's (`zero.py`); the rest stay analytic."""
    return (setup.shard == "fsdp" and setup.offload == "none" and setup.peft != "qlora") or zero.simulates(setup)


def simulate_fsdp_rank(spec: ModelSpec, setup: TrainSetup, precision: str,
                       rank: int = 0, splits: bool = False) -> tuple[TensorLedger, StateBytes]:
    """The ledger of rank `rank`'s simulated step of the `setup.shard_group`-rank FSDP2 run (the world, or under
    HSDP a node), and the rank's
    weights, gradients and optimizer states after its last optimizer step."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from trainmem.fsdp import fake_group, follow_fsdp_storage, shard_model

    with fake_group(rank, setup.shard_group):  # HSDP: a rank holds what a rank of its node's FSDP holds
        model = shard_model(states.meta_model(spec, setup, precision), setup.shard_group, precision, "cpu")

        def build(ledger: TensorLedger) -> Any:
            return model.to_empty(device="cpu")  # this rank's shards, allocated under the ledger

        # meta tensors (the sharded parameters before to_empty) enter the fake mode as inputs
        with FakeTensorMode(allow_non_fake_inputs=True):
            return simulate_step(build, setup, precision, device="cpu", follow=follow_fsdp_storage, splits=splits)
