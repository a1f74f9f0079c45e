#!/usr/bin/python3
"""LokaDB benchmarks (`make bench`): "cloud overhead", "plugin overhead",
"parity" and "routing cost".

cloud overhead: what a pooler adds on top of PostgreSQL: pgbench against the
same throw-away PostgreSQL 15 cluster directly, through Debian's PgBouncer 1.18
and through lokadb, both in transaction mode with the same pool size, the
targets interleaved round by round so that machine noise hits all three alike.

plugin overhead: what a loaded plugin that registered no per-statement hook
costs: the same pgbench rows (select-only and PK update, 1 and 32 clients)
against lokadb with `plugins =` empty and against lokadb with the test plugin
t_noop loaded (only CLIENT_STARTUP and CLIENT_CLOSE hooks), interleaved alike
with an A/A control: a third lokadb process with the same ini as the first (no
plugins), whose ratio to it is the noise that t_noop's ratio is judged against.

parity (bench/parity.py): PgBouncer vs lokadb side by side with TLS (client
side, and both sides), prepared statements in transaction pooling (lokadb
`-M prepared` with max_prepared_statements = 200 against PgBouncer 1.18's
`-M extended`), and two processes of each pooler on one port with
so_reuseport, in a cluster of its own.

routing cost (bench/routing_cost.py): lokadb without plugins vs lokadb with
meta_cache + org_routing (and org_affinity on, when org_routing has it) on
tenant tables whose organizations are all in DEFAULT or all in their own
partition, by number of organizations, in a cluster of its own.

site (bench/site.py; only when BENCH_SUITES names it, about 15 minutes):
what a moved organization costs: the price of distance through postgres_fdw
and the tunnel at four round-trip times, streaming a moved organization by
tunnel window, relay memory with 10/100/1000 idle agents, and 200/500/1000
clients on a moved organization through fdw; two clusters of its own.

    make bench                                  # full run (BENCH_SECONDS=15)
    /usr/bin/python3 bench/run.py --quick       # 3 s smoke run
    BENCH_SCENARIOS=select,connect /usr/bin/python3 bench/run.py

Environment:
    BENCH_SECONDS    measured seconds per target and row (default 15; --quick: 3)
    BENCH_ROUNDS     interleaved rounds the measured seconds are split into
                     (default 3 when BENCH_SECONDS >= 9, else 1)
    BENCH_WARMUP     warm-up seconds per target and row (default 3; --quick: 1)
    BENCH_SCENARIOS  comma list of scenarios (select, update, connect) or rows
                     (select:32); default all
    BENCH_SUITES     comma list of the benchmarks to run: cloud, plugin,
                     parity, routing (default all four), site (only when named)
    BENCH_PARITY_*   the parity suite's own settings: see bench/parity.py and
                     doc/benchmarks.md
    BENCH_ROUTING_*  the routing cost suite's own settings: see
                     bench/routing_cost.py and doc/benchmarks.md
    BENCH_SITE_*     the site suite's own settings: see bench/site.py and
                     doc/benchmarks.md
    LOKADB_TEST_PLUGIN_DIR  directory holding t_noop.so (`make bench` sets it;
                     default build/rel/test-plugins)
    BENCH_POOL_SIZE  default_pool_size of both poolers (default 16)
    BENCH_LOKADB     lokadb binary (default ./lokadb of this repository)
    BENCH_KEEP_TMP   non-empty: keep the temp dir (cluster, inis, pooler logs)

Results: bench/results/cloud-overhead.md, plugin-overhead.md, parity.md and
routing-cost.md (+ routing-cost.png), site.md (+ site.png), each with a dated copy NAME-YYYYMMDD.md
(--quick writes NAME-quick.md only).
See doc/benchmarks.md. Python standard library only.
"""

import argparse
import datetime
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

sys.dont_write_bytecode = True   # keep bench/ free of __pycache__
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402
import parity  # noqa: E402
import routing_cost  # noqa: E402
# bench/site.py by its path: `import site` is Python's own site module.
_spec = importlib.util.spec_from_file_location("site_suite", Path(__file__).resolve().parent / "site.py")
site_suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(site_suite)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DBNAME = "bench"
SCALE = 10

UPDATE_SCRIPT = """\\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
"""

PG_SETTINGS = bl.PG_SETTINGS

TARGETS = ["direct", "pgbouncer", "lokadb"]               # cloud overhead
# plugin overhead: lokadb_control is an A/A control, a second lokadb process
# with exactly the ini of "lokadb" (no plugins).
PLUGIN_TARGETS = ["lokadb", "lokadb_noop", "lokadb_control"]
TARGET_LABEL = {"direct": "direct", "pgbouncer": "PgBouncer", "lokadb": "lokadb",
                "lokadb_noop": "lokadb + t_noop", "lokadb_control": "lokadb control"}
SUITES = ["cloud", "plugin", "parity", "routing"]
# Suites run only when BENCH_SUITES names them (they take longer).
EXTRA_SUITES = ["site"]
NOOP_PLUGIN = "t_noop"
# The plugin overhead rows: the per-statement scenarios (not -C).
PLUGIN_SCENARIOS = ("select", "update")
# The plugin overhead target, against the A/A control (two identical lokadb
# processes differ by up to about 5 % per row on a 2-core machine): in every
# row t_noop/no-plugins >= control/no-plugins - PLUGIN_ROW_MARGIN, and the mean
# over the rows of t_noop/no-plugins >= that of control/no-plugins
# - PLUGIN_MEAN_MARGIN (throughput ratios).
PLUGIN_ROW_MARGIN = 0.05
PLUGIN_MEAN_MARGIN = 0.02
# The former fixed floor (t_noop >= 0.95x no plugins in every row); reported
# for information only, it is not a target: the noise alone can break it.
PLUGIN_TPS_FLOOR = 0.95


