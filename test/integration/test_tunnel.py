# SPDX-License-Identifier: ISC
"""The tunnel end to end (doc/tunnel.md): a "cloud" lokadb with the relay
plugin, a site lokadb with the agent plugin dialing it over TLS 1.3, and the
test cluster as the site's PostgreSQL. psycopg talks to the cloud lokadb,
whose [databases] entries with transport=tunnel reach the site's database
through the agent: reads, writes, transactions, COPY both ways, cancel,
a wrong token refused and logged, a stopped agent failing only its own
site's statements at once, the agent redialing a restarted relay, and many
clients sharing the pool."""

import hashlib
import re
import subprocess
import threading
import urllib.request
import time

import pytest
from psycopg import errors

from lokadb_harness import SLOW, BgCall, PgError, free_port, parse_error_fields, wait_until

TOKEN = "acme-token-0123456789abcdef0123456789abcdef"
OTHER_TOKEN = "beta-token-0123456789abcdef0123456789abcdef"
DB = "p1"                       # the site's database (on the test cluster)
USER = "trustuser"


def query_error(b, db):
    """Log in to db (the pool may answer the login itself) and run a query that must
    fail: the PgError of the ErrorResponse that comes before the connection closes."""
    w = b.wire(5.0)
    err = w.login(USER, db, raise_error=False)
    if err is not None:
        return err
    w.send_msg(b"Q", b"select 1\0")
    for typ, payload in w.wait_closed(5.0):
        if typ == b"E":
            return PgError(parse_error_fields(payload))
    raise AssertionError(f"select 1 on {db}: no ErrorResponse")


