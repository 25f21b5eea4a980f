"""Crashes at named points, from the test side: a child process SIGKILLs itself when a method boundary of
the production code is passed for the n-th time, without a single fault branch in the product.

A test starts a child with `tests.helpers.child_env(faults="site:n[,site:n...]")`: its environment names
the plan (`CEC_TEST_KILL`) and puts `tests/killpoints/boot` first on its PYTHONPATH, whose
`sitecustomize` calls `install` at interpreter start. Each planned site wraps a method of a production
module when that module is imported (an import hook: nothing is imported early), in every Python process
started with that environment: the worker, the CLI and the workers it starts, a Spark driver, its JVM's
Python workers. The production code runs its own paths, fast ones included; the wrapper only decides when
to stop the process, with SIGKILL (no `finally`, no atexit, no flush), exactly like `kill -9`.

Sites (n counts passes in the process):
- `runtime.after_input:n`: once n input tuples were applied (`OperatorInstance.apply_run`/`apply`; a run of
  tuples is cut there, so the fast paths run up to the kill), including replayed ones;
- `runtime.before_process:n`: before the n-th tuple is applied;
- `runtime.replaying:n`: before the n-th tuple below its partition's crash point is replayed;
- `runtime.before_append:n` / `runtime.after_append:n`: around the n-th record appended to an output queue
  (`OutputQueue.append`, `append_run`: a G-check run is cut there);
- `chunks.between_parts:n`: after the n-th part of a value written in parts (`queuestore.chunks.split`);
- `store.before_commit:n`: inside the SQLite transaction that commits the n-th batch handed to the writer's
  I/O thread, its rows inserted, before COMMIT;
- `store.io_error:n`: that commit fails with a disk I/O error instead (the process lives on);
- `kafka.before_commit:n` / `kafka.after_commit:n`: around the n-th Kafka transaction commit of a writer;
- `recovery.after_ec_build:n`: after the n-th eventual checkpoint built (during recovery itself): read back
  from the log, or from the EC cache or a standby's followed log and the log's tail;
- `ec_cache.mid_snapshot:n`: the n-th EC cache snapshot (`queuestore.ec_cache`) dies with half its bytes
  in the temporary file, before the rename that would put it in place;
- `attach.plan.after_ec_build:n`: the same in an attached query's planning task (a Python worker), which
  SIGKILLs the driver's whole process group (as `attach.sink.mid_batch`): the driver dies during recovery;
- `standby.took_over:n`: a standby (`operators.standby`) holds the partition's writer (the old one fenced)
  and hands what it followed to recovery, the n-th time, before the log's tail is read;
- `replica.states_at:n`: a standby's replica (`operators.replica`) at the n-th takeover, its states brought
  to the log's final crash point and not yet handed to recovery;
- `trim.before_prune:n`: inside the n-th trim, the log's head deleted (SQLite's range delete committed,
  Kafka's `delete_records` answered), the stream index not yet pruned (`StreamIndex.prune`);
- `results.before_ack:n`: inside the n-th commit of `cec run`'s results writer (`IncrementalOutputs`; its
  first is the one of its start), both files fsynced and its progress file renamed, no acknowledgement
  sent yet;
- `attach.sink.mid_batch:n`: the n-th micro-batch of an attached query dies with half of one output
  partition durable: the driver sink's n-th partition write (writers="driver"; the driver SIGKILLs
  itself), or the first write task of micro-batch n (writers="executors") SIGKILLs the driver's whole
  process group (in local mode: the driver, its JVM and Python workers) once half its records committed;
- `attach.writer.kill_task:n`: the first attempt of every write task of micro-batch n SIGKILLs its own
  Python worker once half its records are committed (Spark retries the task);
- `attach.writer.in_trim:n`: a write task's n-th trim in its Python worker (`operators.spark.trim.TaskTrim`:
  its batch and the carried directory committed, `DeleteRecords` answered, nothing reported to the driver
  yet) SIGKILLs the driver's whole process group, as `attach.sink.mid_batch` does;
- `attach.writer.in_commit:n`: inside the n-th commit, in a write task's Python worker, of a transaction
  that carries a trim bound's closed-window directory (`TaskTrim.carry`): the transaction's records sent
  and delivered to the broker, `commit_transaction` not called yet (the transaction stays open, so a
  restart's writer aborts it), SIGKILLs the driver's whole process group;
- `attach.writer.before_trim:n`: a write task's n-th trim, right after its batch's commit (the carried
  directory durable), before `DeleteRecords` is sent, SIGKILLs the driver's whole process group.
"""