class Scenario:
    def __init__(self, name, title, args, clients, measures, cycle=False):
        self.name = name
        self.cycle = cycle        # latency = whole request cycle (see benchlib.read_latencies)
        self.title = title
        self.args = args          # pgbench arguments; "{script}" is the update script
        self.clients = clients
        self.measures = measures


SCENARIOS = [
    Scenario("select", "select-only (`-S`)", ["-S", "-M", "simple"], [1, 32],
             "one primary-key SELECT per transaction (pgbench's built-in select-only)"),
    Scenario("update", "PK update", ["-f", "{script}", "-M", "simple"], [1, 32],
             "one primary-key UPDATE of pgbench_accounts per transaction"),
    Scenario("connect", "connect per txn (`-C -S`)", ["-C", "-S", "-M", "simple"], [16],
             "a new connection for every select-only transaction (connect, login, query, "
             "disconnect)", cycle=True),
]


def select_rows(spec, only=None):
    """[(scenario, clients)] chosen by BENCH_SCENARIOS ("" = all); only: the
    scenario names this benchmark has (None = all)."""
    rows = []
    want = [w.strip() for w in spec.split(",") if w.strip()] if spec else []
    known = {s.name: s for s in SCENARIOS}
    for w in want:
        name = w.split(":", 1)[0]
        if name not in known:
            sys.exit(f"BENCH_SCENARIOS: unknown scenario {name!r} "
                     f"(known: {', '.join(known)}; a row is NAME:CLIENTS)")
        if ":" in w:
            c = w.split(":", 1)[1]
            if not c.isdigit() or int(c) not in known[name].clients:
                sys.exit(f"BENCH_SCENARIOS: {name} has rows for clients "
                         f"{known[name].clients}, not {c!r}")
    for s in SCENARIOS:
        if only is not None and s.name not in only:
            continue
        for c in s.clients:
            if not want or s.name in want or f"{s.name}:{c}" in want:
                rows.append((s, c))
    return rows


split_seconds = bl.split_seconds   # also for parity.py and routing_cost.py (R.split_seconds)


def machine_info():
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = bl.first_line(["nproc"])
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GiB"
    except (OSError, ValueError):
        pass
    return nproc, model, mem, os.uname().release


def lokadb_build_info(binary):
    ver = bl.first_line([binary, "-V"])
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), "status",
                                "--porcelain", "--", "src", "include", "Makefile", "configure"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ver
    if head:
        ver += f" (repository HEAD {head}" + (", with uncommitted changes in the sources)"
                                               if dirty else ")")
    return ver


def command_line():
    """The command as markdown: `make bench` when make ran us, else the python line."""
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
           if k.startswith("BENCH_")]
    argv = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    if os.environ.get("MAKELEVEL") and len(sys.argv) == 1:
        return f"`{' '.join(env + ['make bench'])}` (which runs `{argv}`)"
    return f"`{' '.join(env + [argv])}`"


# --------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------

class Cell:
    """Measurements of one target in one row, summed over the rounds."""

    def __init__(self):
        self.transactions = 0
        self.elapsed = 0.0
        self.latencies = []
        self.errors = []
        self.cpu = 0.0            # pooler CPU seconds in the measured runs
        self.cpu_known = True
        self.round_tps = []       # per measured round (paired comparisons: bl.interval95)
        self.round_p50 = []

    def add(self, res):
        if res.cpu is None:
            self.cpu_known = False
        else:
            self.cpu += res.cpu
        self.transactions += res.transactions
        self.elapsed += res.elapsed or 0.0
        self.latencies.extend(res.latencies_us)
        self.round_tps.append(res.transactions / res.elapsed if res.elapsed else None)
        self.round_p50.append(bl.percentile(sorted(res.latencies_us), 50))

    def finish(self):
        self.latencies.sort()
        self.tps = self.transactions / self.elapsed if self.elapsed > 0 else None
        self.p50 = bl.percentile(self.latencies, 50)
        self.p99 = bl.percentile(self.latencies, 99)
        self.ok = not self.errors and self.tps is not None and self.p50 is not None
        self.cpu_us_per_txn = (self.cpu * 1e6 / self.transactions
                               if self.ok and self.cpu_known and self.transactions else None)
        self.cores = self.cpu / self.elapsed if self.ok and self.cpu_known else None
        self.latencies = None  # free memory


