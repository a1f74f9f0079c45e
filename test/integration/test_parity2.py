# SPDX-License-Identifier: ISC
"""PgBouncer 1.24 settings lokadb used to refuse: [databases] server_lifetime
and query_wait_timeout, [users] query_wait_timeout and reserve_pool_size,
query_wait_notify and cancel_wait_timeout."""

import socket
import struct
import threading
import time

import pytest

from lokadb_harness import (SLOW, BgCall, PgError, Wire, assert_error, assert_reserve_pool_serves_a_second_client,
                            backend_pid, free_port, parse_error_fields, wait_until)

WAIT = 2.5      # longer than every 1 s timeout below, with room for the janitor's tick


def waiting_query_outcome(b, dbname, user="trustuser", timeout=8):
    """Log in to dbname and run a query that has to wait for a server.
    Returns (PgError or None, notices, seconds): the error that ended the wait,
    the NOTICE messages seen before, and how long it took."""
    start = time.monotonic()
    w = b.wire(timeout=timeout)
    err = w.login(user, dbname, raise_error=False)
    notices = []
    if err is None:
        w.send_msg(b"Q", b"select 1\0")
        deadline = time.monotonic() + timeout * SLOW
        while err is None and time.monotonic() < deadline:
            kind, fields = w.outcome(timeout)
            if kind == "error":
                err = PgError(fields)
            elif kind == "closed":
                break
            elif fields[0] == b"N":
                notices.append(parse_error_fields(fields[1]))
            elif fields[0] == b"Z":
                break
    return err, notices, time.monotonic() - start


def srv(pg, dbname, extra=""):
    """A [databases] line for a database of the test cluster."""
    return f"host={pg.host} port={pg.port} dbname={dbname} {extra}".strip()


# --------------------------------------------------------------------------
# [databases] query_wait_timeout, [users] query_wait_timeout
# --------------------------------------------------------------------------

def test_a_database_query_wait_timeout_fails_its_waiters_only(bouncer_factory, pg):
    b = bouncer_factory(settings={"default_pool_size": 1},
                        databases={"qa": srv(pg, "p0", "query_wait_timeout=1"), "qb": srv(pg, "p1")})
    holder_a = b.connect("qa")
    backend_pid(holder_a)
    holder_b = b.connect("qb")
    backend_pid(holder_b)

    err, _, elapsed = waiting_query_outcome(b, "qa")
    assert_error(err, "57014", "query_wait_timeout")
    assert 0.8 <= elapsed < 5 * SLOW, elapsed
    b.wait_log("query_wait_timeout")

    # qb keeps the global query_wait_timeout (120 s): its waiter is still waiting
    def waiter():
        with b.connect("qb") as c:
            return c.execute("select 7").fetchone()[0]
    call = BgCall(waiter)
    assert not call.wait(WAIT), "the qb client should still be waiting"
    holder_b.close()
    assert call.result(5 * SLOW) == 7
    assert holder_a.execute("select 1").fetchone()[0] == 1


def test_a_users_query_wait_timeout_wins_over_the_database_and_global_ones(bouncer_factory, pg):
    b = bouncer_factory(settings={"default_pool_size": 1},
                        databases={"qa": srv(pg, "p0", "query_wait_timeout=0")},
                        users={"trustuser": "query_wait_timeout=1"})
    holder = b.connect("qa")
    backend_pid(holder)
    err, _, elapsed = waiting_query_outcome(b, "qa")
    assert_error(err, "57014", "query_wait_timeout")
    assert 0.8 <= elapsed < 5 * SLOW, elapsed

    # without the user's value, the database's 0 means: wait for ever
    b.write_ini(users={"trustuser": None})
    b.reload()
    wait_until(lambda: not any(r["name"] == "trustuser" for r in b.admin_dicts("SHOW USERS")), 3 * SLOW,
               what="trustuser gone from SHOW USERS")

    def waiter():
        with b.connect("qa") as c:
            return c.execute("select 8").fetchone()[0]
    call = BgCall(waiter)
    assert not call.wait(WAIT), "the client should still be waiting (query_wait_timeout=0)"
    holder.close()
    assert call.result(5 * SLOW) == 8