from __future__ import annotations

import importlib.abc
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "BOOT",
    "ENV",
    "PLAN_AFTER_EC_BUILD",
    "SINK_MID_BATCH",
    "SITES",
    "WRITER_BEFORE_TRIM",
    "WRITER_IN_COMMIT",
    "WRITER_IN_TRIM",
    "WRITER_KILL_TASK",
    "install",
    "parse",
]

ENV = "CEC_TEST_KILL"
BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
SINK_MID_BATCH = "attach.sink.mid_batch"
WRITER_KILL_TASK = "attach.writer.kill_task"
WRITER_IN_TRIM = "attach.writer.in_trim"
WRITER_IN_COMMIT = "attach.writer.in_commit"
WRITER_BEFORE_TRIM = "attach.writer.before_trim"
PLAN_AFTER_EC_BUILD = "attach.plan.after_ec_build"


SITES = frozenset(
    {
        "runtime.after_input",
        "runtime.before_process",
        "runtime.replaying",
        "runtime.before_append",
        "runtime.after_append",
        "chunks.between_parts",
        "store.before_commit",
        "store.io_error",
        "kafka.before_commit",
        "kafka.after_commit",
        "recovery.after_ec_build",
        "ec_cache.mid_snapshot",
        "standby.took_over",
        "replica.states_at",
        "trim.before_prune",
        "results.before_ack",
        SINK_MID_BATCH,
        WRITER_KILL_TASK,
        WRITER_IN_TRIM,
        WRITER_IN_COMMIT,
        WRITER_BEFORE_TRIM,
        PLAN_AFTER_EC_BUILD,
    }
)


def parse(spec: str) -> dict[str, int]:
    """The plan "site:n[,site:n...]" (n defaults to 1); an unknown site is an error."""
    plan: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        site, _, count = item.partition(":")
        if site not in SITES:
            raise ValueError(f"{ENV}: no kill site {site!r}")
        plan[site] = int(count or 1)
    return plan


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_driver() -> None:
    """SIGKILL the driver from a local-mode Python worker: PySpark's daemon puts its workers in process
    groups of their own, but not in a session of their own, so the session's leader is the driver (the
    tests start it with a session of its own); its group holds the driver and its JVM."""
    os.killpg(os.getsid(0), signal.SIGKILL)
    kill()


