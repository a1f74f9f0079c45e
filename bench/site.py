"""sites (issue 5): what a moved organization costs, from the cloud.

Four parts, each can be chosen with BENCH_SITE_PARTS (default all):

distance  "The price of distance", fdw profile. Two throw-away PostgreSQL 15
          clusters, "cloud" and "site". The cloud database holds a tenant
          table LIST-partitioned by organization: organization 0 stays in a
          cloud partition, each moved organization's partition is a
          postgres_fdw foreign table (FOR VALUES IN (org)) on a foreign server
          whose host/port is the cloud lokadb's listener and whose dbname is a
          `[databases]` key `site_rN = transport=tunnel host=site_rN
          dbname=app` (what MOVE ORG ... TO SITE leaves). The cloud lokadb runs
          the relay plugin; one agent lokadb per round-trip time (site
          site_rN) connects to the site PostgreSQL, its TCP connection to the
          relay going through test/tools/delay_relay with half the RTT each
          way. pgbench, one client, talks to the cloud PostgreSQL: "BEGIN; read
          one row by (org, id); COMMIT" and "BEGIN; update one row; COMMIT",
          p50 in ms and as a multiple of the RTT, at each RTT; the same on the
          cloud organization, and SELECT 1 through the relay (the tunnel's own
          round trip), for reference.
stream    COPY (SELECT the moved organization's rows) TO STDOUT through the
          relay at 40 ms RTT (client -> relay lokadb -> tunnel -> agent ->
          site PostgreSQL), with LOKADB_MUX_WINDOW_KB set for the relay and the
          agent (both restarted for each window): MiB/s against window / RTT.
memory    RSS and PSS of a relay lokadb (sites and a tunnel database for 1000
          sites configured) with 0, 10, 100 and 1000 agents connected and idle,
          a fresh relay process for each count. The agents are sessions of
          test/tools/agent_swarm (one process, one site per session, the
          agent plugin's handshake: TLS 1.3, HELLO with the token proof, then
          the mux heartbeat); the 10-agent row is also run with 10 lokadb
          agent processes, to check that the swarm costs the relay what
          real agents do.
clients   200 / 500 / 1000 concurrent pgbench clients through the cloud lokadb
          (max_client_conn raised, transaction pooling in front of the cloud
          PostgreSQL) reading the moved organization through postgres_fdw (the
          fdw connections of the cloud backends go to the same lokadb, whose
          relay pools them onto the tunnel): refused connections, failed
          transactions, tps, p50/p99.

Called by bench/run.py (BENCH_SUITES=site; not in the default list: a full
run takes about 15 minutes). See doc/benchmarks.md, section "Sites (issue 5)".
Python standard library only (gnuplot for the chart).
"""

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
NAME = "site"
PARTS = ["distance", "stream", "memory", "clients"]

RTTS = [0.2, 9.4, 38.7, 43.3]          # ms, the issue's four round-trip times
STREAM_RTT = 40.0
WINDOWS_KB = [256, 1024, 4096]
AGENTS = [10, 100, 1000]
CLIENTS = [200, 500, 1000]
CLIENTS_RTT = 9.4
REF_MEM_MB = 34.0                      # the reference: 100 agents in 34 MB
REF_REFUSED = {200: 0.0, 500: 0.0, 1000: 82.0}
REF_DISTANCE = {0.2: (3.5, 3.4), 9.4: (80.3, 80.5), 38.7: (353, 353), 43.3: (352, 351)}

ROWS_PER_ORG = 100_000                 # rows of each moved organization (distance, clients)
STREAM_MB = 160                        # approximate COPY text of the streamed organization
QUICK_STREAM_MB = 24
PAD = 200                              # bytes of padding per row (streaming)
CLOUD_ORG = 0
STREAM_ORG = 90
REAL_AGENTS = 10                       # memory: this count also with lokadb agent processes
POOL_SIZE = 20                         # cloud lokadb pools (cloud db, and each site_rN)

PG_SETTINGS = bl.PG_SETTINGS

READ_SQL = """\\set id random(1, :rows)
BEGIN;
SELECT v FROM tenant_rows WHERE org = :org AND id = :id;
COMMIT;
"""
UPDATE_SQL = """\\set id random(1, :rows)
BEGIN;
UPDATE tenant_rows SET n = n + 1 WHERE org = :org AND id = :id;
COMMIT;
"""
PING_SQL = "SELECT 1;\n"


def _env_list(name, default, cast=float):
    v = os.environ.get(name, "").strip()
    if not v:
        return list(default)
    try:
        return [cast(x) for x in v.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"{name} must be a comma list of numbers, not {v!r}")


def token_of(site):
    return f"lokadb-bench-token-{site}-0123456789abcdef"


def swarm_token(site):
    return f"lokadb-swarm-token-{site}"      # what test/tools/agent_swarm sends


def sha(s):
    return hashlib.sha256(s.encode()).hexdigest()