class Bench:
    def __init__(self, opts):
        self.opts = opts
        self.errors = []      # dicts for the report
        self.pg = None
        self.poolers = {}
        self.down = {}        # target -> reason it is no longer usable

    def setup(self):
        self.base = bl.make_tempdir("lokadb-bench-")
        self.logdir = self.base / "pgbench-logs"
        self.logdir.mkdir()
        self.script = self.base / "update.sql"
        self.script.write_text(UPDATE_SCRIPT)
        bl.log(f"temp dir {self.base}")
        # Run a private copy: a `make` elsewhere may replace ./lokadb mid-run.
        self.lokadb_bin, self.lokadb_src = bl.private_lokadb_copy(self.opts.lokadb, self.base)

        self.pg = bl.Postgres(self.base, PG_SETTINGS)
        bl.log(f"initdb + start PostgreSQL on 127.0.0.1:{self.pg.port}")
        self.pg.start()
        self.pg.psql(f"CREATE DATABASE {DBNAME}")
        bl.log(f"pgbench -i -s {SCALE}")
        r = subprocess.run([str(bl.PG_BIN / "pgbench"), "-i", "-q", "-s", str(SCALE),
                            "-h", self.pg.host, "-p", str(self.pg.port), "-U", "postgres",
                            DBNAME], capture_output=True, text=True, timeout=900,
                           env=bl.client_env())
        if r.returncode != 0:
            raise RuntimeError(f"pgbench -i failed:\n{r.stdout}\n{r.stderr}")

        common = {
            "pool_mode": "transaction",
            "default_pool_size": self.opts.pool_size,
            "max_client_conn": 1000,
            "log_connections": 0,
            "log_disconnections": 0,
            "log_stats": 0,
        }
        specs = []
        if "cloud" in self.opts.suites:
            specs.append(("pgbouncer", bl.PGBOUNCER_BIN, {}))
        specs.append(("lokadb", self.lokadb_bin, {}))
        if "plugin" in self.opts.suites:
            # The same binary and ini as "lokadb", plus the no-op plugin.
            specs.append(("lokadb_noop", self.lokadb_bin,
                          {"plugins": NOOP_PLUGIN, "plugin_dir": self.opts.plugin_dir}))
            # The A/A control: exactly the ini of "lokadb" (no plugins).
            specs.append(("lokadb_control", self.lokadb_bin, {}))
        for kind, binary, extra in specs:
            p = bl.Pooler(kind, binary, self.base, self.pg, DBNAME, {**common, **extra})
            self.poolers[kind] = p
            bl.log(f"start {kind} on 127.0.0.1:{p.port}")
            try:
                p.start()
            except RuntimeError as e:
                self.mark_down(kind, None, f"{kind} did not start: {e}", None)
        self.plugin_rows = None
        self.no_plugins_checked = []
        if "plugin" in self.opts.suites:
            self.check_plugins()
        # An idle pooler should use no CPU: catch busy loops before measuring.
        self.idle_cpu = bl.idle_cpu({k: p for k, p in self.poolers.items() if k not in self.down})
        bl.log("idle CPU: " + ", ".join(f"{k} {v * 100:.0f}%" for k, v in self.idle_cpu.items()))

    def check_plugins(self):
        """SHOW PLUGINS on the plugin overhead processes: t_noop must be the
        only plugin of lokadb_noop (its row, with the hooks, goes into the
        report) and lokadb and lokadb_control must have none."""
        for kind in PLUGIN_TARGETS:
            if kind not in self.poolers or kind in self.down:
                continue
            try:
                out = self.poolers[kind].console("SHOW PLUGINS")
            except RuntimeError as e:
                self.mark_down(kind, None, f"SHOW PLUGINS failed: {e}", None)
                continue
            if kind == "lokadb_noop":
                self.plugin_rows = out.splitlines()
                bl.log("lokadb_noop SHOW PLUGINS: " + " / ".join(self.plugin_rows))
                names = [r.split("|", 1)[0] for r in self.plugin_rows]
                if names != [NOOP_PLUGIN]:
                    self.mark_down(kind, None, f"SHOW PLUGINS lists {names}, expected "
                                   f"only {NOOP_PLUGIN}", None)
            elif out.strip():
                self.mark_down(kind, None, f"{kind} (no plugins) lists plugins: {out}", None)
            else:
                self.no_plugins_checked.append(kind)
                bl.log(f"{kind} SHOW PLUGINS: no plugin")

    def stop_poolers_and_read_logs(self):
        """Stop the poolers (so shutdown messages are logged) and keep what
        their logs say besides routine lines."""
        self.pooler_logs = bl.stop_and_read_pooler_logs(self.poolers)

    def versions(self):
        pgv = self.pg.psql("SHOW server_version")
        return {
            "postgres": f"PostgreSQL {pgv}",
            "pgbench": bl.first_line([str(bl.PG_BIN / "pgbench"), "-V"]),
            "pgbouncer": (bl.first_line([bl.PGBOUNCER_BIN, "-V"])
                          if "pgbouncer" in self.poolers else "not run"),
            "lokadb": lokadb_build_info(self.lokadb_bin),
        }

    def port_of(self, target):
        return self.pg.port if target == "direct" else self.poolers[target].port

    def mark_down(self, target, row, msg, res):
        self.down.setdefault(target, msg)
        self.record_error(target, row, msg, res)

    def record_error(self, target, row, msg, res):
        self.errors.append(bl.error_entry(target, row, msg, res, self.poolers.get(target)))
        bl.log(f"ERROR {target} {row or ''}: {msg}")

    def pgbench_args(self, scen, clients):
        args = [a.replace("{script}", str(self.script)) for a in scen.args]
        return args + ["-c", str(clients), "-j", str(min(2, clients))]

    def run_one(self, target, scen, clients, seconds, logprefix, label):
        """One pgbench run; returns the result if it is usable, else None."""
        if target in self.down:
            return None
        pooler = self.poolers.get(target)
        cpu0 = pooler.cpu_seconds() if pooler else None
        res = bl.run_pgbench(self.pgbench_args(scen, clients), "127.0.0.1",
                             self.port_of(target), DBNAME, seconds, logprefix=logprefix,
                             cwd=str(self.logdir), cycle=scen.cycle)
        cpu1 = pooler.cpu_seconds() if pooler else None
        res.cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        rowname = f"{scen.name}:{clients} {label}"
        if target in self.poolers and not self.poolers[target].alive():
            self.mark_down(target, rowname, f"{target} process died during the run", res)
            return None
        if not self.pg.alive():
            raise RuntimeError(f"PostgreSQL died during {rowname} ({target}):\n"
                               f"{bl.tail(self.pg.logpath)}")
        if not res.ok:
            self.record_error(target, rowname, res.error, res)
            return None
        if logprefix is not None and not res.latencies_us:
            self.record_error(target, rowname, "pgbench wrote no per-transaction log", res)
            return None
        return res

    def run_row(self, idx, scen, clients, targets):
        o = self.opts
        bl.log(f"== {scen.name}, {clients} client(s): VACUUM + CHECKPOINT")
        self.pg.psql("VACUUM pgbench_accounts, pgbench_branches, pgbench_tellers, "
                     "pgbench_history", dbname=DBNAME)
        self.pg.psql("CHECKPOINT")
        cells = {t: Cell() for t in targets}
        def log_round(t, r, res, lat):
            bl.log(f"   {scen.name:8s} c={clients:<3d} round {r + 1}/{o.rounds} "
                   f"{t:14s} {res.tps:10.0f} tps  p50 {ms(bl.percentile(lat, 50))} ms"
                   f"  p99 {ms(bl.percentile(lat, 99))} ms")
        bl.run_rounds(targets, idx, o.warmup, o.seconds, o.rounds, cells,
                      lambda t, secs, prefix, label: self.run_one(t, scen, clients, secs, prefix, label),
                      lambda t: t in self.down,
                      lambda t, r: self.logdir / f"{scen.name}-{clients}-{t}-r{r}", log_round)
        for t in targets:
            if t in self.down and not cells[t].errors:
                cells[t].errors.append(f"{t} down")
            cells[t].finish()
        return cells


