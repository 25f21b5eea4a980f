#!/bin/bash
# Quiet A/B of the standby's takeover: a before tree and an after tree, interleaved, one repeat each per round.
# BEFORE (a `git archive` snapshot with cec/_native*.so copied in; default /tmp/s13/before, 6e9a6cc), AFTER
# (default /work/main), OUT (JSON files; default /tmp/s13/ab), ROUNDS (default "1 2").
set -u
BEFORE=${BEFORE:-/tmp/s13/before}; AFTER=${AFTER:-/work/main}; OUT=${OUT:-/tmp/s13/ab}; ROUNDS=${ROUNDS:-"1 2"}
mkdir -p "$OUT"
for round in $ROUNDS; do
  for tree in before after; do
    dir=$BEFORE; [ $tree = after ] && dir=$AFTER
    echo "== round $round $tree flat $(cat /proc/loadavg)"
    (cd "$dir" && nice -n 5 /work/main/.venv/bin/python -u benchmarks/bench_standby.py --repeats 1 --kill-at 80000 --modes standby --out "$OUT/flat-$tree-$round.json" 2>&1 | grep "kill to caught up   ")
    echo "== round $round $tree rate50k-late $(cat /proc/loadavg)"
    (cd "$dir" && nice -n 5 /work/main/.venv/bin/python -u benchmarks/bench_standby.py --repeats 1 --tuples 1000000 --kill-at 200000 --rate 50000 --modes standby --out "$OUT/late-$tree-$round.json" 2>&1 | grep "kill to caught up   ")
  done
done
