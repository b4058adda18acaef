"""The shared launcher (mesh.testing.launcher): deadlines, a broker that cannot start,
pause / resume, restart on the same address and data."""
import pytest

from mesh.testing.launcher import BrokerExited, BrokerProcess, Cluster, free_port, wait_until

pytestmark = pytest.mark.integration


def test_wait_until_returns_the_value_or_says_what_it_waited_for():
    calls = []

    def third_time():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return "done"
    assert wait_until(third_time, 5, "three calls", interval_s=0.001) == "done"
    with pytest.raises(AssertionError, match=r"waiting for nothing \(last error: ConnectionError"):
        wait_until(lambda: (_ for _ in ()).throw(ConnectionError("never")), 0.05, "nothing", interval_s=0.01)
    assert 0 < free_port() < 65536


def test_free_ports_are_below_the_ephemeral_range_and_apart_per_worker(monkeypatch):
    from mesh.testing.launcher import _port_slice
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(p < low for p in ports)   # not handed out twice
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    slices = []
    for w in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", w)
        slices.append(set(_port_slice()))
    assert all(len(s) >= 1000 for s in slices) and not (slices[0] & slices[1] or slices[1] & slices[2] or slices[0] & slices[2])


def test_a_broker_that_exits_fails_the_wait_at_once_with_its_log(tmp_path):
    b = BrokerProcess("bad", str(tmp_path / "bad"), extra=["--no-such-flag"])
    with pytest.raises(BrokerExited, match="broker bad exited with code") as info:
        b.start(timeout_s=60)  # fails long before the deadline: the process is gone
    assert "no-such-flag" in str(info.value)
    assert not b.alive() and b.stop() != 0


def test_a_broker_that_never_answers_in_time_is_not_left_running(tmp_path):
    b = BrokerProcess("slow", str(tmp_path / "slow"))
    with pytest.raises(AssertionError, match="to answer"):
        b.start(timeout_s=0.001)   # no broker answers within a millisecond of its start
    assert not b.alive() and "slow" in b.command()


def test_pause_resume_and_restart_keep_address_and_data(tmp_path):
    from mesh.client import Admin
    c = Cluster(tmp_path, 1, log_dir=str(tmp_path / "logs")).start()
    (b,) = c.brokers
    try:
        assert b.log_path == str(tmp_path / "logs" / "n1.log")
        with Admin(b.address) as a:
            a.create_topic("kept", partitions=1)
        b.pause()
        with pytest.raises(AssertionError):
            wait_until(lambda: b.metadata(100), 0.3, "a paused broker to answer")
        b.resume()
        b.wait_ready()
        address = b.address
        b.restart()
        assert b.address == address
        with Admin(b.address) as a:
            assert a.list_topics() == ["kept"]  # the same data directory
        b.kill()
        assert not b.alive()
    finally:
        c.stop()


def test_a_metrics_port_taken_before_the_broker_binds_it_is_chosen_again(tmp_path):
    """free_port() and the broker's bind race with every outgoing connection on the host
    (any may get that port as its ephemeral one): CI once lost a whole module to it."""
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    b = BrokerProcess("m1", str(tmp_path / "m1"), metrics_port=port)
    try:
        b.start()
        assert b.metrics_port != port and "Address already in use" in b.log()
    finally:
        b.kill()
        taken.close()


def test_a_cluster_that_does_not_form_says_what_each_broker_sees(tmp_path):
    c = Cluster(tmp_path, 2)
    c.brokers[1].seeds = [f"127.0.0.1:{free_port()}"]   # n2 seeds from nobody: the two never meet
    try:
        for b in c.brokers:
            b.start()
        with pytest.raises(AssertionError) as info:
            c.wait_converged(1.0)
        text = str(info.value)
        assert "waiting for n1 to see ['n1', 'n2'] alive" in text
        assert "--- n1 (running) sees: n1=alive\n" in text and "--- n2 (running) sees: n2=alive\n" in text
        assert "serving on" in text   # each broker's log's end follows its view
    finally:
        c.stop()