rotate = bl.rotate


def ms(us, digits=3):
    return "n/a" if us is None else f"{us / 1000.0:.{digits}f}"


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def fmt_tps(c):
    return f"{c.tps:,.0f}" if c.ok else "**FAIL**"


def fmt_lat(c):
    return f"{ms(c.p50)} / {ms(c.p99)}" if c.ok else "**FAIL**"


def fmt_ratio(a, b):
    if not (a.ok and b.ok) or not b.tps:
        return "n/a"
    return f"{a.tps / b.tps:.2f}"


def fmt_added(c, d):
    if not (c.ok and d.ok):
        return "n/a"
    return f"{(c.p50 - d.p50) / 1000.0:+.3f}"


def header(bench, meta, title, kinds, setup):
    """The report's title and the lines about when, where and how it ran."""
    o = bench.opts
    L = [f"# {title}", ""]
    L.append(f"- Date: {meta['date']}")
    L.append(f"- Machine: {meta['nproc']} CPUs (nproc), {meta['model']}, {meta['mem']} RAM, "
             f"Linux {meta['kernel']}. pgbench runs on the same machine and takes about one "
             f"core, so PostgreSQL and the pooler share what is left.")
    idle = [(k, v) for k, v in bench.idle_cpu.items() if k in kinds]
    if idle:
        L.append("- Idle pooler CPU before the runs (2 s, no clients): " + ", ".join(
            f"{TARGET_LABEL[k]} {v * 100:.0f}%" for k, v in idle))
    L.append(f"- Load average (1 min) before / after the run: {meta['load_before']} / "
             f"{meta['load_after']} (anything else running on the machine adds noise)")
    v = meta["versions"]
    L.append(f"- Versions: {v['postgres']}; "
             + (f"{v['pgbouncer']} (Debian); " if "pgbouncer" in kinds else "")
             + f"{v['lokadb']}; {v['pgbench']}")
    L.append(f"- lokadb binary: {bench.lokadb_src}")
    L.append(f"- Command: {meta['command']}")
    L.append(f"- BENCH_SECONDS={o.seconds}: measured seconds per target and row, in "
             f"{o.rounds} interleaved round(s) of {'/'.join(map(str, split_seconds(o.seconds, o.rounds)))} s; "
             f"warm-up {o.warmup} s per target and row"
             + ("; **--quick smoke run**" if o.quick else ""))
    L.append(f"- Setup: pgbench scale {SCALE}; {setup}; "
             f"PostgreSQL max_connections=300, shared_buffers=256MB, fsync=off, "
             f"synchronous_commit=off; `-M simple`, `-j 2` (`-j 1` for 1 client)")
    return L


def pooler_log_lines(bench, kinds):
    logs = [(k, v) for k, v in (getattr(bench, "pooler_logs", None) or {}).items() if k in kinds]
    return bl.pooler_log_lines(logs, lambda k: TARGET_LABEL[k])


def command_lines(bench, results):
    L = ["pgbench command per row (`-T` = the round's seconds, `--log` added for "
         "measured rounds; the port selects the target):", ""]
    seen = set()
    for scen, clients, _ in results:
        if (scen.name, clients) in seen:
            continue
        seen.add((scen.name, clients))
        args = " ".join(bench.pgbench_args(scen, clients)).replace(str(bench.script),
                                                                   "update.sql")
        L.append(f"- {scen.title}, {clients}: `pgbench -h 127.0.0.1 -p PORT -U postgres -n "
                 f"-T SECONDS {args} {DBNAME}`")
    if any(s.name == "update" for s, _, _ in results):
        L.append("")
        L.append("update.sql:")
        L.append("")
        L.append("```")
        L.append(UPDATE_SCRIPT.rstrip())
        L.append("```")
    return L


