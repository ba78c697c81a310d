"""The tables and figures docs/ and the README quote, rendered from the code and the committed tables:

    python benchmarks/docs_tables.py            # rewrite every generated block in place
    python benchmarks/docs_tables.py --check    # exit 1 where a block differs from what it renders now

The command line of `lab/docs.py`, which holds the blocks (`BLOCKS`: each block's file and what
renders it) and says where each figure comes from; tests/regression/test_docs.py fails until the docs are
what it renders. Reads no GPU and runs no estimate: a few seconds.
"""

from __future__ import annotations

import os
import sys

# this checkout's code renders this checkout's docs, whichever trainmem is installed
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's lab/
from lab.docs import refresh  # noqa: E402


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = refresh(rewrite=not check)
    print("\n".join(stale) or "every generated block is current")
    return 1 if stale and check else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
