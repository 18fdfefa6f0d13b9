"""`python -m streams.contracts`: regenerate (or `--check`) the artefacts for other languages."""

import sys

from streams.contracts.languages import main

sys.exit(main())
