"""`python -m trainmem.cli`: the same as the `trainmem` command."""

import sys

from . import main

sys.exit(main())