# --------------------------------------------------------------------------
# [databases] server_lifetime
# --------------------------------------------------------------------------

def test_a_database_server_lifetime_replaces_that_databases_servers_only(bouncer_factory, pg):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1},
                        databases={"la": srv(pg, "p0", "server_lifetime=1"), "lb": srv(pg, "p1")})
    dbs = {r["name"]: r for r in b.admin_dicts("SHOW DATABASES")}
    assert dbs["la"]["server_lifetime"] == "1"
    assert dbs["lb"]["server_lifetime"] == "3600"
    assert dbs["p0"]["server_lifetime"] == "3600"

    a = b.connect("la")
    other = b.connect("lb")
    first_a = backend_pid(a)
    first_b = backend_pid(other)

    def replaced():
        time.sleep(0.2)
        return backend_pid(a) != first_a
    wait_until(replaced, 6 * SLOW, interval=0.1, what="a new server connection for la")
    wait_until(lambda: not pg.backend_alive(first_a), 5 * SLOW, what="la's old backend to exit")
    assert backend_pid(other) == first_b, "lb's server must live on (global server_lifetime 3600)"
    assert pg.backend_alive(first_b)
    b.wait_log("server lifetime over")


# --------------------------------------------------------------------------
# [users] reserve_pool_size
# --------------------------------------------------------------------------

def test_a_users_reserve_pool_size_grants_extra_servers_after_reserve_pool_timeout(bouncer_factory):
    b = bouncer_factory(settings={"default_pool_size": 1, "reserve_pool_size": 0,
                                  "reserve_pool_timeout": 0.5},
                        users={"trustuser": "reserve_pool_size=1"})
    users = {r["name"]: r for r in b.admin_dicts("SHOW USERS")}
    assert users["trustuser"]["reserve_pool_size"] == "1"
    assert_reserve_pool_serves_a_second_client(b)
    b.wait_log("reserve pool")


def test_a_users_reserve_pool_size_of_zero_wins_over_the_databases(bouncer_factory, pg):
    b = bouncer_factory(settings={"default_pool_size": 1, "reserve_pool_timeout": 0.5},
                        databases={"rp": srv(pg, "p0", "reserve_pool_size=1")},
                        users={"trustuser": "reserve_pool_size=0"})
    users = {r["name"]: r for r in b.admin_dicts("SHOW USERS")}
    assert users["trustuser"]["reserve_pool_size"] == "0"
    holder = b.connect("rp")
    backend_pid(holder)

    def second():
        with b.connect("rp") as c:
            return backend_pid(c)
    call = BgCall(second)
    assert not call.wait(WAIT), "no reserve server for this user: the client waits"
    assert len(b.servers("rp")) == 1
    holder.close()
    call.result(5 * SLOW)


# --------------------------------------------------------------------------
# query_wait_notify
# --------------------------------------------------------------------------

QUEUED = "No server connection available in postgres backend, client being queued"


def queued_query(b, holder, hold):
    """Run a query that waits behind holder's transaction for `hold` seconds;
    returns (error, notices, seconds)."""
    call = BgCall(waiting_query_outcome, b, "p0")
    assert not call.wait(hold), "the query should wait for the held server"
    holder.execute("commit")
    return call.result(8 * SLOW)


def test_a_client_waiting_longer_than_query_wait_notify_gets_one_notice(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1,
                                  "query_wait_notify": 1})
    assert b.show_config()["query_wait_notify"]["value"] == "1"
    holder = b.connect("p0")
    holder.execute("begin")
    backend_pid(holder)
    err, notices, elapsed = queued_query(b, holder, WAIT + 0.5)
    assert err is None, err
    assert elapsed >= WAIT
    assert len(notices) == 1, notices      # once per wait, though it waited 3 s
    assert notices[0]["S"] == "NOTICE" and notices[0]["C"] == "00000"
    assert notices[0]["M"] == QUEUED


