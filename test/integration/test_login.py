# SPDX-License-Identifier: ISC
"""Connect-per-request logins: what a login sends, and client objects,
bufferevents and strings reused from one connection to the next."""

import socket
import struct

import psycopg
import pytest

from lokadb_harness import PG_DEFAULT_TIMEZONE, SSL_REQUEST_CODE, USERS, PgError, Wire, startup_packet


def welcome(b, params, user="trustuser", database="p0"):
    """Log in with a raw client; the ParameterStatus (name, value) pairs in order."""
    out = []
    with Wire(port=b.port) as w:
        p = {"user": user, "database": database}
        p.update(params)
        w.send(startup_packet(p))
        while True:
            typ, payload = w.read_msg()
            if typ == b"E":
                raise AssertionError(f"login failed: {payload!r}")
            if typ == b"S":
                k, v, _ = payload.split(b"\0", 2)
                out.append((k.decode(), v.decode()))
            if typ == b"Z":
                w.logged_in = True
                return out


def test_welcome_sends_each_parameter_once_with_the_clients_values(bouncer):
    first = welcome(bouncer, {})
    names = [k for k, _ in first]
    assert len(names) == len(set(names)), names
    server = dict(first)
    assert server["TimeZone"] == PG_DEFAULT_TIMEZONE
    # the client's own values replace the server's in place, the others stay
    long_app = "a-long-application-name-" + "x" * 40
    second = welcome(bouncer, {"application_name": long_app, "TimeZone": "UTC", "DateStyle": "ISO, DMY"})
    assert [k for k, _ in second] == names
    got = dict(second)
    assert got["application_name"] == long_app
    assert got["TimeZone"] == "UTC"
    assert got["DateStyle"] == "ISO, DMY"
    for k in names:
        if k not in ("application_name", "TimeZone", "DateStyle"):
            assert got[k] == server[k], k
    # and a later plain login is not affected by the previous client's values
    assert dict(welcome(bouncer, {})) == server


def test_connect_per_request_logins_keep_each_clients_settings(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    zones = ["UTC", "Europe/Paris", "America/New_York"]
    for i in range(60):
        app = f"app{i}" if i % 2 else f"application-{i}-" + "y" * 40
        tz = zones[i % 3]
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="p0", user="trustuser",
                             application_name=app, options=f"-c TimeZone={tz}", sslmode="disable",
                             gssencmode="disable", connect_timeout=10, autocommit=True) as c:
            assert c.info.parameter_status("application_name") == app
            assert c.info.parameter_status("TimeZone") == tz
            assert c.execute("select current_setting('TimeZone'), current_setting('application_name')"
                             ).fetchone() == (tz, app)


def test_logins_alternating_secrets_and_sslrequest(bouncer_factory):
    # scram secrets are longer than what a client object keeps inline, plain ones shorter
    bouncer = bouncer_factory(settings={"auth_type": "md5"})
    for i in range(12):
        for user in ("cl_scram", "cl_plain", "cl_md5", "trustuser"):
            with Wire(port=bouncer.port) as w:
                if i % 2:
                    w.send(struct.pack("!II", 8, SSL_REQUEST_CODE))
                    assert w.read_exact(1) == b"N"
                w.login(user, "p1", password=USERS[user]["password"])
                w.send_msg(b"Q", b"select current_user\0")
                typ, _ = w.read_msg()
                assert typ == b"T"
    with Wire(port=bouncer.port) as w:
        err = w.login("cl_scram", "p1", password="wrong", raise_error=False)
        assert isinstance(err, PgError) and err.fields["C"] == "28P01"


def test_long_names_and_unknown_database(bouncer):
    long_db = "d" * 63
    for _ in range(5):
        with Wire(port=bouncer.port) as w:
            err = w.login("cl_scram", long_db, password="scrampw", raise_error=False)
            assert isinstance(err, PgError)
            assert err.fields["C"] == "3D000"
            assert err.fields["M"] == f"no such database: {long_db}"
    with bouncer.connect("p0", user="trustuser") as c:
        assert c.execute("select 1").fetchone() == (1,)


def test_clients_gone_mid_login_or_with_unread_replies(bouncer):
    for i in range(20):
        s = socket.create_connection(("127.0.0.1", bouncer.port), timeout=5)
        if i % 4 == 0:
            s.sendall(struct.pack("!II", 8, SSL_REQUEST_CODE))
        elif i % 4 == 1:
            s.sendall(startup_packet({"user": "trustuser", "database": "p0"})[:11])
        elif i % 4 == 2:
            # a whole login and a query whose answer is never read
            q = b"select repeat('z', 300000)\0"
            s.sendall(startup_packet({"user": "trustuser", "database": "p0"}) + b"Q" + struct.pack("!I", 4 + len(q)) + q)
        s.close()
    with Wire(port=bouncer.port) as w:
        w.login("trustuser", "p0")
        w.send_msg(b"Q", b"select 42\0")
        assert w.read_msg()[0] == b"T"
        typ, payload = w.read_msg()
        assert typ == b"D" and payload.endswith(b"42")
    with bouncer.connect("p0", user="trustuser") as c:
        assert c.execute("select 2").fetchone() == (2,)


@pytest.mark.parametrize("n", [3])
def test_console_login_after_pool_logins(bouncer, n):
    for _ in range(n):
        with bouncer.connect("p0", user="trustuser") as c:
            c.execute("select 1")
    with psycopg.connect(host="127.0.0.1", port=bouncer.port, dbname="pgbouncer", user="admin",
                         password="adminpw", sslmode="disable", gssencmode="disable",
                         autocommit=True) as c:
        assert c.info.parameter_status("server_encoding") == "UTF8"
        rows = c.execute("show clients").fetchall()
        assert len(rows) >= 1


def test_sslrequest_alone_or_with_the_startup_packet(bouncer):
    ssl_request = struct.pack("!II", 8, SSL_REQUEST_CODE)
    startup = startup_packet({"user": "trustuser", "database": "p0"})
    for together in (False, True, False, True):
        with Wire(port=bouncer.port) as w:
            if together:
                w.send(ssl_request + startup)
            else:
                w.send(ssl_request)
                assert w.read_exact(1) == b"N"
                w.send(startup)
            if together:
                assert w.read_exact(1) == b"N"
            assert w.finish_login("trustuser") is None
            w.send_msg(b"Q", b"select 7\0")
            assert w.read_msg()[0] == b"T"
    # an SSLRequest of the wrong length is refused as before
    with Wire(port=bouncer.port) as w:
        w.send(struct.pack("!III", 12, SSL_REQUEST_CODE, 0))
        typ, payload = w.read_msg()
        assert typ == b"E" and b"invalid length of startup packet" in payload
