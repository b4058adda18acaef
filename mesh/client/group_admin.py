"""The group admin calls: list, describe, reset and delete consumer groups (``mesh group``)."""
from __future__ import annotations

import logging

from mesh.client.admin import ClientBase
from mesh.client.cluster import TopicPartition
from mesh.client.coordinator import MOVED, Coordinator
from mesh.cluster.liveness import row_is_up
from mesh.groups import GroupDelete, GroupDescribe, GroupFetchOffsets, GroupList, GroupResetOffsets
from mesh.wire.errors import ErrorCode, MeshError
from mesh.wire.messages import EARLIEST, LATEST

__all__ = ["GroupAdmin"]

log = logging.getLogger("mesh.group")

_SETTLE_WAIT_S = 15.0   # a coordinator refuses deletes and resets for its takeover grace (10 s)


class GroupAdmin(ClientBase):
    """List, describe, reset and delete consumer groups (what ``mesh group`` does)."""

    def __init__(self, bootstrap: str = "127.0.0.1:7101", request_timeout_ms: int = 5_000, *, creds=None):
        super().__init__(bootstrap, request_timeout_ms, creds=creds)

    def _coordinator(self, group_id: str) -> Coordinator:
        return Coordinator(self.transport, self.cluster, group_id)

    def list_groups(self) -> list[dict]:
        """Every group any live broker knows (coordinated there, or with offsets in gossip):
        [{group_id, coordinator, state, members, group_epoch}], by group id."""
        self.cluster.refresh([])
        out: dict[str, dict] = {}
        for b in sorted(self.cluster.brokers.values(), key=lambda b: b["id"]):
            if not row_is_up(b, strict=True):
                continue
            try:
                resp, _ = self.transport.call(b["address"], GroupList(), timeout_ms=self.timeout_ms)
            except MeshError as exc:
                log.warning("broker %s did not list its groups: %s", b["id"], exc)
                continue
            for g in resp.groups:
                known = out.get(g["group_id"])
                authoritative = g.get("coordinator") == b["id"] and g.get("state") != "unknown"
                if known is None or authoritative:
                    out[g["group_id"]] = dict(g)
        return [out[k] for k in sorted(out)]

    def describe(self, group_id: str) -> dict:
        """The coordinator's view (members, assignment, committed offsets) plus log end and
        lag per partition. If the coordinator cannot be reached, the offsets come from any
        broker's gossip view and ``state`` is "unknown"."""
        try:
            resp = self._coordinator(group_id).call(GroupDescribe(group_id), timeout_ms=self.timeout_ms, patient=True)
            if resp.error:
                raise MeshError(resp.error, resp.message)
            d = {"group_id": group_id, "coordinator": resp.coordinator, "state": resp.state,
                 "group_epoch": resp.group_epoch, "assignor": resp.assignor, "members": resp.members,
                 "offsets": resp.offsets}
        except MeshError as exc:
            if exc.code not in (ErrorCode.TIMEOUT, *MOVED):
                raise
            d = self._describe_from_gossip(group_id)
        owner = {}
        for m in d["members"]:
            for t, p in m.get("assigned", []) + m.get("revoking", []):
                owner[(t, p)] = m["member_id"]
        committed = {(t, p): off for t, p, off, _ in d["offsets"]}
        tps = sorted(set(committed) | set(owner))
        ends = self._log_ends(tps)
        d["partitions"] = [
            {"topic": t, "partition": p, "member": owner.get((t, p)), "committed": committed.get((t, p), -1),
             "log_end": ends.get((t, p), -1),
             "lag": (ends[(t, p)] - max(committed.get((t, p), -1), 0)) if ends.get((t, p), -1) >= 0 else None}
            for t, p in tps]
        return d

    def _describe_from_gossip(self, group_id: str) -> dict:
        last = None
        for addr in self.cluster.addresses():
            try:
                resp, _ = self.transport.call(addr, GroupDescribe(group_id), timeout_ms=self.timeout_ms)
            except MeshError as exc:
                last = exc
                continue
            return {"group_id": group_id, "coordinator": resp.coordinator, "state": "unknown",
                    "group_epoch": -1, "assignor": "", "members": [], "offsets": resp.offsets}
        raise MeshError(ErrorCode.BROKER_UNAVAILABLE, f"no broker answered: {last}")

    def _log_ends(self, tps: list) -> dict[tuple[str, int], int]:
        """Log end (readable end) per partition, asked of each leader; gossip stats otherwise."""
        if not tps:
            return {}
        md = self.cluster.refresh(sorted({t for t, _ in tps}))
        wanted = set(tps)
        ends = {(t["name"], p["partition"]): p["high_watermark"]
                for t in md.topics for p in t.get("partitions", []) if (t["name"], p["partition"]) in wanted}
        try:
            asked = self.cluster.list_offsets(sorted(ends), LATEST, timeout_ms=self.timeout_ms,
                                              request_timeout_ms=self.timeout_ms, partial=True)
        except MeshError:
            asked = {}
        ends.update(asked)
        return ends

    def committed(self, group_id: str) -> dict[TopicPartition, int]:
        resp = self._coordinator(group_id).call(GroupFetchOffsets(group_id, None), timeout_ms=self.timeout_ms,
                                                patient=True)
        if resp.error:
            raise MeshError(resp.error, resp.message)
        return {TopicPartition(t, p): off for t, p, off, _ in resp.offsets}

    def reset_offsets(self, group_id: str, topic: str, to: str | int,
                      partitions: list[int] | None = None) -> dict[TopicPartition, int]:
        """Set the group's committed offsets of ``topic`` to "earliest", "latest" or an
        offset (clamped to each partition's [log start, log end]). Refused while the group
        has members. Returns what was set."""
        md = self.cluster.refresh([topic])
        (t,) = md.topics
        if t.get("error"):
            raise MeshError(t["error"], f"unknown topic {topic!r}")
        parts = partitions if partitions is not None else [p["partition"] for p in t["partitions"]]
        for p in parts:
            if not 0 <= p < len(t["partitions"]):
                raise MeshError(ErrorCode.UNKNOWN_PARTITION, f"topic {topic!r} has no partition {p}")
        starts = self._list_offsets(t, parts, EARLIEST)
        ends = self._list_offsets(t, parts, LATEST)
        target = {}
        for p in parts:
            if to == "earliest":
                off = starts[p]
            elif to == "latest":
                off = ends[p]
            else:
                off = min(max(int(to), starts[p]), ends[p])
            target[TopicPartition(topic, p)] = off
        self._call_settled(group_id, GroupResetOffsets(
            group_id, [[tp.topic, tp.partition, off] for tp, off in sorted(target.items())]))
        return target

    def _call_settled(self, group_id: str, msg) -> None:
        """A delete or reset: retried while the coordinator is still taking its groups over
        (COORDINATOR_NOT_AVAILABLE: their members may still rejoin), for up to 15 s."""
        coordinator = self._coordinator(group_id)

        def call():
            resp = coordinator.call(msg, timeout_ms=self.timeout_ms, patient=True)
            if resp.error:
                raise MeshError(resp.error, resp.message)
        self._while_unavailable(call, _SETTLE_WAIT_S)

    def delete(self, group_id: str) -> None:
        """Delete a group and its committed offsets (Kafka's ``kafka-consumer-groups
        --delete``). Refused while it has members (GROUP_NOT_EMPTY); UNKNOWN_GROUP if it has
        neither members nor offsets. Every broker forgets its offsets a gossip round or two
        later; a commit to the group afterwards starts it again."""
        self._call_settled(group_id, GroupDelete(group_id))

    def _list_offsets(self, t: dict, parts: list[int], which: int) -> dict[int, int]:
        got = self.cluster.list_offsets([(t["name"], p) for p in parts], which, timeout_ms=self.timeout_ms,
                                        request_timeout_ms=self.timeout_ms)
        return {tp.partition: off for tp, off in got.items()}
