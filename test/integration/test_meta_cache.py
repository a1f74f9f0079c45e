# SPDX-License-Identifier: ISC
"""The meta_cache plugin (issue 4): the LokaDB catalog of the cloud database
cached in lokadb, kept current by LISTEN lokadb_meta, checked for new
connections unless verified within `verify`, served stale (and retried)
while the cloud database is unavailable, and published as the service
"meta_cache.v1" -- which the test plugin t_mc_client (test/plugins/) looks
up and shows through the console (SHOW T_MC ...) and a live session
(SELECT 't_mc_version', held with wait() like org_routing holds statements).

Each test gets its own cloud database with plugins/move/catalog.sql run in
it; catalog rows are written with SQL directly (no move plugin needed)."""

import itertools
import os
import select
import socket
import threading
import time
from pathlib import Path

import psycopg
import pytest

from lokadb_harness import (CONSOLE_USERS, HERE, SLOW, BgCall, assert_error, default_bin,
                            startup_packet, wait_until)

REPO = (HERE / "../..").resolve()
CATALOG_SQL = (REPO / "plugins/move/catalog.sql").read_text()
TEST_PLUGIN_DIR = Path(os.environ.get("LOKADB_TEST_PLUGIN_DIR")
                       or REPO / "build/rel/test-plugins")
SHOW_COLUMNS = ["state", "version", "tables", "orgs", "partitions", "last_load", "last_verify",
                "last_error", "loads", "verifications", "notifications", "reloading", "waiting",
                "setting_readers"]
_db_numbers = itertools.count(1)


# ------------------------------------------------------------------ setup --

@pytest.fixture(scope="module")
def plugin_dir(tmp_tree):
    """meta_cache.so (built next to the lokadb binary) and t_mc_client.so in one directory."""
    mc = Path(default_bin()).resolve().parent / "plugins/meta_cache/meta_cache.so"
    client = TEST_PLUGIN_DIR / "t_mc_client.so"
    for f in (mc, client):
        assert f.exists(), f"{f} is missing: run `make all test-plugins`"
    d = tmp_tree.new_dir("mc-plugins")
    (d / "meta_cache.so").symlink_to(mc)
    (d / "t_mc_client.so").symlink_to(client)
    return str(d)