def report_tail(bench, results, kinds, target_lines):
    """The end of the cloud and plugin reports: logs, targets, commands, errors."""
    L = [""] + pooler_log_lines(bench, kinds)
    L.append("Targets:")
    L.append("")
    for line in target_lines:
        L.append(f"- {line}")
    L.append("")
    L += command_lines(bench, results)
    L += bl.error_lines([e for e in bench.errors if e["target"] in kinds])
    return "\n".join(L) + "\n"


def render(bench, results, meta):
    o = bench.opts
    L = header(bench, meta, "Cloud overhead: direct vs PgBouncer vs lokadb", TARGETS,
               f"both poolers pool_mode=transaction, default_pool_size={o.pool_size}, "
               f"auth_type=trust, TCP on 127.0.0.1")
    L.append("")
    L.append("| scenario | clients | direct tps | PgBouncer tps | lokadb tps "
             "| direct p50 / p99 ms | PgBouncer p50 / p99 ms | lokadb p50 / p99 ms "
             "| lokadb / PgBouncer tps | lokadb / direct tps "
             "| PgBouncer added p50 ms | lokadb added p50 ms |")
    L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for scen, clients, cells in results:
        d, b, k = cells["direct"], cells["pgbouncer"], cells["lokadb"]
        L.append(f"| {scen.title} | {clients} | {fmt_tps(d)} | {fmt_tps(b)} | {fmt_tps(k)} "
                 f"| {fmt_lat(d)} | {fmt_lat(b)} | {fmt_lat(k)} "
                 f"| {fmt_ratio(k, b)} | {fmt_ratio(k, d)} "
                 f"| {fmt_added(b, d)} | {fmt_added(k, d)} |")
    L.append("")
    L.append("Latency is per transaction, from pgbench's per-transaction logs (`--log`, "
             "every transaction, all rounds pooled). For the `-C` row it is the whole "
             "request cycle (time between a client's consecutive transaction ends: "
             "disconnect + connect + login + query), since pgbench's own per-transaction "
             "time starts after the connection is made. \"Added p50\" is the target's p50 "
             "minus the direct p50 of the same row.")
    L.append("")
    L.append("Pooler CPU (user + system time of the pooler process over the measured runs, "
             "from /proc; \"cores\" = CPU seconds per wall second):")
    L.append("")
    L.append("| scenario | clients | PgBouncer CPU µs / txn | lokadb CPU µs / txn "
             "| PgBouncer cores | lokadb cores |")
    L.append("|---|--:|--:|--:|--:|--:|")
    for scen, clients, cells in results:
        b, k = cells["pgbouncer"], cells["lokadb"]
        L.append(f"| {scen.title} | {clients} | {fmt_num(b.cpu_us_per_txn, '.1f')} "
                 f"| {fmt_num(k.cpu_us_per_txn, '.1f')} | {fmt_num(b.cores, '.2f')} "
                 f"| {fmt_num(k.cores, '.2f')} |")
    return "\n".join(L) + "\n" + report_tail(bench, results, TARGETS, targets(results))


def fmt_num(x, fmt):
    return "n/a" if x is None else format(x, fmt)


def fmt_cpu_ratio(a, b):
    if a.cpu_us_per_txn is None or not b.cpu_us_per_txn:
        return "n/a"
    return f"{a.cpu_us_per_txn / b.cpu_us_per_txn:.2f}"


def render_plugin(bench, results, meta):
    o = bench.opts
    N = NOOP_PLUGIN
    L = header(bench, meta, f"Plugin overhead: lokadb without plugins vs lokadb with {N} "
               f"(with an A/A control)", PLUGIN_TARGETS,
               f"three lokadb processes of the same binary with the same ini "
               f"(pool_mode=transaction, default_pool_size={o.pool_size}, auth_type=trust, "
               f"TCP on 127.0.0.1): \"no plugins\" and \"control\" with `plugins =` empty, "
               f"\"{N}\" with `plugins = {N}` and `plugin_dir = {bl.shown_path(o.plugin_dir)}`")
    if bench.plugin_rows is not None:
        L.append(f"- `SHOW PLUGINS` of lokadb + {N} (name|version|abi|path|hooks|"
                 f"transports|commands|state): "
                 + "; ".join(f"`{bl.shown_path(r)}`" for r in bench.plugin_rows))
    if bench.no_plugins_checked:
        L.append("- `SHOW PLUGINS` of " + " and of ".join(
            "lokadb (no plugins)" if k == "lokadb" else TARGET_LABEL[k]
            for k in bench.no_plugins_checked) + ": no rows")
    L.append("")
    L.append(f"{N} registers only the CLIENT_STARTUP and CLIENT_CLOSE hooks "
             f"(both return LK_CONTINUE) and flags no client for QUERY, so after login the "
             f"core never calls it. \"no plugins\" is lokadb with `plugins =` empty. "
             f"\"control\" is an A/A control: a second lokadb process with exactly the ini "
             f"of \"no plugins\", measured in the same interleaved rounds; control / no "
             f"plugins shows how far two identical processes drift apart in this run, and "
             f"{N} / no plugins is judged against it.")
    L.append("")
    L.append(f"| scenario | clients | no plugins tps | {N} tps | control tps "
             f"| no plugins p50 / p99 ms | {N} p50 / p99 ms | control p50 / p99 ms "
             f"| {N} / no plugins tps | control / no plugins tps "
             f"| {N} - no plugins p50 ms | control - no plugins p50 ms "
             f"| no plugins CPU µs / txn | {N} CPU µs / txn | control CPU µs / txn "
             f"| {N} / no plugins CPU | control / no plugins CPU |")
    L.append("|---|" + "--:|" * 16)
    for scen, clients, cells in results:
        e, n, c = cells["lokadb"], cells["lokadb_noop"], cells["lokadb_control"]
        L.append(f"| {scen.title} | {clients} | {fmt_tps(e)} | {fmt_tps(n)} | {fmt_tps(c)} "
                 f"| {fmt_lat(e)} | {fmt_lat(n)} | {fmt_lat(c)} "
                 f"| {fmt_ratio(n, e)} | {fmt_ratio(c, e)} "
                 f"| {fmt_added(n, e)} | {fmt_added(c, e)} "
                 f"| {fmt_num(e.cpu_us_per_txn, '.1f')} | {fmt_num(n.cpu_us_per_txn, '.1f')} "
                 f"| {fmt_num(c.cpu_us_per_txn, '.1f')} "
                 f"| {fmt_cpu_ratio(n, e)} | {fmt_cpu_ratio(c, e)} |")
    L.append("")
    L.append("Latency is per transaction, from pgbench's per-transaction logs (`--log`, "
             "every transaction, all rounds pooled). CPU is the user + system time of the "
             "lokadb process over the measured runs (from /proc) per transaction. A ratio "
             "of 1.00 means no difference. The control columns are the noise: a "
             f"{N} column is only a cost where it is worse than the control column "
             "of the same row by more than the control's own spread.")
    return "\n".join(L) + "\n" + report_tail(bench, results, PLUGIN_TARGETS, plugin_targets(results))


