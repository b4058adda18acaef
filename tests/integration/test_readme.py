"""README.md, run as written (issue 43): every shell command, ``$ nc`` transcript and Python
snippet of its sections, in order, against a cluster started as ``make run`` starts it (the
real Procfile under honcho, each broker under tools/supervise.py), with its ports remapped
to free ones, and the working directory a tmp dir (so ``data/``, ``secrets``,
``alice.creds``, ``checkpoints/`` land there). Output is checked against what the README
says (see ``Runner.check``). A new section's commands are run too: a section or command
this cannot run must be added to SKIP_SECTIONS / SKIP_COMMANDS with its reason.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mesh.testing.launcher import ROOT, free_port, wait_until
from tests.integration.readme_steps import Step, sections

pytestmark = pytest.mark.integration

README = (Path(ROOT) / "README.md").read_text()
BIN = Path(sys.executable).parent

SKIP_SECTIONS = {
    "Set up": "`make run` / `make test` themselves: the fixture starts make run's Procfile as make does",
    "Growing and shrinking the cluster": "not in issue 43's list; tests/integration/test_elastic.py runs these",
    "Guarantees": "prose",
    "Benchmarks": "minutes each; tests/bench runs the scenarios",
    "Where things are": "prose",
}
SKIP_COMMANDS = [   # (regex on the command, reason)
    (r"/mesh top$", "the live screen runs until Ctrl-C (`mesh top --once` is run)"),
    (r"^prometheus ", "runs until stopped; tests/integration/test_metrics.py checks its config with promtool"),
    (r"^kcat .* -G ", "a group member runs until stopped; tests/integration/test_kafka_group_clients.py runs two"),
]
BACKGROUND = re.compile(r"/mesh node |/mesh consume \S+ --group \S+$")   # run until stopped
TIMEOUT_S = 90


def _section_params():
    out = []
    for sec in sections(README):
        if sec.title in SKIP_SECTIONS or not sec.steps:
            continue
        # Spark: a JVM and a Python worker per planning step; minutes on a busy 2-core host
        marks = [pytest.mark.spark, pytest.mark.timeout(600)] if sec.title == "Spark" else []
        out.append(pytest.param(sec.title, marks=marks, id=sec.title.split(":")[0].replace(" ", "-")))
    return out


class Runner:
    """The cluster, the port map and what earlier steps left behind."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ports: dict[str, str] = {}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.env["MESH_BOOTSTRAP"] = self.addr("127.0.0.1:7101")   # the tools' default address, remapped
        self.env.pop("MESH_CREDS", None)
        self.env.pop("PYSPARK_PYTHON", None)      # register(spark) must do without it
        self.nodes: list[subprocess.Popen] = []   # `mesh node` steps, until the module ends
        self.section_bg: list[tuple[subprocess.Popen, Path]] = []
        self.produced: dict[str, list[tuple[str, str]]] = {}
        self.honcho = None

    # -- addresses ----------------------------------------------------------------------
    def port(self, old: str) -> str:
        if old not in self.ports:
            self.ports[old] = str(free_port())
        return self.ports[old]

    def remap(self, text: str) -> str:
        text = re.sub(r"(?<=127\.0\.0\.1:)(\d{4,5})|(?<=localhost:)(\d{4,5})"
                      r"|(?<=--metrics-port )(\d+)|(?<=--kafka-port )(\d+)|(?<=--text-port )(\d+)",
                      lambda m: self.port(m.group(0)), text)
        return re.sub(r"(?<![\w/])\.venv/bin/(\w+)",
                      lambda m: sys.executable if m.group(1) == "python" else f"{BIN}/{m.group(1)}", text)

    def addr(self, readme_addr: str) -> str:
        host, port = readme_addr.rsplit(":", 1)
        return f"{host}:{self.port(port)}"

    # -- make run -----------------------------------------------------------------------
    def start(self) -> None:
        procfile = self.tmp / "Procfile"
        procfile.write_text(self.remap((Path(ROOT) / "Procfile").read_text()))
        (self.tmp / "data").mkdir()
        self.honcho = subprocess.Popen([str(BIN / "honcho"), "-f", str(procfile), "-d", str(self.tmp), "start"],
                                       cwd=self.tmp, env=self.env, stdout=open(self.tmp / "honcho.log", "w"),
                                       stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.alive() >= {"n1", "n2", "n3"}, timeout_s=TIMEOUT_S,
                   what="make run's three brokers alive")

    def stop(self) -> None:
        for p, _ in self.section_bg:
            _end(p)
        for p in self.nodes:
            _end(p)
        if self.honcho and self.honcho.poll() is None:
            self.honcho.send_signal(signal.SIGINT)
            try:
                self.honcho.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.honcho.pid, signal.SIGKILL)

    def alive(self) -> set[str]:
        out = subprocess.run([str(BIN / "mesh"), "cluster", "status", "--json", "--bootstrap",
                              self.addr("127.0.0.1:7101")], capture_output=True, text=True, env=self.env,
                             timeout=30)
        return {r["id"] for r in json.loads(out.stdout) if r.get("status") == "alive"} if not out.returncode else set()

    def leaders(self) -> dict:
        """(topic, partition) -> (leader, epoch), from any broker's metadata."""
        from mesh.client import Admin
        with Admin(self.addr("127.0.0.1:7101")) as a:
            md = a.metadata(None)
        return {(t["name"], p["partition"]): (p.get("leader"), p.get("epoch", 0))
                for t in md.topics if not t.get("error") for p in t["partitions"]}

    def pid(self, node: str) -> int | None:
        try:
            return int((self.tmp / "data" / node / "mesh.lock").read_text().strip() or 0) or None
        except (OSError, ValueError):
            return None

    # -- steps --------------------------------------------------------------------------
    def sh(self, cmd: str, env: dict, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", cmd], cwd=self.tmp, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def run_shell(self, step: Step, env: dict, after_start: bool) -> None:
        cmd = self.remap(step.text)
        m = re.fullmatch(r"export (\w+)=(\S+)", cmd)
        if m:
            env[m.group(1)] = m.group(2)
            return
        if re.search(r"/mesh group (reset-offsets|delete) ", cmd):
            self.stop_section_consumers()      # "only once it has no members"
        if BACKGROUND.search(cmd):
            self.background(cmd, env)
            return
        if cmd.startswith("kill -9 "):
            self.kill9(cmd, env)
            return
        # a broker just started: until it answers; a group: until the member started in the
        # background ("in several terminals") has joined; "n1, n2, n3 alive": a broker a busy
        # host starved for a probe shows suspect for a round, then alive
        settle = after_start or "/mesh group describe" in cmd or ("cluster status" in cmd and " alive" in step.comment)
        deadline = time.monotonic() + (30 if settle else 0)
        while True:
            r = self.sh(cmd, env)
            try:
                assert r.returncode == 0, f"{step.text!r} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
                self.check(step, cmd, r.stdout, env)
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.5)

    def background(self, cmd: str, env: dict) -> None:
        log = self.tmp / f"bg-{len(self.nodes) + len(self.section_bg)}.log"
        p = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=self.tmp, env=dict(env), stdout=open(log, "w"),
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if "/mesh node " in cmd:
            self.nodes.append(p)
            node = re.search(r"--id (\S+)", cmd).group(1)
            wait_until(lambda: self.pid(node) and p.poll() is None, timeout_s=TIMEOUT_S, what=f"{node} started")
            if "--seed " in cmd:                  # joins make run's cluster: "within seconds"
                wait_until(lambda: node in self.alive(), timeout_s=TIMEOUT_S, what=f"{node} alive in the cluster")
        else:
            self.section_bg.append((p, log))       # it joins its group while the next steps run

    def stop_section_consumers(self) -> None:
        for p, log in self.section_bg:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)      # as a supervisor stops it: commits and leaves the group
                p.wait(timeout=30)
            assert p.returncode == 0, f"stopped with SIGTERM: {p.returncode}\n{log.read_text()}"
            assert "Traceback" not in log.read_text(), log.read_text()
        self.section_bg.clear()

    def kill9(self, cmd: str, env: dict) -> None:
        node = re.search(r"data/(\w+)/mesh\.lock", cmd).group(1)
        old = self.pid(node)
        before = self.alive()
        led = {tp: e for tp, (leader, e) in self.leaders().items() if leader == node}
        assert self.sh(cmd, env).returncode == 0
        # "within about a second another replica leads (`mesh topic describe` shows the new epoch)"
        wait_until(lambda: all(self.leaders()[tp][1] > e for tp, e in led.items()), timeout_s=TIMEOUT_S,
                   what=f"the partitions {node} led led by another replica at a new epoch")
        wait_until(lambda: self.pid(node) not in (None, old), timeout_s=TIMEOUT_S,
                   what=f"{node} started again by its supervisor")
        wait_until(lambda: self.alive() >= before, timeout_s=TIMEOUT_S, what=f"{before} alive after {node}'s restart")
        assert self.honcho.poll() is None, "make run ended when one broker died"
        assert f"supervise: {node} exited (signal SIGKILL)" in (self.tmp / "honcho.log").read_text()

    def check(self, step: Step, cmd: str, out: str, env: dict) -> None:
        """What the README says a command prints, where it can be checked."""
        m = re.search(r"((?:n\d+, )*n\d+) alive", step.comment)
        if m and "cluster status" in cmd:
            for node in m.group(1).split(", "):
                assert re.search(rf"\b{node}\b.*alive", out), f"{node} not alive in:\n{out}"
        m = re.search(r"printf '([^']*)' \| \S+/mesh produce (\S+)(.*)", cmd)
        if m:
            sep = re.search(r"--key-separator (\S)", m.group(3))
            recs = [tuple(line.split(sep.group(1), 1)) if sep else ("", line)
                    for line in m.group(1).split("\\n") if line]
            self.produced.setdefault((env.get("MESH_BOOTSTRAP"), m.group(2)), []).extend(recs)
        m = re.search(r"/mesh consume (\S+) .*--count (\d+)", cmd)
        if m:
            lines = out.splitlines()
            assert len(lines) == int(m.group(2)), out
            if "{key} {value}'" in cmd:
                want = sorted(f"{k} {v}" for k, v in self.produced[(env.get("MESH_BOOTSTRAP"), m.group(1))])
                assert sorted(" ".join(line.split()[-2:]) for line in lines) == want, out
        if re.search(r"/mesh topic describe (\S+)$", cmd) and "leader" in step.comment:
            for word in re.findall(r"\w+", step.comment):
                assert word in out, f"no {word!r} column in:\n{out}"
        if re.search(r"/mesh topic list$", cmd):
            assert "orders" in out.split(), out
        if "/mesh group list" in cmd:
            assert "billing" in out, out
        if "/mesh group describe billing" in cmd:     # one member (the background one) owns all three
            for word in ("member", "committed", "lag", "payments/0,payments/1,payments/2"):
                assert word in out, out
        if "/mesh acl list" in cmd:
            assert "alice" in out and "billing-" in out, out
        if "/metrics | grep ^mesh_" in cmd:
            assert out and all(line.startswith("mesh_") for line in out.splitlines()), out[:500]
        if "/mesh top --once" in cmd:
            for node in ("n1", "n2", "n3"):
                assert node in out, out

    def run_transcript(self, step: Step) -> None:
        """``$ nc HOST PORT`` then commands, each followed by the answer lines the README
        prints; timestamps differ (any integer there is accepted)."""
        first, *lines = step.text.splitlines()
        host, port = first.split()[2:4]
        turns: list[tuple[str, list[str]]] = []
        for line in lines:
            if re.match(r"(OK|ERR|END)\b|\d", line) and turns:
                turns[-1][1].append(line)
            else:
                turns.append((line, []))
        with socket.create_connection((host, int(self.port(port))), timeout=30) as s:
            f = s.makefile("rwb")
            for cmd, want in turns:
                f.write(cmd.encode() + b"\n")
                f.flush()
                got = [f.readline().decode().rstrip("\n") for _ in want]
                assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want)), \
                    f"{cmd!r}: README prints\n" + "\n".join(want) + "\ngot\n" + "\n".join(got)

    def run_python(self, step: Step, section: str, env: dict) -> str:
        prelude = f"from mesh.client import Admin, Consumer, Producer\nBOOT = {self.addr('127.0.0.1:7101')!r}\n"
        if section == "Spark":
            prelude += ("from pyspark.sql import SparkSession\n"
                        "spark = (SparkSession.builder.master('local[2]').config('spark.ui.enabled', 'false')"
                        ".config('spark.ui.showConsoleProgress', 'false').getOrCreate())\n"
                        "spark.sparkContext.setLogLevel('ERROR')\n")
        elif "spark." in step.text:      # another section's one-liner for Spark: the calls, without a JVM
            prelude += ("class _Chain:\n    def __getattr__(self, name): return self\n"
                        "    def __call__(self, *a, **k): return self\n"
                        "spark = _Chain()\n")
        code = "import time as _t\n_t0 = _t.monotonic()\n" + prelude
        if section == "Spark":
            code += "print(f'session started after {_t.monotonic() - _t0:.1f} s', flush=True)\n"
        code += self.remap(step.text) + SPARK_EPILOGUE.get(section, "")
        try:
            r = subprocess.run([sys.executable, "-c", code], cwd=self.tmp, env=env, capture_output=True, text=True,
                               timeout=400 if section == "Spark" else TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            pytest.fail(f"snippet timed out after {e.timeout} s:\n{step.text}\n{out}")
        assert r.returncode == 0, f"snippet failed:\n{step.text}\n{r.stdout}\n{r.stderr[-3000:]}"
        return r.stdout


# After the README's Spark snippet: its batch read saw the tour's records; its stream copies
# records produced from now on to orders-clean (a stream starts at the latest offsets).
SPARK_EPILOGUE = {"Spark": '''
import time
print(f"snippet done after {time.monotonic() - _t0:.1f} s", flush=True)
assert df.count() >= 2, df.count()
print(f"batch read after {time.monotonic() - _t0:.1f} s", flush=True)
deadline = time.monotonic() + 150
while q.lastProgress is None and time.monotonic() < deadline:
    time.sleep(0.2)         # the stream's first trigger fixed its start ("latest"): produce after it
assert q.lastProgress is not None, q.status
with Producer(BOOT) as p:
    for i in range(3):
        p.send("orders", f"spark-{i}".encode())
    p.flush()
seen = set()
deadline = time.monotonic() + 150
with Consumer("orders-clean", bootstrap=BOOT, auto_offset_reset="earliest") as c:
    while len(seen) < 3 and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=1000).values():
            seen.update(r.value for r in recs)
print(f"stream copied {len(seen)} after {time.monotonic() - _t0:.1f} s", flush=True)
q.stop()
assert seen == {b"spark-0", b"spark-1", b"spark-2"}, seen
print("spark ok")
'''}


def _same(got: str, want: str) -> bool:
    m, n = re.match(r"(\d+ \d+) (\{.*\})$", got), re.match(r"(\d+ \d+) (\{.*\})$", want)
    if m and n:                 # a record: partition, offset, JSON (its timestamp is today's)
        g, w = json.loads(m.group(2)), json.loads(n.group(2))
        if m.group(1) != n.group(1) or list(g) != list(w) or not isinstance(g.pop("Timestamp", 0), int):
            return False
        w.pop("Timestamp", None)
        return g == w
    return got == want


def _end(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    r = Runner(tmp_path_factory.mktemp("readme"))
    try:
        r.start()
        yield r
    finally:
        r.stop()


@pytest.mark.parametrize("title", _section_params())
def test_readme_section(readme_run, title):
    r = readme_run
    sec = next(s for s in sections(README) if s.title == title)
    env = dict(r.env)
    after_start = False
    for step in sec.steps:
        if step.kind == "shell":
            cmd = r.remap(step.text)
            if any(re.search(rx, cmd) for rx, _why in SKIP_COMMANDS):
                continue
            r.run_shell(step, env, after_start)
            # the step after a broker started (an `export` between does not count) may retry
            after_start = bool(BACKGROUND.search(cmd)) or (after_start and cmd.startswith("export "))
        elif step.kind == "transcript":
            r.run_transcript(step)
        else:
            out = r.run_python(step, title, env)
            if "create_topic(\"events\"" in step.text:
                _check_tour_python(out)
                _check_tour_python(r.run_python(step, title, env), first=False)   # a second run works too
            if title == "Spark":
                assert "spark ok" in out
                print(out)                     # the phases' times (pytest -s shows them)
    r.stop_section_consumers()


def _check_tour_python(out: str, first: bool = True) -> None:
    """The tour's snippet prints the RecordMetadata of its send, then the four records (run
    again: four or more of the eight)."""
    lines = out.splitlines()
    assert lines and lines[0].startswith("RecordMetadata("), out
    values = [re.search(r"b'(\w+)'", line.split(" ", 3)[3]).group(1) for line in lines[1:]]
    assert len(values) >= 4 and set(values) <= {"hello", "a", "b", "c"}, out
    if first:
        assert sorted(values) == ["a", "b", "c", "hello"], out


def test_readme_skip_lists_are_current():
    """Every skipped section and command still exists (a stale entry hides nothing)."""
    titles = {s.title for s in sections(README)}
    assert set(SKIP_SECTIONS) <= titles, set(SKIP_SECTIONS) - titles
    cmds = [st.text for s in sections(README) for st in s.steps if st.kind == "shell"]
    for rx, _ in SKIP_COMMANDS:
        assert any(re.search(rx, c.replace(".venv/bin/", "/")) for c in cmds), rx


def test_consume_group_on_a_missing_topic_says_so(readme_run):
    """Issue 43 item 4: ``mesh consume nosuch --group g`` warns on stderr, as Kafka does."""
    r = readme_run
    p = subprocess.Popen([str(BIN / "mesh"), "consume", "no-such-topic", "--group", "g1", "--bootstrap",
                          r.addr("127.0.0.1:7101")], cwd=r.tmp, env=r.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stderr], [], [], 30)
        line = p.stderr.readline() if ready else ""
        assert "UNKNOWN_TOPIC" in line and "no-such-topic" in line, f"nothing on stderr for 30 s: {line!r}"
    finally:
        _end(p)


def test_text_subscription_ids_are_per_connection(readme_run):
    """Issue 43 item 3: each connection's first SUBS answers ``OK 1`` (the README's ``CONS
    orders 1`` works on any connection)."""
    r = readme_run
    from mesh.client import Admin
    with Admin(r.addr("127.0.0.1:7101")) as a:
        a.create_topic("per-connection", exist_ok=True)
    conns = [socket.create_connection(("127.0.0.1", int(r.port("7201"))), timeout=30) for _ in range(2)]
    try:
        for s in conns:
            f = s.makefile("rwb")
            f.write(b"SUBS per-connection readers\n")
            f.flush()
            assert f.readline() == b"OK 1\n"
    finally:
        for s in conns:
            s.close()


def test_a_no_op_replication_factor_change_says_so(readme_run):
    """Issue 43 item 8: ``topic alter --replication-factor`` to the factor it has moves nothing."""
    r = readme_run
    from mesh.client import Admin
    with Admin(r.addr("127.0.0.1:7101")) as a:
        a.create_topic("rf-same", partitions=2, replication_factor=3, exist_ok=True)
    out = r.sh(f"{BIN}/mesh topic alter rf-same --replication-factor 3", r.env)
    assert out.returncode == 0, out.stderr
    assert "already" in out.stdout and "being added" not in out.stdout, out.stdout