class Cloud:
    """A cloud database of its own on the test cluster, catalog installed or not."""

    def __init__(self, pg, install=True):
        self.pg = pg
        self.dbname = f"mc_cloud_{os.getpid()}_{next(_db_numbers)}"
        pg.sql(f"CREATE DATABASE {self.dbname}")
        if install:
            self.sql(CATALOG_SQL)

    def conninfo(self, port=None):
        return f"host=127.0.0.1 port={port or self.pg.port} dbname={self.dbname} user=postgres"

    def connect(self):
        return self.pg.connect(dbname=self.dbname)

    def sql(self, query, params=None):
        with self.connect() as c:
            cur = c.execute(query, params)
            return cur.fetchall() if cur.description else None

    def version(self):
        return int(self.sql("SELECT value FROM lokadb.meta WHERE key = 'version'")[0][0])

    def silent(self, query):
        """Change the catalog without firing its triggers: no version bump, no NOTIFY."""
        with self.connect() as c:
            c.execute("SET session_replication_role = replica")
            c.execute(query)

    def drop(self):
        self.pg.sql(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")


@pytest.fixture
def cloud(pg):
    c = Cloud(pg)
    yield c
    c.drop()


def start(bouncer_factory, plugin_dir, cloud_conninfo, watch="trustuser", start=True, **mc):
    """lokadb with meta_cache (+ t_mc_client) and [plugin.meta_cache] cloud = ... plus mc."""
    conf = {"cloud": cloud_conninfo, **mc}
    raw = "[plugin.meta_cache]\n" + "".join(f"{k} = {v}\n" for k, v in conf.items())
    raw += f"\n[plugin.t_mc_client]\nwatch = {watch}\n"
    return bouncer_factory(settings={"plugin_dir": plugin_dir, "plugins": "meta_cache t_mc_client"},
                           raw=raw, start=start)


def show(b, user="admin"):
    res = b.admin_result("SHOW META_CACHE", user=user)
    assert res.error is None, res.error
    assert res.columns == SHOW_COLUMNS
    assert len(res.rows) == 1
    return dict(zip(res.columns, res.rows[0]))


def t_mc(b, args=""):
    return b.admin_dicts(f"SHOW T_MC {args}".strip())


def wait_show(b, pred, what, timeout=5):
    box = {}

    def check():
        box["row"] = show(b)
        return pred(box["row"])
    try:
        wait_until(check, timeout * SLOW, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; last SHOW META_CACHE: {box.get('row')}") from None
    return box["row"]


def wait_ready(b, timeout=5):
    return wait_show(b, lambda r: r["state"] == "ready", "state ready", timeout)


def live_version(conn):
    """What a live session's next statement sees: (version, held)."""
    return conn.execute("SELECT 't_mc_version'").fetchone()


def add_org(cloud, org_id, name=None, **cols):
    names = ["id", "name", *cols]
    values = [str(org_id), name or f"org {org_id}", *cols.values()]
    cloud.sql(f"INSERT INTO lokadb.orgs ({', '.join(names)}) VALUES "
              f"({', '.join(['%s'] * len(values))})", values)


def add_table(cloud, schema, name, org_column="organization_id", org_type="bigint"):
    cloud.sql("INSERT INTO lokadb.tables (schema_name, table_name, org_column, org_type, default_part)"
              " VALUES (%s, %s, %s, %s, %s)", (schema, name, org_column, org_type, f"{name}_default"))


class Forwarder:
    """A TCP forwarder 127.0.0.1:port -> the cluster, standing in for the network
    between lokadb and the cloud database: stop() closes it (connections refused,
    open ones cut), freeze() keeps connections open but stops moving bytes."""

    def __init__(self, target_port):
        self.target = target_port
        self.port = None
        self.frozen = threading.Event()
        self.lsock = None
        self.socks = []
        self.lock = threading.Lock()
        self.start()

    def start(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", self.port or 0))
        self.port = self.lsock.getsockname()[1]
        self.lsock.listen(16)
        threading.Thread(target=self._accept, args=(self.lsock,), daemon=True).start()

    def _accept(self, lsock):
        while True:
            try:
                a, _ = lsock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                a.close()
                continue
            with self.lock:
                self.socks += [a, b]
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        peer = {a: b, b: a}
        try:
            while True:
                if self.frozen.is_set():
                    time.sleep(0.02)
                    continue
                r, _, _ = select.select([a, b], [], [], 0.05)
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        raise OSError("closed")
                    peer[s].sendall(data)
        except (OSError, ValueError):
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def stop(self):
        """Refuse new connections and cut the open ones."""
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)   # wakes the thread blocked in accept()
        except OSError:
            pass
        self.lsock.close()
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def freeze(self):
        self.frozen.set()

    def thaw(self):
        self.frozen.clear()


@pytest.fixture
def forwarder(pg):
    f = Forwarder(pg.port)
    yield f
    f.thaw()
    f.stop()


# ------------------------------------------------------------ the tests --

def test_the_catalog_is_loaded_at_start_and_shown_to_stats_users(bouncer_factory, plugin_dir, cloud):
    add_table(cloud, "public", "documents")
    add_table(cloud, "public", "versions")
    for i in (1, 2, 3):
        add_org(cloud, i)
    cloud.sql("UPDATE lokadb.orgs SET isolated = true WHERE id = '2'")
    cloud.sql("INSERT INTO lokadb.partitions VALUES ('public', 'documents', '2', 'documents_o2', "
              "'documents_o2_1')")
    b = start(bouncer_factory, plugin_dir, cloud.conninfo())
    row = wait_ready(b)
    assert int(row["version"]) == cloud.version()
    assert (row["tables"], row["orgs"], row["partitions"]) == ("2", "3", "1")
    assert int(row["loads"]) >= 1 and row["last_load"].endswith(" UTC") and row["last_error"] is None
    assert row["reloading"] == "f"
    # not admin-only; META_CACHE RELOAD is
    assert show(b, user="stats")["state"] == "ready"
    assert_error(b.admin_result("META_CACHE RELOAD", user="stats").error, "42501")
    st = t_mc(b)[0]
    assert (st["ready"], st["stale"], st["version"], st["n_tables"]) == ("1", "0", row["version"], "2")
    assert int(st["size"]) > 0 and int(st["changes"]) >= 1


def test_a_missing_catalog_is_an_empty_catalog_then_picked_up_when_installed(
        bouncer_factory, plugin_dir, pg):
    cloud = Cloud(pg, install=False)
    try:
        b = start(bouncer_factory, plugin_dir, cloud.conninfo())
        row = wait_show(b, lambda r: r["state"] == "not installed", "state not installed")
        assert (row["version"], row["tables"], row["orgs"], row["last_error"]) == ("0", "0", "0", None)
        assert "ERROR" not in b.log() and "WARNING" not in b.log()
        assert t_mc(b, "TABLE public.documents") == []
        cloud.sql(CATALOG_SQL)          # INSTALL does not notify ...
        add_org(cloud, 7)               # ... the first change does
        row = wait_show(b, lambda r: r["state"] == "ready" and r["orgs"] == "1", "catalog installed")
        assert int(row["version"]) == cloud.version()
        assert t_mc(b, "ORG 7")[0]["name"] == "org 7"
    finally:
        cloud.drop()


def test_a_change_is_seen_by_a_live_console_and_a_live_session(bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo())
    before = wait_ready(b)
    console = b.login(dbname="lokadb", user="admin", password=CONSOLE_USERS["admin"])
    session = b.connect("p0", "trustuser")
    assert live_version(session) == (int(before["version"]), False)

    add_org(cloud, 42, "answer", profile="fdw+direct")
    v = cloud.version()

    def console_sees():
        res = console.query("SHOW META_CACHE")
        r = dict(zip(res.columns, res.rows[0]))
        return r["version"] == str(v) and r["orgs"] == "1" and r
    r = wait_until(console_sees, 5 * SLOW, what="the live console to see the new version")
    assert int(r["notifications"]) >= 1
    assert live_version(session)[0] == v
    org = t_mc(b, "ORG 42")[0]
    assert (org["name"], org["state"], org["site"], org["profile"], org["isolated"], org["paused"]) == \
        ("answer", "cloud", None, "fdw+direct", "0", "0")
    st = t_mc(b)[0]
    assert st["change_version"] == str(v)


def test_service_lookups_by_name_search_path_org_and_leaf(bouncer_factory, plugin_dir, cloud):
    cloud.sql('CREATE SCHEMA app; CREATE SCHEMA shadow; CREATE SCHEMA alice; CREATE SCHEMA "Mixed";'
              "CREATE TABLE shadow.documents (id int); CREATE VIEW shadow.versions AS SELECT 1 AS x")
    add_table(cloud, "public", "documents")
    add_table(cloud, "public", "versions")
    add_table(cloud, "app", "events", org_column="tenant", org_type="uuid")
    add_table(cloud, "alice", "notes")
    add_table(cloud, "Mixed", "Docs")
    add_org(cloud, 1)
    add_org(cloud, 2, isolated=True)
    cloud.sql("INSERT INTO lokadb.partitions VALUES ('public', 'documents', '2', 'documents_o2',"
              " 'documents_o2_1'), ('public', 'documents', '1', 'documents_o1', 'documents_o1_1'),"
              " ('app', 'events', '2', 'events_o2', 'events_o2_app')")
    add_org(cloud, 4, isolated=True)
    for k in range(12):
        add_table(cloud, "public", f"t{k}")
        cloud.sql(f"INSERT INTO lokadb.partitions VALUES ('public', 't{k}', '4', 't{k}_o4', 't{k}_o4_1')")
    b = start(bouncer_factory, plugin_dir, cloud.conninfo())
    wait_ready(b)

    ev = t_mc(b, "TABLE app.events")
    assert ev == [{"schema": "app", "name": "events", "org_column": "tenant", "org_type": "uuid",
                   "default_part": "events_default"}]
    assert t_mc(b, "TABLE public.events") == []
    assert t_mc(b, "TABLE Mixed.Docs")[0]["name"] == "Docs"

    def search(name, path, user="-"):
        rows = t_mc(b, f"SEARCH {name} | {path} | {user}")
        return f"{rows[0]['schema']}.{rows[0]['name']}" if rows else None

    # PostgreSQL's default path: "$user", public
    assert search("documents", "-") == "public.documents"
    assert search("notes", "-", "alice") == "alice.notes"       # "$user" expands to the user
    assert search("notes", "-", "bob") is None
    assert search("notes", "-") is None
    assert search("events", "app, public") == "app.events"
    assert search("events", "public") is None
    assert search("events", "APP") == "app.events"               # unquoted: downcased
    assert search("events", '"APP"') is None                     # quoted: as written
    assert search("Docs", '"Mixed"') == "Mixed.Docs"
    assert search("Docs", "Mixed") is None
    assert search("documents", "pg_catalog, pg_temp, public") == "public.documents"
    # another relation of that name earlier on the path hides the LokaDB table
    assert search("documents", "shadow, public") is None
    assert search("versions", "shadow, public") is None
    assert search("documents", "public, shadow") == "public.documents"
    assert search("documents", '"$user", app, public', "alice") == "public.documents"
    assert search("documents", "") is None                        # an empty path finds nothing
    assert search("documents", "public,") is None                 # not a valid list

    assert t_mc(b, "ORG 2")[0]["isolated"] == "1"
    assert t_mc(b, "ORG 3") == []
    assert t_mc(b, "LEAF public.documents 2") == [{"leaf": "documents_o2_1"}]
    # organization 1 has a partitions row but is not isolated (yet): no leaf
    assert t_mc(b, "LEAF public.documents 1") == [{"leaf": None}]
    assert t_mc(b, "LEAF public.versions 2") == [{"leaf": None}]
    # an organization's partitions are found by schema and name (its own
    # few compared, the catalog-wide table past a handful: both ways)
    assert t_mc(b, "LEAF app.events 2") == [{"leaf": "events_o2_app"}]
    assert t_mc(b, "LEAF Mixed.events 2") == [{"leaf": None}]
    for k in range(12):
        assert t_mc(b, f"LEAF public.t{k} 4") == [{"leaf": f"t{k}_o4_1"}]
        assert t_mc(b, f"LEAF public.t{k} 2") == [{"leaf": None}]
    assert t_mc(b, "LEAF app.events 4") == [{"leaf": None}]

    # DDL does not notify nor bump the version: a reload finds the new shadow,
    # and on_change fires although version() is the same
    before = t_mc(b)[0]
    cloud.sql("CREATE TABLE app.documents (id int)")
    assert search("documents", "app, public") == "public.documents"    # not loaded yet
    b.admin("META_CACHE RELOAD")
    assert search("documents", "app, public") is None
    after = t_mc(b)[0]
    assert after["version"] == before["version"]
    assert int(after["changes"]) == int(before["changes"]) + 1
    b.admin("META_CACHE RELOAD")                                       # nothing changed
    assert t_mc(b)[0]["changes"] == after["changes"]


def test_a_burst_of_changes_costs_one_reload(bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), heartbeat="0")
    before = wait_ready(b)
    # one transaction, 20 statements: 20 notifications (versions v+1 .. v+20) at commit
    stmts = "; ".join(f"INSERT INTO lokadb.orgs (id) VALUES ('b{i}')" for i in range(20))
    cloud.sql(f"BEGIN; {stmts}; COMMIT")
    v = cloud.version()
    row = wait_show(b, lambda r: r["version"] == str(v) and r["reloading"] == "f", "the burst loaded")
    assert int(row["notifications"]) - int(before["notifications"]) == 20
    assert int(row["loads"]) - int(before["loads"]) <= 2, row
    assert row["orgs"] == "20", repr((row, cloud.sql("select count(*) from lokadb.orgs"), before))
    time.sleep(0.3)
    assert show(b)["loads"] == row["loads"]         # nothing left queued


def test_a_statement_waits_while_a_reload_is_in_flight(bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), timeout="20s")
    wait_ready(b)
    session = b.connect("p0", "trustuser")
    v0 = live_version(session)[0]
    with cloud.connect() as locker:
        # the reload's SELECT waits for this lock: the reload stays in flight
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE lokadb.partitions IN ACCESS EXCLUSIVE MODE")
        add_org(cloud, 5)
        v = cloud.version()
        wait_show(b, lambda r: r["reloading"] == "t", "the reload to be in flight")
        call = BgCall(live_version, session)
        assert not call.wait(0.7), "the statement ran with the old catalog during the reload"
        assert show(b)["waiting"] == "1"
        wait_op = BgCall(b.admin, "T_MC WAIT")
        assert not wait_op.wait(0.2)
        locker.execute("COMMIT")
    assert call.result(5 * SLOW) == (v, True)
    assert wait_op.result(5 * SLOW) == [[str(v), "1"]]
    assert v > v0
    assert live_version(session) == (v, False)
    assert show(b)["waiting"] == "0"


