# SPDX-License-Identifier: ISC
"""Console parity with PgBouncer (issue 6): SHOW STATS_TOTALS, STATS_AVERAGES,
TOTALS, MEM, DNS_HOSTS, DNS_ZONES, SOCKETS, ACTIVE_SOCKETS, and the commands
KILL_CLIENT, WAIT_CLOSE, SUSPEND/RESUME, DISABLE and ENABLE."""

import threading
import time

import psycopg
import pytest

from lokadb_harness import (ADMIN_DB, SLOW, BgCall, PgError, assert_error, backend_pid,
                            parse_error_fields, wait_until)
from test_admin import SOCKET_COLUMNS, assert_console_error

DEBUG_COLUMNS = ["recv_pos", "pkt_pos", "pkt_remain", "send_pos", "send_remain", "pkt_avail",
                 "send_avail"]
COUNTERS = ["server_assignment_count", "xact_count", "query_count", "bytes_received",
            "bytes_sent", "xact_time", "query_time", "wait_time"]

# PgBouncer 1.24's columns of the new views.
NEW_VIEWS = {
    "STATS_TOTALS": ["database"] + COUNTERS + ["client_parse_count", "server_parse_count",
                                                "bind_count"],
    "STATS_AVERAGES": ["database"] + COUNTERS + ["avg_client_parse_count",
                                                  "avg_server_parse_count", "avg_bind_count"],
    "TOTALS": ["name", "value"],
    "MEM": ["name", "size", "used", "free", "memtotal"],
    "DNS_HOSTS": ["hostname", "ttl", "addrs"],
    "DNS_ZONES": ["zonename", "serial", "count"],
    "SOCKETS": SOCKET_COLUMNS + DEBUG_COLUMNS,
    "ACTIVE_SOCKETS": SOCKET_COLUMNS + DEBUG_COLUMNS,
}

TOTALS_NAMES = ["server_assignment_count", "xact_count", "query_count", "client_bytes",
                "server_bytes", "xact_time", "query_time", "wait_time", "ps_client_parse_count",
                "ps_server_parse_count", "ps_bind_count"]


def by_name(rows, key="database"):
    return {r[key]: r for r in rows}


def client_id(b, application_name):
    rows = [r for r in b.admin_dicts("SHOW CLIENTS") if r["application_name"] == application_name]
    assert len(rows) == 1, rows
    return rows[0]["id"]


# ------------------------------------------------------------ the views --

@pytest.mark.parametrize("view", sorted(NEW_VIEWS))
def test_new_views_have_pgbouncers_columns(bouncer, view):
    assert bouncer.admin_columns(f"SHOW {view}") == NEW_VIEWS[view]
    # stats_users may read every view
    res = bouncer.admin_result(f"SHOW {view}", user="stats")
    assert res.error is None, res.error


