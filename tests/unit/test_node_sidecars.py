"""The node's sidecar processes (``mesh.node.lifecycle.sidecars``): closed in reverse order, and
never left running by a start that fails after them."""
import socket

import pytest

from mesh.node.loop import Node, NodeConfig, StartupError
from mesh.node.lifecycle.sidecars import SidecarError, Sidecars
from mesh.testing.launcher import free_port


class Proc:
    def __init__(self, name, closed):
        self.name, self.closed = name, closed

    def close(self):
        self.closed.append(self.name)


def test_sidecars_close_in_reverse_order_once_and_a_failed_start_closes_the_earlier_ones():
    closed = []
    s = Sidecars()
    s.start("a", lambda: Proc("a", closed), OSError)
    s.start("b", lambda: Proc("b", closed), OSError)

    def boom():
        raise OSError("port taken")

    with pytest.raises(SidecarError, match="c: port taken"):
        s.start("c", boom, OSError)
    assert closed == ["b", "a"] and len(s) == 0
    s.close()
    assert closed == ["b", "a"]


def test_a_start_that_fails_after_the_text_gateway_closes_it(tmp_path, monkeypatch):
    """The metrics port taken: the gateway process started before it must not outlive the
    refused start (it did: only the router and the lock were released)."""
    from mesh.gateway import process
    closed = []
    monkeypatch.setattr(process.GatewayProcess, "start", staticmethod(lambda *a, **k: Proc("text", closed)))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cfg = NodeConfig(node_id="n1", bind=f"127.0.0.1:{free_port()}", data_dir=str(tmp_path), sync=False,
                         text_port=free_port(), metrics_port=taken.getsockname()[1])
        with pytest.raises(StartupError, match="cannot serve metrics"):
            Node(cfg)
    finally:
        taken.close()
    assert closed == ["text"]