def test_verify_0_makes_every_new_connection_see_an_unannounced_change(
        bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="0", heartbeat="0")
    v0 = int(wait_ready(b)["version"])
    for i in range(3):
        cloud.silent(f"UPDATE lokadb.meta SET value = (value::bigint + 1)::text WHERE key = 'version';"
                     f"INSERT INTO lokadb.orgs (id) VALUES ('s{i}')")
        conn = b.connect("p0", "trustuser")
        assert live_version(conn) == (v0 + i + 1, False)   # loaded during the login, not after
        assert show(b)["orgs"] == str(i + 1)
        conn.close()
    assert int(show(b)["notifications"]) == 0


def test_setting_readers_reach_a_new_connection_without_the_event_trigger(bouncer_factory, plugin_dir, cloud):
    """Code that reads settings (org_routing's server_org = auto) is part of
    what the freshness check compares: where INSTALL could not create the
    event trigger (not a superuser), a new connection brings it in, though
    the catalog's version did not change; with the trigger, it comes at once."""
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="0", heartbeat="0")
    r = wait_ready(b)
    assert r["setting_readers"] == "f"
    cloud.sql("CREATE FUNCTION public.f_org() RETURNS text LANGUAGE sql STABLE "
              "AS $$SELECT current_setting('lokadb.org', true)$$")
    wait_show(b, lambda r: r["setting_readers"] == "t", "the reader announced", 5)
    cloud.sql("DROP FUNCTION public.f_org()")
    r = wait_show(b, lambda r: r["setting_readers"] == "f", "the reader's drop announced", 5)
    cloud.sql("DROP EVENT TRIGGER lokadb_guards")
    v, loads = r["version"], int(r["loads"])
    cloud.sql("CREATE VIEW public.v_org AS SELECT current_setting('lokadb.org', true) AS org")
    time.sleep(0.3)
    assert show(b)["setting_readers"] == "f"              # nothing announced it
    b.connect("p0", "trustuser").close()                   # verify = 0: checked at this login
    r = show(b)
    assert (r["setting_readers"], r["version"]) == ("t", v) and int(r["loads"]) == loads + 1, r
    cloud.sql("DROP VIEW public.v_org")
    b.connect("p0", "trustuser").close()
    assert show(b)["setting_readers"] == "f"