def test_stats_totals_averages_and_totals_agree_with_show_stats(bouncer_factory):
    b = bouncer_factory(settings={"stats_period": 1, "pool_mode": "transaction"})
    with b.connect("p1") as c:
        for _ in range(20):
            c.execute("select 1")
    with b.connect("p2") as c:
        for _ in range(3):
            c.execute("select 1")

    def counted():
        rows = by_name(b.admin_dicts("SHOW STATS_TOTALS"))
        return int(rows["p1"]["query_count"]) >= 20 and int(rows["p2"]["query_count"]) >= 3
    wait_until(counted, 5 * SLOW, what="SHOW STATS_TOTALS to count the queries")

    totals = by_name(b.admin_dicts("SHOW STATS_TOTALS"))
    stats = by_name(b.admin_dicts("SHOW STATS"))
    assert set(totals) == set(stats)
    for db, row in totals.items():
        for col in ("server_assignment_count", "xact_count", "query_count", "xact_time",
                    "query_time", "wait_time"):
            assert row[col] == stats[db]["total_" + col], (db, col)
        assert row["bytes_received"] == stats[db]["total_received"]
        assert row["bytes_sent"] == stats[db]["total_sent"]
    assert int(totals["p1"]["query_count"]) >= 20 and int(totals["p1"]["bytes_sent"]) > 0
    assert int(totals["p2"]["bytes_received"]) > 0 and int(totals["p0"]["query_count"]) == 0

    # SHOW TOTALS: one (name, value) row per counter, summed over every database
    t = dict(b.admin("SHOW TOTALS"))
    assert list(t) == ["total_" + n for n in TOTALS_NAMES] + ["avg_" + n for n in TOTALS_NAMES]
    assert int(t["total_query_count"]) == sum(int(r["total_query_count"]) for r in stats.values())
    assert int(t["total_client_bytes"]) == sum(int(r["total_received"]) for r in stats.values())
    assert int(t["total_server_bytes"]) == sum(int(r["total_sent"]) for r in stats.values())
    assert int(t["total_query_count"]) >= 23

    # STATS_AVERAGES is SHOW STATS' avg_ half: seen while p1 is busy, so the rates are not 0
    stop = threading.Event()

    def load():
        with b.connect("p1") as c:
            while not stop.is_set():
                c.execute("select 1")
                time.sleep(0.005)
    th = threading.Thread(target=load, daemon=True)
    th.start()
    try:
        def averages_match():
            avg = by_name(b.admin_dicts("SHOW STATS_AVERAGES"))["p1"]
            st = by_name(b.admin_dicts("SHOW STATS"))["p1"]
            if int(avg["query_count"]) == 0:
                return False
            return (avg["query_count"] == st["avg_query_count"]
                    and avg["xact_count"] == st["avg_xact_count"]
                    and avg["bytes_received"] == st["avg_recv"]
                    and avg["bytes_sent"] == st["avg_sent"]
                    and avg["query_time"] == st["avg_query_time"])
        wait_until(averages_match, 10 * SLOW, interval=0.2,
                   what="SHOW STATS_AVERAGES to show p1's rates as SHOW STATS does")
        t = dict(b.admin("SHOW TOTALS"))
        assert int(t["avg_query_count"]) > 0 or int(t["total_query_count"]) > 23
    finally:
        stop.set()
        th.join(10)


def test_show_mem_counts_live_objects(bouncer):
    def mem():
        return by_name(bouncer.admin_dicts("SHOW MEM"), "name")

    before = mem()
    assert set(before) == {"user_cache", "db_cache", "pool_cache", "server_cache", "client_cache"}
    for name, r in before.items():
        assert int(r["size"]) > 0
        assert int(r["free"]) == 0 or (name == "client_cache" and int(r["free"]) <= 64)
        assert int(r["memtotal"]) == int(r["size"]) * (int(r["used"]) + int(r["free"]))
    lists = dict(bouncer.admin("SHOW LISTS"))
    assert int(before["db_cache"]["used"]) == int(lists["databases"])
    assert int(before["pool_cache"]["used"]) == int(lists["pools"])

    conns = [bouncer.connect("p0", application_name=f"mem{i}") for i in range(3)]
    for c in conns:
        backend_pid(c)                       # session mode: one server each
    during = mem()
    assert int(during["client_cache"]["used"]) >= int(before["client_cache"]["used"]) + 3
    assert int(during["server_cache"]["used"]) >= int(before["server_cache"]["used"]) + 3
    for c in conns:
        c.close()
    wait_until(lambda: int(mem()["client_cache"]["used"]) <= int(during["client_cache"]["used"]) - 3,
               5 * SLOW, what="SHOW MEM to count the closed clients out")
    # their objects are kept for the next clients
    after = mem()["client_cache"]
    assert int(after["free"]) >= int(during["client_cache"]["free"]) + 3
    assert int(after["memtotal"]) == int(after["size"]) * (int(after["used"]) + int(after["free"]))


