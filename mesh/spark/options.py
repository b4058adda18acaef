"""Options of the mesh Spark source and sink, and the errors a Spark user can act on.

Option names follow Spark's Kafka source where the meaning is the same (``subscribe``,
``startingOffsets``, ``maxOffsetsPerTrigger``...); ``mesh.spark``'s docstring lists them.
Everything parsed here is plain data, pickled to the tasks. Importing this module checks
the pyspark version (every other module of ``mesh.spark`` imports it first).
"""
from __future__ import annotations

import re

import pyspark

if tuple(int(x) for x in re.findall(r"\d+", pyspark.__version__)[:2]) < (4, 2):
    raise ImportError(f"mesh.spark needs pyspark 4.2 or newer (admission control and availableNow for Python "
                      f"streaming sources); this is pyspark {pyspark.__version__}: pip install -U 'pyspark>=4.2'")

__all__ = ["MeshSparkError", "MeshOptions", "require_pyarrow"]

_DEFAULT_TIMEOUT_MS = 10_000
_DEFAULT_FETCH_BYTES = 8 << 20


class MeshSparkError(RuntimeError):
    """An error a Spark user can act on; the message names the option or the fix."""


def require_pyarrow():
    try:
        import pyarrow
    except ImportError as exc:  # on the driver or on a worker
        raise MeshSparkError(
            "mesh's Spark source and sink need pyarrow in every Python that Spark runs "
            "(driver and workers): pip install pyarrow (or 'broker-mesh[spark]'), and point "
            "PYSPARK_PYTHON at that Python") from exc
    return pyarrow


# -- options ---------------------------------------------------------------------------
def _int_option(opts: dict, name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise MeshSparkError(f"option {name}={raw!r} is not an integer") from None
    if v < minimum:
        raise MeshSparkError(f"option {name}={v} must be at least {minimum}")
    return v


def _bool_option(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise MeshSparkError(f"option {name}={raw!r} must be true or false")
    return raw.strip().lower() == "true"


def _creds_option(opts: dict) -> str | None:
    """The ``creds`` option: a creds file path (checked here, on the driver; every worker
    loads it from the same path, so the secret key never travels in a task). None:
    $MESH_CREDS where the client runs, else an open cluster."""
    path = (opts.get("creds") or "").strip() or None
    if path is not None:
        from mesh.security import CredsError, load_creds
        try:
            load_creds(path)
        except CredsError as exc:
            raise MeshSparkError(f'option creds: {exc}') from None
    return path


def _timestamps_option(opts: dict):
    """startingTimestamp (one ms timestamp for every partition) or startingOffsetsByTimestamp
    (JSON ``{"orders": {"0": 1700000000000}}``), as Spark's Kafka source; the first wins."""
    raw = opts.get("startingtimestamp")
    if raw is not None and raw.strip():
        ts = _int_option(opts, "startingTimestamp", None, 0)
        return ts
    raw = opts.get("startingoffsetsbytimestamp")
    if raw is None or not raw.strip():
        return None
    import json
    try:
        js = json.loads(raw)
    except ValueError:
        js = None
    out = {}
    if isinstance(js, dict):
        for t, parts in js.items():
            if not isinstance(parts, dict):
                js = None
                break
            for p, ts in parts.items():
                if not (isinstance(p, str) and p.isdigit() and type(ts) is int and ts >= 0):
                    raise MeshSparkError(f"startingOffsetsByTimestamp: {t}/{p}: {ts!r} is not a timestamp "
                                         "in ms (an int >= 0)")
                out[(t, int(p))] = ts
    if not isinstance(js, dict):
        raise MeshSparkError(f'startingOffsetsByTimestamp must be JSON like {{"orders":{{"0":1700000000000}}}}, '
                             f"not {raw!r}")
    return out


class MeshOptions:
    """The parsed options shared by source and sink (plain data: it is pickled to tasks)."""

    def __init__(self, options, *, sink: bool = False):
        opts = {str(k).lower(): str(v) for k, v in dict(options or {}).items()}
        self.raw = opts
        self.bootstrap = (opts.get("bootstrap") or opts.get("kafka.bootstrap.servers") or "").strip()
        if not self.bootstrap:
            raise MeshSparkError('option "bootstrap" is required, e.g. .option("bootstrap", "127.0.0.1:7101")')
        self.request_timeout_ms = _int_option(opts, "requestTimeoutMs", _DEFAULT_TIMEOUT_MS, 1)
        self.creds = _creds_option(opts)
        topic = opts.get("topic")
        subscribe = opts.get("subscribe")
        pattern = opts.get("subscribepattern")
        if sink:
            self.topics = [topic.strip()] if topic and topic.strip() else []
            self.pattern = None
            return
        given = [n for n, v in (("topic", topic), ("subscribe", subscribe), ("subscribePattern", pattern)) if v]
        if len(given) != 1:
            raise MeshSparkError('give exactly one of the options "topic" / "subscribe" (comma-separated '
                                 'topic names) or "subscribePattern" (a regex)'
                                 + (f"; got {', '.join(given)}" if given else ""))
        self.pattern = None
        self.topics = []
        if pattern:
            try:
                self.pattern = re.compile(pattern)
            except re.error as exc:
                raise MeshSparkError(f"subscribePattern {pattern!r} is not a valid regex: {exc}") from None
        else:
            self.topics = [t.strip() for t in (topic or subscribe).split(",") if t.strip()]
            if not self.topics:
                raise MeshSparkError("no topic named in the topic/subscribe option")
        self.starting = opts.get("startingoffsets")
        self.starting_timestamps = _timestamps_option(opts)   # None, an int (all partitions) or {tp: ms}
        self.starting_timestamp_strategy = (opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
        if self.starting_timestamp_strategy not in ("error", "latest"):
            raise MeshSparkError(f"option startingOffsetsByTimestampStrategy="
                                 f"{opts.get('startingoffsetsbytimestampstrategy')!r} must be error or latest")
        self.ending = opts.get("endingoffsets")
        self.max_offsets_per_trigger = _int_option(opts, "maxOffsetsPerTrigger", None, 1)
        self.min_partitions = _int_option(opts, "minPartitions", None, 1)
        self.fail_on_data_loss = _bool_option(opts, "failOnDataLoss", True)
        self.fetch_max_bytes = _int_option(opts, "fetchMaxBytes", _DEFAULT_FETCH_BYTES, 1024)
