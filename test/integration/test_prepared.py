# SPDX-License-Identifier: ISC
"""Protocol-level prepared statements in transaction pooling
(max_prepared_statements): the client's names mapped onto server-side
statements that any server connection of the pool may have, re-prepared on
demand, in pipeline order, with PostgreSQL's errors."""

import os
import re
import struct
import subprocess
import time
import urllib.request

import pytest

from lokadb_harness import PGBENCH, SLOW, Wire, assert_serves, free_port, message
# org_routing's fixtures and helpers, for its re-parse at a Bind (no tests are imported)
from test_org_routing import (ISOLATED, ISOLATED2, ORM_FEED, USER, app, check_feed_binds,  # noqa: F401
                              direct, router, stats)


def run_client(cmd, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * SLOW, env=env,
                          stdin=subprocess.DEVNULL)


def make(bouncer_factory, pool_mode="transaction", **settings):
    return bouncer_factory(settings={"pool_mode": pool_mode, **settings})


def fresh_table(pg, dbname, name, ddl):
    pg.sql(f"drop table if exists {name}", dbname=dbname)
    pg.sql(f"create table {name} {ddl}", dbname=dbname)
    pg.sql(f"grant all on {name} to public", dbname=dbname)


# ---------------------------------------------------------------- raw wire --

def P(name, sql):
    return Wire.parse_msg(sql, name)


def B(stmt, params=(), portal=""):
    return Wire.bind_msg(portal, stmt, params)


def E(portal=""):
    return Wire.execute_msg(portal)


def D(kind, name):
    return message(b"D", kind + name.encode() + b"\0")


def C(kind, name):
    return message(b"C", kind + name.encode() + b"\0")


S = Wire.sync_msg()


def batch(w, *msgs):
    """Send the messages; return [(type, payload)] up to and with ReadyForQuery."""
    w.send(b"".join(msgs))
    return w.read_until_ready(timeout=10).messages


def types(msgs):
    return "".join(t.decode() for t, _ in msgs)


def rows(msgs):
    out = []
    for t, p in msgs:
        if t == b"D":
            (n,) = struct.unpack("!H", p[:2])
            (ln,) = struct.unpack("!i", p[2:6])
            out.append(p[6:6 + ln].decode() if n else None)
    return out


def error_of(msgs):
    for t, p in msgs:
        if t == b"E":
            fields = {}
            for part in p.split(b"\0"):
                if part:
                    fields[part[:1].decode()] = part[1:].decode()
            return fields
    return None


def ready_status(msgs):
    assert msgs[-1][0] == b"Z"
    return msgs[-1][1].decode()


def console_row(b, what, pred):
    rows_ = [r for r in b.admin_dicts(f"show {what}") if pred(r)]
    assert rows_, f"no matching row in SHOW {what}"
    return rows_


# ------------------------------------------------------------------ pgbench --

def test_pgbench_prepared_in_transaction_mode_counts_every_update(bouncer_factory, pg, tmp_path):
    b = make(bouncer_factory, default_pool_size=2)
    fresh_table(pg, "p1", "ps_counter", "(id int primary key, n int not null)")
    pg.sql("insert into ps_counter values (1, 0), (2, 0)", dbname="p1")
    script = tmp_path / "bump.sql"
    script.write_text("\\set k random(1, 2)\n"
                      "begin;\n"
                      "update ps_counter set n = n + 1 where id = :k;\n"
                      "select n from ps_counter where id = :k;\n"
                      "end;\n"
                      "update ps_counter set n = n + 1 where id = 3 - :k;\n")
    # one thread per client: pgbench prepares with a blocking call, which in one
    # thread would wait for a server while its other clients hold both
    clients, per_client = 6, 60
    r = run_client([PGBENCH, "-h", "127.0.0.1", "-p", str(b.port), "-U", "trustuser", "-n",
                    "-M", "prepared", "-c", str(clients), "-j", str(clients), "-t", str(per_client), "-f", str(script), "p1"],
                   timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"number of failed transactions: 0\b", out), out[-3000:]
    total = pg.sql("select sum(n) from ps_counter", dbname="p1")[0][0]
    assert total == 2 * clients * per_client
    stats = [r for r in b.admin_dicts("show stats") if r["database"] == "p1"][0]
    assert int(stats["total_bind_count"]) >= 4 * clients * per_client
    # each client parses its statements once; the two servers prepare each text once
    assert int(stats["total_client_parse_count"]) <= 5 * clients
    assert int(stats["total_server_parse_count"]) <= 5 * 2
    assert_serves(b)


