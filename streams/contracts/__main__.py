"""`python -m streams.contracts`: regenerate (or `--check`) the artefacts for other languages."""

from streams.contracts.languages import main

main()
