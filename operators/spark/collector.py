"""Python's cyclic garbage collector paused over one processor call.

A state partition's keys come back as one pickled value per call (`state_partition`): at 100,000 keys that is
a few hundred thousand objects alive for the call, and every object the call allocates counts toward the
collector's next run, whose full passes walk all of them. Measured on the processor alone (no JVM; 100,000
keys, four micro-batches of 100,000 tuples): 7.9 s with the collector against 4.3 s without. The processor's
objects hold no reference cycles that must go during a call (they die by reference count), so the collector
is paused for the call and runs as usual between calls; it is left as it was found (a caller that turned it
off keeps it off).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
