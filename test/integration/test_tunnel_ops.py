# SPDX-License-Identifier: ISC
"""Operating the tunnel (doc/tunnel.md): the relay drains at shutdown
(agents told GOAWAY RELAY_RESTART reconnect at once, to the new process of a
rolling restart; streams still open are reset after 5 s), so a proxy in
front of the relay keeps working across a relay restart; the agent resolves
the relay's name; each site gets a fair share of max_streams and a killed
agent fails only its site; and the hostile or heavy cases of the test
matrix: garbage on the relay port, a slow reader at the window, half-close
both ways, 2048 streams on one session, a replayed proof."""

import asyncio
import os
import re
import resource
import signal
import socket
import ssl
import struct
import subprocess
import time

import psycopg
import pytest

from lokadb_harness import HERE, SLOW, Wire, wait_until
from test_tunnel import (DB, OTHER_TOKEN, TOKEN, USER, Tunnel, certs,  # noqa: F401 -- certs, tunnel: fixtures
                         query_error, tunnel)

REUSE = "so_reuseport = 1\n"


def unix_admin(b, sql):
    """One console command over this process's own unix socket -> list of dicts."""
    with Wire(unix_path=str(b.dir / f".s.PGSQL.{b.settings['listen_port']}"), timeout=5.0) as w:
        w.login("admin", "lokadb", "adminpw")
        res = w.query(sql)
        return [dict(zip(res.columns, r)) for r in res.rows]


def wait_unix_ready(b):
    def ready():
        assert b.proc.poll() is None, f"lokadb exited during startup:\n{b.stderr()[-2000:]}\n{b.log()[-2000:]}"
        return unix_admin(b, "SHOW VERSION")
    wait_until(ready, 10 * SLOW, what=f"lokadb in {b.dir} on its unix socket")


def site_active(b, site="acme"):
    return any(r["site"] == site and r["state"] == "active" for r in unix_admin(b, "SHOW AGENTS"))


