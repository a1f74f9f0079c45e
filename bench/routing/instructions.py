#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""lokadb's instructions per statement on the routing-cost workloads, with
and without meta_cache + org_routing (doc/benchmarks.md, "Routing cost").

Instruction counts (valgrind --tool=callgrind) do not depend on what else
runs on the machine, unlike throughput and CPU time. For each build and
workload: lokadb runs under callgrind, pgbench -M simple -c 1 sends N1
statements (after a warm-up: --warm-clients clients at once, which opens the
pool's servers as the benchmark's warm-up does, then 200 statements), lokadb
stops; again with N2; the difference of the two totals divided by N2 - N1 is
what one more statement costs (start, warm-up and the plugins' caches filling
up cancel out; the warm-up's share varies a little with timing). A database of its own is
built first on the given PostgreSQL (bench/routing/schema.sql after
plugins/move/catalog.sql, as bench/routing_cost.py builds it).

usage: instructions.py --pg-port P [--orgs 100] [--layout isolated|default]
                       [--workloads read,feed,update,insert] [--n1 500 --n2 2500]
                       [--build LABEL=BINARY:PLUGIN_DIR ...] [--off] [--affinity N]
                       [--warm-clients 16] [--no-build-db]
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "bench"))
import routing_cost as rc  # noqa: E402  (the layout SQL)

PG_BIN = Path(os.environ.get("LOKADB_PG_BIN", "/usr/lib/postgresql/15/bin"))
DB = "lokadb_instr"


def psql(a, sql, db=DB):
    subprocess.run([str(PG_BIN / "psql"), "-h", a.pg_host, "-p", str(a.pg_port), "-U", "postgres", "-d", db,
                    "-q", "-v", "ON_ERROR_STOP=1"], input=sql, text=True, check=True, stdout=subprocess.DEVNULL)


def build_db(a):
    per, pp = a.docs // a.orgs, max(1, rc.PROJECTS // a.orgs)
    psql(a, f"DROP DATABASE IF EXISTS {DB}; CREATE DATABASE {DB}", db="postgres")
    psql(a, (REPO / "plugins/move/catalog.sql").read_text())
    psql(a, (HERE / "schema.sql").read_text())
    iso = a.layout == "isolated"
    if iso:
        psql(a, rc.PARTITIONS_DO.format(a=1, b=a.orgs))
    psql(a, rc.LOAD_SQL.format(n=a.orgs, per=per, pp=pp, total=a.orgs * per))
    psql(a, rc.CATALOG_ROWS_SQL.format(n=a.orgs, iso="true" if iso else "false",
                                       partitions=rc.PARTITION_ROWS_SQL.format(n=a.orgs) if iso else ""))
    if getattr(a, "vacuum", False):     # keep.py --vacuum: as bench/routing_cost.py builds its layouts
        for t in rc.VACUUM_TABLES:
            psql(a, f"VACUUM (ANALYZE) {t}")
        psql(a, "CHECKPOINT")
    else:
        psql(a, "ANALYZE; CHECKPOINT")
    return per


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def one_run(a, tmp, binary, plugin_dir, on, wl, n, per):
    d = Path(tempfile.mkdtemp(dir=tmp))
    port = free_port()
    (d / "users.txt").write_text('"postgres" ""\n')
    ini = (f"[lokadb]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
           f"auth_file = {d}/users.txt\nadmin_users = postgres\nlogfile = {d}/lokadb.log\n"
           f"pool_mode = transaction\ndefault_pool_size = 8\nmax_client_conn = 200\n")
    if on:
        ini += f"plugins = meta_cache org_routing\nplugin_dir = {plugin_dir}\n"
    ini += f"\n[databases]\n{DB} = host={a.pg_host} port={a.pg_port} dbname={DB}\n"
    if on:
        ini += (f"\n[plugin.meta_cache]\ncloud = host={a.pg_host} port={a.pg_port} dbname={DB} user=postgres\n"
                f"\n[plugin.org_routing]\norg_affinity = {a.affinity}\n")
    (d / "lokadb.ini").write_text(ini)
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out", binary, "-q",
                          str(d / "lokadb.ini")], stdout=open(d / "out", "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(port), PGUSER="postgres")
    try:
        for _ in range(600):
            if subprocess.run([str(PG_BIN / "psql"), "-d", DB, "-c", "select 1"], env=env,
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        time.sleep(2.0 if on else 0.2)      # meta_cache loads the catalog

        def bench(t):
            r = subprocess.run([str(PG_BIN / "pgbench"), "-n", "-M", "simple", "-f", str(HERE / f"{wl}.sql"),
                                "-D", f"norgs={a.orgs}", "-D", f"per={per}", "-c", "1", "-t", str(t), DB],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"pgbench failed:\n{r.stdout}\n{r.stderr}")
        if a.warm_clients > 1:     # open the whole pool, as the benchmark's 32-client warm-up does
            r = subprocess.run([str(PG_BIN / "pgbench"), "-n", "-M", "simple", "-f", str(HERE / f"{wl}.sql"),
                                "-D", f"norgs={a.orgs}", "-D", f"per={per}", "-c", str(a.warm_clients), "-j", "2",
                                "-t", "40", DB], env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"pgbench failed:\n{r.stdout}\n{r.stderr}")
        bench(200)
        bench(n)
    finally:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=120)
    for line in open(d / "cg.out"):
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    sys.exit(f"no callgrind totals in {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg-host", default="127.0.0.1")
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--orgs", type=int, default=100)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--layout", choices=["isolated", "default"], default="isolated")
    ap.add_argument("--workloads", default="read,feed,update,insert")
    ap.add_argument("--n1", type=int, default=500)
    ap.add_argument("--n2", type=int, default=2500)
    ap.add_argument("--build", action="append", default=[],
                    help=f"LABEL=BINARY:PLUGIN_DIR (default: this tree, {REPO}/lokadb:{REPO}/plugins)")
    ap.add_argument("--off", action="store_true", help="also the first build without plugins")
    ap.add_argument("--affinity", type=int, default=0,
                    help="org_routing's org_affinity with plugins on (default 0: off)")
    ap.add_argument("--warm-clients", type=int, default=16,
                    help="clients of a short warm-up that opens the pool's servers (default 16; 1: none, "
                         "then the pool has one server and org_affinity has nothing to choose from)")
    ap.add_argument("--no-build-db", action="store_true",
                    help="use the database an earlier run built (same --orgs, --docs and --layout)")
    a = ap.parse_args()
    builds = []
    for b in a.build or [f"this={REPO}/lokadb:{REPO}/plugins"]:
        label, rest = b.split("=", 1)
        binary, plugin_dir = rest.split(":", 1)
        builds.append((label, binary, plugin_dir))
    per = a.docs // a.orgs if a.no_build_db else build_db(a)
    runs = [(label, binary, pdir, True) for label, binary, pdir in builds]
    if a.off:
        runs.insert(0, ("off", builds[0][1], builds[0][2], False))
    print(f"lokadb instructions per statement (callgrind), {a.layout} {a.orgs}, pgbench -M simple -c 1, "
          f"({a.n2} - {a.n1} statements), org_affinity {a.affinity}")
    with tempfile.TemporaryDirectory() as tmp:
        for wl in a.workloads.split(","):
            for label, binary, pdir, on in runs:
                i1 = one_run(a, tmp, binary, pdir, on, wl, a.n1, per)
                i2 = one_run(a, tmp, binary, pdir, on, wl, a.n2, per)
                print(f"  {wl:7s} {label:10s} {(i2 - i1) / (a.n2 - a.n1):10,.0f}", flush=True)


if __name__ == "__main__":
    main()
