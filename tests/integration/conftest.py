import pytest

from mesh.testing.launcher import BrokerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = BrokerProcess("n1", str(tmp_path_factory.mktemp("broker") / "n1"),
                      extra=["--retention-check-ms", "200"]).start()
    yield b
    b.stop()
