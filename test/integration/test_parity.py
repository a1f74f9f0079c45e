# SPDX-License-Identifier: ISC
"""PgBouncer parity: max_db_client_connections / max_user_client_connections
(global and per entry), transaction_timeout, server_fast_close, the log
phrases and errors PgBouncer users look for, an empty pidfile, and every
PgBouncer 1.24 setting name either accepted or refused as not supported."""

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from lokadb_harness import (SLOW, USERS, PgError, assert_error, assert_serves, parse_error_fields,
                            read_until_error_or_close, wait_until)

# [pgbouncer] settings of PgBouncer 1.24/1.25 (its main.c table, WIN32-only
# service_name included).
PGBOUNCER_SETTINGS = """
admin_users application_name_add_host auth_dbname auth_file auth_hba_file auth_ident_file
auth_ldap_options auth_query auth_type auth_user autodb_idle_timeout cancel_wait_timeout
client_idle_timeout client_login_timeout client_tls13_ciphers client_tls_ca_file
client_tls_cert_file client_tls_ciphers client_tls_dheparams client_tls_ecdhcurve
client_tls_key_file client_tls_protocols client_tls_sslmode conffile default_pool_size
disable_pqexec dns_max_ttl dns_nxdomain_ttl dns_zone_check_period idle_transaction_timeout
ignore_startup_parameters job_name listen_addr listen_backlog listen_port log_connections
log_disconnections log_pooler_errors log_stats logfile max_client_conn
max_db_client_connections max_db_connections max_packet_size max_prepared_statements
max_user_client_connections max_user_connections min_pool_size peer_id pidfile pkt_buf
pool_mode query_timeout query_wait_notify query_wait_timeout reserve_pool_size
reserve_pool_timeout resolv_conf sbuf_loopcnt scram_iterations server_check_delay
server_check_query server_connect_timeout server_fast_close server_idle_timeout
server_lifetime server_login_retry server_reset_query server_reset_query_always
server_round_robin server_tls13_ciphers server_tls_ca_file server_tls_cert_file
server_tls_ciphers server_tls_key_file server_tls_protocols server_tls_sslmode service_name
so_reuseport stats_period stats_users suspend_timeout syslog syslog_facility syslog_ident
tcp_defer_accept tcp_keepalive tcp_keepcnt tcp_keepidle tcp_keepintvl tcp_socket_buffer
tcp_user_timeout track_extra_parameters transaction_timeout unix_socket_dir
unix_socket_group unix_socket_mode user verbose
""".split()

# [databases] and [users] options of PgBouncer 1.24/1.25.
PGBOUNCER_DB_OPTIONS = """
dbname host port user password auth_user auth_query auth_dbname pool_size min_pool_size
reserve_pool reserve_pool_size connect_query pool_mode max_db_connections
max_db_client_connections server_lifetime client_encoding datestyle timezone
load_balance_hosts application_name
""".split()
PGBOUNCER_USER_OPTIONS = """
pool_mode pool_size reserve_pool_size max_user_connections max_user_client_connections
query_timeout idle_transaction_timeout client_idle_timeout transaction_timeout
""".split()

NOT_SUPPORTED = "is not supported by this version of lokadb"


def ping(w):
    """Send one query: None once its ReadyForQuery came, else the ErrorResponse."""
    w.send_msg(b"Q", b"select 1\0")
    while True:
        typ, payload = w.read_msg()
        if typ == b"E":
            return PgError(parse_error_fields(payload))
        if typ == b"Z":
            return None


# ------------------------------------------------- client connection limits --

