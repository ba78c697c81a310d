"""Validation of trainmem against the world it models, reusable by tests and by benchmarks/ (whose scripts are
the command lines over these modules):

- `repository`: where the repository's docs/ are (validation reads the measurements committed there);
- `timing`: measured step times from committed rows, each predicted at the card it ran on; the fit and the
  cross-validation of the step-time constants; the comparison table;
- `docs`: the generated blocks of README.md and docs/ and what renders each;
- `traces`: a recorded allocator trace cut into windows and replayed;
- `alignment`: the matmul-alignment micro-benchmark's measurement;
- `registry`: every causal-LM type of the installed transformers.

Nothing is imported here: each module is imported by name."""
