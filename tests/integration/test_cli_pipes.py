"""The CLI in a shell pipeline: a reader that goes away (`mesh topic describe orders | head`)
ends the command quietly, with status 0 and no 'Broken pipe' error."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mesh.client import Admin

pytestmark = pytest.mark.integration


def test_a_closed_stdout_ends_a_command_quietly(broker):
    with Admin(broker.address) as admin:
        admin.create_topic("piped", partitions=8)
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "topic", "describe", "piped",
                             "--bootstrap", broker.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()             # the reader is gone before the first line is written
    _, err = proc.communicate(timeout=60)
    assert b"Broken pipe" not in err, err
    assert proc.returncode == 0, err
