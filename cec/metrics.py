"""Prometheus metrics of running operators: every definition here, and the small interface hosts call.

`cec run --metrics-port PORT` (and `JobSpec.metrics_port`, which the Spark hosts pass through to their
tasks; `cec_aggregate(metrics_port=...)` on the Spark driver, see `operators.spark.query`) serves them over HTTP for Prometheus to scrape. Instance p of a job serves on `PORT + p`, so the
instances of a partitioned stage running as separate processes on one host (Spark tasks) never compete
for one port; instances in one process with the same port share one endpoint (labels tell them apart).

Every series is labelled with the operator instance's output `topic` and `partition` (`all` for the Spark
driver's query-wide figures). A series appears once its host first reports the figure: the Spark driver
does not know the input read, the extent in records or the checkpoint duty, and leaves those out rather
than exporting zeros (its `cec_recovery_phase` stays `idle`: it plans recovery before the query starts).

| name | type | what |
| --- | --- | --- |
| `cec_open_windows` | gauge | N: windows open now |
| `cec_extent_records` | gauge | q: output records from the oldest footprint to the end (the extent) |
| `cec_replay_tuples` | gauge | u: input tuples since the oldest footprint (what a recovery would replay) |
| `cec_gopens_total` / `cec_gchecks_total` | counter | G-opens / G-checks produced |
| `cec_checkpoint_duty_ratio` | gauge | share of operator time really spent producing G-checks |
| `cec_input_tuples_total` / `cec_appended_records_total` | counter | input tuples read / records appended |
| `cec_input_rate` / `cec_append_rate` | gauge | the same per second, over the last interval of >= 1 s |
| `cec_dead_letters_total` | counter | input tuples dead-lettered (DEAD records written) |
| `cec_trimmed_offsets_total` | counter | offsets trimmed from the head of the output partition |
| `cec_recovery_phase` | enum | `idle`, `ec_build`, `ec_load` or `replay`, as recovery goes through them |
| `cec_recovery_phase_seconds` | gauge | how long each phase of the last recovery took (label `phase`): the phases above, and at caught up those of the whole restart (`recovery.timeline`: `process_start`, `store_open`, `index`, `ec_build`, `ec_load`, `restore`, `replay`) |
| `cec_recovery_seconds` | gauge | the last recovery's time, from the start of the restart to caught up (the report's `recovery time`) |
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, start_http_server

from cec.exceptions import ConfigError

__all__ = ["PHASES", "REGISTRY", "OperatorMetrics", "serve"]

# A registry of cec's own (not prometheus_client's global one), so that embedding cec in an application
# that has its own metrics never clashes with them.
REGISTRY = CollectorRegistry(auto_describe=True)
PHASES = ("idle", "ec_build", "ec_load", "replay")
_LABELS = ("topic", "partition")
_RATE_INTERVAL_S = 1.0

_open_windows = Gauge("cec_open_windows", "N: windows open now", _LABELS, registry=REGISTRY)
_extent = Gauge(
    "cec_extent_records", "q: records from the oldest footprint to the end", _LABELS, registry=REGISTRY
)
_replay = Gauge("cec_replay_tuples", "u: input tuples since the oldest footprint", _LABELS, registry=REGISTRY)
_gopens = Counter("cec_gopens", "G-open footprints produced", _LABELS, registry=REGISTRY)
_gchecks = Counter("cec_gchecks", "G-check footprints produced", _LABELS, registry=REGISTRY)
_duty = Gauge(
    "cec_checkpoint_duty_ratio", "share of operator time spent producing G-checks", _LABELS, registry=REGISTRY
)
_inputs = Counter(
    "cec_input_tuples", "input tuples read (replayed ones included)", _LABELS, registry=REGISTRY
)
_appended = Counter("cec_appended_records", "records appended to the output log", _LABELS, registry=REGISTRY)
_outstanding = Gauge(
    "cec_outstanding_records",
    "records appended to the output log and not durable yet (what a reader of the log cannot see yet)",
    _LABELS,
    registry=REGISTRY,
)
_input_rate = Gauge("cec_input_rate", "input tuples per second", _LABELS, registry=REGISTRY)
_append_rate = Gauge("cec_append_rate", "records appended per second", _LABELS, registry=REGISTRY)
_dead = Counter("cec_dead_letters", "input tuples dead-lettered", _LABELS, registry=REGISTRY)
_trimmed = Counter(
    "cec_trimmed_offsets", "offsets trimmed from the head of the output partition", _LABELS, registry=REGISTRY
)
_phase = Enum(
    "cec_recovery_phase", "the recovery phase going on", _LABELS, states=list(PHASES), registry=REGISTRY
)
_phase_seconds = Gauge(
    "cec_recovery_phase_seconds",
    "duration of each phase of the last recovery",
    (*_LABELS, "phase"),
    registry=REGISTRY,
)

_recovery_seconds = Gauge(
    "cec_recovery_seconds",
    "the last recovery's time, from the start of the restart to caught up",
    _LABELS,
    registry=REGISTRY,
)

_servers: dict[int, Any] = {}
_servers_lock = threading.Lock()


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Serve `REGISTRY` over HTTP on `port` (once per process and port); returns the port. A port that
    cannot be bound is a `ConfigError` (one line for the CLI)."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port must be 0..65535, got {port}")
    with _servers_lock:
        if port in _servers:
            return int(_servers[port].server_address[1])
        try:
            server, _thread = start_http_server(port, addr=addr, registry=REGISTRY)
        except OSError as exc:
            reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise ConfigError(f"cannot serve metrics on port {port}: {reason}") from None
        bound = int(server.server_address[1])
        _servers[port] = server
        _servers[bound] = server
        return bound


class OperatorMetrics:
    """The metrics of one operator instance. The runtime calls `sample` after each input batch (cheap:
    a few gauge sets; rates are recomputed once per second of `clock`), `phase` as recovery moves on,
    and `trimmed` is for whoever deletes the head of the output log. A host that knows only some figures
    calls `update` instead of `sample`. `partition` is the output partition, or a name for figures that
    span a whole query (`"all"` on the Spark driver)."""

    def __init__(
        self, topic: str, partition: int | str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        labels = {"topic": topic, "partition": str(partition)}
        self.labels = labels
        self._clock = clock
        # The figures' series are made when first given (`_series`): one a host never reports is absent
        # from the endpoint, not a made-up 0.
        self._series: dict[Any, Any] = {}  # metric family -> this instance's child
        self._trimmed = _trimmed.labels(**labels)
        self._phase = _phase.labels(**labels)
        self._phase_seconds = {p: _phase_seconds.labels(**labels, phase=p) for p in PHASES[1:]}
        self._phase.state("idle")
        self._current: tuple[str, float] | None = None
        self._seen = {"inputs": 0, "outputs": 0, "gopens": 0, "gchecks": 0, "dead_letters": 0}
        self._rate_marks: dict[str, tuple[float, int]] = {}

    def sample(
        self,
        *,
        open_windows: int,
        extent: int,
        replay: int,
        inputs: int,
        outputs: int,
        gopens: int,
        gchecks: int,
        duty: float,
        dead_letters: int = 0,
        outstanding: int | None = None,
    ) -> None:
        """The instance's figures now; `inputs`..`gchecks` and `dead_letters` are its running totals since
        it started; `outstanding`: records appended and not durable yet."""
        self.update(
            dead_letters=dead_letters,
            outstanding=outstanding,
            open_windows=open_windows,
            extent=extent,
            replay=replay,
            inputs=inputs,
            outputs=outputs,
            gopens=gopens,
            gchecks=gchecks,
            duty=duty,
        )

    def update(
        self,
        *,
        open_windows: int | None = None,
        extent: int | None = None,
        replay: int | None = None,
        inputs: int | None = None,
        outputs: int | None = None,
        gopens: int | None = None,
        gchecks: int | None = None,
        duty: float | None = None,
        dead_letters: int | None = None,
        outstanding: int | None = None,
    ) -> None:
        """`sample` for a host that knows only some of the figures (the Spark driver): those not given
        are left as they are (a gauge never set is not exported with a made-up value)."""
        for gauge, value in (
            (_open_windows, open_windows),
            (_extent, extent),
            (_replay, replay),
            (_duty, duty),
            (_outstanding, outstanding),
        ):
            if value is not None:
                self._child(gauge).set(value)
        for name, counter, total in (
            ("inputs", _inputs, inputs),
            ("outputs", _appended, outputs),
            ("gopens", _gopens, gopens),
            ("gchecks", _gchecks, gchecks),
            ("dead_letters", _dead, dead_letters),
        ):
            if total is not None:
                child = self._child(counter)
                if total > self._seen[name]:
                    child.inc(total - self._seen[name])
                    self._seen[name] = total
        now = self._clock()
        for name, gauge, total in (("inputs", _input_rate, inputs), ("outputs", _append_rate, outputs)):
            if total is None:
                continue
            mark = self._rate_marks.get(name)
            if mark is None:  # the rate is reported (0 until a first interval is measured) with its total
                self._child(gauge)
                self._rate_marks[name] = (now, total)
            elif now - mark[0] >= _RATE_INTERVAL_S:
                self._child(gauge).set((total - mark[1]) / (now - mark[0]))
                self._rate_marks[name] = (now, total)

    def _child(self, family: Any) -> Any:
        """This instance's series of `family`, made on first use."""
        child = self._series.get(family)
        if child is None:
            child = self._series[family] = family.labels(**self.labels)
        return child

    def phase(self, name: str) -> None:
        """Recovery entered phase `name` (one of `PHASES`); the previous one ended now."""
        if name not in PHASES:
            raise ValueError(f"unknown recovery phase {name!r}")
        now = self._clock()
        if self._current is not None:
            previous, started = self._current
            self._phase_seconds[previous].set(now - started)
        self._current = None if name == "idle" else (name, now)
        self._phase.state(name)

    def restart(self, phases: dict[str, float], recovery_seconds: float) -> None:
        """A recovery caught up: how long each phase of its whole restart took (`recovery.timeline`), and
        its recovery time."""
        for name, seconds in phases.items():
            _phase_seconds.labels(**self.labels, phase=name).set(seconds)
        self._child(_recovery_seconds).set(recovery_seconds)

    def trimmed(self, offsets: int) -> None:
        """`offsets` more offsets were deleted from the head of the output partition."""
        if offsets > 0:
            self._trimmed.inc(offsets)