def test_within_verify_a_new_connection_is_not_held_and_refresh_catches_up(
        bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="60s", heartbeat="0")
    v0 = int(wait_ready(b)["version"])
    checks = int(show(b)["verifications"])
    cloud.silent("UPDATE lokadb.meta SET value = (value::bigint + 1)::text WHERE key = 'version'")
    conn = b.connect("p0", "trustuser")
    assert live_version(conn) == (v0, False)       # verified < 60 s ago: not checked again
    assert int(show(b)["verifications"]) == checks
    # refresh(): one round trip, then the change is in
    assert b.admin("T_MC REFRESH") == [[str(v0 + 1), "1"]]
    assert live_version(conn) == (v0 + 1, False)
    # META_CACHE RELOAD answers once the catalog is loaded
    cloud.silent("INSERT INTO lokadb.orgs (id) VALUES ('r1')")
    res = b.admin_result("META_CACHE RELOAD")
    assert res.error is None and res.columns == ["version", "tables", "orgs", "partitions"]
    assert res.rows == [[str(v0 + 1), "0", "1", "0"]]
    assert b.admin("T_MC WAIT") == [[str(v0 + 1), "0"]]      # nothing due: not held


def test_concurrent_logins_share_one_verification(bouncer_factory, plugin_dir, cloud):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="1s", heartbeat="0")
    wait_ready(b)
    time.sleep(1.1)                     # the last check is older than verify now
    before = int(show(b)["verifications"])
    go = threading.Barrier(8)

    def login():
        go.wait(5)
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="p0", user="trustuser",
                             sslmode="disable", gssencmode="disable", connect_timeout=10) as c:
            return c.execute("select 1").fetchone()[0]
    calls = [BgCall(login) for _ in range(8)]
    assert [c.result(10 * SLOW) for c in calls] == [1] * 8
    after = int(show(b)["verifications"])
    assert 1 <= after - before <= 2, (before, after)
    # within verify again: the next logins are not checked
    for _ in range(3):
        b.connect("p0", "trustuser").close()
    assert int(show(b)["verifications"]) == after


