"""A job as typed data (`JobSpec`): one operator instance with its input, output queue and checkpoint policy.

`JobSpec` holds typed specs (`operators.specs`: the operator, the source, the store; `cec.Checkpointing`)
and takes their dict forms as well. Specs are JSON-able so the same job runs in this process, in a child
process (`python -m operators.worker SPEC.json`, which tests and the CLI SIGKILL), or inside a Spark task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from cec.config import Checkpointing
from cec.exceptions import ConfigError
from cec.spec_form import check_known, json_object
from operators.engine.trimming import TrimPace
from operators.sinks import RESULTS_TOPIC
from operators.specs import OperatorSpec, SourceSpec, StoreSpec

__all__ = ["JobSpec"]


@dataclass
class JobSpec:
    """One operator instance's job. `operator`, `source` and `store` are typed specs; their dict forms
    (`{"type": "aggregate", ...}`) are accepted too and read into them (`from_dict`), as are job files
    written by earlier releases (`from_json`: their `extra` field)."""

    operator: OperatorSpec
    source: SourceSpec
    store: StoreSpec
    output_topic: str
    output_partition: int = 0
    output_partitions: int = 1
    checkpointing: Checkpointing = field(default_factory=Checkpointing)
    batch_size: int = 512
    progress: bool = False
    stats_path: str | None = None
    footprints: bool = True  # False: results only, no fault tolerance (the baseline CEC is measured against)
    trim_every: int | None = None  # trim the output log every this many appended records (None: never)
    # A registered consumer the operator waits for at each trim (back-pressure: `cec run`'s results writer)
    trim_pace: TrimPace | None = None
    # Serve Prometheus metrics (cec.metrics) on metrics_port + output_partition; None: no endpoint.
    metrics_port: int | None = None
    # Also publish every result as a plain JSON record to this Kafka topic, in the output log's
    # transactions (`cec run --results-topic`, `operators.sinks.ResultsTopicOutput`); None: no such topic.
    results_topic: str | None = None
    # Keep the EC cache beside the stream index (design S0, `queuestore.ec_cache`): a restart that finds it
    # reads only the log's tail instead of the extent. Off by default (`cec run --ec-cache on`: with it): at
    # 100,000 keys a restart with it was measured no faster than reading the extent back (docs/recovery.md).
    ec_cache: bool = False

    def __post_init__(self) -> None:
        self.operator = OperatorSpec.from_dict(self.operator)
        self.source = SourceSpec.from_dict(self.source)
        self.store = StoreSpec.from_dict(self.store)
        self.trim_pace = TrimPace.from_dict(self.trim_pace)
        if isinstance(self.checkpointing, Mapping):  # from JSON
            self.checkpointing = Checkpointing.from_dict(dict(self.checkpointing))
        if not isinstance(self.checkpointing, Checkpointing):
            raise ConfigError(f"checkpointing must be a cec.Checkpointing, got {self.checkpointing!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every spec as its dict form."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """A job from its JSON form; one written before `results_topic` was a field carries it in `extra`."""
        data = dict(data)
        extra = data.pop("extra", None) or {}
        if not isinstance(extra, Mapping) or set(extra) - {RESULTS_TOPIC}:
            raise ConfigError(f"unknown job extra field(s): {extra!r}")
        if extra.get(RESULTS_TOPIC) is not None:
            data.setdefault("results_topic", extra[RESULTS_TOPIC])
        check_known(data, (f.name for f in fields(cls)), "job")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_dict(json_object(text, "a job spec"))
