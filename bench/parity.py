"""parity: lokadb side by side with Debian's PgBouncer (1.18) where a pooler
does more than pass plain messages: TLS, prepared statements in transaction
pooling, and several processes on one port with so_reuseport. The issue's
target: at least PgBouncer's throughput in every scenario.

One throw-away PostgreSQL 15 cluster of its own (`pgbench -i -s 10`, ssl=on
with the suite's certificate, used only by the rows with server-side TLS),
both poolers in transaction pooling with the same pool size and
`server_tls_sslmode` set explicitly on both (disable, or require in the
server TLS row), pgbench on 127.0.0.1. Three groups of rows, each with its
own pooler processes, started for the group and stopped after it:

  tls        client_tls_sslmode = require on both poolers with a self-signed
             key/certificate made here with the openssl CLI (P-256, or RSA
             2048 with BENCH_PARITY_TLS_KEY=rsa); pgbench with
             PGSSLMODE=require. Rows: -S at 1 and 32 clients, -C -S at 16
             clients (a TLS handshake per request), a 100 kB reply
             (bench/parity_large.sql) at 4 clients, and "TLS both sides":
             -S at 32 clients through a second pair of poolers that also
             have server_tls_sslmode = require.
  prepared   pgbench -M prepared -S at 1 and 32 clients through lokadb with
             max_prepared_statements = 200. PgBouncer 1.18 predates
             prepared statements in transaction pooling (1.21): its column
             runs -M extended, the best it can do there; lokadb -M extended
             runs too, for reference.
  reuseport  two processes of each pooler on one port (so_reuseport = 1,
             each with its own pidfile, logfile and unix socket directory,
             through which its console is reached); -S at 32 clients and
             -C -S at 16 clients; CPU summed over both processes; SHOW STATS
             of each process shows how the kernel spread the transactions.

Rows interleave their targets round by round with rotation, as the other
suites do. Called by bench/run.py (BENCH_SUITES=parity); see
doc/benchmarks.md, section "Parity". Python standard library only (and the
openssl CLI for the certificate).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import benchlib as bl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
NAME = "parity"
OPENSSL = os.environ.get("BENCH_OPENSSL", "openssl")

GROUPS = ["tls", "prepared", "reuseport"]
GROUP_TITLE = {
    "tls": "TLS",
    "prepared": "Prepared statements in transaction pooling",
    "reuseport": "so_reuseport: two processes on one port",
}
PREPARED_STATEMENTS = 200       # lokadb's max_prepared_statements in the prepared rows


class Target:
    """A column of a row: one pooler (one or more processes) and how pgbench talks to it."""

    def __init__(self, tid, label, kinds, protocol, tls=False):
        self.id = tid
        self.label = label
        self.kinds = kinds          # pooler process kinds (Pooler.kind)
        self.protocol = protocol    # pgbench -M
        self.tls = tls              # pgbench with PGSSLMODE=require
        self.is_pgbouncer = kinds[0].startswith("pgbouncer")


TARGETS = {t.id: t for t in [
    Target("pgb_tls", "PgBouncer", ["pgbouncer_tls"], "simple", tls=True),
    Target("lk_tls", "lokadb", ["lokadb_tls"], "simple", tls=True),
    Target("pgb_tls2", "PgBouncer", ["pgbouncer_tls2"], "simple", tls=True),
    Target("lk_tls2", "lokadb", ["lokadb_tls2"], "simple", tls=True),
    Target("pgb_ext", "PgBouncer `-M extended`", ["pgbouncer"], "extended"),
    Target("lk_prep", "lokadb `-M prepared`", ["lokadb_prep"], "prepared"),
    Target("lk_ext", "lokadb `-M extended`", ["lokadb_prep"], "extended"),
    Target("pgb_rp", "PgBouncer (2 processes)", ["pgbouncer_rp1", "pgbouncer_rp2"], "simple"),
    Target("lk_rp", "lokadb (2 processes)", ["lokadb_rp1", "lokadb_rp2"], "simple"),
]}


class Row:
    def __init__(self, key, group, title, args, clients, targets, cycle=False):
        self.key = key              # BENCH_PARITY_ROWS name: "tls-select:32"
        self.name = key.split(":", 1)[0]
        self.group = group
        self.title = title
        self.args = args            # pgbench arguments besides -M, -c, -j
        self.clients = clients
        self.targets = targets      # target ids; the first is PgBouncer, the base of ratios
        self.cycle = cycle          # latency = the whole request cycle (-C)


ROWS = [
    Row("tls-select:1", "tls", "TLS, select-only (`-S`)", ["-S"], 1, ["pgb_tls", "lk_tls"]),
    Row("tls-select:32", "tls", "TLS, select-only (`-S`)", ["-S"], 32, ["pgb_tls", "lk_tls"]),
    Row("tls-connect:16", "tls", "TLS, connect per txn (`-C -S`)", ["-C", "-S"], 16,
        ["pgb_tls", "lk_tls"], cycle=True),
    Row("tls-large:4", "tls", "TLS, 100 kB replies (`-f parity_large.sql`)",
        ["-f", str(HERE / "parity_large.sql")], 4, ["pgb_tls", "lk_tls"]),
    Row("tls-server:32", "tls", "TLS both sides, select-only (`-S`)", ["-S"], 32,
        ["pgb_tls2", "lk_tls2"]),
    Row("prepared:1", "prepared", "prepared select-only (`-S`)", ["-S"], 1,
        ["pgb_ext", "lk_prep", "lk_ext"]),
    Row("prepared:32", "prepared", "prepared select-only (`-S`)", ["-S"], 32,
        ["pgb_ext", "lk_prep", "lk_ext"]),
    Row("reuseport-select:32", "reuseport", "so_reuseport, select-only (`-S`)", ["-S"], 32,
        ["pgb_rp", "lk_rp"]),
    Row("reuseport-connect:16", "reuseport", "so_reuseport, connect per txn (`-C -S`)",
        ["-C", "-S"], 16, ["pgb_rp", "lk_rp"], cycle=True),
]


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------

class Options:
    """The parity suite's settings (environment, see doc/benchmarks.md)."""

    def __init__(self, o):
        self.rows = self._rows(os.environ.get("BENCH_PARITY_ROWS", ""))
        key = os.environ.get("BENCH_PARITY_TLS_KEY", "").strip() or "ec"
        if key not in ("ec", "rsa"):
            sys.exit("BENCH_PARITY_TLS_KEY must be ec (P-256) or rsa (RSA 2048)")
        self.tls_key = key
        self.seconds = o.seconds
        self.rounds = o.rounds
        self.warmup = o.warmup
        self.quick = o.quick
        self.pool_size = o.pool_size

    @staticmethod
    def _rows(spec):
        """Rows chosen by BENCH_PARITY_ROWS: a comma list of groups (tls,
        prepared, reuseport), row names (tls-connect) or rows
        (tls-select:32); default all."""
        want = [w.strip() for w in spec.split(",") if w.strip()]
        names = {r.name for r in ROWS}
        for w in want:
            if w in GROUPS or w in names or w in [r.key for r in ROWS]:
                continue
            sys.exit(f"BENCH_PARITY_ROWS: unknown {w!r} (groups: {', '.join(GROUPS)}; rows: "
                     f"{', '.join(r.key for r in ROWS)}; a row's name without :CLIENTS "
                     f"chooses all its client counts)")
        rows = [r for r in ROWS if not want or r.group in want or r.name in want
                or r.key in want]
        if not rows:
            sys.exit("BENCH_PARITY_ROWS chose no row")
        return rows

    def missing(self):
        """Why the suite cannot run, or None."""
        if shutil.which(OPENSSL) is None:
            return f"{OPENSSL} (the openssl CLI) is missing: apt-get install openssl"
        if not os.access(bl.PGBOUNCER_BIN, os.X_OK):
            return f"{bl.PGBOUNCER_BIN} is missing"
        return None


