# SPDX-License-Identifier: ISC
"""auth_type = hba: the rules of auth_hba_file pick each login's method
(first matching line wins), a connection no rule matches is refused with
PostgreSQL's 28000 text, RELOAD re-reads the file and a bad file is refused
with FILE:LINE. Also PgBouncer's same-UID console login on the unix socket."""

import os

import pytest

from lokadb_harness import SLOW, USERS, Wire, assert_error, assert_serves, wait_until
from test_tls import certs, tls_settings  # noqa: F401 -- the module's certificate fixture

AUTH_CLEARTEXT_REQUEST = 3
AUTH_MD5_REQUEST = 5
AUTH_SASL_REQUEST = 10

RULES = """\
# lokadb test rules
local   all   all                          trust
host    p1    all         127.0.0.1/32     reject
host    p0    cl_md5      127.0.0.1/32     md5
host    p0    cl_plain    127.0.0.0/8      password
host    p0    cl_scram    127.0.0.1 255.255.255.255 scram-sha-256
host    p0,p3 "trustuser" 127.0.0.1/32     trust
"""


def pw(user):
    return USERS[user]["password"]


# the harness reaches the console over TCP as admin (line 1 of every file here)
CONSOLE_RULE = "host lokadb admin,stats all md5\n"


def hba_bouncer(bouncer_factory, rules, settings=None, start=True):
    b = bouncer_factory(start=False)
    (b.dir / "hba.conf").write_text(CONSOLE_RULE + rules)
    s = {"auth_type": "hba", "auth_hba_file": "hba.conf"}
    s.update(settings or {})
    b.write_ini(settings=s)
    if start:
        b.start()
    return b


def unix_wire(b, timeout=5.0):
    w = Wire(unix_path=str(b.dir / f".s.PGSQL.{b.port}"), timeout=timeout)
    b.wires.append(w)
    return w


def test_the_first_matching_hba_rule_picks_the_login_method(bouncer_factory):
    b = hba_bouncer(bouncer_factory, RULES)
    w = b.login("p0", "cl_md5", pw("cl_md5"))
    assert AUTH_MD5_REQUEST in w.auth_codes
    assert w.scalar("select current_user") == "cl_md5"
    w = b.login("p0", "cl_plain", pw("cl_plain"))
    assert w.auth_codes[0] == AUTH_CLEARTEXT_REQUEST
    w = b.login("p0", "cl_scram", pw("cl_scram"))
    assert AUTH_SASL_REQUEST in w.auth_codes
    w = b.login("p3", "trustuser")
    assert w.auth_codes in ([0], [])
    assert w.scalar("select current_database()") == "p3"
    assert_error(b.login_error("p0", "cl_md5", "wrong"), "28P01", "password authentication failed")
    # the unix socket matches only the local rule: trust
    w = unix_wire(b)
    w.login("cl_md5", "p0")
    assert w.auth_codes in ([0], [])
    assert w.scalar("select current_user") == "cl_md5"


def test_a_reject_rule_and_a_missing_rule_refuse_the_login_with_28000(bouncer_factory):
    b = hba_bouncer(bouncer_factory, RULES)
    err = b.login_error("p1", "trustuser")
    assert_error(err, "28000",
                 'pg_hba.conf rejects connection for host "127.0.0.1", user "trustuser", database "p1", no encryption')
    assert err.severity == "FATAL"
    err = b.login_error("p2", "trustuser")
    assert_error(err, "28000",
                 'no pg_hba.conf entry for host "127.0.0.1", user "trustuser", database "p2", no encryption')
    err = b.login_error("p0", "md5user", pw("md5user"))          # no rule for this user
    assert_error(err, "28000", "no pg_hba.conf entry")
    b.wait_log(r'closing because: no pg_hba.conf entry for host "127\.0\.0\.1", user "md5user"')
    assert_serves(b)


def test_ipv6_and_all_address_rules(bouncer_factory):
    rules = "host all all ::1/128 trust\nhost all all 127.0.0.1/32 reject\nhost all all all md5\n"
    b = hba_bouncer(bouncer_factory, rules, settings={"listen_addr": "127.0.0.1,::1"})
    w = Wire(host="::1", port=b.port, timeout=5.0)
    b.wires.append(w)
    w.login("trustuser", "p0")
    assert w.auth_codes in ([0], [])
    assert w.scalar("select 1") == "1"
    assert_error(b.login_error("p0", "trustuser"), "28000", "pg_hba.conf rejects connection")


