"""routing cost (issue 4): what meta_cache + org_routing cost, and how
throughput holds up as organizations get their own partitions.

One throw-away PostgreSQL 15 cluster of its own (settings for thousands of
partitions), one database `bench` holding the LokaDB catalog
(plugins/move/catalog.sql) and the schema of bench/routing/schema.sql:
cloud tables organizations and projects, tenant tables documents and
versions, LIST partitioned by organization_id with a DEFAULT partition. The
same total rows are spread over N organizations, which are either all in
DEFAULT ("DEFAULT" layout: registered in lokadb.orgs, not isolated) or all in
their own partition ("isolated" layout: per table a container <t>_o<id>
PARTITION OF <t> FOR VALUES IN (id) PARTITION BY LIST holding the leaf
<t>_o<id>_1, catalog rows in lokadb.orgs and lokadb.partitions, as ISOLATE
ORG leaves them). The layouts are built in SQL directly, DEFAULT ones first,
then the isolated ones with N going up: the partitions of the previous N are
kept and only the new organizations' are created; the rows are reloaded for
every layout (same total, spread over N).

Targets, lokadb processes of the same binary, interleaved round by round:
  off  no plugins;
  on   plugins = meta_cache org_routing ([plugin.meta_cache] cloud = the
       bench database), org_affinity off when the plugin has that setting;
  aff  the same with org_affinity on (only when org_routing has the setting,
       found by SHOW CONFIG of a probe process).

Workloads (pgbench scripts in bench/routing/, one statement per
transaction, a random organization per transaction, 1 and 32 clients,
transaction pooling): read by (organization_id, id), the feed (documents
JOIN projects ... ORDER BY id DESC LIMIT 20), update by (organization_id,
id), insert into versions.

Called by bench/run.py (BENCH_SUITES=routing); see doc/benchmarks.md,
section "Routing cost". Python standard library only (gnuplot for the chart).
"""

import datetime
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import benchlib as bl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SQL_DIR = HERE / "routing"
RESULTS = HERE / "results"
DBNAME = "bench"
NAME = "routing-cost"
PLUGINS = ("meta_cache", "org_routing")
CATALOG_SQL = REPO / "plugins" / "move" / "catalog.sql"

WORKLOADS = ["read", "feed", "update", "insert"]
WORKLOAD_TITLE = {
    "read": "read by (org, id)",
    "feed": "feed (JOIN projects, LIMIT 20)",
    "update": "update by (org, id)",
    "insert": "insert (versions)",
}
CLIENTS = [1, 32]
TARGETS = ["off", "on", "aff"]
KIND = {"off": "lokadb_off", "on": "lokadb_on", "aff": "lokadb_aff"}
LABEL = {"off": "plugins off", "on": "plugins on", "aff": "plugins on + org_affinity"}
SHORT = {"off": "off", "on": "on", "aff": "on+aff"}

ISO_ORGS = [1, 100, 1000, 3000, 10000]
DEFAULT_ORGS = [1, 10000]
QUICK_ORGS = [1, 100]
DOCS = 500_000            # documents in total, spread over the organizations
QUICK_DOCS = 100_000
PROJECTS = 20_000         # projects in total (at least one per organization)
BATCH = 250               # organizations per partition-creating transaction
# Server connections per lokadb process. Not BENCH_POOL_SIZE's 16: at 10,000
# organizations a PostgreSQL backend that has touched every leaf holds about
# 0.4 GB of relation caches, and three processes' pools stay open side by side.
POOL_SIZE = 8
MEM_FLOOR_MB = 1536       # stop the suite when MemAvailable falls below this

# The targets (throughput ratios).
ON_OFF_MIN = 0.90                       # plugins on >= 90 % of plugins off
DEFAULT_KEEP = 0.90                     # DEFAULT: <= 10 % lost from 1 to 10,000 organizations
ISO_KEEP = {1000: 0.80, 10000: 0.60}    # isolated: kept of the 1-organization throughput

PG_SETTINGS = {
    "max_connections": "300",
    # The isolated layout at 10,000 organizations is about 20,000 leaves of a
    # few pages each (heap, primary key, index): keep them in shared buffers.
    "shared_buffers": "1GB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    # Statistics, hint bits and visibility maps come from an explicit VACUUM
    # (ANALYZE) after each layout is loaded; autovacuum would otherwise work
    # through 20,000 leaves during the runs.
    "autovacuum": "off",
    # TRUNCATE and the reload of 20,000 leaves, ANALYZE of the parents.
    "max_locks_per_transaction": "1024",
    "log_min_messages": "warning",
}

# What VACUUM (ANALYZE) takes after a layout's reload, one statement each
# (bench/routing/instructions.py and keep.py --vacuum too).
VACUUM_TABLES = ("organizations, projects", "documents", "versions")

# The counters of SHOW ORG_ROUTING reported per layout (deltas).
COUNTERS = ["statements_routed", "statements_passed", "rewritten", "rewrite_failed", "prefixes",
            "prefixes_known", "prefixes_skipped", "statements_normalized", "parse_cache_hits",
            "parse_cache_misses", "parse_errors", "org_none", "inserts_on_parent"]


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------

def _env_list(name, default):
    v = os.environ.get(name, "").strip()
    if not v:
        return list(default)
    if v.lower() in ("none", "-"):
        return []
    out = []
    for w in v.split(","):
        w = w.strip()
        if not w.isdigit() or int(w) < 1:
            sys.exit(f"{name}: {w!r} is not a number of organizations (>= 1)")
        out.append(int(w))
    return sorted(set(out))