def test_dns_zones_is_empty_and_dns_hosts_shows_the_resolver_cache(bouncer_factory, pg):
    b = bouncer_factory(databases={"pdns": f"host=localhost port={pg.port} dbname=p0"},
                        settings={"server_connect_timeout": 2})
    assert b.admin("SHOW DNS_ZONES") == []
    # a login to pdns makes lokadb resolve "localhost" (numeric hosts never reach the resolver)
    w = b.wire(timeout=10)
    try:
        w.login("trustuser", "pdns", raise_error=False)
    except (EOFError, OSError):
        pass
    def cached():
        rows = by_name(b.admin_dicts("SHOW DNS_HOSTS"), "hostname")
        return rows.get("localhost")
    row = wait_until(cached, 10 * SLOW, what="localhost in SHOW DNS_HOSTS")
    assert row["addrs"] in ("127.0.0.1", "::1"), row
    assert 0 <= int(row["ttl"]) <= 15
    assert int(dict(b.admin("SHOW LISTS"))["dns_names"]) >= 1


def test_sockets_lists_clients_and_servers_with_buffer_columns(bouncer):
    c = bouncer.connect("p0", application_name="sockidle")
    backend_pid(c)
    cid = client_id(bouncer, "sockidle")
    sql = "SHOW SOCKETS"
    w = bouncer.login(ADMIN_DB, "admin")
    res = w.query(sql)
    rows = [dict(zip(res.columns, r)) for r in res.rows]
    mine = [r for r in rows if r["id"] == cid]
    assert len(mine) == 1
    assert mine[0]["type"] == "C" and mine[0]["state"] == "cl_active"
    assert mine[0]["database"] == "p0"
    assert all(mine[0][k] == "0" for k in DEBUG_COLUMNS), mine[0]
    servers = [r for r in rows if r["type"] == "S" and r["database"] == "p0"]
    assert [s["state"] for s in servers] == ["sv_active"]
    assert servers[0]["link"] == mine[0]["ptr"]
    # the console session itself: its Query body is still in its input buffer
    me = [r for r in rows if r["type"] == "C" and r["database"] == ADMIN_DB]
    assert len(me) == 1, me
    assert int(me[0]["recv_pos"]) == len(sql) + 1 == int(me[0]["pkt_avail"])

    # ACTIVE_SOCKETS: only connections with buffered data; the idle client is not one
    res = w.query("SHOW ACTIVE_SOCKETS")
    rows = [dict(zip(res.columns, r)) for r in res.rows]
    assert cid not in [r["id"] for r in rows]
    me = [r for r in rows if r["database"] == ADMIN_DB]
    assert len(me) == 1 and int(me[0]["pkt_avail"]) == len("SHOW ACTIVE_SOCKETS") + 1


def test_active_sockets_shows_output_queued_for_a_client_that_does_not_read(bouncer):
    w = bouncer.login("p0", params={"application_name": "slowreader"})
    cid = client_id(bouncer, "slowreader")
    # ~64 MB of rows that the client never reads: lokadb's output to it backs up
    w.send_msg(b"Q", b"select repeat('x', 1048576) from generate_series(1, 64)\0")

    def queued():
        rows = [r for r in bouncer.admin_dicts("SHOW ACTIVE_SOCKETS") if r["id"] == cid]
        return rows and int(rows[0]["send_avail"]) > 0 and rows[0]
    row = wait_until(queued, 10 * SLOW, interval=0.1,
                     what="the slow reader's queued output in SHOW ACTIVE_SOCKETS")
    assert row["send_remain"] == row["send_avail"] and row["state"] == "cl_active"
    w.close()


# -------------------------------------------------------- KILL_CLIENT --

def test_kill_client_closes_only_that_client(bouncer):
    victim = bouncer.connect("p0", application_name="victim")
    other = bouncer.connect("p0", application_name="bystander")
    backend_pid(victim)
    backend_pid(other)
    vid = client_id(bouncer, "victim")
    res = bouncer.admin_result(f"KILL_CLIENT {vid}")
    assert res.error is None and res.tags == ["KILL_CLIENT"], res.error
    with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
        victim.execute("select 1")
    assert other.execute("select 1").fetchone()[0] == 1
    assert vid not in [r["id"] for r in bouncer.admin_dicts("SHOW CLIENTS")]
    assert_console_error(bouncer.admin_result(f"KILL_CLIENT {vid}"), "42704")


