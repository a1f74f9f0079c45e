# SPDX-License-Identifier: ISC
"""Client authentication (auth_type, auth_file secrets) and server login
through each PostgreSQL method."""

import time

import psycopg
import pytest

from lokadb_harness import SLOW, USERS, assert_error, assert_serves

AUTH_MD5_REQUEST = 5
AUTH_CLEARTEXT_REQUEST = 3
AUTH_SASL_REQUEST = 10

# client-auth users, by the kind of secret their auth_file line holds
SECRET_USERS = {"plain": "cl_plain", "md5": "cl_md5", "scram": "cl_scram"}


def pw(user):
    return USERS[user]["password"]


def assert_accepts_the_right_password(bouncer_factory, auth_type, user, auth_code):
    """With auth_type, user logs in with its password after an auth_code
    request, on the raw protocol and with libpq, and is that user."""
    b = bouncer_factory(settings={"auth_type": auth_type})
    w = b.login("p0", user, pw(user))
    assert auth_code in w.auth_codes
    assert w.scalar("select current_user") == user
    with b.connect("p0", user, password=pw(user)) as c:
        assert c.execute("select current_user").fetchone()[0] == user


# ---------------------------------------------------------------- trust ----

def test_trust_auth_admits_a_known_user_without_asking_for_a_password(bouncer):
    w = bouncer.login("p0", "cl_md5", password=None)
    assert w.auth_codes in ([0], []), f"trust asked for authentication: {w.auth_codes}"
    assert w.scalar("select current_user") == "cl_md5"


# ------------------------------------------------------------------ md5 ----

@pytest.mark.parametrize("secret", ["plain", "md5"])
def test_md5_auth_accepts_the_right_password(bouncer_factory, secret):
    assert_accepts_the_right_password(bouncer_factory, "md5", SECRET_USERS[secret], AUTH_MD5_REQUEST)


@pytest.mark.parametrize("secret", ["plain", "md5", "scram"])
def test_md5_auth_rejects_a_wrong_password_with_28P01(bouncer_factory, secret):
    b = bouncer_factory(settings={"auth_type": "md5"})
    user = SECRET_USERS[secret]
    err = b.login_error("p0", user, "not-the-password")
    assert_error(err, "28P01", "password authentication failed")
    assert err.severity == "FATAL"
    b.wait_log(user)
    assert_serves(b)


def test_md5_auth_with_a_scram_secret_uses_scram(bouncer_factory):
    b = bouncer_factory(settings={"auth_type": "md5"})
    w = b.login("p0", "cl_scram", pw("cl_scram"))
    assert AUTH_SASL_REQUEST in w.auth_codes and AUTH_MD5_REQUEST not in w.auth_codes
    assert w.scalar("select current_user") == "cl_scram"


# ---------------------------------------------------------------- scram ----

@pytest.mark.parametrize("secret", ["plain", "scram"])
def test_scram_auth_accepts_the_right_password(bouncer_factory, secret):
    assert_accepts_the_right_password(bouncer_factory, "scram-sha-256", SECRET_USERS[secret], AUTH_SASL_REQUEST)


@pytest.mark.parametrize("secret", ["plain", "scram"])
def test_scram_auth_rejects_a_wrong_password_with_28P01(bouncer_factory, secret):
    b = bouncer_factory(settings={"auth_type": "scram-sha-256"})
    user = SECRET_USERS[secret]
    err = b.login_error("p0", user, "not-the-password")
    assert_error(err, "28P01", "password authentication failed")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        b.connect("p0", user, password="not-the-password")
    assert_serves(b)


# ---------------------------------------------------------------- plain ----

def test_plain_auth_asks_for_a_cleartext_password(bouncer_factory):
    b = bouncer_factory(settings={"auth_type": "plain"})
    w = b.login("p0", "cl_plain", pw("cl_plain"))
    assert AUTH_CLEARTEXT_REQUEST in w.auth_codes
    err = b.login_error("p0", "cl_plain", "wrong")
    assert_error(err, "28P01")


# --------------------------------------------------------- unknown user ----

@pytest.mark.parametrize("auth_type", ["md5", "scram-sha-256"])
def test_unknown_user_is_rejected_with_28P01(bouncer_factory, auth_type):
    b = bouncer_factory(settings={"auth_type": auth_type})
    err = b.login_error("p0", "nosuchuser", "whatever")
    assert_error(err, "28P01")
    assert_serves(b)


# --------------------------------------------------------- server login ----

@pytest.mark.parametrize("dbname,user,method", [
    ("p0_trust", "trustuser", None),
    ("p0_clear", "cleartextuser", "password"),
    ("p0_md5", "md5user", "md5"),
    ("p0_scram", "scramuser", "scram-sha-256"),
])
def test_server_login_works_with_each_postgres_method(bouncer, pg, dbname, user, method):
    mark = pg.log_size()
    with bouncer.connect(dbname, "trustuser") as c:
        assert c.execute("select current_user, current_database()").fetchone() == (user, "p0")
    if method is not None:
        assert f'identity="{user}" method={method}' in pg.log_since(mark)


def test_server_login_as_the_client_user_with_an_md5_secret(bouncer_factory):
    """No forced user: lokadb logs in as the client, using the auth_file md5 secret."""
    b = bouncer_factory(settings={"auth_type": "md5"})
    with b.connect("p1", "md5user", password="md5pass") as c:
        assert c.execute("select current_user").fetchone()[0] == "md5user"


@pytest.mark.parametrize("user", ["md5user", "scramuser", "cleartextuser"])
def test_wrong_server_password_gives_the_client_an_error_not_a_hang(bouncer_factory, pg, user):
    b = bouncer_factory(
        settings={"server_login_retry": 1, "query_wait_timeout": 3, "server_connect_timeout": 2},
        databases={"pbadpw": f"host=127.0.0.1 port={pg.port} dbname=p0 user={user} password=wrong"})
    start = time.monotonic()
    with pytest.raises(psycopg.Error) as ei:
        with b.connect("pbadpw") as c:
            c.execute("select 1")
    assert time.monotonic() - start < 10 * SLOW
    seen = str(ei.value) + b.log()
    assert "password authentication failed" in seen
    assert_serves(b)


def test_scram_secret_from_pg_authid_logs_in_to_the_server_by_pass_through(bouncer_factory, pg):
    """A userlist holding only PostgreSQL's own SCRAM secret: the client's SCRAM
    proof gives lokadb the ClientKey, and the server login uses it (no password)."""
    secret = pg.sql("select rolpassword from pg_authid where rolname = 'scramuser'")[0][0]
    assert secret.startswith("SCRAM-SHA-256$")
    b = bouncer_factory(settings={"auth_type": "scram-sha-256"}, start=False)
    text = b.userlist.read_text()
    lines = [ln for ln in text.splitlines() if not ln.startswith('"scramuser"')]
    lines.append(f'"scramuser" "{secret}"')
    b.userlist.write_text("\n".join(lines) + "\n")
    b.start()
    c = b.connect("p0", user="scramuser", password="scrampass")
    assert c.execute("select current_user").fetchone()[0] == "scramuser"
    c.close()
    b.admin("RECONNECT p0")          # a fresh server login reuses the kept keys
    c2 = b.connect("p0", user="scramuser", password="scrampass")
    assert c2.execute("select 2").fetchone()[0] == 2
