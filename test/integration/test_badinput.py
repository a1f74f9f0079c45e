# SPDX-License-Identifier: ISC
"""Bad bytes on a raw socket. Each case: the reply is an ErrorResponse with
the expected SQLSTATE or a clean close -- never a hang -- and lokadb keeps
serving other clients afterwards."""

import random
import struct

import psycopg
import pytest

from lokadb_harness import (CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, SSL_REQUEST_CODE,
                            assert_error, assert_serves, message, startup_packet)


def u32(*vals):
    return b"".join(struct.pack("!I", v) for v in vals)


def params_body(params):
    return b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"


LOGIN = {"user": "trustuser", "database": "p0"}


def versioned_startup(major, minor):
    body = u32((major << 16) | minor) + params_body(LOGIN)
    return u32(len(body) + 4) + body


# name -> (bytes sent before login, SQLSTATEs an ErrorResponse may carry,
#          whether a clean close without ErrorResponse is acceptable)
PRE_LOGIN_CASES = {
    # 8 bytes each, so a reader that waits for a whole 8-byte header has it
    "length_below_8": (u32(4, 196608), ("08P01",), True),
    "length_7": (u32(7) + b"\0\3\0\0", ("08P01",), True),
    "length_over_10000": (u32(20000, 196608) + b"user\0trustuser\0", ("08P01",), True),
    "negative_length": (u32(0xFFFFFFFF, 196608), ("08P01",), True),
    "no_user_parameter": (startup_packet({"database": "p0"}), ("08P01", "28000"), False),
    "parameters_not_terminated": (u32(8 + 10, 196608) + b"user\0trust", ("08P01",), True),
    "http_request": (b"GET / HTTP/1.1\r\nHost: lokadb\r\n\r\n", ("08P01", "0A000"), True),
    "binary_garbage": (bytes(random.Random(7).randrange(256) for _ in range(200)),
                       ("08P01", "0A000"), True),
}


@pytest.mark.parametrize("case", sorted(PRE_LOGIN_CASES))
def test_bad_startup_packet_gets_an_error_or_a_close(bouncer, case):
    data, sqlstates, close_ok = PRE_LOGIN_CASES[case]
    w = bouncer.wire()
    w.send(data)
    kind, fields = w.outcome(5)
    if kind == "error":
        assert_error(fields, sqlstates)
        w.wait_closed(5)
    else:
        assert kind == "closed" and close_ok, f"{case}: got {kind} {fields!r}"
    assert_serves(bouncer)


@pytest.mark.parametrize("major,minor", [(2, 0), (4, 0)])
def test_unsupported_protocol_version_gets_0A000(bouncer, major, minor):
    w = bouncer.wire()
    w.send(versioned_startup(major, minor))
    kind, fields = w.outcome(5)
    assert kind == "error", f"expected ErrorResponse, got {kind}"
    assert_error(fields, "0A000", "unsupported frontend protocol")
    w.wait_closed(5)
    assert_serves(bouncer)


def test_truncated_startup_packet_then_close_leaves_lokadb_serving(bouncer):
    for cut in (1, 3, 6, 20):
        w = bouncer.wire()
        w.send(startup_packet(LOGIN)[:cut])
        w.close()
    assert_serves(bouncer)


@pytest.mark.parametrize("code", [SSL_REQUEST_CODE, GSSENC_REQUEST_CODE], ids=["ssl", "gssenc"])
def test_encryption_request_gets_N_and_startup_then_works_on_the_same_socket(bouncer, code):
    w = bouncer.wire()
    w.send(u32(8, code))
    assert w.read_exact(1) == b"N"
    w.login("trustuser", "p0")
    assert w.scalar("select 'plain'") == "plain"


def test_libpq_sslmode_prefer_falls_back_to_plain(bouncer):
    with bouncer.connect("p0", sslmode="prefer") as c:
        assert c.execute("select 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError):
        bouncer.connect("p0", sslmode="require")
    assert_serves(bouncer)


def test_cancel_request_with_unknown_key_is_closed_quietly(bouncer):
    w = bouncer.wire()
    w.send(u32(16, CANCEL_REQUEST_CODE, 12345, 67890))
    kind, _ = w.outcome(5)
    assert kind == "closed"
    assert_serves(bouncer)


# name -> bytes sent after a successful login
POST_LOGIN_CASES = {
    "unknown_message_type": message(b"y", b"hello"),
    "length_field_2": b"Q" + u32(2),
    "length_field_0": b"Q" + u32(0),
    "negative_length": b"Q" + u32(0xFFFFFFFF),
    "garbage_bytes": b"\0" + bytes(random.Random(11).randrange(256) for _ in range(64)),
    "startup_packet_again": startup_packet(LOGIN),
}


@pytest.mark.parametrize("case", sorted(POST_LOGIN_CASES))
def test_bad_message_after_login_gets_08P01(bouncer, case):
    other = bouncer.connect("p0")
    w = bouncer.login("p0")
    w.send(POST_LOGIN_CASES[case])
    kind, fields = w.outcome(5)
    assert kind == "error", f"{case}: expected ErrorResponse, got {kind}"
    assert_error(fields, "08P01")
    w.wait_closed(5)
    assert other.execute("select 1").fetchone()[0] == 1
    assert_serves(bouncer)


def test_unknown_database_gets_3D000_no_such_database(bouncer):
    err = bouncer.login_error("nosuchdb")
    assert_error(err, "3D000", "no such database")
    assert err.severity == "FATAL"
    bouncer.wait_log("nosuchdb")
    with pytest.raises(psycopg.OperationalError, match="no such database"):
        bouncer.connect("nosuchdb")
    assert_serves(bouncer)


def test_log_pooler_errors_logs_the_errors_lokadb_sends_as_warnings(bouncer_factory):
    """log_pooler_errors (PgBouncer's setting, on by default): each error the
    pooler itself sends is a WARNING "pooler error: ..." line; off, none."""
    on = bouncer_factory()
    assert_error(on.login_error("nosuchdb_on"), "3D000", "no such database")
    on.wait_log(r"WARNING .*pooler error: no such database.*nosuchdb_on")
    off = bouncer_factory(settings={"log_pooler_errors": 0})
    assert_error(off.login_error("nosuchdb_off"), "3D000", "no such database")
    off.wait_log("nosuchdb_off")                 # the closing line is there ...
    assert "pooler error" not in off.log()        # ... the warning is not
    assert_serves(on)


def test_terminate_message_closes_the_connection_cleanly(bouncer):
    w = bouncer.login("p0")
    w.send(message(b"X"))
    assert w.wait_closed(5) == []
    assert_serves(bouncer)


@pytest.mark.parametrize("dbname,sql", [("lokadb", "SHOW VERSION"), ("p0", "select 'same-write'")],
                         ids=["console", "pooled"])
def test_query_sent_in_the_same_write_as_the_startup_packet_is_answered(bouncer, dbname, sql):
    user = "admin" if dbname == "lokadb" else "trustuser"
    w = bouncer.wire()
    w.send(startup_packet({"user": user, "database": dbname})
           + message(b"Q", sql.encode() + b"\0"))
    seen = []
    for _ in range(100):                 # bounded: login replies, then the query's
        kind, body = w.read_msg(5)
        seen.append(kind)
        if kind == b"Z" and b"D" in seen:
            break
    assert b"D" in seen and seen[-1] == b"Z", f"no answer to the pipelined query: {seen}"
