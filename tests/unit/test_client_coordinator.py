"""The client's coordinator lookup over a scripted fake transport: a coordinator that
answers "loading" (COORDINATOR_NOT_AVAILABLE) is asked again; a patient (admin) call keeps
asking with a backoff until its timeout, a member's gives up after its attempts."""
import time

import pytest

from mesh.client.coordinator import Coordinator
from mesh.groups import GroupFetchOffsets, GroupFetchOffsetsResponse, GroupFindCoordinator, GroupFindCoordinatorResponse
from mesh.wire.errors import ErrorCode, MeshError

LOADING = GroupFetchOffsetsResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, "loading the group's committed offsets")


class Cluster:
    def addresses(self):
        return ["127.0.0.1:1"]

    def refresh(self):
        pass


class Transport:
    def __init__(self, answers):
        self.answers, self.asked = list(answers), []

    def call(self, addr, msg, timeout_ms):
        if isinstance(msg, GroupFindCoordinator):
            return GroupFindCoordinatorResponse(ErrorCode.NONE, "", "n1", addr), None
        self.asked.append(time.monotonic())
        return self.answers.pop(0), None


def test_a_patient_call_waits_out_a_loading_coordinator_within_its_timeout():
    ok = GroupFetchOffsetsResponse(ErrorCode.NONE, "", [["t", 0, 7, ""]])
    t = Transport([LOADING] * 5 + [ok])
    resp = Coordinator(t, Cluster(), "g").call(GroupFetchOffsets("g", None), timeout_ms=5_000, patient=True)
    assert resp is ok and len(t.asked) == 6
    gaps = [b - a for a, b in zip(t.asked, t.asked[1:])]
    assert min(gaps[3:]) >= 0.09   # the 4th try on waits a backoff (50 ms, then doubling)


def test_an_impatient_call_and_a_patient_one_out_of_time_raise_the_last_answer():
    t = Transport([LOADING] * 10)
    with pytest.raises(MeshError, match="loading") as e:
        Coordinator(t, Cluster(), "g").call(GroupFetchOffsets("g", None), timeout_ms=5_000)
    assert e.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE and len(t.asked) == 3
    t = Transport([LOADING] * 100)
    t0 = time.monotonic()
    with pytest.raises(MeshError, match="loading"):
        Coordinator(t, Cluster(), "g").call(GroupFetchOffsets("g", None), timeout_ms=300, patient=True)
    assert 0.25 <= time.monotonic() - t0 < 5 and 3 < len(t.asked) < 10   # about its 300 ms
