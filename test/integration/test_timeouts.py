# SPDX-License-Identifier: ISC
"""Timeouts and pool sizing over time: query_wait_timeout, client_idle_timeout,
idle_transaction_timeout, server_idle_timeout, server_lifetime, min_pool_size,
reserve_pool_size."""

import time

import psycopg
import pytest

from lokadb_harness import (SLOW, PgError, assert_error, assert_reserve_pool_serves_a_second_client, backend_pid,
                            wait_until)

IDLE = 2.5      # longer than every 1 s timeout below, with room for a 1 s timer tick


def test_query_wait_timeout_fails_a_waiting_client_with_57014(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "query_wait_timeout": 1})
    holder = b.connect("p0")
    backend_pid(holder)
    start = time.monotonic()
    w = b.wire(timeout=8)
    err = w.login("trustuser", "p0", raise_error=False)
    if err is None:     # logged in without a server; the query has to wait
        w.send_msg(b"Q", b"select 1\0")
        kind, fields = w.outcome(8)
        assert kind == "error", f"expected an ErrorResponse, got {kind}"
        err = PgError(fields)
    elapsed = time.monotonic() - start
    assert_error(err, "57014", "query_wait_timeout")
    assert 0.8 <= elapsed < 5 * SLOW, elapsed
    b.wait_log("query_wait_timeout")
    assert holder.execute("select 1").fetchone()[0] == 1


def test_client_idle_timeout_disconnects_an_idle_client(bouncer_factory):
    # transaction mode: an idle client holds no server, whichever way an
    # implementation treats idle clients that do (PgBouncer skips those)
    b = bouncer_factory(settings={"client_idle_timeout": 1, "pool_mode": "transaction"})
    idle = b.connect("p0")
    busy = b.connect("p0")
    idle.execute("select 1")
    deadline = time.monotonic() + IDLE
    while time.monotonic() < deadline:
        busy.execute("select 1")
        time.sleep(0.3)
    with pytest.raises(psycopg.OperationalError):
        idle.execute("select 1")
    assert busy.execute("select 2").fetchone()[0] == 2
    b.wait_log("client_idle_timeout")


def test_idle_transaction_timeout_disconnects_a_client_idle_in_begin(bouncer_factory, pg):
    b = bouncer_factory(settings={"idle_transaction_timeout": 1})
    in_tx = b.connect("p0")
    outside = b.connect("p0")
    in_tx.execute("begin")
    pid = backend_pid(in_tx)
    outside.execute("select 1")
    time.sleep(IDLE)
    with pytest.raises(psycopg.OperationalError):
        in_tx.execute("select 1")
    assert outside.execute("select 2").fetchone()[0] == 2
    b.wait_log("idle transaction timeout")
    # the server connection that held the transaction is not handed out mid-transaction
    with b.connect("p0") as c:
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        c.execute("select 1")
    wait_until(lambda: not pg.backend_alive(pid) or
               pg.sql("select state from pg_stat_activity where pid = %s", (pid,))[0][0] == "idle",
               5 * SLOW, what="the timed-out transaction to end on the server")


def test_server_idle_timeout_closes_an_unused_server_connection(bouncer_factory, pg):
    b = bouncer_factory(settings={"server_idle_timeout": 2})
    with b.connect("p0") as c:
        pid = backend_pid(c)
    time.sleep(0.3)
    assert len(b.servers("p0")) == 1, "the server should stay pooled for a while"
    assert pg.backend_alive(pid)
    wait_until(lambda: not b.servers("p0"), 6 * SLOW, interval=0.2,
               what="SHOW SERVERS to become empty")
    wait_until(lambda: not pg.backend_alive(pid), 3 * SLOW, what="the backend to exit")


def test_server_lifetime_replaces_an_old_server_connection(bouncer_factory, pg):
    b = bouncer_factory(settings={"server_lifetime": 1, "pool_mode": "transaction",
                                  "default_pool_size": 1})
    c = b.connect("p0")
    first = backend_pid(c)

    def replaced():
        time.sleep(0.2)
        return backend_pid(c) != first
    wait_until(replaced, 6 * SLOW, interval=0.1, what="a new server connection")
    wait_until(lambda: not pg.backend_alive(first), 5 * SLOW, what="the old backend to exit")


def test_min_pool_size_opens_server_connections_without_clients(bouncer_factory, pg):
    dbs = {name: None for name in ("p0_trust", "p0_md5", "p0_scram", "p0_clear")}
    dbs["pmin"] = f"host=127.0.0.1 port={pg.port} dbname=p_minpool user=trustuser"
    b = bouncer_factory(settings={"min_pool_size": 2}, databases=dbs)
    wait_until(lambda: len(b.servers("pmin")) == 2, 6 * SLOW, interval=0.2,
               what="two pmin servers in SHOW SERVERS")
    wait_until(lambda: pg.count_backends("p_minpool", "trustuser") == 2, 3 * SLOW,
               what="two backends in pg_stat_activity")
    assert not b.clients("pmin")


def test_reserve_pool_serves_a_waiting_client_after_reserve_pool_timeout(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "reserve_pool_size": 1,
                                  "reserve_pool_timeout": 0.5})
    assert_reserve_pool_serves_a_second_client(b)
