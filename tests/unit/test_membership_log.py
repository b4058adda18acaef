"""The operator's record of membership changes (mesh/node/ops/membership_log.py)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from mesh.gossip.membership import MembershipEvent
from mesh.node.ops.membership_log import MAX_LOGGED, log_membership_events


def test_each_change_is_logged_and_suspicions_and_deaths_are_counted(caplog):
    metrics = SimpleNamespace(suspicions=0, deaths=0)
    events = [MembershipEvent(1, "n2", "alive", "suspect"), MembershipEvent(2, "n2", "suspect", "alive"),
              MembershipEvent(3, "n3", "suspect", "dead"), MembershipEvent(4, "n1", "alive", "suspect")]
    with caplog.at_level(logging.INFO, logger="mesh.node.membership"):
        log_membership_events(events, "n1", metrics)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["member n2: alive -> suspect", "member n2: suspect -> alive", "member n3: suspect -> dead"]
    assert (metrics.suspicions, metrics.deaths) == (2, 1)


def test_a_mass_change_is_a_count_not_a_screenful(caplog):
    events = [MembershipEvent(i, f"n{i}", "alive", "dead") for i in range(MAX_LOGGED + 30)]
    with caplog.at_level(logging.INFO, logger="mesh.node.membership"):
        log_membership_events(events, "me")
    assert len(caplog.records) == MAX_LOGGED + 1 and "30 more" in caplog.records[-1].getMessage()