def setup_options(o):
    """Called by run.py's parse_args when the parity suite is selected."""
    o.parity = Options(o)
    return o.parity.missing()


# --------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------

class ParityBench:
    def __init__(self, o, R):
        self.o = o
        self.po = o.parity
        self.R = R                        # bench/run.py: Cell, helpers
        self.errors = []
        self.notes = {g: [] for g in GROUPS}   # per group: lines for the report
        self.checks = []                  # (ok, what, detail) for the targets list
        self.poolers = {}                 # kind -> Pooler (all ever started)
        self.down = {}                    # kind -> reason
        self.results = []                 # (row, {target id: Cell})
        self.idle_cpu = {}                # kind -> cores
        self.pooler_logs = {}             # kind -> (lines, notable lines)
        self.spread = {}                  # row key -> {target id: [xacts per process]}
        self.tls_info = {}                # kind -> negotiated protocol and cipher
        self.plaintext_checked = set()    # kinds the plaintext check connected to
        self.prep_config = None
        self.pgb_prepared = None          # what PgBouncer 1.18 does with -M prepared

    # ---------------------------------------------------------------- setup

    def setup(self):
        R = self.R
        self.base = bl.make_tempdir("lokadb-parity-")
        self.logdir = self.base / "pgbench-logs"
        self.logdir.mkdir()
        bl.log(f"parity: temp dir {self.base}")
        self.lokadb_bin, self.lokadb_src = bl.private_lokadb_copy(self.o.lokadb, self.base)
        self.make_cert()
        nowhere = self.base / "no-such-file"
        # libpq with sslmode=require checks the certificate when ~/.postgresql/root.crt
        # exists, and sends ~/.postgresql/postgresql.crt: point both nowhere.
        self.tls_env = {"PGSSLMODE": "require", "PGSSLROOTCERT": str(nowhere),
                        "PGSSLCERT": str(nowhere), "PGSSLKEY": str(nowhere)}

        settings = dict(R.PG_SETTINGS)
        settings.update({"ssl": "on", "ssl_cert_file": f"'{self.pg_cert}'",
                         "ssl_key_file": f"'{self.pg_key}'"})
        self.pg_settings = settings
        self.pg = bl.Postgres(self.base, settings)
        bl.log(f"parity: initdb + start PostgreSQL on 127.0.0.1:{self.pg.port}")
        self.pg.start()
        self.pg.psql(f"CREATE DATABASE {R.DBNAME}")
        bl.log(f"parity: pgbench -i -s {R.SCALE}")
        r = subprocess.run([str(bl.PG_BIN / "pgbench"), "-i", "-q", "-s", str(R.SCALE),
                            "-h", self.pg.host, "-p", str(self.pg.port), "-U", "postgres",
                            R.DBNAME], capture_output=True, text=True, timeout=900,
                           env=bl.client_env())
        if r.returncode != 0:
            raise RuntimeError(f"pgbench -i failed:\n{r.stdout}\n{r.stderr}")
        self.common = {
            "pool_mode": "transaction",
            "default_pool_size": self.po.pool_size,
            "max_client_conn": 1000,
            "log_connections": 0,
            "log_disconnections": 0,
            "log_stats": 0,
            # Set on both: lokadb's default is prefer, PgBouncer's disable,
            # and this cluster offers TLS.
            "server_tls_sslmode": "disable",
        }

    def make_cert(self):
        """A self-signed key/certificate for the poolers (and PostgreSQL)."""
        d = self.base / "tls"
        d.mkdir(mode=0o755)
        self.key, self.cert = d / "key.pem", d / "cert.pem"
        if self.po.tls_key == "rsa":
            newkey = ["-newkey", "rsa:2048"]
            self.key_desc = "RSA 2048"
        else:
            newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
            self.key_desc = "ECDSA P-256"
        cmd = [OPENSSL, "req", "-x509", "-nodes", "-days", "2"] + newkey + [
            "-subj", "/CN=127.0.0.1", "-keyout", str(self.key), "-out", str(self.cert)]
        self.cert_cmd = " ".join(shlex.quote(a) for a in cmd).replace(str(d) + "/", "")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"openssl req failed:\n{r.stdout}\n{r.stderr}")
        self.openssl_version = bl.first_line([OPENSSL, "version"])
        # PgBouncer runs as postgres; PostgreSQL wants its key owned by it, mode 0600.
        os.chmod(self.key, 0o600)
        bl.chown_pg(self.key)
        os.chmod(self.cert, 0o644)
        self.pg_key, self.pg_cert = self.key, self.cert

    # ------------------------------------------------------------- poolers

    def specs(self, group):
        """(kind, binary, settings, Pooler keyword arguments) of a group's processes,
        as far as the chosen rows need them."""
        want = {k for r in self.po.rows if r.group == group
                for t in r.targets for k in TARGETS[t].kinds}
        tls = {"client_tls_sslmode": "require", "client_tls_key_file": str(self.key),
               "client_tls_cert_file": str(self.cert)}
        out = []
        if group == "tls":
            for kind in ("pgbouncer_tls", "lokadb_tls"):
                out.append((kind, tls, {"client_env": self.tls_env}))
            for kind in ("pgbouncer_tls2", "lokadb_tls2"):
                out.append((kind, {**tls, "server_tls_sslmode": "require"},
                            {"client_env": self.tls_env}))
        elif group == "prepared":
            out.append(("pgbouncer", {}, {}))
            out.append(("lokadb_prep", {"max_prepared_statements": PREPARED_STATEMENTS}, {}))
        elif group == "reuseport":
            ports = {"pgbouncer": bl.free_port(), "lokadb": bl.free_port()}
            for kind in ("pgbouncer_rp1", "pgbouncer_rp2", "lokadb_rp1", "lokadb_rp2"):
                port = ports["pgbouncer" if kind.startswith("pgbouncer") else "lokadb"]
                out.append((kind, {"so_reuseport": 1}, {"port": port, "own_socket": True}))
        return [(k, bl.PGBOUNCER_BIN if k.startswith("pgbouncer") else self.lokadb_bin, s, kw)
                for k, s, kw in out if k in want]

    def start_group(self, group):
        started = []
        for kind, binary, settings, kw in self.specs(group):
            p = bl.Pooler(kind, binary, self.base, self.pg, self.R.DBNAME,
                          {**self.common, **settings}, **kw)
            self.poolers[kind] = p
            started.append(p)
            bl.log(f"parity: start {kind} on 127.0.0.1:{p.port}")
            try:
                p.start()
            except RuntimeError as e:
                self.mark_down(kind, None, f"{kind} did not start: {e}", None)
        up = [p for p in started if p.kind not in self.down]
        self.idle_cpu.update(bl.idle_cpu({p.kind: p for p in up}))
        bl.log("parity: idle CPU: " + ", ".join(f"{k} {self.idle_cpu[k] * 100:.0f}%"
                                                for k in (p.kind for p in up)
                                                if k in self.idle_cpu))
        return started

    def stop_group(self, started):
        """Stop a group's processes (so shutdown messages are logged) and keep
        what their logs say besides routine lines."""
        logs = bl.stop_and_read_pooler_logs({p.kind: p for p in started})
        for p in started:
            n, notable = logs[p.kind]
            # The TLS check's plaintext client is refused on purpose.
            own = [x for x in notable if p.kind in self.plaintext_checked
                   and re.search(r"SSL required", x)]
            notable = [x for x in notable if x not in own]
            self.pooler_logs[p.kind] = (n, notable, len(own))
        self.errors += bl.shutdown_errors({p.kind: p for p in started})

    # -------------------------------------------------------------- checks

    def check(self, ok, what, detail=""):
        self.checks.append((ok, what, detail))
        bl.log(f"parity: check {'ok' if ok else 'FAILED'}: {what}" + (f" ({detail})" if detail else ""))

    def tls_checks(self, started):
        """Each TLS pooler refuses a plaintext client, and what a TLS handshake
        with it negotiates (openssl s_client -starttls postgres)."""
        for p in started:
            if p.kind in self.down:
                continue
            self.plaintext_checked.add(p.kind)
            try:
                self.pg.psql("select 1", dbname=self.R.DBNAME, port=p.port, timeout=15)
                refused, why = False, "a plaintext connection was accepted"
            except (RuntimeError, subprocess.SubprocessError) as e:
                last = str(e).strip().splitlines()[-1]
                refused, why = True, "psql with PGSSLMODE=disable: " + last.split("failed: ")[-1][:120]
            self.check(refused, f"{p.kind} refuses a plaintext client (client_tls_sslmode = "
                       f"require)", bl.shown_path(why))
            self.tls_info[p.kind] = tls_probe(p.port)

    def server_tls_check(self, p, expect):
        """How many of the pooler's server connections use TLS (SHOW SERVERS'
        remote_pid joined with pg_stat_ssl)."""
        try:
            pids = [r.get("remote_pid") for r in p.console_dicts("SHOW SERVERS")]
            pids = [x for x in pids if x and x.isdigit() and x != "0"]
            if not pids:
                self.check(False, f"{p.kind}: server connections {'use' if expect else 'do not use'}"
                           f" TLS", "SHOW SERVERS lists no server connection with a remote_pid")
                return
            row = self.pg.psql("SELECT count(*) FILTER (WHERE ssl) || ' ' || count(*) || ' ' || "
                               "coalesce(string_agg(DISTINCT version, ','), '') FROM pg_stat_ssl "
                               f"WHERE pid IN ({','.join(pids)})")
        except RuntimeError as e:
            self.check(False, f"{p.kind}: server connections checked for TLS", str(e)[:200])
            return
        parts = row.split(" ", 2)
        n_ssl, n = int(parts[0]), int(parts[1])
        ver = parts[2] if len(parts) > 2 else ""
        ok = (n_ssl == n and n > 0) if expect else (n_ssl == 0 and n > 0)
        self.check(ok, f"{p.kind}: server connections {'use' if expect else 'do not use'} TLS",
                   f"{n_ssl} of {n} with TLS in pg_stat_ssl" + (f", {ver}" if ver else ""))

    def prepared_config(self):
        p = self.poolers.get("lokadb_prep")
        if p is None or p.kind in self.down:
            return
        try:
            rows = {r["key"]: r for r in p.console_dicts("SHOW CONFIG")}
        except RuntimeError as e:
            self.prep_config = f"SHOW CONFIG failed: {e}"
            return
        r = rows.get("max_prepared_statements")
        self.prep_config = (f"`max_prepared_statements = {r.get('value')}` in SHOW CONFIG" if r
                            else "max_prepared_statements is not in SHOW CONFIG (this build "
                                 "accepts the setting as a no-op)")
        bl.log(f"parity: lokadb_prep: {self.prep_config}")

    def pgbouncer_prepared_probe(self):
        """What PgBouncer 1.18 does with `pgbench -M prepared` in transaction
        pooling (a short unmeasured run, 32 clients): the report says it."""
        p = self.poolers.get("pgbouncer")
        if p is None or p.kind in self.down:
            return
        secs = 2
        res = bl.run_pgbench(["-S", "-M", "prepared", "-c", "32", "-j", "2"], "127.0.0.1",
                             p.port, self.R.DBNAME, secs, cwd=str(self.logdir))
        if res.ok:
            self.pgb_prepared = (f"a {secs} s probe, `pgbench -S -M prepared -c 32 -j 2`, "
                                 f"ran without errors ({res.transactions:,} transactions)")
        else:
            err = next((m.group(0) for m in (re.search(r"ERROR:\s*.*", x)
                                             for x in res.output.splitlines()) if m), res.error)
            self.pgb_prepared = (f"a {secs} s probe, `pgbench -S -M prepared -c 32 -j 2`, "
                                 f"failed: `{err.strip()[:120]}` ({res.error})")
        bl.log(f"parity: PgBouncer -M prepared: {self.pgb_prepared}")
        if not p.alive():
            self.mark_down(p.kind, "prepared probe", "pgbouncer died during the -M prepared "
                           "probe", res)

    def xacts(self, p):
        """total_xact_count of the bench database in SHOW STATS of this process."""
        try:
            for r in p.console_dicts("SHOW STATS"):
                if r.get("database") == self.R.DBNAME:
                    return int(r.get("total_xact_count") or 0)
            return 0
        except (RuntimeError, ValueError):
            return None

    # ----------------------------------------------------------- measuring

    def mark_down(self, kind, row, msg, res):
        self.down.setdefault(kind, msg)
        self.record_error(kind, row, msg, res)

    def record_error(self, kind, row, msg, res, target=None):
        env = "PGSSLMODE=require " if target in TARGETS and TARGETS[target].tls else ""
        self.errors.append(bl.error_entry(target or kind, row, msg, res, self.poolers.get(kind),
                                          cmd_prefix=env, show=bl.shown_path))
        bl.log(f"ERROR {target or kind} {row or ''}: {msg}")

    def pgbench_args(self, row, t):
        return list(row.args) + ["-M", t.protocol, "-c", str(row.clients),
                                 "-j", str(min(2, row.clients))]

    def run_one(self, tid, row, seconds, logprefix, label):
        """One pgbench run; returns the result if it is usable, else None."""
        t = TARGETS[tid]
        if any(k in self.down for k in t.kinds):
            return None
        procs = [self.poolers[k] for k in t.kinds]
        cpu0 = [p.cpu_seconds() for p in procs]
        res = bl.run_pgbench(self.pgbench_args(row, t), "127.0.0.1", procs[0].port,
                             self.R.DBNAME, seconds, logprefix=logprefix,
                             cwd=str(self.logdir), cycle=row.cycle,
                             env=self.tls_env if t.tls else None)
        cpu1 = [p.cpu_seconds() for p in procs]
        res.cpu = (sum(b - a for a, b in zip(cpu0, cpu1))
                   if None not in cpu0 and None not in cpu1 else None)
        rowname = f"{row.key} {label}"
        for p in procs:
            if not p.alive():
                self.mark_down(p.kind, rowname, f"{p.kind} process died during the run", res)
                return None
        if not self.pg.alive():
            raise RuntimeError(f"PostgreSQL died during {rowname} ({tid}):\n"
                               f"{bl.tail(self.pg.logpath)}")
        if not res.ok:
            self.record_error(t.kinds[0], rowname, res.error, res, target=tid)
            return None
        if logprefix is not None and not res.latencies_us:
            self.record_error(t.kinds[0], rowname, "pgbench wrote no per-transaction log", res,
                              target=tid)
            return None
        return res

    def run_row(self, idx, row):
        o, R = self.po, self.R
        bl.log(f"== parity {row.key}: VACUUM + CHECKPOINT")
        self.pg.psql("VACUUM pgbench_accounts, pgbench_branches, pgbench_tellers, "
                     "pgbench_history", dbname=R.DBNAME)
        self.pg.psql("CHECKPOINT")
        cells = {t: R.Cell() for t in row.targets}
        before = {}
        if row.group == "reuseport":
            before = {k: self.xacts(self.poolers[k]) for t in row.targets
                      for k in TARGETS[t].kinds if k not in self.down}
        def log_round(t, r, res, lat):
            bl.log(f"   {row.key:22s} round {r + 1}/{o.rounds} {t:8s} {res.tps:10.0f} tps"
                   f"  p50 {R.ms(bl.percentile(lat, 50))} ms"
                   f"  p99 {R.ms(bl.percentile(lat, 99))} ms")
        bl.run_rounds(row.targets, idx, o.warmup, o.seconds, o.rounds, cells,
                      lambda t, secs, prefix, label: self.run_one(t, row, secs, prefix, label),
                      lambda t: any(k in self.down for k in TARGETS[t].kinds),
                      lambda t, r: self.logdir / f"{row.name}-{row.clients}-{t}-r{r}", log_round)
        for t in row.targets:
            if any(k in self.down for k in TARGETS[t].kinds) and not cells[t].errors:
                cells[t].errors.append("pooler down")
            cells[t].finish()
        if row.group == "reuseport":
            self.reuseport_spread(row, before)
        return cells

    def reuseport_spread(self, row, before):
        """Transactions per process in this row (warm-up and rounds), from
        SHOW STATS of each process through its own unix socket."""
        spread = {}
        for t in row.targets:
            counts = []
            for k in TARGETS[t].kinds:
                if k in self.down:
                    counts.append(None)
                    continue
                a, b = before.get(k), self.xacts(self.poolers[k])
                counts.append(b - a if a is not None and b is not None else None)
            spread[t] = counts
            ok = all(c is not None and c > 0 for c in counts)
            self.check(ok, f"{row.key}: both {TARGETS[t].label.split(' ')[0]} processes took "
                       f"transactions (SHOW STATS total_xact_count of each)",
                       " / ".join("?" if c is None else f"{c:,}" for c in counts))
        self.spread[row.key] = spread

    def run(self):
        idx = 0
        for group in GROUPS:
            rows = [r for r in self.po.rows if r.group == group]
            if not rows:
                continue
            bl.log(f"== parity: {GROUP_TITLE[group]}")
            started = self.start_group(group)
            try:
                if group == "tls":
                    self.tls_checks(started)
                if group == "prepared":
                    self.prepared_config()
                for row in rows:
                    self.results.append((row, self.run_row(idx, row)))
                    idx += 1
                if group == "prepared":
                    # After the measured rows: it leaves named statements in
                    # PgBouncer's server connections.
                    self.pgbouncer_prepared_probe()
                if group == "tls":
                    for p in started:
                        if p.kind not in self.down:
                            self.server_tls_check(p, p.kind.endswith("2"))
            finally:
                self.stop_group(started)

    def versions(self):
        pgv = self.pg.psql("SHOW server_version")
        return {
            "postgres": f"PostgreSQL {pgv}",
            "pgbench": bl.first_line([str(bl.PG_BIN / "pgbench"), "-V"]),
            "pgbouncer": bl.first_line([bl.PGBOUNCER_BIN, "-V"]),
            "lokadb": self.R.lokadb_build_info(self.lokadb_bin),
            "openssl": self.openssl_version,
        }


