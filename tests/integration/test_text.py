"""The telnet text protocol against a live broker, over real TCP: a raw socket, and `nc`
when it is installed."""
from __future__ import annotations

import json
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
    c = Client(broker.text_port)
    try:
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
    finally:
        c.close()


def test_bad_lines_get_err_and_the_connection_stays_open(broker):
    c = Client(broker.text_port)
    try:
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
    finally:
        c.close()
    # a client that disconnects mid-line does not disturb the next one
    s = socket.create_connection(("127.0.0.1", broker.text_port))
    s.sendall(b"PUBS news half a li")
    s.close()
    c = Client(broker.text_port)
    try:
        assert c.cmd("PUBS news after").startswith("OK ")
        assert c.cmd("QUIT") == "BYE"
        with pytest.raises(ConnectionError):
            c.line()
    finally:
        c.close()


HELP_FIRST = "PUBS <topic> <message>                    -> OK <partition> <offset>"


def test_pipelined_pubs_are_answered_in_order(broker):
    c = Client(broker.text_port)
    try:
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
    finally:
        c.close()


def test_cons_commits_what_the_previous_cons_returned(broker):
    c = Client(broker.text_port)
    try:
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
    finally:
        c.close()
    assert {r[2]["Body"] for r in first} == {f"first{i}" for i in range(5)}
    assert {r[2]["Body"] for r in got} == {f"second{i}" for i in range(3)}
    c = Client(broker.text_port)
    try:
        sub = c.cmd("SUBS solo ledger").split()[1]
        again = cons_until(c, f"CONS solo {sub}", len(last))
        assert {r[2]["Body"] for r in again} == {r[2]["Body"] for r in last}   # at-least-once
        # explicit partitions: exactly those, offsets kept in the group as a simple consumer
        key = next(k for k in (f"k{i}" for i in range(100)) if partition_for_key(k.encode(), 2) == 1)
        assert c.cmd(f'PUBS solo {{"Key": "{key}", "Body": "to-one"}}').split()[1] == "1"
        c2 = c.cmd("SUBS solo manual 1").split()[1]
        only = cons_until(c, f"CONS solo {c2}", 1)
        assert {r[0] for r in only} == {1}
    finally:
        c.close()


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
    c = Client(broker.text_port)
    try:
        assert c.cmd("PUBS news ok").startswith("OK ")
    finally:
        c.close()
    assert time.monotonic() - t0 < 10
