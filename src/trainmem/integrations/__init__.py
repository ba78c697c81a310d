"""trainmem inside other people's training code: `MemoryCallback` for a transformers `Trainer`."""

from .trainer import MemoryCallback, spec_of

__all__ = ["MemoryCallback", "spec_of"]
