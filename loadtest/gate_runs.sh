#!/usr/bin/env bash
# The load-test gate tested: RUNS (default 10) checks with no change and RUNS
# with JETWAY_DEBUG_BURN_US=BURN (default 20), in turns, each verdict a line
# of var/gate/summary.txt (with the time it took, the load average and the
# worker-CPU row), each check's output in var/gate/KIND-N.log.
#
#   loadtest/gate_runs.sh            # after make setup setup-loadtest
#
# Run it from a clone whose baseline.json names its own HEAD (make
# loadtest-record, commit), so that "no change" is no change.
set -euo pipefail
cd "$(dirname "$0")/.."
burn=${BURN:-20}
out=var/gate
mkdir -p "$out"
for i in $(seq 1 "${RUNS:-10}"); do
  for kind in unchanged burn; do
    start=$(date +%s)
    if [ "$kind" = burn ]; then export JETWAY_DEBUG_BURN_US=$burn; else unset JETWAY_DEBUG_BURN_US; fi
    rc=0
    timeout 900 .venv-loadtest/bin/python -m loadtest._run check --name "gate-$kind-$i" > "$out/$kind-$i.log" 2>&1 || rc=$?
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    cpu=$(grep "^worker CPU per request" "$out/$kind-$i.log" | head -1 || true)
    echo "$kind $i rc=$rc $(($(date +%s) - start))s load[$load] $cpu" >> "$out/summary.txt"
  done
done
