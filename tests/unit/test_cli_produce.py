"""``mesh produce`` says whether failed records may have been written (Kafka's "outcome
unknown" versus "not written"), with a fake producer: no broker."""
from click.testing import CliRunner

import mesh.client
from mesh.wire.errors import ErrorCode, MeshError
from tools.cli import main


class FakeFuture:
    def __init__(self, exc):
        self.exc = exc

    def done(self):
        return True

    def exception(self):
        return self.exc


class FakeProducer:
    outcomes: list = []

    def __init__(self, *args, **kwargs):
        self.i = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def send(self, topic, value, **kwargs):
        out = FakeFuture(self.outcomes[self.i])
        self.i += 1
        return out

    def flush(self):
        pass


def run(monkeypatch, outcomes):
    FakeProducer.outcomes = outcomes
    monkeypatch.setattr(mesh.client, "Producer", FakeProducer)
    return CliRunner().invoke(main, ["produce", "t"], input="a\nb\nc\n")


def test_a_timeout_after_sending_is_outcome_unknown(monkeypatch):
    res = run(monkeypatch, [None, MeshError(ErrorCode.TIMEOUT, "no answer within 3 s", maybe_written=True),
                            MeshError(ErrorCode.TIMEOUT, "an earlier batch failed", maybe_written=False)])
    assert res.exit_code == 1
    assert "error: TIMEOUT: no answer within 3 s (outcome unknown: the record may have been written)" in res.stderr
    assert "1 of 3 records produced to t; 2 failed: 1 with outcome unknown" in res.stderr
    assert "1 not written" in res.stderr


def test_a_refusal_is_not_written(monkeypatch):
    res = run(monkeypatch, [MeshError(ErrorCode.UNKNOWN_TOPIC, "unknown topic 't'")] * 3)
    assert res.exit_code == 1
    assert "error: UNKNOWN_TOPIC: unknown topic 't' (not written)" in res.stderr


def test_all_written(monkeypatch):
    res = run(monkeypatch, [None, None, None])
    assert res.exit_code == 0 and "produced 3 records to t" in res.stderr


def test_from_time_takes_ms_or_iso_8601_and_names_what_it_takes():
    import click
    import pytest

    from tools.cli import _parse_time_ms
    assert _parse_time_ms("1700000000000") == 1_700_000_000_000
    assert _parse_time_ms("1970-01-01T00:00:01.5Z") == 1500
    assert _parse_time_ms("1970-01-01T00:00:02") == 2000            # no zone: UTC
    assert _parse_time_ms("1970-01-01T01:00:00+01:00") == 0
    for bad in ("yesterday", "1969-12-31T23:59:59Z"):
        with pytest.raises(click.BadParameter):
            _parse_time_ms(bad)
