# SPDX-License-Identifier: ISC
"""Protocol features through lokadb: pipelining, prepared statements, COPY,
cursors, LISTEN/NOTIFY, multi-statement queries, errors in transactions,
cancel requests and a server that dies under a client."""

import hashlib
import threading
import time

import psycopg
import pytest
from psycopg import errors

from lokadb_harness import SLOW, BgCall, PgError, Wire, assert_serves, message

MODES = ["session", "transaction"]


def make(bouncer_factory, pool_mode, **settings):
    return bouncer_factory(settings={"pool_mode": pool_mode, **settings})


def fresh_table(pg, dbname, name, ddl="(id int primary key, v text)"):
    pg.sql(f"drop table if exists {name}", dbname=dbname)
    pg.sql(f"create table {name} {ddl}", dbname=dbname)
    pg.sql(f"grant all on {name} to public", dbname=dbname)


# ------------------------------------------------------------- pipelining --

@pytest.mark.parametrize("pool_mode", MODES)
def test_pipeline_of_many_executes_returns_every_result_in_order(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    n = 300
    with b.connect("p0") as c:
        with c.pipeline():
            curs = [c.execute("select %s::int * 2, repeat('z', %s)", (i, i % 50)) for i in range(n)]
        got = [cur.fetchone() for cur in curs]
        assert got == [(i * 2, "z" * (i % 50)) for i in range(n)]
        assert c.execute("select 1").fetchone()[0] == 1


@pytest.mark.parametrize("pool_mode", MODES)
def test_pipeline_with_an_error_in_the_middle_recovers(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    with b.connect("p0") as c:
        with pytest.raises(errors.DivisionByZero):
            with c.pipeline():
                c.execute("select %s::int", (1,))
                c.execute("select 1 / %s::int", (0,))
                c.execute("select %s::int", (3,))
        assert c.execute("select %s::int", (4,)).fetchone()[0] == 4


# ----------------------------------------------------- prepared statements --

def test_prepared_statements_work_in_session_mode(bouncer):
    with bouncer.connect("p0", prepare_threshold=5) as c:
        for i in range(10):
            assert c.execute("select %s::int + 1", (i,), prepare=True).fetchone()[0] == i + 1
        n = c.execute("select count(*) from pg_prepared_statements").fetchone()[0]
        assert n >= 1
        c.execute("prepare sq(int) as select $1 * $1")
        assert c.execute("execute sq(7)").fetchone()[0] == 49


# ------------------------------------------------------------------- COPY --

@pytest.mark.parametrize("pool_mode", MODES)
def test_copy_from_stdin_and_to_stdout_round_trip(bouncer_factory, pg, pool_mode):
    b = make(bouncer_factory, pool_mode)
    table = f"copy_rt_{pool_mode}"
    fresh_table(pg, "p2", table)
    rows = [(i, f"value {i} " + "x" * (i % 100)) for i in range(5000)]
    with b.connect("p2") as c:
        with c.cursor() as cur:
            with cur.copy(f"copy {table} (id, v) from stdin") as cp:
                for r in rows:
                    cp.write_row(r)
        assert c.execute(f"select count(*) from {table}").fetchone()[0] == len(rows)
        out = []
        with c.cursor() as cur:
            with cur.copy(f"copy (select id, v from {table} order by id) to stdout") as cp:
                for r in cp.rows():
                    out.append((int(r[0]), r[1]))
        assert out == rows
        assert c.execute("select 1").fetchone()[0] == 1


def test_copy_from_stdin_error_rolls_back_and_connection_recovers(bouncer, pg):
    fresh_table(pg, "p2", "copy_err")
    with bouncer.connect("p2") as c:
        with pytest.raises(psycopg.Error):
            with c.cursor() as cur:
                with cur.copy("copy copy_err (id, v) from stdin") as cp:
                    cp.write_row((1, "a"))
                    cp.write_row((1, "duplicate key"))
        assert c.execute("select count(*) from copy_err").fetchone()[0] == 0


@pytest.mark.parametrize("pool_mode", MODES)
def test_copy_in_via_the_extended_protocol(bouncer_factory, pg, pool_mode):
    """Parse/Bind/Execute/Sync, CopyData..., CopyDone, Sync (what libpq sends)."""
    b = make(bouncer_factory, pool_mode, default_pool_size=1)
    table = f"copy_ext_{pool_mode}"
    fresh_table(pg, "p2", table)
    w = b.login("p2")
    w.send(Wire.parse_msg(f"copy {table} (id, v) from stdin") + Wire.bind_msg()
           + Wire.execute_msg() + Wire.sync_msg())
    types = []
    while True:
        typ, _ = w.read_msg()
        types.append(typ)
        if typ == b"G":
            break
        assert typ != b"E", f"error before CopyInResponse: {types}"
    data = b"".join(b"d" + (4 + len(line)).to_bytes(4, "big") + line
                    for line in (f"{i}\tv{i}\n".encode() for i in range(100)))
    w.send(data + b"c\0\0\0\4" + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None, res.error
    assert "COPY 100" in res.tags
    assert w.scalar(f"select count(*) from {table}") == "100"
    # the server is released correctly: a second client gets it (pool_size=1)
    if pool_mode == "transaction":
        w2 = b.login("p2")
        assert w2.scalar(f"select count(*) from {table}") == "100"
        assert w.scalar("select 1") == "1"


def test_copy_in_via_the_simple_protocol_on_a_raw_socket(bouncer, pg):
    fresh_table(pg, "p2", "copy_simple")
    w = bouncer.login("p2")
    w.send_msg(b"Q", b"copy copy_simple (id, v) from stdin\0")
    typ, _ = w.read_msg()
    assert typ == b"G"
    for i in range(10):
        w.send_msg(b"d", f"{i}\tv{i}\n".encode())
    w.send_msg(b"c")
    res = w.read_until_ready()
    assert res.error is None and res.tags == ["COPY 10"]


# ---------------------------------------------------------------- cursors --

@pytest.mark.parametrize("pool_mode", MODES)
def test_server_side_cursor_fetches_in_batches(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    with b.connect("p0", autocommit=False) as c:
        with c.cursor(name="big") as cur:
            cur.itersize = 100
            cur.execute("select g from generate_series(1, 2500) g")
            total = sum(r[0] for r in cur)
        c.commit()
        assert total == 2500 * 2501 // 2


# ---------------------------------------------------------- LISTEN/NOTIFY --

def test_listen_notify_in_session_mode_delivers_a_notification(bouncer, pg):
    got = []
    with bouncer.connect("p0") as c:
        c.add_notify_handler(lambda n: got.append((n.channel, n.payload)))
        c.execute("listen lokadb_chan")
        with bouncer.connect("p0") as other:
            other.execute("notify lokadb_chan, 'hello'")
        pg.sql("notify lokadb_chan, 'direct'", dbname="p0")
        deadline = time.monotonic() + 5 * SLOW
        while len(got) < 2 and time.monotonic() < deadline:
            c.execute("select 1")
            time.sleep(0.05)
    assert ("lokadb_chan", "hello") in got
    assert ("lokadb_chan", "direct") in got


# ------------------------------------------------------- simple protocol --

@pytest.mark.parametrize("pool_mode", MODES)
def test_multi_statement_simple_query_returns_every_result(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    w = b.login("p0")
    res = w.query("select 1; select 2, 3; create temp table m (a int); insert into m values (1), (2); "
                  "select count(*) from m")
    assert res.rows == [["1"], ["2", "3"], ["2"]]
    assert res.tags == ["SELECT 1", "SELECT 1", "CREATE TABLE", "INSERT 0 2", "SELECT 1"]
    with b.connect("p0") as c:
        cur = c.execute("select 'a'; select 'b'")
        vals = [cur.fetchone()[0]]
        while cur.nextset():
            vals.append(cur.fetchone()[0])
        assert vals == ["a", "b"]


def test_empty_query_and_notices_pass_through(bouncer):
    w = bouncer.login("p0")
    res = w.query("")
    assert any(t == b"I" for t, _ in res.messages)
    res = w.query("do $$ begin raise notice 'hi there'; end $$")
    assert any(n.get("M") == "hi there" for n in res.notices)


# ------------------------------------------------------------------ errors --

@pytest.mark.parametrize("pool_mode", MODES)
def test_error_inside_a_transaction_then_rollback_and_the_server_is_reused(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode, default_pool_size=1)
    w = b.login("p0")
    pid = w.scalar("select pg_backend_pid()")
    w.query("begin")
    with pytest.raises(PgError) as ei:
        w.query("select 1/0")
    assert ei.value.sqlstate == "22012"
    with pytest.raises(PgError) as ei:
        w.query("select 1")
    assert ei.value.sqlstate == "25P02"
    w.query("rollback")
    assert w.scalar("select 'ok'") == "ok"
    if pool_mode == "transaction":
        w2 = b.login("p0")
        assert w2.scalar("select pg_backend_pid()") == pid
        assert w2.scalar("select 2") == "2"


# ------------------------------------------------------------------ cancel --

@pytest.mark.parametrize("pool_mode", MODES)
def test_cancel_stops_a_running_query_quickly(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    with b.connect("p0") as c:
        t = threading.Timer(0.5, c.cancel)
        t.start()
        start = time.monotonic()
        try:
            with pytest.raises(errors.QueryCanceled) as ei:
                c.execute("select pg_sleep(10)")
        finally:
            t.cancel()
        assert time.monotonic() - start < 5 * SLOW
        assert ei.value.sqlstate == "57014"
        assert c.execute("select 1").fetchone()[0] == 1


def test_cancel_with_an_unknown_key_does_nothing(bouncer):
    with bouncer.connect("p0") as c:
        call = BgCall(c.execute, "select pg_sleep(1)")
        w = Wire(port=bouncer.port)
        w.send((16).to_bytes(4, "big") + (80877102).to_bytes(4, "big") + b"\x01\x02\x03\x04\x05\x06\x07\x08")
        assert w.outcome(5)[0] in ("closed", "error")
        w.close()
        call.result(5 * SLOW)


# --------------------------------------------------------- server failure --

@pytest.mark.parametrize("pool_mode", MODES)
def test_server_killed_mid_transaction_gives_the_client_an_error(bouncer_factory, pg, pool_mode):
    b = make(bouncer_factory, pool_mode)
    w = b.login("p0")
    w.query("begin")
    pid = int(w.scalar("select pg_backend_pid()"))
    assert pg.terminate(pid)
    time.sleep(0.3)
    try:
        w.send_msg(b"Q", b"select 1\0")
    except OSError:
        pass
    kind, fields = w.outcome(5)
    assert kind == "error", f"expected an ErrorResponse, got {kind}"
    assert fields.get("C") in ("08006", "57P01"), fields
    assert_serves(b)


@pytest.mark.parametrize("pool_mode", MODES)
def test_cancel_reaches_only_the_query_of_the_cancelling_client(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode, default_pool_size=2)
    a = b.connect("p0")
    other = b.connect("p0")
    other_call = BgCall(other.execute, "select pg_sleep(1.5)")
    time.sleep(0.2)
    t = threading.Timer(0.3, a.cancel)
    t.start()
    try:
        with pytest.raises(errors.QueryCanceled):
            a.execute("select pg_sleep(5)")
    finally:
        t.cancel()
    other_call.result(5 * SLOW)      # not canceled
    assert other.execute("select 1").fetchone()[0] == 1


# ---------------------------------------------------------------- framing --

@pytest.mark.parametrize("pool_mode", MODES)
def test_messages_split_into_single_bytes_are_reassembled(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode)
    w = b.login("p0")
    data = (message(b"Q", b"select 'one byte at a time'\0")
            + Wire.parse_msg("select $1::int + 1") + Wire.bind_msg(params=[41])
            + Wire.execute_msg() + Wire.sync_msg())
    for i in range(len(data)):
        w.send(data[i:i + 1])
        if i % 7 == 0:
            time.sleep(0.002)
    first = w.read_until_ready()
    assert first.error is None and first.rows == [["one byte at a time"]]
    second = w.read_until_ready()
    assert second.error is None and second.rows == [["42"]]


@pytest.mark.parametrize("pool_mode", MODES)
def test_several_queries_in_one_write_all_get_their_results(bouncer_factory, pool_mode):
    b = make(bouncer_factory, pool_mode, default_pool_size=1)
    w = b.login("p0")
    w.send(b"".join(message(b"Q", f"select {i}".encode() + b"\0") for i in range(20)))
    for i in range(20):
        res = w.read_until_ready()
        assert res.error is None and res.rows == [[str(i)]]
    if pool_mode == "transaction":      # the single server is free again
        w2 = b.login("p0")
        assert w2.scalar("select 'next'") == "next"


# ------------------------------------------------- full sockets, both ways --

@pytest.mark.parametrize("pool_mode", MODES)
def test_large_data_both_ways_arrives_intact_past_full_socket_buffers(bouncer_factory, pool_mode):
    """Small replies go straight from the server's input to the client's
    socket; once a socket is full the rest must queue behind what was sent,
    in order. 20 MB each way (COPY in, COPY out read late so that the
    client's socket fills), then many small pipelined statements: every
    byte arrives, in order, and the connection still works."""
    b = make(bouncer_factory, pool_mode)
    with b.connect() as c:     # one transaction: the temp table lives in every pool mode
        c.execute("create temp table big (i int, pad text)")
        with c.cursor().copy("copy big from stdin") as cp:
            for i in range(200000):
                cp.write_row((i, f"{i:09d}" * 10))
        out = bytearray()
        with c.cursor().copy("copy (select i, pad from big order by i) to stdout") as cp:
            time.sleep(1.0)          # lokadb meanwhile fills the client's socket and queues the rest
            for chunk in cp:
                out += chunk
        assert hashlib.md5(bytes(out)).hexdigest() == hashlib.md5(
            b"".join(b"%d\t%s\n" % (i, (b"%09d" % i) * 10) for i in range(200000))).hexdigest()
        with c.pipeline():
            curs = [c.execute("select %s::int, repeat('x', %s)", (i, i % 50)) for i in range(500)]
        assert [cur.fetchone() for cur in curs] == [(i, "x" * (i % 50)) for i in range(500)]
        c.commit()
        assert c.execute("select 1").fetchone()[0] == 1