def test_query_wait_notify_zero_sends_no_notice_and_a_short_wait_none(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction", "default_pool_size": 1,
                                  "query_wait_notify": 0})
    holder = b.connect("p0")
    holder.execute("begin")
    backend_pid(holder)
    err, notices, _ = queued_query(b, holder, WAIT)
    assert err is None and notices == [], (err, notices)

    # the default (5 s) is longer than this wait
    b.admin("SET query_wait_notify = 5")
    holder.execute("begin")
    backend_pid(holder)
    err, notices, _ = queued_query(b, holder, WAIT)
    assert err is None and notices == [], (err, notices)


# --------------------------------------------------------------------------
# cancel_wait_timeout
# --------------------------------------------------------------------------

CANCEL_CODE = 80877102
PEER2_KEYS = [((0x40 << 24) | (2 << 16) | n, 0x5678) for n in (1, 2)]   # one hop left, peer 2


def send_cancel(port, key):
    """A CancelRequest to lokadb; it closes the connection once it has taken it."""
    w = Wire(port=port, timeout=5.0)
    try:
        w.send(struct.pack("!IIII", 16, CANCEL_CODE, *key))
        kind, _ = w.outcome(5)
        assert kind in ("closed", "error"), kind
    finally:
        w.close()


def silent_peer():
    """A listening socket that never accepts: a forward to it connects (the
    kernel's backlog) and then waits for ever for the peer to close it."""
    port = free_port()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    return sock, port


def peer_pools(b):
    return {r["peer_id"]: r for r in b.admin_dicts("SHOW PEER_POOLS")}


def queue_two_cancels(b):
    for key in PEER2_KEYS:
        send_cancel(b.port, key)
    wait_until(lambda: peer_pools(b)["2"]["cl_waiting_cancel_req"] == "1", 3 * SLOW,
               what="one forward in flight and one queued")
    assert peer_pools(b)["2"]["cl_active_cancel_req"] == "1"


def test_cancel_wait_timeout_drops_forwards_that_wait_too_long(bouncer_factory):
    sock, port = silent_peer()
    try:
        b = bouncer_factory(settings={"peer_id": 1, "cancel_wait_timeout": 1},
                            raw=f"[peers]\n2 = host=127.0.0.1 port={port} pool_size=1\n")
        start = time.monotonic()
        queue_two_cancels(b)
        wait_until(lambda: b.log().count("closing because: cancel_wait_timeout") == 2, 5 * SLOW,
                   what="both cancel requests dropped")
        assert time.monotonic() - start >= 0.8
        assert "cancel request for peer 2 closing because: cancel_wait_timeout (age=" in b.log()
        pools = peer_pools(b)["2"]
        assert pools["cl_active_cancel_req"] == "0" and pools["cl_waiting_cancel_req"] == "0"
        with b.connect("p0") as c:
            assert c.execute("select 1").fetchone()[0] == 1
    finally:
        sock.close()


def test_by_default_a_cancel_request_waits_ten_seconds(bouncer_factory):
    sock, port = silent_peer()
    try:
        b = bouncer_factory(settings={"peer_id": 1},
                            raw=f"[peers]\n2 = host=127.0.0.1 port={port} pool_size=1\n")
        assert b.show_config()["cancel_wait_timeout"]["value"] == "10"
        queue_two_cancels(b)
        time.sleep(WAIT)
        assert "cancel_wait_timeout" not in b.log()
        assert peer_pools(b)["2"]["cl_waiting_cancel_req"] == "1"
        # a shorter limit applies to the queued request at the janitor's next turn
        b.admin("SET cancel_wait_timeout = 1")
        b.wait_log("closing because: cancel_wait_timeout", timeout=3)
        assert peer_pools(b)["2"]["cl_waiting_cancel_req"] == "0"
    finally:
        sock.close()


# --------------------------------------------------------------------------
# [databases] auth_query and auth_dbname
# --------------------------------------------------------------------------

AQ_ROLE, AQ_PASSWORD = "aq2_scram", "aq2 scram pw"
IN_P2 = "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = $1 AND current_database() = ''p2''"


@pytest.fixture
def aq_role(pg):
    pg.sql(f"SET password_encryption = 'scram-sha-256'; DROP ROLE IF EXISTS {AQ_ROLE}; "
           f"CREATE ROLE {AQ_ROLE} LOGIN PASSWORD '{AQ_PASSWORD}'")
    yield AQ_ROLE
    pg.sql(f"DROP ROLE IF EXISTS {AQ_ROLE}")


