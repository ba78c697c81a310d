"""A local web page: a setup answered on every catalog card at once, live, with plan and reports.

Starts a web server (default http://127.0.0.1:7860, this machine only) whose page asks for a model, a
fine-tuning method, precision, optimizer, batch, sequence length, checkpointing and GPUs, and shows every
card of the catalog at once: fits / tight / no with headroom, the largest micro-batch, the predicted step
time, the smallest card that fits; the chosen card's breakdown; `plan` on it; and `trainmem report` for a
dropped JSONL. Analytic numbers come at once, simulated ones replace them as they finish (docs/guide/serve.md).
"""

from __future__ import annotations

import argparse
import sys


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 serves the network)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860, as a Hugging Face Space)")
    p.add_argument("--workers", type=int, default=2, metavar="N",
                   help="processes that simulate and plan in the background (default 2)")


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from ..serve import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"trainmem serve: listening on {args.host}: anyone who can reach this machine can use the page",
              file=sys.stderr)
    print(f"trainmem serve: http://{args.host}:{args.port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
    uvicorn.run(create_app(processes=max(1, args.workers)), host=args.host, port=args.port, log_level="warning",
                timeout_graceful_shutdown=5)
    return 0
