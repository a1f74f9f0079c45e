# SPDX-License-Identifier: ISC
"""Behaviour added or fixed recently: reload during client authentication,
query_timeout, SHUTDOWN WAIT_FOR_*, KILL/RESUME without an argument, waiting
clients that leave, SHOW STATS times, max_user_connections and
max_db_connections, connect_query, server_reset_query, statement pooling, the
console query size limit and SHOW CLIENTS local addresses."""

import base64
import hashlib
import os
import socket
import struct
import time

import psycopg
import pytest

from lokadb_harness import (ADMIN_DB, SLOW, USERS, BgCall, PgError, assert_error,
                            assert_serves, assert_shutdown_waits_for, backend_pid, message, parse_error_fields,
                            read_until_error_or_close, startup_packet, userlist_text, wait_until)

BLOCKED_FOR = 1.0       # how long a call must stay blocked to count as waiting


# ------------------------------------------------------------------ helpers --

def reload_and_wait(b):
    """SIGHUP lokadb and wait until the log shows that the reload happened."""
    marker = "configuration reloaded"
    before = b.log().lower().count(marker)
    b.reload()
    wait_until(lambda: b.log().lower().count(marker) > before, 5 * SLOW,
               what="the log to show the SIGHUP reload")


def start_login(w, user, dbname="p0"):
    """Send the startup packet; return (auth code, data) of the first AuthenticationRequest."""
    w.send(startup_packet({"user": user, "database": dbname}))
    typ, payload = w.read_msg()
    if typ == b"E":
        raise PgError(parse_error_fields(payload))
    assert typ == b"R", f"expected an authentication request, got {typ!r}"
    (code,) = struct.unpack("!I", payload[:4])
    return code, payload[4:]


def md5_answer(user, password, salt):
    inner = hashlib.md5((password + user).encode()).hexdigest()
    return b"md5" + hashlib.md5(inner.encode() + salt).hexdigest().encode() + b"\0"


def pool_row(b, dbname, user):
    for r in b.admin_dicts("SHOW POOLS"):
        if r["database"] == dbname and r["user"] == user:
            return r
    return None


def cl_waiting(b, dbname, user):
    r = pool_row(b, dbname, user)
    return int(r["cl_waiting"]) if r else 0


def stats_row(b, dbname):
    for r in b.admin_dicts("SHOW STATS"):
        if r["database"] == dbname:
            return {k: (int(v) if k != "database" else v) for k, v in r.items()}
    raise AssertionError(f"no SHOW STATS row for {dbname}")


def query_in_background(b, dbname="p0", user="trustuser", sql="select pg_backend_pid()"):
    def run():
        with b.connect(dbname, user, password=USERS[user]["password"]) as c:
            return c.execute(sql).fetchone()[0]
    return BgCall(run)


def assert_blocked(call, seconds=BLOCKED_FOR):
    assert not call.wait(seconds), f"expected to wait, but it finished: {call.exception(0)!r}"


# ------------------------------------------------- 1. reload during login --

@pytest.mark.parametrize("answer_ok", [True, False], ids=["right", "wrong"])
def test_sighup_during_md5_authentication_keeps_the_login_working(bouncer_factory, answer_ok):
    b = bouncer_factory(settings={"auth_type": "md5"})
    user, pw = "cl_md5", USERS["cl_md5"]["password"]
    w = b.wire()
    code, salt = start_login(w, user)
    assert code == 5, f"expected AuthenticationMD5Password, got code {code}"
    # rewrite the auth_file (same secrets) so that the reload re-reads every entry
    b.userlist.write_text(userlist_text())
    reload_and_wait(b)
    w.send_msg(b"p", md5_answer(user, pw if answer_ok else "not-" + pw, salt[:4]))
    err = w.finish_login(user, pw, raise_error=False)
    if answer_ok:
        assert err is None, f"login failed after the reload: {err}"
        assert w.query("select current_user").rows == [[user]]
    else:
        assert isinstance(err, PgError), "a wrong md5 answer was accepted"
        assert_error(err, "28P01")
    assert b.alive(), f"lokadb died:\n{b.stderr()[-2000:]}"
    assert_serves(b)