# ------------------------------------------------------------------ psycopg --

def test_psycopg_prepared_statements_follow_the_client_across_servers(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=2)
    with b.connect("p0", prepare_threshold=0) as a, b.connect("p0", prepare_threshold=0) as c:
        pids = set()
        for i in range(20):
            with a.transaction():
                # a holds one server: c's statements run on the other one
                a.execute("select pg_backend_pid()")
                r = c.execute("select %s::int * 3, pg_backend_pid()", (i,)).fetchone()
                assert r[0] == i * 3
                pids.add(r[1])
            r = c.execute("select %s::int * 3, pg_backend_pid()", (i + 100,)).fetchone()
            assert r[0] == (i + 100) * 3
            pids.add(r[1])
            assert c.execute("select %s::text || 'x'", (str(i),)).fetchone()[0] == f"{i}x"
        assert len(pids) == 2
        # psycopg prepared them: the server sees lokadb's names, never psycopg's
        names = c.execute("select name from pg_prepared_statements").fetchall()
        assert names and all(n[0].startswith("LOKADB_") for n in names)
    assert_serves(b)


def test_psycopg_pipeline_with_prepared_statements_in_transaction_mode(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=2)
    with b.connect("p0", prepare_threshold=0) as c:
        for rnd in range(3):
            with c.pipeline():
                curs = [c.execute("select %s::int + %s::int", (i, rnd)) for i in range(40)]
                curs += [c.execute("select %s::text", (f"t{i}",)) for i in range(10)]
            got = [cur.fetchone()[0] for cur in curs]
            assert got == [i + rnd for i in range(40)] + [f"t{i}" for i in range(10)]
    assert_serves(b)


def server_parses(b, db="p0"):
    return int([r for r in b.admin_dicts("show stats") if r["database"] == db][0]["total_server_parse_count"])


@pytest.mark.parametrize("pool_mode", ["transaction", "statement"])
def test_statements_outlive_their_client_and_serve_the_next_one(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode=pool_mode, default_pool_size=1)
    w1 = b.login("p0")
    assert rows(batch(w1, P("mine", "select $1::int - 1"), B("mine", [10]), E(), S)) == ["9"]
    w1.close()
    n = server_parses(b)
    w2 = b.login("p0")
    for i in range(3):     # another client, another name, the same text: no Parse reaches the server
        m = batch(w2, P(f"its{i}", "select $1::int - 1"), B(f"its{i}", [i]), E(), S)
        assert types(m) == "12DCZ" and rows(m) == [str(i - 1)]
    assert server_parses(b) == n
    assert console_row(b, "clients", lambda r: r["prepared_statements"] == "3")
    assert console_row(b, "servers", lambda r: r["prepared_statements"] == "1")
    w2.close()


def test_psycopg_pipeline_with_an_error_behaves_as_postgresql(bouncer_factory):
    """The statement parsed after the failed one was skipped by the server:
    it does not exist, so psycopg (which counts it as prepared) gets
    26000 for it, exactly as against PostgreSQL itself; the one parsed
    before the error exists and runs."""
    from psycopg import errors
    b = make(bouncer_factory, default_pool_size=2)
    with b.connect("p0", prepare_threshold=0) as c:
        with pytest.raises(errors.DivisionByZero):
            with c.pipeline():
                c.execute("select %s::int + 1", (1,))
                c.execute("select 10 / %s::int", (0,))
                c.execute("select %s::int * 5", (1,))
        assert c.execute("select %s::int + 1", (6,)).fetchone()[0] == 7
        with pytest.raises(errors.InvalidSqlStatementName):
            c.execute("select %s::int * 5", (2,))
        assert c.execute("select 10 / %s::int", (5,)).fetchone()[0] == 2
    assert_serves(b)


# ------------------------------------------------------------ pipeline order --

