"""Output writers kept alive across micro-batches in a reused Python worker (`operators.spark.writer`,
"Reuse"): a write task whose partition's writer here committed the log up to the very cursor the driver
hands it, in the same run, as attempt 0, appends through it without `init_transactions()` and without
reading the log. Anything else closes the kept writer and takes the partition over afresh."""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queuestore.kafka import KafkaPartitionWriter

__all__ = ["LiveWriter", "close_live", "discard", "keep_live", "take_live"]

log = logging.getLogger(__name__)


class LiveWriter:
    """One output partition's store and transactional writer in this Python worker, and where the log
    ends after that writer's last commit (`next_offset`; None before its first)."""

    def __init__(
        self, session: str | None, bootstrap_servers: str, client: Mapping[str, str], topic: str, q: int
    ):
        from queuestore.kafka import KafkaQueueStore

        self.session = session
        self.topic, self.q = topic, q
        # The writer's locks go to a directory of this worker: on another host the driver's state_dir does
        # not exist, and on the driver's host its OutputQueue holds the partition's lock (module doc).
        self.scratch = Path(tempfile.mkdtemp(prefix="cec-writer-"))
        try:
            self.store = KafkaQueueStore(bootstrap_servers, self.scratch, config=dict(client))
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.writer: KafkaPartitionWriter | None = None
        self.next_offset: int | None = None

    def open(self) -> KafkaPartitionWriter:
        """A new transactional writer: `init_transactions()` fences every earlier writer of the partition."""
        if self.writer is not None:
            old, self.writer = self.writer, None
            try:
                old.close(_DISCARD_TIMEOUT_S)
            except Exception as exc:  # fenced or failed: it holds nothing of ours any more
                log.debug("closing the replaced writer of %s[%d]: %s", self.topic, self.q, exc)
        self.next_offset = None
        self.writer = self.store.writer(self.topic, self.q)
        return self.writer

    def close(self, timeout: float | None = 60.0) -> None:
        try:
            if self.writer is not None:
                self.writer.close(timeout)
        finally:
            self.writer = None
            self.store.close()
            shutil.rmtree(self.scratch, ignore_errors=True)


# Writers kept alive across micro-batches in this (reused) Python worker, per (bootstrap, topic, q): a write
# task whose partition's writer here committed the log up to the very cursor the driver hands it, in the
# same run (`session`), as attempt 0, appends through it without init_transactions() and without reading
# the log (module doc, "Reuse"). At most _LIVE_MAX, least recently used first out.
_LIVE: OrderedDict[tuple[str, str, int], LiveWriter] = OrderedDict()
_LIVE_MAX = 64
_DISCARD_TIMEOUT_S = 5.0


def take_live(
    key: tuple[str, str, int], session: str | None, attempt: int, next_offset: int
) -> LiveWriter | None:
    """The cached writer of `key` if it may append at `next_offset` unchecked, else None (a stale one is
    closed: another session's, or a writer that is not known to end the log there)."""
    live = _LIVE.pop(key, None)
    if live is None:
        return None
    usable = (
        session is not None
        and live.session == session
        and attempt == 0
        and live.writer is not None
        and live.writer.failure is None
        and live.next_offset == next_offset
    )
    if usable:
        return live
    discard(live)
    return None


def discard(live: LiveWriter) -> None:
    """Close a writer that will not be used again; it may be fenced or failed, which is no error here."""
    try:
        live.close(_DISCARD_TIMEOUT_S)
    except Exception as exc:  # a fenced producer may refuse to close cleanly; nothing of ours is open
        log.debug("discarding the cached writer of %s[%d]: %s", live.topic, live.q, exc)


def keep_live(key: tuple[str, str, int], live: LiveWriter) -> None:
    _LIVE[key] = live
    while len(_LIVE) > _LIVE_MAX:
        discard(_LIVE.popitem(last=False)[1])


@atexit.register
def close_live() -> None:
    """Close every writer kept in this process (at exit; a test that kept some)."""
    while _LIVE:
        discard(_LIVE.popitem()[1])
