#!/usr/bin/python3
"""LokaDB benchmark: scenario "cloud overhead" (`make bench`).

Measures what a pooler adds on top of PostgreSQL: pgbench against the same
throw-away PostgreSQL 15 cluster directly, through Debian's PgBouncer 1.18 and
through lokadb, both in transaction mode with the same pool size, the targets
interleaved round by round so that machine noise hits all three alike.

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
    BENCH_POOL_SIZE  default_pool_size of both poolers (default 16)
    BENCH_LOKADB     lokadb binary (default ./lokadb of this repository)
    BENCH_KEEP_TMP   non-empty: keep the temp dir (cluster, inis, pooler logs)

Results: bench/results/cloud-overhead.md and a dated copy
cloud-overhead-YYYYMMDD.md (--quick writes cloud-overhead-quick.md only).
See doc/benchmarks.md. Python standard library only.
"""

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True   # keep bench/ free of __pycache__
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DBNAME = "bench"
SCALE = 10

UPDATE_SCRIPT = """\\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
"""

PG_SETTINGS = {
    "max_connections": "300",
    "shared_buffers": "256MB",
    "fsync": "off",
    "synchronous_commit": "off",
    # Keep checkpoints out of the measured runs (an explicit CHECKPOINT runs
    # before every row instead).
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
    "log_min_messages": "warning",
}

TARGETS = ["direct", "pgbouncer", "lokadb"]
TARGET_LABEL = {"direct": "direct", "pgbouncer": "PgBouncer", "lokadb": "lokadb"}


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


