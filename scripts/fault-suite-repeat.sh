#!/usr/bin/env bash
# Runs the full test suite N times and records how the fault suite (tests/system/test_faults_kafka.py)
# and the poison suite (tests/system/test_poison_kafka.py) fared in each run, inside the whole suite
# (they failed only there: the other tests leave the broker and the machine busy).
#
#   scripts/fault-suite-repeat.sh 10          # idle machine
#   scripts/fault-suite-repeat.sh 5 --hog     # two busy-looping processes keep both cores busy
#   TESTS="tests/system/test_faults_kafka.py tests/system/test_poison_kafka.py" scripts/fault-suite-repeat.sh 3
#                                             # only those files (cheaper; not "inside the suite")
#
# Results: one line per run in test-artifacts/fault-repeat.txt (date, load average, outcome of
# each fault/poison test), the full pytest output in test-artifacts/fault-repeat-<n>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:?usage: scripts/fault-suite-repeat.sh RUNS [--hog]}
hog=${2:-}
mkdir -p test-artifacts
out=test-artifacts/fault-repeat.txt
make .venv/.installed >/dev/null 2>&1 || [[ -x .venv/bin/python ]] || exit 1  # a worktree may link another's .venv (make cannot create it there)
export MEMSTREAM_FAULT_SUITE=1  # (the default) whatever the caller's environment says
for i in $(seq 1 "$runs"); do
  hogs=()
  if [[ "$hog" == "--hog" ]]; then
    for _ in 1 2; do timeout 3600 python3 -c 'while 1: pass' & hogs+=($!); done
  fi
  log=test-artifacts/fault-repeat-$i.log
  started=$(date +%s)
  # shellcheck disable=SC2086 # TESTS is a list of paths
  .venv/bin/python -m pytest -q -rA -p no:cacheprovider ${TESTS:-} >"$log" 2>&1
  rc=$?
  for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
  faults=$(grep -E "^(PASSED|FAILED|ERROR) tests/(system/)?test_(faults|poison)_kafka.py" "$log" | sed 's/ - .*//' | tr '\n' ' ')
  line="$(date -u +%FT%TZ) run $i/$runs ${hog:-idle} ${TESTS:-full-suite} load=$(cut -d' ' -f1-3 /proc/loadavg) rc=$rc $(( $(date +%s) - started ))s :: $faults"
  echo "$line" | tee -a "$out"
done