def test_reload_rereads_the_hba_file_and_a_bad_file_keeps_the_old_rules(bouncer_factory):
    b = hba_bouncer(bouncer_factory, RULES)
    assert b.login("p0", "trustuser").scalar("select 1") == "1"
    (b.dir / "hba.conf").write_text(CONSOLE_RULE + RULES.replace('"trustuser" 127.0.0.1/32     trust',
                                                  '"trustuser" 127.0.0.1/32     reject'))
    b.admin("RELOAD")
    assert_error(b.login_error("p0", "trustuser"), "28000", "pg_hba.conf rejects connection")
    (b.dir / "hba.conf").write_text(CONSOLE_RULE + RULES + "host all all 10.0.0.0/99 trust\n")
    res = b.admin_result("RELOAD")
    assert res.error is not None
    assert "hba.conf:9: invalid CIDR mask" in res.error.message, res.error.fields
    b.wait_log(r"RELOAD failed, keeping the old configuration: .*hba\.conf:9: invalid CIDR mask")
    assert_error(b.login_error("p0", "trustuser"), "28000", "pg_hba.conf rejects connection")
    assert b.login("p0", "cl_md5", pw("cl_md5")).scalar("select 1") == "1"


@pytest.mark.parametrize("rules,message", [
    ("local replication all trust\n", ':2: "replication" is not supported'),
    ("host all all 10.0.0.1 trust\n", ':2: invalid netmask "trust"'),
    ("local all all trust\nhost all all all ldap\n",
     ':3: authentication method "ldap" is not supported by this version of lokadb'),
])
def test_a_bad_hba_file_refuses_the_start_with_file_and_line(bouncer_factory, rules, message):
    b = hba_bouncer(bouncer_factory, rules, start=False)
    r = b.run_foreground()
    assert r.returncode != 0
    assert str(b.dir / "hba.conf") + message in r.stderr, r.stderr


def test_auth_type_hba_without_auth_hba_file_refuses_the_start(bouncer_factory):
    b = bouncer_factory(settings={"auth_type": "hba"}, start=False)
    r = b.run_foreground()
    assert r.returncode != 0 and "auth_type hba needs auth_hba_file" in r.stderr, r.stderr


def test_peer_rule_compares_the_os_user_of_the_unix_socket(bouncer_factory):
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    b = hba_bouncer(bouncer_factory, "local all all peer\n")
    w = unix_wire(b)
    err = w.login("trustuser", "p0", raise_error=False)
    assert_error(err, "28000", 'peer authentication failed for user "trustuser"')
    # the OS user's own name passes; p0_trust forces the server user
    w = unix_wire(b)
    w.login(me, "p0_trust")
    assert w.scalar("select current_user") == "trustuser"


def test_cert_rule_logs_in_by_the_client_certificate_cn(bouncer_factory, certs):  # noqa: F811
    rules = "hostssl all all 127.0.0.1/32 cert\nhostnossl all all all reject\n"
    b = hba_bouncer(bouncer_factory, rules, start=False,
                    settings=tls_settings(certs, "verify-ca", client_tls_ca_file=str(certs / "ca.pem")))
    b.tls_client_cert = (str(certs / "client.pem"), str(certs / "client.key"))   # CN=trustuser
    b.start()
    w = b.login("p0", "trustuser")
    assert w.auth_codes in ([0], [])
    assert w.scalar("select current_user") == "trustuser"
    err = b.login_error("p0", "md5user")
    assert_error(err, "28000", 'certificate authentication failed for user "md5user"')


def test_console_user_pgbouncer_of_the_same_os_user_needs_no_password_on_the_unix_socket(bouncer_factory):
    b = bouncer_factory(settings={"auth_type": "md5", "admin_users": "admin"})
    w = unix_wire(b)
    w.login("pgbouncer", "pgbouncer")
    assert w.auth_codes in ([0], [])
    res = w.query("SHOW POOLS")
    assert res.error is None
    res = w.query("PAUSE p3")                     # an admin command, not only SHOW
    assert res.error is None
    w.query("RESUME p3")
    b.wait_log("pgbouncer access from unix socket")
    # over TCP the name gets no such favour
    err = b.login_error("pgbouncer", "pgbouncer", "x")
    assert err.sqlstate in ("28P01", "28000"), err.fields


def test_auth_type_cert_logs_in_by_the_client_certificate_cn(bouncer_factory, certs):  # noqa: F811
    b = bouncer_factory(start=False, settings=tls_settings(
        certs, "verify-ca", client_tls_ca_file=str(certs / "ca.pem"), auth_type="cert"))
    b.tls_client_cert = (str(certs / "client.pem"), str(certs / "client.key"))   # CN=trustuser
    b.start(wait=False)     # the harness's console login (as admin) cannot pass: wait by a client login

    def served():
        try:
            return b.login("p0", "trustuser").scalar("select current_user")
        except (ConnectionError, OSError):
            return None
    assert wait_until(served, 10 * SLOW, what="lokadb to serve a certificate login") == "trustuser"
    assert_error(b.login_error("p0", "md5user"), "28000", 'certificate authentication failed for user "md5user"')
