"""A peer link that reconnects while the receiving ROUTER still holds its old connection
takes the routing id over, in secured mode too (issue 39, finding 3).

That is what a pause makes: the receiver is stopped, the link's heartbeat times out and it
reconnects (same routing id: one socket, one id), and the resumed receiver may identify
the new connection before it has read the old one's end. Without ROUTER_HANDOVER libzmq
kept the new connection and never delivered a message from it: the broker came back deaf
to that peer for good. Here the two connections overlap on purpose: the second connects
while the first is still up, then the first closes."""
import time

import pytest
import zmq

from mesh.node.requests.dispatch import open_router
from mesh.security import init_secrets
from mesh.security.broker import BrokerSecurity
from mesh.testing.launcher import free_port


@pytest.fixture(params=["open", "secured"])
def router(request, tmp_path):
    ctx = zmq.Context()
    secrets = None
    if request.param == "secured":
        init_secrets(tmp_path / "secrets")
        secrets = str(tmp_path / "secrets")
    sec = BrokerSecurity(ctx, secrets_dir=secrets, binds=["127.0.0.1:1"])
    bind = f"127.0.0.1:{free_port()}"
    r = open_router(ctx, bind, 1000, configure=sec.configure_router)
    yield ctx, sec, r, bind
    sec.close(r)
    r.close(0)
    ctx.term()


def _link(ctx, sec, bind, rid):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.ROUTING_ID, rid)
    if sec.peer_creds is not None:
        sec.peer_creds.apply(d)
    d.connect(f"tcp://{bind}")
    return d


def _receive(sec, r, want: bytes, timeout_s: float = 5.0):
    """Serve ZAP and read the ROUTER until a message with body ``want`` comes: its identity."""
    poller = zmq.Poller()
    poller.register(r, zmq.POLLIN)
    poller.register(sec.zap.sock, zmq.POLLIN)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = dict(poller.poll(50))
        if sec.zap.sock in events:
            sec.zap.handle()
        if r in events:
            frames = r.recv_multipart()
            if frames[-1] == want:
                return frames[0]
    return None


def test_a_reconnected_link_takes_its_routing_id_over(router):
    ctx, sec, r, bind = router
    rid = b"peer:127.0.0.1:7#0123456789abcdef"
    old = _link(ctx, sec, bind, rid)
    old.send(b"from the old connection")
    assert _receive(sec, r, b"from the old connection") == rid
    new = _link(ctx, sec, bind, rid)          # the reconnection, while the old one is still held
    for i in range(3):
        new.send(b"from the new connection %d" % i)
    got = _receive(sec, r, b"from the new connection 0", 3.0)
    old.close(0)                              # the old connection's end comes after
    got = got or _receive(sec, r, b"from the new connection 1")
    new.send(b"later")
    assert got == rid and _receive(sec, r, b"later") == rid
    new.close(0)
