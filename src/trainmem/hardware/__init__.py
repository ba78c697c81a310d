"""The cards: the catalog with each figure's source (`gpus`), and every behaviour of CUDA the estimate and the
emulation model, decided once (`cuda`). The lowest layer: imports nothing else of trainmem."""
