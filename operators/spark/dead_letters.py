"""Dead letters of an attached aggregation, watched on the driver: never a silent empty answer.

The CLI refuses a run in which every input row was dead-lettered (`cec.cli.common.check_not_all_dead`);
the attached query does the same from the figures its sinks already collect per micro-batch (input tuples
from the state partitions' control rows, DEAD records from the writers' summaries, and the first dead
letter's reason, which a write task reads from its own records):

- a micro-batch in which every tuple was dead-lettered is logged as a warning with the first reason, and
  so is, once per run, a run whose dead letters reach `LARGE_SHARE` of its tuples;
- `DeadLetterWatch.figures()` is `lastProgress["cec"]["dead_letters"]`: `batch` and `total` tuples and
  dead letters, `share` of the run's tuples dead-lettered, `first_reason`, and `all_dead_batches`;
- a bounded query (`available_now=True`) whose every tuple in this run was dead-lettered fails with that
  reason when it ends (`DeadLetteredInputError`, raised by the handle's `awaitTermination`).

Dead letters themselves are read back with `operators.spark.results.read_dead_letters`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from cec.exceptions import CodecError
from cec.records import AvroCodec, Kind, OutputRecord
from operators.base import DEAD_LETTER_SCHEMA
from operators.exceptions import DeadLetteredInputError

__all__ = ["LARGE_SHARE", "DeadLetterWatch", "dead_reason", "first_dead_reason"]

log = logging.getLogger(__name__)

# A run whose dead letters reach this share of its tuples is said once: most often a field name or format
# that matches only some records (a half-renamed producer), which leaves results that look plausible.
LARGE_SHARE = 0.5
_CODEC = AvroCodec(DEAD_LETTER_SCHEMA)


def dead_reason(payload: bytes | None) -> str | None:
    """The reason of one DEAD record's payload (`operators.engine.records.DeadLetters`); None if unreadable."""
    if payload is None:
        return None
    try:
        return str(_CODEC.decode(payload)["reason"])
    except (CodecError, KeyError, ValueError, TypeError):
        return None


def first_dead_reason(records: Iterable[OutputRecord]) -> str | None:
    """The reason of the first DEAD record among `records` (in log order), or None."""
    for record in records:
        if record.kind is Kind.DEAD:
            return dead_reason(record.payload)
    return None


class DeadLetterWatch:
    """The run's dead-letter figures on the driver (module doc), fed once per micro-batch under the sink's
    lock. `output_topic` names where the dead letters are, for the messages."""

    def __init__(self, output_topic: str) -> None:
        self.output_topic = output_topic
        self.tuples = 0
        self.dead = 0
        self.batch_tuples = 0
        self.batch_dead = 0
        self.first_reason: str | None = None
        self.all_dead_batches = 0
        self._share_said = False

    def batch(self, batch_id: int, tuples: int, dead: int, reason: str | None) -> None:
        """One written micro-batch: `tuples` handed to the state partitions, `dead` DEAD records written,
        `reason` the first of them (None if there was none, or it was not readable)."""
        self.batch_tuples, self.batch_dead = tuples, dead
        self.tuples += tuples
        self.dead += dead
        if self.first_reason is None and reason is not None:
            self.first_reason = reason
        if dead and dead >= tuples:
            self.all_dead_batches += 1
            log.warning(
                "cec: micro-batch %d: every one of its %s input tuples was dead-lettered (the first: %s); "
                "read them with read_dead_letters(spark, %r, bootstrap_servers)",
                batch_id,
                f"{dead:,}",
                reason or self.first_reason or "reason unknown",
                self.output_topic,
            )
        elif not self._share_said and self.tuples and self.dead / self.tuples >= LARGE_SHARE:
            self._share_said = True
            log.warning(
                "cec: %s of the %s input tuples so far were dead-lettered (the first: %s); read them with "
                "read_dead_letters(spark, %r, bootstrap_servers)",
                f"{self.dead:,}",
                f"{self.tuples:,}",
                self.first_reason or "reason unknown",
                self.output_topic,
            )

    @property
    def every_tuple_dead(self) -> bool:
        """True when this run read tuples and dead-lettered every one of them."""
        return self.dead > 0 and self.dead >= self.tuples

    def check(self) -> None:
        """Raise `DeadLetteredInputError` (one line, with the first reason) if every tuple was dead-lettered."""
        if not self.every_tuple_dead:
            return
        reason = f" (the first: {self.first_reason})" if self.first_reason else ""
        raise DeadLetteredInputError(
            f"every one of the {self.dead:,} input tuples was dead-lettered{reason}; read them with "
            f"read_dead_letters(spark, {self.output_topic!r}, bootstrap_servers)"
        )

    def figures(self) -> dict[str, Any]:
        """`lastProgress["cec"]["dead_letters"]` (module doc)."""
        return {
            "batch_tuples": self.batch_tuples,
            "batch_dead": self.batch_dead,
            "tuples": self.tuples,
            "dead": self.dead,
            "share": self.dead / self.tuples if self.tuples else 0.0,
            "first_reason": self.first_reason,
            "all_dead_batches": self.all_dead_batches,
        }