class Options:
    """The routing suite's settings (environment, see doc/benchmarks.md)."""

    def __init__(self, o):
        self.iso = _env_list("BENCH_ROUTING_ORGS", QUICK_ORGS if o.quick else ISO_ORGS)
        self.default = _env_list("BENCH_ROUTING_DEFAULT_ORGS", QUICK_ORGS if o.quick else DEFAULT_ORGS)
        if not self.iso and not self.default:
            sys.exit("BENCH_ROUTING_ORGS and BENCH_ROUTING_DEFAULT_ORGS choose no layout")
        self.docs = bl.env_int("BENCH_ROUTING_DOCS", QUICK_DOCS if o.quick else DOCS, 1)
        most = max(self.iso + self.default)
        if self.docs < most:
            sys.exit(f"BENCH_ROUTING_DOCS ({self.docs}) must be at least the largest number of "
                     f"organizations ({most})")
        lw = os.environ.get("BENCH_ROUTING_LAYOUT_WARMUP", "").strip()
        if lw and not lw.isdigit():
            sys.exit(f"BENCH_ROUTING_LAYOUT_WARMUP must be an integer, not {lw!r}")
        self.layout_warmup = int(lw) if lw else None
        lw = os.environ.get("BENCH_ROUTING_LONE_WARMUP", "").strip()
        if lw and not lw.isdigit():
            sys.exit(f"BENCH_ROUTING_LONE_WARMUP must be an integer, not {lw!r}")
        self.lone_warmup = int(lw) if lw else None
        self.protocol = os.environ.get("BENCH_ROUTING_PROTOCOL", "").strip() or "simple"
        if self.protocol not in ("simple", "extended", "prepared"):
            sys.exit("BENCH_ROUTING_PROTOCOL must be simple, extended or prepared")
        self.affinity_on = os.environ.get("BENCH_ROUTING_AFFINITY", "").strip() or None
        self.plugin_src = Path(os.path.abspath(os.environ.get("BENCH_ROUTING_PLUGIN_DIR")
                                               or str(REPO / "plugins")))
        self.rows = self._rows(os.environ.get("BENCH_ROUTING_ROWS", ""))
        # --quick: 2 s runs and no per-row warm-up (the layout warm-up fills
        # the pools), so that 4 layouts x 8 rows x 3 targets take minutes.
        self.seconds = o.seconds
        self.warmup = o.warmup
        if o.quick and not os.environ.get("BENCH_SECONDS", "").strip():
            self.seconds = 2
        if o.quick and not os.environ.get("BENCH_WARMUP", "").strip():
            self.warmup = 0
        self.rounds = max(1, min(o.rounds, self.seconds))
        self.quick = o.quick
        self.pool_size = bl.env_int("BENCH_ROUTING_POOL_SIZE", POOL_SIZE, 1)

    @staticmethod
    def _rows(spec):
        want = [w.strip() for w in spec.split(",") if w.strip()]
        for w in want:
            name = w.split(":", 1)[0]
            if name not in WORKLOADS:
                sys.exit(f"BENCH_ROUTING_ROWS: unknown workload {name!r} (known: "
                         f"{', '.join(WORKLOADS)}; a row is NAME:CLIENTS)")
            if ":" in w and w.split(":", 1)[1] not in [str(c) for c in CLIENTS]:
                sys.exit(f"BENCH_ROUTING_ROWS: clients must be one of {CLIENTS} in {w!r}")
        rows = []
        for w in WORKLOADS:
            for c in CLIENTS:
                if not want or w in want or f"{w}:{c}" in want:
                    rows.append((w, c))
        if not rows:
            sys.exit("BENCH_ROUTING_ROWS chose no row")
        return rows

    def plugin_path(self, name):
        for p in (self.plugin_src / f"{name}.so", self.plugin_src / name / f"{name}.so"):
            if p.is_file():
                return p
        return None

    def missing(self):
        """Why the suite cannot run, or None."""
        for name in PLUGINS:
            if self.plugin_path(name) is None:
                return (f"{name}.so not found in {self.plugin_src} (nor {self.plugin_src}/{name}/): "
                        f"run `make` first")
        if not CATALOG_SQL.is_file():
            return f"{CATALOG_SQL} is missing"
        for f in ("schema.sql",) + tuple(f"{w}.sql" for w in WORKLOADS):
            if not (SQL_DIR / f).is_file():
                return f"{SQL_DIR / f} is missing"
        return None


def setup_options(o):
    """Called by run.py's parse_args when the routing suite is selected."""
    o.routing = Options(o)
    return o.routing.missing()


# --------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------

