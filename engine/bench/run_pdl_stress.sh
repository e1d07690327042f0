#!/usr/bin/env bash
# The PDL race's decisive experiment (session 12, s12pdl; engine/bench/NOTES.md "Session 12 (s12pdl): PDL chain
# audit"): five processes of pdl_stress.py side by side on one GPU (time-sliced contexts, as in the lead's
# bisection), one library (this branch's: it has DDTREE_ACCEPT_PDL=2), each process a variant:
#   pdl          DDTREE_ACCEPT_PDL=1: the early mode as sessions 7-11 shipped it      positive control: must deviate
#   early-plain  DDTREE_ACCEPT_PDL=2: the early mode's code, launched without PDL     the attribute or the code?
#   fence        =1, a torch kernel between the lm_head GEMM and the accept           the cuBLAS predecessor or any?
#   sync         =1, eager runs synchronize before each accept (no overlap left)      a race window or the attribute?
#   off          the default (early mode off)                                          negative control: must not
# Reading: pdl clean -> no power, run again. early-plain deviates -> the early mode's code (its relaxed loads, the
# tail's page prefetch), not PDL. early-plain clean and fence clean -> the PDL edge from cuBLAS's GEMM. fence deviates
# -> any PDL edge into the accept; then sync's eager runs ("by_mode") clean -> a race inside the overlap window,
# deviating -> the attribute alone (platform: PDL under time-slicing). off deviating -> the comparison itself is wrong.
# Usage (repository root; the library built for sm_90a and carried; ~45 s of device time on a warm machine):
#   LIB=.device/pdl/libddtree.so bash engine/bench/run_pdl_stress.sh
# (STRESS_ARGS="--device cpu --min-runs 1" SECONDS_EACH=1 TIMEOUT_EACH=300: a CPU dry run, reference ops, eager only.)
set -u
OUT=${OUT:-/tmp/pdl_stress}
SECONDS_EACH=${SECONDS_EACH:-25}
mkdir -p "$OUT"
: "${LIB:?set LIB to the libddtree.so of this branch}"
export PYTHONPATH="$PWD/engine/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
go() {  # label, then pdl_stress.py's arguments
  local label=$1
  shift
  timeout "${TIMEOUT_EACH:-$((SECONDS_EACH + 30))}" python3 engine/bench/pdl_stress.py --label "$label" \
    --seconds "$SECONDS_EACH" \
    --env DDTREE_LIB="$LIB" "$@" ${STRESS_ARGS:-} > "$OUT/$label.json" 2> "$OUT/$label.err" &
}
go pdl --env DDTREE_ACCEPT_PDL=1
go early-plain --env DDTREE_ACCEPT_PDL=2
go fence --env DDTREE_ACCEPT_PDL=1 --fence
go sync --env DDTREE_ACCEPT_PDL=1 --sync
go off
wait
for label in pdl early-plain fence sync off; do
  if [ -s "$OUT/$label.json" ]; then echo "$label: $(cat "$OUT/$label.json")"
  else echo "$label: no result (timeout or error): $(tail -2 "$OUT/$label.err")"; fi
done
