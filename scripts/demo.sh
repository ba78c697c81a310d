#!/usr/bin/env bash
# trainmem's main job on its built-in default, the README's first set-up command: the chapter's seven runs
# (EleutherAI/polyglot-ko-1.3b on a T4, see the README) estimated on the T4, and with a CUDA GPU also measured,
# each under a T4 cap; then the report of both, side by side, in trainmem-out/chapter-report/.
# Uses .venv/bin/trainmem where the README's command installed it, else the trainmem on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
trainmem=.venv/bin/trainmem
[ -x "$trainmem" ] || trainmem=trainmem
"$trainmem" sweep --preset chapter --gpu T4 --resume --out trainmem-out/chapter.jsonl
"$trainmem" report trainmem-out/chapter.jsonl --gpu T4 --out trainmem-out/chapter-report
