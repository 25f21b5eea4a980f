"""The `cec` command line (`cec = "cec.cli:main"`): one module per command family, `main.py` assembles
them.

- `main.py`: the parser, the options of every command (--log-level, --quiet, --version), logging and
  the progress display, and how an error becomes one line and an exit code;
- `demo.py`, `run.py` (over a CSV file; the parser of `cec run`), `run_topic.py` (over a Kafka topic),
  `run_operator.py` (the operator flags of `cec run`, whichever its input), `inspect.py`, `recover.py`,
  `state.py`: a command each;
- `common.py`: what several commands share (flag groups, printing, workers, report lines).
"""

from cec.cli.main import DISTRIBUTION, build_parser, main

__all__ = ["DISTRIBUTION", "build_parser", "main"]