class Layout:
    def __init__(self, kind, n, docs):
        self.kind = kind                  # "default" or "isolated"
        self.n = n
        self.per = docs // n              # documents (and versions) per organization
        self.docs = self.per * n
        self.pp = max(1, PROJECTS // n)   # projects per organization
        self.key = (kind, n)
        self.info = {}                    # build timings and sizes
        self.mem = None                   # (backends, total MB, largest MB) after the rows

    @property
    def name(self):
        return f"{'DEFAULT' if self.kind == 'default' else 'isolated'} {self.n}"


PARTITIONS_DO = """DO $$
DECLARE t text;
BEGIN
	FOR o IN {a}..{b} LOOP
		FOREACH t IN ARRAY ARRAY['documents', 'versions'] LOOP
			EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES IN (%s) PARTITION BY LIST (organization_id)',
				       t || '_o' || o, t, o);
			EXECUTE format('CREATE TABLE %I PARTITION OF %I (CONSTRAINT %I CHECK (organization_id = %s), '
				       'PRIMARY KEY (organization_id, id)) FOR VALUES IN (%s)',
				       t || '_o' || o || '_1', t || '_o' || o, 'lokadb_only_o' || o, o, o);
		END LOOP;
	END LOOP;
END $$"""

# Rows in creation order, organizations interleaved (as an application
# writes them over time); ids per organization are (o - 1) * per + 1 .. o * per,
# which the pgbench scripts rely on.
LOAD_SQL = """
INSERT INTO organizations SELECT o, 'organization ' || o FROM generate_series(1, {n}) o;
INSERT INTO projects (id, organization_id, name)
	SELECT {pp}::bigint * (o - 1) + k, o, 'project ' || k FROM generate_series(1, {n}) o, generate_series(1, {pp}) k;
INSERT INTO documents (organization_id, id, project_id, title, body, created_at, updated_at)
	SELECT o, {per}::bigint * (o - 1) + j, {pp}::bigint * (o - 1) + 1 + j % {pp}, 'document ' || j,
	       repeat(md5(o || '.' || j), 3), ts, ts
	FROM generate_series(1, {per}) j, generate_series(1, {n}) o,
	     LATERAL (SELECT timestamptz '2024-01-01' + j * interval '1 minute') x(ts)
	ORDER BY j, o;
INSERT INTO versions (organization_id, id, document_id, body, created_at)
	SELECT o, {per}::bigint * (o - 1) + j, {per}::bigint * (o - 1) + j, repeat(md5(j || '.' || o), 2),
	       timestamptz '2024-01-01' + j * interval '1 minute'
	FROM generate_series(1, {per}) j, generate_series(1, {n}) o
	ORDER BY j, o;
SELECT setval('documents_id_seq', {total}), setval('versions_id_seq', {total});
"""

CATALOG_ROWS_SQL = """BEGIN;
DELETE FROM lokadb.partitions;
DELETE FROM lokadb.orgs;
INSERT INTO lokadb.orgs (id, name, isolated)
	SELECT o::text, 'organization ' || o, {iso} FROM generate_series(1, {n}) o;
{partitions}COMMIT;"""

PARTITION_ROWS_SQL = """INSERT INTO lokadb.partitions (schema_name, table_name, org_id, container, leaf)
	SELECT 'public', t, o::text, t || '_o' || o, t || '_o' || o || '_1'
	FROM generate_series(1, {n}) o, unnest(ARRAY['documents', 'versions']) t;
"""


# --------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------

class RoutingBench:
    def __init__(self, o, R):
        self.o = o
        self.ro = o.routing
        self.R = R                        # bench/run.py: Cell, helpers
        self.errors = []
        self.notes = []
        self.poolers = {}
        self.down = {}
        self.built = 0                    # organizations 1..built have partitions
        self.layouts = ([Layout("default", n, self.ro.docs) for n in self.ro.default]
                        + [Layout("isolated", n, self.ro.docs) for n in self.ro.iso])
        self.results = {}                 # (layout key, workload, clients) -> {target: Cell}
        self.counters = {}                # (layout key, target) -> {counter: delta}
        self.targets = ["off", "on"]
        self.affinity = None              # SHOW CONFIG row of org_affinity, or None
        self.aff_values = None            # (off value, on value)
        self.plugin_rows = []
        self.idle_cpu = {}

    # ---------------------------------------------------------------- setup

    def sql(self, text, timeout=3600):
        return self.pg.psql(text, dbname=DBNAME, timeout=timeout)

    def setup(self):
        self.base = bl.make_tempdir("lokadb-routing-")
        self.logdir = self.base / "pgbench-logs"
        self.logdir.mkdir()
        bl.log(f"routing cost: temp dir {self.base}")
        # Private copies of everything a `make` elsewhere may replace mid-run.
        self.scripts = self.base / "scripts"
        self.scripts.mkdir()
        for f in SQL_DIR.glob("*.sql"):
            shutil.copy2(f, self.scripts / f.name)
        self.script_text = {w: (self.scripts / f"{w}.sql").read_text() for w in WORKLOADS}
        self.lokadb_bin, self.lokadb_src = bl.private_lokadb_copy(self.o.lokadb, self.base)
        self.plugin_dir = self.base / "plugins"
        self.plugin_dir.mkdir()
        self.plugin_src = []
        for name in PLUGINS:
            p = self.ro.plugin_path(name)
            st = p.stat()
            shutil.copy2(p, self.plugin_dir / f"{name}.so")
            shown = f"./{p.relative_to(REPO)}" if p.is_relative_to(REPO) else str(p)
            self.plugin_src.append(
                f"`{shown}` ({st.st_size} bytes, built "
                f"{datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC)")

        self.pg = bl.Postgres(self.base, PG_SETTINGS)
        bl.log(f"routing cost: initdb + start PostgreSQL on 127.0.0.1:{self.pg.port}")
        self.pg.start()
        self.pg.psql(f"CREATE DATABASE {DBNAME}")
        self.sql(CATALOG_SQL.read_text())
        self.sql((self.scripts / "schema.sql").read_text())
        self.cloud = f"host={self.pg.host} port={self.pg.port} dbname={DBNAME} user=postgres"
        self.common = {
            "pool_mode": "transaction",
            "default_pool_size": self.ro.pool_size,
            "max_client_conn": 1000,
            "log_connections": 0,
            "log_disconnections": 0,
            "log_stats": 0,
        }
        self.probe()
        for t in self.targets:
            p = self.make_pooler(t)
            bl.log(f"start {p.kind} ({LABEL[t]}) on 127.0.0.1:{p.port}")
            try:
                p.start()
            except RuntimeError as e:
                self.mark_down(t, None, f"{p.kind} did not start: {e}", None)
        for t in self.targets:
            if t != "off" and t not in self.down:
                self.check_plugins(t)
        self.idle_cpu.update(bl.idle_cpu({t: self.poolers[t] for t in self.targets if t not in self.down}))
        bl.log("idle CPU: " + ", ".join(f"{LABEL[t]} {v * 100:.0f}%" for t, v in self.idle_cpu.items()))

    def plugin_settings(self, affinity=None):
        routing = {"route_log": "off"}
        if affinity is not None:
            routing["org_affinity"] = affinity
        return ({"plugins": " ".join(PLUGINS), "plugin_dir": str(self.plugin_dir)},
                {"plugin.meta_cache": {"cloud": self.cloud}, "plugin.org_routing": routing})

    def make_pooler(self, t):
        if t == "off":
            settings, sections = {}, {}
        else:
            aff = None
            if self.aff_values is not None:
                aff = self.aff_values[1] if t == "aff" else self.aff_values[0]
            settings, sections = self.plugin_settings(aff)
        p = bl.Pooler(KIND[t], self.lokadb_bin, self.base, self.pg, DBNAME,
                      {**self.common, **settings}, sections)
        self.poolers[t] = p
        return p

    def probe(self):
        """A lokadb with the plugins and no org_routing settings: do they load,
        does meta_cache read the catalog, has org_routing an org_affinity?"""
        settings, sections = self.plugin_settings()
        p = bl.Pooler("lokadb_probe", self.lokadb_bin, self.base, self.pg, DBNAME,
                      {**self.common, **settings}, sections)
        bl.log("probe: lokadb with meta_cache and org_routing")
        try:
            p.start()
            self.wait_meta(p, None)
            self.plugin_rows = p.console("SHOW PLUGINS").splitlines()
            config = {r["key"]: r for r in p.console_dicts("SHOW CONFIG")}
        except RuntimeError as e:
            raise RuntimeError(f"lokadb with plugins = {' '.join(PLUGINS)} does not work: {e}\n"
                               f"{bl.tail(p.logfile, 20)}\n{bl.tail(p.stderr_path, 20)}") from e
        finally:
            p.stop()
        self.probe_config = {k: v for k, v in config.items() if k.startswith("plugin.org_routing.")}
        row = config.get("plugin.org_routing.org_affinity")
        if row is None:
            self.notes.append("org_routing has no setting `org_affinity` (SHOW CONFIG of the probe "
                              "process lists no `plugin.org_routing.org_affinity`): the affinity "
                              "axis is skipped; \"plugins on\" runs with org_routing's defaults.")
            bl.log("org_routing has no org_affinity setting: affinity axis skipped")
            return
        self.affinity = row
        self.aff_values = affinity_values(row.get("default") or "", self.ro.affinity_on)
        if self.aff_values is None:
            self.notes.append(f"org_routing's `org_affinity` has default {row.get('default')!r}, "
                              f"which this script cannot turn into on/off values: set "
                              f"BENCH_ROUTING_AFFINITY to the value meaning \"on\"; the affinity "
                              f"axis is skipped.")
            return
        self.targets.append("aff")
        bl.log(f"org_routing org_affinity (default {row.get('default')!r}): "
               f"plugins on with {self.aff_values[0]!r}, affinity target with {self.aff_values[1]!r}")

    def check_plugins(self, t):
        p = self.poolers[t]
        try:
            names = [r.split("|", 1)[0] for r in p.console("SHOW PLUGINS").splitlines()]
            self.wait_meta(p, None)
        except RuntimeError as e:
            self.mark_down(t, None, f"plugin check failed: {e}", None)
            return
        if names != list(PLUGINS):
            self.mark_down(t, None, f"SHOW PLUGINS lists {names}, expected {list(PLUGINS)}", None)
        if t == "aff" or (t == "on" and self.aff_values):
            want = self.aff_values[1] if t == "aff" else self.aff_values[0]
            rows = [r for r in p.console_dicts("SHOW CONFIG")
                    if r["key"] == "plugin.org_routing.org_affinity"]
            got = rows[0]["value"] if rows else None
            bl.log(f"{p.kind}: org_affinity = {got!r}")
            if got is None or (got.lower() != want.lower()
                               and not same_bool(got, want)):
                self.mark_down(t, None, f"org_affinity is {got!r}, not {want!r}", None)

    def wait_meta(self, p, version, partitions=None, orgs=None, timeout=180.0):
        """Until meta_cache of pooler p is ready with catalog version >= version."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                rows = p.console_dicts("SHOW META_CACHE")
                last = rows[0] if rows else None
            except RuntimeError as e:
                last = str(e)
            if isinstance(last, dict) and last.get("state") == "ready" \
                    and last.get("reloading") in ("f", "false", "0", None) \
                    and (version is None or int(last.get("version") or 0) >= version) \
                    and (partitions is None or int(last.get("partitions") or -1) == partitions) \
                    and (orgs is None or int(last.get("orgs") or -1) == orgs):
                return last
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{p.kind}: meta_cache not current within {timeout:.0f} s "
                                   f"(want version >= {version}, partitions {partitions}, "
                                   f"orgs {orgs}): {last}")
            time.sleep(0.2)

    # ---------------------------------------------------------------- errors

    def mark_down(self, t, row, msg, res):
        self.down.setdefault(t, msg)
        self.record_error(t, row, msg, res)

    def record_error(self, t, row, msg, res):
        self.errors.append(bl.error_entry(t, row, msg, res, self.poolers.get(t)))
        bl.log(f"ERROR {LABEL.get(t, t)} {row or ''}: {msg}")

    # ---------------------------------------------------------------- layouts

    def build(self, lay):
        """TRUNCATE, partitions for the new organizations (isolated), reload,
        catalog rows, VACUUM (ANALYZE), CHECKPOINT; then wait for meta_cache.
        The VACUUM sets the new rows' hint bits and the visibility maps before
        anything is measured: otherwise the first row measured after a build
        (one client's reads) pays for them, in whichever targets it reaches first."""
        bl.log(f"== layout {lay.name}: {lay.n} organization(s), {lay.per} documents and "
               f"{lay.per} versions each")
        t0 = time.monotonic()
        self.sql("TRUNCATE organizations, projects, documents, versions")
        created = 0
        if lay.kind == "isolated" and lay.n > self.built:
            last_log = time.monotonic()
            while self.built < lay.n:
                a, b = self.built + 1, min(self.built + BATCH, lay.n)
                self.sql(PARTITIONS_DO.format(a=a, b=b))
                created += b - a + 1
                self.built = b
                if time.monotonic() - last_log > 20:
                    last_log = time.monotonic()
                    bl.log(f"   partitions of organizations 1..{b} created")
        if lay.kind == "default" and self.built:
            raise RuntimeError("internal: a DEFAULT layout after partitions were made")
        t1 = time.monotonic()
        self.sql(LOAD_SQL.format(n=lay.n, per=lay.per, pp=lay.pp, total=lay.docs))
        t2 = time.monotonic()
        iso = lay.kind == "isolated"
        self.sql(CATALOG_ROWS_SQL.format(
            n=lay.n, iso="true" if iso else "false",
            partitions=PARTITION_ROWS_SQL.format(n=lay.n) if iso else ""))
        for t in VACUUM_TABLES:
            self.sql(f"VACUUM (ANALYZE) {t}")
        self.sql("CHECKPOINT")
        t3 = time.monotonic()
        version = int(self.sql("SELECT value FROM lokadb.meta WHERE key = 'version'"))
        for t in self.targets:
            if t != "off" and t not in self.down:
                try:
                    self.wait_meta(self.poolers[t], version, 2 * lay.n if iso else 0, lay.n)
                except RuntimeError as e:
                    self.mark_down(t, lay.name, str(e), None)
        sizes = self.sql(
            "SELECT sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'documents'), "
            "sum(pg_total_relation_size(relid)) FILTER (WHERE t = 'versions'), count(*) "
            "FROM (SELECT 'documents' t, relid FROM pg_partition_tree('documents') WHERE isleaf "
            "UNION ALL SELECT 'versions', relid FROM pg_partition_tree('versions') WHERE isleaf) x")
        dsize, vsize, leaves = (int(x or 0) for x in sizes.split("|"))
        lay.info = {"created": created, "ddl": t1 - t0, "load": t2 - t1, "analyze": t3 - t2,
                    "leaves": leaves, "docs_mb": dsize / 2**20, "versions_mb": vsize / 2**20}
        bl.log(f"   built in {t3 - t0:.0f} s (partitions {t1 - t0:.0f} s for {created} new "
               f"organization(s), rows {t2 - t1:.0f} s, catalog + VACUUM (ANALYZE) + CHECKPOINT "
               f"{t3 - t2:.0f} s); {leaves} leaves, documents {dsize / 2**20:.0f} MB, "
               f"versions {vsize / 2**20:.0f} MB")

    def layout_warmup(self, lay):
        return layout_warmup(self.ro, lay.n)

    def lone_warmup(self, lay):
        return lone_warmup(self.ro, lay.kind, lay.n)

    def snapshot(self):
        snap = {}
        for t in self.targets:
            if t == "off" or t in self.down:
                continue
            try:
                rows = self.poolers[t].console_dicts("SHOW ORG_ROUTING")
                snap[t] = {k: int(v) for k, v in rows[0].items() if v is not None and v.lstrip("-").isdigit()}
            except (RuntimeError, IndexError) as e:
                bl.log(f"SHOW ORG_ROUTING on {t} failed: {e}")
        return snap

    # ---------------------------------------------------------------- runs

    def pgbench_args(self, lay, scripts, clients):
        args = ["-M", self.ro.protocol]
        for s in scripts:
            args += ["-f", str(self.scripts / f"{s}.sql")]
        return args + ["-D", f"norgs={lay.n}", "-D", f"per={lay.per}",
                       "-c", str(clients), "-j", str(min(2, clients))]

    def run_one(self, t, lay, scripts, clients, seconds, logprefix, label):
        if t in self.down:
            return None
        pooler = self.poolers[t]
        cpu0 = pooler.cpu_seconds()
        res = bl.run_pgbench(self.pgbench_args(lay, scripts, clients), "127.0.0.1", pooler.port,
                             DBNAME, seconds, logprefix=logprefix, cwd=str(self.logdir))
        cpu1 = pooler.cpu_seconds()
        res.cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        rowname = f"{lay.name} {'+'.join(scripts)}:{clients} {label}"
        if not pooler.alive():
            self.mark_down(t, rowname, f"{pooler.kind} process died during the run", res)
            return None
        if not self.pg.alive():
            raise RuntimeError(f"PostgreSQL died during {rowname} ({t}):\n{bl.tail(self.pg.logpath)}")
        if not res.ok:
            self.record_error(t, rowname, res.error, res)
            return None
        if logprefix is not None and not res.latencies_us:
            self.record_error(t, rowname, "pgbench wrote no per-transaction log", res)
            return None
        return res

    def run_layout(self, lay, idx):
        o = self.ro
        before = self.snapshot()
        w = self.layout_warmup(lay)
        if w > 0:
            bl.log(f"   layout warm-up: all four workloads, 32 clients, {w} s per target")
            for t in bl.rotate(self.targets, idx):
                self.run_one(t, lay, WORKLOADS, 32, w, None, "layout warm-up")
        # The one-client rows first, after a one-client warm-up: a client
        # alone in its pool keeps the backend it used last, and a 32-client
        # row in between would hand it another one, which has met only the
        # organizations its share of 32 clients chose.
        lone = [r for r in self.ro.rows if r[1] == 1]
        w = self.lone_warmup(lay) if lone else 0
        if w > 0:
            bl.log(f"   one-client warm-up: all four workloads, 1 client, {w} s per target")
            for t in bl.rotate(self.targets, idx):
                self.run_one(t, lay, WORKLOADS, 1, w, None, "one-client warm-up")
        for workload, clients in lone + [r for r in self.ro.rows if r[1] != 1]:
            check_memory()
            self.sql("CHECKPOINT")
            cells = {t: self.R.Cell() for t in self.targets}
            def log_round(t, r, res, lat):
                bl.log(f"   {lay.name:14s} {workload:6s} c={clients:<3d} round {r + 1}/{o.rounds} "
                       f"{LABEL[t]:26s} {res.tps:9.0f} tps  p50 "
                       f"{self.R.ms(bl.percentile(lat, 50))} ms  p99 "
                       f"{self.R.ms(bl.percentile(lat, 99))} ms")
            bl.run_rounds(self.targets, idx, o.warmup, o.seconds, o.rounds, cells,
                          lambda t, secs, prefix, label: self.run_one(t, lay, [workload], clients, secs,
                                                                      prefix, label),
                          lambda t: t in self.down,
                          lambda t, r: self.logdir / f"{lay.kind}-{lay.n}-{workload}-{clients}-{t}-r{r}",
                          log_round)
            for t in self.targets:
                if t in self.down and not cells[t].errors:
                    cells[t].errors.append(f"{t} down")
                cells[t].finish()
            self.results[(lay.key, workload, clients)] = cells
            idx += 1
        lay.mem = backend_memory(self.pg)
        if lay.mem:
            bl.log(f"   PostgreSQL backends of {DBNAME}: {lay.mem[0]}, anonymous memory "
                   f"{lay.mem[1]:.0f} MB in all, {lay.mem[2]:.0f} MB the largest")
        after = self.snapshot()
        for t, a in after.items():
            b = before.get(t, {})
            self.counters[(lay.key, t)] = {k: a.get(k, 0) - b.get(k, 0) for k in COUNTERS if k in a}
        return idx

    def run(self):
        idx = 0
        for lay in self.layouts:
            check_memory()
            self.build(lay)
            if all(t in self.down for t in self.targets):
                raise RuntimeError("every lokadb process is down")
            idx = self.run_layout(lay, idx)

    def stop_poolers_and_read_logs(self):
        self.pooler_logs = bl.stop_and_read_pooler_logs(self.poolers)

    def versions(self):
        pgv = self.pg.psql("SHOW server_version")
        return {
            "postgres": f"PostgreSQL {pgv}",
            "pgbench": bl.first_line([str(bl.PG_BIN / "pgbench"), "-V"]),
            "lokadb": self.R.lokadb_build_info(self.lokadb_bin),
            "gnuplot": bl.first_line(["gnuplot", "--version"]) if shutil.which("gnuplot") else None,
        }


def same_bool(a, b):
    t, f = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
    a, b = a.lower(), b.lower()
    return (a in t and b in t) or (a in f and b in f)


def affinity_values(default, on_override):
    """(off value, on value) for org_routing's org_affinity, from its default
    as SHOW CONFIG shows it; None when that is not understood."""
    d = default.strip().lower()
    if on_override:
        off = "off" if d in ("on", "off", "true", "false", "yes", "no", "") else "0"
        return (off, on_override)
    if d in ("on", "off", "true", "false", "yes", "no", ""):
        return ("off", "on")
    if d in ("0", "1"):
        return ("0", "1")
    if d.isdigit():                      # a bound: the default is "on"
        return ("0", d)
    return None


def mem_available_mb():
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory():
    """Stop before the OOM killer picks something (this machine is shared)."""
    m = mem_available_mb()
    if m is not None and m < MEM_FLOOR_MB:
        raise RuntimeError(f"memory low: MemAvailable {m:.0f} MB < {MEM_FLOOR_MB} MB; "
                           f"stopping the suite (BENCH_ROUTING_POOL_SIZE smaller, or fewer "
                           f"organizations)")


def backend_memory(pg, db=None):
    """(client backends of database db, default DBNAME, their RssAnon in MB in
    all, the largest) from /proc."""
    db = db or DBNAME
    if pg.pid is None:
        return None
    n, total, top = 0, 0.0, 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != pg.pid:
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if f" {db} " not in cmd:
                continue
            kb = 0
            for line in (d / "status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    kb = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
        n += 1
        total += kb / 1024
        top = max(top, kb / 1024)
    return (n, total, top) if n else None


def layout_warmup(ro, n):
    """Seconds of the mixed warm-up per target before a layout's rows."""
    if ro.layout_warmup is not None:
        return ro.layout_warmup
    if ro.quick:
        return 1 + math.ceil(n / 1000)
    return 3 + math.ceil(n / 500)


def lone_warmup(ro, kind, n):
    """Seconds of the one-client warm-up per target before an isolated
    layout's one-client rows: long enough for the lone backend to meet every
    organization's leaves (a random choice reaches all of 10,000 in about
    98,000 statements; 154 s at 10,000, doc/benchmarks.md), none for DEFAULT
    (one partition) and --quick."""
    if ro.lone_warmup is not None:
        return ro.lone_warmup if kind == "isolated" else 0
    if ro.quick or kind != "isolated":
        return 0
    return math.ceil(n / 65)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def cell(bench, lay_key, workload, clients, t):
    cells = bench.results.get((lay_key, workload, clients))
    return cells.get(t) if cells else None


def tps_of(c):
    return c.tps if c is not None and c.ok else None


def fmt(x, f=".2f"):
    return "n/a" if x is None else format(x, f)


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_tps(c):
    if c is None:
        return "–"
    return f"{c.tps:,.0f}" if c.ok else "**FAIL**"


def fmt_lat(bench, c):
    if c is None:
        return "–"
    return f"{bench.R.ms(c.p50)} / {bench.R.ms(c.p99)}" if c.ok else "**FAIL**"


def keep_ratio(bench, kind, n, workload, clients, t):
    """tps(kind, n) / tps(kind, 1) of a row and target, or None."""
    return ratio(tps_of(cell(bench, (kind, n), workload, clients, t)),
                 tps_of(cell(bench, (kind, 1), workload, clients, t)))


def targets_lines(bench):
    """PASS / FAIL / NOT MEASURED lines for the issue's targets."""
    R = bench.R
    rows = bench.ro.rows
    on_variants = [t for t in bench.targets if t != "off"]
    out = []
    # 1. plugins on >= 90 % of plugins off, every cell.
    for t in on_variants:
        bad, worst, n, vals = [], None, 0, []
        for lay in bench.layouts:
            for w, c in rows:
                a, b = cell(bench, lay.key, w, c, t), cell(bench, lay.key, w, c, "off")
                if a is None or b is None or not (a.ok and b.ok):
                    bad.append(f"{lay.name} {w}:{c} (failed run)")
                    continue
                r = a.tps / b.tps
                n += 1
                vals.append(r)
                if worst is None or r < worst[0]:
                    worst = (r, f"{lay.name} {w}:{c}")
                if r < ON_OFF_MIN:
                    bad.append(f"{lay.name} {w}:{c} ({r:.2f})")
        det = (f"{n} cells; lowest {worst[0]:.2f} ({worst[1]}), mean {sum(vals) / len(vals):.2f}"
               if worst else "")
        out.append(R.verdict(not bad and n > 0, f"{LABEL[t]} >= {ON_OFF_MIN:.0%} of plugins off "
                             f"in every cell (layout, workload, clients)", det, bad))
    # 2. DEFAULT: no more than 10 % lost from 1 to 10,000 organizations.
    dn = [lay.n for lay in bench.layouts if lay.kind == "default"]
    out += keep_lines(bench, "default", dn, {10000: DEFAULT_KEEP}, on_variants,
                      "with every organization in DEFAULT")
    # 3. isolated: 80 % at 1,000 and 60 % at 10,000 of the 1-organization throughput.
    iso = [lay.n for lay in bench.layouts if lay.kind == "isolated"]
    out += keep_lines(bench, "isolated", iso, ISO_KEEP, on_variants,
                      "with every organization in its own partition")
    return out


def keep_lines(bench, kind, ns, goals, on_variants, what):
    R = bench.R
    out = []
    for n, floor in goals.items():
        goal = f"{what}, throughput at {n:,} organizations >= {floor:.0%} of 1 organization's"
        if 1 not in ns or n not in ns:
            got = [m for m in ns if m > 1]
            info = ""
            if 1 in ns and got:
                m = max(got)
                parts = []
                for t in ["off"] + on_variants:
                    rs = [keep_ratio(bench, kind, m, w, c, t) for w, c in bench.ro.rows]
                    rs = [r for r in rs if r is not None]
                    if rs:
                        parts.append(f"{LABEL[t]} {min(rs):.2f}-{max(rs):.2f}")
                info = (f"; information only, {m:,} vs 1 organization: " + ", ".join(parts)
                        if parts else "")
            out.append(f"NOT MEASURED: {goal} (layouts {kind} 1 and {n:,} not both in this run{info})")
            continue
        for t in on_variants:
            bad, det = [], []
            for w, c in bench.ro.rows:
                r = keep_ratio(bench, kind, n, w, c, t)
                if r is None:
                    bad.append(f"{w}:{c} (failed run)")
                    continue
                det.append(f"{w}:{c} {r:.2f}")
                if r < floor:
                    bad.append(f"{w}:{c} ({r:.2f})")
            out.append(R.verdict(not bad and bool(det), f"{LABEL[t]}: {goal}",
                                 ", ".join(det), bad))
        ref = []
        for w, c in bench.ro.rows:
            r = keep_ratio(bench, kind, n, w, c, "off")
            if r is not None:
                ref.append(f"{w}:{c} {r:.2f}")
        if ref:
            out.append(f"Reference, not a target: plugins off (PostgreSQL through lokadb without "
                       f"plugins), {n:,} vs 1 organization, {what}: " + ", ".join(ref))
    return out


def header(bench, meta):
    ro = bench.ro
    L = ["# Routing cost: meta_cache + org_routing vs no plugins, by number of organizations", ""]
    L.append(f"- Date: {meta['date']}")
    L.append(f"- Machine: {meta['nproc']} CPUs (nproc), {meta['model']}, {meta['mem']} RAM, "
             f"Linux {meta['kernel']}. pgbench, PostgreSQL and lokadb share the machine.")
    if bench.idle_cpu:
        L.append("- Idle pooler CPU before the runs (2 s, no clients): " + ", ".join(
            f"{LABEL[t]} {v * 100:.0f}%" for t, v in bench.idle_cpu.items()))
    L.append(f"- Load average (1 min) before / after the suite: {meta['load_before']} / "
             f"{meta['load_after']} (anything else running on the machine adds noise)")
    v = meta["versions"]
    L.append(f"- Versions: {v['postgres']}; {v['lokadb']}; {v['pgbench']}"
             + (f"; {v['gnuplot']}" if v.get("gnuplot") else ""))
    L.append(f"- lokadb binary: {bench.lokadb_src}; plugins: "
             + ", ".join(f"{n} {s}" for n, s in zip(PLUGINS, bench.plugin_src)))
    L.append(f"- Command: {meta['command']}")
    L.append(f"- BENCH_SECONDS={ro.seconds}: measured seconds per target and row, in "
             f"{ro.rounds} interleaved round(s) of "
             f"{'/'.join(map(str, bench.R.split_seconds(ro.seconds, ro.rounds)))} s; warm-up "
             f"{ro.warmup} s per target and row; per layout first a warm-up of all four "
             f"workloads with 32 clients per target ("
             + (f"BENCH_ROUTING_LAYOUT_WARMUP={ro.layout_warmup} s" if ro.layout_warmup is not None
                else ("1 s + 1 s per 1,000 organizations" if ro.quick
                      else "3 s + 1 s per 500 organizations"))
             + "); then, on isolated layouts, a warm-up of all four workloads with 1 client per "
               "target ("
             + (f"BENCH_ROUTING_LONE_WARMUP={ro.lone_warmup} s" if ro.lone_warmup is not None
                else ("none" if ro.quick else "1 s per 65 organizations"))
             + ") and the one-client rows, so that each lone client's backend has met the "
               "organizations; then the 32-client rows"
             + ("; **--quick smoke run**" if ro.quick else ""))
    L.append(f"- Data: {ro.docs:,} documents and as many versions in total, spread evenly over "
             f"the organizations of a layout (organizations interleaved, in creation order); "
             f"{PROJECTS:,} projects (at least one per organization); documents ~{3 * 32} bytes "
             f"of body")
    L.append("- lokadb: three processes of the same binary"
             if "aff" in bench.targets else "- lokadb: two processes of the same binary")
    L[-1] += (f", pool_mode=transaction, default_pool_size={ro.pool_size}, TCP on 127.0.0.1; "
              f"plugins on: `plugins = meta_cache org_routing`, `[plugin.meta_cache] cloud = "
              f"dbname={DBNAME} ...` (the bench database), `[plugin.org_routing] route_log = off`")
    if bench.aff_values:
        L[-1] += (f", `org_affinity = {bench.aff_values[0]}` (plugins on) / "
                  f"`org_affinity = {bench.aff_values[1]}` (plugins on + org_affinity)")
    L.append("- PostgreSQL: " + ", ".join(f"{k}={v}" for k, v in PG_SETTINGS.items()
                                          if k != "log_min_messages"))
    L.append(f"- pgbench: `-M {ro.protocol}`, `-j 2` (`-j 1` for 1 client), one statement per "
             f"transaction, random organization per transaction")
    if bench.plugin_rows:
        L.append("- `SHOW PLUGINS` of plugins on (name|version|abi|path|hooks|transports|"
                 "commands|state): " + "; ".join(f"`{bl.shown_path(r)}`" for r in bench.plugin_rows))
    if getattr(bench, "probe_config", None):
        L.append("- org_routing settings (SHOW CONFIG of the probe, key = value (default)): "
                 + ", ".join(f"`{k.split('.', 2)[2]} = {r.get('value')}` ({r.get('default')})"
                             for k, r in sorted(bench.probe_config.items())))
    for n in bench.notes:
        L.append(f"- Note: {n}")
    return L


def render(bench, meta, chart_name):
    ts = bench.targets
    L = header(bench, meta)
    L.append("")
    L.append("Layouts, in the order built and measured (partitions: organizations whose "
             "partitions were created for this layout; rows reloaded for every layout):")
    L.append("")
    L.append("| layout | organizations | documents / org | leaves (documents + versions) "
             "| documents MB | versions MB | new partitions s | rows s | catalog + VACUUM (ANALYZE) s "
             "| backends after the rows | their memory MB (largest) |")
    L.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for lay in bench.layouts:
        i = lay.info
        if not i:
            L.append(f"| {lay.name} | {lay.n:,} | {lay.per:,} | not built | | | | | | | |")
            continue
        m = lay.mem
        L.append(f"| {lay.name} | {lay.n:,} | {lay.per:,} | {i['leaves']:,} | {i['docs_mb']:.0f} "
                 f"| {i['versions_mb']:.0f} | {i['ddl']:.1f} ({i['created']:,} org) | {i['load']:.1f} "
                 f"| {i['analyze']:.1f} | {m[0] if m else 'n/a'} "
                 f"| {f'{m[1]:,.0f} ({m[2]:,.0f})' if m else 'n/a'} |")
    L.append("")
    L.append("Memory: RssAnon of PostgreSQL's backends of the bench database (the lokadb "
             "processes' server connections and meta_cache's) after the layout's last row, "
             "mostly relation and catalog caches; it grows with the relations each backend "
             "has touched.")
    L.append("")
    hdr = ("| layout | workload | clients | " + " | ".join(f"{LABEL[t]} tps" for t in ts)
           + " | " + " | ".join(f"{SHORT[t]} p50 / p99 ms" for t in ts)
           + " | " + " | ".join(f"{SHORT[t]} / off tps" for t in ts if t != "off")
           + " | " + " | ".join(f"{SHORT[t]} CPU µs / txn" for t in ts) + " |")
    L.append(hdr)
    L.append("|---|---|--:|" + "--:|" * (3 * len(ts) + len(ts) - 1))
    for lay in bench.layouts:
        for w, c in bench.ro.rows:
            cs = bench.results.get((lay.key, w, c))
            if cs is None:
                continue
            L.append(f"| {lay.name} | {WORKLOAD_TITLE[w]} | {c} | "
                     + " | ".join(fmt_tps(cs[t]) for t in ts) + " | "
                     + " | ".join(fmt_lat(bench, cs[t]) for t in ts) + " | "
                     + " | ".join(fmt(ratio(tps_of(cs[t]), tps_of(cs["off"]))) for t in ts if t != "off")
                     + " | " + " | ".join(fmt(cs[t].cpu_us_per_txn, ".1f") for t in ts) + " |")
    L.append("")
    L.append("Latency is per transaction, from pgbench's per-transaction logs (every "
             "transaction, all rounds pooled). CPU is the user + system time of the lokadb "
             "process over the measured runs (from /proc) per transaction: what the plugins "
             "cost the pooler. A ratio of 1.00 means no difference.")
    L.append("")
    # Throughput kept relative to 1 organization.
    kinds = [(k, [lay.n for lay in bench.layouts if lay.kind == k and lay.n > 1])
             for k in ("isolated", "default")]
    kinds = [(k, ns) for k, ns in kinds if ns and any(lay.key == (k, 1) for lay in bench.layouts)]
    if kinds:
        L.append("Throughput kept relative to 1 organization of the same layout "
                 "(tps at N organizations / tps at 1):")
        L.append("")
        cols = [(k, n) for k, ns in kinds for n in ns]
        L.append("| target | workload | clients | " + " | ".join(
            f"{'isolated' if k == 'isolated' else 'DEFAULT'} {n:,} / 1" for k, n in cols) + " |")
        L.append("|---|---|--:|" + "--:|" * len(cols))
        for t in ts:
            for w, c in bench.ro.rows:
                L.append(f"| {LABEL[t]} | {WORKLOAD_TITLE[w]} | {c} | " + " | ".join(
                    fmt(keep_ratio(bench, k, n, w, c, t)) for k, n in cols) + " |")
        L.append("")
    if bench.counters:
        L.append("org_routing's counters over each layout (SHOW ORG_ROUTING, difference from "
                 "before the layout's first run to after its last, warm-ups included):")
        L.append("")
        L.append("| layout | target | " + " | ".join(COUNTERS) + " |")
        L.append("|---|---|" + "--:|" * len(COUNTERS))
        for lay in bench.layouts:
            for t in ts:
                d = bench.counters.get((lay.key, t))
                if d is None:
                    continue
                L.append(f"| {lay.name} | {LABEL[t]} | "
                         + " | ".join(f"{d[k]:,}" if k in d else "n/a" for k in COUNTERS) + " |")
        L.append("")
        L += counter_checks(bench)
    if chart_name:
        L.append(f"![throughput by number of organizations]({chart_name})")
        L.append("")
        L.append(f"`{chart_name}`: tps by number of organizations (log scale), one panel per "
                 f"workload and client count; solid lines: every organization in its own "
                 f"partition, dashed: every organization in DEFAULT.")
        L.append("")
    L += bl.pooler_log_lines(list((getattr(bench, "pooler_logs", None) or {}).items()),
                             lambda t: LABEL[t])
    L.append("Targets (issue 4):")
    L.append("")
    for line in targets_lines(bench):
        L.append(f"- {line}")
    L.append("")
    L.append("pgbench command per row (`-T` = the round's seconds, `--log` added for measured "
             "rounds; the port selects the target; N and PER are the layout's organizations and "
             "documents per organization):")
    L.append("")
    for w, c in bench.ro.rows:
        L.append(f"- {WORKLOAD_TITLE[w]}, {c}: `pgbench -h 127.0.0.1 -p PORT -U postgres -n -T SECONDS "
                 f"-M {bench.ro.protocol} -f {w}.sql -D norgs=N -D per=PER -c {c} -j {min(2, c)} {DBNAME}`")
    L.append("")
    for w in WORKLOADS:
        if any(w == x for x, _ in bench.ro.rows):
            L += [f"bench/routing/{w}.sql:", "", "```",
                  bench.script_text[w].rstrip(), "```", ""]
    L += bl.error_lines(bench.errors, label=lambda t: LABEL.get(t, t), blank_before=False)
    return "\n".join(L) + "\n"


def counter_checks(bench):
    """Plain-language checks that routing did what the layout implies."""
    L = []
    for lay in bench.layouts:
        for t in bench.targets:
            d = bench.counters.get((lay.key, t))
            if not d or "rewritten" not in d:
                continue
            # (an INSERT whose one LokaDB table is its target stays on the parent: inserts_on_parent)
            routed = d.get("statements_routed", 0) - d.get("inserts_on_parent", 0)
            rw = d.get("rewritten", 0)
            if lay.kind == "isolated" and routed and rw < 0.99 * routed \
                    and bench.ro.protocol == "simple":
                L.append(f"- Check: {lay.name}, {LABEL[t]}: only {rw:,} of {routed:,} routed "
                         f"statements other than inserts kept on the parent were addressed to a leaf.")
            if lay.kind == "default" and rw:
                L.append(f"- Check: {lay.name}, {LABEL[t]}: {rw:,} statements were rewritten "
                         f"although no organization has its own partition.")
            for k in ("rewrite_failed", "parse_errors"):
                if d.get(k):
                    L.append(f"- Check: {lay.name}, {LABEL[t]}: {k} = {d[k]:,}.")
    if L:
        L.append("")
    return L


# --------------------------------------------------------------------------
# chart
# --------------------------------------------------------------------------

COLORS = {"off": "#555555", "on": "#1f77b4", "aff": "#ff7f0e"}


def chart(bench, png, title):
    """tps by number of organizations, gnuplot PNG; returns None or why not.

    2 x 4 panels (clients x workloads) placed by hand, and one key for all of
    them in a band of its own under the title."""
    if not shutil.which("gnuplot"):
        return "gnuplot not found (apt-get install gnuplot-nox)"
    d = bench.base / "chart"
    d.mkdir(exist_ok=True)
    ns = sorted({lay.n for lay in bench.layouts})
    lo, hi = min(ns), max(ns)
    if lo == hi:
        lo, hi = lo / 2, hi * 2
    G = ['set terminal pngcairo noenhanced size 1800,1000 font "sans,10"',
         f"set output '{png}'",
         f'set multiplot title "{title}" font ",13"',
         "set logscale x",
         f"set xrange [{lo * 0.7}:{hi * 1.4}]",
         "set xtics (" + ", ".join(f'"{n:,}" {n}' for n in ns) + ")",
         "set grid",
         "unset key",
         'set xlabel "organizations"',
         'set ylabel "tps"',
         'set format y "%.0f"']
    series = {}                          # (target, kind) -> its style and title, for the key
    pw, ph = 0.985 / len(WORKLOADS), 0.445
    for r, c in enumerate(CLIENTS):
        for k, w in enumerate(WORKLOADS):
            G.append(f"set origin {0.01 + k * pw:.4f}, {ph * (len(CLIENTS) - 1 - r):.4f}")
            G.append(f"set size {pw:.4f}, {ph:.4f}")
            G.append(f'set title "{WORKLOAD_TITLE[w]}, {c} client{"s" if c > 1 else ""}"')
            plots = []
            top = 0.0
            for t in bench.targets:
                for kind, dt, pt in (("isolated", 1, 7), ("default", 2, 6)):
                    pts = [(lay.n, tps_of(cell(bench, lay.key, w, c, t)))
                           for lay in bench.layouts if lay.kind == kind]
                    pts = [(n, v) for n, v in pts if v is not None]
                    if not pts:
                        continue
                    top = max([top] + [v for _, v in pts])
                    f = d / f"{w}-{c}-{t}-{kind}.dat"
                    f.write_text("".join(f"{n} {v:.1f}\n" for n, v in pts))
                    style = f"with linespoints lw 2 dt {dt} pt {pt} ps 1.2 lc rgb '{COLORS[t]}'"
                    what = "own partitions" if kind == "isolated" else "DEFAULT"
                    series[(t, kind)] = (style, f"{LABEL[t]}, {what}")
                    plots.append(f"'{f}' using 1:2 {style} notitle")
            if plots:
                G += ["unset label 1", "set ytics", f"set yrange [0:{top * 1.1:.0f}]",
                      "plot " + ", ".join(plots)]
            else:
                G += ['set label 1 "not measured" at graph 0.5, 0.5 center', "set yrange [0:1]",
                      "unset ytics", "plot -1 notitle"]
    if series:
        order = [(t, kind) for t in TARGETS for kind in ("isolated", "default") if (t, kind) in series]
        G += ["unset label 1", "unset title", "unset xlabel", "unset ylabel", "unset border",
              "unset tics", "unset grid", "unset logscale x", "set xrange [0:1]", "set yrange [0:1]",
              f"set origin 0.01, {ph * len(CLIENTS):.4f}", f"set size 0.98, {0.96 - ph * len(CLIENTS):.4f}",
              "set key center center horizontal maxrows 2 font \",10\" samplen 4 width 1",
              "plot " + ", ".join(f"2 {series[x][0]} title '{series[x][1]}'" for x in order)]
    G.append("unset multiplot")
    gp = d / "chart.gp"
    gp.write_text("\n".join(G) + "\n")
    r = subprocess.run(["gnuplot", str(gp)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return f"gnuplot failed: {r.stderr.strip()[-500:]}"
    return None


# --------------------------------------------------------------------------
# entry point (from run.py)
# --------------------------------------------------------------------------

def estimate(o):
    ro = o.routing
    ntargets = 3
    runs = (len(ro.iso) + len(ro.default)) * len(ro.rows) * ntargets
    secs = runs * (ro.seconds + (ro.warmup + 0.5 if ro.warmup else 0) + 0.5)
    for n in ro.iso + ro.default:
        secs += ntargets * (layout_warmup(ro, n) + 1)
    if any(c == 1 for _, c in ro.rows):
        for n in ro.iso:
            secs += ntargets * (lone_warmup(ro, "isolated", n) + 1)
    return int(secs)


def run_suite(o, R, now, only_one):
    """Run the routing cost suite; returns (exit status, report lines of targets)."""
    ro = o.routing
    load_before = os.getloadavg()[0]
    est = estimate(o)
    bl.log(f"routing cost: layouts DEFAULT {ro.default or '-'} and isolated {ro.iso or '-'}, "
           f"{len(ro.rows)} row(s) x up to 3 targets, {ro.seconds} s each ({ro.rounds} round(s)) + "
           f"{ro.warmup} s warm-up; about {est // 60} min {est % 60} s plus building the layouts")
    bench = RoutingBench(o, R)
    versions = {}

    def steps():
        bench.setup()
        versions.update(bench.versions())
        bench.run()
        bench.stop_poolers_and_read_logs()
    rc, err = bl.run_bench(bench, "routing cost", steps)
    if rc is not None:
        return rc, []
    if err is not None:
        if not bench.results:
            bl.cleanup()
            return 2, []
        bench.errors.append({"target": "-", "row": "aborted", "message": str(err)})
        try:
            bench.stop_poolers_and_read_logs()
        except Exception:  # noqa: BLE001
            pass
    meta = bl.report_meta(R, now, load_before, versions or {
        "postgres": "?", "pgbench": "?", "lokadb": "?"})
    bench.errors += bl.shutdown_errors(bench.poolers)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pngs = bl.output_paths(o, now, NAME, RESULTS, ".png", only_one)
    chart_name = bl.draw_chart(
        lambda png: chart(bench, png, "Routing cost: tps by number of organizations"
                          + (" (--quick)" if o.quick else "")), pngs, bench.notes)
    bl.cleanup()
    text = render(bench, meta, chart_name)
    bl.write_reports([(text, bl.output_paths(o, now, NAME, RESULTS, ".md", only_one))],
                     also=pngs if chart_name else ())
    lines = targets_lines(bench)
    if bench.errors:
        return 1, lines
    return 0, lines