def env_int(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return default
    try:
        n = int(v)
    except ValueError:
        sys.exit(f"{name} must be an integer, not {v!r}")
    if n < 0:
        sys.exit(f"{name} must not be negative")
    return n


def select_rows(spec):
    """[(scenario, clients)] chosen by BENCH_SCENARIOS ("" = all)."""
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
        for c in s.clients:
            if not want or s.name in want or f"{s.name}:{c}" in want:
                rows.append((s, c))
    return rows


def split_seconds(total, rounds):
    base, extra = divmod(total, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


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

    def add(self, res):
        if res.cpu is None:
            self.cpu_known = False
        else:
            self.cpu += res.cpu
        self.transactions += res.transactions
        self.elapsed += res.elapsed or 0.0
        self.latencies.extend(res.latencies_us)

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
        src = Path(self.opts.lokadb)
        st = src.stat()
        shown = f"./{src.relative_to(REPO)}" if src.is_relative_to(REPO) else str(src)
        self.lokadb_src = (f"`{shown}` ({st.st_size} bytes, built "
                           f"{datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC)")
        self.lokadb_bin = str(self.base / "lokadb-bin")
        shutil.copy2(src, self.lokadb_bin)

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
        specs = [("pgbouncer", bl.PGBOUNCER_BIN), ("lokadb", self.lokadb_bin)]
        for kind, binary in specs:
            p = bl.Pooler(kind, binary, self.base, self.pg, DBNAME, common)
            self.poolers[kind] = p
            bl.log(f"start {kind} on 127.0.0.1:{p.port}")
            try:
                p.start()
            except RuntimeError as e:
                self.mark_down(kind, None, f"{kind} did not start: {e}", None)
        # An idle pooler should use no CPU: catch busy loops before measuring.
        self.idle_cpu = {}
        up = {k: p for k, p in self.poolers.items() if k not in self.down}
        c0 = {k: p.cpu_seconds() for k, p in up.items()}
        time.sleep(2.0)
        for k, p in up.items():
            c1 = p.cpu_seconds()
            if c0[k] is not None and c1 is not None:
                self.idle_cpu[k] = (c1 - c0[k]) / 2.0
        bl.log("idle CPU: " + ", ".join(f"{k} {v * 100:.0f}%" for k, v in self.idle_cpu.items()))

    def stop_poolers_and_read_logs(self):
        """Stop the poolers (so shutdown messages are logged) and keep what
        their logs say besides routine lines."""
        self.pooler_logs = {}
        for kind, p in self.poolers.items():
            p.stop()
            lines = []
            for path in (p.logfile, p.stderr_path):
                try:
                    lines += path.read_text(errors="replace").splitlines()
                except OSError:
                    pass
            notable = [x for x in lines if re.search(r"\b(warning|error|fatal|panic|"
                                                     r"assert|sanitizer|segv)", x, re.I)]
            self.pooler_logs[kind] = (len(lines), notable)

    def versions(self):
        pgv = self.pg.psql("SHOW server_version")
        return {
            "postgres": f"PostgreSQL {pgv}",
            "pgbench": bl.first_line([str(bl.PG_BIN / "pgbench"), "-V"]),
            "pgbouncer": bl.first_line([bl.PGBOUNCER_BIN, "-V"]),
            "lokadb": lokadb_build_info(self.lokadb_bin),
        }

    def port_of(self, target):
        return self.pg.port if target == "direct" else self.poolers[target].port

    def mark_down(self, target, row, msg, res):
        self.down.setdefault(target, msg)
        self.record_error(target, row, msg, res)

    def record_error(self, target, row, msg, res):
        err = {"target": target, "row": row, "message": msg}
        if res is not None:
            err["cmd"] = " ".join(shlex.quote(a) for a in res.cmd)
            err["output"] = "\n".join(res.output.strip().splitlines()[-25:])
        if target in self.poolers:
            p = self.poolers[target]
            err["process"] = p.exit_info() if p.popen is not None else f"{target} not running"
            err["log"] = bl.tail(p.logfile, 40)
            err["stderr"] = bl.tail(p.stderr_path, 20)
        self.errors.append(err)
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

    def run_row(self, idx, scen, clients):
        o = self.opts
        bl.log(f"== {scen.name}, {clients} client(s): VACUUM + CHECKPOINT")
        self.pg.psql("VACUUM pgbench_accounts, pgbench_branches, pgbench_tellers, "
                     "pgbench_history", dbname=DBNAME)
        self.pg.psql("CHECKPOINT")
        cells = {t: Cell() for t in TARGETS}
        # Rotate the order from row to row and round to round: no target always
        # runs first (on a cold cache) or last.
        if o.warmup > 0:
            for t in rotate(TARGETS, idx):
                if self.run_one(t, scen, clients, o.warmup, None, "warm-up") is None \
                        and t not in self.down:
                    cells[t].errors.append("warm-up failed")
        for r, secs in enumerate(split_seconds(o.seconds, o.rounds)):
            for t in rotate(TARGETS, idx + r):
                if cells[t].errors:
                    continue
                prefix = self.logdir / f"{scen.name}-{clients}-{t}-r{r}"
                res = self.run_one(t, scen, clients, secs, str(prefix),
                                   f"round {r + 1}/{o.rounds}")
                if res is None:
                    cells[t].errors.append("run failed")
                    continue
                cells[t].add(res)
                lat = sorted(res.latencies_us)
                bl.log(f"   {scen.name:8s} c={clients:<3d} round {r + 1}/{o.rounds} "
                       f"{t:10s} {res.tps:10.0f} tps  p50 {ms(bl.percentile(lat, 50))} ms"
                       f"  p99 {ms(bl.percentile(lat, 99))} ms")
        for t in TARGETS:
            if t in self.down and not cells[t].errors:
                cells[t].errors.append(f"{t} down")
            cells[t].finish()
        return cells


def rotate(lst, n):
    n %= len(lst)
    return lst[n:] + lst[:n]


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


def render(bench, results, meta):
    o = bench.opts
    L = []
    L.append("# Cloud overhead: direct vs PgBouncer vs lokadb")
    L.append("")
    L.append(f"- Date: {meta['date']}")
    L.append(f"- Machine: {meta['nproc']} CPUs (nproc), {meta['model']}, {meta['mem']} RAM, "
             f"Linux {meta['kernel']}. pgbench runs on the same machine and takes about one "
             f"core, so PostgreSQL and the pooler share what is left.")
    if bench.idle_cpu:
        L.append("- Idle pooler CPU before the runs (2 s, no clients): " + ", ".join(
            f"{TARGET_LABEL[k]} {v * 100:.0f}%" for k, v in bench.idle_cpu.items()))
    L.append(f"- Load average (1 min) before / after the run: {meta['load_before']} / "
             f"{meta['load_after']} (anything else running on the machine adds noise)")
    v = meta["versions"]
    L.append(f"- Versions: {v['postgres']}; {v['pgbouncer']} (Debian); {v['lokadb']}; "
             f"{v['pgbench']}")
    L.append(f"- lokadb binary: {bench.lokadb_src}")
    L.append(f"- Command: {meta['command']}")
    L.append(f"- BENCH_SECONDS={o.seconds}: measured seconds per target and row, in "
             f"{o.rounds} interleaved round(s) of {'/'.join(map(str, split_seconds(o.seconds, o.rounds)))} s; "
             f"warm-up {o.warmup} s per target and row"
             + ("; **--quick smoke run**" if o.quick else ""))
    L.append(f"- Setup: pgbench scale {SCALE}; both poolers pool_mode=transaction, "
             f"default_pool_size={o.pool_size}, auth_type=trust, TCP on 127.0.0.1; "
             f"PostgreSQL max_connections=300, shared_buffers=256MB, fsync=off, "
             f"synchronous_commit=off; `-M simple`, `-j 2` (`-j 1` for 1 client)")
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
        f = lambda x, fmt: "n/a" if x is None else format(x, fmt)  # noqa: E731
        L.append(f"| {scen.title} | {clients} | {f(b.cpu_us_per_txn, '.1f')} "
                 f"| {f(k.cpu_us_per_txn, '.1f')} | {f(b.cores, '.2f')} | {f(k.cores, '.2f')} |")
    L.append("")
    if getattr(bench, "pooler_logs", None):
        L.append("Pooler logs (log_connections, log_disconnections and log_stats off): " + "; ".join(
            f"{TARGET_LABEL[k]} {n} line(s), {len(bad)} warning/error line(s)"
            for k, (n, bad) in bench.pooler_logs.items()))
        for k, (n, bad) in bench.pooler_logs.items():
            if bad:
                L.append("")
                L.append(f"{TARGET_LABEL[k]} warnings/errors (first 10):")
                L.append("")
                L.append("```")
                L.extend(bad[:10])
                L.append("```")
        L.append("")
    L.append("Targets:")
    L.append("")
    for line in targets(results):
        L.append(f"- {line}")
    L.append("")
    L.append("pgbench command per row (`-T` = the round's seconds, `--log` added for "
             "measured rounds; the port selects the target):")
    L.append("")
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
    if bench.errors:
        L.append("")
        L.append("## Errors")
        for e in bench.errors:
            L.append("")
            L.append(f"- {e['target']} {e['row'] or ''}: {e['message']}")
            for key in ("cmd", "process"):
                if e.get(key):
                    L.append(f"  - {key}: `{e[key]}`")
            for key in ("output", "log", "stderr"):
                if e.get(key):
                    L.append(f"  - {key}:")
                    L.append("")
                    L.append("    ```")
                    L.extend("    " + x for x in e[key].splitlines())
                    L.append("    ```")
    return "\n".join(L) + "\n"


def targets(results):
    """Pass/fail lines for the three targets."""
    out = []
    rows = [(s, c, cells) for s, c, cells in results]
    name = lambda s, c: f"{s.name}:{c}"  # noqa: E731

    bad, worst, n = [], None, 0
    for s, c, cells in rows:
        k, b = cells["lokadb"], cells["pgbouncer"]
        if not (k.ok and b.ok):
            bad.append(f"{name(s, c)} (failed run)")
            continue
        n += 1
        r = k.tps / b.tps
        worst = r if worst is None else min(worst, r)
        if r < 1.0:
            bad.append(f"{name(s, c)} ({r:.2f}x)")
    out.append(verdict(not bad and n > 0, "lokadb throughput >= PgBouncer's in every row",
                       f"lowest lokadb/PgBouncer ratio {worst:.2f}" if worst is not None else "",
                       bad))

    bad, n = [], 0
    for s, c, cells in rows:
        k, b, d = cells["lokadb"], cells["pgbouncer"], cells["direct"]
        if not (k.ok and b.ok and d.ok):
            bad.append(f"{name(s, c)} (failed run)")
            continue
        n += 1
        ka, ba = (k.p50 - d.p50) / 1000.0, (b.p50 - d.p50) / 1000.0
        if ka > ba:
            bad.append(f"{name(s, c)} (lokadb {ka:+.3f} ms vs PgBouncer {ba:+.3f} ms)")
    out.append(verdict(not bad and n > 0, "lokadb's added p50 latency <= PgBouncer's in "
                       "every row", "", bad))

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
    ap = argparse.ArgumentParser(description="LokaDB benchmark: cloud overhead "
                                 "(direct vs PgBouncer vs lokadb)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 3 s runs, 1 round, 1 s warm-up; writes "
                         "bench/results/cloud-overhead-quick.md")
    ap.add_argument("--output", help="write the table here instead of bench/results/")
    ap.add_argument("--strict", action="store_true",
                    help="exit with status 3 when a target fails")
    o = ap.parse_args()
    o.seconds = env_int("BENCH_SECONDS", 3 if o.quick else 15)
    if o.seconds < 1:
        sys.exit("BENCH_SECONDS must be at least 1")
    o.rounds = env_int("BENCH_ROUNDS", 1 if (o.quick or o.seconds < 9) else 3)
    o.rounds = max(1, min(o.rounds, o.seconds))
    o.warmup = env_int("BENCH_WARMUP", 1 if o.quick else 3)
    o.pool_size = env_int("BENCH_POOL_SIZE", 16)
    o.lokadb = os.environ.get("BENCH_LOKADB") or str(REPO / "lokadb")
    o.rows = select_rows(os.environ.get("BENCH_SCENARIOS", ""))
    if not os.access(o.lokadb, os.X_OK):
        sys.exit(f"{o.lokadb} is missing: run `make` first")
    for b in (bl.PG_BIN / "initdb", bl.PG_BIN / "pgbench", bl.PGBOUNCER_BIN):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} is missing")
    return o


def main():
    o = parse_args()
    bl.install_cleanup_handlers()
    now = datetime.datetime.now(datetime.timezone.utc)
    nproc, model, mem, kernel = machine_info()
    load_before = os.getloadavg()[0]
    est = len(o.rows) * len(TARGETS) * (o.seconds + o.warmup + 1)
    bl.log(f"cloud overhead: {len(o.rows)} row(s) x {len(TARGETS)} targets, "
           f"{o.seconds} s each ({o.rounds} round(s)) + {o.warmup} s warm-up; "
           f"about {est // 60} min {est % 60} s plus setup")
    bench = Bench(o)
    results = []
    try:
        bench.setup()
        versions = bench.versions()
        for idx, (scen, clients) in enumerate(o.rows):
            results.append((scen, clients, bench.run_row(idx, scen, clients)))
        bench.stop_poolers_and_read_logs()
    except KeyboardInterrupt:
        bl.log("interrupted; stopping everything")
        bl.cleanup()
        return 130
    except Exception as e:  # noqa: BLE001 -- report, clean up, fail
        bl.log(f"benchmark aborted: {e}")
        for p in bench.poolers.values():
            bl.log(f"--- {p.kind} log tail ---\n{bl.tail(p.logfile, 30)}")
        bl.cleanup()
        return 2
    finally:
        bl.cleanup()

    meta = {"load_before": f"{load_before:.2f}", "load_after": f"{os.getloadavg()[0]:.2f}",
            "date": now.strftime("%Y-%m-%d %H:%M UTC"), "nproc": nproc, "model": model,
            "mem": mem, "kernel": kernel, "versions": versions, "command": command_line()}
    for kind, p in bench.poolers.items():
        if getattr(p, "stopped_cleanly", True) is False:
            bench.errors.append({"target": kind, "row": "shutdown",
                                 "message": f"{kind} did not exit within 10 s of SIGTERM "
                                            f"(killed)", "log": bl.tail(p.logfile, 20)})
    text = render(bench, results, meta)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if o.output:
        outs = [Path(o.output)]
    elif o.quick:
        outs = [RESULTS / "cloud-overhead-quick.md"]
    else:
        outs = [RESULTS / "cloud-overhead.md",
                RESULTS / f"cloud-overhead-{now.strftime('%Y%m%d')}.md"]
    for p in outs:
        p.write_text(text)
    print()
    print(text)
    bl.log("wrote " + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)
                                for p in outs))
    if bench.errors:
        return 1
    if o.strict and any(line.startswith("**FAIL") for line in targets(results)):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