def plugin_targets(results):
    """The plugin overhead target, judged against the A/A control, and the
    former fixed 0.95 floor as an information line (no PASS/FAIL)."""
    N = NOOP_PLUGIN
    bad, det, noop_r, ctrl_r = [], [], [], []
    for s, c, cells in results:
        e, k, a = cells["lokadb"], cells["lokadb_noop"], cells["lokadb_control"]
        if not (e.ok and k.ok and a.ok):
            bad.append(f"{s.name}:{c} (failed run)")
            continue
        rk, ra = k.tps / e.tps, a.tps / e.tps
        noop_r.append(rk)
        ctrl_r.append(ra)
        det.append(f"{s.name}:{c} {N} {rk:.3f} vs control {ra:.3f}")
        if rk < ra - PLUGIN_ROW_MARGIN:
            bad.append(f"{s.name}:{c} ({N} {rk:.3f} < control {ra:.3f} "
                       f"- {PLUGIN_ROW_MARGIN:.2f})")
    if noop_r:
        mk, ma = sum(noop_r) / len(noop_r), sum(ctrl_r) / len(ctrl_r)
        det.append(f"mean over {len(noop_r)} row(s): {N} {mk:.3f}, control {ma:.3f}")
        if mk < ma - PLUGIN_MEAN_MARGIN:
            bad.append(f"mean ({N} {mk:.3f} < control {ma:.3f} - {PLUGIN_MEAN_MARGIN:.2f})")
    out = [verdict(not bad and bool(noop_r),
                   f"{N} costs nothing measurable: in every row, {N} / no plugins "
                   f"throughput >= control / no plugins throughput - {PLUGIN_ROW_MARGIN:.2f}, "
                   f"and the mean over the rows of {N} / no plugins >= the mean of "
                   f"control / no plugins - {PLUGIN_MEAN_MARGIN:.2f}",
                   "; ".join(det), bad)]
    if noop_r:
        low = [f"{s.name}:{c}" for (s, c, cells) in results
               if cells["lokadb"].ok and cells["lokadb_noop"].ok
               and cells["lokadb_noop"].tps / cells["lokadb"].tps < PLUGIN_TPS_FLOOR]
        out.append(f"Information, not a target: {N} / no plugins throughput >= "
                   f"{PLUGIN_TPS_FLOOR:.2f} in every row: "
                   + ("yes" if not low else "no, below in " + ", ".join(low))
                   + f" (lowest {N} / no plugins {min(noop_r):.3f}; lowest control / "
                   f"no plugins {min(ctrl_r):.3f}, the noise of two identical processes)")
    return out


def compare_tps(k, b):
    """lokadb's cell k against cell b of the same row: (pooled ratio, the
    95 % interval of the per-round ratios or None, behind). lokadb is behind
    only when it is measurably slower: the pooled ratio is under 1.00 and
    so is the top of the interval (with one round: the ratio alone)."""
    r = k.tps / b.tps
    ci = bl.interval95([x / y if x and y else None for x, y in zip(k.round_tps, b.round_tps)])
    return r, ci, r < 1.0 and (ci is None or ci[2] < 1.0)


def compare_p50(k, b):
    """The same for the p50 latency: (the 95 % interval of the per-round
    differences k - b in µs or None, behind) given that the pooled p50 of k
    is higher; behind when the bottom of the interval is above 0 too."""
    ci = bl.interval95([x - y if x is not None and y is not None else None
                        for x, y in zip(k.round_p50, b.round_p50)])
    return ci, ci is None or ci[1] > 0


def fmt_interval(ci, f=".2f"):
    return f"rounds {format(ci[1], f)} to {format(ci[2], f)}" if ci else "one round"


