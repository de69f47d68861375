"""`python -m shoal.cli`: the `shoal` command."""

import sys

from shoal.cli.main import main

sys.exit(main())
