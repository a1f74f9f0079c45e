#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""Throughput kept at N organizations against 1 (issue 4's targets 2 and 3),
with both layouts side by side and measured in alternation.

bench/routing_cost.py builds its layouts one after the other in one database
and measures them minutes apart, next to two other lokadb processes (plugins
off, plugins on) whose backends stay open: on a machine whose speed drifts,
the ratio of two layouts then carries the drift. Here one PostgreSQL 15
cluster (the routing suite's settings) holds two databases built as
bench/routing/instructions.py builds them (plugins/move/catalog.sql,
bench/routing/schema.sql, the same total rows; `--vacuum`: then VACUUM
(ANALYZE) as the routing suite does): with `--layout isolated`
(target 3) every organization has its own partitions, databases `pf1` with
1 organization and `pfN` with N; with `--layout default` (target 2) every
organization stays in DEFAULT, databases `pd1` and `pdN`.

Each run starts one lokadb (pool of 8) in front of one database, in one of
the `--modes`: `on` (`plugins = meta_cache org_routing`, the given
org_affinity), `off` (no plugins: PostgreSQL's own loss through the
pooler) or `set` (no plugins, the workload's statement sent at N
organizations with `SET lokadb.org = '<o>'; ` in front in the same Query:
what org_routing sends PostgreSQL when the server connection holds another
organization, without org_routing) or `parent` (plugins on with org_routing's
`rewrite = off`: statements stay on the parent, custom-planned once an
organization is isolated) or `session` (plugins on with org_routing's
`server_org = session`: the servers' lokadb.org is the client's own, none
here, so no SET goes in front when the organization changes) or `statement`
(plugins on with `server_org = statement`: the statement's organization on
its server, the SET in front when it changes; `on` has org_routing's
default, `auto`, which on this schema, where nothing reads settings, is
`session`); it warms it
with the measured workload and client count, measures `pgbench -M simple -c C -j 2` (`-j 1` for one
client; `--protocol extended`: `-M extended`, each statement the unnamed
statement with its organization a parameter; `--protocol prepared`: `-M
prepared`, a named statement prepared once per connection and then only
bound, lokadb's `max_prepared_statements` at its default, and the report
gives the Parses lokadb sent PostgreSQL per 100 Binds of its clients
(SHOW STATS); mode `set` only with `simple`),
and stops it. A round runs each mode on 1 then N organizations;
the order of the modes rotates from one round to the next. The report
gives every run with the CPU of lokadb and of PostgreSQL per transaction
(/proc) and the private memory (RssAnon) of the database's backends after
it, and per mode the median tps of each layout, their ratio, and the
ratio of each round's pair (N after 1, a few seconds apart) with its
median: the figure least moved by a machine whose speed drifts. With
`off` and another mode it also gives, round by round, that mode's kept
ratio (N after 1) over off's: a ratio of ratios, not of throughput.

usage: keep.py [--orgs 1000] [--layout isolated|default] [--clients 32]
               [--workloads read,update,insert] [--modes on,off,set,parent,session]
               [--rounds 5] [--seconds 8] [--warm 8] [--affinity 8]
               [--lokadb ./lokadb] [--plugin-dir ./plugins]
               [--protocol simple|extended|prepared] [--max-prepared N]
               [--perf N] [--perf-of postgres|lokadb]
(`--off` is `--modes off`; `--max-prepared`: lokadb's max_prepared_statements;
`--perf N`: `perf record -e cpu-clock` of PostgreSQL's processes, or with
`--perf-of lokadb` of lokadb, during each measured run, and their N busiest
functions in µs of CPU per transaction.)
"""
import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(HERE))
import benchlib as bl  # noqa: E402
import instructions  # noqa: E402  (the databases)
import routing_cost as rc  # noqa: E402  (PostgreSQL's settings)

DOCS = 500000


# The target of each layout: issue 4's targets 2 (DEFAULT) and 3 (isolated).
def target(layout, n):
    return rc.DEFAULT_KEEP if layout == "default" else rc.ISO_KEEP[1000 if n <= 1000 else 10000]


def dbname(layout, n):
    return f"{'pd' if layout == 'default' else 'pf'}{n}"


def build(pg, layout, n, vacuum=False):
    a = argparse.Namespace(pg_host=pg.host, pg_port=pg.port, orgs=n, docs=DOCS, layout=layout, vacuum=vacuum)
    instructions.build_db(a)
    pg.psql(f"ALTER DATABASE {instructions.DB} RENAME TO {dbname(layout, n)}")


def tps_of(r):
    """The tps of a finished pgbench run; exits on a failed one."""
    res = bl.PgbenchResult()
    bl.parse_pgbench_output(r.stdout, res)
    if r.returncode or res.tps is None:
        sys.exit(f"pgbench failed:\n{r.stdout}\n{r.stderr}")
    return res.tps


def script(base, wl, mode, n):
    """The workload's pgbench script; for mode `set` and more than one
    organization, its statement with the organization's SET in front (`\\;`:
    one Query message). With one organization plugins on sends the SET once
    per server connection, so `set` sends none."""
    if mode != "set" or n == 1:
        return HERE / f"{wl}.sql"
    path = base / f"{wl}-set.sql"
    if path.exists():
        return path
    lines = (HERE / f"{wl}.sql").read_text().splitlines()
    path.write_text("".join((ln if ln.startswith("\\") else "SET lokadb.org = ':o' \\; " + ln) + "\n"
                            for ln in lines if ln.strip()))
    return path


PERF_HZ = 2000


def perf_start(a, pg, lk, d):
    """With --perf: perf record (cpu-clock) of the cluster's processes (or,
    with --perf-of lokadb, of lokadb) for the measured run, started now;
    (process, output file) or None."""
    if not a.perf:
        return None
    pids = [str(lk.pid)] if a.perf_of == "lokadb" else bl.tree_pids(pg.pid)
    out = d / "perf.data"
    return subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(PERF_HZ), "-p", ",".join(pids),
                             "-o", str(out), "--", "sleep", str(a.seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out


def perf_top(a, rec, txns):
    """The recorded functions by CPU µs per transaction (the --perf most)."""
    if not rec:
        return []
    proc, out = rec
    proc.wait(timeout=a.seconds + 60)
    r = subprocess.run(["perf", "report", "-i", str(out), "--stdio", "--no-children", "--sort", "sym",
                        "-F", "sample,sym", "-q"], capture_output=True, text=True, timeout=300)
    rows = []
    for ln in r.stdout.splitlines():
        f = ln.split(None, 2)
        if len(f) == 3 and f[0].isdigit():
            rows.append((int(f[0]) / PERF_HZ / txns * 1e6, f[2].strip()))
    rows.sort(reverse=True)
    return [(sum(us for us, _ in rows), "(all functions)")] + rows[:a.perf]


def one_run(a, pg, base, n, wl, mode):
    off = mode not in ("on", "parent", "session", "statement")
    d = Path(tempfile.mkdtemp(prefix=f"lk{n}-", dir=base))
    port = bl.free_port()
    (d / "users.txt").write_text('"postgres" ""\n')
    conn = f"host={pg.host} port={pg.port} dbname={dbname(a.layout, n)}"
    (d / "lokadb.ini").write_text(
        f"[lokadb]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
        f"auth_file = {d}/users.txt\nadmin_users = postgres\nlogfile = {d}/lokadb.log\n"
        f"pool_mode = transaction\ndefault_pool_size = 8\nmax_client_conn = 200\n"
        + (f"max_prepared_statements = {a.max_prepared}\n" if a.max_prepared is not None else "")
        + ("" if off else f"plugins = meta_cache org_routing\nplugin_dir = {a.plugin_dir}\n")
        + f"\n[databases]\nbench = {conn}\n"
        + ("" if off else f"\n[plugin.meta_cache]\ncloud = {conn} user=postgres\n"
           f"\n[plugin.org_routing]\norg_affinity = {a.affinity}\n"
           + ("rewrite = off\n" if mode == "parent" else "")
           + (f"server_org = {mode}\n" if mode in ("session", "statement") else "")))
    lk = subprocess.Popen([a.lokadb, "-q", str(d / "lokadb.ini")], start_new_session=True)
    try:
        env = bl.client_env({"PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": "postgres"})
        for _ in range(100):
            if subprocess.run([str(bl.PG_BIN / "psql"), "-d", "bench", "-c", "select 1"], env=env,
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        if not off:
            time.sleep(2.0)     # meta_cache loads the catalog
        per = DOCS // n

        def pgbench(secs):
            r = subprocess.run([str(bl.PG_BIN / "pgbench"), "-n", "-M", a.protocol,
                                "-f", str(script(base, wl, mode, n)),
                                "-D", f"norgs={n}", "-D", f"per={per}", "-c", str(a.clients),
                                "-j", str(min(2, a.clients)), "-T", str(secs),
                                "bench"], env=env, capture_output=True, text=True, timeout=secs + 120)
            return tps_of(r)
        pgbench(a.warm)
        def cpu():
            return {"lokadb": bl.proc_cpu_seconds(lk.pid) or 0.0, "postgres": bl.tree_cpu_seconds(pg.pid)}

        def counts():
            rows = bl.psql_dicts(pg, "SHOW STATS", "lokadb", port, host="127.0.0.1")
            row = next(r for r in rows if r["database"] == "bench")
            return {k: int(row[f"total_{k}"]) for k in ("xact_count", "server_parse_count", "bind_count")}
        n0, c0 = counts(), cpu()
        rec = perf_start(a, pg, lk, d)
        tps = pgbench(a.seconds)
        c1, n1 = cpu(), counts()
        txns = tps * a.seconds
        meas = {k: (c1[k] - c0[k]) / txns * 1e6 for k in c0}
        dn = {k: n1[k] - n0[k] for k in n0}
        meas["parses"] = dn["server_parse_count"] / max(1, dn["bind_count"]) * 100
        held = [int(r["prepared_statements"]) for r in
                bl.psql_dicts(pg, "SHOW SERVERS", "lokadb", port, host="127.0.0.1") if r["database"] == "bench"]
        meas["held"] = max(held, default=0)
        meas["memory"] = rc.backend_memory(pg, dbname(a.layout, n))
        meas["perf"] = perf_top(a, rec, txns)
        return tps, meas
    finally:
        bl.stop_pid(lk.pid, popen=lk)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orgs", type=int, default=1000)
    ap.add_argument("--layout", choices=["isolated", "default"], default="isolated")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--modes", default="on",
                    help="of on, off (no plugins: PostgreSQL's own loss), set (no plugins, the SET in front), "
                         "parent (plugins on, rewrite = off), session (plugins on, server_org = session), "
                         "statement (plugins on, server_org = statement)")
    ap.add_argument("--off", action="store_true", help="the same as --modes off")
    ap.add_argument("--workloads", default="read,update,insert")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--affinity", type=int, default=8)
    ap.add_argument("--max-prepared", type=int, default=None,
                    help="lokadb's max_prepared_statements (default: lokadb's default)")
    ap.add_argument("--perf", type=int, default=0, metavar="N",
                    help="perf record PostgreSQL during each measured run and print its N most "
                         "expensive functions, µs of CPU per transaction")
    ap.add_argument("--perf-of", choices=["postgres", "lokadb"], default="postgres",
                    help="whose functions --perf records")
    ap.add_argument("--vacuum", action="store_true",
                    help="VACUUM (ANALYZE) the databases after their rows, as bench/routing_cost.py "
                         "does (default: ANALYZE only, as instructions.py)")
    ap.add_argument("--lokadb", default=str(REPO / "lokadb"))
    ap.add_argument("--plugin-dir", default=str(REPO / "plugins"))
    ap.add_argument("--protocol", choices=["simple", "extended", "prepared"], default="simple",
                    help="pgbench -M: extended sends each statement as the unnamed statement, its "
                         "organization a parameter; prepared binds a named statement")
    a = ap.parse_args()
    modes = ["off"] if a.off else a.modes.split(",")
    if not modes or len(set(modes)) != len(modes) or not set(modes) <= {"on", "off", "set", "parent", "session", "statement"}:
        ap.error("--modes: a list of on, off, set, parent and session")
    if a.perf and not shutil.which("perf"):
        ap.error("--perf needs perf (Debian package linux-perf)")
    if "set" in modes and a.protocol != "simple":
        ap.error("--modes set needs --protocol simple (the SET and the statement go in one Query)")
    a.lokadb, a.plugin_dir = str(Path(a.lokadb).resolve()), str(Path(a.plugin_dir).resolve())
    bl.install_cleanup_handlers()
    base = bl.make_tempdir("lokadb-keep-")
    pg = bl.Postgres(base, rc.PG_SETTINGS)
    try:
        pg.start()
        where = "in DEFAULT" if a.layout == "default" else "isolated"
        for n in (1, a.orgs):
            bl.log(f"keep: building {dbname(a.layout, n)} ({n} organization(s) {where}, {DOCS} documents)")
            build(pg, a.layout, n, a.vacuum)
        names = {"on": f"plugins on (org_affinity = {a.affinity})", "off": "plugins off",
                 "set": "plugins off with the SET in front",
                 "parent": f"plugins on with rewrite = off (org_affinity = {a.affinity})",
                 "session": f"plugins on with server_org = session (org_affinity = {a.affinity})",
                 "statement": f"plugins on with server_org = statement (org_affinity = {a.affinity})"}
        print(f"# keep: {a.orgs} organizations {where} against 1, {' and '.join(names[m] for m in modes)}, "
              f"{a.rounds} rounds of {a.seconds} s (warm-up {a.warm} s), pgbench -M {a.protocol} "
              f"-c {a.clients} -j {min(2, a.clients)}; target: {target(a.layout, a.orgs):.2f} kept"
              + ("; the databases VACUUMed (ANALYZE) after their rows" if a.vacuum else ""))
        for wl in a.workloads.split(","):
            tps = {(m, n): [] for m in modes for n in (1, a.orgs)}
            for r in range(a.rounds):
                for m in bl.rotate(modes, r):
                    for n in (1, a.orgs):
                        t, meas = one_run(a, pg, base, n, wl, m)
                        tps[m, n].append(t)
                        print(f"{wl:6s} round {r + 1} {m:3s} orgs {n:5d}: {t:8.0f} tps, CPU µs / txn lokadb "
                              f"{meas['lokadb']:.1f}, PostgreSQL {meas['postgres']:.1f}"
                              + (f", server Parses per 100 Binds {meas['parses']:.1f}, at most "
                                 f"{meas['held']} statements on a server"
                                 if a.protocol == "prepared" else "")
                              + (", backends' private memory (RssAnon) {1:.0f} MB in all, {2:.0f} MB the largest"
                                 .format(*meas["memory"]) if meas["memory"] else ""), flush=True)
                        for us, sym in meas["perf"]:
                            print(f"{wl:6s}     perf {m:3s} orgs {n:5d}: {us:7.2f} µs  {sym}"
                                  + (" (lokadb)" if a.perf_of == "lokadb" else ""), flush=True)
            pairs = {}
            for m in modes:
                m1, mn = statistics.median(tps[m, 1]), statistics.median(tps[m, a.orgs])
                pairs[m] = [y / x for x, y in zip(tps[m, 1], tps[m, a.orgs])]
                print(f"{wl:6s} {m:3s} median tps: 1 org {m1:.0f}, {a.orgs} orgs {mn:.0f}; kept {mn / m1:.2f}; "
                      f"round by round {', '.join(f'{p:.2f}' for p in pairs[m])}, median "
                      f"{statistics.median(pairs[m]):.2f}", flush=True)
            for m in [m for m in modes if m != "off"] if "off" in modes else []:
                q = [x / y for x, y in zip(pairs[m], pairs["off"])]
                print(f"{wl:6s} {m}'s kept ratio over off's kept ratio, round by round (not throughput): {', '.join(f'{v:.2f}' for v in q)}, median "
                      f"{statistics.median(q):.2f}", flush=True)
    finally:
        pg.stop()
        bl.cleanup()


if __name__ == "__main__":
    main()