class Options:
    def __init__(self, o):
        spec = os.environ.get("BENCH_SITE_PARTS", "").strip()
        self.parts = [w.strip() for w in spec.split(",") if w.strip()] or list(PARTS)
        for p in self.parts:
            if p not in PARTS:
                sys.exit(f"BENCH_SITE_PARTS: unknown part {p!r} (known: {', '.join(PARTS)})")
        self.quick = o.quick
        self.rtts = _env_list("BENCH_SITE_RTTS", RTTS)
        self.windows = _env_list("BENCH_SITE_WINDOWS_KB", WINDOWS_KB, int)
        self.agents = _env_list("BENCH_SITE_AGENTS", AGENTS, int)
        self.clients = _env_list("BENCH_SITE_CLIENTS", CLIENTS, int)
        self.clients_rtt = float(os.environ.get("BENCH_SITE_CLIENTS_RTT", "").strip() or CLIENTS_RTT)
        self.stream_rtt = float(os.environ.get("BENCH_SITE_STREAM_RTT", "").strip() or STREAM_RTT)
        self.stream_mb = bl.env_int("BENCH_SITE_STREAM_MB", QUICK_STREAM_MB if o.quick else STREAM_MB, 1)
        self.seconds = bl.env_int("BENCH_SITE_SECONDS", 4 if o.quick else 20, 1)
        self.clients_seconds = bl.env_int("BENCH_SITE_CLIENTS_SECONDS", 8 if o.quick else 30, 1)
        if "clients" in self.parts and self.clients_rtt not in self.rtts:
            self.rtts.append(self.clients_rtt)
        self.tools = Path(os.path.abspath(os.environ.get("LOKADB_TOOLS_DIR")
                                          or str(REPO / "build" / "rel" / "tools")))
        self.plugin_src = Path(os.path.abspath(os.environ.get("BENCH_SITE_PLUGIN_DIR")
                                               or str(REPO / "plugins")))

    def missing(self):
        for t in ("delay_relay", "agent_swarm"):
            if not os.access(self.tools / t, os.X_OK):
                return f"{self.tools / t} is missing: run `make test-tools`"
        for n in ("relay", "agent"):
            if not any((self.plugin_src / p).is_file() for p in (f"{n}.so", f"{n}/{n}.so")):
                return f"{n}.so not found in {self.plugin_src}: run `make`"
        if not shutil.which("openssl"):
            return "openssl (the command) is missing"
        if not (Path("/usr/share/postgresql/15/extension/postgres_fdw.control")).is_file():
            return "postgres_fdw is not installed (postgresql-15)"
        return None


def setup_options(o):
    """Called by run.py's parse_args when the site suite is selected."""
    o.site = Options(o)
    return o.site.missing()


# --------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------

class Lokadb(bl.Pooler):
    """A lokadb process whose [databases] has extra entries (tunnel databases)."""

    def __init__(self, *a, extra_dbs=None, **kw):
        super().__init__(*a, **kw)
        self.extra_dbs = extra_dbs or {}

    def write_files(self):
        super().write_files()
        extra = "".join(f"{k} = {v}\n" for k, v in self.extra_dbs.items())
        text = self.ini.read_text().replace("[databases]\n", "[databases]\n" + extra, 1)
        self.ini.write_text(text)


