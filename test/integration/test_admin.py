# SPDX-License-Identifier: ISC
"""The admin console (dbname lokadb / pgbouncer): SHOW columns as in
PgBouncer 1.24, SET, PAUSE/RESUME, RECONNECT, KILL, RELOAD, SHUTDOWN, and
who may do what."""

import subprocess

import psycopg
import pytest

from lokadb_harness import (ADMIN_DB, PSQL, SLOW, BgCall, PgError, assert_error, assert_serves,
                            backend_pid, wait_until)

SOCKET_COLUMNS = ["type", "user", "database", "replication", "state", "addr", "port",
                  "local_addr", "local_port", "connect_time", "request_time", "wait", "wait_us",
                  "close_needed", "ptr", "link", "remote_pid", "tls", "application_name",
                  "prepared_statements", "id"]

# PgBouncer 1.24 columns; `optional` are later additions (1.25) we also accept.
SHOW_COLUMNS = {
    "POOLS": (["database", "user", "cl_active", "cl_waiting", "cl_active_cancel_req",
               "cl_waiting_cancel_req", "sv_active", "sv_active_cancel", "sv_being_canceled",
               "sv_idle", "sv_used", "sv_tested", "sv_login", "maxwait", "maxwait_us",
               "pool_mode"], {"load_balance_hosts"}),
    "CLIENTS": (SOCKET_COLUMNS, set()),
    "SERVERS": (SOCKET_COLUMNS, set()),
    "STATS": (["database",
               "total_server_assignment_count", "total_xact_count", "total_query_count",
               "total_received", "total_sent", "total_xact_time", "total_query_time",
               "total_wait_time", "total_client_parse_count", "total_server_parse_count",
               "total_bind_count",
               "avg_server_assignment_count", "avg_xact_count", "avg_query_count", "avg_recv",
               "avg_sent", "avg_xact_time", "avg_query_time", "avg_wait_time",
               "avg_client_parse_count", "avg_server_parse_count", "avg_bind_count"],
              {"total_client_login_count", "avg_client_login_count"}),
    "DATABASES": (["name", "host", "port", "database", "force_user", "pool_size",
                   "min_pool_size", "reserve_pool_size", "server_lifetime", "pool_mode",
                   "max_connections", "current_connections", "max_client_connections",
                   "current_client_connections", "paused", "disabled"], {"load_balance_hosts"}),
    "USERS": (["name", "pool_size", "reserve_pool_size", "pool_mode", "max_user_connections",
               "current_connections", "max_user_client_connections",
               "current_client_connections"], set()),
    "CONFIG": (["key", "value", "default", "changeable"], set()),
    "LISTS": (["list", "items"], set()),
    "VERSION": (["version"], set()),
    "STATE": (["key", "value"], set()),
}


def assert_console_error(res_or_err, sqlstates=None):
    err = res_or_err.error if hasattr(res_or_err, "error") else res_or_err
    assert err is not None, "expected an error from the console"
    code = err.sqlstate
    assert code and len(code) == 5, f"error without a SQLSTATE: {err.fields}"
    assert code != "42000" and not code.startswith("01"), code
    if sqlstates:
        assert_error(err, sqlstates)
    return err


# ------------------------------------------------------------------ SHOW --

@pytest.mark.parametrize("dbname", ["lokadb", "pgbouncer"])
def test_console_answers_under_both_database_names(bouncer, dbname):
    rows = bouncer.admin("SHOW VERSION", dbname=dbname)
    assert len(rows) == 1
    if ADMIN_DB == "lokadb":
        assert rows[0][0].lower().startswith("lokadb ")


@pytest.mark.parametrize("what", sorted(SHOW_COLUMNS))
def test_show_returns_pgbouncer_columns(bouncer, what):
    c = bouncer.connect("p0")
    backend_pid(c)
    expected, optional = SHOW_COLUMNS[what]
    cols = bouncer.admin_columns(f"SHOW {what}")
    assert [x for x in cols if x not in optional] == expected


def test_show_clients_servers_and_pools_describe_a_connected_client(bouncer):
    c = bouncer.connect("p0", application_name="showme")
    pid = backend_pid(c)
    clients = [r for r in bouncer.clients("p0") if r["user"] == "trustuser"]
    assert len(clients) == 1
    assert clients[0]["type"] == "C" and clients[0]["application_name"] == "showme"
    assert clients[0]["addr"] == "127.0.0.1"
    servers = bouncer.servers("p0")
    assert len(servers) == 1 and servers[0]["type"] == "S"
    assert int(servers[0]["remote_pid"]) == pid
    assert int(servers[0]["port"]) == bouncer.pg.port
    pools = [r for r in bouncer.admin_dicts("SHOW POOLS") if r["database"] == "p0"]
    assert len(pools) == 1 and pools[0]["user"] == "trustuser"
    assert int(pools[0]["cl_active"]) == 1 and int(pools[0]["sv_active"]) == 1
    assert pools[0]["pool_mode"] == "session"


