"""`python -m operators.worker SPEC.json [--crash-after K | --standby [--no-replica]]`: run one job in its own
process (the unit that gets killed; `--crash-after`: `operators.crash_after`; `--standby`: as the standby of
the job's writer, `operators.standby`, with its replica unless `--no-replica`).

An error the product reports to users (a damaged log, a failed append, a bad configuration) ends the
process with one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from cec import progress
from cec.exceptions import CecError
from operators.job import JobSpec, run_job
from operators.standby import Standby
from queuestore.kafka_config import quiet_librdkafka
from recovery.timeline import process_started

__all__ = ["REPORTED_ERROR_EXIT", "USER_ERRORS", "main"]

# Errors that are reported as one line (the CLI's convention), never as a traceback.
USER_ERRORS = (CecError,)  # the one root: store, recovery and pipeline errors too
REPORTED_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130


def _environment_errors() -> tuple[type[BaseException], ...]:
    """Errors of the machine or the cluster rather than of cec (a full disk, a refused permission, a Kafka
    client error no layer turned into its own): reported in one line too, naming what failed."""
    try:
        from confluent_kafka import KafkaException
    except ImportError:  # the Kafka client is optional
        return (OSError,)
    return (OSError, KafkaException)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    crash_after = None
    standby = False
    replica = True
    if len(args) == 3 and args[1] == "--crash-after" and args[2].isdigit():
        crash_after = int(args[2])
        args = args[:1]
    elif len(args) in (2, 3) and args[1] == "--standby" and args[2:] in ([], ["--no-replica"]):
        standby = True
        replica = len(args) == 2
        args = args[:1]
    if len(args) != 1:
        print(
            "usage: python -m operators.worker SPEC.json [--crash-after K | --standby [--no-replica]]",
            file=sys.stderr,
        )
        return 2
    try:
        spec = JobSpec.from_json(Path(args[0]).read_text())
        # The CLI's --log-level (passed down in the environment); progress as plain lines: the parent may
        # hold the terminal, and two live displays on one terminal garble each other.
        level = logging.getLevelName(os.environ.get("CEC_LOG_LEVEL", "WARNING").upper())
        logging.basicConfig(
            level=level if isinstance(level, int) else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
        quiet_librdkafka(level if isinstance(level, int) else logging.WARNING)  # as the CLI does
        if spec.progress:
            logging.getLogger("cec.progress").setLevel(logging.INFO)
            progress.set_reporter(progress.LogReporter())
        run_job(
            spec,
            crash_after=crash_after,
            started=process_started(),
            standby=Standby(replica=replica) if standby else None,
        )
    except USER_ERRORS as exc:
        # A mistake the user can fix (e.g. resuming a log against another input): one line, no traceback,
        # and an exit code the parent (the CLI) recognises as already reported.
        print(f"cec: error: {exc}", file=sys.stderr, flush=True)
        return REPORTED_ERROR_EXIT
    except _environment_errors() as exc:
        print(f"cec: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return REPORTED_ERROR_EXIT
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the CLI reports it, once
        return INTERRUPTED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
