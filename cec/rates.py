"""What checkpointing and recovery cost on this machine, measured as the operator runs.

A recovery takes about: EC build (read the extent back: q records at B records/s) + EC load (decode and
install N windows at L windows/s) + replay (u input tuples at R tuples/s). The policies that choose how
much to checkpoint (`cec.policy`) plan with these rates and with the cost of one G-check.

Rates start from conservative defaults (below what DESIGN-NOTES measured on a quiet machine, so that the
first plan errs towards checkpointing more) and are updated from what the operator measures: G-check
cost, input rate and records per input while it runs, replay rate from its live processing rate (replay
does the same reading and applying, without the writing, so that is a lower bound), and EC build, load
and replay rates from the previous recovery's report when this run began with one.

Before any recovery the runtime calibrates the EC build and load rates at startup: the real EC code over
a synthetic in-memory extent (`recovery.calibrate`; at the paper's scale the rates below were 4x too low
against what the next recovery measured). Without that calibration, until a recovery has measured them,
the EC build and load rates follow the live rate: both are CPU work
on the same machine, a fraction of what the operator does per input tuple, and slow down with it when the
machine is loaded (measured at the paper's scale, 92k windows: EC build and load at ~11x the replay rate
on a quiet machine, 508k and 502k/s against 45k/s, and ~11x on a loaded one, 269k and 283k/s against
25k/s). `EC_PER_REPLAY` takes half that, and never less than the fixed defaults: without it, the first
run's plan assumed the fixed defaults (an EC rebuild of 92k windows alone ~6 s, more than a 3 s target),
checkpointed for a replay of a fifth of the target and ran out of budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ["MeasuredRates", "RecoveryFigures"]

_ALPHA = 0.3  # weight of a new measurement in the running averages
_MIN_SAMPLE_S = 0.02  # shorter recovery phases say more about timer noise than about a rate
EC_PER_REPLAY = 5.0  # EC build records/s and EC load windows/s per replayed tuple/s, until measured
_DEFAULT_EC_BUILD = 40_000.0
_DEFAULT_EC_LOAD = 25_000.0


class RecoveryFigures(Protocol):
    """What `recovery.manager.RecoveryReport` carries (structural, so cec does not import recovery)."""

    records_read: int
    ec_windows: int
    ec_build_seconds: float
    ec_load_seconds: float
    tuples_replayed: int
    catch_up_seconds: float
    install_seconds: float  # of catch_up_seconds: the loaded windows installed (planned as EC load)


@dataclass
class MeasuredRates:
    ec_build_rate: float = _DEFAULT_EC_BUILD  # records/s read back while rebuilding the EC
    ec_load_rate: float = _DEFAULT_EC_LOAD  # windows/s decoded and installed
    replay_rate: float = 20_000.0  # input tuples/s re-read and applied up to the crash point
    gcheck_seconds: float = 50e-6  # operator time per G-check
    input_rate: float = 0.0  # input tuples per second of run time (0: not measured yet)
    process_rate: float = 0.0  # input tuples per second of processing (no waits, no G-checks; 0: not yet)
    outputs_per_input: float = 1.0  # records other than G-checks written per input tuple
    # The fixed part of a recovery before any EC work (`observe_restart`): on the local runtime the
    # process's start, store open and index, measured at this run's own start, fresh or not (a first run
    # that planned without it missed a 2 s target by 0.6-1.2 s on a fresh host); the query's start for the
    # attached operator on Spark.
    restart_seconds: float = 0.0
    from_recovery: bool = False  # EC build/load and replay rates come from a real recovery
    calibrated: bool = False  # EC build/load rates measured at startup (`recovery.calibrate`)
    measured: set[str] = field(default_factory=set)

    def _blend(self, name: str, value: float) -> None:
        if value <= 0:
            return
        old = getattr(self, name)
        setattr(self, name, value if name not in self.measured else (1 - _ALPHA) * old + _ALPHA * value)
        self.measured.add(name)

    def observe_gchecks(self, seconds: float, count: int) -> None:
        if count > 0 and seconds > 0:
            self._blend("gcheck_seconds", seconds / count)

    def observe_run(
        self,
        *,
        seconds: float,
        busy_seconds: float,
        inputs: int,
        outputs: int,
        gchecks: int,
        replay_seconds: float | None = None,
    ) -> None:
        """One measurement interval of normal operation: `busy_seconds` excludes waiting for input and
        producing G-checks. `replay_seconds`: what replaying these inputs would take, when a host knows it
        is more than `busy_seconds` (on Spark a replay runs through micro-batches whose planning, state
        commits and writes the task's own time does not count); by default `busy_seconds`."""
        if seconds <= 0 or inputs <= 0:
            return
        self._blend("input_rate", inputs / seconds)
        self._blend("outputs_per_input", max(outputs - gchecks, 0) / inputs or 1e-6)
        if busy_seconds > 0:
            self._blend("process_rate", inputs / busy_seconds)
        replay = busy_seconds if replay_seconds is None else replay_seconds
        if not self.from_recovery and replay > 0:
            self._blend("replay_rate", inputs / replay)
            # Not measured by a recovery yet: they follow the live rate (module docstring).
            if "ec_build_rate" not in self.measured and not self.calibrated:
                self.ec_build_rate = max(_DEFAULT_EC_BUILD, EC_PER_REPLAY * self.replay_rate)
            if "ec_load_rate" not in self.measured and not self.calibrated:
                self.ec_load_rate = max(_DEFAULT_EC_LOAD, EC_PER_REPLAY * self.replay_rate)

    def calibrate(self, ec_build_rate: float, ec_load_rate: float) -> None:
        """EC build and load rates measured at startup on a synthetic extent (`recovery.calibrate`): the
        plan's figures until a real recovery measures them (those are never replaced by these)."""
        if ec_build_rate <= 0 or ec_load_rate <= 0:
            return
        if "ec_build_rate" not in self.measured:
            self.ec_build_rate = ec_build_rate
        if "ec_load_rate" not in self.measured:
            self.ec_load_rate = ec_load_rate
        self.calibrated = True

    def observe_recovery(self, report: RecoveryFigures) -> None:
        """Rates of the recovery this run began with: the closest measure of the next one."""
        if report.ec_build_seconds >= _MIN_SAMPLE_S and report.records_read > 0:
            self.ec_build_rate = report.records_read / report.ec_build_seconds
            self.measured.add("ec_build_rate")
        # Installing the windows is per window, like decoding them: EC load, not replay (it took 0.3-0.4 s
        # at 91k windows, which a replay rate spread over the tuples replayed).
        load_seconds = report.ec_load_seconds + report.install_seconds
        if load_seconds >= _MIN_SAMPLE_S and report.ec_windows > 0:
            self.ec_load_rate = report.ec_windows / load_seconds
            self.measured.add("ec_load_rate")
        replay_seconds = report.catch_up_seconds - report.install_seconds
        if replay_seconds >= _MIN_SAMPLE_S and report.tuples_replayed > 0:
            self.replay_rate = report.tuples_replayed / replay_seconds
            self.measured.add("replay_rate")
            self.from_recovery = True

    def gcheck_share(self, gchecks_per_input: float) -> float:
        """The share of run time that `gchecks_per_input` G-checks per input tuple take (0 before the
        input rate is measured).

        At the measured input rate that is g * k * input_rate, if the operator has the time to spare; if
        not, the operator becomes the bottleneck, its input slows down, and the share is what the
        G-checks take of processing plus G-checks, x / (1 + x) with x = g * k * process_rate. The
        smaller of the two is the right one, and it is below 1: a share above 1 (g * k * input_rate
        alone, measured before any G-check slowed the input) counts time the operator would not have."""
        if self.input_rate <= 0:
            return 0.0
        per_input = self.gcheck_seconds * gchecks_per_input
        share = per_input * self.input_rate
        if self.process_rate > 0:
            x = per_input * self.process_rate
            share = min(share, x / (1.0 + x))
        return share

    def observe_restart(self, seconds: float) -> None:
        """A start's fixed cost, measured at this start: what the next restart will pay before its EC work."""
        if seconds > 0:
            self.restart_seconds = seconds
            self.measured.add("restart_seconds")

    def recovery_seconds(self, *, extent: float, windows: float, replay: float) -> float:
        """Estimated recovery time for an extent of `extent` records, `windows` open windows and `replay`
        tuples to replay."""
        return (
            self.restart_seconds
            + extent / self.ec_build_rate
            + windows / self.ec_load_rate
            + replay / self.replay_rate
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["measured"] = sorted(self.measured)
        return d
