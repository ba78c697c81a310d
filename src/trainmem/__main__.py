"""`python -m trainmem`: the same as the `trainmem` command."""

import sys

from .cli import main

sys.exit(main())