def test_show_databases_lists_the_configured_entries(bouncer, pg):
    rows = {r["name"]: r for r in bouncer.admin_dicts("SHOW DATABASES")}
    for name in ("p0", "p1", "p2", "p3", "p0_md5", "p0_scram"):
        assert name in rows
    assert rows["p0"]["host"] == "127.0.0.1" and int(rows["p0"]["port"]) == pg.port
    assert rows["p0"]["database"] == "p0" and int(rows["p0"]["pool_size"]) == 5
    assert rows["p0_md5"]["force_user"] == "md5user"


def test_show_users_reports_users_section_overrides(bouncer_factory):
    b = bouncer_factory(users={"pooluser1": "pool_mode=transaction"})
    rows = {r["name"]: r for r in b.admin_dicts("SHOW USERS")}
    assert rows["pooluser1"]["pool_mode"] == "transaction"


def test_show_stats_counts_queries_of_a_database(bouncer):
    with bouncer.connect("p1") as c:
        for _ in range(5):
            c.execute("select 1")

    def counted():
        rows = [r for r in bouncer.admin_dicts("SHOW STATS") if r["database"] == "p1"]
        return rows and int(rows[0]["total_query_count"]) >= 5
    wait_until(counted, 3 * SLOW, what="SHOW STATS to count the p1 queries")


def test_show_lists_and_state_have_the_expected_rows(bouncer):
    lists = {r[0] for r in bouncer.admin("SHOW LISTS")}
    assert {"databases", "users", "pools"} <= lists
    state = dict(bouncer.admin("SHOW STATE"))
    assert state == {"active": "yes", "paused": "no", "suspended": "no"}


def test_show_config_has_defaults_and_set_changes_a_value(bouncer):
    cfg = bouncer.show_config()
    assert cfg["max_client_conn"]["value"] == "1000"
    assert cfg["max_client_conn"]["default"] == "1000"
    assert cfg["default_pool_size"]["value"] == "5"
    assert cfg["listen_port"]["changeable"] == "no"
    assert cfg["default_pool_size"]["changeable"] == "yes"
    bouncer.admin("SET default_pool_size = 7")
    assert bouncer.show_config()["default_pool_size"]["value"] == "7"


def test_set_of_an_unknown_key_is_an_error(bouncer):
    assert_console_error(bouncer.admin_result("SET no_such_setting = 1"))
    assert_console_error(bouncer.admin_result("SET default_pool_size = notanumber"))
    assert bouncer.show_config()["default_pool_size"]["value"] == "5"


def test_unknown_command_gets_an_error_and_the_console_keeps_working(bouncer):
    w = bouncer.login(ADMIN_DB, "admin")
    res = w.query("FROBNICATE ALL THE THINGS", raise_error=False)
    assert_console_error(res)
    res = w.query("SHOW NOSUCHTHING", raise_error=False)
    assert_console_error(res)
    assert w.query("SHOW VERSION").rows


