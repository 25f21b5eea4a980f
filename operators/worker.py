"""`python -m operators.worker SPEC.json`: run one job in its own process (the unit that gets killed)."""

from __future__ import annotations

import sys
from pathlib import Path

from operators.job import JobSpec, run_job

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m operators.worker SPEC.json", file=sys.stderr)
        return 2
    run_job(JobSpec.from_json(Path(args[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