class Tool:
    """A test tool process (delay_relay, agent_swarm) stopped by PID at cleanup."""

    def __init__(self, name, cmd, logpath):
        self.name = name
        self.cmd = [str(c) for c in cmd]
        self.logpath = logpath
        self.popen = None

    def start(self, wait_for, timeout=30.0):
        self.out = open(self.logpath, "w")
        self.popen = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=self.out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        bl.on_cleanup(self.name, self.stop)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = Path(self.logpath).read_text(errors="replace")
            m = re.search(wait_for, text)
            if m:
                return m
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{text[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: no {wait_for!r} within {timeout}s:\n"
                           f"{Path(self.logpath).read_text(errors='replace')[-2000:]}")

    def stop(self):
        if self.popen is not None:
            bl.stop_pid(self.popen.pid, signal.SIGTERM, 10.0, self.popen)
            self.popen = None
            self.out.close()


def mem_of(pid):
    """(RSS MiB, PSS MiB) of pid from /proc (PSS None when unreadable)."""
    rss = pss = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return rss, pss


# --------------------------------------------------------------------------
# the suite
# --------------------------------------------------------------------------

class SiteBench:
    def __init__(self, o, R):
        self.o, self.R, self.so = o, R, o.site
        self.base = bl.make_tempdir("lokadb-site-")
        self.notes = []
        self.errors = []
        self.commands = []
        self.distance = []      # dicts
        self.stream = []
        self.memory = []
        self.clients = []
        self.sites = {}         # rtt -> site name
        self.site_statements = {}   # kind -> [(calls per transaction, query)] at the site
        self.poolers = {}

    # ---- setup ----

    def certs(self):
        d = self.base / "certs"
        d.mkdir()
        run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True,  # noqa: E731
                                        timeout=60)
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "relay.key", "-out", "relay.pem", "-days", "2", "-subj", "/CN=relay",
            "-addext", "subjectAltName = IP:127.0.0.1")
        der = subprocess.run(["openssl", "pkey", "-in", str(d / "relay.key"), "-pubout", "-outform",
                              "DER"], check=True, capture_output=True, timeout=60).stdout
        self.pin = hashlib.sha256(der).hexdigest()
        self.cert, self.key = d / "relay.pem", d / "relay.key"
        self.plugin_dir = self.base / "plugins"
        self.plugin_dir.mkdir()
        for n in ("relay", "agent"):
            for p in (self.so.plugin_src / f"{n}.so", self.so.plugin_src / n / f"{n}.so"):
                if p.is_file():
                    shutil.copy2(p, self.plugin_dir / f"{n}.so")
                    break

    def setup(self):
        self.certs()
        bl.log("site: starting the cloud and site PostgreSQL clusters")
        self.cloud = bl.Postgres(self.base / "cloud", PG_SETTINGS)
        (self.base / "cloud").mkdir()
        self.cloud.start()
        self.site = bl.Postgres(self.base / "site", dict(
            PG_SETTINGS, shared_preload_libraries="'pg_stat_statements'"))
        (self.base / "site").mkdir()
        self.site.start()
        self.cloud.psql("CREATE DATABASE cloud")
        self.site.psql("CREATE DATABASE app")
        self.site.psql("CREATE EXTENSION pg_stat_statements", dbname="app")
        # The site database: the moved organizations' rows (what MOVE copies there).
        orgs = [i + 1 for i in range(len(self.so.rtts))]
        self.moved = dict(zip(self.so.rtts, orgs))
        self.site.psql("CREATE TABLE tenant_rows (org int NOT NULL, id int NOT NULL, n int NOT NULL "
                       "DEFAULT 0, v text, pad text, PRIMARY KEY (org, id))", dbname="app")
        for org in orgs:
            self.site.psql(f"INSERT INTO tenant_rows SELECT {org}, g, 0, 'row ' || g, NULL "
                           f"FROM generate_series(1, {ROWS_PER_ORG}) g", dbname="app")
        if "stream" in self.so.parts:
            n = self.so.stream_mb * 1024 * 1024 // (PAD + 30)
            self.stream_rows = n
            self.site.psql(f"INSERT INTO tenant_rows SELECT {STREAM_ORG}, g, 0, 'row ' || g, "
                           f"repeat(md5(g::text), {PAD // 32 + 1})::char({PAD}) "
                           f"FROM generate_series(1, {n}) g", dbname="app", timeout=900)
        self.site.psql("VACUUM ANALYZE tenant_rows", dbname="app", timeout=900)
        bl.log("site: site database loaded")
        self.sites = {rtt: f"site_r{i}" for i, rtt in enumerate(self.so.rtts)}

    def start_cloud(self):
        """The cloud lokadb (relay plugin; tunnel databases site_rN), the agents
        behind delay_relay, and the cloud schema with the foreign tables."""
        sites = ", ".join(f"{s}:{sha(token_of(s))}" for s in self.sites.values())
        self.relay_port = bl.free_port()
        extra = {s: f"transport=tunnel host={s} dbname=app pool_mode=transaction "
                    f"pool_size={POOL_SIZE}" for s in self.sites.values()}
        p = Lokadb("lokadb_cloud", self.o.lokadb, self.base, self.cloud, "cloud",
                   {"plugins": "relay", "plugin_dir": str(self.plugin_dir),
                    "pool_mode": "transaction", "default_pool_size": str(POOL_SIZE),
                    "max_client_conn": "1500", "max_db_connections": "0"},
                   sections={"plugin.relay": {"listen": f"127.0.0.1:{self.relay_port}",
                                              "cert_file": self.cert, "key_file": self.key,
                                              "sites": sites}},
                   extra_dbs=extra)
        bl.log("site: starting the cloud lokadb (relay) and one agent per RTT")
        p.start()
        self.poolers["cloud"] = p
        self.agents = {}
        for i, (rtt, s) in enumerate(self.sites.items()):
            self.agents[rtt] = self.start_agent(f"agent_r{i}", s, rtt, self.relay_port)
        self.wait_agents(p, list(self.sites.values()))
        # The cloud schema: what MOVE ORG ... TO SITE leaves.
        sql = ["CREATE EXTENSION postgres_fdw",
               "CREATE TABLE tenant_rows (org int NOT NULL, id int NOT NULL, n int NOT NULL DEFAULT 0, "
               "v text, pad text) PARTITION BY LIST (org)",
               f"CREATE TABLE tenant_rows_o{CLOUD_ORG} PARTITION OF tenant_rows "
               f"FOR VALUES IN ({CLOUD_ORG})",
               f"ALTER TABLE tenant_rows_o{CLOUD_ORG} ADD PRIMARY KEY (org, id)",
               f"INSERT INTO tenant_rows_o{CLOUD_ORG} SELECT {CLOUD_ORG}, g, 0, 'row ' || g, NULL "
               f"FROM generate_series(1, {ROWS_PER_ORG}) g",
               "CREATE TABLE tenant_rows_default PARTITION OF tenant_rows DEFAULT"]
        for rtt, s in self.sites.items():
            org = self.moved[rtt]
            sql += [f"CREATE SERVER {s} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', "
                    f"port '{p.port}', dbname '{s}')",
                    f"CREATE USER MAPPING FOR PUBLIC SERVER {s} OPTIONS (user 'postgres')",
                    f"CREATE FOREIGN TABLE tenant_rows_o{org} PARTITION OF tenant_rows "
                    f"FOR VALUES IN ({org}) SERVER {s} OPTIONS (table_name 'tenant_rows')"]
        for stmt in sql:
            self.cloud.psql(stmt, dbname="cloud")
        self.cloud.psql(f"ANALYZE tenant_rows_o{CLOUD_ORG}", dbname="cloud")
        bl.log("site: cloud schema with the foreign tables in place")

    def start_agent(self, kind, site, rtt, relay_port, env=None):
        dport = bl.free_port()
        d = Tool(f"delay_{kind}", [self.so.tools / "delay_relay", "--listen", f"127.0.0.1:{dport}", "--to",
                                   f"127.0.0.1:{relay_port}", "--delay-ms", f"{rtt / 2:g}"],
                 self.base / f"delay_{kind}.log")
        d.start(r"listening on 127\.0\.0\.1:(\d+)")
        a = bl.Pooler(kind, self.o.lokadb, self.base, self.site, "app",
                      {"plugins": "agent", "plugin_dir": str(self.plugin_dir)},
                      sections={"plugin.agent": {
                          "relay": f"127.0.0.1:{dport}", "site": site, "token": token_of(site),
                          "relay_pin": self.pin, "max_conns": "500",
                          "databases": f"app:host=127.0.0.1 port={self.site.port} dbname=app"}},
                      proc_env=env)
        a.start()
        self.poolers[kind] = a
        return (d, a)

    def wait_agents(self, relay, sites, timeout=30.0):
        deadline = time.monotonic() + timeout
        want = set(sites)
        while time.monotonic() < deadline:
            up = {r["site"] for r in relay.console_dicts("SHOW AGENTS") if r["state"] == "active"}
            if want <= up:
                return
            time.sleep(0.2)
        raise RuntimeError(f"agents not connected within {timeout}s: {sorted(want - up)}\n"
                           f"{bl.tail(relay.logfile, 20)}")

    def versions(self):
        return {"postgres": f"PostgreSQL {self.cloud.psql('SHOW server_version')}",
                "pgbench": bl.first_line([str(bl.PG_BIN / "pgbench"), "-V"]),
                "lokadb": self.R.lokadb_build_info(self.o.lokadb),
                "openssl": bl.first_line(["openssl", "version"])}

    # ---- pgbench helper ----

    def pgbench(self, label, script, port, dbname, clients, seconds, defines=None, threads=1,
                extra=None):
        f = self.base / f"{re.sub(r'[^a-z0-9]+', '_', label.lower())}.sql"
        f.write_text(script)
        args = ["-c", str(clients), "-j", str(threads), "-M", "simple", "-f", str(f)]
        for k, v in (defines or {}).items():
            args += ["-D", f"{k}={v}"]
        args += extra or []
        prefix = self.base / "pgbench_log"
        res = bl.run_pgbench(args, "127.0.0.1", port, dbname, seconds, logprefix=str(prefix),
                             cwd=str(self.base), timeout_extra=180)
        lat = sorted(res.latencies_us)
        res.p50 = bl.percentile(lat, 50) / 1000 if lat else None
        res.p99 = bl.percentile(lat, 99) / 1000 if lat else None
        self.commands.append((label, res.cmd, script))
        if res.error:
            bl.log(f"{label}: {res.error}\n{res.output[-1500:]}")
        return res

    # ---- parts ----

    def run_distance(self):
        bl.log("== price of distance (fdw profile, one client)")
        secs = self.so.seconds
        cloud_port = self.cloud.port
        base = {}
        for kind, script in (("read", READ_SQL), ("update", UPDATE_SQL)):
            r = self.pgbench(f"cloud org {kind}", script, cloud_port, "cloud", 1, secs,
                             {"org": CLOUD_ORG, "rows": ROWS_PER_ORG})
            base[kind] = r
        self.distance_cloud = base
        for rtt in self.so.rtts:
            s, org = self.sites[rtt], self.moved[rtt]
            row = {"rtt": rtt, "site": s}
            row["ping"] = self.pgbench(f"SELECT 1 through the relay, RTT {rtt:g} ms", PING_SQL,
                                       self.poolers["cloud"].port, s, 1, max(2, secs // 4))
            # warm the cloud backend's fdw connection and the tunnel pool
            self.pgbench(f"warm-up RTT {rtt:g} ms", READ_SQL, cloud_port, "cloud", 1, 1,
                         {"org": org, "rows": ROWS_PER_ORG})
            for kind, script in (("read", READ_SQL), ("update", UPDATE_SQL)):
                self.site.psql("SELECT pg_stat_statements_reset()", dbname="app")
                row[kind] = self.pgbench(f"moved org {kind}, RTT {rtt:g} ms", script, cloud_port,
                                         "cloud", 1, secs, {"org": org, "rows": ROWS_PER_ORG})
                stmts = bl.psql_dicts(self.site, "SELECT calls, query FROM pg_stat_statements "
                                      "WHERE query NOT LIKE '%pg_stat_statements%' "
                                      "ORDER BY calls DESC, query", dbname="app")
                n = row[kind].transactions
                row[kind + "_stmts"] = (sum(int(x["calls"]) for x in stmts) / n if n else None)
                if n and kind not in self.site_statements:
                    # postgres_fdw's DECLARE carries the values: one entry per value
                    groups = {}
                    for x in stmts:
                        q = re.sub(r"\s+", " ", re.sub(r"\b\d+\b", "N", x["query"]))
                        groups[q] = groups.get(q, 0) + int(x["calls"])
                    self.site_statements[kind] = sorted(
                        ((c / n, q) for q, c in groups.items() if c >= n / 2), key=lambda t: -t[0])
            bl.log(f"RTT {rtt:g} ms: read p50 {fmt(row['read'].p50)} ms, update p50 "
                   f"{fmt(row['update'].p50)} ms, SELECT 1 via relay {fmt(row['ping'].p50)} ms")
            self.distance.append(row)

    def run_clients(self):
        rtt = self.so.clients_rtt
        s, org = self.sites[rtt], self.moved[rtt]
        cloud = self.poolers["cloud"]
        bl.log(f"== many clients through the cloud lokadb, moved org at RTT {rtt:g} ms")
        for n in self.so.clients:
            r = self.pgbench(f"{n} clients, moved org read", READ_SQL, cloud.port, "cloud", n,
                             self.so.clients_seconds, {"org": org, "rows": ROWS_PER_ORG},
                             threads=4)
            refused = len(re.findall(r"connection to server .* failed|could not create connection|"
                                     r"no more connections allowed|too many clients", r.output))
            aborted = re.search(r"(\d+) of \d+ clients? aborted|number of clients aborted: (\d+)",
                                r.output)
            errs = len(re.findall(r"^pgbench: error: client \d+ ", r.output, re.M))
            streams = len([x for x in cloud.console_dicts("SHOW STREAMS") if x.get("site") == s])
            row = {"clients": n, "res": r, "refused": refused, "errors": errs, "streams": streams,
                   "aborted": aborted.group(0) if aborted else ""}
            self.clients.append(row)
            bl.log(f"{n} clients: tps {fmt(r.tps, '.1f')}, p50 {fmt(r.p50)} ms, p99 {fmt(r.p99)} ms, "
                   f"refused {refused}, errors {errs}, failed txns {r.failed}, streams {streams}"
                   + (f", {r.error}" if r.error else ""))

    def run_stream(self):
        rtt = self.so.stream_rtt
        bl.log(f"== streaming the moved organization (COPY TO STDOUT, {self.so.stream_mb} MB) at "
               f"RTT {rtt:g} ms")
        sql = (f"COPY (SELECT * FROM tenant_rows WHERE org = {STREAM_ORG} ORDER BY id) TO STDOUT")
        for w in self.so.windows:
            env = {"LOKADB_MUX_WINDOW_KB": str(w)}
            port = bl.free_port()
            site = "site_stream"
            relay = Lokadb(f"lokadb_stream_{w}", self.o.lokadb, self.base, self.cloud, "cloud",
                           {"plugins": "relay", "plugin_dir": str(self.plugin_dir)},
                           sections={"plugin.relay": {"listen": f"127.0.0.1:{port}",
                                                      "cert_file": self.cert, "key_file": self.key,
                                                      "sites": f"{site}:{sha(token_of(site))}"}},
                           extra_dbs={site: f"transport=tunnel host={site} dbname=app"},
                           proc_env=env)
            relay.start()
            d, a = self.start_agent(f"agent_stream_{w}", site, rtt, port, env=env)
            self.wait_agents(relay, [site])
            cmd = [str(bl.PG_BIN / "psql"), "-X", "-q", "-h", "127.0.0.1", "-p", str(relay.port),
                   "-U", "postgres", "-d", site, "-c", sql]
            runs = []
            for _ in range(1 if self.so.quick else 2):
                t0 = time.monotonic()
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=bl.client_env())
                first = None
                total = 0
                while True:
                    chunk = p.stdout.read1(1 << 20)
                    if not chunk:
                        break
                    if first is None:
                        first = time.monotonic()
                    total += len(chunk)
                err = p.stderr.read().decode(errors="replace")
                rc = p.wait(timeout=600)
                t1 = time.monotonic()
                if rc != 0 or first is None:
                    self.errors.append(f"COPY with window {w} KiB failed: {err.strip()[:300]}")
                    break
                runs.append({"bytes": total, "secs": t1 - first, "total_secs": t1 - t0})
            self.commands.append((f"stream, window {w} KiB",
                                  ["LOKADB_MUX_WINDOW_KB=" + str(w)] + cmd, None))
            best = max(runs, key=lambda x: x["bytes"] / x["secs"]) if runs else None
            row = {"window": w, "rtt": rtt, "runs": runs, "best": best,
                   "relay_rss": mem_of(relay.pid)[0]}
            self.stream.append(row)
            if best:
                bl.log(f"window {w} KiB: {best['bytes'] / 2**20:.0f} MiB in {best['secs']:.2f} s = "
                       f"{best['bytes'] / 2**20 / best['secs']:.1f} MiB/s (window/RTT "
                       f"{w / 1024 / (rtt / 1000):.1f} MiB/s)")
            a.stop()
            d.stop()
            relay.stop()

    def run_memory(self):
        n_max = max(self.so.agents)
        names = [f"swarm{i:04d}" for i in range(max(1000, n_max))]
        sites = ", ".join(f"{s}:{sha(swarm_token(s))}" for s in names)
        extra = {f"org_{s}": f"transport=tunnel host={s} dbname=app" for s in names}
        bl.log(f"== relay memory with {', '.join(map(str, self.so.agents))} agents "
               f"({len(names)} sites configured)")
        # (agents, real): a row of REAL_AGENTS lokadb agent processes checks that
        # agent_swarm's sessions cost the relay what real agents cost it.
        rows = [(0, False)] + [(n, False) for n in self.so.agents]
        if REAL_AGENTS in self.so.agents:
            rows.insert(rows.index((REAL_AGENTS, False)) + 1, (REAL_AGENTS, True))
        for n, real in rows:
            port = bl.free_port()
            relay = Lokadb(f"lokadb_mem_{n}{'_real' if real else ''}", self.o.lokadb, self.base,
                           self.cloud, "cloud",
                           {"plugins": "relay", "plugin_dir": str(self.plugin_dir),
                            "max_client_conn": "100"},
                           sections={"plugin.relay": {"listen": f"127.0.0.1:{port}",
                                                      "cert_file": self.cert, "key_file": self.key,
                                                      "sites": sites}},
                           extra_dbs=extra)
            relay.start()
            before = mem_of(relay.pid)
            row = {"agents": n, "before": before, "real": real}
            sw = None
            procs = []
            if real:
                for i in range(n):
                    a = bl.Pooler(f"agent_mem_{i}", self.o.lokadb, self.base, self.site, "app",
                                  {"plugins": "agent", "plugin_dir": str(self.plugin_dir)},
                                  sections={"plugin.agent": {
                                      "relay": f"127.0.0.1:{port}", "site": names[i],
                                      "token": swarm_token(names[i]), "relay_pin": self.pin,
                                      "databases": f"app:host=127.0.0.1 port={self.site.port} "
                                                   f"dbname=app"}})
                    a.start()
                    procs.append(a)
                t0 = time.monotonic()
                self.wait_agents(relay, names[:n])
                row["ramp_s"] = time.monotonic() - t0
                self.commands.append((f"relay memory, {n} lokadb agent processes",
                                      procs[0].cmd + ["(one per site)"], None))
            elif n:
                sw = Tool(f"swarm_{n}", [self.so.tools / "agent_swarm", "--relay",
                                         f"127.0.0.1:{port}", "--count", n, "--parallel", 32],
                          self.base / f"swarm_{n}.log")
                m = sw.start(r"agent_swarm: (\d+) sessions established in ([0-9.]+) s", timeout=150)
                row["ramp_s"] = float(m.group(2))
                self.commands.append((f"relay memory, {n} agents", sw.cmd, None))
            time.sleep(3)
            active = sum(1 for r in relay.console_dicts("SHOW AGENTS") if r["state"] == "active")
            row["active"] = active
            row["after"] = mem_of(relay.pid)
            row["swarm_rss"] = (mem_of(sw.popen.pid)[0] if sw else
                                sum(mem_of(a.pid)[0] or 0 for a in procs) if procs else None)
            # stay connected across a heartbeat: still all active, memory again
            time.sleep(1 if self.so.quick else 11)
            row["later"] = mem_of(relay.pid)
            row["active_later"] = sum(1 for r in relay.console_dicts("SHOW AGENTS")
                                      if r["state"] == "active")
            self.memory.append(row)
            bl.log(f"{n} {'lokadb agents' if real else 'agents'} ({active} active): relay RSS "
                   f"{fmt(row['after'][0], '.1f')} MiB, PSS {fmt(row['after'][1], '.1f')} MiB")
            if sw:
                sw.stop()
            for a in procs:
                a.stop()
            relay.stop()

    def run(self):
        if "memory" in self.so.parts:
            self.run_memory()
        if "distance" in self.so.parts or "clients" in self.so.parts:
            self.start_cloud()
            if "distance" in self.so.parts:
                self.run_distance()
            if "clients" in self.so.parts:
                self.run_clients()
            for d, a in self.agents.values():
                a.stop()
                d.stop()
            self.poolers["cloud"].stop()
        if "stream" in self.so.parts:
            self.run_stream()


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def fmt(x, f=".2f"):
    return "n/a" if x is None else format(x, f)


def verdict(ok, what, detail=""):
    return f"**{'PASS' if ok else 'FAIL'}**: {what}" + (f" ({detail})" if detail else "")


def render(bench, meta, chart_name):
    so = bench.so
    L = ["# Sites: the price of distance, streaming, relay memory, many clients through fdw", ""]
    L.append(f"- Date: {meta['date']}")
    L.append(f"- Machine: {meta['nproc']} CPUs (nproc), {meta['model']}, {meta['mem']} RAM, "
             f"Linux {meta['kernel']}. Both PostgreSQL clusters, every lokadb, the delay relays "
             f"and pgbench share the machine.")
    L.append(f"- Load average (1 min) before / after: {meta['load_before']} / {meta['load_after']}")
    v = meta["versions"]
    L.append(f"- Versions: {v['postgres']}; {v['lokadb']}; {v['pgbench']}; {v['openssl']}")
    L.append(f"- Command: {meta['command']}" + ("; **--quick smoke run**" if so.quick else ""))
    L.append("- Round-trip times are made on loopback by test/tools/delay_relay (half the RTT "
             "added each way) on the agent's TCP connection to the relay; nothing else is "
             "delayed. It models propagation delay only (no bandwidth limit, loss or jitter).")
    L.append(f"- Topology (distance, clients): cloud PostgreSQL, database `cloud`, table "
             f"`tenant_rows (org, id, n, v, pad)` LIST-partitioned by `org`: organization "
             f"{CLOUD_ORG} in a cloud partition ({ROWS_PER_ORG:,} rows), each moved organization's "
             f"partition a postgres_fdw foreign table on a server `site_rN` (host/port = the cloud "
             f"lokadb, dbname = `site_rN`); the cloud lokadb (`plugins = relay`, transaction "
             f"pooling, pool_size {POOL_SIZE}) serves `site_rN = transport=tunnel host=site_rN "
             f"dbname=app`; one agent lokadb per RTT connects to the site PostgreSQL (database "
             f"`app`, {ROWS_PER_ORG:,} rows per moved organization). TLS 1.3 between agent and "
             f"relay, trust authentication elsewhere.")
    for n in bench.notes:
        L.append(f"- Note: {n}")
    L.append("")

    if bench.distance:
        L += ["## The price of distance (fdw profile, one client, p50)", ""]
        L.append("pgbench -c 1 against the cloud PostgreSQL; each transaction is `BEGIN; <one "
                 "statement>; COMMIT` on one row by (org, id). \"× RTT\" is the p50 divided by the "
                 "round-trip time; \"SELECT 1 via relay\" is `SELECT 1` sent to the relay's tunnel "
                 "database directly (one round trip through relay, tunnel, agent and site "
                 "PostgreSQL). The reference is the original system's fdw column.")
        L.append("")
        c = bench.distance_cloud
        L.append(f"Cloud organization (no tunnel), for scale: read p50 {fmt(c['read'].p50, '.3f')} ms, "
                 f"update p50 {fmt(c['update'].p50, '.3f')} ms.")
        L.append("")
        L.append("| RTT ms | SELECT 1 via relay ms | read p50 ms | read × RTT | update p50 ms "
                 "| update × RTT | read / update tx | site statements per read / update "
                 "| reference read / update ms |")
        L.append("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in bench.distance:
            rtt = r["rtt"]
            ref = REF_DISTANCE.get(rtt)
            rd, up = r["read"], r["update"]
            L.append(f"| {rtt:g} | {fmt(r['ping'].p50)} | {fmt(rd.p50)} | "
                     f"{fmt(rd.p50 / rtt if rd.p50 else None, '.1f')} | {fmt(up.p50)} | "
                     f"{fmt(up.p50 / rtt if up.p50 else None, '.1f')} | "
                     f"{rd.transactions} / {up.transactions} | "
                     f"{fmt(r.get('read_stmts'), '.1f')} / {fmt(r.get('update_stmts'), '.1f')} | "
                     + (f"{ref[0]:g} / {ref[1]:g}" if ref else "-") + " |")
        L.append("")
        far = [r for r in bench.distance if r["rtt"] >= 5 and r["read"].p50 and r["update"].p50]
        if far:
            mr = sum(r["read"].p50 / r["rtt"] for r in far) / len(far)
            mu = sum(r["update"].p50 / r["rtt"] for r in far) / len(far)
            L.append(f"At RTTs of 5 ms and more a read costs {mr:.1f} round trips and an update "
                     f"{mu:.1f} (mean of the multiples); the reference's fdw profile: about 8.")
            L.append("")
        for kind, stmts in bench.site_statements.items():
            L.append(f"What the site PostgreSQL receives per {kind} transaction (pg_stat_statements, "
                     f"statements run at least every other transaction, numbers as N, calls per "
                     f"transaction): "
                     + "; ".join(f"{c:.1f} × `{q}`" for c, q in stmts))
            L.append("")
    if bench.stream:
        L += [f"## Streaming a moved organization at {so.stream_rtt:g} ms RTT", ""]
        L.append(f"`COPY (SELECT * FROM tenant_rows WHERE org = {STREAM_ORG} ORDER BY id) TO STDOUT` "
                 f"by psql through the relay's tunnel database (relay and agent restarted with "
                 f"`LOKADB_MUX_WINDOW_KB` for each window; {getattr(bench, 'stream_rows', 0):,} rows). "
                 "MiB/s from the first byte to the end"
                 + ("" if so.quick else ", the better of two runs") + ".")
        L.append("")
        L.append("| window | MiB | seconds | MiB/s | window ÷ RTT MiB/s | of window ÷ RTT | relay RSS MiB |")
        L.append("|--:|--:|--:|--:|--:|--:|--:|")
        for r in bench.stream:
            b = r["best"]
            lim = r["window"] / 1024 / (r["rtt"] / 1000)
            if b:
                rate = b["bytes"] / 2**20 / b["secs"]
                L.append(f"| {r['window']} KiB | {b['bytes'] / 2**20:.0f} | {b['secs']:.2f} | "
                         f"{rate:.1f} | {lim:.1f} | {rate / lim * 100:.0f} % | "
                         f"{fmt(r['relay_rss'], '.1f')} |")
            else:
                L.append(f"| {r['window']} KiB | - | - | failed | {lim:.1f} | - | - |")
        L.append("")
    if bench.memory:
        L += ["## Relay memory with connected, idle agents", ""]
        L.append("A fresh relay lokadb per row (`plugins = relay`, 1000 sites in `sites` and one "
                 "tunnel database per site in `[databases]`), then N sessions of "
                 "test/tools/agent_swarm (one site each, TLS 1.3 + HELLO with the token proof, "
                 "then idle: mux PINGs only). RSS and PSS from /proc 3 s after the last session "
                 "was accepted, and again after a heartbeat interval (10 s PING)"
                 + (" (--quick: 1 s)" if so.quick else "") + ".")
        L.append("")
        L.append("| agents | active | relay RSS MiB | relay PSS MiB | later RSS MiB | per agent KiB "
                 "| ramp-up s | agents' RSS MiB |")
        L.append("|--:|--:|--:|--:|--:|--:|--:|--:|")
        base_rss = bench.memory[0]["after"][0] if bench.memory and bench.memory[0]["agents"] == 0 else None
        for r in bench.memory:
            per = ((r["later"][0] - base_rss) * 1024 / r["agents"]
                   if r["agents"] and base_rss is not None and r["later"][0] else None)
            L.append(f"| {r['agents']}{' lokadb agent processes' if r['real'] else ''} | "
                     f"{r['active']} / {r['active_later']} | "
                     f"{fmt(r['after'][0], '.1f')} | {fmt(r['after'][1], '.1f')} | "
                     f"{fmt(r['later'][0], '.1f')} | {fmt(per, '.0f')} | "
                     f"{fmt(r.get('ramp_s'), '.2f')} | {fmt(r['swarm_rss'], '.1f')} |")
        L.append("")
        if any(r["real"] for r in bench.memory):
            L.append(f"The row with lokadb agent processes ({REAL_AGENTS} processes with the agent "
                     f"plugin, connected without delay) checks that agent_swarm's sessions cost the "
                     f"relay what real agents do; \"agents' RSS\" is the swarm process's RSS, or the "
                     f"sum of the agent processes' RSS.")
            L.append("")
        top = [r for r in bench.memory if r["agents"] == 1000 and not r["real"]]
        if top:
            r = top[0]
            rss = max(x for x in (r["after"][0], r["later"][0]) if x is not None)
            L.append(verdict(r["active_later"] == 1000 and rss <= REF_MEM_MB,
                             f"1000 agents held in <= {REF_MEM_MB:g} MB (the reference: 100 agents "
                             f"in 34 MB)", f"relay RSS {rss:.1f} MiB, {r['active_later']} active"))
            L.append("")
    if bench.clients:
        L += [f"## Many clients on a moved organization through fdw (RTT {so.clients_rtt:g} ms)", ""]
        L.append(f"pgbench -c N -j 4 through the cloud lokadb (database `cloud`, transaction "
                 f"pooling, pool_size {POOL_SIZE}, max_client_conn 1500), each transaction "
                 f"`BEGIN; read one row of the moved organization; COMMIT` (postgres_fdw, then the "
                 f"relay's pool of {POOL_SIZE} tunnel streams), {so.clients_seconds} s. Refused: "
                 f"connections pgbench could not open; errors: clients that stopped on an error; "
                 f"streams: tunnel streams of the site at the end.")
        L.append("")
        L.append("| clients | tps | p50 ms | p99 ms | transactions | failed | refused | errors "
                 "| streams | reference refused |")
        L.append("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        for r in bench.clients:
            x = r["res"]
            L.append(f"| {r['clients']} | {fmt(x.tps, '.1f')} | {fmt(x.p50)} | {fmt(x.p99)} | "
                     f"{x.transactions} | {x.failed} | {r['refused']} | {r['errors']} | "
                     f"{r['streams']} | {REF_REFUSED.get(r['clients'], '-')} % |")
        L.append("")
        bad = [str(r["clients"]) for r in bench.clients
               if r["refused"] or r["errors"] or r["res"].failed or not r["res"].ok]
        L.append(verdict(not bad, "0 % refused or failed at every client count",
                         "failing: " + ", ".join(bad) if bad else ""))
        L.append("")
    if chart_name:
        L += [f"![price of distance and streaming]({chart_name})", ""]
    L += ["## Commands", ""]
    for label, cmd, script in bench.commands:
        if label.startswith("warm-up"):
            continue
        L.append(f"- {label}: `{bl.shown_path(' '.join(str(c) for c in cmd))}`")
    scripts = {}
    for label, cmd, script in bench.commands:
        if script:
            scripts.setdefault(script, label)
    if scripts:
        L += ["", "Scripts:", ""]
        for script in scripts:
            L += ["```", script.rstrip("\n"), "```"]
    if bench.errors:
        L += ["", "## Errors", ""] + [f"- {e}" for e in bench.errors]
    return "\n".join(L) + "\n"


def chart(bench, png, title):
    """Two panels: distance p50 (ms) by RTT; streaming MiB/s by window. None or why not."""
    gp = shutil.which("gnuplot")
    if not gp:
        return "gnuplot is not installed"
    if not bench.distance and not bench.stream:
        return "nothing to draw"
    d = bench.base / "chart"
    d.mkdir(exist_ok=True)
    (d / "dist.dat").write_text("".join(
        f"{r['rtt']} {r['read'].p50 or 0} {r['update'].p50 or 0} {r['ping'].p50 or 0}\n"
        for r in bench.distance))
    (d / "stream.dat").write_text("".join(
        f"\"{r['window']} KiB\" {r['best']['bytes'] / 2**20 / r['best']['secs'] if r['best'] else 0} "
        f"{r['window'] / 1024 / (r['rtt'] / 1000)}\n" for r in bench.stream))
    panels = (1 if bench.distance else 0) + (1 if bench.stream else 0)
    s = [f"set terminal pngcairo size {640 * panels},480", f"set output '{png}'",
         f"set multiplot layout 1,{panels} title '{title}'", "set key top left", "set grid"]
    if bench.distance:
        s += ["set title 'fdw, one client, p50'", "set xlabel 'RTT (ms)'", "set ylabel 'ms'",
              f"plot '{d}/dist.dat' u 1:2 w lp t 'read tx', '' u 1:3 w lp t 'update tx', "
              f"'' u 1:4 w lp t 'SELECT 1 via relay'"]
    if bench.stream:
        s += [f"set title 'COPY TO STDOUT at {bench.so.stream_rtt:g} ms RTT'", "set xlabel 'window'",
              "set ylabel 'MiB/s'", "set style data histograms", "set style fill solid 0.6",
              "set yrange [0:*]",
              f"plot '{d}/stream.dat' u 2:xtic(1) t 'measured', '' u 3 t 'window / RTT'"]
    s.append("unset multiplot")
    r = subprocess.run([gp], input="\n".join(s) + "\n", text=True, capture_output=True, timeout=60)
    if r.returncode != 0:
        return f"gnuplot: {r.stderr.strip()[:200]}"
    return None


def run_suite(o, R, now, only_one):
    """Run the site suite; returns (exit status, report lines of targets)."""
    load_before = os.getloadavg()[0]
    so = o.site
    bl.log(f"site: parts {', '.join(so.parts)}; RTTs {so.rtts} ms, {so.seconds} s per row; "
           f"agents {so.agents}; clients {so.clients} ({so.clients_seconds} s); windows "
           f"{so.windows} KiB at {so.stream_rtt:g} ms, {so.stream_mb} MB")
    bench = SiteBench(o, R)
    versions = {}

    def steps():
        bench.setup()
        versions.update(bench.versions())
        bench.run()
    rc, err = bl.run_bench(bench, "site", steps, tail_lines=20)
    if rc is not None:
        return rc, []
    if err is not None:
        bench.errors.append(f"aborted: {bl.shown_path(str(err))[:1000]}")
        if not (bench.distance or bench.memory or bench.stream or bench.clients):
            bl.cleanup()
            return 2, []
    meta = bl.report_meta(R, now, load_before, versions or {
        "postgres": "?", "pgbench": "?", "lokadb": "?", "openssl": "?"})
    RESULTS.mkdir(parents=True, exist_ok=True)
    pngs = bl.output_paths(o, now, NAME, RESULTS, ".png", only_one)
    chart_name = bl.draw_chart(
        lambda png: chart(bench, png, "Sites" + (" (--quick)" if o.quick else "")), pngs, bench.notes)
    bl.cleanup()
    text = render(bench, meta, chart_name)
    bl.write_reports([(text, bl.output_paths(o, now, NAME, RESULTS, ".md", only_one))])
    lines = [x for x in text.splitlines() if x.startswith("**PASS") or x.startswith("**FAIL")]
    return (1 if bench.errors else 0), lines