def test_max_db_client_connections_refuses_the_client_over_the_limit_with_53300(bouncer_factory):
    b = bouncer_factory(settings={"max_db_client_connections": 2},
                        databases={"p1": None})
    b.write_ini(databases={"p1": b.server("p1", "max_db_client_connections=1")})
    b.stop()
    b.start()
    first = b.login("p0", "trustuser")
    b.login("p0", "pooluser1")
    err = b.login_error("p0", "pooluser2")
    assert_error(err, "53300", "client connections exceeded (max_db_client_connections)")
    assert err.severity == "FATAL"
    b.wait_log(r"closing because: client connections exceeded \(max_db_client_connections\)")
    b.login("p2", "pooluser2")                      # another database is not affected
    b.login("p1", "trustuser")
    assert_error(b.login_error("p1", "pooluser1"), "53300", "max_db_client_connections")
    rows = {r["name"]: r for r in b.admin_dicts("SHOW DATABASES")}
    assert rows["p0"]["max_client_connections"] == "2"
    assert rows["p0"]["current_client_connections"] == "2"
    assert rows["p1"]["max_client_connections"] == "1"
    first.close()
    b.wires.remove(first)
    # the slot is free again once the client has gone
    deadline = time.monotonic() + 3 * SLOW
    while True:
        w = b.wire()
        if w.login("pooluser2", "p0", raise_error=False) is None:
            break
        assert time.monotonic() < deadline, "the freed slot was not given to a new client"
        time.sleep(0.1)
    assert w.scalar("select current_user") == "pooluser2"


def test_max_user_client_connections_refuses_the_client_over_the_limit_with_53300(bouncer_factory):
    b = bouncer_factory(settings={"max_user_client_connections": 2},
                        users={"pooluser1": "max_user_client_connections=1"})
    b.login("p0", "trustuser")
    b.login("p1", "trustuser")
    err = b.login_error("p2", "trustuser")
    assert_error(err, "53300", "client connections exceeded (max_user_client_connections)")
    b.login("p0", "pooluser1")
    assert_error(b.login_error("p1", "pooluser1"), "53300", "max_user_client_connections")
    b.login("p0", "pooluser2")                      # other users are not affected
    rows = {r["name"]: r for r in b.admin_dicts("SHOW USERS")}
    assert rows["pooluser1"]["max_user_client_connections"] == "1"
    assert rows["pooluser1"]["current_client_connections"] == "1"
    b.wait_log(r"closing because: client connections exceeded \(max_user_client_connections\)")


def test_client_connection_limits_can_be_raised_by_set(bouncer_factory):
    b = bouncer_factory(settings={"max_db_client_connections": 1})
    b.login("p0", "trustuser")
    assert_error(b.login_error("p0", "pooluser1"), "53300")
    b.admin("SET max_db_client_connections = 0")
    assert b.login("p0", "pooluser1").scalar("select 1") == "1"


# ---------------------------------------------------------- transaction_timeout --

def test_transaction_timeout_closes_a_client_whose_transaction_runs_too_long(bouncer_factory, pg):
    b = bouncer_factory(settings={"transaction_timeout": 1, "default_pool_size": 1})
    w = b.login("p0", timeout=8)
    w.query("begin")
    pid = int(w.scalar("select pg_backend_pid()"))
    start = time.monotonic()
    err = None
    while err is None and time.monotonic() - start < 5 * SLOW:   # busy, never idle: the age counts
        err = ping(w)
        time.sleep(0.2)
    elapsed = time.monotonic() - start
    assert err is not None
    assert_error(err, "25P04", "transaction timeout")
    assert 0.8 <= elapsed < 4 * SLOW, elapsed
    b.wait_log(r"C-\d+: p0/trustuser@\S+ closing because: transaction timeout")
    b.wait_log(r"S-\d+: p0/trustuser@\S+ closing because: transaction timeout")
    # the server connection went with it (PostgreSQL rolled back), and the pool serves again
    wait_until(lambda: not pg.backend_alive(pid), 5 * SLOW, what="the timed-out backend to end")
    assert_serves(b)