def test_an_unavailable_cloud_database_keeps_the_last_catalog_and_logins_fast(
        bouncer_factory, plugin_dir, cloud, forwarder):
    add_org(cloud, 1)
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(forwarder.port), retry="300ms",
              verify="0")
    v = int(wait_ready(b)["version"])

    forwarder.stop()
    row = wait_show(b, lambda r: r["state"] == "stale", "state stale")
    assert row["version"] == str(v) and row["orgs"] == "1" and row["last_error"]
    assert t_mc(b)[0]["stale"] == "1"
    t0 = time.monotonic()
    for _ in range(10):
        conn = b.connect("p0", "trustuser")
        assert live_version(conn) == (v, False)           # the last good catalog
        conn.close()
    assert time.monotonic() - t0 < 3 * SLOW, "logins waited for the unavailable cloud database"
    add_org(cloud, 2)                   # committed while this lokadb cannot see it
    time.sleep(1.0)                     # several retries
    assert b.log().count("cloud database unavailable") == 1, b.log()[-2000:]
    assert_error(b.admin_result("META_CACHE RELOAD").error, "08006", "unavailable")

    forwarder.start()                   # the same port again
    row = wait_show(b, lambda r: r["state"] == "ready", "ready again", timeout=5)
    assert row["orgs"] == "2" and int(row["version"]) == cloud.version() and row["last_error"] is None
    assert b.log().count("cloud database available again") == 1
    # and it listens again
    add_org(cloud, 3)
    wait_show(b, lambda r: r["orgs"] == "3", "a change after the outage")


