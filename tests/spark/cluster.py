"""A Spark standalone cluster on 127.0.0.1 for tests: one master and N workers, started and stopped by pid.

The pip pyspark ships no `sbin/start-*.sh` scripts (DESIGN-NOTES section 4), so each daemon is
`$SPARK_HOME/bin/spark-class org.apache.spark.deploy.{master.Master,worker.Worker}`, with SPARK_HOME the
pyspark package directory, each in its own session (process group) so that stopping it also stops the JVM
that spark-class execs and the executor JVMs a worker forks.

Readiness is a condition, never a sleep: the master's web UI answers `/json` with status ALIVE and every
worker listed there as ALIVE.

Which Python an executor starts is decided by the *driver*: PySpark sends its `PYSPARK_PYTHON` (default
`python3`) with every Python function, and the executor runs that command, resolved on its host (measured
here with Spark 4.3: a worker's own `PYSPARK_PYTHON` is not used). So the driver must set
`PYSPARK_PYTHON` to a Python that has cec installed on every host (tests/spark/cluster_driver.py sets this
venv's interpreter); each worker also gets this venv's `bin` first on its PATH and `PYSPARK_PYTHON` set,
so that a driver that leaves the default `python3` still gets a Python with cec. docs/spark.md describes
the other ways to ship cec: `--archives` of a packed venv, `--py-files`.

Process discovery reads /proc (Linux): an executor JVM and the Python daemon and workers it starts run
with their current directory inside the worker's work dir (`<work_dir>/<app-id>/<executor-id>`), which is
how a test finds one worker's executor to kill and how `stop()` makes sure nothing outlives the cluster.
The pyspark daemon puts itself in a process group of its own, so killing a worker's group does not reach
it; it exits when its executor JVM closes its stdin, and `stop()` SIGKILLs any that did not.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ClusterError",
    "SparkCluster",
    "Worker",
    "executor_processes",
    "free_port",
    "processes_under",
    "start_cluster",
]

_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_READY_TIMEOUT_S = 120.0  # JVM start-up on a loaded 2-core machine took up to ~20 s per daemon


class ClusterError(RuntimeError):
    """The cluster did not start, or a daemon died."""


def free_port() -> int:
    # Racy by nature (released before the JVM binds it); start_cluster retries a failed start.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, max_bytes: int = 3000) -> str:
        if not self.log.exists():
            return ""
        return self.log.read_bytes()[-max_bytes:].decode(errors="replace")

    def kill(self) -> None:
        # Its own process group: spark-class's JVM and (for a worker) the executor JVMs it forked.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


@dataclass
class Worker:
    """One worker daemon; `work_dir` holds one directory per application, one per executor inside."""

    daemon: _Daemon
    work_dir: Path
    webui_port: int

    @property
    def pid(self) -> int:
        return self.daemon.pid


@dataclass
class SparkCluster:
    """A running standalone cluster; `stop()` is idempotent and leaves no process behind."""

    master_url: str
    webui_url: str
    master: _Daemon
    workers: list[Worker]
    root: Path
    _stopped: bool = field(default=False, repr=False)

    def state(self) -> dict[str, Any]:
        """The master's view (its web UI's /json): workers, applications, status."""
        with urllib.request.urlopen(f"{self.webui_url}/json", timeout=5) as resp:
            body = resp.read()
        try:
            return dict(json.loads(body))
        except ValueError:
            raise ClusterError(
                f"{self.webui_url}/json is not a Spark master's state: {body[:80]!r}"
            ) from None

    def alive_workers(self) -> int:
        try:
            state = self.state()
        except OSError:  # the UI is not listening yet
            return 0
        if state.get("status") != "ALIVE":
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def logs(self) -> str:
        parts = [f"--- {d.name} ({d.log}) ---\n{d.log_tail()}" for d in self._daemons()]
        return "\n".join(parts)

    def _daemons(self) -> list[_Daemon]:
        return [self.master, *(w.daemon for w in self.workers)]

    def stop(self) -> None:
        """SIGKILL every daemon's process group, then any process still running inside a worker's work dir
        (pyspark daemons and their workers, which sit in process groups of their own)."""
        if self._stopped:
            return
        self._stopped = True
        for worker in self.workers:
            worker.daemon.kill()
        self.master.kill()
        deadline = time.monotonic() + 30
        while (left := self.leftovers()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def leftovers(self) -> list[int]:
        """Processes of this cluster still running: its daemons' groups and anything in its work dirs."""
        pids = set(processes_under(self.root))
        for daemon in self._daemons():
            if _group_alive(daemon.pid):
                pids.add(daemon.pid)
        return sorted(pids)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _proc_cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:  # gone, or not ours
        return None


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def processes_under(directory: Path) -> list[int]:
    """Pids of the running processes whose current directory is `directory` or below it."""
    root = directory.resolve()
    out = []
    for pid in _pids():
        cwd = _proc_cwd(pid)
        if cwd is not None and (cwd == root or root in cwd.parents):
            out.append(pid)
    return out


