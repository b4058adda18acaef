"""The bench's durability modes (issue 41): the DSBS cells run with write caching when asked,
the report says which mode, and peer-nats says what each row's acknowledgement means."""
from bench.report import _durability
from bench.scenarios import get_scenario
from bench.worker_common import topic_config


def test_dsbs_cells_take_write_caching_and_their_topics_have_it():
    fsync = get_scenario("dsbs").cells()
    cached = get_scenario("dsbs").with_overrides({"write_caching": [True]}).cells()
    assert len(cached) == len(fsync)
    assert all(c.workload.write_caching for c in cached) and not any(c.workload.write_caching for c in fsync)
    assert topic_config(cached[0].workload)["write.caching"] == "true"
    assert "write.caching" not in topic_config(fsync[0].workload)


def test_the_report_says_which_durability_the_cells_had():
    assert _durability({"cells": [{"write_caching": False}]}).startswith("fsync")
    assert _durability({"cells": [{"write_caching": True}]}).startswith("write caching")
    assert _durability({}).startswith("fsync")   # a run recorded before the knob


def test_peer_nats_has_both_mesh_modes_beside_nats_r3_and_says_each_rows_durability():
    from bench.peer import DURABILITY, PAIRS, SYSTEMS, WRITE_CACHED
    keys = [k for k, *_ in SYSTEMS]
    assert {"mesh-rf3", "mesh-rf3-wc", "nats-r3", "nats-r1", "mesh-rf1"} <= set(keys)
    assert ("mesh-rf3", "nats-r3") in PAIRS and ("mesh-rf3-wc", "nats-r3") in PAIRS
    assert WRITE_CACHED == {"mesh-rf3-wc"} and set(DURABILITY) == set(keys)
