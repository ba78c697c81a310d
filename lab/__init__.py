"""The lab: trainmem checked against the world it models. Not part of the package (the wheel ships src/trainmem
only); tests import it from the checkout's root and benchmarks/ scripts are its command lines:

- `manifest` (with `sets.json`): every committed measurement set, its GPU, held out or in-sample, and where
  and when it was reported;
- `repository`: where the checkout's docs/ are;
- `timing`: measured step times, each predicted at the card it ran on; the fit and cross-validation of the
  step-time constants; the comparison table;
- `docs`: the generated blocks of README.md and docs/ and what renders each;
- `traces`: a recorded allocator trace cut into windows and replayed;
- `alignment`: the matmul-alignment micro-benchmark's measurement;
- `registry`: every causal-LM type of the installed transformers through trainmem.

Nothing is imported here: each module is imported by name."""
