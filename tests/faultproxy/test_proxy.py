"""The fault proxy itself: byte-exact when no rule fires, and each fault as specified, against a fake
broker that records every byte it receives and answers each request at once (so what a test sees is the
proxy's doing); then, on Apache Kafka, that clients behind the proxy stay behind it.

Delays are asserted as lower bounds on elapsed time (a loaded machine can only make them longer)."""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, suppress

import pytest
from confluent_kafka.admin import AdminClient

from tests.brokers import Broker
from tests.faultproxy import API_KEYS, Chaos, Fault, FaultPlan, FaultProxy, Rule
from tests.faultproxy.frames import FrameReader, RequestHeader, request_frame, request_header, response_frame
from tests.helpers import wait_for

PRODUCE, FETCH, ENDTXN, METADATA = (
    API_KEYS["Produce"],
    API_KEYS["Fetch"],
    API_KEYS["EndTxn"],
    API_KEYS["Metadata"],
)
DEADLINE = 30.0


class FakeBroker:
    """Accepts connections, keeps every byte each one sent, answers every request frame at once with a
    response of the same correlation id and a body the test can predict (`answer`)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.received: list[bytearray] = []
        self.headers: list[list[tuple[float, RequestHeader]]] = []
        self.closed: list[bool] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def answer(header: RequestHeader) -> bytes:
        return response_frame(
            header.correlation_id,
            b"answer-%d-" % header.correlation_id + b"z" * (header.correlation_id % 5000),
        )

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                index = len(self.received)
                self.received.append(bytearray())
                self.headers.append([])
                self.closed.append(False)
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        frames = FrameReader()
        with closing(conn):
            while True:
                try:
                    data = conn.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    with self._lock:
                        self.closed[index] = True
                    return
                with self._lock:
                    self.received[index] += data
                for frame in frames.feed(data):
                    header = request_header(frame)
                    if header is None:
                        continue
                    with self._lock:
                        self.headers[index].append((time.monotonic(), header))
                    with suppress(OSError):  # the proxy may have cut the connection
                        conn.sendall(self.answer(header))

    def seen(self, index: int) -> list[RequestHeader]:
        """The request headers connection `index` sent so far (none before it is accepted)."""
        with self._lock:
            return [h for _, h in self.headers[index]] if index < len(self.headers) else []

    def is_closed(self, index: int) -> bool:
        with self._lock:
            return index < len(self.closed) and self.closed[index]

    def all_seen(self) -> list[RequestHeader]:
        with self._lock:
            return [h for headers in self.headers for _, h in headers]

    def close(self) -> None:
        self.server.close()


class Client:
    """A raw client connection: sends frames, reads whole response frames."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        self.frames = FrameReader()
        self.got: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, count: int) -> list[bytes]:
        """Read until `count` response frames in all; returns them. Raises on EOF before that."""
        while len(self.got) < count:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"closed after {len(self.got)} responses")
            self.got.extend(self.frames.feed(data))
        return self.got[:count]

    def closed_by_peer(self) -> bool:
        """True once the proxy closed the connection (EOF or reset), after whatever it still sent."""
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
                self.got.extend(self.frames.feed(data))
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def fake() -> Iterator[FakeBroker]:
    broker = FakeBroker()
    yield broker
    broker.close()


@pytest.fixture
def proxy(fake: FakeBroker) -> Iterator[FaultProxy]:
    with FaultProxy(fake.address) as p:
        yield p


def _request(api: int, correlation: int, client: str = "tester", size: int = 10) -> bytes:
    return request_frame(api, 9, correlation, client, random.Random(correlation).randbytes(size))


@pytest.mark.parametrize(
    "plan",
    [None, FaultPlan(Rule(Fault.DROP, client="someone-else"), Chaos(1.0, client="nobody"), seed=3)],
    ids=["no-plan", "rules-that-never-match"],
)
def test_frames_pass_through_byte_exact_when_no_rule_fires(
    fake: FakeBroker, proxy: FaultProxy, plan: FaultPlan | None
) -> None:
    proxy.plan = plan
    rng = random.Random(11)
    requests = [
        _request(
            rng.choice([PRODUCE, FETCH, ENDTXN, METADATA]), i, size=rng.choice([0, 1, 100, 70_000, 1 << 20])
        )
        for i in range(1, 41)
    ]
    stream = b"".join(requests)
    client = Client(proxy.address)
    try:
        at = 0
        while at < len(stream):  # in pieces that cut frames and headers anywhere
            step = rng.choice([1, 3, 7, 500, 65_536, 300_000])
            client.send(stream[at : at + step])
            at += step
        answers = client.read(len(requests))
    finally:
        client.close()
    assert bytes(fake.received[0]) == stream
    assert answers == [FakeBroker.answer(h) for h in fake.seen(0)]
    assert [h.correlation_id for h in fake.seen(0)] == list(range(1, 41))
    assert proxy.total_injected() == 0
    assert sum(proxy.requests().values()) == 40