def test_real_clients_can_read_the_console(bouncer):
    r = subprocess.run([PSQL, "-X", "-A", "-h", "127.0.0.1", "-p", str(bouncer.port), "-U", "admin",
                        "-d", ADMIN_DB, "-c", "SHOW POOLS", "-c", "SHOW CONFIG"],
                       capture_output=True, text=True, timeout=20 * SLOW)
    assert r.returncode == 0, r.stderr
    assert "cl_active" in r.stdout and "max_client_conn" in r.stdout
    with psycopg.connect(host="127.0.0.1", port=bouncer.port, dbname=ADMIN_DB, user="admin",
                         sslmode="disable", autocommit=True, connect_timeout=10,
                         cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.execute("SHOW DATABASES", prepare=False)
        assert "name" in [d.name for d in cur.description]
        assert any(r[0] == "p0" for r in cur.fetchall())


# ------------------------------------------------------------ privileges --

def test_stats_user_may_show_but_not_control(bouncer):
    assert bouncer.admin("SHOW POOLS", user="stats") is not None
    for cmd in ("PAUSE", "RELOAD", "SET default_pool_size = 9", "SHUTDOWN"):
        assert_console_error(bouncer.admin_result(cmd, user="stats"), "42501")
    assert bouncer.alive()
    assert bouncer.show_config()["default_pool_size"]["value"] == "5"
    assert dict(bouncer.admin("SHOW STATE"))["paused"] == "no"


def test_ordinary_user_cannot_use_the_console(bouncer):
    res = bouncer.admin_result("SHOW POOLS", user="trustuser")
    assert_console_error(res, ("28000", "42501"))


# --------------------------------------------------------- PAUSE/RESUME --

def test_pause_holds_queries_until_resume(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    c = b.connect("p0")
    backend_pid(c)
    b.admin("PAUSE")
    assert dict(b.admin("SHOW STATE"))["paused"] == "yes"
    call = BgCall(backend_pid, c)
    assert not call.wait(1.0), "a query ran while lokadb was paused"
    b.admin("RESUME")
    call.result(5 * SLOW)
    assert dict(b.admin("SHOW STATE"))["paused"] == "no"


def test_pause_and_resume_of_one_database(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    c0 = b.connect("p0")
    c1 = b.connect("p1")
    backend_pid(c0)
    b.admin("PAUSE p0")
    paused = {r["name"]: r["paused"] for r in b.admin_dicts("SHOW DATABASES")}
    assert paused["p0"] in ("1", "t", "true", "yes") and paused["p1"] in ("0", "f", "false", "no")
    call = BgCall(backend_pid, c0)
    assert backend_pid(c1)                     # p1 is not paused
    assert not call.wait(1.0), "a p0 query ran while p0 was paused"
    b.admin("RESUME p0")
    call.result(5 * SLOW)


def test_reconnect_replaces_server_connections(bouncer_factory, pg):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1})
    c = b.connect("p0")
    first = backend_pid(c)
    b.admin("RECONNECT p0")
    wait_until(lambda: backend_pid(c) != first, 5 * SLOW, interval=0.1,
               what="a new server connection after RECONNECT")
    wait_until(lambda: not pg.backend_alive(first), 5 * SLOW, what="the old backend to exit")


def test_kill_disconnects_the_clients_of_a_database(bouncer):
    c0 = bouncer.connect("p0")
    c1 = bouncer.connect("p1")
    backend_pid(c0)
    backend_pid(c1)
    bouncer.admin("KILL p0")
    with pytest.raises(psycopg.OperationalError):
        c0.execute("select 1")
    assert c1.execute("select 1").fetchone()[0] == 1
    assert bouncer.alive()


# ---------------------------------------------------------------- RELOAD --

def test_reload_picks_up_a_new_database_entry(bouncer):
    bouncer.write_ini(databases={"pnew": bouncer.server("p3")})
    bouncer.admin("RELOAD")
    with bouncer.connect("pnew") as c:
        assert c.execute("select current_database()").fetchone()[0] == "p3"
    assert "pnew" in {r["name"] for r in bouncer.admin_dicts("SHOW DATABASES")}


def test_reload_of_a_broken_ini_reports_an_error_and_keeps_the_old_config(bouncer):
    bouncer.write_ini(settings={"default_pool_size": 9, "bogus_setting": 1},
                      databases={"pnew": bouncer.server("p3")})
    assert_console_error(bouncer.admin_result("RELOAD"))
    assert bouncer.show_config()["default_pool_size"]["value"] == "5"
    assert "pnew" not in {r["name"] for r in bouncer.admin_dicts("SHOW DATABASES")}
    assert "bogus_setting" in bouncer.log()
    assert_serves(bouncer)
    bouncer.write_ini(settings={"bogus_setting": None})
    bouncer.admin("RELOAD")
    assert bouncer.show_config()["default_pool_size"]["value"] == "9"


# -------------------------------------------------------------- SHUTDOWN --

def test_shutdown_command_stops_the_process(bouncer):
    try:
        bouncer.admin_result("SHUTDOWN")
    except (EOFError, OSError):
        pass                     # the console may close without a reply
    assert bouncer.wait_exit(5), "lokadb still running after SHUTDOWN"


def test_console_errors_carry_sqlstates_for_bad_arguments(bouncer):
    for cmd in ("PAUSE nosuchdb", "KILL nosuchdb"):
        res = bouncer.admin_result(cmd)
        assert_console_error(res)
    assert isinstance(res.error, PgError)


def test_pause_answers_once_open_transactions_have_released_their_servers(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    c = b.connect("p0", autocommit=False)
    first = backend_pid(c)                  # BEGIN implicitly: the server stays linked
    call = BgCall(b.admin, "PAUSE")
    assert not call.wait(1.0), "PAUSE answered while a transaction still held its server"
    c.commit()
    call.result(5 * SLOW)                   # answered once the server was released
    assert dict(b.admin("SHOW STATE"))["paused"] == "yes"
    b.admin("RESUME")
    assert backend_pid(c) != first, "PAUSE must close the released server, as PgBouncer does"
    c.commit()
