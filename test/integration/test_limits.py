# SPDX-License-Identifier: ISC
"""max_client_conn, max_message_bytes and client_login_timeout."""

import struct
import time

from lokadb_harness import SLOW, Wire, assert_error, assert_serves, startup_packet, wait_until


def test_client_over_max_client_conn_is_refused_with_53300(bouncer_factory):
    b = bouncer_factory(settings={"max_client_conn": 3})
    conns = [b.connect("p0") for _ in range(3)]
    for c in conns:
        assert c.execute("select 1").fetchone()[0] == 1
    err = b.login_error("p0")
    assert_error(err, "53300")
    conns[0].close()

    def fourth_client_gets_in():
        with b.connect("p0") as c:
            return c.execute("select 1").fetchone()[0] == 1
    wait_until(fourth_client_gets_in, 5 * SLOW, interval=0.1, what="a slot after one client left")
    for c in conns[1:]:
        assert c.execute("select 2").fetchone()[0] == 2


def test_message_over_max_message_bytes_gets_08P01_and_only_that_client_is_closed(bouncer_factory):
    # 1024: the smallest value lokadb's settings table accepts
    b = bouncer_factory(settings={"max_message_bytes": 1024})
    other = b.connect("p0")
    assert other.execute("select 1").fetchone()[0] == 1
    w = b.login("p0")
    assert w.scalar("select '" + "a" * 500 + "'") == "a" * 500    # under the limit: fine
    w.send_msg(b"Q", ("select '" + "b" * 2000 + "'").encode() + b"\0")
    kind, fields = w.outcome(5)
    assert kind == "error", "expected an ErrorResponse before the close"
    assert_error(fields, "08P01")
    w.wait_closed(5)
    assert other.execute("select 2").fetchone()[0] == 2
    assert_serves(b)


def test_client_login_timeout_closes_silent_and_half_started_sockets(bouncer_factory):
    b = bouncer_factory(settings={"client_login_timeout": 1})
    early = b.connect("p0")
    assert early.execute("select 1").fetchone()[0] == 1
    silent = Wire(port=b.port, timeout=6)
    half = Wire(port=b.port, timeout=6)
    b.wires += [silent, half]
    pkt = startup_packet({"user": "trustuser", "database": "p0"})
    half.send(pkt[:len(pkt) // 2])
    start = time.monotonic()
    for w in (silent, half):
        msgs = w.wait_closed(6)
        assert all(t == b"E" for t, _ in msgs), msgs
    assert time.monotonic() - start < 6 * SLOW
    b.wait_log("client_login_timeout")
    # a logged-in client that stays idle longer than the timeout is unaffected
    time.sleep(0.5)
    assert early.execute("select 2").fetchone()[0] == 2
    assert_serves(b)


def test_many_concurrent_clients_under_the_limit_all_work(bouncer_factory):
    b = bouncer_factory(settings={"max_client_conn": 60, "default_pool_size": 4,
                                  "pool_mode": "transaction"})
    conns = [b.connect("p1") for _ in range(40)]
    for i, c in enumerate(conns):
        assert c.execute("select %s::int", (i,)).fetchone()[0] == i
    for c in conns:
        c.close()
    assert_serves(b)


def test_startup_packet_at_the_size_limit_is_accepted(bouncer):
    """A long but legal startup packet (many parameters) still logs in."""
    w = bouncer.wire()
    params = {"user": "trustuser", "database": "p0", "application_name": "a" * 60}
    pkt = startup_packet(params)
    assert len(pkt) < 10000
    w.send(pkt)
    assert w.finish_login("trustuser") is None
    assert w.scalar("show application_name") == "a" * 60
    assert struct.unpack("!I", pkt[:4])[0] == len(pkt)
