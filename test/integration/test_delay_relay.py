# SPDX-License-Identifier: ISC
"""delay_relay (test/tools/delay_relay.c), the user-space TCP relay that adds
a one-way delay each way, in front of the real PostgreSQL cluster: a round
trip through it takes at least twice the delay, bytes pass intact both ways
(10 MB COPY in and out), an EOF is passed on, a refused target closes the
client, and bad arguments are refused.

The binary comes from LOKADB_TOOLS_DIR (`make integration` sets it; `make
test-tools` builds it)."""

import hashlib
import os
import socket
import subprocess
import time

import psycopg
import pytest

from lokadb_harness import HERE, SANITIZER_MARKERS, SLOW, bouncer_env, free_port, stop_pid, wait_until

TOOLS_DIR = os.environ.get("LOKADB_TOOLS_DIR") or str((HERE / "../../build/rel/tools").resolve())
DELAY_RELAY = os.path.join(TOOLS_DIR, "delay_relay")


class DelayRelay:
    """One delay_relay process from 127.0.0.1:port to target_port."""

    def __init__(self, tree, target_port, delay_ms, extra=()):
        self.dir = tree.new_dir("delay")
        self.port = free_port()
        self.delay_ms = delay_ms
        self.out = open(self.dir / "stdout", "wb")
        self.err = open(self.dir / "stderr", "wb")
        self.proc = subprocess.Popen(
            [DELAY_RELAY, "--listen", f"127.0.0.1:{self.port}", "--to", f"127.0.0.1:{target_port}",
             "--delay-ms", str(delay_ms), *extra],
            stdout=self.out, stderr=self.err, stdin=subprocess.DEVNULL, env=bouncer_env())
        wait_until(lambda: b"listening on" in (self.dir / "stdout").read_bytes(), 10 * SLOW,
                   what="delay_relay to listen")

    def connect(self, **kw):
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname="postgres", user="postgres",
                               connect_timeout=10, sslmode="disable", gssencmode="disable",
                               autocommit=True, **kw)

    def stop(self):
        """SIGTERM; returns (exit code, stdout, stderr). Sanitizer reports fail the test."""
        stop_pid(self.proc.pid, popen=self.proc)
        self.out.close()
        self.err.close()
        out = (self.dir / "stdout").read_text(errors="replace")
        err = (self.dir / "stderr").read_text(errors="replace")
        for marker in SANITIZER_MARKERS:
            assert marker not in err, f"sanitizer report from delay_relay:\n{err}"
        return self.proc.returncode, out, err


@pytest.fixture
def relay_factory(tmp_tree):
    made = []

    def make(target_port, delay_ms, extra=()):
        r = DelayRelay(tmp_tree, target_port, delay_ms, extra)
        made.append(r)
        return r
    yield make
    for r in made:
        if r.proc.poll() is None:
            r.stop()


def round_trip(conn):
    t0 = time.monotonic()
    assert conn.execute("select 1").fetchone() == (1,)
    return time.monotonic() - t0


@pytest.mark.parametrize("delay_ms", [4.7, 25])
def test_a_round_trip_through_the_relay_takes_at_least_twice_the_delay(pg, relay_factory, delay_ms):
    r = relay_factory(pg.port, delay_ms)
    with r.connect() as c:
        rtts = [round_trip(c) for _ in range(5)]
    # the lower bound is the relay's whole point; no upper bound is asserted
    assert min(rtts) >= 2 * delay_ms / 1000.0, rtts
    code, out, _ = r.stop()
    assert code == 0
    assert "1 connections" in out


def test_ten_megabytes_pass_intact_both_ways(pg, relay_factory):
    r = relay_factory(pg.port, 2)
    table = f"delay_copy_{os.getpid()}"
    lines = [(i, hashlib.sha256(str(i).encode()).hexdigest() * 3) for i in range(52000)]
    sent = b"".join(f"{i}\t{s}\n".encode() for i, s in lines)
    assert len(sent) > 10_000_000
    pg.sql(f"create table {table} (id int primary key, line text)")
    try:
        with r.connect() as c:
            with c.cursor().copy(f"copy {table} (id, line) from stdin") as cp:
                for off in range(0, len(sent), 65536):
                    cp.write(sent[off:off + 65536])
        # what arrived, seen directly
        assert pg.sql(f"select count(*), md5(string_agg(id || E'\\t' || line || E'\\n', '' order by id)) "
                      f"from {table}")[0] == (len(lines), hashlib.md5(sent).hexdigest())
        # and back out through the relay
        got = bytearray()
        with r.connect() as c:
            with c.cursor().copy(f"copy (select id, line from {table} order by id) to stdout") as cp:
                for block in cp:
                    got += block
        assert bytes(got) == sent
    finally:
        pg.sql(f"drop table {table}")
    code, out, _ = r.stop()
    assert code == 0 and "2 connections" in out


def test_a_client_eof_reaches_the_server(pg, relay_factory):
    """The client leaves (Terminate, then close): the EOF is passed on after
    the delay and the backend goes away."""
    r = relay_factory(pg.port, 10)
    with r.connect(application_name="delay_eof") as c:
        pid = c.execute("select pg_backend_pid()").fetchone()[0]
    wait_until(lambda: not pg.backend_alive(pid), 10 * SLOW, what="the backend to exit")


def test_a_client_that_leaves_at_once_is_passed_on_as_eof(relay_factory):
    """The client closes before the relay's own connection is up: the
    target still gets its EOF once that connection is established."""
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen(1)
        target.settimeout(10 * SLOW)
        r = relay_factory(target.getsockname()[1], 20)
        socket.create_connection(("127.0.0.1", r.port), timeout=5).close()
        conn, _ = target.accept()
        with conn:
            conn.settimeout(10 * SLOW)
            assert conn.recv(100) == b""


def test_a_refused_target_closes_the_client(relay_factory):
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    r = relay_factory(dead, 1)
    with pytest.raises(psycopg.OperationalError):
        r.connect()
    assert r.proc.poll() is None        # still serving
    code, out, _ = r.stop()
    assert code == 0 and "1 connections" in out


@pytest.mark.parametrize("args", [
    [],
    ["--listen", "127.0.0.1:1"],
    ["--listen", "127.0.0.1:1", "--to", "127.0.0.1:2", "--delay-ms", "-1"],
    ["--listen", "127.0.0.1:1", "--to", "127.0.0.1:2", "--delay-ms", "abc"],
    ["--listen", "nohost", "--to", "127.0.0.1:2", "--delay-ms", "1"],
    ["--listen", "127.0.0.1:1", "--to", "127.0.0.1:2", "--delay-ms", "1", "--frobnicate", "1"],
])
def test_bad_arguments_are_refused(args):
    p = subprocess.run([DELAY_RELAY, *args], capture_output=True, text=True, timeout=10 * SLOW,
                       env=bouncer_env())
    assert p.returncode == 2
    assert "usage: delay_relay" in p.stderr