def test_transaction_timeout_also_bounds_a_single_long_statement(bouncer_factory):
    b = bouncer_factory(settings={"transaction_timeout": 1})
    w = b.login("p0", timeout=8)
    start = time.monotonic()
    w.send_msg(b"Q", b"select pg_sleep(6)\0")
    err, _ = read_until_error_or_close(w, 5)
    assert err is not None
    assert_error(err, "25P04", "transaction timeout")
    assert time.monotonic() - start < 4 * SLOW
    assert_serves(b)


def test_users_entries_override_the_client_timeouts_for_their_clients(bouncer_factory):
    b = bouncer_factory(settings={"transaction_timeout": 30},
                        users={"pooluser1": "query_timeout=1 transaction_timeout=0",
                               "pooluser2": "transaction_timeout=1"})
    w1 = b.login("p0", "pooluser1", timeout=8)
    w2 = b.login("p0", "pooluser2", timeout=8)
    other = b.login("p0", "trustuser", timeout=8)
    w1.send_msg(b"Q", b"select pg_sleep(5)\0")
    assert_error(read_until_error_or_close(w1, 4)[0], "57014", "query timeout")
    w2.query("begin")
    err = None
    start = time.monotonic()
    while err is None and time.monotonic() - start < 5 * SLOW:
        err = ping(w2)
        time.sleep(0.2)
    assert_error(err, "25P04", "transaction timeout")
    # trustuser has no entry: the global 30 s applies, a 2 s query runs to its end
    assert other.query("select pg_sleep(2), 'done'").rows == [["", "done"]]


def test_without_transaction_timeout_a_long_transaction_is_left_alone(bouncer_factory):
    b = bouncer_factory()
    with b.connect("p0") as c:
        c.execute("begin")
        time.sleep(1.5)
        assert c.execute("select 1").fetchone()[0] == 1
        c.execute("commit")


# ----------------------------------------------------------- server_fast_close --

def test_server_fast_close_ends_a_session_after_its_transaction_on_reconnect(bouncer_factory, pg):
    b = bouncer_factory(settings={"server_fast_close": 1, "pool_mode": "session"})
    w = b.login("p0", timeout=8)
    pid = int(w.scalar("select pg_backend_pid()"))
    w.query("begin")
    w.query("select 1")
    b.admin("RECONNECT p0")
    time.sleep(0.6)                                 # several janitor runs: the transaction is not cut
    assert w.query("select 2").rows == [["2"]]
    w.query("commit")
    err, _ = read_until_error_or_close(w, 3)
    assert err is not None
    assert_error(err, "57P01", "database configuration changed")
    b.wait_log(r"S-\d+: p0/trustuser@\S+ closing because: database configuration changed")
    wait_until(lambda: not pg.backend_alive(pid), 5 * SLOW, what="the old server connection to close")
    with b.connect("p0") as c:                      # a new session gets a new server connection
        assert c.execute("select pg_backend_pid()").fetchone()[0] != pid


def test_server_fast_close_applies_to_a_reload_that_changes_the_database_entry(bouncer_factory):
    b = bouncer_factory(settings={"server_fast_close": 1, "pool_mode": "session"})
    w = b.login("p0", timeout=8)
    assert w.scalar("select current_database()") == "p0"
    b.write_ini(databases={"p0": b.server("p1")})
    b.admin("RELOAD")
    err, _ = read_until_error_or_close(w, 3)          # idle outside a transaction: closed at once
    assert err is not None
    assert_error(err, "57P01", "database configuration changed")
    with b.connect("p0") as c:
        assert c.execute("select current_database()").fetchone()[0] == "p1"


def test_without_server_fast_close_a_session_keeps_its_server_after_reconnect(bouncer_factory):
    b = bouncer_factory(settings={"pool_mode": "session"})
    w = b.login("p0", timeout=8)
    pid = w.scalar("select pg_backend_pid()")
    b.admin("RECONNECT p0")
    time.sleep(0.6)
    assert w.scalar("select pg_backend_pid()") == pid


