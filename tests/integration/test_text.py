"""The telnet text protocol against a live broker, over real TCP: a raw socket, and `nc`
when it is installed."""
from __future__ import annotations

import json
import signal
import shutil
import socket
import subprocess
import time

import pytest

from mesh.client import Admin, Consumer
from mesh.wire.partitioner import partition_for_key
from mesh.testing.launcher import BrokerProcess, free_port, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    port = free_port()
    b = BrokerProcess("n1", str(tmp_path_factory.mktemp("text") / "n1"), extra=["--text-port", str(port)]).start()
    b.text_port = port
    with Admin(b.address) as a:
        for name, n in (("news", 4), ("solo", 2), ("shared", 4), ("batch", 3)):
            a.create_topic(name, n)
    yield b
    b.stop()


class Client:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> str:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the gateway")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cmd(self, text: str) -> str:
        self.send(text.encode() + b"\n")
        return self.line()

    def cons(self, text: str) -> list[str]:
        """A CONS: the record lines before END."""
        self.send(text.encode() + b"\n")
        out = []
        while True:
            line = self.line()
            if line == "END" or line.startswith("ERR"):
                return out if line == "END" else [line]
            out.append(line)

    def close(self):
        self.sock.close()


def records(lines):
    out = []
    for line in lines:
        p, o, obj = line.split(" ", 2)
        out.append((int(p), int(o), json.loads(obj)))
    return out


def cons_until(c: Client, cmd: str, n: int, timeout_s: float = 15) -> list:
    got = []
    wait_until(lambda: got.extend(records(c.cons(cmd))) or len(got) >= n, timeout_s, f"{n} records from {cmd!r}")
    return got


def test_pubs_subs_cons_round_trip_with_json_messages(broker):
    with Client(broker.text_port) as c:
        ok, p, off = c.cmd("PUBS news hello world").split()
        assert ok == "OK" and 0 <= int(p) < 4 and int(off) >= 0
        ok, p, off = c.cmd('PUBS news {"Header": "h", "Key": "124", "Body": "Hello World!"}').split()
        assert ok == "OK" and int(p) == partition_for_key(b"124", 4)
        ok, p2, _ = c.cmd('PUBS news {"Key": "124", "Body": {"nested": [1, 2]}}').split()
        assert p2 == p   # the same key, the same partition
        sub = c.cmd("SUBS news audit").split()
        assert sub[0] == "OK"
        got = cons_until(c, f"CONS news {sub[1]}", 3)
        by_body = {r[2]["Body"]: r for r in got}
        assert set(by_body) == {"hello world", "Hello World!", '{"nested":[1,2]}'}
        rec = by_body["Hello World!"]
        assert (rec[0], rec[1]) == (int(p), int(off))
        assert rec[2]["Key"] == "124" and rec[2]["Header"] == "h" and rec[2]["Timestamp"] > 0
        assert "Key" not in by_body["hello world"][2]
        # the records went into the log as real records: the Python client reads them too
        with Consumer("news", bootstrap=broker.address, auto_offset_reset="earliest") as consumer:
            seen = []
            wait_until(lambda: seen.extend(r for rs in consumer.poll_batches(100) for r in rs) or len(seen) >= 3,
                       10, "3 records")
        hello = next(r for r in seen if r.value == b"Hello World!")
        assert hello.key == b"124" and hello.headers == (("Header", b"h"),)
        # with an offset: every partition the subscription holds starts over there
        again = c.cons(f"CONS news {sub[1]} 0")
        assert {r[2]["Body"] for r in records(again)} == set(by_body)


def test_bad_lines_get_err_and_the_connection_stays_open(broker):
    with Client(broker.text_port) as c:
        bad = ["FROB x", "PUBS news", "PUBS", "PUBS nosuchtopic hi", "SUBS news", "SUBS news g 0-9",
               "SUBS news g x,y", "CONS news 999", "CONS nosuch 1 2 3 4", "SUBS nosuchtopic g"]
        for line in bad:
            assert c.cmd(line).startswith("ERR "), line
        sub = c.cmd("SUBS news g1").split()[1]
        assert c.cmd(f"CONS solo {sub}").startswith("ERR ")      # wrong topic for the subscription
        assert c.cmd(f"CONS news {sub} minus1").startswith("ERR ")
        c.send(b"\xff\xfe not utf-8\n")
        assert c.line().startswith("ERR ")
        c.send(b"PUBS news " + b"x" * (2 << 20) + b"\n")         # longer than any line may be
        assert c.line().startswith("ERR line longer")
        c.send(b"\r\n\n   \n")                                   # blank lines are ignored
        c.send(b"PUBS news still here\r\n")                      # CRLF, as telnet sends
        assert c.line().startswith("OK ")
        assert c.cmd("help") == HELP_FIRST
    # a client that disconnects mid-line does not disturb the next one
    s = socket.create_connection(("127.0.0.1", broker.text_port))
    s.sendall(b"PUBS news half a li")
    s.close()
    with Client(broker.text_port) as c:
        assert c.cmd("PUBS news after").startswith("OK ")
        assert c.cmd("QUIT") == "BYE"
        with pytest.raises(ConnectionError):
            c.line()


