# SPDX-License-Identifier: ISC
"""Signals (HUP, TERM, INT, QUIT) and daemon mode (-d with a pidfile)."""

import signal
import socket
import time

import psycopg
import pytest

from lokadb_harness import SLOW, assert_shutdown_waits_for, backend_pid, pid_alive, stop_pid, wait_until


def test_sighup_reloads_the_config(bouncer):
    bouncer.write_ini(databases={"pnew": bouncer.server("p2")})
    bouncer.reload()

    def new_entry_works():
        with bouncer.connect("pnew") as c:
            return c.execute("select current_database()").fetchone()[0] == "p2"
    wait_until(new_entry_works, 5 * SLOW, interval=0.1, what="pnew after SIGHUP")
    assert bouncer.alive()


def test_sigterm_lets_clients_finish_and_refuses_new_ones(bouncer):
    a = bouncer.connect("p0")
    backend_pid(a)
    bouncer.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert bouncer.alive(), "SIGTERM must wait for connected clients"
    assert a.execute("select 'still here'").fetchone()[0] == "still here"
    assert_shutdown_waits_for(bouncer, a)


def test_sigint_waits_for_active_transactions_then_exits(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "transaction"})
    a = b.connect("p0")
    a.execute("begin")
    a.execute("create temp table t (x int)")
    b.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert b.alive(), "SIGINT must wait for the open transaction"
    a.execute("insert into t values (1)")
    a.execute("commit")
    assert b.wait_exit(5), "lokadb did not exit after the transaction ended"


def test_sigquit_exits_immediately(bouncer):
    a = bouncer.connect("p0")
    a.execute("begin")
    backend_pid(a)
    start = time.monotonic()
    bouncer.send_signal(signal.SIGQUIT)
    assert bouncer.wait_exit(3), "lokadb still running after SIGQUIT"
    assert time.monotonic() - start < 3 * SLOW
    with pytest.raises(psycopg.OperationalError):
        a.execute("select 1")


def test_daemon_mode_writes_the_pidfile_and_serves(bouncer_factory):
    b = bouncer_factory(start=False)
    pidfile = b.dir / "lokadb.pid"
    b.write_ini(settings={"pidfile": str(pidfile)})
    r = b.run_foreground(["-d"], timeout=10)
    assert r.returncode == 0, r.stderr
    pid = wait_until(lambda: pidfile.exists() and pidfile.read_text().strip()
                     and int(pidfile.read_text().strip()), 5 * SLOW, what="the pidfile")
    b.pid = pid                  # teardown stops the daemon by this pid
    assert pid_alive(pid)
    b.wait_ready()
    with b.connect("p0") as c:
        assert c.execute("select 1").fetchone()[0] == 1
    # the daemon's own lines carry its pid, not the pid of the process that forked it
    started = [ln for ln in b.log().splitlines() if "lokadb " in ln and " started" in ln]
    assert started and f"[{pid}] LOG" in started[-1], started
    assert stop_pid(pid, signal.SIGTERM, 5 * SLOW), "daemon did not stop on SIGTERM"


def test_daemon_mode_without_a_pidfile_is_refused(bouncer_factory):
    b = bouncer_factory(start=False)
    r = b.run_foreground(["-d"], timeout=10)
    assert r.returncode != 0
    assert "pidfile" in (r.stderr + r.stdout).lower()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", b.port), timeout=1).close()