def test_sighup_during_scram_authentication_finishes_with_the_secret_it_started_with(bouncer_factory):
    b = bouncer_factory(settings={"auth_type": "scram-sha-256"})
    user, pw = "cl_scram", USERS["cl_scram"]["password"]
    w = b.wire()
    code, data = start_login(w, user)
    assert code == 10, f"expected AuthenticationSASL, got code {code}"
    state = w._auth_step(10, data, user, pw, None)
    typ, payload = w.read_msg()
    assert typ == b"R" and struct.unpack("!I", payload[:4])[0] == 11, (typ, payload)
    # new salt for every SCRAM secret: the file really changes under the exchange
    b.userlist.write_text(userlist_text())
    reload_and_wait(b)
    w._auth_step(11, payload[4:], user, pw, state)
    typ, payload = w.read_msg()
    if typ == b"E":
        raise AssertionError(f"SCRAM login failed after the reload: {parse_error_fields(payload)}")
    assert typ == b"R" and struct.unpack("!I", payload[:4])[0] == 12, (typ, payload)
    got = dict(kv.split("=", 1) for kv in payload[4:].decode().split(","))
    assert base64.b64decode(got["v"]) == state["server_signature"]
    assert w.finish_login(user, pw, raise_error=False) is None
    assert w.query("select current_user").rows == [[user]]
    assert b.alive()
    assert_serves(b)


# ----------------------------------------------------------- 2. query_timeout --

def test_query_timeout_cancels_a_long_query_with_57014(bouncer_factory):
    b = bouncer_factory(settings={"query_timeout": 1, "default_pool_size": 1})
    w = b.login("p0", timeout=8)
    w.query("select 1")
    start = time.monotonic()
    w.send_msg(b"Q", b"select pg_sleep(5)\0")
    err, msgs = read_until_error_or_close(w, 4)
    elapsed = time.monotonic() - start
    assert err is not None, f"connection closed without an ErrorResponse after {elapsed:.1f}s: {msgs!r}"
    assert_error(err, "57014", "query timeout")
    assert 0.9 <= elapsed < 3 * SLOW, elapsed
    b.wait_log("query timeout")
    # the only server slot is usable again, and not by a stale pg_sleep reply
    with b.connect("p0") as c:
        assert c.execute("select 'after timeout'").fetchone()[0] == "after timeout"
    assert b.alive()


# ----------------------------------------------------------- 3. SHUTDOWN WAIT_* --

def test_shutdown_wait_for_clients_serves_connected_clients_and_refuses_new_ones(bouncer):
    a = bouncer.connect("p0")
    backend_pid(a)
    res = bouncer.admin_result("SHUTDOWN WAIT_FOR_CLIENTS")
    assert res.error is None, res.error
    assert res.tags == ["SHUTDOWN"]
    time.sleep(0.3)
    assert bouncer.alive(), "SHUTDOWN WAIT_FOR_CLIENTS must wait for the connected client"
    assert a.execute("select 'still served'").fetchone()[0] == "still served"
    assert_shutdown_waits_for(bouncer, a)