# ------------------------------------------------------ PgBouncer's log phrases --

def test_query_timeout_logs_closing_because_query_timeout_for_client_and_server(bouncer_factory):
    b = bouncer_factory(settings={"query_timeout": 1})
    w = b.login("p0", timeout=8)
    w.send_msg(b"Q", b"select pg_sleep(5)\0")
    err, _ = read_until_error_or_close(w, 4)
    assert_error(err, "57014", "query timeout")
    b.wait_log(r"S-\d+: p0/trustuser@\S+ closing because: query timeout")
    b.wait_log(r"C-\d+: p0/trustuser@\S+ closing because: query timeout")


@pytest.mark.parametrize("auth_type,user", [("md5", "cl_md5"), ("md5", "cl_scram"), ("scram-sha-256", "cl_scram")])
def test_an_unknown_database_is_named_only_after_a_good_password(bouncer_factory, auth_type, user):
    b = bouncer_factory(settings={"auth_type": auth_type})
    err = b.login_error("nosuchdb", user, "wrong")
    assert_error(err, "28P01", "password authentication failed")
    err = b.login_error("nosuchdb", user, USERS[user]["password"])
    assert_error(err, "3D000", "no such database: nosuchdb")
    b.wait_log(r"closing because: no such database: nosuchdb")
    b.wait_log(rf"login failed: db=nosuchdb user={user}")
    err = b.login_error("nosuchdb", "nosuchuser", "x")          # unknown user: no hint either
    assert_error(err, "28P01", "password authentication failed")
    assert_serves(b)


def test_login_is_logged_as_pgbouncer_does_with_the_tls_state(bouncer):
    bouncer.login("p1", "trustuser")
    bouncer.wait_log(r"C-\d+: p1/trustuser@127\.0\.0\.1:\d+ login attempt: db=p1 user=trustuser tls=no\n")


def test_an_empty_pidfile_setting_is_accepted(bouncer_factory):
    b = bouncer_factory(settings={"pidfile": ""})
    rows = {r["key"]: r for r in b.admin_dicts("SHOW CONFIG")}
    assert rows["pidfile"]["value"] == ""
    assert_serves(b)
    assert not list(b.dir.glob("*.pid"))


def test_every_pgbouncer_setting_name_is_accepted_or_refused_as_not_supported(bouncer):
    known = {r["key"] for r in bouncer.admin_dicts("SHOW CONFIG")}
    unknown = []
    for name in PGBOUNCER_SETTINGS:
        if name in known or name == "max_packet_size":     # alias of max_message_bytes
            continue
        res = bouncer.admin_result(f"SET {name} = 'lokadb-test-value'")
        if res.error is None or NOT_SUPPORTED not in res.error.message:
            unknown.append((name, res.error.message if res.error else "accepted"))
    assert not unknown, unknown


TEXT_OPTIONS = {"dbname": "x", "host": "127.0.0.1", "user": "x", "password": "x", "auth_user": "x",
                "auth_query": "x", "auth_dbname": "x", "connect_query": "x", "client_encoding": "UTF8",
                "datestyle": "ISO", "timezone": "UTC", "application_name": "x", "pool_mode": "session",
                "load_balance_hosts": "disable"}


@pytest.mark.parametrize("section,options", [("databases", PGBOUNCER_DB_OPTIONS),
                                             ("users", PGBOUNCER_USER_OPTIONS)])
def test_every_pgbouncer_connection_option_is_accepted_or_refused_as_not_supported(bouncer_factory, section,
                                                                                   options):
    # a bad key at the end makes every run stop at the config check: either at
    # the probed option (refused) or at the end (the option was accepted)
    b = bouncer_factory(start=False, raw="[lokadb]\nlokadb_test_end_marker = 1\n")
    wrong = []
    for opt in options:
        entry = f"{opt}={TEXT_OPTIONS.get(opt, '5')}"
        if section == "databases":
            b.write_ini(databases={"probe": f"host=127.0.0.1 {entry}"})
        else:
            b.write_ini(users={"probe": entry})
        out = b.run_foreground(timeout=5).stderr
        if "lokadb_test_end_marker" in out:
            continue
        if f'option "{opt}" {NOT_SUPPORTED}' not in out:
            wrong.append((opt, out.strip()[-200:]))
    assert not wrong, wrong