def test_a_cloud_database_that_does_not_answer_holds_a_login_at_most_timeout(
        bouncer_factory, plugin_dir, cloud, forwarder):
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(forwarder.port), verify="0",
              timeout="1s", retry="300ms")
    v = int(wait_ready(b)["version"])
    forwarder.freeze()
    quitter = b.wire()                  # a client that leaves while its login is held
    quitter.send(startup_packet({"user": "trustuser", "database": "p0"}))
    time.sleep(0.1)
    quitter.close()
    t0 = time.monotonic()
    conn = b.connect("p0", "trustuser")
    held = time.monotonic() - t0
    assert 0.5 < held < 3 * SLOW, held
    assert live_version(conn) == (v, False)
    row = show(b)
    assert row["state"] == "stale" and "within 1s" in row["last_error"]
    t0 = time.monotonic()
    b.connect("p0", "trustuser").close()                      # stale: not held at all
    assert time.monotonic() - t0 < 0.5 * SLOW
    forwarder.thaw()
    wait_show(b, lambda r: r["state"] == "ready", "ready again", timeout=5)
    assert show(b)["waiting"] == "0" and b.alive()


def test_settings_are_checked_and_cloud_can_be_changed_at_run_time(
        bouncer_factory, plugin_dir, cloud, pg):
    b = start(bouncer_factory, plugin_dir, "", start=False)
    r = b.run_foreground()
    assert r.returncode != 0 and "[plugin.meta_cache] cloud: must be set" in r.stderr, r.stderr
    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="soon", start=False)
    r = b.run_foreground()
    assert r.returncode != 0 and "verify: must be a duration" in r.stderr, r.stderr

    b = start(bouncer_factory, plugin_dir, cloud.conninfo(), verify="500ms")
    wait_ready(b)
    conf = b.show_config()
    assert conf["plugin.meta_cache.verify"]["value"] == "500ms"
    assert conf["plugin.meta_cache.retry"]["default"] == "2s"
    assert_error(b.admin_result("SET plugin.meta_cache.retry = '0'").error, "22023", "more than 0")
    assert_error(b.admin_result("SET plugin.meta_cache.cloud = 'nonsense'").error, "22023")
    b.admin("SET plugin.meta_cache.verify = '2'")

    other = Cloud(pg)
    try:
        add_org(other, "x1")
        add_org(other, "x2")
        b.admin(f"SET plugin.meta_cache.cloud = '{other.conninfo()}'")
        wait_show(b, lambda r: r["state"] == "ready" and r["orgs"] == "2", "the other catalog")
        assert t_mc(b, "ORG x1")[0]["id"] == "x1"
    finally:
        b.stop()
        other.drop()
