"""`python -m attnlab ...` (also what `torchrun -m attnlab` launches)."""

import sys

from attnlab.cli.main import main

sys.exit(main())
