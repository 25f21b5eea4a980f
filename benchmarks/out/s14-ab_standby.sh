#!/bin/bash
# Quiet A/B of the standby's takeover: before (6e9a6cc) and after (main), interleaved, one repeat each per round.
set -u
OUT=/tmp/s14/ab; mkdir -p $OUT
for round in 1; do
  for tree in before after; do
    dir=/tmp/s14/before; [ $tree = after ] && dir=/work/main
    echo "== round $round $tree flat $(cat /proc/loadavg)"
    (cd $dir && nice -n 5 /work/main/.venv/bin/python -u benchmarks/bench_standby.py --repeats 1 --kill-at 80000 --modes standby --out $OUT/flat-$tree-$round.json 2>&1 | grep "kill to caught up   ")
    echo "== round $round $tree rate50k-late $(cat /proc/loadavg)"
    (cd $dir && nice -n 5 /work/main/.venv/bin/python -u benchmarks/bench_standby.py --repeats 1 --tuples 1000000 --kill-at 200000 --rate 50000 --modes standby --out $OUT/late-$tree-$round.json 2>&1 | grep "kill to caught up   ")
  done
done