def test_shutdown_wait_for_servers_exits_once_the_open_transaction_ends(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    a = b.connect("p0")
    a.execute("begin")
    a.execute("select 1")
    res = b.admin_result("SHUTDOWN WAIT_FOR_SERVERS")
    assert res.error is None, res.error
    assert res.tags == ["SHUTDOWN"]
    time.sleep(0.5)
    assert b.alive(), "SHUTDOWN WAIT_FOR_SERVERS must wait for the open transaction"
    assert a.execute("select 'in tx'").fetchone()[0] == "in tx"
    a.execute("commit")
    assert b.wait_exit(5), "lokadb did not exit after the transaction ended"


def test_shutdown_with_an_unknown_argument_is_a_syntax_error(bouncer):
    res = bouncer.admin_result("SHUTDOWN BOGUS")
    assert res.error is not None, f"SHUTDOWN BOGUS succeeded: {res.tags}"
    assert_error(res.error, "42601")
    time.sleep(0.2)
    assert_serves(bouncer)


# -------------------------------------------------------------- 4. KILL/RESUME --

def test_kill_without_argument_then_resume_without_argument_serves_every_database(bouncer):
    a = bouncer.connect("p0")
    c = bouncer.connect("p1")
    backend_pid(a)
    backend_pid(c)
    res = bouncer.admin_result("KILL")
    assert res.error is None, res.error
    assert res.tags == ["KILL"]
    for conn in (a, c):
        with pytest.raises(psycopg.OperationalError):
            conn.execute("select 1")
    waiting = query_in_background(bouncer, "p2", sql="select current_database()")
    assert_blocked(waiting, 0.5)
    res = bouncer.admin_result("RESUME")
    assert res.error is None, res.error
    assert res.tags == ["RESUME"]
    assert waiting.result(5 * SLOW) == "p2"
    for db in bouncer.databases:
        def works(db=db):
            with bouncer.connect(db, connect_timeout=int(3 * SLOW)) as conn:
                return conn.execute("select 1").fetchone()[0] == 1
        wait_until(works, 5 * SLOW, interval=0.1, what=f"a new client of {db} after RESUME")
    assert bouncer.alive()


# --------------------------------------------------- 5. waiting client leaves --

def test_waiting_client_that_disconnects_leaves_the_pool_at_once(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "query_wait_timeout": 20})
    holder = b.connect("p0")
    holder.execute("begin")
    holder.execute("select 1")
    w = b.login("p0")
    w.send_msg(b"Q", b"select 1\0")
    wait_until(lambda: cl_waiting(b, "p0", "trustuser") == 1, 3 * SLOW,
               what="SHOW POOLS cl_waiting = 1")
    # vanish without Terminate: only EOF tells lokadb
    w.logged_in = False
    w.sock.shutdown(socket.SHUT_RDWR)
    w.close()
    start = time.monotonic()
    wait_until(lambda: cl_waiting(b, "p0", "trustuser") == 0, 1.5 * SLOW, interval=0.05,
               what="SHOW POOLS cl_waiting to go back to 0")
    assert time.monotonic() - start < 1.5 * SLOW
    assert len(b.clients("p0")) == 1, b.clients("p0")
    holder.execute("commit")
    assert holder.execute("select 2").fetchone()[0] == 2


# ------------------------------------------------------------- 6. SHOW STATS --

def test_show_stats_counts_transactions_and_queries_with_plausible_times(bouncer):
    before = stats_row(bouncer, "p1")
    t0 = time.monotonic()
    w = bouncer.login("p1")
    for _ in range(3):
        w.query("select 1")
    for sql in ("begin", "select 1", "select 2", "commit"):
        w.query(sql)
    w.close()
    xacts, queries = 4, 7

    def counted():
        s = stats_row(bouncer, "p1")
        return s if s["total_xact_count"] - before["total_xact_count"] >= xacts else None
    after = wait_until(counted, 3 * SLOW, what="SHOW STATS to count the transactions")
    wall_us = (time.monotonic() - t0) * 1e6
    d = {k: after[k] - before[k] for k in after if k != "database"}
    assert d["total_xact_count"] == xacts, d
    assert d["total_query_count"] == queries, d
    assert 0 < d["total_xact_time"] < wall_us * xacts, (d, wall_us)
    assert 0 < d["total_query_time"] < wall_us * queries, (d, wall_us)
    assert d["total_query_time"] < wall_us, (d, wall_us)


