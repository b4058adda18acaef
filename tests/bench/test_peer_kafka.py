"""bench.peer_kafka's report: async send from interleaved rounds, the ratio paired per round."""
from bench.peer_kafka import KAFKA_PRODUCER, kafka_producer_config, rounds_line, side_by_side

NATIVE = {"latency": {"p50_ms": 2.0, "p99_ms": 4.0, "mean_ms": 2.2}, "consume_rps": 1_000_000.0,
          "produce_rounds": [300_000.0, 100_000.0, 200_000.0], "produce_rps": 200_000.0}
# a load burst hit the first round's native phase and the last round's Kafka phase
KAFKA = {"latency": {"p50_ms": 2.5, "p99_ms": 5.0, "mean_ms": 2.6}, "consume_rps": 400_000.0,
         "produce_rounds": [90_000.0, 60_000.0, 150_000.0], "produce_rps": 90_000.0, "produce_ratio": 0.6}


def test_async_send_ratio_is_the_median_of_the_rounds_ratios():
    lines = side_by_side(NATIVE, KAFKA).splitlines()
    thr = next(ln for ln in lines if ln.startswith("| async send"))
    assert "| 200,000 | 90,000 | 0.60x |" in thr   # not 90,000 / 200,000 = 0.45x
    p50 = next(ln for ln in lines if ln.startswith("| blocking send p50"))
    assert "| 2.00 | 2.50 | 1.25x |" in p50


def test_rounds_line_lists_every_round_and_its_ratio():
    line = rounds_line(NATIVE, KAFKA)
    assert "native 300,000, 100,000, 200,000" in line
    assert "confluent-kafka 90,000, 60,000, 150,000" in line
    assert "0.30x, 0.60x, 0.75x" in line


def test_the_kafka_producer_is_idempotent_acks_all_with_failure_only_reports():
    calls = []
    conf = kafka_producer_config("127.0.0.1:9092", lambda err, msg: calls.append(err))
    assert conf["bootstrap.servers"] == "127.0.0.1:9092"
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True and conf["linger.ms"] == 5
    assert conf["delivery.report.only.error"] is True and callable(conf["on_delivery"])
    assert KAFKA_PRODUCER["batch.size"] <= KAFKA_PRODUCER["message.max.bytes"]