def test_kill_client_errors(bouncer):
    err = assert_console_error(bouncer.admin_result("KILL_CLIENT 987654321"), "42704")
    assert "client not found" in err.message
    assert_console_error(bouncer.admin_result("KILL_CLIENT abc"), "22023")
    assert_console_error(bouncer.admin_result("KILL_CLIENT -1"), "22023")
    assert_console_error(bouncer.admin_result("KILL_CLIENT"), "42601")
    c = bouncer.connect("p0", application_name="safe")
    assert_console_error(bouncer.admin_result(f"KILL_CLIENT {client_id(bouncer, 'safe')}",
                                              user="stats"), "42501")
    assert c.execute("select 1").fetchone()[0] == 1


def test_kill_client_of_the_own_console_session_closes_it(bouncer):
    w = bouncer.login(ADMIN_DB, "admin", params={"application_name": "selfkill"})
    res = w.query("SHOW CLIENTS")
    me = [dict(zip(res.columns, r)) for r in res.rows]
    me = [r for r in me if r["application_name"] == "selfkill"]
    assert len(me) == 1
    w.send_msg(b"Q", f"KILL_CLIENT {me[0]['id']}".encode() + b"\0")
    msgs = w.wait_closed(5)
    errors = [PgError(parse_error_fields(p)) for t, p in msgs if t == b"E"]
    assert errors and errors[0].sqlstate == "57P01", msgs
    assert bouncer.alive()
    assert bouncer.admin("SHOW VERSION")


# --------------------------------------------------------- WAIT_CLOSE --

def test_wait_close_answers_once_marked_servers_are_gone(bouncer_factory, pg):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    res = b.admin_result("WAIT_CLOSE")
    assert res.error is None and res.tags == ["WAIT_CLOSE"]    # nothing marked: at once
    c = b.connect("p0", autocommit=False)
    first = backend_pid(c)                  # in a transaction: the server stays linked
    b.admin("RECONNECT p0")
    assert [s["close_needed"] for s in b.servers("p0")] == ["1"]
    # another database has nothing marked
    assert b.admin_result("WAIT_CLOSE p1").tags == ["WAIT_CLOSE"]
    call = BgCall(b.admin_result, "WAIT_CLOSE p0", timeout=20)
    call_all = BgCall(b.admin_result, "WAIT_CLOSE", timeout=20)
    assert not call.wait(1.0), "WAIT_CLOSE answered while a marked server was still in use"
    assert not call_all.done()
    c.commit()                              # released with close_needed: closed
    res = call.result(5 * SLOW)
    assert res.error is None and res.tags == ["WAIT_CLOSE"], res.error
    res = call_all.result(5 * SLOW)
    assert res.error is None and res.tags == ["WAIT_CLOSE"], res.error
    assert all(s["close_needed"] == "0" for s in b.servers())
    wait_until(lambda: not pg.backend_alive(first), 5 * SLOW, what="the old backend to exit")
    assert backend_pid(c) != first
    c.commit()


def test_wait_close_errors(bouncer):
    assert_console_error(bouncer.admin_result("WAIT_CLOSE nosuchdb"), "3D000")
    assert_console_error(bouncer.admin_result("WAIT_CLOSE p0 p1"), "42601")
    assert_console_error(bouncer.admin_result("WAIT_CLOSE", user="stats"), "42501")


