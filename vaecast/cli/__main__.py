"""`python -m vaecast.cli`, as `python -m vaecast` and the `vaecast` command."""

import sys

from vaecast.cli import main

sys.exit(main())