def test_pipeline_of_parse_describe_bind_close_keeps_reply_order(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    for rnd in range(3):   # the 2nd and 3rd rounds find the statements on the server
        m = batch(w, P("a", "select $1::int + 1"), D(b"S", "a"), B("a", [41]), E(),
                  P("b", "select $1::int * 2"), C(b"S", "a"), B("b", [21]), E(),
                  P("a", "select $1::int + 1"), B("a", [1]), E(), C(b"S", "a"), C(b"S", "b"), S)
        assert types(m) == "1tT2DC" + "132DC" + "12DC" + "33" + "Z", (rnd, types(m))
        assert rows(m) == ["42", "42", "2"]
    assert w.query("select count(*) from pg_prepared_statements").rows == [["2"]]
    w.close()


def test_describe_of_a_statement_another_server_prepared(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=2)
    w1, w2 = b.login("p0"), b.login("p0")
    assert types(batch(w1, P("q", "select $1::int as x, 'y'::text as y"), S)) == "1Z"
    w2.send(message(b"Q", b"begin\0"))     # w2 holds a server: w1 must use the other one
    w2.read_until_ready()
    m = batch(w1, D(b"S", "q"), B("q", [5]), E(), S)
    assert types(m) == "tT2DCZ"
    assert rows(m) == ["5"]
    w2.query("commit")
    w1.close()
    w2.close()


# ------------------------------------------------------------------- errors --

def test_failed_parse_in_a_batch_skips_the_rest_and_leaves_no_statement(bouncer_factory, pg):
    b = make(bouncer_factory, default_pool_size=1)
    pg.sql("drop table if exists ps_later", dbname="p0")
    w = b.login("p0")
    m = batch(w, P("ok", "select 7"), P("bad", "select * from ps_later"), B("ok"), E(), S)
    assert types(m) == "1EZ"
    assert error_of(m)["C"] == "42P01"
    # "bad" does not exist; "ok" does
    m = batch(w, B("bad"), E(), S)
    assert error_of(m)["C"] == "26000"
    assert rows(batch(w, B("ok"), E(), S)) == ["7"]
    # the failed text was not kept as prepared on the server: once the table
    # exists, the same text prepares and runs
    pg.sql("create table ps_later (v int); insert into ps_later values (9); grant all on ps_later to public",
           dbname="p0")
    m = batch(w, P("bad", "select * from ps_later"), B("bad"), E(), S)
    assert types(m) == "12DCZ" and rows(m) == ["9"]
    w.close()


def test_failed_execute_skips_later_parses_of_the_batch(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    # floor(random()) is 0 and volatile: the division runs at Execute, not when planned at Bind
    m = batch(w, P("div", "select 1 / ($1::int + floor(random())::int)"), B("div", [0]), E(),
              P("later", "select 2"), B("later"), E(), S)
    assert types(m) == "12EZ"
    assert error_of(m)["C"] == "22012"
    # "later" was skipped by the server: it does not exist, and can be parsed anew
    assert error_of(batch(w, B("later"), E(), S))["C"] == "26000"
    m = batch(w, P("later", "select 2"), B("later"), E(), B("div", [1]), E(), S)
    assert types(m) == "12DC2DCZ" and rows(m) == ["2", "1"]
    w.close()


def test_error_skips_a_close_so_the_name_still_exists(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("k", "select 5"), S)) == "1Z"
    m = batch(w, P("", "select 1/0"), B(""), E(), C(b"S", "k"), S)
    assert error_of(m)["C"] == "22012"
    assert rows(batch(w, B("k"), E(), S)) == ["5"]
    w.close()


def test_a_batch_sent_past_a_failing_one_binds_statements_its_parses_were_skipped_for(bouncer_factory):
    """With max_prepared_statements = 1 the server keeps one statement, so
    binding "a" after "b" has the pooler close b and parse a in front of the
    Bind (hidden). An error earlier in that batch makes the server skip both.
    A batch the client sent past that batch's Sync, before the error came
    back, binds a and b again, or parses b's text under a new name: each
    works as on PostgreSQL, not a 26000 for a statement the server never got
    or a 42P05 for one it kept."""
    b = make(bouncer_factory, default_pool_size=1, max_prepared_statements=1)
    w = b.login("p0")
    assert types(batch(w, P("a", "select 'a'"), P("b", "select 'b'"), S)) == "11Z"
    for later, want in (((P("c", "select 'b'"), B("c"), E(), C(b"S", "c"), S), ["b"]),
                        ((B("a"), E(), S), ["a"]), ((B("b"), E(), S), ["b"]),
                        ((B("a"), E(), B("b"), E(), S), ["a", "b"])):
        w.send(P("", "select 1/0") + B("") + E() + B("a") + E() + S + b"".join(later))
        m = w.read_until_ready(timeout=10).messages
        assert error_of(m)["C"] == "22012" and rows(m) == []
        m = w.read_until_ready(timeout=10).messages
        assert error_of(m) is None and rows(m) == want, (error_of(m), rows(m))
    assert rows(batch(w, B("b"), E(), B("a"), E(), S)) == ["b", "a"]
    w.close()


def test_a_name_whose_parse_or_close_an_earlier_batch_may_skip_waits_for_its_answer(bouncer_factory):
    """A client that pipelines: its Parse (or Close, or DEALLOCATE) of a name
    in a batch that an error makes PostgreSQL skip, and in a batch sent past
    that batch's Sync a Bind, Describe, Parse or DEALLOCATE of the name. That
    message waits for the earlier batch's answer, so it meets what PostgreSQL
    has: a Bind of a name whose Parse was skipped gets 26000 (it used to run
    the statement), a Parse of a name whose Close was skipped gets 42P05.
    Inside a transaction block, a Parse of a text the connection has, which
    lokadb answers itself, waits for the batches before it, which may fail
    the block (then PostgreSQL's 25P02 answers it). The error comes 0.2 s
    late, so that the later batch surely arrives first."""
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    slow_error = P("", "select 1/(count(*)-count(*)) from (select pg_sleep(0.2)) s") + B("") + E()
    assert types(batch(w, P("kept", "select 5"), S)) == "1Z"
    cases = [
        # a Parse skipped: the name does not exist
        (P("s2", "select 2") + S, B("s2") + E() + S, "26000"),
        (P("s2", "select 2") + S, D(b"S", "s2") + S, "26000"),
        (P("s2", "select 2") + S, message(b"Q", b"DEALLOCATE s2\0"), "26000"),
        # a Close skipped: the name still exists
        (C(b"S", "kept") + S, P("kept", "select 6") + S, "42P05"),
    ]
    for first, later, want in cases:
        w.send(slow_error + first + later)
        m = w.read_until_ready(timeout=10).messages
        assert error_of(m)["C"] == "22012" and types(m) == "12EZ", m
        m = w.read_until_ready(timeout=10).messages
        assert (error_of(m) or {}).get("C") == want, m
    # a batch that worked: the name made there is there for the batch sent past it
    w.send(P("s3", "select 3") + S + B("s3") + E() + S)
    assert types(w.read_until_ready(timeout=10).messages) == "1Z"
    assert rows(w.read_until_ready(timeout=10).messages) == ["3"]
    assert rows(batch(w, B("kept"), E(), S)) == ["5"]
    # an SQL DEALLOCATE of a name whose Close was skipped: the name is there to deallocate
    w.send(slow_error + C(b"S", "kept") + S + message(b"Q", b"DEALLOCATE kept\0"))
    assert error_of(w.read_until_ready(timeout=10).messages)["C"] == "22012"
    m = w.read_until_ready(timeout=10).messages
    assert error_of(m) is None and types(m) == "CZ", m
    assert error_of(batch(w, B("kept"), E(), S))["C"] == "26000"
    # in a transaction block that the Query before it fails: a Parse of a text the connection has
    # gets PostgreSQL's 25P02 (not lokadb's ParseComplete), and the name is not made
    assert types(batch(w, P("other", "select 5"), S)) == "1Z"
    assert w.query("BEGIN").error is None
    w.send(message(b"Q", b"select 1/(count(*)-count(*)) from (select pg_sleep(0.2)) s\0") + P("again", "select 5") + S)
    assert error_of(w.read_until_ready(timeout=10).messages)["C"] == "22012"
    assert error_of(w.read_until_ready(timeout=10).messages)["C"] == "25P02"
    assert w.query("ROLLBACK").error is None
    assert error_of(batch(w, B("again"), E(), S))["C"] == "26000"
    w.close()


def test_a_waiting_message_behind_copy_from_stdin_does_not_hang(bouncer_factory, pg):
    """A client that sends a Bind of a name whose Parse is unanswered right
    behind a COPY FROM STDIN Query (not data, as PostgreSQL expects): once
    PostgreSQL waits for the COPY's data, nothing more is answered before
    the client sends it, so the Bind waits no longer: it goes on, and
    PostgreSQL ends the COPY and the connection (a protocol violation), which
    the client is told. Nothing hangs; other clients go on."""
    fresh_table(pg, "p0", "copy_wait", "(v int)")
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    slow_error = P("", "select 1/(count(*)-count(*)) from (select pg_sleep(0.2)) s") + B("") + E()
    w.send(slow_error + P("s1", "select 1") + S + message(b"Q", b"COPY copy_wait FROM STDIN\0") + B("s1") + E()
           + S)
    assert error_of(w.read_until_ready(timeout=10).messages)["C"] == "22012"
    got = w.wait_closed(timeout=10)
    assert [t for t, _ in got][:1] == [b"G"] and error_of(got) is not None, got
    w = b.login("p0")
    assert rows(batch(w, P("s2", "select 2"), B("s2"), E(), S)) == ["2"]
    w.close()


def test_duplicate_name_gives_42P05_and_aborts_like_postgres(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    m = batch(w, P("d", "select 1"), P("d", "select 2"), B("d"), E(), S)
    assert types(m) == "1EZ"
    err = error_of(m)
    assert err["C"] == "42P05" and err["M"] == 'prepared statement "d" already exists'
    assert rows(batch(w, B("d"), E(), S)) == ["1"]
    # inside a transaction block the error aborts it, as PostgreSQL's own would
    w.query("begin")
    m = batch(w, P("d", "select 3"), S)
    assert error_of(m)["C"] == "42P05" and ready_status(m) == "E"
    assert w.query("rollback").tags == ["ROLLBACK"]
    assert rows(batch(w, B("d"), E(), S)) == ["1"]
    w.close()


def test_parse_in_a_failed_transaction_is_refused_and_creates_no_name(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("f", "select 6"), S)) == "1Z"      # the server has the text now
    w.query("begin")
    assert w.query("select 1/0", raise_error=False).error.sqlstate == "22012"
    m = batch(w, P("g", "select 6"), S)
    assert error_of(m)["C"] == "25P02" and ready_status(m) == "E"
    w.query("rollback")
    # "g" was not created; the server still has the statement "f" uses
    m = batch(w, P("g", "select 6"), B("g"), E(), B("f"), E(), S)
    assert types(m) == "12DC2DCZ" and rows(m) == ["6", "6"]
    w.close()


def test_unknown_name_gives_26000_and_close_of_it_is_no_error(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    for msgs in ((B("nosuch"), E()), (D(b"S", "nosuch"),)):
        m = batch(w, *msgs, S)
        err = error_of(m)
        assert err["C"] == "26000" and err["M"] == 'prepared statement "nosuch" does not exist'
        assert types(m) == "EZ"
    assert types(batch(w, C(b"S", "nosuch"), S)) == "3Z"
    assert w.scalar("select 1") == "1"
    w.close()


# ------------------------------------------------ DEALLOCATE ALL, DISCARD ALL --

@pytest.mark.parametrize("cmd", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_deallocate_all_and_discard_all_forget_the_clients_names(bouncer_factory, cmd):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("x", "select 11"), P("y", "select 12"), S)) == "11Z"
    assert console_row(b, "clients", lambda r: r["prepared_statements"] == "2")
    w.query(cmd)
    assert error_of(batch(w, B("x"), E(), S))["C"] == "26000"
    assert all(r["prepared_statements"] == "0" for r in b.admin_dicts("show servers"))
    # the names are free again and the server prepares the texts anew
    m = batch(w, P("x", "select 11"), B("x"), E(), S)
    assert types(m) == "12DCZ" and rows(m) == ["11"]
    w.close()


# ------------------------------------------ SQL DEALLOCATE of a client name --

def status_of(res):
    return res.messages[-1][1].decode()


def test_sql_deallocate_of_a_protocol_statement_forgets_the_name(bouncer_factory):
    """SQL DEALLOCATE of a name the client prepared with Parse: lokadb
    forgets the name and gives PostgreSQL's reply (tag DEALLOCATE, the
    transaction status kept); the server keeps no statement of it."""
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("x", "select 11"), P("Y", "select 12"), P("z", "select 13"), S)) == "111Z"
    res = w.query("DEALLOCATE x")
    assert res.tags == ["DEALLOCATE"] and status_of(res) == "I"
    err = error_of(batch(w, B("x"), E(), S))
    assert err["C"] == "26000" and err["M"] == 'prepared statement "x" does not exist'
    # inside a transaction block, quoted, with PREPARE: the block goes on
    w.query("begin")
    res = w.query(' deallocate prepare "Y" ;')
    assert res.tags == ["DEALLOCATE"] and status_of(res) == "T"
    assert w.query("commit").tags == ["COMMIT"]
    assert error_of(batch(w, B("Y"), E(), S))["C"] == "26000"
    # the names are free again, for other texts
    m = batch(w, P("x", "select 21"), B("x"), E(), P("Y", "select 22"), B("Y"), E(), S)
    assert types(m) == "12DC12DCZ" and rows(m) == ["21", "22"]
    # a name the client does not have: PostgreSQL's own error, by name
    res = w.query("DEALLOCATE nosuch", raise_error=False)
    assert res.error.sqlstate == "26000" and 'prepared statement "nosuch" does not exist' in str(res.error)
    # lokadb's own statement left on the server (here by SQL): closed first, no 42P05
    w.query("PREPARE lokadb_deallocate AS SELECT 1")
    assert types(batch(w, P("z2", "select 14"), S)) == "1Z"
    assert w.query("DEALLOCATE z2").tags == ["DEALLOCATE"]
    names = w.scalar("select string_agg(name, ',' order by name) from pg_prepared_statements")
    assert all(n.startswith("LOKADB_") for n in names.split(","))
    assert console_row(b, "clients", lambda r: r["prepared_statements"] == "3")
    w.close()