def test_a_database_entry_has_its_own_auth_query_and_auth_dbname(bouncer_factory, pg, aq_role):
    b = bouncer_factory(
        settings={"auth_type": "scram-sha-256", "auth_user": "postgres"},
        databases={
            # the entry's query only finds the role in p2, where its auth_dbname sends it
            "aqa": srv(pg, "p0", f"auth_query='{IN_P2}' auth_dbname=p2"),
            # the same query without auth_dbname runs in p0: no row, so the login fails
            "aqc": srv(pg, "p0", f"auth_query='{IN_P2}'"),
            # a query that finds no secret
            "aqb": srv(pg, "p0", "auth_query='SELECT rolname, NULL::text FROM pg_authid WHERE rolname = $1'"),
        })
    for dbname in ("aqa", "p0"):        # p0: the global auth_query
        with b.connect(dbname, aq_role, password=AQ_PASSWORD) as c:
            assert c.execute("select current_user, current_database()").fetchone() == (aq_role, "p0")
    for dbname in ("aqb", "aqc"):
        err = b.login_error(dbname, aq_role, password=AQ_PASSWORD)
        assert_error(err, "28P01", f'password authentication failed for user "{aq_role}"')


class CancelSwallower:
    """A TCP relay on 127.0.0.1 in front of PostgreSQL that passes every
    connection through, except one that starts with a CancelRequest: that one
    it keeps open and silent (a server that never answers nor closes), so the
    pooler's wait for the close is what ends it."""

    def __init__(self, pg_host, pg_port):
        self.target = (pg_host, pg_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.held, self.open, self.cancels = [], [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _pump(self, src, dst):
        try:
            while not self.stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            c.settimeout(5)
            try:
                head = c.recv(8, socket.MSG_WAITALL)
            except OSError:
                c.close()
                continue
            if len(head) == 8 and struct.unpack("!II", head) == (16, CANCEL_CODE):
                self.cancels += 1
                self.held.append(c)         # never answered, never closed (until close())
                continue
            up = socket.create_connection(self.target, timeout=5)
            c.settimeout(None)
            up.settimeout(None)
            up.sendall(head)
            self.open += [c, up]
            for a, z in ((c, up), (up, c)):
                threading.Thread(target=self._pump, args=(a, z), daemon=True).start()

    def close(self):
        self.stop.set()
        for s in [self.sock] + self.held + self.open:
            try:
                s.close()
            except OSError:
                pass
        self.thread.join(5)


def test_a_cancel_request_postgresql_never_closes_is_dropped_after_cancel_wait_timeout(bouncer_factory, pg):
    """The pooler passes a client's cancel to PostgreSQL on a new connection
    and waits for PostgreSQL to close it; a server side that never does is
    given up after cancel_wait_timeout with PgBouncer's log line, and every
    client, the cancelling one too, goes on."""
    relay = CancelSwallower(pg.host, pg.port)
    try:
        b = bouncer_factory(settings={"cancel_wait_timeout": 1, "pool_mode": "transaction"},
                            databases={"via": f"host=127.0.0.1 port={relay.port} dbname=p0"})
        with b.connect("via") as slow, b.connect("via") as other:
            call = BgCall(lambda: slow.execute("select pg_sleep(2), 1").fetchone()[1])
            wait_until(lambda: any(r["state"] == "active" for r in b.admin_dicts("SHOW SERVERS")
                                   if r["database"] == "via"), 3 * SLOW, what="the sleep to run")
            start = time.monotonic()
            slow.cancel()
            wait_until(lambda: relay.cancels == 1, 3 * SLOW, what="the cancel to reach the relay")
            assert other.execute("select 42").fetchone()[0] == 42      # others go on meanwhile
            b.wait_log(r"cancel request closing because: cancel_wait_timeout \(age=", timeout=4 * SLOW)
            assert time.monotonic() - start >= 0.8
            assert call.result(5 * SLOW) == 1                       # never cancelled: it ran out
            assert slow.execute("select 7").fetchone()[0] == 7
    finally:
        relay.close()