def tls_probe(port):
    """Protocol and cipher of a TLS handshake with a pooler, or a short reason."""
    try:
        r = subprocess.run([OPENSSL, "s_client", "-connect", f"127.0.0.1:{port}",
                            "-starttls", "postgres", "-brief"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError) as e:
        return f"s_client failed: {e}"
    out = r.stdout + r.stderr
    proto = re.search(r"Protocol version:\s*(\S+)", out)
    cipher = re.search(r"Ciphersuite:\s*(\S+)", out)
    if proto and cipher:
        return f"{proto.group(1)}, {cipher.group(1)}"
    return "s_client: " + (out.strip().splitlines() or ["no output"])[0][:120]


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def first_error(bench, tid, row):
    """The first ERROR line pgbench printed for this target and row, if any."""
    for e in bench.errors:
        if e["target"] == tid and (e["row"] or "").startswith(row.key + " "):
            for line in (e.get("output") or "").splitlines():
                m = re.search(r"(ERROR|FATAL):\s*(.*)", line)
                if m:
                    return f"{m.group(1)}: {m.group(2)[:120]}"
            return e["message"]
    return None


def targets_lines(bench):
    """PASS/FAIL lines: lokadb >= PgBouncer per group, and the checks."""
    R = bench.R
    out = []
    by_group = {}
    for row, cells in bench.results:
        by_group.setdefault(row.group, []).append((row, cells))
    for group in GROUPS:
        ties = []
        rows = by_group.get(group)
        if not rows:
            sel = [r for r in bench.po.rows if r.group == group]
            if sel:
                out.append(f"**FAIL**: {GROUP_TITLE[group]}: not run (the suite stopped before)")
            continue
        bad, det = [], []
        for row, cells in rows:
            base = cells[row.targets[0]]
            lk = row.targets[1]
            k = cells[lk]
            if not (k.ok and base.ok):
                why = []
                for t in (lk, row.targets[0]):
                    if not cells[t].ok:
                        e = first_error(bench, t, row)
                        why.append(f"{TARGETS[t].label} failed" + (f": {e}" if e else ""))
                bad.append(f"{row.key} ({'; '.join(why)})")
                continue
            r, ci, behind = R.compare_tps(k, base)
            det.append(f"{row.key} {r:.2f}")
            if behind:
                bad.append(f"{row.key} ({r:.3f}x, {R.fmt_interval(ci)})")
            elif r < 1.0:
                ties.append(f"{row.key} ({r:.3f}x, {R.fmt_interval(ci)})")
        if group == "prepared":
            what = (f"lokadb `-M prepared` (max_prepared_statements = {PREPARED_STATEMENTS}) "
                    f"throughput >= PgBouncer 1.18's best in transaction pooling (`-M extended`) "
                    f"in every row")
        elif group == "tls":
            what = "with TLS, lokadb throughput >= PgBouncer's in every row"
        else:
            what = ("with two processes on one port (so_reuseport), lokadb throughput >= "
                    "PgBouncer's in every row")
        what += " (or not measurably lower: the 95 % interval of the per-round ratios reaches 1.00)"
        detail = "lokadb / PgBouncer: " + ", ".join(det) if det else ""
        if ties:
            detail += "; ties (under 1.00 by less than the rounds tell apart): " + ", ".join(ties)
        out.append(R.verdict(not bad and bool(det), what, detail, bad))
        if group == "prepared":
            ref = []
            for row, cells in rows:
                a, b = cells["lk_ext"], cells["pgb_ext"]
                ref.append(f"{row.key} " + (f"{a.tps / b.tps:.2f}" if a.ok and b.ok else "n/a"))
            out.append("Reference, not a target: lokadb `-M extended` / PgBouncer `-M extended`: "
                       + ", ".join(ref))
    for ok, what, detail in bench.checks:
        out.append(R.verdict(ok, f"check: {what}", detail, []))
    return out


def fmt_share(counts):
    if not counts or any(c is None for c in counts):
        return "n/a"
    total = sum(counts)
    if total <= 0:
        return " / ".join("0" for _ in counts)
    return " / ".join(f"{c:,} ({c * 100 / total:.0f}%)" for c in counts)


def group_table(bench, group, rows):
    R = bench.R
    tids = rows[0][0].targets
    labels = [TARGETS[t].label for t in tids]
    L = []
    head = ["scenario", "clients"] + [f"{x} tps" for x in labels] + \
           [f"{x} p50 / p99 ms" for x in labels] + \
           [f"{TARGETS[t].label} / {labels[0]} tps" for t in tids[1:]]
    L.append("| " + " | ".join(head) + " |")
    L.append("|---|" + "--:|" * (len(head) - 1))
    for row, cells in rows:
        base = cells[tids[0]]
        vals = [row.title, str(row.clients)]
        vals += [R.fmt_tps(cells[t]) for t in tids]
        vals += [R.fmt_lat(cells[t]) for t in tids]
        vals += [R.fmt_ratio(cells[t], base) for t in tids[1:]]
        L.append("| " + " | ".join(vals) + " |")
    L.append("")
    procs = "both processes of the pooler, added up," if group == "reuseport" else \
        "the pooler process"
    L.append(f"Pooler CPU (user + system time of {procs} over the measured runs, from /proc; "
             f"\"cores\" = CPU seconds per wall second):")
    L.append("")
    head = ["scenario", "clients"] + [f"{x} CPU µs / txn" for x in labels] + \
           [f"{x} cores" for x in labels]
    if group == "reuseport":
        head += [f"{x} transactions per process" for x in labels]
    L.append("| " + " | ".join(head) + " |")
    L.append("|---|" + "--:|" * (len(head) - 1))
    for row, cells in rows:
        vals = [row.title, str(row.clients)]
        vals += [R.fmt_num(cells[t].cpu_us_per_txn, ".1f") for t in tids]
        vals += [R.fmt_num(cells[t].cores, ".2f") for t in tids]
        if group == "reuseport":
            sp = bench.spread.get(row.key, {})
            vals += [fmt_share(sp.get(t)) for t in tids]
        L.append("| " + " | ".join(vals) + " |")
    L.append("")
    return L


def header(bench, meta):
    R, po = bench.R, bench.po
    L = ["# Parity: lokadb vs PgBouncer with TLS, prepared statements and so_reuseport", ""]
    L.append(f"- Date: {meta['date']}")
    L.append(f"- Machine: {meta['nproc']} CPUs (nproc), {meta['model']}, {meta['mem']} RAM, "
             f"Linux {meta['kernel']}. pgbench runs on the same machine and takes about one "
             f"core, so PostgreSQL and the pooler share what is left.")
    if bench.idle_cpu:
        L.append("- Idle pooler CPU after start (2 s, no clients): " + ", ".join(
            f"{k} {v * 100:.0f}%" for k, v in bench.idle_cpu.items()))
    L.append(f"- Load average (1 min) before / after the suite: {meta['load_before']} / "
             f"{meta['load_after']} (anything else running on the machine adds noise)")
    v = meta["versions"]
    L.append(f"- Versions: {v['postgres']}; {v['pgbouncer']} (Debian); {v['lokadb']}; "
             f"{v['pgbench']}; {v['openssl']}")
    L.append(f"- lokadb binary: {bench.lokadb_src}")
    L.append(f"- Command: {meta['command']}")
    L.append(f"- BENCH_SECONDS={po.seconds}: measured seconds per target and row, in "
             f"{po.rounds} interleaved round(s) of "
             f"{'/'.join(map(str, R.split_seconds(po.seconds, po.rounds)))} s; warm-up "
             f"{po.warmup} s per target and row" + ("; **--quick smoke run**" if po.quick else ""))
    L.append(f"- Setup: pgbench scale {R.SCALE}; both poolers pool_mode=transaction, "
             f"default_pool_size={po.pool_size} (per process), max_client_conn=1000, "
             f"auth_type=trust, TCP on 127.0.0.1, server_tls_sslmode=disable unless a row "
             f"says otherwise; PostgreSQL "
             + ", ".join(f"{k}={v}" for k, v in bench.pg_settings.items()
                         if k not in ("log_min_messages", "ssl_cert_file", "ssl_key_file"))
             + " (with the certificate below); `-j 2` (`-j 1` for 1 client)")
    if any(r.group == "tls" for r in po.rows):
        L.append(f"- TLS: a self-signed {bench.key_desc} certificate made by `{bench.cert_cmd}`, "
                 f"used by both poolers (client_tls_key_file / client_tls_cert_file) and by "
                 f"PostgreSQL; pgbench with `PGSSLMODE=require` (no certificate check: "
                 f"PGSSLROOTCERT, PGSSLCERT and PGSSLKEY point to no file); TLS settings "
                 f"otherwise the poolers' defaults")
    errs = [e for e in bench.errors if e["row"] in ("aborted",)]
    for e in errs:
        L.append(f"- **Aborted**: {e['message']}")
    return L


def group_text(bench, group):
    """What a group's rows measure, and its notes."""
    if group == "tls":
        L = ["Both poolers with `client_tls_sslmode = require`; pgbench with "
             "`PGSSLMODE=require`, `-M simple`. In the `-C` row every request is a new "
             "connection and so a full TLS handshake; its latency is the whole request "
             "cycle (time between a client's consecutive transaction ends: disconnect + "
             "connect + TLS handshake + login + query). \"TLS both sides\" runs through a "
             "second pair of pooler processes that also have `server_tls_sslmode = require` "
             "(PostgreSQL with `ssl = on`): every message is encrypted twice."]
        if bench.tls_info:
            L.append("")
            L.append("Negotiated with clients (`openssl s_client -starttls postgres`): "
                     + "; ".join(f"{k} {v}" for k, v in bench.tls_info.items()))
        return L
    if group == "prepared":
        L = [f"lokadb runs with `max_prepared_statements = {PREPARED_STATEMENTS}` and is measured "
             "with `pgbench -M prepared` (each client prepares its statement once and then "
             "only binds and executes it, whichever server connection transaction pooling "
             "gives it). PgBouncer 1.18 predates prepared statements in transaction pooling "
             "(PgBouncer 1.21 added them): with `-M prepared` a client fails as soon as it lands "
             "on a server connection where its statement does not exist, or another client's "
             "of the same name does (`prepared statement \"P_0\" does not exist` / "
             "`already exists`), so its "
             "column runs `-M extended` (unnamed statements: parse, bind, execute each "
             "time), the best PgBouncer 1.18 can do in transaction pooling. lokadb "
             "`-M extended` runs too, on the same lokadb process, for reference."]
        if bench.pgb_prepared:
            L.append("")
            L.append(f"PgBouncer 1.18 with `-M prepared` in this run: {bench.pgb_prepared}.")
        if bench.prep_config:
            L.append("")
            L.append(f"lokadb process of these rows: {bench.prep_config}.")
        return L
    return ["Two processes of each pooler listen on one TCP port with `so_reuseport = 1` "
            "(each with its own pidfile, logfile and unix socket directory, through which "
            "its console is reached); the kernel spreads incoming connections over them. "
            "pgbench `-M simple`. Each process has its own pool of `default_pool_size` server "
            "connections. The CPU columns add up both processes. \"Transactions per process\" "
            "is the growth of `total_xact_count` (SHOW STATS, database bench) of each process "
            "over the row (warm-up and measured rounds)."]


def render(bench, meta):
    R = bench.R
    L = header(bench, meta)
    by_group = {}
    for row, cells in bench.results:
        by_group.setdefault(row.group, []).append((row, cells))
    for group in GROUPS:
        rows = by_group.get(group)
        if not rows:
            continue
        L.append("")
        L.append(f"## {GROUP_TITLE[group]}")
        L.append("")
        L += group_text(bench, group)
        L.append("")
        # Rows of a group with other targets (TLS both sides) get a table of their own.
        parts = []
        for row, cells in rows:
            if parts and parts[-1][0][0].targets == row.targets:
                parts[-1].append((row, cells))
            else:
                parts.append([(row, cells)])
        for part in parts:
            L += group_table(bench, group, part)
    L.append("Latency is per transaction, from pgbench's per-transaction logs (`--log`, every "
             "transaction, all rounds pooled); for `-C` rows the whole request cycle. A "
             "ratio above 1.00 means lokadb did more transactions per second than PgBouncer.")
    L.append("")
    logs = [(k, v) for k, v in bench.pooler_logs.items()]
    if logs:
        L.append("Pooler logs (log_connections, log_disconnections and log_stats off): "
                 + "; ".join(f"{k} {n} line(s), {len(bad)} warning/error line(s)"
                             + (f" (besides {own} from the plaintext check)" if own else "")
                             for k, (n, bad, own) in logs))
        for k, (n, bad, own) in logs:
            if bad:
                L.append("")
                L.append(f"{k} warnings/errors (first 10):")
                L.append("")
                L.append("```")
                L.extend(bl.shown_path(x) for x in bad[:10])
                L.append("```")
        L.append("")
    L.append("Targets:")
    L.append("")
    for line in targets_lines(bench):
        L.append(f"- {line}")
    L.append("")
    L.append("pgbench command per row and target (`-T` = the round's seconds, `--log` added "
             "for measured rounds; the port selects the pooler):")
    L.append("")
    for row, _ in bench.results:
        for tid in row.targets:
            t = TARGETS[tid]
            env = "PGSSLMODE=require " if t.tls else ""
            L.append(f"- {row.title}, {row.clients}, {t.label}: `{env}pgbench -h 127.0.0.1 "
                     f"-p PORT -U postgres -n -T SECONDS "
                     f"{bl.shown_path(' '.join(bench.pgbench_args(row, t)))} {R.DBNAME}`")
    L += bl.error_lines(bench.errors, bl.shown_path)
    return "\n".join(L) + "\n"


# --------------------------------------------------------------------------
# entry point (from run.py)
# --------------------------------------------------------------------------

def estimate(o):
    po = o.parity
    runs = sum(len(r.targets) for r in po.rows)
    groups = len({r.group for r in po.rows})
    return int(runs * (po.seconds + po.warmup + 1) + groups * 5)


def run_suite(o, R, now, only_one):
    """Run the parity suite; returns (exit status, report lines of targets)."""
    po = o.parity
    load_before = os.getloadavg()[0]
    est = estimate(o)
    bl.log(f"parity: {len(po.rows)} row(s) ({', '.join(r.key for r in po.rows)}), "
           f"{po.seconds} s each ({po.rounds} round(s)) + {po.warmup} s warm-up; "
           f"about {est // 60} min {est % 60} s plus setup")
    bench = ParityBench(o, R)
    versions = {}

    def steps():
        try:
            bench.setup()
            versions.update(bench.versions())
            bench.run()
        finally:
            for p in bench.poolers.values():
                if p.popen is not None:
                    p.stop()
    rc, err = bl.run_bench(bench, "parity", steps)
    if rc is not None:
        return rc, []
    if err is not None:
        if not bench.results:
            bl.cleanup()
            return 2, []
        bench.errors.append({"target": "-", "row": "aborted", "message": str(err)})
    bl.cleanup()
    meta = bl.report_meta(R, now, load_before, versions or {
        "postgres": "?", "pgbench": "?", "pgbouncer": "?", "lokadb": "?", "openssl": "?"})
    text = render(bench, meta)
    RESULTS.mkdir(parents=True, exist_ok=True)
    bl.write_reports([(text, bl.output_paths(o, now, NAME, RESULTS, only_one=only_one))])
    lines = targets_lines(bench)
    if bench.errors:
        return 1, lines
    return 0, lines
