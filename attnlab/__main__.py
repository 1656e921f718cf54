"""`python -m attnlab ...` (also what `torchrun -m attnlab` launches)."""

import sys

from attnlab.cli import main

sys.exit(main())
