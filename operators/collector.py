"""Python's cyclic garbage collector, kept from walking an operator's state on every few allocations.

An operator holds one object graph per open window (window, state, facts): at the paper's scale (~100,000
open windows) a few hundred thousand objects that live long. With the default thresholds (700, 10, 10) the
collector runs a young pass every 700 net allocations and a full pass, which walks all of them, every 100
young passes (or once the survivors grew by a quarter); a tuple allocates several objects. The operator's
objects hold no reference cycles that must go soon (they die by reference count), so:

- `collector_paused`: for one call that loads a state partition and drops it at its end (the Spark
  processor): paused over the call, running as usual between calls. Measured on the processor alone
  (`benchmarks/bench_spark_processor.py`, 100,000 keys, four micro-batches of 100,000 tuples): 8.4 s -> 5.2 s
  of CPU, with the call's key objects also freed at its end (`PartitionCall.release`).
- `collector_spaced`: for a long run (the local runtime): passes 100x rarer (thresholds 100,000, 50, 100),
  so a full pass comes every few million allocations instead of every 70,000. Measured on `cec run` over a
  CSV of 500,000 tuples of 100,000 keys, count windows of 10: ~7.6 s -> ~6.5 s of user CPU; memory the
  same (the collector still runs, so a cycle is still freed).

Both leave the collector as they found it (a caller that turned it off keeps it off).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_SPACED_THRESHOLDS = (100_000, 50, 100)


@contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def collector_spaced() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*_SPACED_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
