# SPDX-License-Identifier: ISC
"""Real clients (psql, psycopg, pgbench) through lokadb, and host names."""

import os
import re
import subprocess
import time

import psycopg
import pytest

from lokadb_harness import PGBENCH, PSQL, SLOW, assert_serves


def run_client(cmd, timeout=30, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(env_extra or {})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * SLOW,
                          env=env, stdin=subprocess.DEVNULL)


def test_psql_runs_queries_through_lokadb(bouncer):
    r = run_client([PSQL, "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(bouncer.port),
                    "-U", "trustuser", "-d", "p0",
                    "-c", "select 41 + 1", "-c", "select current_database()"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["42", "p0"]


def test_psql_connects_over_the_unix_socket(bouncer):
    r = run_client([PSQL, "-X", "-A", "-t", "-h", str(bouncer.dir), "-p", str(bouncer.port),
                    "-U", "trustuser", "-d", "p1", "-c", "select current_database()"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "p1"


def test_psql_script_with_transactions_and_errors(bouncer):
    script = """
\\set ON_ERROR_STOP 0
create temp table t (a int);
begin;
insert into t select generate_series(1, 100);
commit;
select 1/0;
select count(*) from t;
"""
    r = subprocess.run([PSQL, "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(bouncer.port),
                        "-U", "trustuser", "-d", "p0"], input=script, capture_output=True,
                       text=True, timeout=30 * SLOW)
    assert "division by zero" in r.stderr
    assert r.stdout.split()[-1] == "100"


def test_psycopg_runs_simple_and_parameterized_queries(bouncer):
    with bouncer.connect("p0") as c:
        assert c.execute("select 1, 'a', null::int").fetchone() == (1, "a", None)
        assert c.execute("select %s::int + %s", (40, 2)).fetchone()[0] == 42
        assert c.execute("select %b::bytea", (b"\x00\xff",)).fetchone()[0] == b"\x00\xff"
        rows = c.execute("select g, repeat('x', g) from generate_series(1, 2000) g").fetchall()
        assert len(rows) == 2000 and rows[-1][1] == "x" * 2000
        big = "y" * 300_000
        assert c.execute("select length(%s)", (big,)).fetchone()[0] == 300_000
        with c.transaction():
            c.execute("create temp table t (a int, b text)")
            c.cursor().executemany("insert into t values (%s, %s)", [(i, str(i)) for i in range(50)])
        assert c.execute("select count(*), sum(a) from t").fetchone() == (50, 1225)


def _pgbench(bouncer, dbname, args, timeout=60):
    base = [PGBENCH, "-h", "127.0.0.1", "-p", str(bouncer.port), "-U", "trustuser"]
    return run_client(base + args + [dbname], timeout=timeout)


def _assert_pgbench_ok(r):
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    assert m and int(m.group(1)) > 0, out[-3000:]
    assert re.search(r"number of failed transactions: 0\b", out), out[-3000:]


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_pgbench_runs_in_transaction_mode(bouncer_factory, protocol):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 2})
    r = _pgbench(b, "p1", ["-i", "-q", "-s", "1"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    r = _pgbench(b, "p1", ["-n", "-T", "3", "-c", "4", "-M", protocol])
    _assert_pgbench_ok(r)
    assert_serves(b)


def test_pgbench_prepared_runs_in_session_mode(bouncer):
    r = _pgbench(bouncer, "p2", ["-i", "-q", "-s", "1"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    r = _pgbench(bouncer, "p2", ["-n", "-T", "3", "-c", "4", "-M", "prepared"])
    _assert_pgbench_ok(r)


def test_database_entry_with_host_localhost_works(bouncer_factory, pg):
    b = bouncer_factory(databases={"plocal": f"host=localhost port={pg.port} dbname=p1"})
    with b.connect("plocal") as c:
        assert c.execute("select current_database()").fetchone()[0] == "p1"


def test_database_entry_with_unresolvable_host_fails_quickly(bouncer_factory, pg):
    b = bouncer_factory(
        settings={"server_connect_timeout": 2, "query_wait_timeout": 3, "server_login_retry": 1},
        databases={"pnohost": f"host=nonexistent.invalid port={pg.port} dbname=p1"})
    start = time.monotonic()
    with pytest.raises(psycopg.Error):
        with b.connect("pnohost") as c:
            c.execute("select 1")
    assert time.monotonic() - start < 12 * SLOW
    assert_serves(b)
