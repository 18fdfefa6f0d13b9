import sys

from streams.tools.cli import main

sys.exit(main())
