# SPDX-License-Identifier: ISC
"""Pool modes, per-user/per-database overrides and startup parameters
(ParameterStatus) carried across shared server connections."""

import time

import pytest

from lokadb_harness import PG_DEFAULT_TIMEZONE, SLOW, BgCall, backend_pid

BLOCKED_FOR = 1.0       # how long a query must stay blocked to count as waiting


def query_in_background(bouncer, dbname="p0", user="trustuser", sql="select pg_backend_pid()"):
    """Connect and run sql in a thread; the BgCall's result is the first value."""
    def run():
        with bouncer.connect(dbname, user) as c:
            return c.execute(sql).fetchone()[0]
    return BgCall(run)


def assert_blocked(call, seconds=BLOCKED_FOR):
    assert not call.wait(seconds), f"expected to wait, but it finished: {call.exception(0)!r}"


# ----------------------------------------------------------- session mode --

def test_session_mode_second_client_waits_until_the_first_disconnects(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1})
    a = b.connect("p0")
    pid_a = backend_pid(a)
    call = query_in_background(b)
    assert_blocked(call)
    a.close()
    assert call.result(5 * SLOW) == pid_a


def test_session_mode_keeps_session_state_for_the_client(bouncer):
    with bouncer.connect("p0") as c:
        c.execute("create temp table t (a int)")
        c.execute("set work_mem = '1234kB'")
        pid = backend_pid(c)
        for _ in range(5):
            assert backend_pid(c) == pid
        assert c.execute("show work_mem").fetchone()[0] == "1234kB"
        assert c.execute("select count(*) from t").fetchone()[0] == 0


def test_session_state_does_not_leak_to_the_next_client(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1})
    with b.connect("p0") as c:
        pid = backend_pid(c)
        c.execute("set work_mem = '1234kB'")
        c.execute("create temp table leak (a int)")
    with b.connect("p0") as c:
        assert backend_pid(c) == pid
        assert c.execute("show work_mem").fetchone()[0] != "1234kB"
        assert c.execute("select count(*) from pg_tables where tablename = 'leak'").fetchone()[0] == 0


# ------------------------------------------------------- transaction mode --

def test_transaction_mode_clients_take_turns_on_one_server(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1})
    a = b.connect("p0")
    c = b.connect("p0")
    pids = {backend_pid(a), backend_pid(c), backend_pid(a), backend_pid(c)}
    assert len(pids) == 1


def test_transaction_mode_client_in_an_open_transaction_keeps_its_server(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1})
    a = b.connect("p0")
    c = b.connect("p0")
    pid = backend_pid(c)
    a.execute("begin")
    assert backend_pid(a) == pid
    a.execute("create temp table t (x int)")
    call = BgCall(backend_pid, c)
    assert_blocked(call)
    assert a.execute("select count(*) from t").fetchone()[0] == 0     # same server still
    a.execute("commit")
    assert call.result(5 * SLOW) == pid


def test_transaction_mode_many_clients_share_a_small_pool(bouncer_factory, pg):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 2})
    conns = [b.connect("p1") for _ in range(8)]
    pids = set()
    for _ in range(3):
        for c in conns:
            pids.add(backend_pid(c))
    assert 1 <= len(pids) <= 2


# -------------------------------------------------------------- overrides --

def test_users_pool_mode_overrides_the_global_pool_mode(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "session", "default_pool_size": 1},
                        users={"pooluser1": "pool_mode=transaction"})
    a = b.connect("p0", "pooluser1")
    pid = backend_pid(a)
    assert query_in_background(b, "p0", "pooluser1").result(5 * SLOW) == pid
    # the global mode still holds for everyone else
    t = b.connect("p0", "trustuser")
    backend_pid(t)
    assert_blocked(query_in_background(b, "p0", "trustuser"))


def test_databases_pool_mode_overrides_the_global_pool_mode(bouncer_factory, pg):
    b = bouncer_factory(settings={"pool_mode": "session", "default_pool_size": 1},
                        databases={"p1": f"host=127.0.0.1 port={pg.port} dbname=p1 pool_mode=transaction"})
    a = b.connect("p1")
    pid = backend_pid(a)
    assert query_in_background(b, "p1").result(5 * SLOW) == pid


def test_databases_pool_size_overrides_default_pool_size(bouncer_factory, pg):
    b = bouncer_factory(settings={"default_pool_size": 5},
                        databases={"p1": f"host=127.0.0.1 port={pg.port} dbname=p1 pool_size=1"})
    a = b.connect("p1")
    backend_pid(a)
    call = query_in_background(b, "p1")
    others = [b.connect("p0") for _ in range(3)]
    assert len({backend_pid(o) for o in others}) == 3       # p0 keeps the global size
    assert_blocked(call)
    a.close()
    call.result(5 * SLOW)