def targets(results):
    """Pass/fail lines for the three targets. A row where lokadb is under
    PgBouncer by less than the rounds can tell (compare_tps, compare_p50) is
    a tie: listed, not failed."""
    out = []
    rows = [(s, c, cells) for s, c, cells in results]
    name = lambda s, c: f"{s.name}:{c}"  # noqa: E731

    bad, ties, worst, n = [], [], None, 0
    for s, c, cells in rows:
        k, b = cells["lokadb"], cells["pgbouncer"]
        if not (k.ok and b.ok):
            bad.append(f"{name(s, c)} (failed run)")
            continue
        n += 1
        r, ci, behind = compare_tps(k, b)
        worst = r if worst is None else min(worst, r)
        if behind:
            bad.append(f"{name(s, c)} ({r:.3f}x, {fmt_interval(ci)})")
        elif r < 1.0:
            ties.append(f"{name(s, c)} ({r:.3f}x, {fmt_interval(ci)})")
    detail = f"lowest lokadb/PgBouncer ratio {worst:.3f}" if worst is not None else ""
    if ties:
        detail += "; ties (under 1.00 by less than the rounds tell apart): " + ", ".join(ties)
    out.append(verdict(not bad and n > 0, "lokadb throughput >= PgBouncer's in every row, "
                       "or not measurably lower (the 95 % interval of the per-round ratios "
                       "reaches 1.00)", detail, bad))

    bad, ties, n = [], [], 0
    for s, c, cells in rows:
        k, b, d = cells["lokadb"], cells["pgbouncer"], cells["direct"]
        if not (k.ok and b.ok and d.ok):
            bad.append(f"{name(s, c)} (failed run)")
            continue
        n += 1
        ka, ba = (k.p50 - d.p50) / 1000.0, (b.p50 - d.p50) / 1000.0
        if ka > ba:
            ci, behind = compare_p50(k, b)
            what = (f"{name(s, c)} (lokadb {ka:+.3f} ms vs PgBouncer {ba:+.3f} ms, "
                    f"{fmt_interval(ci, '+.0f')} µs)")
            (bad if behind else ties).append(what)
    out.append(verdict(not bad and n > 0, "lokadb's added p50 latency <= PgBouncer's in "
                       "every row, or not measurably higher (the 95 % interval of the "
                       "per-round differences of p50 reaches 0)",
                       "ties: " + ", ".join(ties) if ties else "", bad))

    conn = [(s, c, cells) for s, c, cells in rows if s.name == "connect"]
    if not conn:
        out.append("NOT MEASURED: per-request connections (`-C`) through lokadb >= 2x direct "
                   "(connect scenario not selected)")
    else:
        bad, det = [], []
        for s, c, cells in conn:
            k, d = cells["lokadb"], cells["direct"]
            if not (k.ok and d.ok):
                bad.append(f"{name(s, c)} (failed run)")
                continue
            r = k.tps / d.tps
            det.append(f"{r:.2f}x at {c} clients")
            if r < 2.0:
                bad.append(f"{name(s, c)} ({r:.2f}x)")
        out.append(verdict(not bad, "per-request connections (`-C`) through lokadb >= 2x "
                           "direct", ", ".join(det), bad))
    return out


def verdict(ok, what, detail, bad):
    s = f"**{'PASS' if ok else 'FAIL'}**: {what}"
    if detail:
        s += f" ({detail})"
    if bad:
        s += "; failing: " + ", ".join(bad)
    return s


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description="LokaDB benchmarks: cloud overhead "
                                 "(direct vs PgBouncer vs lokadb), plugin overhead "
                                 "(lokadb without plugins vs lokadb with t_noop vs an identical "
                                 "lokadb control), parity (PgBouncer vs lokadb with TLS, "
                                 "prepared statements and so_reuseport) and routing cost "
                                 "(lokadb without plugins vs with meta_cache + org_routing, by "
                                 "number of organizations)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 3 s runs, 1 round, 1 s warm-up (routing cost: 1 and 100 "
                         "organizations); writes bench/results/cloud-overhead-quick.md, "
                         "plugin-overhead-quick.md, parity-quick.md and routing-cost-quick.md "
                         "(+ .png)")
    ap.add_argument("--output", help="write the cloud overhead table here instead of "
                    "bench/results/ (the plugin overhead table goes next to it, as "
                    "NAME-plugin-overhead.md, the parity table as NAME-parity.md and the "
                    "routing cost table as NAME-routing-cost.md; when only one benchmark "
                    "runs, to FILE)")
    ap.add_argument("--strict", action="store_true",
                    help="exit with status 3 when a target fails")
    o = ap.parse_args()
    o.seconds = bl.env_int("BENCH_SECONDS", 3 if o.quick else 15)
    if o.seconds < 1:
        sys.exit("BENCH_SECONDS must be at least 1")
    o.rounds = bl.env_int("BENCH_ROUNDS", 1 if (o.quick or o.seconds < 9) else 3)
    o.rounds = max(1, min(o.rounds, o.seconds))
    o.warmup = bl.env_int("BENCH_WARMUP", 1 if o.quick else 3)
    o.pool_size = bl.env_int("BENCH_POOL_SIZE", 16)
    o.lokadb = os.environ.get("BENCH_LOKADB") or str(REPO / "lokadb")

    suites_env = os.environ.get("BENCH_SUITES", "").strip()
    o.suites = [w.strip() for w in suites_env.split(",") if w.strip()] or list(SUITES)
    for w in o.suites:
        if w not in SUITES + EXTRA_SUITES:
            sys.exit(f"BENCH_SUITES: unknown benchmark {w!r} (known: "
                     f"{', '.join(SUITES + EXTRA_SUITES)})")
    spec = os.environ.get("BENCH_SCENARIOS", "")
    o.rows = select_rows(spec) if "cloud" in o.suites else []
    o.plugin_rows = select_rows(spec, PLUGIN_SCENARIOS) if "plugin" in o.suites else []
    if "plugin" in o.suites and not o.plugin_rows:
        bl.log("plugin overhead skipped: BENCH_SCENARIOS chose no select or update row")
        o.suites.remove("plugin")
    if "cloud" in o.suites and not o.rows:
        o.suites.remove("cloud")
    if "plugin" in o.suites:
        o.plugin_dir = os.path.abspath(os.environ.get("LOKADB_TEST_PLUGIN_DIR")
                                       or str(REPO / "build" / "rel" / "test-plugins"))
        so = Path(o.plugin_dir) / f"{NOOP_PLUGIN}.so"
        if not so.is_file():
            msg = (f"{so} is missing: run `make test-plugins` (or `make bench`, which "
                   f"builds it and sets LOKADB_TEST_PLUGIN_DIR)")
            if suites_env:
                sys.exit(msg)
            bl.log(f"plugin overhead skipped: {msg}")
            o.suites.remove("plugin")
    if "plugin" not in o.suites:
        o.plugin_rows = []
    # A suite that cannot run is skipped, unless BENCH_SUITES asked for it (site: always asked for).
    for suite, title, module in (("parity", "parity", parity), ("routing", "routing cost", routing_cost),
                                 ("site", "site", site_suite)):
        if suite in o.suites:
            why = module.setup_options(o)
            if why:
                if suites_env or suite == "site":
                    sys.exit(f"{title}: {why}")
                bl.log(f"{title} skipped: {why}")
                o.suites.remove(suite)
    if not o.suites:
        sys.exit("nothing to run: BENCH_SUITES / BENCH_SCENARIOS chose no row")
    if not os.access(o.lokadb, os.X_OK):
        sys.exit(f"{o.lokadb} is missing: run `make` first")
    need = [bl.PG_BIN / "initdb", bl.PG_BIN / "pgbench"]
    if "cloud" in o.suites:
        need.append(bl.PGBOUNCER_BIN)
    for b in need:
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is missing")
    return o