def test_sql_deallocate_in_a_failed_transaction_fails_and_keeps_the_name(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("k", "select 5"), S)) == "1Z"
    w.query("begin")
    assert w.query("select 1/0", raise_error=False).error.sqlstate == "22012"
    res = w.query("DEALLOCATE k", raise_error=False)
    assert res.error.sqlstate == "25P02" and res.tags == [] and status_of(res) == "E"
    m = batch(w, P("", "DEALLOCATE k"), B(""), E(), S)
    assert error_of(m)["C"] == "25P02" and ready_status(m) == "E"
    w.query("rollback")
    assert rows(batch(w, B("k"), E(), S)) == ["5"]
    # and then it goes
    assert w.query("DEALLOCATE k").tags == ["DEALLOCATE"]
    assert error_of(batch(w, B("k"), E(), S))["C"] == "26000"
    w.close()


def test_sql_deallocate_in_an_extended_batch_answers_in_pipeline_order(bouncer_factory):
    """The unnamed Parse/Bind/Describe/Execute of DEALLOCATE, as psycopg
    sends it with libpq before 17: the replies PostgreSQL gives, in order
    with the batch's other messages; an earlier error skips it and keeps
    the name."""
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, P("a", "select 1"), P("b", "select 2"), S)) == "11Z"
    m = batch(w, B("a"), E(), P("", "DEALLOCATE a"), B(""), D(b"P", ""), E(), B("b"), E(), S)
    assert types(m) == "2DC12nC2DCZ"
    assert [p.rstrip(b"\0").decode() for t, p in m if t == b"C"] == ["SELECT 1", "DEALLOCATE", "SELECT 1"]
    assert rows(m) == ["1", "2"]
    assert error_of(batch(w, B("a"), E(), S))["C"] == "26000"
    # skipped after an error: "b" stays
    m = batch(w, P("", "select 1/0"), B(""), E(), P("", "DEALLOCATE b"), B(""), E(), S)
    assert error_of(m)["C"] == "22012" and types(m) == "1EZ"   # 1/0 folded at the Bind
    assert rows(batch(w, B("b"), E(), S)) == ["2"]
    # a batch that never executes it leaves nothing on the server for the next one
    assert types(batch(w, P("", "DEALLOCATE b"), S)) == "1Z"
    assert types(batch(w, P("c", "select 3"), S)) == "1Z"
    m = batch(w, P("", "DEALLOCATE c"), B(""), E(), S)
    assert types(m) == "12CZ"
    names = w.scalar("select string_agg(name, ',' order by name) from pg_prepared_statements")
    assert all(n.startswith("LOKADB_") for n in names.split(","))
    w.close()


