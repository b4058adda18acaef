import signal

import pytest

from mesh.testing.launcher import BrokerProcess, Cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("n1", str(tmp_path_factory.mktemp("broker") / "n1"),
                      extra=["--retention-check-ms", "200"]).start()
    yield b
    b.stop()


@pytest.fixture
def cluster3(tmp_path):
    """Three brokers; afterwards every one is resumed (if a test paused it) and killed."""
    c = Cluster(tmp_path, 3).start()
    yield c
    for b in c.brokers:
        if b.proc and b.proc.poll() is None:
            try:
                b.signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
        b.kill()