def test_show_stats_xact_time_leaves_out_idle_time_between_transactions(bouncer):
    before = stats_row(bouncer, "p1")
    w = bouncer.login("p1")
    for _ in range(3):
        time.sleep(0.5)
        w.query("select 1")
    w.close()
    after = wait_until(lambda: (s := stats_row(bouncer, "p1"))["total_xact_count"]
                       - before["total_xact_count"] >= 3 and s, 3 * SLOW,
                       what="SHOW STATS to count the transactions")
    xact_us = after["total_xact_time"] - before["total_xact_time"]
    query_us = after["total_query_time"] - before["total_query_time"]
    # three "select 1" take milliseconds; 1.5 s of idle client time is not transaction time
    assert 0 < query_us < 300_000 * SLOW, query_us
    assert 0 < xact_us < 300_000 * SLOW, \
        f"total_xact_time grew by {xact_us} us for three idle-separated 'select 1'"


# ------------------------------------------- 7./8. per-user and per-db limits --

def test_max_user_connections_makes_a_second_session_wait_until_the_first_leaves(bouncer_factory):
    b = bouncer_factory(users={"trustuser": "max_user_connections=1"})
    a = b.connect("p0")
    pid = backend_pid(a)
    call = query_in_background(b, "p0")
    assert_blocked(call)
    assert cl_waiting(b, "p0", "trustuser") == 1
    assert len(b.servers("p0")) == 1
    a.close()
    assert call.result(5 * SLOW) == pid


def test_max_user_connections_frees_an_idle_server_of_another_database(bouncer_factory):
    # PgBouncer closes an idle server of the user to make room for a waiting client
    b = bouncer_factory(users={"trustuser": "max_user_connections=1"})
    a = b.connect("p0")
    backend_pid(a)
    call = query_in_background(b, "p1", sql="select current_database()")
    assert_blocked(call)
    a.close()
    assert call.result(5 * SLOW) == "p1"


def test_max_db_connections_makes_a_second_user_of_the_database_wait(bouncer_factory, pg):
    b = bouncer_factory(databases={
        "pdb": f"host={pg.host} port={pg.port} dbname=p2 max_db_connections=1"})
    a = b.connect("pdb", "pooluser1", password=USERS["pooluser1"]["password"])
    backend_pid(a)
    call = query_in_background(b, "pdb", "pooluser2", sql="select current_user")
    assert_blocked(call)
    assert len(b.servers("pdb")) == 1
    a.close()
    assert call.result(5 * SLOW) == "pooluser2"


# ------------------------------------------------------------ 9. connect_query --

def test_connect_query_runs_on_each_new_server_connection(bouncer_factory, pg):
    cq = "connect_query='select set_config(''lokadb_test.x'', ''42'', false)'"
    b = bouncer_factory(databases={"pcq": f"host={pg.host} port={pg.port} dbname=p0 {cq}"})
    with b.connect("pcq") as c:
        assert c.execute("select current_setting('lokadb_test.x', true)").fetchone()[0] == "42"
    # a database without connect_query does not get the setting
    with b.connect("p0") as c:
        assert c.execute("select current_setting('lokadb_test.x', true)").fetchone()[0] in (None, "")
    assert b.alive()


# ------------------------------------------------------ 10. server_reset_query --

def leave_session_state(b):
    with b.connect("p0") as c:
        pid = backend_pid(c)
        c.execute("select set_config('lokadb_test.y', '7', false)")
        c.execute("create temp table reset_probe (a int)")
    return pid


def session_state_seen(c):
    guc = c.execute("select current_setting('lokadb_test.y', true)").fetchone()[0]
    tables = c.execute("select count(*) from pg_class where relname = 'reset_probe' "
                       "and relpersistence = 't'").fetchone()[0]
    return guc, tables


def test_server_reset_query_discards_session_state_before_the_next_client(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "server_reset_query": "DISCARD ALL"})
    pid = leave_session_state(b)
    with b.connect("p0") as c:
        assert backend_pid(c) == pid, "the next client did not get the same server"
        guc, tables = session_state_seen(c)
    assert guc in (None, ""), f"custom GUC survived DISCARD ALL: {guc!r}"
    assert tables == 0, "temp table survived DISCARD ALL"