HELP_FIRST = "PUBS <topic> <message>                    -> OK <partition> <offset>"


def test_pipelined_pubs_are_answered_in_order(broker):
    with Client(broker.text_port) as c:
        c.send(b"".join(b"PUBS batch m%d\n" % i for i in range(300)))
        answers = [c.line().split() for _ in range(300)]
        assert all(a[0] == "OK" for a in answers)
        last = {}
        for _, p, off in answers:   # offsets grow per partition in send order
            assert int(off) > last.get(p, -1)
            last[p] = int(off)
        sub = c.cmd("SUBS batch b1").split()[1]
        got = cons_until(c, f"CONS batch {sub}", 300)
        assert sorted(r[2]["Body"] for r in got) == sorted(f"m{i}" for i in range(300))


def test_cons_commits_what_the_previous_cons_returned(broker):
    with Client(broker.text_port) as c:
        for i in range(5):
            assert c.cmd(f"PUBS solo first{i}").startswith("OK")
        sub = c.cmd("SUBS solo ledger").split()[1]
        first = cons_until(c, f"CONS solo {sub}", 5)
        assert c.cons(f"CONS solo {sub}") == []   # acknowledges the first five
        for i in range(3):
            assert c.cmd(f"PUBS solo second{i}").startswith("OK")
        got, last = [], []

        def read_all():   # each CONS acknowledges the one before; the last stays unacknowledged
            last[:] = records(c.cons(f"CONS solo {sub}"))
            got.extend(last)
            return len(got) >= 3 and last
        wait_until(read_all, 15, "the three new records")
        assert c.cmd("QUIT") == "BYE"
    assert {r[2]["Body"] for r in first} == {f"first{i}" for i in range(5)}
    assert {r[2]["Body"] for r in got} == {f"second{i}" for i in range(3)}
    with Client(broker.text_port) as c:
        sub = c.cmd("SUBS solo ledger").split()[1]
        again = cons_until(c, f"CONS solo {sub}", len(last))
        assert {r[2]["Body"] for r in again} == {r[2]["Body"] for r in last}   # at-least-once
        # explicit partitions: exactly those, offsets kept in the group as a simple consumer
        key = next(k for k in (f"k{i}" for i in range(100)) if partition_for_key(k.encode(), 2) == 1)
        assert c.cmd(f'PUBS solo {{"Key": "{key}", "Body": "to-one"}}').split()[1] == "1"
        c2 = c.cmd("SUBS solo manual 1").split()[1]
        only = cons_until(c, f"CONS solo {c2}", 1)
        assert {r[0] for r in only} == {1}


def test_two_subscriptions_of_one_group_share_the_partitions(broker):
    from mesh.client.group_admin import GroupAdmin
    a, b = Client(broker.text_port), Client(broker.text_port)
    try:
        sa = a.cmd("SUBS shared crew").split()[1]
        sb = b.cmd("SUBS shared crew").split()[1]

        def balanced():   # members heartbeat when they read
            assert a.cons(f"CONS shared {sa}") == [] and b.cons(f"CONS shared {sb}") == []
            with GroupAdmin(broker.address) as ga:
                d = ga.describe("crew")
            return d["state"] == "stable" and sorted(len(m["assigned"]) for m in d["members"]) == [2, 2]
        wait_until(balanced, 20, "the two subscriptions to hold two partitions each")
        for i in range(40):
            assert a.cmd(f'PUBS shared {{"Key": "k{i}", "Body": "v{i}"}}').startswith("OK")
        got_a, got_b = [], []

        def all_read():
            got_a.extend(records(a.cons(f"CONS shared {sa}")))
            got_b.extend(records(b.cons(f"CONS shared {sb}")))
            return len({r[2]["Body"] for r in got_a + got_b}) == 40
        wait_until(all_read, 20, "all 40 records to be read")
        # every record read once in the group, each partition by one subscription
        assert got_a and got_b and len(got_a) + len(got_b) == 40
        assert not {r[0] for r in got_a} & {r[0] for r in got_b}
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(shutil.which("nc") is None, reason="nc is not installed")
def test_with_nc(broker):
    proc = subprocess.run(["nc", "-q", "2", "127.0.0.1", str(broker.text_port)],
                          input=b"PUBS news from-nc\nBOGUS\nQUIT\n", capture_output=True, timeout=20)
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("OK ") and lines[1].startswith("ERR ") and lines[2] == "BYE"


