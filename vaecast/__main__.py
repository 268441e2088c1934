import sys

from vaecast.cli import main

sys.exit(main())
