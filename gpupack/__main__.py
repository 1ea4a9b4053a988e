"""`python -m gpupack ...` is the `gpupack` command."""

import sys

from gpupack.cli import main

sys.exit(main())
