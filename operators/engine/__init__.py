"""One operator engine under CEC, for every host: what CEC adds to an operator, written once.

A host feeds an `OperatorInstance` input tuples and takes its records through a `RecordSink`; it neither
loops nor does I/O. Two hosts use it:
- the local loop (`operators.runtime.OperatorRuntime`): polls the source, hands each batch to the
  instance, appends its records to the output queue (`operators.local_sink.OutputQueueSink`), ticks the
  G-check controller every few tuples, trims the log;
- the Spark state partition (`operators.spark.processor`): one instance per state partition and call,
  over the windows it keeps in Spark's state; its rows are stamped by the sink later; its timer ticks the
  same controller.

Modules, one job each:
- `context`: the `OperatorContext` and the records it makes: window identity, holding and claiming a
  tuple's records, G-open of a window still open, dead letters, watermarks, G-check runs;
- `instance`: how tuples are applied (the per-tuple procedure and its fast paths): the replay contract
  while restoring (`recovery.contract` stays the one owner of the rules), restore/resume/save, EOS;
- `phase`: RESTORING -> RUNNING -> DONE and the one rule that ends recovery;
- `records`: the `RecordSink` seam (the sink reads the moment, time and positions, from the instance
  it serves) and the one form of a dead letter;
- `controller`: the G-check controller (policy, schedule, measured rates, targets, what is said once);
- `candidates`: an instance's registry as the controller's candidates (the local host's windows);
- `trimming`: the trim bound and when it may be applied;
- `stats`: the figures of a run.

Why this layout and not the sketch of DESIGN-NOTES section 7 (which had an `emitter` that holds, claims
*and stamps* records): the two hosts stamp `pos` at different moments from different facts (the local
host from the live position vector as it appends, the Spark sink from each tuple's own position after it
sorted a partition's rows), and both rules are `recovery.contract.PositionStamper`. So the instance does
what is common (which records, in which order, which one claims its tuple, their marks) and the sink
stamps: one seam instead of an emitter with two stamping modes. The controller's candidates are an
interface for the same reason: the local registry knows each window's in/out marks, a Spark state
partition knows each window's footprint position and records since, and the policy sees the same
`WindowView` from both.
"""

from __future__ import annotations

from operators.engine.controller import ControllerMemory, GCheckController
from operators.engine.instance import OperatorInstance
from operators.engine.phase import Lifecycle, Phase
from operators.engine.records import DeadLetters, RecordSink, raw_text
from operators.engine.stats import RunStats

__all__ = [
    "ControllerMemory",
    "DeadLetters",
    "GCheckController",
    "Lifecycle",
    "OperatorInstance",
    "Phase",
    "RecordSink",
    "RunStats",
    "raw_text",
]
