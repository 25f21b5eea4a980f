"""A TCP proxy between Kafka clients and a broker that injects faults into chosen requests.

The broker must advertise the proxy's address to the clients that come through it, or they would connect
to the broker directly after their first metadata request: `tests.brokers` starts Apache Kafka with a
second listener for that (`Broker.proxied`), advertised at a port whose listening socket the launcher
holds and hands to the proxy.

The proxy runs its own asyncio event loop in a daemon thread; every public method is safe to call from any
other thread. Each client connection gets its own connection to the broker; requests are read frame by
frame (`tests.faultproxy.frames`), their headers decide their fate (`tests.faultproxy.plan`), and frames
that no fault touches go through byte for byte. Responses are matched to requests by correlation id.
What was injected is counted by fault and API (`injected()`), and the latest injections are kept with
their connection, client id and correlation id (`events()`), for failure messages beside the plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.faultproxy.frames import FrameReader, api_name, request_header, response_correlation
from tests.faultproxy.plan import Fault, FaultPlan, Injection

__all__ = ["Connection", "FaultProxy"]

T = TypeVar("T")
_READ = 1 << 16
_EVENTS = 5000


@dataclass(frozen=True)
class Connection:
    """A client connection as the proxy sees it."""

    id: int
    client_id: str | None
    requests: int


@dataclass(eq=False)
class _Conn:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    client_id: str | None = None
    requests: int = 0
    # (release time on the loop's clock, or inf: held until `FaultProxy.release()`; the hold generation
    # at queueing; frame; API of a delayed request); None: the client side ended, close after what is held.
    queue: asyncio.Queue[tuple[float, int, bytes, str | None] | None] = field(default_factory=asyncio.Queue)
    release_at: float = 0.0  # the latest release time queued: a delay holds everything behind it too
    pending: dict[int, int] = field(default_factory=dict)  # correlation id -> API key
    drop: set[int] = field(default_factory=set)  # correlation ids whose responses are swallowed
    cut: set[int] = field(default_factory=set)  # correlation ids whose responses cut the connection
    delayed: set[int] = field(default_factory=set)  # correlation ids of delayed requests
    client_gone: bool = False
    blackholed: bool = False


class FaultProxy:
    """Listens on `listen` (a bound, listening socket, kept open: the proxy serves a duplicate of it, so
    the port stays reserved when the proxy stops) or on a free loopback port, and forwards to
    `upstream` ("host:port")."""

    def __init__(
        self, upstream: str, *, listen: socket.socket | None = None, plan: FaultPlan | None = None
    ) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._listen = listen
        self.plan = plan  # swapped whole from any thread; read by the loop per request
        self._lock = threading.Lock()
        self._injected: Counter[tuple[str, str]] = Counter()
        self._requests: Counter[str] = Counter()
        self._late: Counter[str] = Counter()  # delayed requests sent on to the broker, by API
        self._late_answers: Counter[str] = Counter()  # ... and answered by the broker, by API
        self._clients: Counter[str | None] = Counter()  # connections by the client id of their first request
        self._by_client: Counter[tuple[str | None, str]] = Counter()  # requests by (client id, API)
        self._events: deque[str] = deque(maxlen=_EVENTS)
        self._blackholed_clients: set[str] = set()
        # Blackholes that start after a count of requests: [client prefix, API name or None, requests left].
        self._armed_blackholes: list[list[Any]] = []
        self._blackholed_conns: set[int] = set()
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = time.monotonic()
        # Held requests (Fault.HOLD) wait for a release of their generation: `release()` frees every
        # generation up to the current one and opens the next.
        self._hold_generation = 0
        self._released_generation = -1
        self._release_event: asyncio.Event | None = None
        self.address = ""

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self._call(self._serve())
        return self

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _serve(self) -> None:
        self._release_event = asyncio.Event()
        if self._listen is not None:
            sock = self._listen.dup()
            self._server = await asyncio.start_server(self._accept, sock=sock)
        else:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._loop = self._thread = None

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            self._abort(conn)
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- controls (any thread) ---------------------------------------------------------------------------
    def blackhole(
        self, client: str | None = None, conn: int | None = None, *, after: int = 0, api: str | None = None
    ) -> None:
        """Swallow every request, from now on, of clients whose id starts with `client` (their new
        connections too) or of connection `conn`: nothing reaches the broker, nothing answers. With
        `after` (clients only), the blackhole starts once `after` more requests of those clients (of `api`
        only, if given) have gone through: decided by the proxy in the clients' own request stream, so a
        test cuts a client off at a chosen point of its work whatever the machine's pace."""
        with self._lock:
            if client is not None:
                if after > 0:
                    self._armed_blackholes.append([client, api, after])
                else:
                    self._blackholed_clients.add(client)
            if conn is not None:
                self._blackholed_conns.add(conn)

    def heal(self) -> None:
        """End every blackhole (connections already blackholed stay silent until their clients drop
        them, as a client would after its request timeout)."""
        with self._lock:
            self._blackholed_clients.clear()
            self._blackholed_conns.clear()
            self._armed_blackholes.clear()

    def release(self) -> int:
        """Send on every request held by a `hold` rule (and what waits behind it on its connection), in
        order; returns how many connections were holding. Later holds wait for the next release."""

        async def release() -> int:
            loop = asyncio.get_running_loop()
            holding = 0
            for conn in self._conns.values():
                if math.isinf(conn.release_at):
                    conn.release_at = loop.time()
                    holding += 1
            self._released_generation = self._hold_generation
            self._hold_generation += 1
            event, self._release_event = self._release_event, asyncio.Event()
            if event is not None:
                event.set()
            return holding

        return self._call(release())

    def cut(self, client: str | None = None) -> int:
        """Cut every connection (of clients whose id starts with `client`); returns how many."""

        async def cut() -> int:
            chosen = [
                c for c in self._conns.values() if client is None or (c.client_id or "").startswith(client)
            ]
            for conn in chosen:
                self._abort(conn)
            return len(chosen)

        return self._call(cut())

    def connections(self) -> list[Connection]:
        async def listing() -> list[Connection]:
            return [Connection(c.id, c.client_id, c.requests) for c in self._conns.values()]

        return self._call(listing())

    def injected(self) -> Counter[tuple[str, str]]:
        """Faults injected so far by (fault, API)."""
        with self._lock:
            return Counter(self._injected)

    def by_fault(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (fault, _), n in self.injected().items():
            out[fault] += n
        return dict(out)

    def total_injected(self) -> int:
        with self._lock:
            return sum(self._injected.values())

    def requests(self) -> Counter[str]:
        """Requests read so far by API."""
        with self._lock:
            return Counter(self._requests)

    def delivered_late(self) -> Counter[str]:
        """Delayed requests that have reached the broker (at the end of their delay), by API."""
        with self._lock:
            return Counter(self._late)

    def requests_of(self, client: str) -> Counter[str]:
        """Requests so far by API, of the clients whose id starts with `client`."""
        with self._lock:
            out: Counter[str] = Counter()
            for (client_id, api), n in self._by_client.items():
                if (client_id or "").startswith(client):
                    out[api] += n
            return out

    def clients(self) -> Counter[str | None]:
        """Connections so far by client id (of their first request)."""
        with self._lock:
            return Counter(self._clients)

    def late_answers(self) -> Counter[str]:
        """Delayed requests the broker has answered (so acted on), by API, whether or not the client
        was still there to get the answer."""
        with self._lock:
            return Counter(self._late_answers)

    def events(self, last: int = 40) -> list[str]:
        with self._lock:
            return list(self._events)[-last:]

    def reset(self) -> None:
        """No plan, no blackhole, counts and events cleared (between tests sharing one proxy)."""
        self.plan = None
        self.heal()
        with self._lock:
            self._injected.clear()
            self._requests.clear()
            self._late.clear()
            self._late_answers.clear()
            self._clients.clear()
            self._by_client.clear()
            self._events.clear()

    def describe(self, last: int = 40) -> str:
        """The plan, the counts and the latest injections: what a failure message needs to replay."""
        plan = self.plan.describe() if self.plan is not None else "no plan"
        counts = ", ".join(f"{f}/{a}: {n}" for (f, a), n in sorted(self.injected().items())) or "none"
        lines = [
            f"proxy {self.address} -> {self._upstream[0]}:{self._upstream[1]}; {plan}",
            f"injected: {counts}",
        ]
        lines += self.events(last)
        return "\n".join(lines)

    # -- the connections (event loop) --------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(next(self._ids), writer, up_writer)
        self._conns[conn.id] = conn
        sender = self._spawn(self._send_upstream(conn))
        down = self._spawn(self._pump_down(conn, up_reader))
        try:
            await self._pump_up(conn, reader)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.client_gone = True
            conn.queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.gather(sender, down, return_exceptions=True)
            self._conns.pop(conn.id, None)

    def _record(self, conn: _Conn, fault: Fault, api: int, correlation: int, delay: float = 0.0) -> None:
        name = api_name(api)
        at = time.monotonic() - self._started
        extra = f" {delay * 1000:.0f}ms" if fault is Fault.DELAY else ""
        with self._lock:
            self._injected[(fault.value, name)] += 1
            self._events.append(
                f"{at:9.3f}s conn {conn.id} ({conn.client_id}) {name} corr {correlation}: {fault.value}{extra}"
            )

    def _is_blackholed(self, conn: _Conn, api: str) -> bool:
        if conn.blackholed:
            return True
        with self._lock:
            for armed in list(self._armed_blackholes):
                prefix, counted, left = armed
                if (conn.client_id or "").startswith(prefix) and counted in (None, api):
                    armed[2] = left - 1
                    if armed[2] <= 0:  # this request is the last one through
                        self._armed_blackholes.remove(armed)
                        self._blackholed_clients.add(prefix)
                        return False
            if conn.id in self._blackholed_conns or any(
                (conn.client_id or "").startswith(c) for c in self._blackholed_clients
            ):
                conn.blackholed = True
        return conn.blackholed

    async def _pump_up(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        """Client -> broker: read requests, decide their fate, queue them for the sender."""
        frames = FrameReader()
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_READ)
            if not data:
                rest = frames.rest()
                if rest:  # a torn last frame goes through as it came (the broker judges it)
                    release = max(loop.time(), conn.release_at)
                    conn.queue.put_nowait((release, self._hold_generation, rest, None))
                return
            for frame in frames.feed(data):
                header = None if frames.raw else request_header(frame)
                injection: Injection | None = None
                if header is not None:
                    conn.requests += 1
                    if conn.requests == 1:
                        conn.client_id = header.client_id
                        with self._lock:
                            self._clients[header.client_id] += 1
                    with self._lock:
                        self._requests[header.api] += 1
                        self._by_client[(conn.client_id, header.api)] += 1
                    if self._is_blackholed(conn, header.api):
                        self._record(conn, Fault.BLACKHOLE, header.api_key, header.correlation_id)
                        continue
                    plan = self.plan
                    injection = plan.decide(header) if plan is not None else None
                release = max(loop.time(), conn.release_at)
                if header is None or injection is None:
                    if header is not None:
                        conn.pending[header.correlation_id] = header.api_key
                    conn.queue.put_nowait((release, self._hold_generation, frame, None))
                    conn.release_at = release
                    continue
                fault = injection.fault
                self._record(conn, fault, header.api_key, header.correlation_id, injection.delay_s)
                if fault is Fault.DISCONNECT_BEFORE:
                    # The request is lost with the connection; what was queued before it still goes.
                    conn.client.transport.abort()
                    return
                conn.pending[header.correlation_id] = header.api_key
                if fault is Fault.DELAY:
                    release += injection.delay_s
                    conn.delayed.add(header.correlation_id)
                elif fault is Fault.HOLD:
                    release = math.inf
                    conn.delayed.add(header.correlation_id)
                elif fault is Fault.DROP:
                    conn.drop.add(header.correlation_id)
                elif fault is Fault.DISCONNECT_AFTER:
                    conn.cut.add(header.correlation_id)
                late = header.api if fault in (Fault.DELAY, Fault.HOLD) else None
                conn.queue.put_nowait((release, self._hold_generation, frame, late))
                conn.release_at = release

    async def _send_upstream(self, conn: _Conn) -> None:
        """Frames to the broker at their release times, in order; after the client side ended, what is
        held still goes (late), then the broker connection closes."""
        loop = asyncio.get_running_loop()
        writer = conn.upstream
        try:
            while True:
                item = await conn.queue.get()
                if item is None:
                    break
                release, generation, frame, late = item
                if math.isinf(release):
                    await self._released(generation)
                else:
                    wait = release - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                writer.write(frame)
                if conn.queue.empty() or late is not None:
                    await writer.drain()
                if late is not None:
                    with self._lock:
                        self._late[late] += 1
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                if writer.can_write_eof():
                    writer.write_eof()
                await writer.drain()

    async def _released(self, generation: int) -> None:
        """Until a `release()` has freed the holds of `generation`."""
        while self._released_generation < generation:
            event = self._release_event
            assert event is not None  # made by _serve, before any connection
            await event.wait()

    async def _pump_down(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        """Broker -> client: responses, each swallowed, forwarded or turned into a cut."""
        frames = FrameReader()
        client = conn.client
        try:
            while True:
                data = await reader.read(_READ)
                if not data:
                    break
                for frame in frames.feed(data):
                    correlation = None if frames.raw else response_correlation(frame)
                    if correlation is not None:
                        api = conn.pending.pop(correlation, None)
                        if correlation in conn.delayed and api is not None:
                            conn.delayed.discard(correlation)
                            with self._lock:
                                self._late_answers[api_name(api)] += 1
                    if conn.client_gone:
                        continue  # an answer for a client that left: nobody to give it to
                    if correlation is not None:
                        if correlation in conn.drop:
                            conn.drop.discard(correlation)
                            continue
                        if correlation in conn.cut:
                            conn.client_gone = True
                            client.transport.abort()
                            break
                    client.write(frame)
                if not conn.client_gone:
                    try:
                        await client.drain()
                    except (ConnectionError, OSError):
                        # The client left: the broker side stays up until the held requests are sent.
                        conn.client_gone = True
                        client.transport.abort()
        except (ConnectionError, OSError):
            pass
        finally:
            conn.client_gone = True
            client.transport.abort()
            conn.upstream.transport.abort()

    def _abort(self, conn: _Conn) -> None:
        conn.client_gone = True
        conn.client.transport.abort()
        conn.upstream.transport.abort()
