#!/usr/bin/env bash
# The mechanical fixes `make lint` asks for, applied in one go (issue 16): parent-relative imports
# made absolute (TID252, an "unsafe" fix in ruff's terms: it only rewrites the import's spelling),
# then pyupgrade rewrites for Python 3.11 (UP), the imports those rewrites leave unused (F401:
# `asyncio.TimeoutError` -> `TimeoutError`, `timezone.utc` -> `UTC`) and import order (I). Nothing else is auto-fixed:
# the other findings (bugbear, pyflakes, mypy) are fixed by hand. Run from anywhere; then `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF="${RUFF:-.venv/bin/ruff}"
"$RUFF" check --fix --unsafe-fixes --select TID252 --exit-zero --quiet .
"$RUFF" check --fix --select UP,F401,I --exit-zero --quiet .
"$RUFF" check .