def test_users_pool_size_overrides_default_pool_size(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 5}, users={"pooluser2": "pool_size=1"})
    a = b.connect("p0", "pooluser2")
    backend_pid(a)
    call = query_in_background(b, "p0", "pooluser2")
    assert_blocked(call)
    a.close()
    call.result(5 * SLOW)


# ------------------------------------------------------ startup parameters --

PARAMS_A = {"application_name": "app1", "TimeZone": "UTC", "DateStyle": "ISO, MDY",
            "client_encoding": "UTF8"}
PARAMS_B = {"application_name": "app2", "TimeZone": "America/New_York",
            "DateStyle": "SQL, DMY", "client_encoding": "LATIN1"}


def show_all(w):
    return {
        "application_name": w.scalar("show application_name"),
        "TimeZone": w.scalar("show timezone"),
        "DateStyle": w.scalar("show datestyle"),
        "client_encoding": w.scalar("show client_encoding"),
        "pid": w.scalar("select pg_backend_pid()"),
    }


def test_startup_parameters_reach_the_server_and_are_reported(bouncer):
    w = bouncer.login("p0", params=PARAMS_B)
    for k, v in PARAMS_B.items():
        assert w.params.get(k) == v, f"ParameterStatus {k}: {w.params.get(k)!r}"
    seen = show_all(w)
    for k, v in PARAMS_B.items():
        assert seen[k] == v
    assert w.params.get("server_version", "").startswith("15")


def test_options_startup_parameter_sets_timezone_and_datestyle(bouncer):
    with bouncer.connect("p0", options="-c TimeZone=America/New_York -c DateStyle=SQL,DMY",
                         application_name="app1") as c:
        assert c.execute("show timezone").fetchone()[0] == "America/New_York"
        assert c.execute("show datestyle").fetchone()[0] == "SQL, DMY"
        assert c.execute("show application_name").fetchone()[0] == "app1"
        assert c.info.parameter_status("application_name") == "app1"


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_each_client_sees_its_own_parameters_on_a_shared_server(bouncer_factory, pool_mode):
    b = bouncer_factory(settings={"pool_mode": pool_mode, "default_pool_size": 1})
    if pool_mode == "transaction":
        wa = b.login("p0", params=PARAMS_A)
        wb = b.login("p0", params=PARAMS_B)
        rounds = [(wa, PARAMS_A), (wb, PARAMS_B), (wa, PARAMS_A), (wb, PARAMS_B)]
    else:
        rounds = []
        for params in (PARAMS_A, PARAMS_B, PARAMS_A):
            w = b.login("p0", params=params)
            rounds.append((w, params))
    pids = set()
    for w, params in rounds:
        seen = show_all(w)
        pids.add(seen.pop("pid"))
        assert seen == params
        if pool_mode == "session":
            w.close()
    assert len(pids) == 1, "the clients were meant to share one server connection"


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_client_without_parameters_gets_server_defaults_after_another_client(bouncer_factory, pool_mode):
    b = bouncer_factory(settings={"pool_mode": pool_mode, "default_pool_size": 1})
    wb = b.login("p0", params=PARAMS_B)
    pid = show_all(wb)["pid"]
    wb.close()
    time.sleep(0.2)
    w = b.login("p0")
    assert w.scalar("select pg_backend_pid()") == pid
    assert w.scalar("show timezone") == PG_DEFAULT_TIMEZONE
    assert w.scalar("show datestyle") != PARAMS_B["DateStyle"]
    assert w.scalar("show client_encoding") != PARAMS_B["client_encoding"]


def test_set_of_a_reported_parameter_follows_its_client_in_transaction_mode(bouncer_factory):
    """A SET the server reports with ParameterStatus belongs to the client
    that ran it, not to the server connection it happened to use."""
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1})
    wa = b.login("p0")
    wb = b.login("p0")
    pid = wa.scalar("select pg_backend_pid()")
    wa.query("set timezone = 'UTC'")
    wa.query("set application_name = 'set-by-a'")
    assert wa.params.get("TimeZone") == "UTC"
    assert wb.scalar("select pg_backend_pid()") == pid
    assert wb.scalar("show timezone") == PG_DEFAULT_TIMEZONE
    assert wb.scalar("show application_name") != "set-by-a"
    assert wa.scalar("show timezone") == "UTC"
    assert wa.scalar("show application_name") == "set-by-a"