def test_a_delay_holds_the_request_and_what_follows_it_on_its_connection(
    fake: FakeBroker, proxy: FaultProxy
) -> None:
    proxy.plan = FaultPlan(Rule(Fault.DELAY, apis=frozenset({ENDTXN}), nth=1, delay_s=3.0))
    held = Client(proxy.address)
    other = Client(proxy.address)
    try:
        sent = time.monotonic()
        held.send(_request(ENDTXN, 1) + _request(PRODUCE, 2))
        wait_for(lambda: len(fake.headers) == 2, DEADLINE)  # both connections are up
        other.send(_request(PRODUCE, 3))
        assert other.read(1) == [FakeBroker.answer(RequestHeader(PRODUCE, 9, 3, "tester"))]
        assert proxy.delivered_late()["EndTxn"] == 0  # answered while the other connection is held
        assert held.read(2)  # both answered, in order, once released
        with fake._lock:
            arrivals = {h.correlation_id: (at, conn) for conn, hs in enumerate(fake.headers) for at, h in hs}
    finally:
        held.close()
        other.close()
    assert arrivals[1][1] == arrivals[2][1] != arrivals[3][1]
    assert [h.correlation_id for h in fake.seen(arrivals[1][1])] == [1, 2]  # order kept behind the delay
    assert arrivals[1][0] - sent >= 3.0 and arrivals[2][0] >= arrivals[1][0]
    assert proxy.injected() == {("delay", "EndTxn"): 1}
    assert proxy.delivered_late() == {"EndTxn": 1} and proxy.late_answers() == {"EndTxn": 1}


def test_a_delayed_request_still_reaches_the_broker_after_its_client_left(
    fake: FakeBroker, proxy: FaultProxy
) -> None:
    proxy.plan = FaultPlan(Rule(Fault.DELAY, apis=frozenset({PRODUCE}), nth=1, delay_s=0.5))
    client = Client(proxy.address)
    client.send(_request(PRODUCE, 1) + _request(FETCH, 2))
    wait_for(lambda: len(fake.headers) == 1, DEADLINE)
    client.close()  # gives up before the answer, as a client whose request timed out
    wait_for(lambda: len(fake.seen(0)) == 2, DEADLINE)
    assert [h.correlation_id for h in fake.seen(0)] == [1, 2]
    wait_for(lambda: fake.is_closed(0), DEADLINE)  # then the proxy closes the broker side
    wait_for(lambda: proxy.late_answers() == {"Produce": 1}, DEADLINE)  # answered, to nobody


def test_a_hold_keeps_the_request_until_released_even_after_its_client_left(
    fake: FakeBroker, proxy: FaultProxy
) -> None:
    """A held request (and what follows it on its connection) reaches the broker at `release()`, not
    before, whenever that is; the client leaving meanwhile changes nothing; the next hold waits for the
    next release."""
    proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=frozenset({PRODUCE}), nth=1))
    client = Client(proxy.address)
    client.send(_request(PRODUCE, 1) + _request(FETCH, 2))
    other = Client(proxy.address)
    try:
        other.send(_request(FETCH, 3))
        assert len(other.read(1)) == 1  # the other connection is not held
        client.close()  # gives up, as a client whose request timed out
        assert [h.correlation_id for h in fake.all_seen()] == [3]
        assert proxy.delivered_late() == {} and proxy.late_answers() == {}
        assert proxy.release() == 1
        wait_for(lambda: proxy.late_answers() == {"Produce": 1}, DEADLINE)  # answered, to nobody
        # the request behind the held one follows it, but the broker may answer 1 before it reads 2
        wait_for(lambda: sorted(h.correlation_id for h in fake.all_seen()) == [1, 2, 3], DEADLINE)
        proxy.plan = FaultPlan(Rule(Fault.HOLD, apis=frozenset({PRODUCE}), nth=1))
        other.send(_request(PRODUCE, 4) + _request(FETCH, 5))
        wait_for(lambda: proxy.injected()[("hold", "Produce")] == 2, DEADLINE)
        other.send(_request(FETCH, 6))
        with pytest.raises(TimeoutError):  # nothing answers while held: the socket's timeout shows it
            other.sock.settimeout(0.5)
            other.read(2)
        assert [h.correlation_id for h in fake.all_seen()].count(4) == 0
        other.sock.settimeout(DEADLINE)
        proxy.release()
        assert len(other.read(4)) == 4  # 4, 5 and 6, in order, after the release
    finally:
        other.close()
    assert proxy.injected() == {("hold", "Produce"): 2}
    with pytest.raises(ValueError, match="bad mix"):
        Chaos(0.5, mix={Fault.HOLD: 1.0})