def test_rolling_restart_of_the_relay_drains_and_the_proxy_keeps_working(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    old = t.start_relay(settings={"so_reuseport": 1}, extra=REUSE)
    t.start_agent()
    proxy = bouncer_factory(settings={"pool_mode": "transaction"},
                            databases={"app": f"host=127.0.0.1 port={old.port} dbname=org_a"})
    c = proxy.connect("app", USER)
    assert c.execute("select current_database()").fetchone()[0] == DB      # proxy -> relay -> agent
    busy = t.connect("org_a_session")                    # holds its stream until the drain resets it
    assert busy.execute("select 1").fetchone()[0] == 1
    dials = int(t.agent_row()["dials"])

    new = bouncer_factory(settings={"plugins": "relay", "listen_port": old.port, "so_reuseport": 1},
                          databases=t.relay_databases(), raw=t.relay_raw(extra=REUSE), start=False)
    new.start(wait=False)
    wait_unix_ready(new)
    old.send_signal(signal.SIGINT)                       # wait for servers: the relay drains

    wait_until(lambda: site_active(new), 5 * SLOW, what="the agent at the new relay")
    assert int(t.agent_row()["dials"]) == dials + 1      # told to reconnect: one dial, no backoff
    assert old.wait_exit(timeout=10), "the old relay did not exit after its drain"
    log = old.log()
    assert "relay: shutting down: 1 agents told to reconnect" in log, log[-2000:]
    assert re.search(r"drain deadline \(5 s\): [12] streams reset", log), log[-2000:]   # busy (+ idle pooled)
    assert "RELAY_RESTART" in t.agent.log()

    # the proxy's idle server connection to the old relay closed with it; the next
    # query opens a new one, which the port now gives to the new relay
    wait_until(lambda: not proxy.admin_dicts("SHOW SERVERS"), 5 * SLOW, what="the proxy to drop its server")
    assert c.execute("select current_database()").fetchone()[0] == DB
    assert any(r["db"] == DB for r in unix_admin(new, "SHOW STREAMS"))


def test_relay_stopped_by_sigterm_says_goaway_and_its_successor_gets_the_agent(tunnel):
    with tunnel.connect() as c:                          # transaction pool: the stream stays idle in it
        assert c.execute("select current_database()").fetchone()[0] == DB
    assert tunnel.relay.stop(signal.SIGTERM, timeout=5 + 5), "SIGTERM did not stop the relay"
    assert "relay: shutting down: 1 agents told to reconnect" in tunnel.relay.log()
    wait_until(lambda: "RELAY_RESTART" in tunnel.agent.log(), 5 * SLOW, what="the agent to read the GOAWAY")
    old = tunnel.relay
    tunnel.start_relay()                                 # the same relay port, a new process
    assert tunnel.relay is not old
    tunnel.wait_connected()                              # within 10 s; backoff restarted at 250 ms
    with tunnel.connect() as c:
        assert c.execute("select current_database()").fetchone()[0] == DB


def test_agent_resolves_the_relay_name(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    raw = t.agent_raw().replace(f"relay = 127.0.0.1:{t.relay_port}", f"relay = localhost:{t.relay_port}")
    assert f"relay = localhost:{t.relay_port}" in raw
    t.agent = bouncer_factory(settings={"plugins": "agent"}, raw=raw)
    t.wait_connected()
    assert t.agent_row()["relay"] == f"localhost:{t.relay_port}"
    assert any(r["hostname"] == "localhost" for r in t.agent.admin_dicts("SHOW DNS_HOSTS"))   # the core's cache
    with t.connect() as c:
        assert c.execute("select current_database()").fetchone()[0] == DB


def test_agent_with_an_unresolvable_relay_name_says_so_and_keeps_trying(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    raw = t.agent_raw().replace(f"relay = 127.0.0.1:{t.relay_port}", f"relay = no-such-relay.invalid:{t.relay_port}")
    t.agent = bouncer_factory(settings={"plugins": "agent", "dns_nxdomain_ttl": 1}, raw=raw)
    wait_until(lambda: "cannot resolve relay no-such-relay.invalid" in (t.agent_row()["last_error"] or ""),
               15 * SLOW, what="the resolver's answer")
    assert t.agent_row()["state"] in ("backoff", "resolving")
    wait_until(lambda: int(t.agent_row()["dials"]) == 0 and t.agent.log().count("cannot resolve relay") >= 2,
               20 * SLOW, what="a second try")
    bad = t.agent_raw().replace(f"relay = 127.0.0.1:{t.relay_port}", "relay = bad_name!:1")
    t.agent.write_ini(raw=bad)
    res = t.agent.admin_result("RELOAD")
    assert res.error is not None and "neither a numeric address nor a host name" in str(res.error), res.error


def test_a_busy_site_gets_its_fair_share_and_a_killed_agent_fails_only_its_site(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay(max_streams=6, extra="site_min_streams = 1\n")    # 2 sites connected: 3 each
    t.start_agent()
    beta = bouncer_factory(settings={"plugins": "agent"}, raw=t.agent_raw(token=OTHER_TOKEN, site="beta"))
    t.wait_connected(agent=beta, site="beta")
    held = []
    for _ in range(3):                                   # session mode: each client holds a stream
        c = t.connect("org_a_session")
        c.execute("select 1")
        held.append(c)
    # a pool with no server of its own gets the refusal at once (one that has servers
    # waits for one of them, up to query_wait_timeout, as for any failed connect)
    err = query_error(t.relay, "org_a")
    assert err.sqlstate == "08001", err.fields
    assert 'site "acme" holds 3 streams, its fair share of max_streams (6) with 2 sites connected' in str(err), \
        str(err)
    t.relay.wait_log(r'relay: stream refused: site "acme" holds 3 streams')
    for _ in range(3):                                   # what acme may not take is still there for beta
        c = t.connect("org_b_session")
        c.execute("select 1")
        held.append(c)
    err = query_error(t.relay, "org_b")
    assert "the relay is at max_streams (6)" in str(err), str(err)
    for c in held[3:]:
        c.close()
    beta.stop(signal.SIGKILL)                            # beta gone: acme may use all six
    wait_until(lambda: not any(r["site"] == "beta" for r in t.relay.admin_dicts("SHOW AGENTS")),
               10 * SLOW, what="the relay to notice beta is gone")
    err = query_error(t.relay, "org_b")                  # the killed agent fails its own site only
    assert 'no agent of site "beta" is connected' in str(err) and err.sqlstate == "08001", str(err)
    assert held[0].execute("select 2").fetchone()[0] == 2
    more = [t.connect("org_a", autocommit=False) for _ in range(3)]   # org_a_session has pool_size 5
    for c in more:
        assert c.execute("select 1").fetchone()[0] == 1                # a transaction holds its stream
    assert sum(r["site"] == "acme" for r in t.relay.admin_dicts("SHOW STREAMS")) == 6
    for c in held[:3] + more:
        c.close()


def read_until_closed(sock, timeout):
    """Everything the peer sends until it closes (bounded)."""
    sock.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            return got
        if not chunk:
            return got
        got += chunk
        assert len(got) < 1 << 20


def test_garbage_on_the_relay_port_is_refused_and_logged(tunnel):
    port = tunnel.relay_port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:    # not even TLS
        s.sendall(b"GET / HTTP/1.1\r\nHost: relay\r\n\r\n" + os.urandom(512))
        read_until_closed(s, 5 * SLOW)
    tunnel.relay.wait_log(r"relay: TLS with 127\.0\.0\.1:\d+ failed", timeout=5)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:    # TLS, then no preface
        with ctx.wrap_socket(raw) as s:
            assert s.version() == "TLSv1.3"
            s.sendall(os.urandom(4096))
            read_until_closed(s, 5 * SLOW)
    tunnel.relay.wait_log(r"relay: session of agent 127\.0\.0\.1:\d+ \(site \"\"\) failed: PROTOCOL", timeout=5)

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:    # TLS, then silence
        with ctx.wrap_socket(raw) as s:
            assert read_until_closed(s, 15 * SLOW) == b""                     # the 10 s HELLO deadline
    tunnel.relay.wait_log(r"relay: 127\.0\.0\.1:\d+ sent no valid HELLO within 10 s", timeout=5)

    rows = tunnel.relay.admin_dicts("SHOW AGENTS")
    assert [r["site"] for r in rows] == ["acme"], rows                       # the agent was not disturbed
    with tunnel.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_a_slow_reader_of_copy_to_stdout_stalls_the_stream_then_gets_every_row(bouncer_factory, pg, certs,
                                                                              monkeypatch):
    """Window exhaustion: 64 KiB stream windows, a client that asks COPY TO
    STDOUT for 40 MB and reads nothing. The stream stops at its window plus
    the buffers after it (the backend waits in ClientWrite), other clients go
    on, and once the client reads, credit flows again and every row comes."""
    monkeypatch.setenv("LOKADB_MUX_WINDOW_KB", "64")
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent()
    rows, width = 40000, 1000
    w = t.relay.wire(5.0)
    w.login(USER, "org_a_session")
    w.send_msg(b"Q", f"copy (select repeat('x', {width}) from generate_series(1, {rows})) to stdout\0".encode())

    def stalled_in_client_write():
        return pg.sql("select 1 from pg_stat_activity where wait_event = 'ClientWrite' "
                      "and query like 'copy (select repeat%'")
    wait_until(stalled_in_client_write, 10 * SLOW, what="the backend to block on its client")

    def copy_stream_bytes():                             # the stream that has carried the most
        return max(int(r["bytes_in"]) for r in t.relay.admin_dicts("SHOW STREAMS") if r["site"] == "acme")
    samples = [copy_stream_bytes()]

    def settled():                                       # the buffers after the window filled up
        time.sleep(0.3)
        samples.append(copy_stream_bytes())
        return samples[-1] == samples[-2]
    wait_until(settled, 20 * SLOW, interval=0, what="the stream to stop")
    with t.connect() as c:                               # another stream of the session is not held up
        assert c.execute("select 42").fetchone()[0] == 42
    time.sleep(0.5)
    assert copy_stream_bytes() == samples[-1]
    assert samples[-1] < 16 * 1024 * 1024, samples      # far below the 40 MB asked for

    got = 0
    while True:
        typ, payload = w.read_msg(timeout=30)
        if typ == b"d":
            got += len(payload)
        elif typ == b"C":
            assert payload.rstrip(b"\0") == f"COPY {rows}".encode()
        elif typ == b"Z":
            break
        else:
            assert typ in (b"H", b"c"), (typ, payload[:200])   # CopyOutResponse, CopyDone
    assert got == rows * (width + 1)
    w.close()


def test_half_close_delivers_the_last_bytes_both_ways(tunnel, pg):
    """The database closes first: its last message (a FATAL) comes before the
    FIN, the core reads it and closes its end, both FINs close the stream
    cleanly. The pool closes first: its Terminate reaches the backend, which
    exits; nothing is left open on either end."""
    def no_streams():
        return (not [r for r in tunnel.relay.admin_dicts("SHOW STREAMS") if r["site"] == "acme"]
                and tunnel.agent_row()["streams"] == "0")

    c = tunnel.connect("org_a_session")
    pid = c.execute("select pg_backend_pid()").fetchone()[0]
    with pytest.raises(psycopg.OperationalError) as ei:
        c.execute("select pg_terminate_backend(pg_backend_pid())")
    assert "terminating connection due to administrator command" in str(ei.value), str(ei.value)
    c.close()
    wait_until(no_streams, 5 * SLOW, what="the stream to close")
    assert not pg.sql(f"select 1 from pg_stat_activity where pid = {pid}")

    c = tunnel.connect("org_a_session")
    pid = c.execute("select pg_backend_pid()").fetchone()[0]
    tunnel.relay.admin("KILL org_a_session")             # the pool closes the server connection
    wait_until(lambda: not pg.sql(f"select 1 from pg_stat_activity where pid = {pid}"), 5 * SLOW,
               what="the backend to get the Terminate and exit")
    wait_until(no_streams, 5 * SLOW, what="the stream to close")
    c.close()
    assert "RST" not in tunnel.agent.log() and "CANCEL" not in tunnel.relay.log()


# ------------------------------------------------------------ 2048 streams --

def pg_msg(typ, payload=b""):
    return typ + struct.pack("!I", len(payload) + 4) + payload


async def fake_server(reader, writer, conns):
    """Just enough of a PostgreSQL server for a pooler's login and `select`:
    trust, then ReadyForQuery; every Query gets CommandComplete."""
    try:
        (n,) = struct.unpack("!I", await reader.readexactly(4))
        await reader.readexactly(n - 4)
        out = pg_msg(b"R", struct.pack("!I", 0))
        for k, v in (("server_version", "15.0"), ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
                     ("integer_datetimes", "on"), ("standard_conforming_strings", "on")):
            out += pg_msg(b"S", k.encode() + b"\0" + v.encode() + b"\0")
        out += pg_msg(b"K", struct.pack("!II", len(conns) + 1, 7)) + pg_msg(b"Z", b"I")
        writer.write(out)
        conns.append(writer)
        while True:
            typ = await reader.readexactly(1)
            (n,) = struct.unpack("!I", await reader.readexactly(4))
            await reader.readexactly(n - 4)
            if typ == b"X":
                break
            if typ == b"Q":
                writer.write(pg_msg(b"C", b"SELECT 0\0") + pg_msg(b"Z", b"I"))
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def login(port, db):
    """A client logged in to db (session mode: it holds its server); or the error."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    params = b"user\0" + USER.encode() + b"\0database\0" + db.encode() + b"\0\0"
    writer.write(struct.pack("!II", 8 + len(params), 196608) + params)
    while True:
        typ = await reader.readexactly(1)
        (n,) = struct.unpack("!I", await reader.readexactly(4))
        payload = await reader.readexactly(n - 4)
        if typ == b"E":
            writer.close()
            return None, payload
        if typ == b"Z":
            return (reader, writer), None


async def select(conn):
    reader, writer = conn
    writer.write(pg_msg(b"Q", b"select\0"))
    tags = []
    while True:
        typ = await reader.readexactly(1)
        (n,) = struct.unpack("!I", await reader.readexactly(4))
        payload = await reader.readexactly(n - 4)
        if typ == b"C":
            tags.append(payload)
        if typ == b"Z":
            return tags


def test_2048_streams_on_one_session(bouncer_factory, pg, certs):
    """max_streams (2048) server connections, each a stream of one agent
    session, to a small fake server (PostgreSQL would need 2048 backends):
    all log in and answer, the 2049th is refused at once, and closing them
    leaves no stream behind."""
    n = 2048
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * n + 200:
        pytest.skip(f"needs {2 * n + 200} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 3 * n)), hard))
    t = Tunnel(bouncer_factory, pg, certs)

    async def run():
        conns = []
        server = await asyncio.start_server(lambda r, w: fake_server(r, w, conns), "127.0.0.1", 0, backlog=n)
        fake_port = server.sockets[0].getsockname()[1]
        dbs = t.relay_databases()
        dbs["fake"] = f"transport=tunnel site=acme dbname=fake pool_size={n + 10}"
        t.relay = bouncer_factory(settings={"plugins": "relay", "max_client_conn": n + 100},
                                  databases=dbs, raw=t.relay_raw())
        raw = t.agent_raw(max_conns=n).replace("databases = ", f"databases = fake:host=127.0.0.1 port={fake_port}, ")
        t.agent = bouncer_factory(settings={"plugins": "agent"}, raw=raw)
        await asyncio.to_thread(t.wait_connected)
        clients = []
        for i in range(0, n, 128):                       # 128 clients in flight at a time
            got = await asyncio.wait_for(asyncio.gather(*[login(t.relay.port, "fake") for _ in range(128)]),
                                         30 * SLOW)
            errs = [e for _, e in got if e is not None]
            assert not errs, errs[:3]
            batch = [c for c, _ in got]
            tags = await asyncio.wait_for(asyncio.gather(*[select(c) for c in batch]), 30 * SLOW)
            assert all(tg == [b"SELECT 0\0"] for tg in tags)    # session mode: each keeps its server
            clients += batch
        assert len(conns) == n
        rows = await asyncio.to_thread(t.relay.admin_dicts, "SHOW AGENTS")
        assert [int(r["streams"]) for r in rows if r["site"] == "acme"] == [n], rows
        c, err = await asyncio.wait_for(login(t.relay.port, "org_a"), 10 * SLOW)   # a pool with no server
        assert c is None and b"the relay is at max_streams (2048)" in err, err
        tags = await asyncio.wait_for(asyncio.gather(*[select(c) for c in clients[::16]]), 30 * SLOW)
        assert all(tg == [b"SELECT 0\0"] for tg in tags)
        for r, w in clients:
            w.close()
        await asyncio.to_thread(t.relay.admin, "KILL fake")
        await asyncio.to_thread(wait_until, lambda: not t.relay.admin_dicts("SHOW STREAMS"), 20 * SLOW,
                                what="every stream to close")
        server.close()
        return conns

    asyncio.run(run())
    assert t.agent_row()["streams"] == "0"


# ------------------------------------------------------------ replayed proof --

TOOLS_DIR = os.environ.get("LOKADB_TOOLS_DIR") or str((HERE / "../../build/rel/tools").resolve())


def tunnel_hello(port, *args):
    tool = os.path.join(TOOLS_DIR, "tunnel_hello")
    assert os.path.exists(tool), f"{tool}: run `make test-tools`"
    return subprocess.run([tool, "127.0.0.1", str(port), *args], capture_output=True, text=True,
                          timeout=30 * SLOW)


def test_a_replayed_proof_is_refused(bouncer_factory, pg, certs):
    """A proof binds the token to one TLS connection (the exporter): the
    proof of an accepted session, sent on another connection, is refused."""
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    ok = tunnel_hello(t.relay_port, "acme", TOKEN)       # the tool's own proof is good
    assert ok.returncode == 0 and ok.stdout == "accepted\n", ok
    r = tunnel_hello(t.relay_port, "acme", TOKEN, "replay")
    assert r.stdout == "A: accepted\nB: refused UNAUTHORIZED\n", r
    assert r.returncode == 0, r
    t.relay.wait_log(r'relay: agent 127\.0\.0\.1:\d+ refused: bad token for site "acme"')
    bad = tunnel_hello(t.relay_port, "acme", "not-the-token-of-acme-0123456789")
    assert bad.stdout == "refused UNAUTHORIZED\n", bad


def test_an_agent_that_shuts_down_says_goaway_first(tunnel):
    with tunnel.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1
    assert tunnel.agent.stop(signal.SIGTERM), "the agent did not stop on SIGTERM"
    going = r'relay: agent of site "acme" \(127\.0\.0\.1:\d+\) is going away: NO_ERROR the agent is shutting down'
    gone = r'relay: agent of site "acme" \(127\.0\.0\.1:\d+\) disconnected'
    tunnel.relay.wait_log(going, timeout=5)
    # the server connection of the first client may still be idle in the
    # relay's pool until the session closes: query once it has
    tunnel.relay.wait_log(gone, timeout=5)
    log = tunnel.relay.log()
    assert re.search(going, log).start() < re.search(gone, log).start(), log[-3000:]
    err = query_error(tunnel.relay, "org_a")
    assert 'no agent of site "acme" is connected' in str(err) and err.sqlstate == "08001", str(err)


def test_a_draining_agent_session_carries_no_new_transaction(tunnel):
    """An agent session that says GOAWAY (here a reload that changes the
    agent's check of the relay, so it dials a new session and the old one
    drains) keeps its streams, but the relay's pool stops handing their
    server connections out: the idle one closes at once, the busy one when
    its transaction ends, and the next transactions run over the new
    session, after which the old session closes."""
    def servers():
        return [r for r in tunnel.relay.admin_dicts("SHOW SERVERS") if r["database"] == "org_a"]

    def acme_sessions():
        return [r for r in tunnel.relay.admin_dicts("SHOW AGENTS") if r["site"] == "acme"]

    with tunnel.connect() as idle, tunnel.connect(autocommit=False) as busy:
        busy_pid = busy.execute("select pg_backend_pid()").fetchone()[0]     # its transaction stays open
        idle_pid = idle.execute("select pg_backend_pid()").fetchone()[0]     # its server goes back to the pool
        assert idle_pid != busy_pid
        before = servers()
        assert sorted(r["state"] for r in before) == ["active", "idle"], before
        tunnel.agent.write_ini(raw=tunnel.agent_raw(verify="ca"))       # relay_pin -> relay_ca: a new session
        tunnel.agent.reload()
        tunnel.relay.wait_log(r'relay: agent of site "acme" \(127\.0\.0\.1:\d+\) is going away: NO_ERROR '
                              r'agent reconfigured', timeout=10)
        tunnel.relay.wait_log(r'relay: agent of site "acme" \(127\.0\.0\.1:\d+\): 1 idle server connection '
                              r'over it closed, 1 to close when released', timeout=5)
        wait_until(lambda: sorted(r["state"] for r in acme_sessions()) == ["active", "draining"], 10 * SLOW,
                   what="the new session and the draining one")
        now = servers()
        assert [(r["state"], r["close_needed"]) for r in now] == [("active", "1")], now
        # the transaction in flight finishes over the draining session
        assert busy.execute("select pg_backend_pid()").fetchone()[0] == busy_pid
        busy.commit()
        wait_until(lambda: not servers(), 5 * SLOW, what="the busy server connection to close when released")
        # new transactions go over the new session, to new backends
        pid = idle.execute("select pg_backend_pid()").fetchone()[0]
        assert pid not in (idle_pid, busy_pid)
        assert busy.execute("select 1").fetchone()[0] == 1
        busy.commit()
        wait_until(lambda: [r["state"] for r in acme_sessions()] == ["active"], 10 * SLOW,
                   what="the drained session to close")
    rows = tunnel.pg.sql(f"select count(*) from pg_stat_activity where pid in ({idle_pid}, {busy_pid})")
    assert rows[0][0] == 0, rows