def test_the_gateway_survives_many_connections(broker):
    socks = [socket.create_connection(("127.0.0.1", broker.text_port)) for _ in range(50)]
    for s in socks:
        s.close()
    t0 = time.monotonic()
    with Client(broker.text_port) as c:
        assert c.cmd("PUBS news ok").startswith("OK ")
    assert time.monotonic() - t0 < 10


# -- one client never stalls another; the gateway's own limits (issue 13) ------------------

def serves(address: str, topic: str) -> None:
    """The broker still takes an acks=all produce and serves it to a consumer."""
    from mesh.client import Producer
    with Producer(address, acks="all") as p:
        md = p.send(topic, b"still-serving", partition=0).get(timeout=10)
    with Consumer(bootstrap=address, auto_offset_reset="earliest") as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), md.offset)
        got = []
        wait_until(lambda: got.extend(r for rs in c.poll_batches(100) for r in rs) or got, 10, "the record")
    assert got[0].value == b"still-serving"


def test_the_first_cons_may_carry_an_offset(broker):
    with Client(broker.text_port) as c:
        for i in range(4):
            assert c.cmd(f"PUBS solo early{i}").startswith("OK ")
        sub = c.cmd("SUBS solo fresh-group").split()[1]
        got = records(c.cons(f"CONS solo {sub} 0"))   # at once: the group has not assigned yet
        assert got and min(r[1] for r in got) == 0
        got += cons_until(c, f"CONS solo {sub}", 4 - len(got))
        assert {r[2]["Body"] for r in got} >= {f"early{i}" for i in range(4)}
        assert min(r[1] for r in got) == 0
    serves(broker.address, "solo")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two brokers; n1 serves text with small limits: 3 connections (the one idle 1.5 s closed
    to make room), closed after 3 s idle, 2 subscriptions."""
    root = tmp_path_factory.mktemp("text-limits")
    port = free_port()
    n1 = BrokerProcess("n1", str(root / "n1"), extra=[
        "--text-port", str(port), "--text-max-connections", "3", "--text-idle-timeout-ms", "3000",
        "--text-evict-idle-ms", "1500",
        "--text-max-subscriptions", "2"]).start()
    n2 = BrokerProcess("n2", str(root / "n2"), seeds=[n1.address]).start()
    n1.text_port = port
    wait_until(lambda: {x["id"] for x in n1.metadata(500).brokers if x["status"] == "alive"} == {"n1", "n2"},
               20, "n1 to see n2")
    with Admin(n1.address) as a:
        a.create_topic("spread", 4)
        a.create_topic("here", 1)
        a.create_topic("quiet", 1)
    yield n1, n2
    for b in (n2, n1):
        if b.alive():
            b.signal(signal.SIGCONT)
        b.kill()


def _leaders(b, topic: str) -> dict[int, str]:
    with Admin(b.address, request_timeout_ms=1000) as a:
        meta = a.metadata([topic])
    t = next(t for t in meta.topics if t["name"] == topic)
    return {p["partition"]: p["leader"] for p in t["partitions"]}


def test_a_pubs_waiting_for_its_leader_delays_only_its_connection(pair):
    n1, n2 = pair
    wait_until(lambda: set(_leaders(n1, "spread").values()) == {"n1", "n2"}, 20, "leaders on both brokers")
    far = next(p for p, lead in _leaders(n1, "spread").items() if lead == "n2")
    near = next(p for p, lead in _leaders(n1, "spread").items() if lead == "n1")
    far_key = next(k for k in (f"k{i}" for i in range(1000)) if partition_for_key(k.encode(), 4) == far)
    near_key = next(k for k in (f"k{i}" for i in range(1000)) if partition_for_key(k.encode(), 4) == near)
    a, b = Client(n1.text_port), Client(n1.text_port)
    try:
        assert a.cmd(f'PUBS spread {{"Key": "{far_key}", "Body": "warm"}}').startswith("OK ")
        n2.signal(signal.SIGSTOP)          # the leader of `far` stops answering
        a.send(f'PUBS spread {{"Key": "{far_key}", "Body": "stuck"}}\n'.encode())
        for i in range(5):                 # another connection is served meanwhile, at once
            t0 = time.monotonic()
            ok, p, _ = b.cmd(f'PUBS spread {{"Key": "{near_key}", "Body": "free{i}"}}').split()
            assert ok == "OK" and int(p) == near and time.monotonic() - t0 < 2
        a.sock.settimeout(0.05)
        with pytest.raises(socket.timeout):  # ... while a's PUBS still waits
            a.sock.recv(100)
        a.sock.settimeout(20)
        n2.signal(signal.SIGCONT)
        answer = a.line()                   # the leader is back (OK) or the delivery timed out (ERR)
        assert answer.startswith(("OK ", "ERR ")), answer
    finally:
        n2.signal(signal.SIGCONT)
        a.close()
        b.close()
    serves(n1.address, "here")


def test_a_long_cons_delays_only_its_connection(pair):
    n1, _ = pair
    a, b = Client(n1.text_port), Client(n1.text_port)
    try:
        sub = a.cmd("SUBS quiet idle-readers 0").split()[1]
        a.send(f"CONS quiet {sub}\n".encode())      # a long-poll: nothing to read
        t0 = time.monotonic()
        assert b.cmd("PUBS here while-a-waits").startswith("OK ")
        assert time.monotonic() - t0 < 0.45         # well under CONS's wait (0.5 s)
        assert a.line() == "END"
    finally:
        a.close()
        b.close()
    serves(n1.address, "here")


def test_connection_and_subscription_limits(pair):
    n1, _ = pair
    clients = [Client(n1.text_port) for _ in range(3)]
    try:
        for c in clients:
            assert c.cmd("HELP") == HELP_FIRST
            while c.line() != "END":
                pass
        extra = Client(n1.text_port)               # the fourth: refused with a reason, closed
        try:
            assert extra.line().startswith("ERR too many connections")
            with pytest.raises(ConnectionError):
                extra.line()
        finally:
            extra.close()
        assert clients[0].cmd("SUBS here lim1 0").startswith("OK ")
        assert clients[1].cmd("SUBS here lim2 0").startswith("OK ")
        assert clients[2].cmd("SUBS here lim3 0").startswith("ERR ")   # 2 in all
        assert clients[2].cmd("PUBS here still-open").startswith("OK ")
        clients[0].close()                          # its subscription and its slot go with it
        wait_until(lambda: clients[2].cmd("SUBS here lim3 0").startswith("OK "), 10, "a free subscription")
        late = []

        def admitted():
            c = Client(n1.text_port)
            late.append(c)
            return c.cmd("PUBS here late").startswith("OK ")
        wait_until(admitted, 10, "a free connection slot")
    finally:
        for c in clients + late:
            c.close()
    serves(n1.address, "here")


def test_a_full_gateway_closes_the_connection_idle_longest_to_make_room(pair):
    n1, _ = pair
    clients = [Client(n1.text_port) for _ in range(3)]
    late = []
    try:
        for c in clients:                           # clients[0] idle longest
            assert c.cmd("PUBS here hi").startswith("OK ")

        def admitted():   # refused until some connection has been idle 1.5 s
            c = Client(n1.text_port)
            late.append(c)
            return c.cmd("PUBS here room").startswith("OK ")
        wait_until(admitted, 10, "room made for a new connection")
        assert clients[0].line().startswith("ERR idle while the gateway is full")
        with pytest.raises(ConnectionError):
            clients[0].line()
        assert clients[2].cmd("PUBS here kept").startswith("OK ")   # the others stay
    finally:
        for c in clients + late:
            c.close()
    serves(n1.address, "here")


def test_an_idle_connection_is_closed(pair):
    n1, _ = pair
    with Client(n1.text_port) as c:
        assert c.cmd("PUBS here hello").startswith("OK ")
        t0 = time.monotonic()
        assert c.line().startswith("ERR idle for 3000 ms")
        assert 2.5 < time.monotonic() - t0 < 10
        with pytest.raises(ConnectionError):
            c.line()
    serves(n1.address, "here")


# -- the review of the gateway (items 3-7): odd records, trickling clients, bad numbers ------

def test_a_record_whose_value_is_not_bytes_loses_nothing(broker):
    """A low-level client could store values that are not bytes; the broker now refuses
    them (INVALID_RECORD: it checks record fields, mesh.wire.record_check). A null value is
    a record: CONS shows it as "Body": null, with the records around it, and the group
    loses none."""
    from mesh.client import ErrorCode, MeshError
    from mesh.client.transport import Transport
    from mesh.wire import messages as m
    from mesh.wire.records import encode_batch
    with Admin(broker.address) as a:
        a.create_topic("odd", 1)
    t = Transport()
    try:
        produce = lambda values: t.call(broker.address, m.ProduceRequest("odd", 0, -1), encode_batch(values))
        wait_until(lambda: produce([b"r0", b"r1", b"r2"]), 10, "the topic's leader")
        with pytest.raises(MeshError) as e:
            produce(["a str, not bytes", 5, None])
        assert e.value.code == ErrorCode.INVALID_RECORD
        produce([None, b"r6", b"r7"])
    finally:
        t.close()
    shown = ["r0", "r1", "r2", None, "r6", "r7"]
    with Client(broker.text_port) as c:
        sub = c.cmd("SUBS odd odd-readers 0").split()[1]
        got: list = []
        deadline = time.monotonic() + 60   # (a loaded machine)
        while len(got) < len(shown) and time.monotonic() < deadline:
            lines = c.cons(f"CONS odd {sub}")
            assert not any(line.startswith("ERR") for line in lines), lines
            got.extend(records(lines))
        assert [r[1] for r in got] == list(range(len(shown)))
        assert [r[2].get("Body", r[2].get("BodyRepr")) for r in got] == shown
        assert c.cons(f"CONS odd {sub}") == []     # commits them all
        assert c.cmd("QUIT") == "BYE"
    c = Client(broker.text_port)   # the group's next reader: everything was read, nothing skipped
    try:
        sub = c.cmd("SUBS odd odd-readers 0").split()[1]
        assert c.cons(f"CONS odd {sub}") == []
        assert [r[1] for r in records(c.cons(f"CONS odd {sub} 2"))] == list(range(2, len(shown)))
    finally:
        c.close()


@pytest.fixture
def own_gateway(broker):
    """A TextGateway in this process (a client of ``broker``), so a test can break its insides."""
    from mesh.gateway.text import TextGateway
    gw = TextGateway(broker.address, free_port())
    yield gw
    gw.close()


def test_a_cons_that_fails_after_taking_records_gives_them_back(own_gateway, monkeypatch):
    import mesh.gateway.session as session_mod
    real, calls = session_mod.record_line, []

    def fails_once(r):
        calls.append(r.offset)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(r)
    with Admin(own_gateway.address) as a:
        a.create_topic("odd2", 1)
    with Client(own_gateway.port) as c:
        for i in range(3):
            assert c.cmd(f"PUBS odd2 m{i}").startswith("OK ")
        sub = c.cmd("SUBS odd2 give-back 0").split()[1]
        monkeypatch.setattr(session_mod, "record_line", fails_once)
        first = c.cons(f"CONS odd2 {sub}")
        assert first == ["ERR internal error: injected failure"]
        got = cons_until(c, f"CONS odd2 {sub}", 3)     # all three again: none committed unseen
        assert [r[2]["Body"] for r in got] == ["m0", "m1", "m2"]


def test_a_session_replaces_a_producer_whose_io_thread_failed(own_gateway, monkeypatch):
    import mesh.client.producer as producer_mod
    real, calls = producer_mod.encode_batch, []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected encode failure")
        return real(*args, **kwargs)
    with Client(own_gateway.port) as c:
        monkeypatch.setattr(producer_mod, "encode_batch", fails_once)
        answer = c.cmd("PUBS news first")       # its I/O thread fails before sending: not written
        assert answer.startswith("ERR UNKNOWN not written: producer I/O failed"), answer
        for i in range(3):                       # a new producer: PUBS works again
            assert c.cmd(f"PUBS news again{i}").startswith("OK ")


def test_a_string_that_is_not_utf8_or_json_too_deep_is_refused_and_pubs_goes_on(broker):
    with Client(broker.text_port) as c:
        answer = c.cmd('PUBS news {"Key": "k", "Body": "b", "Header": {"\\ud800": "x"}}')
        assert answer.startswith("ERR a header name is not valid UTF-8"), answer
        assert c.cmd("PUBS news after-surrogate-header").startswith("OK ")
        assert c.cmd('PUBS news {"Key": "\\udfff"}').startswith("ERR the key is not valid UTF-8")
        assert c.cmd('PUBS news {"Header": {"h": "\\ud800"}}').startswith("ERR a header value is not valid UTF-8")
        assert c.cmd('PUBS news {"Body": ' + "[" * 50_000 + "]" * 50_000 + "}") == \
            "ERR the message's JSON is nested too deeply"
        # pipelined: the bad one is answered in its place, its neighbours are sent
        c.send(b'PUBS news one\nPUBS news {"Header": {"\\ud800": "x"}}\nPUBS news three\n')
        answers = [c.line() for _ in range(3)]
        assert answers[0].startswith("OK ") and answers[2].startswith("OK "), answers
        assert answers[1].startswith("ERR a header name is not valid UTF-8"), answers


def test_numbers_are_ascii_digits_and_offsets_at_most_2_63_minus_1(broker):
    with Client(broker.text_port) as c:
        for i in range(3):
            assert c.cmd(f'PUBS solo {{"Key": "b{i}", "Body": "bound{i}"}}').startswith("OK ")
        sub = c.cmd("SUBS solo bounds 0-1").split()[1]
        for offset in (str(2 ** 63), str(2 ** 64), "9" * 5000):
            assert c.cmd(f"CONS solo {sub} {offset}").startswith(
                "ERR offset must be at most 9223372036854775807, not "), offset
        for offset in ("²", "٣", "０"):   # digits to str.isdigit, not ASCII
            assert c.cmd(f"CONS solo {sub} {offset}").startswith("ERR offset must be a non-negative integer")
        assert c.cmd("SUBS solo bounds2 ²").startswith("ERR partitions must look like 0,3,5-7")
        assert c.cmd("SUBS solo bounds2 " + "1" * 5000).startswith("ERR partitions '")
        # the subscription was not moved by any of them: it reads from its start
        got = cons_until(c, f"CONS solo {sub}", 3)
        assert {f"bound{i}" for i in range(3)} <= {r[2]["Body"] for r in got}


def test_bytes_that_are_no_command_do_not_keep_a_connection(pair):
    """Idle time counts from the last complete command: a client that sends a byte of a
    line it never finishes (or a blank line) every 50-150 ms is closed after the idle
    timeout (3 s), and is the one closed to make room for a new client (idle 1.5 s)."""
    n1, _ = pair
    hogs = [Client(n1.text_port) for _ in range(3)]
    drip = [b"P", b"U", b"\n"]     # two never finish their line; one sends blank lines only
    ended: dict[int, tuple[str, float]] = {}
    late: list[Client] = []
    admitted: list[float] = []
    t0 = time.monotonic()

    def step():
        for i, h in enumerate(hogs):
            if i in ended:
                continue
            h.sock.settimeout(0.05)
            try:
                ended[i] = (h.line(), time.monotonic() - t0)   # the gateway's last word
                continue
            except socket.timeout:
                pass
            except OSError as exc:
                ended[i] = (f"<{exc}>", time.monotonic() - t0)
                continue
            try:
                h.send(drip[i])
            except OSError:
                pass   # closed: its last line is read next time
        if not admitted and time.monotonic() - t0 > 1.6:
            c = Client(n1.text_port)
            late.append(c)
            if c.cmd("PUBS here room").startswith("OK "):
                admitted.append(time.monotonic() - t0)
        return len(ended) == 3
    try:
        wait_until(step, 10, "the three connections to be closed")
        assert admitted and admitted[0] < 3.0       # room made before any idle timeout
        evicted = [i for i, (line, _) in ended.items() if line.startswith("ERR idle while the gateway is full")]
        assert len(evicted) == 1, ended
        for i, (line, after_s) in ended.items():
            if i in evicted:
                continue
            unfinished = " (a line was started and not finished)" if drip[i] != b"\n" else ""
            assert line == f"ERR idle for 3000 ms{unfinished}: closing", ended
            assert 2.5 < after_s < 6, ended
        for h in hogs:
            h.sock.settimeout(5)
            with pytest.raises(ConnectionError):
                h.line()
        assert late[-1].cmd("PUBS here still-open").startswith("OK ")
    finally:
        for c in hogs + late:
            c.close()
    serves(n1.address, "here")
