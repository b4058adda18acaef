"""Unread answers are bounded per client and in all (mesh/node/limits/answer_budget.py; issue 39 finding 5)."""
from __future__ import annotations

from types import SimpleNamespace

from mesh.node.limits.answer_budget import TRACK_MIN_BYTES, AnswerBudget

MiB = 1 << 20


def test_unread_answers_are_bounded_per_client_and_in_all_and_readers_are_still_served():
    b = AnswerBudget(per_client=8 * MiB, total=40 * MiB)
    unread = [SimpleNamespace(done=False) for _ in range(10)]
    assert b.refusal(b"a", 4 * MiB, 0, 0) is None
    b.sent(b"a", unread[0], 4 * MiB)
    assert b.refusal(b"a", 4 * MiB, 0, 0) is None
    b.sent(b"a", unread[1], 4 * MiB)
    assert "not read yet" in b.refusal(b"a", 4 * MiB, 0, 0)      # 8 MiB unread: a's next waits
    assert b.refusal(b"a", TRACK_MIN_BYTES - 1, 0, 0) is None    # small answers always go
    for i, ident in enumerate((b"b", b"c")):
        b.sent(ident, unread[2 + 2 * i], 4 * MiB)
        b.sent(ident, unread[3 + 2 * i], 2 * MiB)
    # 20 MiB unread in all (half the bound): clients with unread answers wait, one that reads is served
    assert "queued_max_answer_bytes" in b.refusal(b"b", 4 * MiB, 0, 0)
    assert b.refusal(b"fresh", 4 * MiB, 0, 0) is None
    assert "queued_max_answer_bytes" in b.refusal(b"fresh", 4 * MiB, 0, 20 * MiB)   # the bound: nobody
    unread[0].done = unread[1].done = True    # a read its answers
    assert b.refusal(b"a", 4 * MiB, 0, 0) is None
    assert b.tracked_bytes == 12 * MiB and b.queued(b"a") == 0


def test_one_principal_holds_at_most_a_quarter_of_the_budget_over_all_its_connections():
    b = AnswerBudget(per_client=8 * MiB, total=64 * MiB)
    for i in range(4):   # 16 MiB unread over four connections of mallory
        b.sent(b"m%d" % i, SimpleNamespace(done=False), 4 * MiB, "mallory")
    assert "mallory" in b.refusal(b"m9", 4 * MiB, 0, 0, "mallory")   # a fifth connection waits
    assert b.refusal(b"alice", 4 * MiB, 0, 0, "alice") is None       # others are served
    assert b.tracked_bytes == 16 * MiB
    for t, _, _ in list(b._tracked):
        t.done = True
    b.reap()
    assert b.tracked_bytes == 0 and not b._bytes
    assert b.refusal(b"m9", 4 * MiB, 0, 0, "mallory") is None