def sha256_hex(s):
    return hashlib.sha256(s.encode()).hexdigest()


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A CA, the relay's certificate (IP 127.0.0.1) and the SHA-256 pin of its SPKI."""
    d = tmp_path_factory.mktemp("tunnel_certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=tunnel test CA", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "relay.key", "-out", "relay.csr",
            "-subj", "/CN=relay", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName = IP:127.0.0.1, DNS:relay.test\n")
    openssl("x509", "-req", "-in", "relay.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "relay.pem", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    der = subprocess.run(["openssl", "pkey", "-in", str(d / "relay.key"), "-pubout", "-outform", "DER"],
                         check=True, capture_output=True, timeout=60).stdout
    (d / "pin").write_text(hashlib.sha256(der).hexdigest())
    return d


class Tunnel:
    def __init__(self, factory, pg, certs):
        self.factory, self.pg, self.certs = factory, pg, certs
        self.relay_port = free_port()
        self.relay = None
        self.agent = None

    def relay_raw(self, sites=None, max_streams=None, extra=""):
        sites = sites or f"acme:{sha256_hex(TOKEN)}, beta:{sha256_hex(OTHER_TOKEN)}"
        raw = (f"[plugin.relay]\nlisten = 127.0.0.1:{self.relay_port}\n"
               f"cert_file = {self.certs / 'relay.pem'}\nkey_file = {self.certs / 'relay.key'}\n"
               f"sites = {sites}\n")
        if max_streams:
            raw += f"max_streams = {max_streams}\n"
        return raw + extra

    def relay_databases(self):
        return {"org_a": f"transport=tunnel site=acme dbname={DB} pool_mode=transaction pool_size=5",
               "org_a_session": f"transport=tunnel host=acme dbname={DB}",   # host= is an alias of site=
               "org_b": f"transport=tunnel site=beta dbname={DB} pool_mode=transaction",
               "org_b_session": f"transport=tunnel site=beta dbname={DB}",
               "org_a_nodb": "transport=tunnel host=acme dbname=p0 pool_mode=transaction",
               "org_a_p2": "transport=tunnel host=acme dbname=p2 pool_mode=transaction"}

    def start_relay(self, settings=None, **kw):
        self.relay = self.factory(settings={"plugins": "relay", **(settings or {})},
                                  databases=self.relay_databases(), raw=self.relay_raw(**kw))
        return self.relay

    def agent_raw(self, token=TOKEN, verify="pin", site="acme", max_conns=100):
        raw = (f"[plugin.agent]\nrelay = 127.0.0.1:{self.relay_port}\nsite = {site}\ntoken = {token}\n"
               f"databases = {DB}:host=127.0.0.1 port={self.pg.port} dbname={DB}, "
               f"p2:host=127.0.0.1 port={self.pg.port} dbname=p3\n"
               f"max_conns = {max_conns}\n")
        if verify == "pin":
            raw += f"relay_pin = {(self.certs / 'pin').read_text()}\n"
        else:
            raw += f"relay_ca = {self.certs / 'ca.pem'}\n"
        return raw

    def start_agent(self, wait=True, settings=None, **kw):
        self.agent = self.factory(settings={"plugins": "agent", **(settings or {})}, raw=self.agent_raw(**kw))
        if wait:
            self.wait_connected()
        return self.agent

    def agent_row(self, agent=None):
        return (agent or self.agent).admin_dicts("SHOW AGENT")[0]

    def wait_connected(self, agent=None, site="acme"):
        try:
            wait_until(lambda: self.agent_row(agent)["state"] == "connected", 10 * SLOW,
                       what="the agent to connect")
        except AssertionError:
            print("----- agent log -----\n" + (agent or self.agent).log()[-3000:])
            print("----- relay log -----\n" + self.relay.log()[-3000:])
            raise
        wait_until(lambda: any(r["site"] == site and r["state"] == "active"
                               for r in self.relay.admin_dicts("SHOW AGENTS")),
                   5 * SLOW, what="the relay to list the agent")

    def connect(self, db="org_a", **kw):
        return self.relay.connect(db, USER, **kw)


@pytest.fixture
def tunnel(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent()
    return t


@pytest.fixture
def table(pg):
    name = f"tun_{int(time.time() * 1000) % 10**9}"
    pg.sql(f"create table {name} (id int primary key, v text)", dbname=DB)
    pg.sql(f"grant all on {name} to public", dbname=DB)
    yield name
    pg.sql(f"drop table if exists {name}", dbname=DB)


def test_reads_writes_and_a_transaction_go_through_the_tunnel(tunnel, pg, table):
    with tunnel.connect() as c:
        assert c.execute("select current_database()").fetchone()[0] == DB
        c.execute(f"insert into {table} values (1, 'one'), (2, 'two')")
        assert c.execute(f"select v from {table} order by id").fetchall() == [("one",), ("two",)]
    with tunnel.connect(autocommit=False) as c:
        c.execute(f"insert into {table} values (3, 'three')")
        c.execute(f"update {table} set v = 'uno' where id = 1")
        c.rollback()
        c.execute(f"insert into {table} values (4, 'four')")
        c.commit()
    assert pg.sql(f"select id, v from {table} order by id", dbname=DB) == [(1, "one"), (2, "two"), (4, "four")]
    agents = tunnel.relay.admin_dicts("SHOW AGENTS")
    [a] = [r for r in agents if r["site"] == "acme" and r["state"] == "active"]
    assert int(a["bytes_in"]) > 0 and int(a["bytes_out"]) > 0
    assert a["address"].startswith("127.0.0.1:") and a["connected_since"]
    ag = tunnel.agent_row()
    assert ag["site"] == "acme" and int(ag["bytes_in"]) > 0 and int(ag["bytes_out"]) > 0


def test_copy_both_ways_a_few_megabytes(tunnel, pg, table):
    rows = 60000
    payload = "x" * 60
    data = "".join(f"{i}\t{payload}{i}\n" for i in range(rows)).encode()
    assert len(data) > 4 * 1024 * 1024
    with tunnel.connect() as c:
        with c.cursor().copy(f"copy {table} from stdin") as cp:
            for off in range(0, len(data), 65536):
                cp.write(data[off:off + 65536])
        out = bytearray()
        with c.cursor().copy(f"copy (select * from {table} order by id) to stdout") as cp:
            for chunk in cp:
                out += chunk
    assert bytes(out) == data
    assert pg.sql(f"select count(*), sum(length(v)) from {table}", dbname=DB)[0][0] == rows


def test_cancel_goes_through_a_stream(tunnel, pg):
    with tunnel.connect("org_a_session") as c:
        call = BgCall(c.execute, "select pg_sleep(20)")
        wait_until(lambda: pg.sql("select 1 from pg_stat_activity where query = 'select pg_sleep(20)'"
                                  " and state = 'active'"), 5 * SLOW, what="pg_sleep to run")
        c.cancel()
        exc = call.exception(5 * SLOW)
        assert isinstance(exc, errors.QueryCanceled), exc
        assert c.execute("select 2").fetchone()[0] == 2
    assert "cancel" not in [r["state"] for r in tunnel.relay.admin_dicts("SHOW STREAMS")]


def test_show_streams_lists_open_streams(tunnel):
    with tunnel.connect("org_a_session") as c:
        c.execute("select 1")
        rows = tunnel.relay.admin_dicts("SHOW STREAMS")
        assert any(r["site"] == "acme" and r["db"] == DB and r["state"] == "open" for r in rows), rows
        assert int(tunnel.agent_row()["streams"]) >= 1


def test_site_option_and_its_host_alias_reach_the_same_site(tunnel):
    with tunnel.connect("org_a") as a, tunnel.connect("org_a_session") as b:   # site=acme, host=acme
        assert a.execute("select current_database()").fetchone()[0] == DB
        assert b.execute("select current_database()").fetchone()[0] == DB
        streams = tunnel.relay.admin_dicts("SHOW STREAMS")
        assert sum(r["site"] == "acme" and r["state"] == "open" for r in streams) >= 2, streams
    dbs = {r["name"]: r for r in tunnel.relay.admin_dicts("SHOW DATABASES")}
    assert dbs["org_a"]["host"] == dbs["org_a_session"]["host"] == "acme"


def test_unknown_database_at_the_agent_is_refused_clearly(tunnel):
    with pytest.raises(errors.OperationalError) as ei:
        tunnel.connect("org_a_nodb").execute("select 1")
    msg = str(ei.value)
    assert "the agent has no database of that name" in msg, msg
    assert int(tunnel.agent_row()["refused"]) >= 1


def test_agent_checks_the_database_of_the_startup_packet(tunnel):
    """The allow-list entry p2 serves database p3 only: a startup for p2 is refused."""
    err = query_error(tunnel.relay, "org_a_p2")
    assert err.sqlstate.startswith("08"), err.fields
    tunnel.agent.wait_log(r'stream for "p2" refused: its first packet is not a startup for database "p3"')
    with tunnel.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1


def test_wrong_token_is_refused_and_logged(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent(wait=False, token="wrong-token-0123456789abcdef")
    t.relay.wait_log(r'relay: agent 127\.0\.0\.1:\d+ refused: bad token for site "acme"', timeout=10 * SLOW)
    wait_until(lambda: "refused the token" in (t.agent_row()["last_error"] or ""), 10 * SLOW,
               what="the agent to report the refusal")
    assert t.agent_row()["state"] != "connected"
    assert not [r for r in t.relay.admin_dicts("SHOW AGENTS") if r["state"] == "active"]
    with pytest.raises(errors.OperationalError) as ei:
        t.connect().execute("select 1")
    assert 'no agent of site "acme" is connected' in str(ei.value)


def test_agent_with_the_ca_instead_of_a_pin(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent(verify="ca")
    with t.connect() as c:
        assert c.execute("select 42").fetchone()[0] == 42


def test_wrong_pin_is_refused_by_the_agent(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    raw = t.agent_raw().replace((certs / "pin").read_text(), "ab" * 32)
    t.agent = bouncer_factory(settings={"plugins": "agent"}, raw=raw)
    t.agent.wait_log("the relay's public key does not match relay_pin", timeout=10 * SLOW)
    assert t.agent_row()["state"] != "connected"


def test_stopped_agent_fails_only_its_own_site_at_once(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent()
    beta = bouncer_factory(settings={"plugins": "agent"}, raw=t.agent_raw(token=OTHER_TOKEN, site="beta"))
    t.wait_connected(agent=beta, site="beta")
    a = t.connect()
    b = t.connect("org_b")
    assert a.execute("select 1").fetchone()[0] == 1
    assert b.execute("select 2").fetchone()[0] == 2
    t.agent.stop()
    wait_until(lambda: not any(r["site"] == "acme" for r in t.relay.admin_dicts("SHOW AGENTS")),
               10 * SLOW, what="the relay to notice the agent is gone")
    start = time.monotonic()
    with pytest.raises(errors.OperationalError) as ei:
        a.execute("select 1")
        a.execute("select 1")
    err = query_error(t.relay, "org_a")
    assert time.monotonic() - start < 5 * SLOW
    assert 'no agent of site "acme" is connected' in str(err), str(err)
    assert err.sqlstate == "08001", str(err)
    assert "no agent" in str(ei.value)
    assert b.execute("select 3").fetchone()[0] == 3
    a.close()
    b.close()


def test_agent_redials_after_the_relay_restarts(tunnel):
    with tunnel.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1
    tunnel.relay.stop()
    wait_until(lambda: tunnel.agent_row()["state"] != "connected", 10 * SLOW, what="the agent to notice")
    tunnel.relay.start()
    tunnel.wait_connected()
    with tunnel.connect() as c:
        assert c.execute("select 5").fetchone()[0] == 5
    assert int(tunnel.agent_row()["dials"]) >= 2


def test_many_clients_share_the_pool(tunnel, pg):
    errs = []

    def work(i):
        try:
            with tunnel.connect() as c:
                for j in range(20):
                    assert c.execute("select %s::int + %s::int", (i, j)).fetchone()[0] == i + j
        except Exception as e:     # noqa: BLE001 -- reported below
            errs.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60 * SLOW)
    assert not errs, errs[:3]
    n = pg.sql(f"select count(*) from pg_stat_activity where datname = '{DB}' and usename = '{USER}'")[0][0]
    assert n <= 5, n
    rows = [r for r in tunnel.relay.admin_dicts("SHOW STREAMS") if r["site"] == "acme"]
    assert len(rows) <= 6, rows


def test_max_streams_refuses_clearly(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay(max_streams=1)
    t.start_agent()
    c1 = t.connect("org_a_session")
    c1.execute("select 1")
    err = query_error(t.relay, "org_a")
    assert "the relay is at max_streams (1)" in str(err) and err.sqlstate == "08001", str(err)
    t.relay.wait_log(r"max_streams \(1\) reached")
    c1.close()


def test_bad_settings_refuse_the_start(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    b = bouncer_factory(settings={"plugins": "relay"}, raw=t.relay_raw(sites="acme:1234"), start=False)
    r = b.run_foreground()
    assert r.returncode != 0 and "64 hex digits" in r.stderr + r.stdout
    a = bouncer_factory(settings={"plugins": "agent"},
                        raw=re.sub(r"relay_pin = .*\n", "", t.agent_raw()), start=False)
    r = a.run_foreground()
    assert r.returncode != 0 and "relay_ca or relay_pin" in r.stderr + r.stdout


def test_copy_with_small_windows_returns_credit(bouncer_factory, pg, certs, table, monkeypatch):
    """16 KiB stream windows on both ends: a few MB each way need hundreds of
    WINDOW_UPDATEs, sent only as bytes are written onward."""
    monkeypatch.setenv("LOKADB_MUX_WINDOW_KB", "16")
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    t.start_agent()
    rows = 40000
    data = "".join(f"{i}\t{'y' * 70}{i}\n" for i in range(rows)).encode()
    with t.connect() as c:
        with c.cursor().copy(f"copy {table} from stdin") as cp:
            cp.write(data)
        out = bytearray()
        with c.cursor().copy(f"copy (select * from {table} order by id) to stdout") as cp:
            for chunk in cp:
                out += chunk
    assert bytes(out) == data


def test_two_agents_of_a_site_share_it(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    t.start_relay()
    first = t.start_agent()
    second = bouncer_factory(settings={"plugins": "agent"}, raw=t.agent_raw())
    t.wait_connected(agent=second)
    wait_until(lambda: len([r for r in t.relay.admin_dicts("SHOW AGENTS")
                            if r["site"] == "acme" and r["state"] == "active"]) == 2,
               5 * SLOW, what="both sessions to be active")
    with t.connect() as c:
        assert c.execute("select 1").fetchone()[0] == 1
    assert int(t.agent_row(second)["bytes_in"]) > 0      # the newest took the stream
    assert t.agent_row(first)["state"] == "connected"    # and nobody was told to go away
    second.stop()
    wait_until(lambda: len([r for r in t.relay.admin_dicts("SHOW AGENTS") if r["site"] == "acme"]) == 1,
               10 * SLOW, what="the relay to drop the stopped agent")
    with t.connect() as c:
        assert c.execute("select 7").fetchone()[0] == 7
    assert int(t.agent_row(first)["bytes_in"]) > 0


def test_reload_without_the_site_closes_its_session(tunnel):
    tunnel.relay.write_ini(raw=tunnel.relay_raw(sites=f"beta:{sha256_hex(OTHER_TOKEN)}"))
    tunnel.relay.reload()
    wait_until(lambda: "refused the token" in (tunnel.agent_row()["last_error"] or ""), 10 * SLOW,
               what="the agent to be told its site is gone")
    err = query_error(tunnel.relay, "org_a")
    assert 'no tunnel site "acme"' in str(err) and err.sqlstate == "08001", err.fields


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5 * SLOW) as r:
        return r.read().decode()


def test_metrics_of_relay_and_agent(bouncer_factory, pg, certs):
    t = Tunnel(bouncer_factory, pg, certs)
    rport, aport = free_port(), free_port()
    t.start_relay(settings={"metrics_listen": f"127.0.0.1:{rport}"})
    t.start_agent(settings={"metrics_listen": f"127.0.0.1:{aport}"})
    with t.connect("org_a_session") as c:
        c.execute("select 1")
        text = scrape(rport)
        assert 'lokadb_relay_agents{site="acme"} 1' in text, text
        assert 'lokadb_relay_agents{site="beta"} 0' in text, text
        assert 'lokadb_relay_streams{site="acme"} 1' in text, text
        assert 'lokadb_relay_refused{reason="token"} 0' in text, text
        text = scrape(aport)
        assert "lokadb_agent_connected 1" in text and "lokadb_agent_streams 1" in text, text
        assert re.search(r"^lokadb_agent_received_bytes [1-9]", text, re.M), text


def test_a_client_that_stops_reading_stalls_only_its_own_stream(tunnel):
    """A client that asks for ~100 MB and reads nothing fills its stream's
    window; the other streams of the same agent session go on."""
    w = tunnel.relay.wire(5.0)
    w.login(USER, "org_a_session")
    w.send_msg(b"Q", b"select repeat('x', 1000000) from generate_series(1, 100)\0")
    time.sleep(0.5 * SLOW)
    with tunnel.connect() as c:
        for i in range(20):
            assert c.execute("select %s::int", (i,)).fetchone()[0] == i
    streams = [r for r in tunnel.relay.admin_dicts("SHOW STREAMS") if r["site"] == "acme"]
    # one 4 MiB window plus socket and pooler buffers (about 8 MB here), far from 100 MB
    assert streams and max(int(r["bytes_in"]) for r in streams) < 32 * 1024 * 1024, streams
    w.close()


def test_agent_reload_changes_the_allow_list_and_keeps_the_session(tunnel):
    err = query_error(tunnel.relay, "org_a_nodb")           # p0 is not in the allow-list
    assert "the agent has no database of that name" in str(err), err.fields
    dials = int(tunnel.agent_row()["dials"])
    raw = tunnel.agent_raw().replace("databases = ", f"databases = p0:host=127.0.0.1 port={tunnel.pg.port}, ")
    tunnel.agent.write_ini(raw=raw)
    tunnel.agent.reload()                                  # SIGHUP: applied asynchronously

    def p0():
        with tunnel.relay.connect("org_a_nodb", USER) as c:
            return c.execute("select current_database()").fetchone()[0] == "p0"
    wait_until(p0, 5 * SLOW, what="p0 through the tunnel")
    assert int(tunnel.agent_row()["dials"]) == dials       # same relay, site and token: same session
