"""A log belongs to one input (DESIGN-NOTES section 2): the identity it was built from, kept with the log.

Recovery trusts the log's `pos` vectors as positions *in the input it was built from*. Replaying another
input (a file edited in place, a swapped topic) against them yields stale results (the log's old windows
come back) or mixed ones (the old windows' state plus the new input's tuples), and nothing in the records
themselves could tell. So every log records, before its first record, what it is built from:

    {"format": 1, "input": <the source's identity>, "operator": <the operator's spec>}

as the attachment `input` of its partition (`QueueStore.write_attachment`: a file beside the SQLite
partition, a record in the Kafka companion topic `cec-meta.<topic>`; either way with the log, so a host
with a fresh state directory finds it). `bind_log` is the one place that records and checks it, called by
`operators.job.run_job` before recovery on every host (the CLI, the worker process, the Spark host):

- an empty log belongs to nobody yet: it is bound to the current input (any older attachment is
  replaced: nothing in the log came from that input);
- a non-empty log resumes only against the input (and operator) it records; anything else is an
  `InputMismatchError` that names the log, what differs and how to start fresh;
- fields a source pins (a bounded run's end positions) are not compared: the recorded values win, so a
  restarted run ends where the first one would have.

A Kafka topic input's identity says which records it is (servers, topic, partitions, pinned offsets) but
not how they are read (key/value/time fields, schema, columns, the partitions this instance reads): those
are kept beside it as the attachment `source` (`record_source`), so `cec state --as-of` can read the same
tuples again. Client `config` is left out (it can hold credentials), as are monitoring-only fields.

A log that has records but no attachment was written by a cec release without input identities, or had
its attachment removed; it is refused too: whether it matches the input cannot be known.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from queuestore.base import QueueStore
from recovery.exceptions import InputMismatchError

__all__ = [
    "ATTACHMENT",
    "FORMAT",
    "SOURCE_ATTACHMENT",
    "bind_log",
    "canonical",
    "check_log",
    "differences",
    "record_source",
    "replay_fields",
    "store_name",
]

ATTACHMENT = "input"
SOURCE_ATTACHMENT = "source"
# Not kept: `config` may hold credentials; the rest only steer monitoring or where a reader keeps state.
_UNRECORDED_SOURCE_FIELDS = frozenset({"config", "group_id", "state_dir", "follow"})
FORMAT = 1
_SHOWN_DIFFERENCES = 3
_SHOWN_CHARS = 24


def canonical(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists, keys strings), so that an identity
    computed in this process compares equal to the same identity recorded by another."""
    return json.loads(json.dumps(value, sort_keys=True))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def differences(recorded: Any, current: Any, path: str = "") -> list[str]:
    """Where two identities differ, as `field: X in the log, Y now` (nested fields dotted)."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        out: list[str] = []
        for name in sorted(set(recorded) | set(current)):
            where = f"{path}.{name}" if path else name
            if name not in recorded:
                out.append(f"{where}: none in the log, {_short(current[name])} now")
            elif name not in current:
                out.append(f"{where}: {_short(recorded[name])} in the log, none now")
            else:
                out.extend(differences(recorded[name], current[name], where))
        return out
    if recorded == current:
        return []
    return [f"{path or 'value'}: {_short(recorded)} in the log, {_short(current)} now"]


def store_name(store: QueueStore) -> str:
    bootstrap = getattr(store, "bootstrap_servers", None)
    if bootstrap:
        return f"Kafka at {bootstrap}"
    return str(getattr(store, "root", store.state_dir))


def _fresh(topic: str) -> str:
    return f"to start fresh, use a new --store-dir or delete topic {topic!r}"


def check_log(
    store: QueueStore,
    topic: str,
    partition: int,
    *,
    log_end: int,
    input_identity: Mapping[str, Any],
    operator: Mapping[str, Any] | None = None,
    pinned: Sequence[str] = (),
) -> dict[str, Any] | None:
    """The read-only half of `bind_log`: raises `InputMismatchError` if a non-empty log was built from
    another input or operator; returns the recorded input identity, or None for an empty log (which
    belongs to no input yet). Hosts that can look before they start anything (a Spark driver, before its
    tasks) call it to fail once and clearly instead of in every task attempt."""
    current = {"format": FORMAT, "input": canonical(input_identity), "operator": canonical(operator)}
    if log_end == 0:
        return None
    raw = store.read_attachment(topic, partition, ATTACHMENT)
    return _check(store, topic, partition, log_end, raw, current, pinned)


def _check(
    store: QueueStore,
    topic: str,
    partition: int,
    log_end: int,
    raw: bytes | None,
    current: dict[str, Any],
    pinned: Sequence[str],
) -> dict[str, Any]:
    where = f"{topic}[{partition}] in {store_name(store)}"
    if raw is None:
        raise InputMismatchError(
            f"{where} has {log_end:,} records but no record of the input it was built from "
            f"(written by an older cec?), so it cannot be resumed safely; {_fresh(topic)}"
        )
    try:
        recorded = json.loads(raw)
        if not isinstance(recorded, dict) or recorded.get("format") != FORMAT:
            raise ValueError(f"format {recorded.get('format') if isinstance(recorded, dict) else None}")
    except ValueError as exc:
        raise InputMismatchError(
            f"{where}: the record of the input it was built from is unreadable ({exc}); {_fresh(topic)}"
        ) from None
    recorded_input, current_input = recorded.get("input"), current["input"]
    if isinstance(recorded_input, dict):  # pinned fields: the log's values win, they are not compared
        recorded_input = {k: v for k, v in recorded_input.items() if k not in pinned}
        current_input = {k: v for k, v in current_input.items() if k not in pinned}
    diff_input = differences(recorded_input, current_input, "input")
    diff_operator = differences(recorded.get("operator"), current["operator"], "operator")
    if diff_input or diff_operator:
        what = "another input" if diff_input else "another operator"
        if diff_input and diff_operator:
            what = "another input and operator"
        shown = (diff_input + diff_operator)[:_SHOWN_DIFFERENCES]
        raise InputMismatchError(f"{where} was built from {what} ({'; '.join(shown)}); {_fresh(topic)}")
    return dict(recorded["input"])


def bind_log(
    store: QueueStore,
    topic: str,
    partition: int,
    *,
    log_end: int,
    input_identity: Mapping[str, Any],
    operator: Mapping[str, Any] | None = None,
    pinned: Sequence[str] = (),
) -> dict[str, Any]:
    """Record the identity of the input (and operator) a log is built from, or check it on resume.

    `log_end` is the log's length now; the caller holds the partition's writer lock, so no record can be
    appended concurrently. Returns the input identity the run goes by: the current one for a log that
    starts now, the recorded one (whose `pinned` fields the source must adopt) for a log being resumed.
    Raises `InputMismatchError` when the log was built from something else.
    """
    current = {"format": FORMAT, "input": canonical(input_identity), "operator": canonical(operator)}
    raw = store.read_attachment(topic, partition, ATTACHMENT)
    if log_end == 0:
        encoded = json.dumps(current, sort_keys=True).encode()
        if raw != encoded:  # durable before the first record can be appended
            store.write_attachment(topic, partition, ATTACHMENT, encoded)
        return dict(current["input"])
    return _check(store, topic, partition, log_end, raw, current, pinned)


def replay_fields(source_spec: Mapping[str, Any]) -> dict[str, Any]:
    """What of a source spec is needed to read its tuples again (see the module doc)."""
    return {k: v for k, v in source_spec.items() if k not in _UNRECORDED_SOURCE_FIELDS}


def record_source(
    store: QueueStore, topic: str, partition: int, *, log_end: int, source_spec: Mapping[str, Any]
) -> None:
    """Keep how the log's input is read (`replay_fields`) as the attachment `source`: when the log starts,
    or on resuming a log written before cec kept it (the resumed run reads its input this way).

    Called after `bind_log`, by the partition's writer."""
    raw = store.read_attachment(topic, partition, SOURCE_ATTACHMENT)
    if raw is not None and log_end > 0:
        return
    encoded = json.dumps(canonical(replay_fields(source_spec)), sort_keys=True).encode()
    if raw != encoded:
        store.write_attachment(topic, partition, SOURCE_ATTACHMENT, encoded)
