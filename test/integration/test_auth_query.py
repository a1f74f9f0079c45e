# SPDX-License-Identifier: ISC
"""
auth_query / auth_user / auth_dbname: the secret of a user who is not in
auth_file is looked up in PostgreSQL (pg_authid's rolpassword, SCRAM or md5)
on the event loop, then the client authenticates against it, and lokadb
logs in to the server with it (SCRAM pass-through, md5 hash).
"""
import psycopg
import pytest

from lokadb_harness import USERS, assert_error, startup_packet

ROLES = {"aq_scram": ("scram-sha-256", "aq scram pw"), "aq_md5": ("md5", "aq md5 pw")}


@pytest.fixture(scope="module", autouse=True)
def roles(pg):
    for role, (enc, pw) in ROLES.items():
        pg.sql(f"SET password_encryption = '{enc}'; DROP ROLE IF EXISTS {role}; "
               f"CREATE ROLE {role} LOGIN PASSWORD '{pw}'")
    # the server checks these roles' passwords too (not trust), so the pooler must log in with the secret
    yield
    for role in ROLES:
        pg.sql(f"DROP ROLE IF EXISTS {role}")


def aq(bouncer_factory, auth_type="scram-sha-256", **settings):
    s = {"auth_type": auth_type, "auth_user": "postgres"}
    s.update(settings)
    return bouncer_factory(settings=s)


def test_a_user_known_only_to_postgres_logs_in_with_scram(bouncer_factory, pg):
    pg.sql("ALTER ROLE aq_scram SET search_path = public")
    b = aq(bouncer_factory)
    with b.connect("p0", "aq_scram", password=ROLES["aq_scram"][1]) as c:
        assert c.execute("select current_user").fetchone()[0] == "aq_scram"
    err = b.login_error("p0", "aq_scram", password="wrong")
    assert_error(err, "28P01", 'password authentication failed for user "aq_scram"')
    err = b.login_error("p0", "aq_nobody", password="whatever")
    assert_error(err, "28P01", 'password authentication failed for user "aq_nobody"')


def test_a_md5_secret_from_postgres_serves_md5_auth(bouncer_factory):
    b = aq(bouncer_factory, auth_type="md5")
    with b.connect("p0", "aq_md5", password=ROLES["aq_md5"][1]) as c:
        assert c.execute("select current_user").fetchone()[0] == "aq_md5"
    err = b.login_error("p0", "aq_md5", password="nope")
    assert err.sqlstate == "28P01"


def test_users_in_auth_file_do_not_run_the_query(bouncer_factory):
    b = aq(bouncer_factory, auth_query="SELECT 1/0, 'x'")      # would fail if it ran
    with b.connect("p0", "trustuser", password=USERS["trustuser"]["password"]) as c:
        assert c.execute("select 1").fetchone()[0] == 1
    assert "auth_query" not in b.log()


def test_a_failing_auth_query_gives_a_clear_error_and_others_go_on(bouncer_factory):
    b = aq(bouncer_factory, auth_query="SELECT usename, passwd FROM no_such_table WHERE usename = $1")
    err = b.login_error("p0", "aq_scram", password=ROLES["aq_scram"][1])
    assert_error(err, "08001", "auth_query")
    assert "no_such_table" in err.message
    with b.connect("p0", "trustuser", password=USERS["trustuser"]["password"]) as c:                    # nobody else noticed
        assert c.execute("select 1").fetchone()[0] == 1
    assert "auth_query for user aq_scram failed" in b.log()


def test_auth_dbname_and_the_database_entry_auth_user(bouncer_factory):
    b = aq(bouncer_factory, auth_user=None, auth_dbname="p3",
           auth_query="SELECT rolname, rolpassword FROM pg_authid WHERE rolname = $1 AND current_database() = 'p3'")
    b.write_ini(databases={"p0": b.server("p0", "auth_user=postgres")})
    assert b.admin_result("RELOAD").error is None
    with b.connect("p0", "aq_scram", password=ROLES["aq_scram"][1]) as c:
        assert c.execute("select current_user").fetchone()[0] == "aq_scram"
    # p1 has no auth_user and there is no global one: the user is unknown there
    err = b.login_error("p1", "aq_scram", password=ROLES["aq_scram"][1])
    assert err.sqlstate == "28P01"


def test_a_client_that_leaves_during_the_lookup_is_cleaned_up(bouncer_factory):
    b = aq(bouncer_factory, auth_query="SELECT rolname, rolpassword FROM pg_authid, pg_sleep(1) WHERE rolname = $1")
    w = b.wire()
    w.send(startup_packet({"user": "aq_scram", "database": "p0"}))
    w.close()                                   # gone while auth_query sleeps
    with b.connect("p0", "aq_scram", password=ROLES["aq_scram"][1]) as c:
        assert c.execute("select 2").fetchone()[0] == 2