def output_paths(o, now, name, only_one):
    """Where the report `name` ("cloud-overhead" or "plugin-overhead") goes."""
    return bl.output_paths(o, now, name, RESULTS, only_one=only_one or name == "cloud-overhead")


def main():
    o = parse_args()
    bl.install_cleanup_handlers()
    now = datetime.datetime.now(datetime.timezone.utc)
    status = []
    if o.rows or o.plugin_rows:
        rc = run_cloud_plugin(o, now)
        if rc == 130:
            return rc
        status.append(rc)
    # Each of these suites has a cluster (or clusters) of its own, started
    # after the suites before it have stopped theirs: parity (ssl = on),
    # routing (settings for thousands of partitions), site (cloud and site).
    for suite, module, only_one in (
            ("parity", parity, not (o.rows or o.plugin_rows) and "routing" not in o.suites),
            ("routing", routing_cost, not (o.rows or o.plugin_rows or "parity" in o.suites)),
            ("site", site_suite, o.suites == ["site"])):
        if suite not in o.suites:
            continue
        rc, lines = module.run_suite(o, sys.modules[__name__], now, only_one)
        if rc == 130:
            return rc
        if rc == 0 and o.strict and any(x.startswith("**FAIL") for x in lines):
            rc = 3
        status.append(rc)
    for rc in (2, 1, 3):
        if rc in status:
            return rc
    return 0


def run_cloud_plugin(o, now):
    """The cloud overhead and plugin overhead suites (one cluster, one run)."""
    load_before = os.getloadavg()[0]
    runs = len(o.rows) * len(TARGETS) + len(o.plugin_rows) * len(PLUGIN_TARGETS)
    est = runs * (o.seconds + o.warmup + 1)
    if o.rows:
        bl.log(f"cloud overhead: {len(o.rows)} row(s) x {len(TARGETS)} targets")
    if o.plugin_rows:
        bl.log(f"plugin overhead: {len(o.plugin_rows)} row(s) x {len(PLUGIN_TARGETS)} targets")
    bl.log(f"{o.seconds} s each ({o.rounds} round(s)) + {o.warmup} s warm-up; "
           f"about {est // 60} min {est % 60} s plus setup")
    bench = Bench(o)
    results, plugin_results = [], []
    versions = {}

    def steps():
        bench.setup()
        versions.update(bench.versions())
        idx = 0
        for scen, clients in o.rows:
            results.append((scen, clients, bench.run_row(idx, scen, clients, TARGETS)))
            idx += 1
        if o.plugin_rows:
            bl.log("== plugin overhead: lokadb vs lokadb_noop vs lokadb_control")
        for scen, clients in o.plugin_rows:
            plugin_results.append((scen, clients,
                                   bench.run_row(idx, scen, clients, PLUGIN_TARGETS)))
            idx += 1
        bench.stop_poolers_and_read_logs()
    rc, err = bl.run_bench(bench, "benchmark", steps)
    bl.cleanup()
    if rc is not None:
        return rc
    if err is not None:
        return 2

    meta = bl.report_meta(sys.modules[__name__], now, load_before, versions)
    bench.errors += bl.shutdown_errors(bench.poolers)
    reports = []
    only_one = len([s for s in o.suites if s in ("cloud", "plugin")]) == 1
    if "cloud" in o.suites:
        reports.append(("cloud-overhead", render(bench, results, meta),
                        targets(results)))
    if "plugin" in o.suites:
        reports.append(("plugin-overhead", render_plugin(bench, plugin_results, meta),
                        plugin_targets(plugin_results)))
    RESULTS.mkdir(parents=True, exist_ok=True)
    bl.write_reports([(text, output_paths(o, now, name, only_one)) for name, text, _ in reports])
    if bench.errors:
        return 1
    if o.strict and any(line.startswith("**FAIL") for _, _, lines in reports for line in lines):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
