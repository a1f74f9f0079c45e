#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""Pooler instructions per connect-per-request cycle (pgbench -C -S), lokadb
and, for reference, PgBouncer (doc/benchmarks.md, "so_reuseport, connect per
request").

Instruction counts (valgrind --tool=callgrind) do not depend on what else
runs on the machine, unlike throughput and CPU time. For each pooler: it runs
under callgrind (no plugins, pool_mode = transaction, auth_type = trust, TCP
on 127.0.0.1), pgbench -C -S -c 1 runs N1 transactions, each on a new
connection (after a warm-up), the pooler stops; again with N2; the difference
of the two totals divided by N2 - N1 is what one more login + SELECT +
Terminate + close costs (start, warm-up and pool filling cancel out).
A pgbench database (scale 1) is built first on the given PostgreSQL.
Timer callbacks (PgBouncer's and lokadb's periodic work) count per second of
wall time, and a cycle under valgrind lasts longer on a busy machine: the
figures move by a few percent with the machine's load, PgBouncer's most.

With --annotate DIR the two callgrind outputs of each pooler are kept in DIR
and the per-function difference (callgrind_annotate --inclusive=no, N2 run
minus N1 run, divided by N2 - N1) is printed, largest first.

Run it as an unprivileged user (PgBouncer refuses root), e.g. postgres.

usage: login_instructions.py --pg-port P [--n1 500 --n2 2500]
                             [--build LABEL=BINARY ...] [--pgbouncer BINARY | --no-pgbouncer]
                             [--annotate DIR] [--top 30]
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PG_BIN = Path(os.environ.get("LOKADB_PG_BIN", "/usr/lib/postgresql/15/bin"))
DB = "lokadb_login"


def build_db(a):
    env = dict(os.environ, PGHOST=a.pg_host, PGPORT=str(a.pg_port), PGUSER="postgres")
    subprocess.run([str(PG_BIN / "psql"), "-d", "postgres", "-q", "-c", f"DROP DATABASE IF EXISTS {DB}",
                    "-c", f"CREATE DATABASE {DB}"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([str(PG_BIN / "pgbench"), "-i", "-q", "-s", "1", DB], env=env, check=True,
                   capture_output=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def write_config(a, d, kind, port):
    (d / "users.txt").write_text('"postgres" ""\n')
    sect = "lokadb" if kind == "lokadb" else "pgbouncer"
    ini = (f"[{sect}]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
           f"auth_file = {d}/users.txt\nadmin_users = postgres\nlogfile = {d}/pooler.log\n"
           f"pool_mode = transaction\ndefault_pool_size = 8\nmax_client_conn = 200\n"
           f"log_connections = 0\nlog_disconnections = 0\n")
    if kind != "lokadb":
        ini += f"pidfile = {d}/pooler.pid\n"
    ini += f"\n[databases]\n{DB} = host={a.pg_host} port={a.pg_port} dbname={DB}\n"
    (d / "pooler.ini").write_text(ini)


def one_run(a, tmp, kind, binary, n, keep):
    d = Path(tempfile.mkdtemp(dir=tmp))
    port = free_port()
    write_config(a, d, kind, port)
    argv = [binary, "-q", str(d / "pooler.ini")] if kind == "lokadb" else [binary, str(d / "pooler.ini")]
    p = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out"] + argv,
                         stdout=open(d / "out", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    env = dict(os.environ, PGHOST="127.0.0.1", PGPORT=str(port), PGUSER="postgres")
    try:
        for _ in range(600):
            if subprocess.run([str(PG_BIN / "psql"), "-d", DB, "-c", "select 1"], env=env,
                              capture_output=True).returncode == 0:
                break
            if p.poll() is not None:
                sys.exit(f"{kind} exited:\n{(d / 'out').read_text()}")
            time.sleep(0.1)
        time.sleep(0.2)

        def bench(t):
            r = subprocess.run([str(PG_BIN / "pgbench"), "-n", "-C", "-S", "-c", "1", "-t", str(t), DB],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"pgbench failed:\n{r.stdout}\n{r.stderr}")
        bench(100)
        bench(n)
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=120)
    total = None
    for line in open(d / "cg.out"):
        if line.startswith("summary:") or line.startswith("totals:"):
            total = int(line.split()[1])
    if total is None:
        sys.exit(f"no callgrind totals in {d}")
    if keep:
        shutil.copy(d / "cg.out", Path(keep) / f"{kind}-{n}.out")
    return total


LINE = re.compile(r"^\s*([\d,]+)\s+\([^)]*\)\s+(\S.*)$|^\s*([\d,]+)\s+(\S.*)$")


def per_function(path):
    r = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", str(path)],
                       capture_output=True, text=True, check=True)
    out = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        num, name = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        if "PROGRAM TOTALS" in name or name.startswith("=>") or ":" not in name:
            continue
        out[name.strip()] = out.get(name.strip(), 0) + int(num.replace(",", ""))
    return out


def diff_report(a, label, f1, f2):
    p1, p2 = per_function(f1), per_function(f2)
    rows = [(p2.get(k, 0) - p1.get(k, 0), k) for k in set(p1) | set(p2)]
    rows.sort(reverse=True)
    print(f"  {label}: per-function instructions per cycle (self), top {a.top}")
    for v, k in rows[:a.top]:
        print(f"    {v / (a.n2 - a.n1):9,.0f}  {k}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pg-host", default="127.0.0.1")
    ap.add_argument("--pg-port", type=int, required=True)
    ap.add_argument("--n1", type=int, default=500)
    ap.add_argument("--n2", type=int, default=2500)
    ap.add_argument("--build", action="append", default=[],
                    help=f"LABEL=BINARY (default: this tree, {REPO}/lokadb)")
    ap.add_argument("--pgbouncer", default=shutil.which("pgbouncer") or "/usr/sbin/pgbouncer")
    ap.add_argument("--no-pgbouncer", action="store_true")
    ap.add_argument("--annotate", metavar="DIR", help="keep the callgrind outputs here and diff per function")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    runs = []
    for b in a.build or [f"this={REPO}/lokadb"]:
        label, binary = b.split("=", 1)
        runs.append((label, "lokadb", binary))
    if not a.no_pgbouncer:
        runs.append(("pgbouncer", "pgbouncer", a.pgbouncer))
    build_db(a)
    print(f"pooler instructions per connect-per-request cycle (callgrind), pgbench -C -S -c 1, "
          f"({a.n2} - {a.n1} transactions)")
    with tempfile.TemporaryDirectory() as tmp:
        for label, kind, binary in runs:
            keep = None
            if a.annotate:
                keep = Path(a.annotate) / label
                keep.mkdir(parents=True, exist_ok=True)
            i1 = one_run(a, tmp, kind, binary, a.n1, keep)
            i2 = one_run(a, tmp, kind, binary, a.n2, keep)
            print(f"  {label:10s} {(i2 - i1) / (a.n2 - a.n1):10,.0f}", flush=True)
            if keep:
                diff_report(a, label, keep / f"{kind}-{a.n1}.out", keep / f"{kind}-{a.n2}.out")


if __name__ == "__main__":
    main()
