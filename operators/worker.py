"""`python -m operators.worker SPEC.json`: run one job in its own process (the unit that gets killed)."""

from __future__ import annotations

import sys
from pathlib import Path

from operators.job import JobSpec, run_job
from queuestore.exceptions import WriterFencedError

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m operators.worker SPEC.json", file=sys.stderr)
        return 2
    try:
        run_job(JobSpec.from_json(Path(args[0]).read_text()))
    except WriterFencedError as exc:
        # Not a crash to debug: another instance owns the output partition now (one clear line).
        print(f"worker: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
