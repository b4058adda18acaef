"""``bench soak``: the command is registered and refuses bad options clearly (a real run is
``tests/integration/test_jepsen.py``'s short one, or the command itself)."""
from click.testing import CliRunner

from bench.cli import main


def test_soak_is_a_bench_command_with_its_options():
    r = CliRunner().invoke(main, ["soak", "--help"])
    assert r.exit_code == 0, r.output
    for opt in ("--seed", "--seconds", "--brokers", "--partitions", "--producers", "--runs", "--faults"):
        assert opt in r.output


def test_soak_refuses_an_unknown_fault_kind(tmp_path):
    r = CliRunner().invoke(main, ["soak", "--faults", "kill,flood", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2
    assert "unknown fault kind(s) flood" in r.output
    assert not (tmp_path / "x").exists()