def executor_processes(worker: Worker) -> dict[str, list[int]]:
    """The executors running on `worker`: executor directory (`<app-id>/<executor-id>`) -> pids inside it,
    the executor JVM first, then its Python daemon and workers."""
    root = worker.work_dir.resolve()
    found: dict[str, list[int]] = {}
    for pid in processes_under(root):
        cwd = _proc_cwd(pid)
        if cwd is None or cwd == root:
            continue
        name = str(cwd.relative_to(root))
        jvm = any(_EXECUTOR_CLASS in arg for arg in _proc_cmdline(pid))
        pids = found.setdefault(name, [])
        if jvm:
            pids.insert(0, pid)
        else:
            pids.append(pid)
    return found


def _spawn(name: str, args: list[str], env: dict[str, str], log: Path) -> _Daemon:
    spark_class = spark_home() / "bin" / "spark-class"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(spark_class), *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as a whole
        )
    return _Daemon(name, proc, log)


def _env(root: Path, python: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CEC_TEST_KILL", None)
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_LOCAL_DIRS"] = str(root / "local")
    env["SPARK_LOG_DIR"] = str(root / "logs")
    # A port taken between free_port() and the bind must fail the daemon (and start_cluster retries), not
    # move it to the next port, where the URL the tests use would reach another process.
    env["SPARK_DAEMON_JAVA_OPTS"] = "-Dspark.port.maxRetries=0"
    # Executors are forked by the worker and inherit this environment; they run the driver's PYSPARK_PYTHON
    # (module doc), and its default `python3` resolves through this PATH to the venv that has cec.
    env["PYSPARK_PYTHON"] = python
    env["PATH"] = str(Path(python).parent) + os.pathsep + env.get("PATH", "")
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return env


def _wait(
    condition: Callable[[], bool], daemons: list[_Daemon], what: str, timeout: float = _READY_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [d for d in daemons if not d.alive()]
        if dead:
            raise ClusterError(f"{dead[0].name} exited while waiting for {what}:\n{dead[0].log_tail()}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} not reached in {timeout:.0f} s")
        time.sleep(0.1)


def _start_once(root: Path, workers: int, cores: int, memory: str, python: str) -> SparkCluster:
    root.mkdir(parents=True, exist_ok=True)
    (root / "local").mkdir(exist_ok=True)
    env = _env(root, python)
    port, webui = free_port(), free_port()
    master = _spawn(
        "master",
        [_MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)],
        env,
        root / "master.log",
    )
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{webui}", master, [], root)
    try:
        _wait(lambda: cluster.state().get("status") == "ALIVE" if _answers(cluster) else False, [master],
              "the master's web UI")  # fmt: skip
        for i in range(workers):
            work_dir = root / f"worker-{i}"
            work_dir.mkdir(exist_ok=True)
            ui = free_port()
            daemon = _spawn(
                f"worker-{i}",
                [
                    _WORKER_CLASS,
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(ui),
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--work-dir",
                    str(work_dir),
                    cluster.master_url,
                ],
                env,
                root / f"worker-{i}.log",
            )
            cluster.workers.append(Worker(daemon, work_dir, ui))
        _wait(lambda: cluster.alive_workers() == workers, cluster._daemons(), f"{workers} registered workers")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _answers(cluster: SparkCluster) -> bool:
    try:
        cluster.state()
    except OSError:
        return False
    return True


def start_cluster(
    root: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1200m",
    python: str | None = None,
    attempts: int = 3,
) -> SparkCluster:
    """Start a master and `workers` workers (each `cores` cores and `memory`, its own work dir under
    `root`), and return once every worker has registered with the master."""
    errors: list[str] = []
    for attempt in range(attempts):
        try:
            return _start_once(root / f"cluster-{attempt}", workers, cores, memory, python or sys.executable)
        except ClusterError as exc:  # most likely a port taken between free_port() and the bind: retry
            errors.append(str(exc))
    raise ClusterError("the Spark standalone cluster did not start:\n" + "\n".join(errors))