def test_empty_server_reset_query_keeps_session_state_for_the_next_client(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "server_reset_query": ""})
    pid = leave_session_state(b)
    with b.connect("p0") as c:
        assert backend_pid(c) == pid, "the next client did not get the same server"
        guc, tables = session_state_seen(c)
    assert guc == "7", f"without a reset query the GUC should stay, got {guc!r}"
    assert tables == 1, "without a reset query the temp table should stay"


# ---------------------------------------------------------- 11. statement mode --

def test_statement_mode_runs_single_statements_and_refuses_transaction_blocks(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "statement", "default_pool_size": 1})
    a = b.login("p0")
    c = b.login("p0")
    pids = {a.scalar("select pg_backend_pid()"), c.scalar("select pg_backend_pid()"),
            a.scalar("select pg_backend_pid()")}
    assert len(pids) == 1, "statement mode should share the one server"
    assert a.query("select 1; select 2").rows == [["1"], ["2"]]
    a.send_msg(b"Q", b"begin\0")
    err, _ = read_until_error_or_close(a, 5)
    assert err is not None, "BEGIN in statement mode: connection closed without an error"
    assert_error(err, "08P01", "transaction blocks not allowed")
    assert "statement pooling" in err.message.lower(), err.fields
    # the server does not carry the open transaction to the next client
    res = c.query("select 3")
    assert res.rows == [["3"]]
    assert res.messages[-1] == (b"Z", b"I"), res.messages[-1]
    assert b.alive()


# ------------------------------------------------------ 12. console size limit --

def test_console_query_over_64_kb_gets_54000_and_lokadb_stays_up(bouncer):
    w = bouncer.wire()
    w.login("admin", ADMIN_DB, "adminpw")
    sql = b"SHOW VERSION" + b" " * (70 * 1024) + b"\0"
    msg = message(b"Q", sql)
    # the header tells the size: send a first part only, so that lokadb's
    # reply is not lost to a TCP reset over unread bytes
    w.send(msg[:4096])
    kind, fields = w.outcome(5)
    assert kind == "error", f"expected an ErrorResponse, got {kind} {fields!r}"
    assert_error(fields, "54000")
    with pytest.raises((EOFError, socket.timeout, OSError)):
        w.read_msg(timeout=2)
    assert bouncer.alive()
    assert bouncer.admin("SHOW VERSION")
    assert_serves(bouncer)


def test_console_query_sent_whole_over_64_kb_does_not_hurt_lokadb(bouncer):
    w = bouncer.wire()
    w.login("admin", ADMIN_DB, "adminpw")
    try:
        w.send(message(b"Q", b"SHOW VERSION" + b" " * (70 * 1024) + b"\0"))
    except OSError:
        pass            # lokadb may close while we are still sending
    kind, fields = w.outcome(5)
    if kind == "error":
        assert_error(fields, "54000")
    else:
        assert kind == "closed", f"expected an error or a close, got {kind} {fields!r}"
    assert bouncer.alive()
    assert bouncer.admin("SHOW VERSION")


def test_console_query_just_under_64_kb_is_accepted(bouncer):
    with bouncer.wire() as w:
        w.login("admin", ADMIN_DB, "adminpw")
        res = w.query("SHOW VERSION" + " " * (60 * 1024), raise_error=False)
    assert res.error is None, res.error
    assert len(res.rows) == 1


# -------------------------------------------------- 13. SHOW CLIENTS local_* --

def test_show_clients_local_addr_and_port_are_the_listening_address(bouncer):
    c = bouncer.connect("p0")
    backend_pid(c)
    rows = bouncer.clients("p0")
    assert len(rows) == 1, rows
    r = rows[0]
    assert r["local_addr"] == "127.0.0.1", r
    assert r["local_port"] == str(bouncer.port), r
    assert r["addr"] == "127.0.0.1", r
    assert r["port"] == str(client_port(c)), r


