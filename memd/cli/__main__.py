"""`python -m memd.cli`: the same entry point as the `memd` command."""

import sys

from memd.cli.main import main

sys.exit(main())