# ------------------------------------------------------------------- systemd --

def test_the_systemd_unit_matches_how_lokadb_runs(tmp_path):
    unit = (Path(__file__).resolve().parents[2] / "etc" / "lokadb.service").read_text()
    keys = {}
    for line in unit.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            keys[k.strip()] = v.strip()
    from lokadb_harness import default_bin
    binary = default_bin()
    # no sd_notify in lokadb: Type=notify would hang the start
    symbols = subprocess.run(["nm", "-D", binary], capture_output=True, text=True).stdout
    assert "sd_notify" not in symbols
    assert keys["Type"] in ("simple", "exec", "forking"), keys["Type"]
    if keys["Type"] == "forking":
        assert " -d " in keys["ExecStart"] and "PIDFile" in keys
    else:
        assert " -d " not in keys["ExecStart"]
    assert keys["ExecReload"] == "/bin/kill -HUP $MAINPID"
    if shutil.which("systemd-analyze"):
        local = tmp_path / "lokadb.service"
        local.write_text(unit.replace("/usr/local/bin/lokadb", binary))
        r = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr


def test_closing_lines_carry_the_connection_age_as_pgbouncer_does(bouncer):
    w = bouncer.login("p2", "trustuser")
    w.close()
    bouncer.wait_log(r"C-\d+: p2/trustuser@\S+ closing because: client (close request|unexpected eof) \(age=\d+s\)")


# ------------------------------------------------------------ TCP keepalive --

def _server_side_timer(bouncer_port, client_port):
    """(timer kind, seconds left) of lokadb's end of the connection from
    client_port, from /proc/net/tcp: kind 2 is the keepalive timer, 0 none."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        if local == bouncer_port and remote == client_port and f[3] == "01":
            kind, when = f[5].split(":")
            return int(kind, 16), int(when, 16) / 100
    raise AssertionError(f"no established socket {bouncer_port} <- {client_port} in /proc/net/tcp")


def test_tcp_keepalive_settings_reach_client_sockets_also_after_reload(bouncer_factory):
    """The tcp_keep* settings are set on the listen socket, whose accepted
    sockets inherit them; RELOAD re-applies them, 0 meaning the OS default."""
    b = bouncer_factory(settings={"tcp_keepalive": 1, "tcp_keepidle": 77, "tcp_keepintvl": 11,
                                  "tcp_keepcnt": 5})
    w = b.login("p0", timeout=8)
    kind, left = _server_side_timer(b.port, w.sock.getsockname()[1])
    assert kind == 2 and 60 < left <= 77, (kind, left)

    os_idle = int(Path("/proc/sys/net/ipv4/tcp_keepalive_time").read_text())
    b.write_ini(settings={"tcp_keepidle": 0})
    b.admin("RELOAD")
    w2 = b.login("p0", timeout=8)
    kind, left = _server_side_timer(b.port, w2.sock.getsockname()[1])
    assert kind == 2 and os_idle - 20 < left <= os_idle, (kind, left, os_idle)
    kind, left = _server_side_timer(b.port, w.sock.getsockname()[1])
    assert kind == 2 and left <= 77                  # an existing client keeps what it had

    b.write_ini(settings={"tcp_keepalive": 0})
    b.admin("RELOAD")
    w3 = b.login("p0", timeout=8)
    kind, _ = _server_side_timer(b.port, w3.sock.getsockname()[1])
    assert kind == 0                                 # no keepalive timer at all
    assert w3.scalar("select 1") == "1"
