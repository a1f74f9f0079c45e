# SPDX-License-Identifier: ISC
"""The harness itself: the PostgreSQL cluster, the secrets we generate and the
raw protocol client, checked directly against PostgreSQL (no lokadb)."""

import base64

import psycopg
import pytest

from lokadb_harness import USERS, PgError, Wire, md5_secret, scram_secret


@pytest.mark.parametrize("user", ["trustuser", "md5user", "scramuser", "cleartextuser"])
def test_postgres_accepts_each_role_with_its_password(pg, user):
    with pg.connect(dbname="p0", user=user, password=USERS[user]["password"]) as c:
        assert c.execute("select current_user").fetchone()[0] == user


@pytest.mark.parametrize("user", ["md5user", "scramuser", "cleartextuser"])
def test_postgres_rejects_a_wrong_password(pg, user):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        pg.connect(dbname="p0", user=user, password="wrong")


@pytest.mark.parametrize("user,method", [("md5user", "md5"), ("scramuser", "scram-sha-256"),
                                         ("cleartextuser", "password")])
def test_postgres_logs_the_server_login_method_of_each_role(pg, user, method):
    mark = pg.log_size()
    pg.connect(dbname="p1", user=user, password=USERS[user]["password"]).close()
    text = pg.log_since(mark)
    assert f'identity="{user}" method={method}' in text


def test_databases_and_md5_storage_exist(pg):
    dbs = {r[0] for r in pg.sql("select datname from pg_database")}
    assert {"p0", "p1", "p2", "p3"} <= dbs
    stored = pg.sql("select rolpassword from pg_authid where rolname = 'md5user'")[0][0]
    assert stored == md5_secret("md5user", "md5pass")


def test_scram_secret_generator_matches_postgres(pg):
    stored = pg.sql("select rolpassword from pg_authid where rolname = 'scramuser'")[0][0]
    head, keys = stored.split("$", 1)[1].split("$")
    iterations, salt = head.split(":")
    mine = scram_secret("scrampass", salt=base64.b64decode(salt), iterations=int(iterations))
    assert mine == stored


@pytest.mark.parametrize("user", ["trustuser", "md5user", "scramuser", "cleartextuser"])
def test_raw_client_logs_in_to_postgres_with_each_method(pg, user):
    with Wire(port=pg.port) as w:
        w.login(user, "p0", USERS[user]["password"])
        assert w.scalar("select current_user") == user
        res = w.query("select 1 as a, null as b; select 'x'")
        assert res.rows == [["1", None], ["x"]]


def test_raw_client_reports_sqlstate_of_login_and_query_errors(pg):
    with Wire(port=pg.port) as w:
        err = w.login("scramuser", "p0", "wrong", raise_error=False)
        assert err.sqlstate == "28P01"
    with Wire(port=pg.port) as w:
        err = w.login("trustuser", "nosuchdb", raise_error=False)
        assert err.sqlstate == "3D000"
    with Wire(port=pg.port) as w:
        w.login("trustuser", "p0")
        with pytest.raises(PgError) as ei:
            w.query("select 1/0")
        assert ei.value.sqlstate == "22012"
        assert w.scalar("select 2") == "2"
