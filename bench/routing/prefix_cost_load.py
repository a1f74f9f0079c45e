#!/usr/bin/env python3
# SPDX-License-Identifier: ISC
"""What the organization's SET costs PostgreSQL per insert under load
(doc/benchmarks.md, "Routing cost"): prefix_cost.py with pgbench's clients.

pgbench runs C clients straight to PostgreSQL (no pooler) on a database with
isolated organizations made from bench/routing/schema.sql (the routing
benchmark's, or the one `instructions.py --layout isolated` leaves), each
transaction the benchmark's insert into `versions` for one of K organizations
drawn from the database, sent in the ways --cases names: by default four, on
the organization's leaf or on the parent, alone or with `SET lokadb.org =
'<id>'; ` in front in the same Query (what lokadb sends when a server
connection changes organization); also `SELECT 1; ` or `SET LOCAL ...; ` in
front, or the SET after the insert. The CPU of
every PostgreSQL process is read from /proc over the middle of each run (so
PostgreSQL must run on this machine, as this user or root) and divided by the
transactions in that time. Prints, per case, the runs' µs per transaction
and their mean, the cases interleaved run by run.

usage: prefix_cost_load.py --port P [--host H] [--user U] --db D [--clients C]
                           [--orgs K] [--seconds S] [--runs R] [--cases A,B,...]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import benchlib as bl  # noqa: E402

PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"


def psql(a, sql):
    out = subprocess.run(["psql", "-h", a.host, "-p", str(a.port), "-U", a.user, "-d", a.db, "-AtXq", "-c", sql],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


# --cases NAME: (what the report calls it, the pgbench line; \\; keeps one Query)
CASES = {
    "leaf": ("insert on the leaf", "{ins_leaf}"),
    "set-leaf": ("SET lokadb.org; insert on the leaf (one Query: what lokadb sends)",
                 "SET lokadb.org = '{org}'\\; {ins_leaf}"),
    "parent": ("insert on the parent", "{ins_parent}"),
    "set-parent": ("SET lokadb.org; insert on the parent (one Query)", "SET lokadb.org = '{org}'\\; {ins_parent}"),
    "select1-leaf": ("SELECT 1; insert on the leaf (one Query)", "SELECT 1\\; {ins_leaf}"),
    "setlocal-leaf": ("SET LOCAL lokadb.org; insert on the leaf (one Query)",
                      "SET LOCAL lokadb.org = '{org}'\\; {ins_leaf}"),
    "leaf-set": ("insert on the leaf; SET lokadb.org after it (one Query)", "{ins_leaf}\\; SET lokadb.org = '{org}'"),
}


def scripts(a, dirname):
    """One pgbench script per organization and case: its leaf and a document of its own."""
    rows = psql(a, f"SELECT organization_id, tableoid::regclass, document_id FROM "
                   f"(SELECT DISTINCT ON (organization_id) organization_id, tableoid, document_id FROM versions "
                   f"ORDER BY organization_id) v ORDER BY random() LIMIT {a.orgs}")
    leaves = [r for r in rows if r[1] not in ("versions", "versions_default")]
    if not leaves:
        raise SystemExit("no organization of this database has a leaf of its own (isolated layout?)")
    files = {}
    for key in a.cases:
        name, form = CASES[key]
        files[name] = []
        for i, (org, leaf, doc) in enumerate(leaves):
            ins = "INSERT INTO {t} (organization_id, document_id, body) VALUES (" + org + ", " + doc + ", 'edited')"
            path = os.path.join(dirname, f"{len(files)}-{i}.sql")
            with open(path, "w") as f:
                f.write(form.format(org=org, ins_leaf=ins.format(t=leaf), ins_parent=ins.format(t="versions")) + ";\n")
            files[name].append(path)
    return files, len(leaves)


def run(a, postmaster, files):
    args = [PGBENCH, "-n", "-h", a.host, "-p", str(a.port), "-U", a.user, "-M", "simple", "-c", str(a.clients),
            "-j", "2", "-T", str(a.seconds)]
    for f in files:
        args += ["-f", f]
    pb = subprocess.Popen(args + [a.db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    t0, c0 = time.monotonic(), bl.tree_cpu_seconds(postmaster)
    time.sleep(a.seconds - 3)
    t1, c1 = time.monotonic(), bl.tree_cpu_seconds(postmaster)
    out, err = pb.communicate(timeout=a.seconds + 30)
    res = bl.PgbenchResult()
    bl.parse_pgbench_output(out, res)
    if pb.returncode != 0 or not res.tps:
        raise SystemExit(f"pgbench failed: {err[-2000:]}")
    tps = res.tps
    return tps, 1e6 * (c1 - c0) / (tps * (t1 - t0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--user", default="postgres")
    ap.add_argument("--db", required=True)
    ap.add_argument("--clients", type=int, default=8, help="pgbench clients (default 8: the benchmark's pool)")
    ap.add_argument("--orgs", type=int, default=100, help="organizations drawn (default 100)")
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="leaf,set-leaf,parent,set-parent",
                    help="comma list of " + ", ".join(CASES) + " (default leaf,set-leaf,parent,set-parent)")
    a = ap.parse_args()
    a.cases = a.cases.split(",")
    if any(c not in CASES for c in a.cases):
        raise SystemExit(f"--cases: each of {', '.join(CASES)}")
    if a.seconds < 6:
        raise SystemExit("--seconds must be at least 6")
    datadir = psql(a, "SHOW data_directory")[0][0]
    with open(os.path.join(datadir, "postmaster.pid")) as f:
        postmaster = f.readline().strip()
    with tempfile.TemporaryDirectory() as d:
        files, n = scripts(a, d)
        res = {name: [] for name in files}
        for r in range(a.runs):
            for name in (list(files) if r % 2 == 0 else list(files)[::-1]):
                res[name].append(run(a, postmaster, files[name]))
    print(f"PostgreSQL CPU µs per insert, {a.clients} clients, {n} organizations, {a.runs} runs of "
          f"{a.seconds} s: each run (tps), mean")
    for name, v in res.items():
        each = "  ".join(f"{us:5.1f} ({tps:,.0f})" for tps, us in v)
        print(f"  {sum(us for _, us in v) / len(v):6.1f}  {each}  {name}")


if __name__ == "__main__":
    main()