# -- when a module is imported -------------------------------------------------------------------------
_PATCHES: dict[str, list[Callable[[ModuleType], None]]] = {}
_LOCK = threading.Lock()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the patches of a module right after it is executed (found by the finders behind this one)."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in _PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            with _LOCK:
                patches = _PATCHES.pop(name, [])
            for patch in patches:
                patch(module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def on_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    with _LOCK:
        _PATCHES.setdefault(name, []).append(patch)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _Counter:
    def __init__(self) -> None:
        self.seen = 0
        self.lock = threading.Lock()


# -- the sites -------------------------------------------------------------------------------------------
def _tuples(n: int) -> None:
    """Kill once `n` tuples were applied (`n` = 0: before the first)."""
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.OperatorInstance
        apply_run, apply = cls.apply_run, cls.apply

        def apply_run_(self: Any, tuples: Sequence[Any]) -> None:
            left = n - counter.seen
            if len(tuples) < left:
                counter.seen += len(tuples)
                return apply_run(self, tuples)
            if left > 0:
                apply_run(self, tuples[:left])
            kill()

        def apply_(self: Any, tup: Any) -> Any:
            if counter.seen >= n:
                kill()
            counter.seen += 1
            fate = apply(self, tup)
            if counter.seen >= n:
                kill()
            return fate

        cls.apply_run, cls.apply = apply_run_, apply_

    on_import("operators.engine.instance", patch)


def _replaying(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.OperatorInstance
        apply_run, apply = cls.apply_run, cls.apply

        def below(self: Any, tup: Any) -> bool:
            contract = self.contract
            return contract is not None and tup.offset < contract.crash_pos[tup.partition]

        def apply_run_(self: Any, tuples: Sequence[Any]) -> None:
            for i, tup in enumerate(tuples):
                if below(self, tup):
                    counter.seen += 1
                    if counter.seen == n:
                        if i:
                            apply_run(self, tuples[:i])
                        kill()
            return apply_run(self, tuples)

        def apply_(self: Any, tup: Any) -> Any:
            if below(self, tup):
                counter.seen += 1
                if counter.seen == n:
                    kill()
            return apply(self, tup)

        cls.apply_run, cls.apply = apply_run_, apply_

    on_import("operators.engine.instance", patch)


def _appends(n: int, *, before: bool) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.OutputQueue
        append, append_run = cls.append, cls.append_run

        def append_(self: Any, value: bytes, meta: Any) -> None:
            with counter.lock:
                counter.seen += 1
                due = counter.seen == n
            if due and before:
                kill()
            append(self, value, meta)
            if due:
                kill()

        def append_run_(
            self: Any, kind: str, time: int, keys: list[str], seqs: list[int], values: list[bytes]
        ) -> None:
            with counter.lock:
                first = counter.seen
                counter.seen += len(keys)
            if counter.seen < n:
                return append_run(self, kind, time, keys, seqs, values)
            cut = n - first - (1 if before else 0)  # records of this run appended before the kill
            if cut > 0:
                append_run(self, kind, time, keys[:cut], seqs[:cut], values[:cut])
            kill()

        cls.append, cls.append_run = append_, append_run_

    on_import("queuestore.output", patch)


def _between_parts(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        split = module.split

        def split_(*args: Any, **kwargs: Any) -> Any:
            for part in split(*args, **kwargs):
                if counter.seen == n:
                    kill()  # the n-th part was appended, the next is asked for
                yield part
                counter.seen += 1
            if counter.seen == n:
                kill()

        module.split = split_

    on_import("queuestore.output", patch)


def _sqlite_commit(n: int, *, fail: bool) -> None:
    """Inside the commit of the n-th batch handed to the SQLite writer's I/O thread (it may coalesce
    several batches into one transaction: the first commit after the n-th was handed over)."""
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.SqlitePartitionWriter
        submit, commit = cls._submit, cls._commit

        def submit_(self: Any) -> None:
            if self._pending:
                with counter.lock:
                    counter.seen += 1
                    if counter.seen == n:
                        self._doomed = True  # before it is handed over: its commit comes after this
            submit(self)

        def commit_(self: Any) -> None:
            if getattr(self, "_doomed", False):
                self._doomed = False
                if not fail:
                    kill()
                import sqlite3

                raise sqlite3.OperationalError("disk I/O error")
            commit(self)

        cls._submit, cls._commit = submit_, commit_

    on_import("queuestore.sqlite", patch)


def _kafka_commit(n: int, *, before: bool) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.KafkaPartitionWriter
        commit = cls._commit_transaction

        def commit_(self: Any, producer: Any) -> None:
            with counter.lock:
                counter.seen += 1
                due = counter.seen == n
            if due and before:
                kill()
            commit(self, producer)
            if due:
                kill()

        cls._commit_transaction = commit_

    on_import("queuestore.kafka", patch)


def _standby_took_over(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.Standby
        took_over = cls.took_over

        def took_over_(self: Any) -> Any:
            followed = took_over(self)
            counter.seen += 1
            if counter.seen == n:
                kill()
            return followed

        cls.took_over = took_over_

    on_import("operators.standby", patch)


def _replica_states_at(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.StandbyReplica
        states_at = cls.states_at

        def states_at_(self: Any, ec: Any, within: int) -> Any:
            states = states_at(self, ec, within)
            counter.seen += 1
            if counter.seen == n:
                kill()
            return states

        cls.states_at = states_at_

    on_import("operators.replica", patch)


def _after_ec_build(n: int, stop: Callable[[], None] | None = None) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.EventualCheckpointBuilder
        build = cls.build

        def build_(self: Any) -> Any:
            ec = build(self)
            counter.seen += 1
            if counter.seen == n:
                (stop or kill)()
            return ec

        cls.build = build_

    def patch_manager(module: ModuleType) -> None:
        # An eventual checkpoint from the EC cache or from what a standby followed is built too (the log's
        # tail applied to it): the same point of a recovery, on the paths that do not read the log back.
        for name in ("checkpoint_from_cache", "checkpoint_from_followed"):
            original = getattr(module, name)

            def built_(*args: Any, _original: Any = original) -> Any:
                got = _original(*args)
                if not isinstance(got, str):
                    counter.seen += 1
                    if counter.seen == n:
                        (stop or kill)()
                return got

            setattr(module, name, built_)

    on_import("recovery.eventual", patch)
    on_import("recovery.manager", patch_manager)


def _mid_snapshot(n: int) -> None:
    counter = _Counter()

    class _HalfThenKill:
        def __init__(self, file: Any) -> None:
            self._file = file

        def __enter__(self) -> _HalfThenKill:
            return self

        def __exit__(self, *exc: object) -> None:
            self._file.close()

        def write(self, data: bytes) -> int:
            self._file.write(data[: len(data) // 2])
            self._file.flush()
            kill()
            return len(data)

    def patch(module: ModuleType) -> None:
        def open_(path: Any, *args: Any, **kwargs: Any) -> Any:
            file = open(path, *args, **kwargs)  # noqa: SIM115 (closed by the snapshot's `with`)
            if ".tmp-" in os.fspath(path):
                counter.seen += 1
                if counter.seen == n:
                    return _HalfThenKill(file)
            return file

        module.open = open_  # the module's `open` (a global shadows the builtin), not every module's

    on_import("queuestore.ec_cache", patch)


def _before_prune(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.StreamIndex
        prune = cls.prune

        def prune_(self: Any, before_offset: int) -> int:
            with counter.lock:
                counter.seen += 1
                due = counter.seen == n
            if due:
                kill()
            return int(prune(self, before_offset))

        cls.prune = prune_

    on_import("queuestore.index", patch)


def _results_before_ack(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.IncrementalOutputs
        commit = cls._commit

        def commit_(self: Any) -> None:
            with counter.lock:
                counter.seen += 1
                due = counter.seen == n
            if not due:
                return commit(self)
            store = self.store

            class Dying:
                """The store, whose first acknowledgement kills the process instead."""

                def __getattr__(self, name: str) -> Any:
                    return getattr(store, name)

                def acknowledge(self, *args: Any) -> None:
                    kill()

            self.store = Dying()
            commit(self)
            kill()  # no acknowledgement had changed: the same point

        cls._commit = commit_

    on_import("operators.incremental_outputs", patch)


def _driver_sink_mid_batch(n: int) -> None:
    """writers="driver": the n-th partition write of the driver sink with at least two records dies with
    its first half durable."""
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.CecSink
        write = cls._write

        def write_(self: Any, q: int, rows: list[Any]) -> None:
            half = len(rows) // 2
            if half:
                counter.seen += 1
                if counter.seen == n:
                    out = self.outputs[q]
                    append, appended = out.append, [0]

                    def append_(value: bytes, meta: Any) -> None:
                        if appended[0] == half:
                            out.flush()  # the first half durable, then the crash
                            kill()
                        appended[0] += 1
                        append(value, meta)

                    out.append = append_
            write(self, q, rows)

        cls._write = write_

    on_import("operators.spark.sink", patch)


_TASK = threading.local()  # the micro-batch number and attempt of the write task running in this thread


def _executor_writes(plan: dict[str, int]) -> None:
    """writers="executors": both attach sites, in the Python workers that run the write tasks."""
    mid_batch, kill_task = plan.get(SINK_MID_BATCH), plan.get(WRITER_KILL_TASK)

    def patch(module: ModuleType) -> None:
        writer_cls = module.BatchWriter
        call, attempt_of, append_all = writer_cls.__call__, writer_cls._attempt, module._append_all

        def call_(self: Any, batches: Any) -> Any:
            _TASK.batch = self.batch_number
            return call(self, batches)

        def attempt_() -> int:
            _TASK.attempt = attempt_of()
            return int(_TASK.attempt)

        def append_all_(
            writer: Any, messages: Sequence[Any], first: int, last_offset: int, where: str, *extra: Any
        ) -> int:
            batch, attempt = getattr(_TASK, "batch", None), getattr(_TASK, "attempt", None)
            half = len(messages) // 2
            stop: Callable[[], None] | None = None
            if mid_batch is not None and batch == mid_batch:
                stop = _kill_driver
            elif kill_task is not None and batch == kill_task and attempt == 0:
                stop = kill
            if stop is None or not half or first > half:
                return int(append_all(writer, messages, first, last_offset, where, *extra))
            # Appended and committed (with the results of its R records, `extra`: results_topic=).
            append_all(writer, messages[:half], first, last_offset, where, *extra)
            stop()
            raise AssertionError("unreachable")

        writer_cls.__call__ = call_
        writer_cls._attempt = staticmethod(attempt_)
        module._append_all = append_all_

    on_import("operators.spark.writer", patch)


def _task_trim(n: int) -> None:
    counter = _Counter()

    def patch(module: ModuleType) -> None:
        cls = module.TaskTrim
        apply = cls.apply

        def apply_(self: Any, writer: Any, reader: Any) -> int:
            trimmed = int(apply(self, writer, reader))
            if trimmed:
                with counter.lock:
                    counter.seen += 1
                    due = counter.seen == n
                if due:
                    _kill_driver()
            return trimmed

        cls.apply = apply_

    on_import("operators.spark.trim", patch)


def _task_commit_carrying(n: int) -> None:
    """The n-th commit of a write task's transaction that carries a trim bound's directory, before
    `commit_transaction`: the writer is marked when `TaskTrim.carry` put the directory in its open
    transaction, and its commit (whichever thread runs it) looks at the mark."""
    counter = _Counter()

    def patch_trim(module: ModuleType) -> None:
        cls = module.TaskTrim
        carry = cls.carry

        def carry_(self: Any, writer: Any, topic: str, q: int) -> None:
            carry(self, writer, topic, q)
            carried = self._carried_by
            if carried is not None and carried[0] is writer:
                writer._cec_test_carrying = True

        cls.carry = carry_

    def patch_writer(module: ModuleType) -> None:
        cls = module.KafkaPartitionWriter
        commit = cls._commit_transaction

        def commit_(self: Any, producer: Any) -> None:
            if self.__dict__.pop("_cec_test_carrying", False):
                with counter.lock:
                    counter.seen += 1
                    due = counter.seen == n
                if due:
                    _kill_driver()
            commit(self, producer)

        cls._commit_transaction = commit_

    on_import("operators.spark.trim", patch_trim)
    on_import("queuestore.kafka", patch_writer)


_IN_TASK_TRIM = threading.local()


def _task_before_trim(n: int) -> None:
    """A write task's n-th `DeleteRecords`, before it is sent: `KafkaPartitionWriter.trim` as called by
    `TaskTrim.apply` (after the batch's commit), in the worker's thread that runs the task."""
    counter = _Counter()

    def patch_trim(module: ModuleType) -> None:
        cls = module.TaskTrim
        apply = cls.apply

        def apply_(self: Any, writer: Any, reader: Any) -> int:
            _IN_TASK_TRIM.on = True
            try:
                return int(apply(self, writer, reader))
            finally:
                _IN_TASK_TRIM.on = False

        cls.apply = apply_

    def patch_writer(module: ModuleType) -> None:
        cls = module.KafkaPartitionWriter
        trim = cls.trim

        def trim_(self: Any, before_offset: int) -> int:
            if getattr(_IN_TASK_TRIM, "on", False):
                with counter.lock:
                    counter.seen += 1
                    due = counter.seen == n
                if due:
                    _kill_driver()
            return int(trim(self, before_offset))

        cls.trim = trim_

    on_import("operators.spark.trim", patch_trim)
    on_import("queuestore.kafka", patch_writer)


def install(spec: str) -> None:
    """Install the wrappers of every site planned in `spec` (module doc)."""
    plan = parse(spec)
    for site, n in plan.items():
        if site == "runtime.after_input":
            _tuples(n)
        elif site == "runtime.before_process":
            _tuples(n - 1)
        elif site == "runtime.replaying":
            _replaying(n)
        elif site in ("runtime.before_append", "runtime.after_append"):
            _appends(n, before=site == "runtime.before_append")
        elif site == "chunks.between_parts":
            _between_parts(n)
        elif site in ("store.before_commit", "store.io_error"):
            _sqlite_commit(n, fail=site == "store.io_error")
        elif site in ("kafka.before_commit", "kafka.after_commit"):
            _kafka_commit(n, before=site == "kafka.before_commit")
        elif site == "recovery.after_ec_build":
            _after_ec_build(n)
        elif site == "ec_cache.mid_snapshot":
            _mid_snapshot(n)
        elif site == "standby.took_over":
            _standby_took_over(n)
        elif site == "replica.states_at":
            _replica_states_at(n)
        elif site == PLAN_AFTER_EC_BUILD:
            _after_ec_build(n, _kill_driver)
        elif site == "trim.before_prune":
            _before_prune(n)
        elif site == "results.before_ack":
            _results_before_ack(n)
        elif site == SINK_MID_BATCH:
            _driver_sink_mid_batch(n)
        elif site == WRITER_IN_TRIM:
            _task_trim(n)
        elif site == WRITER_IN_COMMIT:
            _task_commit_carrying(n)
        elif site == WRITER_BEFORE_TRIM:
            _task_before_trim(n)
    if SINK_MID_BATCH in plan or WRITER_KILL_TASK in plan:
        _executor_writes(plan)