def test_drop_swallows_the_answer_and_only_it(fake: FakeBroker, proxy: FaultProxy) -> None:
    proxy.plan = FaultPlan(Rule(Fault.DROP, apis=frozenset({PRODUCE}), nth=2))
    client = Client(proxy.address)
    try:
        client.send(b"".join(_request(PRODUCE, c) for c in (1, 2, 3)))
        wait_for(lambda: len(fake.seen(0)) == 3, DEADLINE)  # the broker got all three
        answers = client.read(2)
    finally:
        client.close()
    assert answers == [FakeBroker.answer(h) for h in fake.seen(0) if h.correlation_id != 2]
    assert proxy.injected() == {("drop", "Produce"): 1}


def test_disconnect_before_loses_the_request_with_the_connection(fake: FakeBroker, proxy: FaultProxy) -> None:
    proxy.plan = FaultPlan(Rule(Fault.DISCONNECT_BEFORE, apis=frozenset({ENDTXN}), nth=1))
    client = Client(proxy.address)
    try:
        client.send(_request(PRODUCE, 1) + _request(ENDTXN, 2) + _request(PRODUCE, 3))
        assert client.closed_by_peer()
        wait_for(lambda: fake.is_closed(0), DEADLINE)
    finally:
        client.close()
    assert [h.correlation_id for h in fake.seen(0)] == [1]  # what came before it still went
    assert proxy.injected() == {("disconnect_before", "EndTxn"): 1}


def test_disconnect_after_lets_the_broker_act_and_cuts_the_answer(
    fake: FakeBroker, proxy: FaultProxy
) -> None:
    proxy.plan = FaultPlan(Rule(Fault.DISCONNECT_AFTER, apis=frozenset({ENDTXN}), nth=1))
    client = Client(proxy.address)
    try:
        client.send(_request(PRODUCE, 1) + _request(ENDTXN, 2))
        assert client.closed_by_peer()
        wait_for(lambda: fake.is_closed(0), DEADLINE)
    finally:
        client.close()
    assert [h.correlation_id for h in fake.seen(0)] == [1, 2]  # the broker got it
    assert client.got == [FakeBroker.answer(fake.seen(0)[0])]  # its answer never came
    assert proxy.injected() == {("disconnect_after", "EndTxn"): 1}


def test_a_blackholed_client_is_swallowed_whole_until_healed(fake: FakeBroker, proxy: FaultProxy) -> None:
    proxy.blackhole(client="victim")
    victim = Client(proxy.address)
    again = Client(proxy.address)
    bystander = Client(proxy.address)
    try:
        victim.send(_request(METADATA, 1, client="victim-1"))
        again.send(_request(PRODUCE, 2, client="victim-1"))  # a new connection of the same client
        bystander.send(_request(PRODUCE, 3, client="bystander"))
        assert bystander.read(1)
        wait_for(lambda: proxy.by_fault().get("blackhole") == 2, DEADLINE)
        assert [h.client_id for h in fake.all_seen()] == ["bystander"]
        proxy.heal()
        fresh = Client(proxy.address)
        try:
            fresh.send(_request(PRODUCE, 4, client="victim-1"))
            assert fresh.read(1)  # after healing, a new connection goes through
        finally:
            fresh.close()
    finally:
        for c in (victim, again, bystander):
            c.close()
    assert proxy.injected() == {("blackhole", "Metadata"): 1, ("blackhole", "Produce"): 1}


def test_a_blackhole_armed_after_a_count_of_requests_starts_at_that_request(
    fake: FakeBroker, proxy: FaultProxy
) -> None:
    """`blackhole(client, after=2, api=...)`: the client's requests go through until its second request
    of that API, which goes through too; from the next one on it is swallowed, other clients untouched."""
    proxy.blackhole(client="victim", after=2, api="EndTxn")
    victim, other = Client(proxy.address), Client(proxy.address)
    try:
        victim.send(
            _request(ENDTXN, 1, "victim") + _request(PRODUCE, 2, "victim") + _request(ENDTXN, 3, "victim")
        )
        assert len(victim.read(3)) == 3
        victim.send(_request(PRODUCE, 4, "victim"))
        other.send(_request(PRODUCE, 5, "other"))
        assert len(other.read(1)) == 1
        wait_for(lambda: proxy.by_fault().get("blackhole") == 1, DEADLINE)
        assert sorted(h.correlation_id for h in fake.all_seen()) == [1, 2, 3, 5]
    finally:
        victim.close()
        other.close()
    again = Client(proxy.address)  # a new connection of the client: swallowed from its first request
    try:
        again.send(_request(FETCH, 6, "victim-2"))
        wait_for(lambda: proxy.by_fault().get("blackhole") == 2, DEADLINE)
    finally:
        again.close()
    assert 6 not in [h.correlation_id for h in fake.all_seen()]