def test_psycopg_over_prepared_max_deallocates_in_transaction_pooling(bouncer_factory):
    """psycopg keeps prepared_max statements and drops the oldest with SQL
    DEALLOCATE: in transaction pooling that works, also inside a
    transaction, and every result is right."""
    b = make(bouncer_factory, default_pool_size=2)
    with b.connect("p0", prepare_threshold=0) as c, b.connect("p0", prepare_threshold=0) as other:
        c.prepared_max = 3
        for rnd in range(3):
            with c.transaction():
                for k in range(8):
                    assert c.execute(f"select %s::int + {k}", (rnd,)).fetchone()[0] == rnd + k
            for k in range(8):
                assert c.execute(f"select %s::int * {k + 1}", (rnd,)).fetchone()[0] == rnd * (k + 1)
                assert other.execute("select %s::int", (k,)).fetchone()[0] == k
        with c.pipeline():
            curs = [c.execute(f"select %s::int - {k}", (10,)) for k in range(8)]
        assert [cur.fetchone()[0] for cur in curs] == [10 - k for k in range(8)]
    rows_ = b.admin_dicts("show clients")
    assert all(int(r["prepared_statements"]) <= 3 for r in rows_ if r["database"] == "p0")
    assert_serves(b)


# --------------------------------------------------------------- eviction --

