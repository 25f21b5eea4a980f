"""`python -m cec.cli`: the `cec` command."""

import sys

from cec.cli.main import main

sys.exit(main())