def test_console_session_waiting_in_wait_close_can_go_away(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    c = b.connect("p0", autocommit=False)
    backend_pid(c)
    b.admin("RECONNECT p0")
    w = b.login(ADMIN_DB, "admin")
    w.send_msg(b"Q", b"WAIT_CLOSE p0\0")
    time.sleep(0.5)
    w.close()                               # gone before its answer
    c.commit()
    wait_until(lambda: all(s["close_needed"] == "0" for s in b.servers()), 5 * SLOW,
               what="the marked server to go")
    # PAUSE still answers as PAUSE afterwards
    res = b.admin_result("PAUSE p0")
    assert res.error is None and res.tags == ["PAUSE"]
    b.admin("RESUME")
    assert b.alive()


# ------------------------------------------------------------ SUSPEND --

def test_suspend_stops_all_traffic_until_resume_and_nothing_is_lost(bouncer):
    """SUSPEND (PgBouncer's): answered once every buffer is flushed; then no
    connection but the consoles' is read and nothing new is accepted: a query
    sent meanwhile and a new login wait (they do not fail) and go on at
    RESUME, with their results."""
    b = bouncer
    assert_console_error(b.admin_result("SUSPEND", user="stats"), "42501")
    c = b.connect("p0")
    assert c.execute("select 1").fetchone()[0] == 1
    con = b.login(ADMIN_DB, "admin")                 # the console stays usable while suspended
    res = con.query("SUSPEND", raise_error=False)
    assert res.error is None and res.tags == ["SUSPEND"]
    assert dict(con.query("SHOW STATE").rows)["suspended"] == "yes"
    assert_error(con.query("SUSPEND", raise_error=False).error, "55000", "already suspended")
    q = BgCall(lambda: c.execute("select 40 + 2").fetchone()[0])
    login = BgCall(lambda: b.connect("p1").execute("select current_database()").fetchone()[0])
    time.sleep(1.0)
    assert not q.done() and not login.done()         # both wait, neither fails
    res = con.query("RESUME", raise_error=False)
    assert res.error is None and res.tags == ["RESUME"]
    assert q.result(10 * SLOW) == 42
    assert login.result(10 * SLOW) == "p1"
    assert dict(con.query("SHOW STATE").rows)["suspended"] == "no"
    con.close()
    assert b.admin_result("SHOW VERSION").error is None   # new console logins again


# ---------------------------------------------------- DISABLE / ENABLE --

def test_disable_refuses_new_logins_and_enable_undoes_it(bouncer):
    old = bouncer.connect("p0")
    backend_pid(old)
    res = bouncer.admin_result("DISABLE p0")
    assert res.error is None and res.tags == ["DISABLE"], res.error
    dbs = by_name(bouncer.admin_dicts("SHOW DATABASES"), "name")
    assert dbs["p0"]["disabled"] == "1" and dbs["p1"]["disabled"] == "0"
    err = bouncer.login_error("p0")
    assert_error(err, "08P01", "database does not allow connections: p0")
    assert err.severity == "FATAL"
    with pytest.raises(psycopg.OperationalError, match="database does not allow connections: p0"):
        bouncer.connect("p0")
    assert old.execute("select 1").fetchone()[0] == 1        # clients already in stay
    with bouncer.connect("p1") as c:                          # other databases are not touched
        assert c.execute("select 1").fetchone()[0] == 1
    bouncer.admin("DISABLE p0")                               # twice is fine
    res = bouncer.admin_result("ENABLE p0")
    assert res.error is None and res.tags == ["ENABLE"], res.error
    assert by_name(bouncer.admin_dicts("SHOW DATABASES"), "name")["p0"]["disabled"] == "0"
    with bouncer.connect("p0") as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_disable_and_enable_errors(bouncer):
    for cmd in ("DISABLE", "ENABLE"):
        err = assert_console_error(bouncer.admin_result(cmd), "42601")
        assert "a database is required" in err.message
        assert_console_error(bouncer.admin_result(f"{cmd} nosuchdb"), "3D000")
        assert_console_error(bouncer.admin_result(f"{cmd} p0 p1"), "42601")
        assert_console_error(bouncer.admin_result(f"{cmd} p0", user="stats"), "42501")
    assert by_name(bouncer.admin_dicts("SHOW DATABASES"), "name")["p0"]["disabled"] == "0"
    with bouncer.connect("p0") as c:
        assert c.execute("select 1").fetchone()[0] == 1


# -------------------------------------------------------------- HELP --

def test_show_help_lists_the_new_views_and_commands(bouncer):
    res = bouncer.admin_result("SHOW HELP")
    assert res.error is None, res.error
    text = " ".join(n.get("M", "") for n in res.notices).upper()
    for word in ("STATS_TOTALS", "STATS_AVERAGES", "TOTALS", "MEM", "DNS_HOSTS", "DNS_ZONES",
                 "ACTIVE_SOCKETS", "KILL_CLIENT", "WAIT_CLOSE", "DISABLE", "ENABLE"):
        assert word in text, word