def client_port(conn):
    """The local TCP port of a psycopg connection."""
    s = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        return s.getsockname()[1]
    finally:
        s.close()


def test_forced_user_without_password_logs_in_with_its_auth_file_secret(bouncer_factory, pg):
    # md5user has no password= in this entry: lokadb must take it from the auth_file
    dbs = {name: None for name in ("p0_trust", "p0_md5", "p0_scram", "p0_clear")}
    dbs["pforced"] = f"host=127.0.0.1 port={pg.port} dbname=p0 user=md5user"
    b = bouncer_factory(databases=dbs)
    c = b.connect("pforced")
    assert c.execute("select current_user").fetchone()[0] == "md5user"


def test_server_check_query_runs_on_a_connection_idle_longer_than_server_check_delay(bouncer_factory):
    check = "select set_config('lokadb_test.checked', 'yes', false)"
    # pool size 1: no second server may be launched (and win the client) while the check runs
    b = bouncer_factory(settings={"server_check_delay": "0.3", "server_check_query": check,
                                  "pool_mode": "transaction", "default_pool_size": 1})
    c = b.connect("p0")
    pid, before = c.execute("select pg_backend_pid(), current_setting('lokadb_test.checked', true)").fetchone()
    assert before in (None, "")          # a fresh connection is not checked
    time.sleep(0.8)
    pid2, after = c.execute("select pg_backend_pid(), current_setting('lokadb_test.checked', true)").fetchone()
    assert pid2 == pid and after == "yes", "the idle server was reused without server_check_query"


def test_failed_server_check_query_replaces_the_connection(bouncer_factory):
    b = bouncer_factory(settings={"server_check_delay": "0", "server_check_query": "select no_such_column",
                                  "pool_mode": "transaction"})
    c = b.connect("p0")
    first = c.execute("select pg_backend_pid()").fetchone()[0]
    second = c.execute("select pg_backend_pid()").fetchone()[0]
    assert first != second, "a server whose check failed was handed out again"
    b.wait_log("query of the pooler failed")


def test_application_name_add_host_appends_the_client_address(bouncer_factory):
    b = bouncer_factory(settings={"application_name_add_host": "1"})
    c = b.connect("p0", application_name="app1")
    name = c.execute("show application_name").fetchone()[0]
    assert name.startswith("app1 - 127.0.0.1:"), name


def test_disable_pqexec_closes_a_client_that_sends_a_query_message(bouncer_factory):
    b = bouncer_factory(settings={"disable_pqexec": 1})
    with b.connect(prepare_threshold=0) as c:            # extended protocol only: served
        assert c.execute("select %s::int + 1", (41,), prepare=True).fetchone()[0] == 42
    with b.connect() as c:
        with pytest.raises(psycopg.OperationalError, match="PQexec disallowed"):
            c.execute("select 1")                        # no parameters: a Query message
    assert b.admin("SHOW VERSION")                       # the console keeps the simple protocol


def test_autodb_idle_timeout_closes_the_servers_of_an_unused_star_database(bouncer_factory, pg):
    """p3 comes from the `*` entry: once no client used it for
    autodb_idle_timeout its server connections close (server_idle_timeout
    alone would keep them for an hour); p0 (listed) keeps its own; a client
    coming back to p3 is served again."""
    b = bouncer_factory(settings={"autodb_idle_timeout": "1s", "server_idle_timeout": 3600},
                        databases={"p3": None, "*": f"host={pg.host} port={pg.port}"})

    def servers(db):
        return [r for r in b.admin_dicts("SHOW SERVERS") if r["database"] == db]

    for db in ("p3", "p0"):
        with b.connect(db) as c:
            assert c.execute("select current_database()").fetchone()[0] == db
    assert servers("p3") and servers("p0")
    wait_until(lambda: not servers("p3"), 10 * SLOW, what="p3's servers closed")
    assert servers("p0")
    b.wait_log("autodb_idle_timeout")
    with b.connect("p3") as c:
        assert c.execute("select current_database()").fetchone()[0] == "p3"