def test_max_prepared_statements_2_evicts_and_reprepares_with_right_results(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1, max_prepared_statements=2)
    w = b.login("p0")
    n = 5
    m = batch(w, *[P(f"s{k}", f"select $1::int + {k * 100}") for k in range(n)], S)
    assert types(m) == "1" * n + "Z"
    for rnd in range(4):
        msgs = []
        for k in (range(n) if rnd % 2 == 0 else reversed(range(n))):
            msgs += [B(f"s{k}", [rnd]), E()]
        m = batch(w, *msgs, S)
        order = list(range(n)) if rnd % 2 == 0 else list(reversed(range(n)))
        assert rows(m) == [str(rnd + k * 100) for k in order]
        assert types(m) == "2DC" * n + "Z"
    assert int(w.scalar("select count(*) from pg_prepared_statements")) <= 2
    assert console_row(b, "servers", lambda r: r["prepared_statements"] == "2")
    assert console_row(b, "clients", lambda r: r["prepared_statements"] == str(n))
    w.close()


def test_a_pool_that_keeps_closing_statements_to_make_room_says_so_in_the_log(bouncer_factory):
    """Binds that fit in max_prepared_statements log nothing; once at least
    one Bind in ten of a stats_period needs a statement closed to make room,
    one warning names the setting (and no second one within 10 minutes)."""
    port = free_port()
    b = make(bouncer_factory, default_pool_size=1, max_prepared_statements=3, stats_period=1,
             metrics_listen=f"127.0.0.1:{port}")
    warning = r"max_prepared_statements = 3 is short"

    def closed():
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        m = re.search(r'^lokadb_pools_server_statements_closed_total\{database="p0",user="[^"]*"\} (\S+)$',
                      text, re.M)
        return int(float(m.group(1))) if m else 0

    w = b.login("p0")
    assert types(batch(w, *[P(f"s{k}", f"select {k}") for k in range(4)], S)) == "1111Z"

    def binds(keys, times=50):
        msgs = [m for _ in range(times) for k in keys for m in (B(f"s{k}"), E())]
        got = batch(w, *msgs, S)
        assert rows(got) == [str(k) for _ in range(times) for k in keys]

    assert closed() == 1                            # the fourth Parse closed the first
    binds(range(3))                                 # three statements: they fit after one round
    assert closed() == 4
    time.sleep(2.5 * SLOW)                          # two stats periods and more
    assert not re.search(warning, b.log()), b.log()[-2000:]
    binds(range(4))                                 # four: every Bind closes one to make room
    assert closed() == 4 + 200 - 3                  # all but the first three Binds
    b.wait_log(warning)
    line = next(ln for ln in b.log().splitlines() if re.search(warning, ln))
    n_closed, n_bound = map(int, re.search(r"(\d+) prepared statements closed .* for (\d+) Binds", line).groups())
    assert n_bound >= 100 and n_closed * 10 >= n_bound, line
    binds(range(4))
    time.sleep(2.5 * SLOW)
    assert len(re.findall(warning, b.log())) == 1
    w.close()