def test_a_blackholed_connection_only(fake: FakeBroker, proxy: FaultProxy) -> None:
    first, second = Client(proxy.address), Client(proxy.address)
    try:
        first.send(_request(PRODUCE, 1, client="same"))
        second.send(_request(PRODUCE, 2, client="same"))
        assert first.read(1) and second.read(1)
        target = min(c.id for c in proxy.connections())
        proxy.blackhole(conn=target)
        first.send(_request(PRODUCE, 3, client="same"))
        second.send(_request(PRODUCE, 4, client="same"))
        assert second.read(2)
        wait_for(lambda: proxy.by_fault().get("blackhole") == 1, DEADLINE)
    finally:
        first.close()
        second.close()
    assert sorted(h.correlation_id for h in fake.all_seen()) == [1, 2, 4]


def test_cut_closes_the_chosen_clients_connections(fake: FakeBroker, proxy: FaultProxy) -> None:
    a, b = Client(proxy.address), Client(proxy.address)
    try:
        a.send(_request(PRODUCE, 1, client="a"))
        b.send(_request(PRODUCE, 2, client="b"))
        assert a.read(1) and b.read(1)
        assert proxy.cut("a") == 1
        assert a.closed_by_peer()
        b.send(_request(PRODUCE, 3, client="b"))
        assert b.read(2)
    finally:
        a.close()
        b.close()


def _headers(n: int, seed: int) -> list[RequestHeader]:
    rng = random.Random(seed)
    apis = [PRODUCE, FETCH, ENDTXN, METADATA, API_KEYS["AddPartitionsToTxn"]]
    return [RequestHeader(rng.choice(apis), 1, i, rng.choice(["w-1", "w-2", "r-1"])) for i in range(n)]


def test_rules_fire_as_specified_and_a_seed_replays_the_same_decisions() -> None:
    headers = _headers(5000, seed=2)
    nth = FaultPlan(Rule(Fault.DROP, apis=frozenset({ENDTXN}), client="w-2", nth=3))
    fired = [h for h in headers if nth.decide(h) is not None]
    matching = [h for h in headers if h.api_key == ENDTXN and h.client_id == "w-2"]
    assert fired == [matching[2]] and nth.fired == [1]

    limited = FaultPlan(Rule(Fault.DISCONNECT_AFTER, apis=frozenset(), times=7))
    assert sum(limited.decide(h) is not None for h in headers) == 7 and limited.exhausted()

    def decisions(seed: int) -> list[tuple[str, float] | None]:
        plan = FaultPlan(
            Rule(Fault.DELAY, apis=frozenset({PRODUCE}), probability=0.1, delay_s=0.2),
            Chaos(0.3, delay_s=(0.01, 0.05), times=400),
            seed=seed,
        )
        out = []
        for h in headers:
            got = plan.decide(h)
            out.append(None if got is None else (got.fault.value, got.delay_s))
        return out

    first = decisions(5)
    assert first == decisions(5) and first != decisions(6)
    faults = [d for d in first if d is not None]
    chaos = [d for d in faults if d != ("delay", 0.2)]
    assert len(chaos) == 400  # the limit
    kinds = {f for f, _ in chaos}
    assert kinds == {
        f.value for f in (Fault.DELAY, Fault.DROP, Fault.DISCONNECT_BEFORE, Fault.DISCONNECT_AFTER)
    }
    assert all(0.01 <= d <= 0.05 for f, d in chaos if f == "delay")
    # The plain rule fires on about a tenth of the produces (binomial: 5 standard deviations around)
    produces = sum(h.api_key == PRODUCE for h in headers)
    plain = sum(d == ("delay", 0.2) for d in faults)
    assert abs(plain - produces / 10) < 5 * (produces * 0.09) ** 0.5


def test_clients_behind_the_proxy_are_told_the_proxys_address(
    fault_proxy: FaultProxy, proxied_broker: Broker
) -> None:
    """The broker's second listener advertises the proxy: metadata fetched through the proxy names it, so
    every later connection of the client goes through it too; the broker's own listener names itself."""
    through = AdminClient({"bootstrap.servers": fault_proxy.address})
    direct = AdminClient({"bootstrap.servers": proxied_broker.bootstrap})
    topic = f"proxy-{uuid.uuid4().hex[:8]}"
    assert [f"{b.host}:{b.port}" for b in through.list_topics(timeout=DEADLINE).brokers.values()] == [
        fault_proxy.address
    ]
    assert [f"{b.host}:{b.port}" for b in direct.list_topics(timeout=DEADLINE).brokers.values()] == [
        proxied_broker.bootstrap
    ]
    assert topic not in through.list_topics(timeout=DEADLINE).topics
    assert fault_proxy.requests()["Metadata"] >= 2 and proxied_broker.proxied is not None
