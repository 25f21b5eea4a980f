"""Timestamps at method boundaries of a `cec run` process, from outside the product (the import hook of
tests/killpoints wraps the methods when their modules are imported): where a restart's time goes (process
start, store open, index reconcile, EC build and load, replay) and what the G-check controller measured
and aimed at while it ran (u against U, q against Q, the duty against the budget), one JSON line per event
in the file named by CEC_BENCH_PROBE, flushed at once (a SIGKILL loses nothing written before it).
CEC_BENCH_PROFILE=<event name> runs that one boundary under cProfile (stats in <file>.<name>.prof). Each
"<name>:exit" event carries `gc_s`, the seconds the cyclic garbage collector ran inside that call.

Loaded by benchmarks/probe_boot/sitecustomize.py; read by benchmarks/bench_restart_phases.py."""

from __future__ import annotations

import cProfile
import functools
import gc
import json
import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TextIO

from tests.killpoints import on_import

__all__ = ["BOUNDARIES", "install"]

# (module, class, method, event name): "<name>:enter" and "<name>:exit" with the wall clock. A boundary that
# a tree does not have is left out (the same event may be named for two trees).
BOUNDARIES = (
    ("queuestore.factory", None, "open_store", "open_store"),
    ("queuestore.output", "OutputQueue", "__init__", "output_queue"),
    ("queuestore.index", "StreamIndex", "reconcile", "index_reconcile"),
    ("recovery.manager", "RecoveryManager", "recover", "recover"),
    ("operators.engine.instance", "OperatorInstance", "restore", "restore"),
    ("operators.runtime", "OperatorRuntime", "run", "run"),
    ("operators.runtime", "OperatorRuntime", "_calibrate", "calibrate"),
    ("operators.runtime", "OperatorRuntime", "_caught_up", "caught_up"),  # trees before the restore split
    ("operators.local_restore", "LocalRestore", "caught_up", "caught_up"),
    ("operators.runtime", "OperatorRuntime", "__init__", "runtime_init"),
    ("recovery.identity", None, "bind_log", "bind_log"),
    ("operators.standby", "Standby", "took_over", "took_over"),
    ("operators.local_restore", "LocalRestore", "restore", "local_restore"),
)

_OUT: TextIO | None = None
_GC = [0.0, 0.0]  # seconds the cyclic GC ran in this process so far; when the running collection started
# One boundary (an event name of BOUNDARIES) run under cProfile, its stats next to the events file.
_PROFILE = os.environ.get("CEC_BENCH_PROFILE")
_LOCK = threading.Lock()


def _emit(event: str, **fields: Any) -> None:
    if _OUT is None:
        return
    # "cpu": this process's CPU seconds so far (every thread): what a phase cost, whatever the load.
    line = json.dumps({"t": time.time(), "cpu": time.process_time(), "ev": event, **fields})
    with _LOCK:
        _OUT.write(line + "\n")
        _OUT.flush()


def _wrap(module_name: str, cls_name: str | None, method: str, name: str) -> None:
    def patch(module: ModuleType) -> None:
        owner: Any = module if cls_name is None else getattr(module, cls_name, None)
        inner: Callable[..., Any] | None = getattr(owner, method, None)
        if inner is None:  # a boundary of another tree (the benchmarks compare trees)
            return

        @functools.wraps(inner)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            gc_before = _GC[0]
            _emit(f"{name}:enter")
            profiler = cProfile.Profile() if name == _PROFILE else None
            try:
                if profiler is None:
                    return inner(*args, **kwargs)
                return profiler.runcall(inner, *args, **kwargs)
            finally:
                _emit(f"{name}:exit", gc_s=_GC[0] - gc_before)
                if profiler is not None and _OUT is not None:
                    profiler.dump_stats(f"{_OUT.name}.{name}.prof")

        setattr(owner, method, wrapped)

    on_import(module_name, patch)


def _first_apply() -> None:
    """The first tuple applied after the instance was restored (the replay's start), once."""

    def patch(module: ModuleType) -> None:
        cls = module.OperatorInstance
        apply_run = cls.apply_run
        seen = [False]

        def apply_run_(self: Any, tuples: Any) -> Any:
            if not seen[0]:
                seen[0] = True
                _emit("first_apply")
            return apply_run(self, tuples)

        cls.apply_run = apply_run_

    on_import("operators.engine.instance", patch)


def _controller() -> None:
    """Each measurement interval of the G-check controller (every 0.25 s of the run): its counts, the
    targets and budget it then planned with, the duty spent and the rates measured."""

    def patch(module: ModuleType) -> None:
        cls = module.GCheckController
        measure = cls._measure

        def measure_(self: Any, now: float, counts: tuple[int, ...]) -> None:
            short = self.memory.budget_short  # whether this interval ran out of budget (reset by measure)
            measure(self, now, counts)
            inputs, outputs, gchecks, _front_in, _front_out, n, q, u = counts
            q_target, u_target = self.memory.targets
            rates = self.rates
            _emit(
                "measure",
                inputs=inputs, outputs=outputs, gchecks=gchecks, n=n, q=q, u=u,
                Q=q_target, U=u_target, budget=self.schedule.duty, duty=self.schedule.real_duty(),
                input_rate=rates.input_rate, replay_rate=rates.replay_rate,
                gcheck_seconds=self.memory.gcheck_seconds, gchecks_made=self.memory.gchecks,
                budget_short=short,
            )  # fmt: skip

        cls._measure = measure_

    on_import("operators.engine.controller", patch)


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    """A `gc.callbacks` hook: the time the cyclic GC takes, summed (each boundary's exit says its share)."""
    if phase == "start":
        _GC[1] = time.perf_counter()
    else:
        _GC[0] += time.perf_counter() - _GC[1]


def install(path: str) -> None:
    global _OUT
    _OUT = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the process's life
    _emit("interpreter", pid=os.getpid())
    gc.callbacks.append(_gc_timer)
    for boundary in BOUNDARIES:
        _wrap(*boundary)
    _first_apply()
    _controller()