def test_lowering_max_prepared_statements_applies_as_servers_evict(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    w = b.login("p0")
    assert types(batch(w, *[P(f"s{k}", f"select {k}") for k in range(4)], S)) == "1111Z"
    assert console_row(b, "servers", lambda r: r["prepared_statements"] == "4")
    b.admin("set max_prepared_statements = 1")
    assert rows(batch(w, B("s2"), E(), S)) == ["2"]     # no insertion: nothing evicted yet
    assert console_row(b, "servers", lambda r: r["prepared_statements"] == "4")
    m = batch(w, P("s4", "select 4"), B("s4"), E(), B("s1"), E(), S)
    assert types(m) == "12DC2DCZ" and rows(m) == ["4", "1"]
    assert console_row(b, "servers", lambda r: r["prepared_statements"] == "1")
    assert int(w.scalar("select count(*) from pg_prepared_statements")) == 1
    w.close()


# ------------------------------------------------------- feature off, session --

def test_max_prepared_statements_0_passes_names_through(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1, max_prepared_statements=0)
    w = b.login("p0")
    m = batch(w, P("mine", "select 3"), B("mine"), E(), S)
    assert types(m) == "12DCZ"
    assert w.scalar("select string_agg(name, ',') from pg_prepared_statements") == "mine"
    assert all(r["prepared_statements"] == "0" for r in b.admin_dicts("show clients"))
    w.close()


def test_session_mode_keeps_the_clients_own_names(bouncer_factory):
    b = make(bouncer_factory, pool_mode="session")
    w = b.login("p0")
    m = batch(w, P("mine", "select 4"), B("mine"), E(), P("mine", "select 5"), S)
    assert error_of(m)["C"] == "42P05"
    assert w.scalar("select string_agg(name, ',') from pg_prepared_statements") == "mine"
    w.close()
    with b.connect("p0", prepare_threshold=0) as c:
        assert c.execute("select %s::int", (8,)).fetchone()[0] == 8
        names = [r[0] for r in c.execute("select name from pg_prepared_statements").fetchall()]
        assert names and not any(n.startswith("LOKADB_") for n in names)


def test_sql_prepare_and_execute_pass_through(bouncer_factory):
    b = make(bouncer_factory, default_pool_size=1)
    with b.connect("p0") as c:
        with c.transaction():
            c.execute("prepare sq(int) as select $1 * $1")
            assert c.execute("execute sq(9)").fetchone()[0] == 81
            c.execute("deallocate sq")


# ----------------------------------------------------- plugins' re-parse --

def test_org_routing_reparse_at_bind_gets_a_statement_of_its_own_text(router, app):
    """org_routing parses a named statement again at the Bind with the
    leaf text of the Bind's organization (query_reparse): in transaction
    mode the client's name then stands for that text, which the servers
    prepare as a statement of its own; going back to the client's text
    finds the first one again."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 2})
    st0 = stats(b)
    with b.connect("app", USER, prepare_threshold=0) as c:
        for _ in range(3):
            check_feed_binds(b, app, c, True, [ISOLATED, 1, ISOLATED2, 3, ISOLATED])
        orgs = [ISOLATED, 1, ISOLATED2, 3, ISOLATED, ISOLATED2, 1]
        with c.pipeline():
            curs = [(o, c.execute(ORM_FEED, [o])) for o in orgs]
        for o, cur in curs:
            assert cur.fetchall() == direct(app, ORM_FEED, [o]), o
    assert stats(b)["reparsed"] - st0["reparsed"] >= 6
    # the parent text and the two leaf texts: three statements, not one per Bind
    counts = [int(r["prepared_statements"]) for r in b.admin_dicts("show servers")]
    assert counts and max(counts) == 3, counts
