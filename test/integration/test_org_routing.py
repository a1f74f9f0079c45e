# SPDX-License-Identifier: ISC
"""The org_routing plugin (issue 4): each statement's organization (DESIGN
§8), set_config('lokadb.org', ...) pipelined before statements on LokaDB
tables, leaf addressing of single-organization statements compared with the
unrewritten results (also with the organization as a Bind parameter: the
statement parsed again at its Bind), refusal of COPY ... TO without an
organization, organization affinity of the pool, statements of a paused
organization held, plan_cache_mode = force_custom_plan against the generic
plans of prepared statements, route_log, SHOW ORG_ROUTING, and the protocol
features that must work as without the plugin -- all through the real
meta_cache plugin.

The schema is the test's own, in a database of its own: organizations,
projects (a cloud table), documents and versions (tenant tables with
(organization_id, id) indexes), made LokaDB tables by running
plugins/move/catalog.sql and partitioning them in SQL here: LIST by
organization_id with a DEFAULT partition, organizations 2 and 5 isolated,
each in a container partition holding one leaf, and the catalog rows written
directly (no move plugin command is used)."""

import os
import re
import threading
import time

import pytest
import psycopg
from psycopg import errors

from lokadb_harness import (HERE, SLOW, BgCall, Wire, _parse_data_row, assert_error, message, parse_error_fields,
                            wait_until)

REPO = (HERE / "../..").resolve()
CATALOG_SQL = (REPO / "plugins/move/catalog.sql").read_text()
APP_DB = f"or_app_{os.getpid()}"
USER = "trustuser"
ORGS = (1, 2, 3, 5)
ISOLATED = 2
ISOLATED2 = 5                   # a second organization with its own partitions
DOCS_PER_ORG = 30

SCHEMA_SQL = """
CREATE TABLE organizations (id bigint PRIMARY KEY, name text NOT NULL);
CREATE TABLE projects (id bigserial PRIMARY KEY, organization_id bigint NOT NULL REFERENCES organizations,
                       name text NOT NULL);
CREATE TABLE documents (organization_id bigint NOT NULL, id bigserial NOT NULL, project_id bigint NOT NULL,
                        title text NOT NULL, created_at timestamptz NOT NULL DEFAULT '2024-01-01')
    PARTITION BY LIST (organization_id);
CREATE TABLE documents_default PARTITION OF documents DEFAULT;
CREATE TABLE documents_o2 PARTITION OF documents FOR VALUES IN (2) PARTITION BY LIST (organization_id);
CREATE TABLE documents_o2_1 PARTITION OF documents_o2 FOR VALUES IN (2);
CREATE TABLE documents_o5 PARTITION OF documents FOR VALUES IN (5) PARTITION BY LIST (organization_id);
CREATE TABLE documents_o5_1 PARTITION OF documents_o5 FOR VALUES IN (5);
CREATE INDEX ON documents (organization_id, id);
ALTER TABLE documents_default ADD PRIMARY KEY (organization_id, id);
ALTER TABLE documents_o2_1 ADD PRIMARY KEY (organization_id, id);
ALTER TABLE documents_o5_1 ADD PRIMARY KEY (organization_id, id);
CREATE TABLE versions (organization_id bigint NOT NULL, id bigserial NOT NULL, document_id bigint NOT NULL,
                       body text NOT NULL)
    PARTITION BY LIST (organization_id);
CREATE TABLE versions_default PARTITION OF versions DEFAULT;
CREATE TABLE versions_o2 PARTITION OF versions FOR VALUES IN (2) PARTITION BY LIST (organization_id);
CREATE TABLE versions_o2_1 PARTITION OF versions_o2 FOR VALUES IN (2);
CREATE TABLE versions_o5 PARTITION OF versions FOR VALUES IN (5) PARTITION BY LIST (organization_id);
CREATE TABLE versions_o5_1 PARTITION OF versions_o5 FOR VALUES IN (5);
CREATE INDEX ON versions (organization_id, id);
CREATE INDEX ON versions (organization_id, document_id);
CREATE SCHEMA other;
CREATE TABLE other.documents (id int, note text);
INSERT INTO other.documents VALUES (1, 'not a LokaDB table');
GRANT USAGE ON SCHEMA other TO PUBLIC;
GRANT ALL ON ALL TABLES IN SCHEMA public, other TO PUBLIC;
GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO PUBLIC;
"""

DATA_SQL = """
INSERT INTO organizations SELECT o, 'org ' || o FROM unnest('{orgs}'::bigint[]) o;
INSERT INTO projects (organization_id, name)
    SELECT o, 'project ' || o || '.' || p FROM unnest('{orgs}'::bigint[]) o, generate_series(1, 3) p;
INSERT INTO documents (organization_id, project_id, title, created_at)
    SELECT p.organization_id, p.id, 'doc ' || p.id || '.' || d, '2024-01-01'::timestamptz + d * interval '1 hour'
    FROM projects p, generate_series(1, {per_project}) d ORDER BY p.organization_id, d, p.id;
INSERT INTO versions (organization_id, document_id, body)
    SELECT d.organization_id, d.id, 'v' || n || ' of ' || d.title FROM documents d, generate_series(1, 2) n;
ANALYZE;
"""

CATALOG_ROWS_SQL = """
INSERT INTO lokadb.orgs (id, name, isolated) VALUES ('1', 'org 1', false), ('2', 'org 2', true),
                                                   ('3', 'org 3', false), ('5', 'org 5', true);
INSERT INTO lokadb.tables (schema_name, table_name, org_column, org_type, default_part) VALUES
    ('public', 'documents', 'organization_id', 'bigint', 'documents_default'),
    ('public', 'versions', 'organization_id', 'bigint', 'versions_default');
INSERT INTO lokadb.partitions (schema_name, table_name, org_id, container, leaf) VALUES
    ('public', 'documents', '2', 'documents_o2', 'documents_o2_1'),
    ('public', 'versions', '2', 'versions_o2', 'versions_o2_1'),
    ('public', 'documents', '5', 'documents_o5', 'documents_o5_1'),
    ('public', 'versions', '5', 'versions_o5', 'versions_o5_1');
"""

SHOW_COLUMNS = ["parse_cache_entries", "parse_cache_size", "parse_cache_hits", "parse_cache_misses",
                "parse_cache_evictions", "parse_cache_invalidations", "statements_passed",
                "statements_routed", "org_from_statement", "org_from_session", "org_none", "prefixes",
                "prefixes_skipped", "refused", "rewritten", "rewrite_failed", "parse_errors",
                "session_changes", "held_for_catalog", "reparsed", "held_for_pause", "pause_timeouts",
                "plan_mode_sets", "reparses_lost", "reparses_refused", "statements_prefiltered",
                "prefixes_known", "statements_normalized", "normalized_cache_hits", "rewrites_made",
                "held_for_answers", "inserts_on_parent"]


# ------------------------------------------------------------------ setup --

def create_app_db(pg, dbname, extra_sql=""):
    """A database with the catalog, the schema, the rows, `extra_sql` and the catalog rows."""
    pg.sql(f"CREATE DATABASE {dbname}")
    with pg.connect(dbname=dbname) as c:
        c.execute(CATALOG_SQL)
        c.execute(SCHEMA_SQL)
        c.execute(DATA_SQL.format(orgs="{" + ",".join(map(str, ORGS)) + "}", per_project=DOCS_PER_ORG // 3))
        if extra_sql:
            c.execute(extra_sql)
        c.execute(CATALOG_ROWS_SQL)


@pytest.fixture(scope="module")
def app(pg):
    """The application database: catalog, schema, rows, catalog rows; every statement logged."""
    create_app_db(pg, APP_DB)
    pg.sql(f"ALTER DATABASE {APP_DB} SET log_statement = 'all'")
    yield pg
    pg.sql(f"DROP DATABASE IF EXISTS {APP_DB} WITH (FORCE)")


def direct_admin(app, query, params=None):
    """A statement run on PostgreSQL as the superuser (catalog changes)."""
    with app.connect(dbname=APP_DB) as c:
        c.execute(query, params)


def direct(app, query, params=None):
    """Rows of a statement run on PostgreSQL itself (no lokadb)."""
    with app.connect(dbname=APP_DB, user=USER) as c:
        cur = c.execute(query, params)
        return cur.fetchall() if cur.description else None


@pytest.fixture
def router(bouncer_factory, app):
    """make(**settings) -> a lokadb with meta_cache and org_routing on the database `app`."""
    def make(route_log="on", rewrite="on", settings=None, extra="", start=True, db=APP_DB):
        s = {"plugins": "meta_cache org_routing"}
        s.update(settings or {})
        raw = (f"[plugin.meta_cache]\ncloud = host=127.0.0.1 port={app.port} dbname={db} user=postgres\n"
               f"verify = 0\n\n[plugin.org_routing]\nroute_log = {route_log}\nrewrite = {rewrite}\n{extra}")
        b = bouncer_factory(settings=s, databases={"app": f"host=127.0.0.1 port={app.port} dbname={db}"},
                            raw=raw, start=start)
        if start:
            wait_until(lambda: b.admin_dicts("SHOW META_CACHE")[0]["state"] == "ready", 10 * SLOW,
                       what="meta_cache to load the catalog")
        return b
    return make


def stats(b):
    return {k: int(v) for k, v in b.admin_dicts("SHOW ORG_ROUTING")[0].items()}


def org_of(w, query):
    """The server's lokadb.org as the statement itself saw it (first column)."""
    return w.query(query).rows[0][0]


def route_lines(b, since=0):
    return [l for l in b.log()[since:].splitlines() if "plugin org_routing:" in l and " org=" in l]


# ------------------------------------------------------- routing rules --

SETTING = "current_setting('lokadb.org', true)"
# The tests of where the organization's SET goes, whose statements do not
# read it themselves (with the default, server_org = auto, and no code in
# the database that reads settings, they would run with the session's).
STATEMENT_ORG = "server_org = statement\n"


def test_the_organization_of_each_statement_is_set_on_the_server_before_it(router):
    b = router()
    w = b.login("app", USER)
    cases = [
        # a constant equality on the organization column
        (f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3", "3"),
        # qualified by alias, AND-ed with other conditions, a cast constant
        (f"SELECT {SETTING}, count(*) FROM documents d WHERE d.title <> '' AND d.organization_id = '1'::bigint",
         "1"),
        # a join scoped through the join condition (v.organization_id = d.organization_id)
        (f"SELECT {SETTING}, count(*) FROM documents d JOIN versions v ON v.document_id = d.id "
         "AND v.organization_id = d.organization_id WHERE d.organization_id = 3", "3"),
        # a join with a cloud table (the ORM feed)
        (f"SELECT {SETTING}, d.id FROM documents d JOIN projects p ON p.id = d.project_id "
         "WHERE d.organization_id = 1 ORDER BY d.id DESC LIMIT 1", "1"),
        # CTE and subqueries: every LokaDB occurrence is scoped
        (f"WITH x AS (SELECT * FROM documents WHERE organization_id = 3) SELECT {SETTING}, count(*) FROM x", "3"),
        (f"SELECT {SETTING}, (SELECT count(*) FROM versions WHERE organization_id = 3)", "3"),
        # IN with one value
        (f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id IN (1)", "1"),
        # no organization: the server's lokadb.org is cleared
        (f"SELECT {SETTING}, count(*) FROM documents", ""),
        # two organizations, OR, an unscoped occurrence: none
        (f"SELECT {SETTING}, count(*) FROM documents d JOIN versions v ON v.document_id = d.id "
         "WHERE d.organization_id = 1 AND v.organization_id = 3", ""),
        (f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 1 OR organization_id = 3", ""),
        (f"SELECT {SETTING}, (SELECT count(*) FROM versions) FROM documents WHERE organization_id = 3 LIMIT 1",
         ""),
        # the ON of an outer join does not scope its preserved side
        (f"SELECT {SETTING}, count(*) FROM documents d LEFT JOIN versions v ON v.document_id = d.id "
         "AND d.organization_id = 3", ""),
        # ... but scopes its nullable side through the preserved side's WHERE
        (f"SELECT {SETTING}, count(*) FROM documents d LEFT JOIN versions v ON v.document_id = d.id "
         "AND v.organization_id = d.organization_id WHERE d.organization_id = 3", "3"),
    ]
    for query, expected in cases:
        assert org_of(w, query) == expected, query
    # DML: every VALUES row, UPDATE/DELETE conditions
    assert org_of(w, f"INSERT INTO documents (organization_id, project_id, title) VALUES (3, 7, 'a'), "
                     f"(3, 7, 'b') RETURNING {SETTING}") == "3"
    assert org_of(w, f"INSERT INTO documents (organization_id, project_id, title) VALUES (1, 1, 'c'), "
                     f"(3, 7, 'd') RETURNING {SETTING}") == ""
    assert org_of(w, f"UPDATE documents SET title = title WHERE organization_id = 3 AND title IN ('a', 'b') "
                     f"RETURNING {SETTING}") == "3"
    assert org_of(w, f"DELETE FROM documents WHERE organization_id = 3 AND title IN ('a', 'b') "
                     f"RETURNING {SETTING}") == "3"
    w.query("DELETE FROM documents WHERE title IN ('c', 'd')")
    # a statement on no LokaDB table is not touched
    assert org_of(w, f"SELECT {SETTING} FROM projects WHERE organization_id = 1 LIMIT 1") == ""
    assert stats(b)["statements_routed"] >= len(cases) + 5


def test_the_session_organization_applies_when_the_statement_has_none(router):
    b = router()
    w = b.login("app", USER)
    q_none = f"SELECT {SETTING}, count(*) FROM documents"
    # (statements sent first, the organization a statement without one then gets)
    steps = [
        ((), ""),
        (("SET lokadb.org = 3",), "3"),
        (("SET SESSION lokadb.org TO '1'",), "1"),
        (("RESET lokadb.org",), ""),
        (("SELECT set_config('lokadb.org', '3', false)",), "3"),
        # SET LOCAL lasts for the transaction block; ROLLBACK undoes a SET made in it
        (("BEGIN", "SET LOCAL lokadb.org = 1"), "1"),
        (("COMMIT",), "3"),
        (("BEGIN", "SET lokadb.org = 1"), "1"),
        (("ROLLBACK",), "3"),
        (("DISCARD ALL",), ""),
        (("SET lokadb.org = 1", "SET lokadb.org = ''"), ""),
    ]
    for i, (sqls, want) in enumerate(steps):
        for sql in sqls:
            w.query(sql)
        assert org_of(w, q_none) == want, f"after {sqls}"
        if i == 1:
            # the statement's own organization wins, then the session's comes back
            assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 1") == "1"
            assert org_of(w, q_none) == "3"
    assert stats(b)["session_changes"] >= 7



def test_a_transaction_block_of_the_extended_protocol_gets_each_statements_organization(router):
    """The session's organization goes before BEGIN; inside the block, where
    the plugin cannot tell a new batch from the middle of one, a statement
    of another organization gets its own in hidden extended-protocol
    messages (no simple Query may go there), and none is skipped."""
    b = router(settings={"pool_mode": "transaction"})
    with b.connect("app", USER, autocommit=False) as c:
        c.execute("SELECT set_config('lokadb.org', '3', false)")
        c.commit()
        for _ in range(2):           # (a parameter makes psycopg use the extended protocol)
            assert c.execute(f"SELECT {SETTING}, count(*) FROM documents WHERE %s", [True]).fetchone()[0] == "3"
            assert c.execute(f"SELECT {SETTING}, count(*) FROM versions WHERE %s", [True]).fetchone()[0] == "3"
            c.commit()
        before = stats(b)
        row = c.execute(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 1 AND %s", [True]
                        ).fetchone()
        assert tuple(row) == ("1", direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = 1")[0][0])
        # back to the session's organization in the same block
        assert c.execute(f"SELECT {SETTING}, count(*) FROM versions WHERE %s", [True]).fetchone()[0] == "3"
        c.commit()
        after = stats(b)
        assert after["prefixes_skipped"] == before["prefixes_skipped"]
        assert after["prefixes"] >= before["prefixes"] + 2
    assert any("decision=begin" in l and "org=3" in l and "prefix=sent" in l for l in route_lines(b))


def test_options_at_connect_give_the_session_organization(router):
    # org_routing declares lokadb.org as a startup parameter: no
    # ignore_startup_parameters needed; other unknown options are still refused
    b = router()
    err = b.login_error("app", USER, params={"options": "-c lokadb.nothing=3"})
    assert_error(err, "08P01", "unsupported options startup parameter")
    w = b.login("app", USER, params={"options": "-c lokadb.org=3"})
    assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents") == "3"
    with b.connect("app", USER, options="-c lokadb.org=1") as c:
        assert c.execute(f"SELECT {SETTING}, count(*) FROM documents").fetchone()[0] == "1"


def test_search_path_decides_what_an_unqualified_name_is(router):
    b = router()
    w = b.login("app", USER)
    assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3") == "3"
    w.query("SET search_path = other, public")
    # other.documents is a plain table: nothing to route, the setting stays as it was
    res = w.query(f"SELECT {SETTING}, note FROM documents WHERE id = 1")
    assert res.rows == [["3", "not a LokaDB table"]]
    assert org_of(w, f"SELECT {SETTING}, count(*) FROM public.documents WHERE organization_id = 1") == "1"
    w.query("RESET search_path")
    assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3") == "3"


def test_row_level_security_rules_or_statement_triggers_keep_statements_on_the_parent(router, app):
    """What a statement addressed to a leaf would bypass on the parent: row-level
    security (reads and writes), rules and statement-level triggers (writes).
    Added after ENABLE TABLE, the catalog's event trigger tells the proxies,
    and such statements stay on the parent until it is gone again."""
    db = f"or_guard_{os.getpid()}"
    create_app_db(app, db)
    try:
        b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, db=db)
        w = b.login("app", USER)
        read = f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}"
        # (a DELETE: an INSERT whose one LokaDB table is its target stays on the parent anyway)
        delete = f"DELETE FROM documents WHERE organization_id = {ISOLATED} AND title = 'no such title'"

        def admin(sql):
            with app.connect(dbname=db) as c:
                c.execute(sql)

        def as_user(sql):
            with app.connect(dbname=db, user=USER) as c:
                return c.execute(sql).fetchone()[0]

        def on_leaf(sql):
            mark = len(b.log())
            res = w.query(sql)
            return any("rewrite=leaf" in l for l in route_lines(b, mark)), res

        leaf, res = on_leaf(read)
        assert leaf and int(res.rows[0][0]) == as_user(read)
        admin("CREATE POLICY hide_dot_1 ON documents USING (title NOT LIKE '%.1')")
        admin("ALTER TABLE documents ENABLE ROW LEVEL SECURITY")
        hidden = as_user(read)
        assert hidden < int(res.rows[0][0])
        wait_until(lambda: not on_leaf(read)[0], 5 * SLOW, what="the proxy to keep reads on the parent")
        leaf, res = on_leaf(read)
        assert not leaf and int(res.rows[0][0]) == hidden
        admin("ALTER TABLE documents DISABLE ROW LEVEL SECURITY")
        wait_until(lambda: on_leaf(read)[0], 5 * SLOW, what="reads on the leaf again")
        # a statement-level trigger: writes stay on the parent, reads go to the leaf
        admin("CREATE TABLE audit (n int); GRANT ALL ON audit TO PUBLIC;"
              "CREATE FUNCTION audit_stmt() RETURNS trigger LANGUAGE plpgsql AS "
              "$$BEGIN INSERT INTO audit VALUES (1); RETURN NULL; END$$;"
              "CREATE TRIGGER audit_deletes AFTER DELETE ON documents FOR EACH STATEMENT "
              "EXECUTE FUNCTION audit_stmt()")
        wait_until(lambda: not on_leaf(delete)[0], 5 * SLOW, what="the proxy to keep writes on the parent")
        before = as_user("SELECT count(*) FROM audit")
        for _ in range(3):
            leaf, _ = on_leaf(delete)
            assert not leaf
        assert as_user("SELECT count(*) FROM audit") == before + 3
        assert on_leaf(read)[0]
        admin("DROP TRIGGER audit_deletes ON documents")
        wait_until(lambda: on_leaf(delete)[0], 5 * SLOW, what="writes on the leaf again")
        assert as_user("SELECT count(*) FROM audit") == before + 3
        w.close()
    finally:
        app.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_row_description_names_the_table_and_its_column_numbers_of_a_leaf_made_after_a_drop(router, app):
    """A column dropped from a LokaDB table keeps its number in the table and its partitions; a
    leaf made afterwards (ISOLATE ORG makes it LIKE the DEFAULT partition) numbers the columns after
    it one less. RowDescription of a statement addressed to that leaf gives the table's OID and the
    table's column numbers, as the statement on the table does."""
    db = f"or_attnum_{os.getpid()}"
    create_app_db(app, db, extra_sql=f"""
        ALTER TABLE documents ADD COLUMN scratch int;
        ALTER TABLE documents DROP COLUMN scratch;
        ALTER TABLE documents ADD COLUMN note text DEFAULT 'n';
        CREATE TABLE documents_o2_1_new (LIKE documents_o2_1 INCLUDING ALL);
        INSERT INTO documents_o2_1_new SELECT * FROM documents_o2_1;
        ALTER TABLE documents_o2 DETACH PARTITION documents_o2_1;
        DROP TABLE documents_o2_1;
        ALTER TABLE documents_o2_1_new RENAME TO documents_o2_1;
        ALTER TABLE documents_o2 ATTACH PARTITION documents_o2_1 FOR VALUES IN (2);
        GRANT ALL ON documents_o2_1 TO {USER};
    """)
    try:
        with app.connect(dbname=db) as c:
            c.execute("SELECT lokadb.copy_privileges('documents')")
        b = router(db=db)
        sql = "SELECT d.id, d.note, d.title, d.organization_id FROM documents d WHERE d.organization_id = 2 ORDER BY d.id LIMIT 2"
        cols = lambda res: [(res.ftable(i), res.ftablecol(i)) for i in range(res.nfields)]
        with app.connect(dbname=db, user=USER) as direct:
            want = cols(direct.execute(sql).pgresult)
            leaf = cols(direct.execute(sql.replace("FROM documents d", "FROM documents_o2_1 d")).pgresult)
        assert [n for _, n in leaf] != [n for _, n in want]       # the numbers do differ on the leaf
        mark = len(b.log())
        with psycopg.connect(host="127.0.0.1", port=b.port, dbname="app", user=USER, autocommit=True,
                             sslmode="disable", gssencmode="disable") as routed:
            got_extended = cols(routed.execute(sql).pgresult)
            got_simple = cols(routed.pgconn.exec_(sql.encode()))
        assert sum("rewrite=leaf" in l for l in route_lines(b, mark)) == 2, route_lines(b, mark)
        assert got_extended == want and got_simple == want
    finally:
        app.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_privileges_of_the_parent_reach_its_leaves_or_keep_statements_on_it(router, app):
    """PostgreSQL checks a statement addressed to a leaf against the leaf's own
    privileges, and a GRANT or REVOKE on a partitioned table does not reach its
    partitions. The catalog's event trigger copies them to the leaves in the
    same transaction (a REVOKE is no bypass, a GRANT no error); a leaf whose
    privileges differ all the same keeps the table's statements on the parent
    until lokadb.copy_privileges() gives it the parent's."""
    db = f"or_priv_{os.getpid()}"
    create_app_db(app, db)
    try:
        b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, db=db)
        w = b.login("app", USER)
        read = f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}"

        def admin(*sql):
            with app.connect(dbname=db) as c:
                for q in sql:
                    c.execute(q)

        def direct_user(sql):
            with app.connect(dbname=db, user=USER) as c:
                try:
                    return ("rows", c.execute(sql).fetchall())
                except psycopg.Error as e:
                    return ("error", e.sqlstate, e.diag.message_primary)

        def routed(sql):
            mark = len(b.log())
            res = w.query(sql, raise_error=False)
            got = (("error", res.error.fields.get("C"), res.error.fields.get("M")) if res.error is not None
                   else ("rows", [(int(r[0]),) for r in res.rows]))
            return any("rewrite=leaf" in l for l in route_lines(b, mark)), got

        leaf, got = routed(read)
        assert leaf and got == direct_user(read) and got[1][0][0] > 0
        # a REVOKE on the parent: the leaf loses the privilege in the same transaction
        admin("REVOKE ALL ON documents FROM PUBLIC")
        want = direct_user(read)
        assert want[:2] == ("error", "42501") and "documents" in want[2], want
        leaf, got = routed(read)
        assert leaf and got == want          # the parent's error, naming the parent, from the leaf
        # a GRANT on the parent: the leaf has it too
        admin(f"GRANT SELECT ON documents TO {USER}")
        leaf, got = routed(read)
        assert leaf and got == direct_user(read) and got[0] == "rows"
        # a leaf whose privileges differ anyway: the table's statements stay on the parent
        admin("SET lokadb.copying_privileges = on", f"REVOKE SELECT ON documents_o2_1 FROM {USER}")
        b.admin("META_CACHE RELOAD")
        leaf, got = routed(read)
        assert not leaf and got == direct_user(read) and got[0] == "rows"
        with app.connect(dbname=db) as c:
            assert c.execute("SELECT lokadb.copy_privileges('documents')").fetchone()[0] == 1
            assert c.execute("SELECT lokadb.table_guard('public', 'documents')").fetchone()[0] is None
        wait_until(lambda: routed(read)[0], 5 * SLOW, what="statements on the leaf again")
        assert routed(read)[1] == direct_user(read)
        # column privileges: the parent's reach the leaves; a leaf whose differ keeps them off it
        admin(f"GRANT UPDATE (title) ON documents TO {USER}")
        wait_until(lambda: routed(read)[0], 5 * SLOW, what="statements on the leaf")
        admin("SET lokadb.copying_privileges = on", f"REVOKE UPDATE (title) ON documents_o2_1 FROM {USER}")
        b.admin("META_CACHE RELOAD")
        leaf, got = routed(read)
        assert not leaf and got == direct_user(read)
        with app.connect(dbname=db) as c:
            assert c.execute("SELECT lokadb.table_guard('public', 'documents')").fetchone()[0] == "a"
            assert c.execute("SELECT lokadb.copy_privileges('documents')").fetchone()[0] == 1
            assert c.execute("SELECT lokadb.table_guard('public', 'documents')").fetchone()[0] is None
        wait_until(lambda: routed(read)[0], 5 * SLOW, what="statements on the leaf again")
        w.close()
    finally:
        app.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_without_the_event_trigger_a_new_connection_sees_a_guard_added_later(router, app):
    """INSTALL without a superuser creates no event trigger, so DDL sends no
    NOTIFY: meta_cache's freshness check at a new connection (verify = 0
    here) compares the guards too, and reloads."""
    db = f"or_guard_nt_{os.getpid()}"
    create_app_db(app, db)
    try:
        with app.connect(dbname=db) as c:
            c.execute("DROP EVENT TRIGGER lokadb_guards")
        b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, db=db)
        delete = f"DELETE FROM documents WHERE organization_id = {ISOLATED} AND title = 'no such title'"

        def on_leaf(w):
            mark = len(b.log())
            assert w.query(delete).error is None
            return any("rewrite=leaf" in l for l in route_lines(b, mark))

        w = b.login("app", USER)
        assert on_leaf(w)
        v0 = int(b.admin_dicts("SHOW META_CACHE")[0]["version"])
        with app.connect(dbname=db) as c:
            c.execute("CREATE FUNCTION noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;"
                      "CREATE TRIGGER stmt_deletes AFTER DELETE ON documents FOR EACH STATEMENT "
                      "EXECUTE FUNCTION noop()")
        w2 = b.login("app", USER)           # its login checks freshness: the guards differ
        assert not on_leaf(w2) and not on_leaf(w)
        assert int(b.admin_dicts("SHOW META_CACHE")[0]["version"]) == v0   # no new version, a new load
        # privileges revoked on the parent do not reach the leaf without the event trigger: the
        # freshness check sees the parent's changed, the load the leaf's differing, and reads stay on
        # the parent, which refuses them as PostgreSQL does (no read of the leaf past the REVOKE)
        read = f"SELECT count(*) FROM versions WHERE organization_id = {ISOLATED}"
        mark = len(b.log())
        assert w.query(read).error is None and any("rewrite=leaf" in l for l in route_lines(b, mark))
        with app.connect(dbname=db) as c:
            c.execute("REVOKE ALL ON versions FROM PUBLIC")
        w3 = b.login("app", USER)
        mark = len(b.log())
        res = w.query(read, raise_error=False)
        assert res.error is not None and res.error.fields.get("C") == "42501", res
        assert res.error.fields.get("M") == "permission denied for table versions"
        assert not any("rewrite=leaf" in l for l in route_lines(b, mark))
        with app.connect(dbname=db) as c:       # by hand: the leaf gets the parent's privileges
            c.execute(f"GRANT SELECT ON versions TO {USER}")
            # the containers and leaves of organizations 2 and 5
            assert c.execute("SELECT lokadb.copy_privileges('versions')").fetchone()[0] == 4

        def read_on_leaf():
            mark = len(b.log())
            return w3.query(read, raise_error=False).error is None and any(
                "rewrite=leaf" in l for l in route_lines(b, mark))
        wait_until(read_on_leaf, 5 * SLOW, what="reads on the leaf again after copy_privileges()")
        w.close()
        w2.close()
        w3.close()
    finally:
        app.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_what_a_failed_transaction_set_is_undone_as_postgresql_undoes_it(router):
    """A SET of search_path or lokadb.org, or a temporary table, made by a
    transaction that an error then rolls back is undone by PostgreSQL: the
    plugin follows (TXN_END's ev_txn_failed), for a failed multi-statement
    Query, an extended-protocol batch and a failed block ended by COMMIT."""
    b = router(settings={"pool_mode": "session"})
    w = b.login("app", USER)
    q = "SELECT note FROM documents WHERE id = 1"       # only other.documents has `note`

    def on_public():
        res = w.query(q, raise_error=False)
        return res.error is not None and res.error.sqlstate == "42703"

    assert on_public()
    assert w.query("SET search_path = other, public; SELECT 1/0", raise_error=False).error.sqlstate == "22012"
    assert on_public()
    assert w.query("SET search_path = other, public").error is None
    assert w.query(q).rows == [["not a LokaDB table"]]
    assert w.query("SET search_path = public; SELECT 1/0", raise_error=False).error is not None
    assert w.query(q).rows == [["not a LokaDB table"]]
    assert w.query("RESET search_path").error is None and on_public()
    # a failed block ended by COMMIT (PostgreSQL answers ROLLBACK)
    for stmt in ("BEGIN", "SET search_path = other, public"):
        assert w.query(stmt).error is None
    assert w.query("SELECT 1/0", raise_error=False).error is not None
    assert w.query("COMMIT").tags == ["ROLLBACK"]
    assert on_public()
    # the extended protocol: one batch
    one = Wire.bind_msg() + Wire.execute_msg()
    w.send(Wire.parse_msg("SET search_path = other, public") + one + Wire.parse_msg("SELECT 1/0") + one
           + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).error is not None
    assert on_public()
    # lokadb.org: the session's organization is not 5 after its failed SET
    assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3") == "3"
    assert w.query("SET lokadb.org = '5'; SELECT 1/0", raise_error=False).error is not None
    mark = len(b.log())
    w.query("SELECT count(*) FROM documents")
    assert [l for l in route_lines(b, mark) if " Q org=" in l][-1].split(" Q org=")[1].startswith("- "), \
        route_lines(b, mark)
    assert w.query("SET lokadb.org = '5'").error is None
    mark = len(b.log())
    w.query("SELECT count(*) FROM documents")
    assert [l for l in route_lines(b, mark) if " Q org=" in l][-1].split(" Q org=")[1].startswith("5 ")
    # a temporary table of a failed Query is gone, and so is its hiding
    mark = len(b.log())
    assert w.query(f"CREATE TEMP TABLE documents (organization_id bigint, id bigint); SELECT 1/0",
                   raise_error=False).error is not None
    w.query(f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}")
    assert any("rewrite=leaf" in l for l in route_lines(b, mark))
    w.close()


@pytest.mark.parametrize("pool_mode", ["session", "transaction"])
def test_a_statement_sent_past_a_failed_batch_sees_what_postgresql_kept(router, pool_mode):
    """A client that sends its next statements before the ReadyForQuery of
    a batch that SETs search_path or lokadb.org and then fails: PostgreSQL
    rolls the SET back, so those statements run with the session's old
    values, and the plugin must decide them on those values too, not on
    the SET's. Without waiting for that batch's answer, the plugin took the
    `documents` of a rolled-back `SET search_path = public` for the LokaDB
    table and addressed the count to organization 2's leaf (30 rows) where
    PostgreSQL, still on `other`, refuses it (42703), and gave a statement
    without an organization the rolled-back organization 5."""
    b = router(settings={"pool_mode": pool_mode})
    w = b.login("app", USER)
    one = Wire.bind_msg() + Wire.execute_msg()
    fail = Wire.parse_msg("SELECT 1/0") + one + Wire.sync_msg()
    count = f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}"
    for _ in range(2):      # the second round: pipelining is known by then
        assert w.query("SET search_path = other, public").error is None
        w.send(Wire.parse_msg("SET search_path = public") + one + fail
               + Wire.parse_msg(count) + one + Wire.sync_msg())
        assert w.read_until_ready(timeout=5 * SLOW).error.sqlstate == "22012"
        res = w.read_until_ready(timeout=5 * SLOW)
        assert res.error is not None and res.error.sqlstate == "42703", res.rows
        # the same as a simple Query sent behind the batch
        w.send(Wire.parse_msg("SET search_path = public") + one + fail + message(b"Q", count.encode() + b"\0"))
        assert w.read_until_ready(timeout=5 * SLOW).error.sqlstate == "22012"
        res = w.read_until_ready(timeout=5 * SLOW)
        assert res.error is not None and res.error.sqlstate == "42703", res.rows
        assert w.query("RESET search_path").error is None
        # lokadb.org: the statement without an organization keeps the session's 3
        assert w.query("SET lokadb.org = '3'").error is None
        w.send(Wire.parse_msg("SET lokadb.org = '5'") + one + fail
               + Wire.parse_msg(f"SELECT {SETTING}, count(*) FROM documents") + one + Wire.sync_msg())
        assert w.read_until_ready(timeout=5 * SLOW).error.sqlstate == "22012"
        assert w.read_until_ready(timeout=5 * SLOW).rows[0][0] == "3"
        # and a batch that worked: its SET holds for what was sent behind it
        w.send(Wire.parse_msg("SET search_path = public") + one + Wire.sync_msg()
               + Wire.parse_msg(count) + one + Wire.sync_msg())
        assert w.read_until_ready(timeout=5 * SLOW).error is None
        assert w.read_until_ready(timeout=5 * SLOW).rows == [[str(DOCS_PER_ORG)]]
        assert w.query("RESET search_path; RESET lokadb.org").error is None
    # held once per batch that changed the session (4 such batches a round); a pipeline
    # of batches that change nothing, or inside a block, is not held
    held = stats(b)["held_for_answers"]
    assert held == 8, held
    w.send((Wire.parse_msg(count) + one + Wire.sync_msg()) * 3)
    for _ in range(3):
        assert w.read_until_ready(timeout=5 * SLOW).rows == [[str(DOCS_PER_ORG)]]
    w.send(Wire.parse_msg("BEGIN") + one + Wire.sync_msg() + Wire.parse_msg("SET search_path = other, public")
           + one + Wire.sync_msg() + Wire.parse_msg("SELECT note FROM documents WHERE id = 1") + one
           + Wire.sync_msg() + Wire.parse_msg("ROLLBACK") + one + Wire.sync_msg())
    replies = [w.read_until_ready(timeout=5 * SLOW) for _ in range(4)]
    assert replies[2].rows == [["not a LokaDB table"]] and replies[3].tags == ["ROLLBACK"], replies
    assert stats(b)["held_for_answers"] == held
    w.close()
    # a client that goes away while its message is held: nothing is left waiting
    for _ in range(3):
        w = b.login("app", USER)
        w.send(Wire.parse_msg("SET search_path = public") + one + Wire.parse_msg("SELECT pg_sleep(0.2)") + one
               + Wire.sync_msg() + Wire.parse_msg(count) + one + Wire.sync_msg())
        wait_until(lambda: stats(b)["held_for_answers"] > held, 5 * SLOW, what="the message to be held")
        held += 1
        w.close()
    assert b.alive()
    w = b.login("app", USER)
    assert w.query(count).rows == [[str(DOCS_PER_ORG)]]
    w.close()


def test_a_temporary_table_hides_the_lokadb_table_of_its_name(router, app):
    """PostgreSQL looks in pg_temp first: while the session has a temporary
    table `documents`, statements on `documents` read it, not the LokaDB
    table, and are not addressed to a leaf; DROP, DISCARD TEMP and the
    ROLLBACK of the block that made one give the LokaDB table back."""
    b = router(settings={"pool_mode": "session"})
    w = b.login("app", USER)
    q = f"SELECT title FROM documents WHERE organization_id = {ISOLATED} ORDER BY id LIMIT 1"
    real = direct(app, q)[0][0]

    def title():
        return w.query(q).rows[0][0]

    def leaf_lines(since):
        return [l for l in route_lines(b, since) if "rewrite=leaf" in l]

    assert title() == real
    for make, undo in [("CREATE TEMP TABLE documents (organization_id bigint, id bigint, title text)",
                        "DROP TABLE documents"),
                       ("CREATE TEMP TABLE documents AS SELECT organization_id, id, 'copy' AS title "
                        "FROM public.documents WHERE false", "DISCARD TEMP"),
                       ("CREATE TEMP VIEW documents AS SELECT organization_id, id, 'view' AS title "
                        "FROM public.documents", "DROP VIEW documents")]:
        w.query(make)
        w.query(f"INSERT INTO pg_temp.documents VALUES ({ISOLATED}, 1, 'temporary')"
                if "VIEW" not in make else "SELECT 1")
        mark = len(b.log())
        assert title() == ("view" if "VIEW" in make else "temporary"), make
        assert leaf_lines(mark) == [], make
        w.query(undo)
        mark = len(b.log())
        assert title() == real, undo
        assert leaf_lines(mark), undo
    # made in a block that rolls back: gone with it
    w.query("BEGIN")
    w.query("CREATE TEMP TABLE documents (organization_id bigint, id bigint, title text)")
    w.query(f"INSERT INTO documents VALUES ({ISOLATED}, 1, 'temporary')")
    assert title() == "temporary"
    w.query("ROLLBACK")
    assert title() == real
    # ON COMMIT DROP: gone with the block's COMMIT
    w.query("BEGIN")
    w.query("CREATE TEMP TABLE documents (organization_id bigint, id bigint, title text) ON COMMIT DROP")
    w.query(f"INSERT INTO documents VALUES ({ISOLATED}, 1, 'temporary')")
    assert title() == "temporary"
    w.query("COMMIT")
    mark = len(b.log())
    assert title() == real and leaf_lines(mark)
    w.close()


# ------------------------------------------------- extended protocol --

def test_extended_protocol_classifies_at_parse_and_decides_at_bind(router):
    b = router()
    with b.connect("app", USER, prepare_threshold=5) as c:
        # constants: decided at the Parse, the prefix goes before it
        assert c.execute(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3").fetchone()[0] == "3"
        # a parameter, named (prepared) statement: decided at the Bind, the prefix goes before the Bind
        q = f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = %s"
        for org in ("1", "3", "1"):
            assert c.execute(q, [int(org)], prepare=True).fetchone()[0] == org
        # a binary parameter (int8)
        q_bin = f"SELECT {SETTING}, count(*) FROM versions WHERE organization_id = %b"
        assert c.execute(q_bin, [3], prepare=True).fetchone()[0] == "3"
        # INSERT rows with parameters
        cur = c.execute(f"INSERT INTO documents (organization_id, project_id, title) VALUES (%s, 7, 'p1') "
                        f"RETURNING {SETTING}", [3], prepare=True)
        assert cur.fetchone()[0] == "3"
        c.execute("DELETE FROM documents WHERE title = 'p1'")
        # a parameter in the unnamed statement: decided at the Bind, where no Query may
        # go (it would drop the unnamed statement): the organization goes in hidden
        # extended-protocol messages before the Bind
        for org in (1, 3, 1):
            count = direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = %s", [org])[0][0]
            row = c.execute(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = %s AND true",
                            [org], prepare=False).fetchone()
            assert tuple(row) == (str(org), count)
    st = stats(b)
    assert st["prefixes_skipped"] == 0
    lines = route_lines(b)
    assert any(" B org=1 decision=param " in l and "prefix=sent" in l for l in lines), lines
    assert not any("prefix=skipped" in l for l in lines), lines
    assert any(" P org=- decision=pending " in l for l in lines), lines


# ------------------------------------------------------------- COPY --

def test_copy_to_without_an_organization_is_refused_with_a_way_to_choose_one(router):
    b = router()
    w = b.login("app", USER)
    res = w.query("COPY documents TO STDOUT", raise_error=False)
    assert_error(res.error, "0A000", "COPY of LokaDB table public.documents would read every organization")
    assert "SET lokadb.org" in res.error.message and "organization_id = <id>" in res.error.message
    assert res.messages[-1][0] == b"Z"
    res = w.query("COPY (SELECT d.id FROM documents d JOIN projects p ON p.id = d.project_id) TO STDOUT",
                  raise_error=False)
    assert_error(res.error, "0A000", "COPY (query) reads LokaDB table public.documents without an organization")
    assert w.scalar("SELECT 1") == "1"                      # the session goes on
    with b.connect("app", USER) as c:
        with pytest.raises(errors.FeatureNotSupported):
            with c.cursor().copy("COPY versions (id, body) TO STDOUT"):
                pass
        assert c.execute("SELECT 2").fetchone()[0] == 2
    assert stats(b)["refused"] == 3


def copy_out(c, statement):
    with c.cursor().copy(statement) as cp:
        return b"".join(bytes(d) for d in cp)


def test_copy_with_an_organization_works_and_reads_only_that_organization(router, app):
    b = router()
    with app.connect(dbname=APP_DB, user=USER) as d:
        expect3 = copy_out(d, "COPY (SELECT * FROM documents WHERE organization_id = 3) TO STDOUT")
        expect2 = copy_out(d, "COPY (SELECT id, title FROM documents WHERE organization_id = 2) TO STDOUT "
                              "WITH (FORMAT csv)")
    assert expect3.count(b"\n") == DOCS_PER_ORG
    with b.connect("app", USER) as c:
        # COPY (query) TO with the organization in the query
        assert copy_out(c, "COPY (SELECT * FROM documents WHERE organization_id = 3) TO STDOUT") == expect3
        # COPY table TO with the session's organization: only that organization's rows
        c.execute("SET lokadb.org = 3")
        assert copy_out(c, "COPY documents TO STDOUT") == expect3
        # ... of an isolated organization: read from its leaf, options and column list kept
        c.execute("SET lokadb.org = 2")
        assert copy_out(c, "COPY documents (id, title) TO STDOUT WITH (FORMAT csv)") == expect2
        # COPY FROM STDIN works with or without an organization
        c.execute("RESET lokadb.org")
        with c.cursor().copy("COPY versions (organization_id, document_id, body) FROM STDIN") as cp:
            cp.write_row((3, 1, "copied in"))
            cp.write_row((2, 1, "copied in"))
        assert direct(app, "SELECT count(*) FROM versions WHERE body = 'copied in'")[0][0] == 2
        c.execute("DELETE FROM versions WHERE body = 'copied in'")
    lines = route_lines(b)
    assert any("rewrite=copy" in l and "documents_o2_1" in l for l in lines), lines
    assert any("rewrite=copy" in l and 'FROM public.documents documents WHERE' in l for l in lines), lines


# ----------------------------------------------------- leaf addressing --

def text_rows(port, dbname, statement):
    """Rows as text through a raw simple-protocol connection (to PostgreSQL or lokadb)."""
    with Wire(port=port, timeout=10 * SLOW) as w:
        w.login(USER, dbname)
        return w.query(statement).rows


LEAF_SELECTS = [
    # read by (organization_id, id)
    "SELECT id, title, project_id FROM documents WHERE organization_id = {o} AND id = {id}",
    # the ORM feed: a join with a cloud table, ORDER BY ... LIMIT
    "SELECT d.id, d.title, p.name FROM documents d JOIN projects p ON p.id = d.project_id "
    "WHERE d.organization_id = {o} ORDER BY d.id DESC LIMIT 20",
    # aggregate
    "SELECT project_id, count(*), max(created_at) FROM documents WHERE organization_id = {o} "
    "GROUP BY project_id ORDER BY project_id",
    # two tenant tables joined through the organization column
    "SELECT d.id, v.body FROM documents d JOIN versions v ON v.document_id = d.id "
    "AND v.organization_id = d.organization_id WHERE d.organization_id = {o} ORDER BY v.id LIMIT 7",
    # CTE, outer join scoped on its nullable side
    "WITH recent AS (SELECT * FROM documents WHERE organization_id = {o} ORDER BY created_at DESC LIMIT 5) "
    "SELECT r.id, count(v.id) FROM recent r LEFT JOIN versions v ON v.document_id = r.id "
    "AND v.organization_id = {o} GROUP BY r.id ORDER BY r.id",
    # correlated EXISTS
    "SELECT id FROM documents d WHERE d.organization_id = {o} AND EXISTS (SELECT 1 FROM versions v "
    "WHERE v.organization_id = {o} AND v.document_id = d.id AND v.body LIKE 'v2%') ORDER BY id LIMIT 5",
    # columns qualified by the table's own name (the rewrite keeps it as the alias)
    "SELECT documents.id, documents.title FROM documents WHERE documents.organization_id = {o} "
    "ORDER BY documents.id LIMIT 3",
]


def test_single_organization_statements_go_to_the_leaf_with_identical_results(router, app):
    b = router()
    some_id = direct(app, "SELECT min(id) FROM documents WHERE organization_id = 2")[0][0]
    log0 = app.log_size()
    for tmpl in LEAF_SELECTS:
        stmt = tmpl.format(o=ISOLATED, id=some_id)
        expected = text_rows(app.port, APP_DB, stmt)
        assert expected, stmt
        assert text_rows(b.port, "app", stmt) == expected, stmt                  # simple protocol
        with b.connect("app", USER) as c:                                      # extended protocol
            got = c.execute(stmt).fetchall()
        assert [[None if v is None else str(v) for v in r] for r in got] == \
            [[None if v is None else str(v) for v in r] for r in direct(app, stmt)], stmt
    lines = [l for l in route_lines(b) if "rewrite=leaf" in l]
    assert len(lines) == 2 * len(LEAF_SELECTS), route_lines(b)
    assert all("documents_o2_1" in l for l in lines)
    pglog = app.log_since(log0)
    assert "documents_o2_1" in pglog and "versions_o2_1" in pglog            # what PostgreSQL ran
    # DML on the leaf: same effect as on the parent
    w = b.login("app", USER)
    res = w.query(f"UPDATE documents SET title = title || '' WHERE organization_id = 2 AND id = {some_id} "
                  "RETURNING id, title")
    assert res.rows == text_rows(app.port, APP_DB, f"SELECT id, title FROM documents WHERE id = {some_id}")
    # an INSERT whose one LokaDB table is its target stays on the parent: PostgreSQL puts the row in the leaf
    mark = len(b.log())
    res = w.query(f"INSERT INTO versions (organization_id, document_id, body) VALUES (2, {some_id}, 'leaf ins') "
                  "RETURNING organization_id, document_id, body")
    assert res.rows == [["2", str(some_id), "leaf ins"]]
    ins = route_lines(b, mark)
    assert len(ins) == 1 and "org=2 decision=statement" in ins[0] and "rewrite=no" in ins[0], ins
    assert direct(app, "SELECT tableoid::regclass::text FROM versions WHERE body = 'leaf ins'") == \
        [("versions_o2_1",)]
    res = w.query("DELETE FROM versions WHERE organization_id = 2 AND body = 'leaf ins' RETURNING body")
    assert res.rows == [["leaf ins"]]
    assert sum("rewrite=leaf" in l for l in route_lines(b)) == 2 * len(LEAF_SELECTS) + 2
    # an organization without its own partition, a statement that may move rows, ONLY: no rewrite
    w.query("SELECT count(*) FROM documents WHERE organization_id = 3")
    w.query("UPDATE documents SET organization_id = 2 WHERE organization_id = 2 AND id = 0")
    only = "SELECT count(*) FROM ONLY documents WHERE organization_id = 2"
    assert w.query(only).rows == text_rows(app.port, APP_DB, only) == [["0"]]
    assert sum("rewrite=leaf" in l for l in route_lines(b)) == 2 * len(LEAF_SELECTS) + 2
    assert stats(b)["rewritten"] == 2 * len(LEAF_SELECTS) + 2


def test_rewrite_off_keeps_statements_on_the_parent(router, app):
    b = router(rewrite="off")
    stmt = LEAF_SELECTS[1].format(o=ISOLATED)
    assert text_rows(b.port, "app", stmt) == text_rows(app.port, APP_DB, stmt)
    assert not any("rewrite=leaf" in l for l in route_lines(b))
    assert stats(b)["rewritten"] == 0


# ------------------------------------- leaf addressing at the Bind --

ORM_FEED = ("SELECT d.* FROM documents d JOIN projects p ON p.id = d.project_id "
            "WHERE d.organization_id = %s ORDER BY d.id DESC LIMIT 20")
FEED_LEAF = {ISOLATED: "documents_o2_1", ISOLATED2: "documents_o5_1"}


def executed(app, since, needle="documents"):
    """The texts PostgreSQL executed (log_statement = all) since a log offset."""
    out = []
    for line in app.log_since(since).splitlines():
        m = re.search(r"(?:statement|execute [^:]*): (.*)$", line)
        if m and needle in m.group(1) and "set_config" not in m.group(1):
            out.append(m.group(1))
    return out


def check_feed_binds(b, app, c, prepare, orgs):
    """Run the ORM feed for each organization in turn: same rows as on
    PostgreSQL, and PostgreSQL ran it on the leaf exactly for isolated ones."""
    for o in orgs:
        log0 = app.log_size()
        got = c.execute(ORM_FEED, [o], prepare=prepare).fetchall()
        ran = executed(app, log0)
        assert got == direct(app, ORM_FEED, [o]) and len(got) == 20, (prepare, o)
        assert len(ran) == 1, (prepare, o, ran)
        if o in FEED_LEAF:
            assert f"public.{FEED_LEAF[o]} d" in ran[0] and "organization_id = $1" in ran[0], ran
        else:
            assert "documents_o" not in ran[0] and "FROM documents d" in ran[0], ran


def test_a_parameter_organization_is_addressed_to_its_leaf_at_the_bind(router, app):
    """The organization of `... WHERE d.organization_id = $1` is known at the
    Bind only: the statement is parsed again there (query_reparse) with the
    leaf text of that organization, or back with the client's text for an
    organization without its own partition."""
    b = router()
    st0 = stats(b)
    # psycopg's unnamed statement: Parse + Bind + Execute + Sync each time
    with b.connect("app", USER) as c:
        check_feed_binds(b, app, c, False, [ISOLATED, 1, ISOLATED2, 3, ISOLATED])
    st1 = stats(b)
    assert st1["reparsed"] - st0["reparsed"] == 3
    # a named statement bound with organizations in turn: isolated, not
    # isolated (parsed back to the parent text), another isolated one, ...
    with b.connect("app", USER, prepare_threshold=5) as c:
        check_feed_binds(b, app, c, True, [ISOLATED, 1, ISOLATED2, 3, 3, ISOLATED, ISOLATED, 1])
    st2 = stats(b)
    assert st2["reparsed"] - st1["reparsed"] == 6       # not for a second Bind of the same text
    lines = route_lines(b)
    assert any(re.search(r" B org=2 decision=param target=SELECT .*documents_o2_1 .*rewrite=leaf "
                         r"prefix=\S+ reparse=yes$", l) for l in lines), lines
    assert any(re.search(r" B org=1 decision=param .*rewrite=parent prefix=\S+ reparse=yes$", l) for l in lines)
    # DML with parameters on an isolated organization: same effect as on the parent
    with b.connect("app", USER, prepare_threshold=5) as c:
        some_id = direct(app, "SELECT min(id) FROM documents WHERE organization_id = 5")[0][0]
        for prepare in (False, True):
            log0 = app.log_size()
            row = c.execute("UPDATE documents SET title = title || '' WHERE organization_id = %s AND id = %s "
                            "RETURNING id, title", [ISOLATED2, some_id], prepare=prepare).fetchone()
            assert "public.documents_o5_1 documents" in executed(app, log0)[0]
            assert row == direct(app, "SELECT id, title FROM documents WHERE id = %s", [some_id])[0]
        # INSERT rows with parameters (a binary one): on the parent, where PostgreSQL puts them in the leaf
        log0 = app.log_size()
        c.execute("INSERT INTO versions (organization_id, document_id, body) VALUES (%b, %s, 'bin ins')",
                  [ISOLATED2, some_id])
        assert "INSERT INTO versions (" in executed(app, log0, "versions")[0]
        assert direct(app, "SELECT tableoid::regclass::text FROM versions WHERE body = 'bin ins'") == \
            [("versions_o5_1",)]
        # a binary parameter addressed to the leaf
        log0 = app.log_size()
        c.execute("DELETE FROM versions WHERE organization_id = %b AND body = 'bin ins'", [ISOLATED2])
        assert "FROM public.versions_o5_1 versions" in executed(app, log0, "versions")[0]
    assert direct(app, "SELECT count(*) FROM versions WHERE body = 'bin ins'")[0][0] == 0


def test_one_leaf_rewrite_serves_every_organization(router, app):
    """A statement is rewritten with libpg_query once, as a leaf template, and
    every organization's messages get their own leaves from it: rewrites_made
    does not grow with the organizations (one rewrite per organization made
    10,000 isolated organizations overflow the templates: a parse and a
    deparse per statement). Simple Queries with literals (normalized) and a
    named statement bound with each organization in turn; every result is
    PostgreSQL's, and PostgreSQL ran each on that organization's leaf."""
    b = router()
    w = b.login("app", USER)
    ids = {o: [r[0] for r in direct(app, "SELECT id FROM documents WHERE organization_id = %s ORDER BY id LIMIT 3",
                                    [o])] for o in (ISOLATED, ISOLATED2)}
    st0 = stats(b)
    n = 0
    for _ in range(2):
        for o in (ISOLATED, ISOLATED2):
            for i in ids[o]:
                stmt = f"SELECT id, title FROM documents WHERE organization_id = {o} AND id = {i}"
                log0 = app.log_size()
                assert w.query(stmt).rows == [[str(v) for v in r] for r in direct(app, stmt)], stmt
                assert any(f"public.documents_o{o}_1 documents" in t for t in executed(app, log0)), stmt
                n += 1
    st1 = stats(b)
    assert st1["rewritten"] - st0["rewritten"] == n
    assert st1["rewrites_made"] - st0["rewrites_made"] == 1, (st0, st1)
    # a named statement: the organization is a parameter, decided at each Bind
    with b.connect("app", USER, prepare_threshold=5) as c:
        for o in (ISOLATED, ISOLATED2, 1, ISOLATED, ISOLATED2):
            log0 = app.log_size()
            q = "SELECT id, title FROM documents WHERE organization_id = %s AND id = ANY(%s) ORDER BY id"
            got = c.execute(q, [o, ids.get(o, [1, 2])], prepare=True).fetchall()
            assert got == direct(app, q, [o, ids.get(o, [1, 2])]), o
            leaf = [t for t in executed(app, log0) if "documents_o" in t]
            assert (leaf and all(f"documents_o{o}_1" in t for t in leaf)) if o in ids else not leaf, (o, leaf)
    st2 = stats(b)
    assert st2["rewrites_made"] - st1["rewrites_made"] == 1, (st1, st2)
    assert st2["rewrite_failed"] == st0["rewrite_failed"]


def test_a_pipeline_of_binds_for_several_organizations_gets_each_its_rows(router, app):
    """psycopg's pipeline mode sends many Binds before one Sync: the core
    keeps only so many re-parses in flight, so after a few leaves the
    statement stays on the parent text (right for every organization), and
    no prefix goes where the batch may still be open."""
    b = router()
    orgs = [ISOLATED, 1, ISOLATED2, 3, ISOLATED, ISOLATED2, 1, ISOLATED, ISOLATED2, 1, ISOLATED, 3, ISOLATED2]
    for threshold in (None, 0):             # unnamed statements, then one named statement
        with b.connect("app", USER, prepare_threshold=threshold) as c:
            with c.pipeline():
                curs = []
                for o in orgs:
                    curs.append((o, c.cursor()))
                    curs[-1][1].execute(ORM_FEED, [o])
            for o, cur in curs:
                assert cur.fetchall() == direct(app, ORM_FEED, [o]), (threshold, o)
            # back to one statement per Sync: prefixes come back (the first one
            # after the pipeline may be skipped: its batch could still be open)
            q = f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3 AND %s"
            c.execute(q, [True])
            assert c.execute(q, [True]).fetchone()[0] == "3"
    st = stats(b)
    assert st["reparses_lost"] == 0 and st["reparses_refused"] == 0, st
    assert st["reparsed"] >= 4


COUNT_OF_ORG = "SELECT count(*), min(organization_id), max(organization_id) FROM documents WHERE organization_id = $1"


@pytest.mark.parametrize("pipelined", [False, True], ids=["batches", "pipelined"])
@pytest.mark.parametrize("settings", [{"pool_mode": "session"},
                                      {"pool_mode": "transaction", "max_prepared_statements": "0"},
                                      {"pool_mode": "transaction"}],
                         ids=["session", "transaction-uncached", "transaction-cached"])
def test_a_reparse_skipped_after_an_error_of_its_batch_is_not_taken_for_done(router, app, settings, pipelined):
    """A named statement bound for organization 2 has 2's leaf text on the
    server. A batch whose first statement fails then binds it for 5: the
    re-parse to 5's leaf in front of that Bind is skipped with the rest of
    the batch. The next Bind for 5 must not run 2's leaf text (it would
    count no rows of 5) -- also when the client sends it past the failing
    batch's Sync, before the error is known."""
    b = router(settings=settings)
    want = {o: [list(map(str, r)) for r in direct(app, COUNT_OF_ORG.replace("$1", str(o)))]
            for o in (ISOLATED, ISOLATED2)}
    w = b.login("app", USER)
    bind = lambda o: Wire.bind_msg(stmt="s1", params=[o]) + Wire.execute_msg()  # noqa: E731
    failing = Wire.parse_msg("SELECT 1/0") + Wire.bind_msg() + Wire.execute_msg()
    w.send(Wire.parse_msg(COUNT_OF_ORG, "s1") + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).error is None
    w.send(bind(ISOLATED) + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).rows == want[ISOLATED]
    for _ in range(2):
        skipped = failing + bind(ISOLATED2) + Wire.sync_msg()
        if pipelined:
            w.send(skipped + bind(ISOLATED2) + Wire.sync_msg())
        else:
            w.send(skipped)
        res = w.read_until_ready(timeout=5 * SLOW)
        assert res.error is not None and res.error.sqlstate == "22012" and res.rows == []
        if not pipelined:
            w.send(bind(ISOLATED2) + Wire.sync_msg())
        res = w.read_until_ready(timeout=5 * SLOW)
        assert res.error is None and res.rows == want[ISOLATED2], res.error
        w.send(bind(ISOLATED) + Wire.sync_msg())
        assert w.read_until_ready(timeout=5 * SLOW).rows == want[ISOLATED]
    w.send(failing + bind(ISOLATED2) + Wire.sync_msg() + bind(ISOLATED) + bind(ISOLATED2) + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).error.sqlstate == "22012"
    assert w.read_until_ready(timeout=5 * SLOW).rows == want[ISOLATED] + want[ISOLATED2]
    st = stats(b)
    assert st["reparses_refused"] == 0 and st["reparsed"] >= 3, st
    assert b.alive()


def test_a_describe_alone_in_its_batch_is_no_pipelining_but_a_bind_past_a_sync_is(router, app):
    """libpq's PQdescribePrepared sends a Describe and a Sync alone: the
    Binds after it are addressed to each organization's leaf at once. A
    Bind the client sends past an unanswered Sync is taken for pipelining
    (the core says so): it is not parsed again for a leaf, and goes back to
    the client's text, right for every organization."""
    b = router()
    want = {o: [list(map(str, r)) for r in direct(app, COUNT_OF_ORG.replace("$1", str(o)))]
            for o in (ISOLATED, ISOLATED2)}
    w = b.login("app", USER)
    bind = lambda o: Wire.bind_msg(stmt="s1", params=[o]) + Wire.execute_msg()  # noqa: E731
    w.send(Wire.parse_msg(COUNT_OF_ORG, "s1") + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).error is None
    w.send(message(b"D", b"Ss1\0") + Wire.sync_msg())
    assert [t for t, _ in w.read_until_ready(timeout=5 * SLOW).messages] == [b"t", b"T", b"Z"]
    for o in (ISOLATED, ISOLATED2, ISOLATED):
        w.send(bind(o) + Wire.sync_msg())
        assert w.read_until_ready(timeout=5 * SLOW).rows == want[o]
        line = route_lines(b)[-1]
        assert "rewrite=leaf" in line and f"documents_o{o}_1" in line, line
    w.send(bind(ISOLATED) + Wire.sync_msg() + bind(ISOLATED2) + Wire.sync_msg())
    assert w.read_until_ready(timeout=5 * SLOW).rows == want[ISOLATED]
    assert w.read_until_ready(timeout=5 * SLOW).rows == want[ISOLATED2]
    line = route_lines(b)[-1]
    assert "org=5" in line and "rewrite=parent" in line, line
    assert b.alive()


def test_a_statement_rewritten_at_its_parse_follows_the_catalog_at_each_bind(router, app):
    """A named statement with a constant organization is addressed to the
    leaf at its Parse; its later Binds are routed on the client's text (the
    prefix, the catalog: back to the parent if the leaf went away)."""
    b = router()
    q = "SELECT count(*) FROM documents WHERE organization_id = 5 AND %s"
    n5 = direct(app, "SELECT count(*) FROM documents WHERE organization_id = 5")[0][0]
    with b.connect("app", USER, prepare_threshold=5) as c:
        log0 = app.log_size()
        for _ in range(3):
            assert c.execute(q, [True], prepare=True).fetchone()[0] == n5
        assert all("documents_o5_1" in t for t in executed(app, log0)), executed(app, log0)
        v0 = int(b.admin_dicts("SHOW META_CACHE")[0]["version"])
        try:
            direct_admin(app, "UPDATE lokadb.orgs SET isolated = false WHERE id = '5'")
            wait_until(lambda: int(b.admin_dicts("SHOW META_CACHE")[0]["version"]) > v0, 5 * SLOW,
                       what="meta_cache to load the change")
            log0 = app.log_size()
            assert c.execute(q, [True], prepare=True).fetchone()[0] == n5
            ran = executed(app, log0)
            assert len(ran) == 1 and "documents_o5" not in ran[0], ran
        finally:
            direct_admin(app, "UPDATE lokadb.orgs SET isolated = true WHERE id = '5'")
    lines = route_lines(b)
    assert any(" B org=5 decision=statement " in l and "rewrite=parent" in l for l in lines), lines


# ------------------------------------------ organization affinity --

def backend_of(w, org):
    """pg_backend_pid() of the server a statement of `org` ran on."""
    return w.query(f"SELECT pg_backend_pid(), count(*) FROM documents WHERE organization_id = {org}").rows[0][0]


def open_servers(b, n):
    """n server connections in the pool: n clients in a block at once, then idle."""
    ws = [b.login("app", USER) for _ in range(n)]
    for w in ws:
        w.query("BEGIN")
        w.query("SELECT 1")
    for w in ws:
        w.query("COMMIT")
        w.close()


def test_each_organization_keeps_its_server_connection_with_org_affinity(router):
    """Organizations with partitions of their own keep their backend (each
    backend then touches only its organizations' partitions); organizations
    in DEFAULT share one partition and get no affinity: the pool gives the
    server it would give without the plugin (switching backends per
    statement only costs). A client alone in its pool stays on one backend
    (the end of the test); `peer` keeps `w` from being alone until then."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 3})
    assert b.show_config()["plugin.org_routing.org_affinity"]["default"] == "8"
    open_servers(b, 3)
    peer = b.login("app", USER)
    w = b.login("app", USER)
    seen = {o: set() for o in (ISOLATED, ISOLATED2)}
    for _ in range(4):
        for o in seen:
            seen[o].add(backend_of(w, o))
    assert all(len(p) == 1 for p in seen.values()), seen
    pids = {next(iter(p)) for p in seen.values()}
    assert len(pids) == 2, seen
    # DEFAULT organizations: the last used server (LIFO), like without affinity
    last = backend_of(w, 1)
    assert {backend_of(w, o) for o in (1, 3, 1, 3)} == {last}
    # the session's organization is the affinity of statements without one
    w.query(f"SET lokadb.org = {ISOLATED2}")
    assert w.query("SELECT pg_backend_pid(), count(*) FROM projects").rows[0][0] in seen[ISOLATED2]
    assert backend_of(w, ISOLATED) in seen[ISOLATED]
    # a busy affine server never makes a client wait while another one is idle
    a = b.login("app", USER)
    a.query("BEGIN")
    busy = backend_of(a, ISOLATED)
    assert busy in seen[ISOLATED]
    o = b.login("app", USER)
    t0 = time.monotonic()
    other = o.query(f"SELECT pg_backend_pid(), count(*) FROM documents WHERE organization_id = {ISOLATED}",
                    timeout=2 * SLOW).rows[0][0]
    assert other != busy and time.monotonic() - t0 < 1 * SLOW
    a.query("COMMIT")
    assert backend_of(w, ISOLATED) in seen[ISOLATED] | {other} | {other}
    # alone in its pool, the client stays on the backend it used last
    for x in (a, o, peer):
        x.close()
    wait_until(lambda: sum(int(r["cl_active"]) for r in b.admin_dicts("SHOW POOLS")
                           if r["database"] == "app") == 1, 5 * SLOW, what="the other clients to leave")
    alone = {backend_of(w, org) for org in (ISOLATED, ISOLATED2, ISOLATED, ISOLATED2)}
    assert len(alone) == 1, (alone, seen)


def test_without_org_affinity_the_pool_gives_the_last_used_server(router):
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 3}, extra="org_affinity = 0\n")
    open_servers(b, 3)
    w = b.login("app", USER)
    pids = {backend_of(w, o) for _ in range(3) for o in (1, 3, ISOLATED)}
    assert len(pids) == 1, pids
    res = b.admin_result("SET plugin.org_routing.org_affinity = '33'")
    assert_error(res.error, "22023", "must be a number of organizations per server 0..32")


# ---------------------------------------------- paused organizations --

def mc_version(b):
    return int(b.admin_dicts("SHOW META_CACHE")[0]["version"])


def set_paused(app, b, org, paused):
    """lokadb.orgs.paused as a move's switch sets it, seen by meta_cache."""
    v0 = mc_version(b)
    direct_admin(app, "UPDATE lokadb.orgs SET paused = %s WHERE id = %s", [paused, str(org)])
    wait_until(lambda: mc_version(b) > v0, 5 * SLOW, what="meta_cache to load the change")


def test_statements_of_a_paused_organization_wait_until_it_is_unpaused(router, app):
    b = router()
    count = {o: [[str(direct(app, "SELECT count(*) FROM documents WHERE organization_id = %s", [o])[0][0])]]
             for o in (1, 3)}
    held, by_session, other, block = (b.login("app", USER) for _ in range(4))
    by_session.query("SET lokadb.org = 3")
    block.query("BEGIN")
    block.query("SELECT count(*) FROM documents WHERE organization_id = 1")
    bgs = []
    try:
        set_paused(app, b, 3, True)
        t0 = time.monotonic()
        bgs.append(BgCall(held.query, "SELECT count(*) FROM documents WHERE organization_id = 3", timeout=10))
        bgs.append(BgCall(by_session.query, "SELECT count(*) FROM documents", timeout=10))

        def extended():
            with b.connect("app", USER) as c:
                return [[str(c.execute("SELECT count(*) FROM documents WHERE organization_id = %s", [3]
                                       ).fetchone()[0])]]
        bgs.append(BgCall(extended))
        # other organizations, statements on no LokaDB table, and a block that
        # already ran on LokaDB tables (it may hold locks the switch waits for) go on
        assert other.query("SELECT count(*) FROM documents WHERE organization_id = 1").rows == count[1]
        assert other.query("SELECT count(*) FROM projects WHERE organization_id = 3").rows == [["3"]]
        assert block.query("SELECT count(*) FROM documents WHERE organization_id = 3").rows == count[3]
        block.query("COMMIT")
        assert time.monotonic() - t0 < 1 * SLOW
        wait_until(lambda: stats(b)["held_for_pause"] >= 3, 5 * SLOW, what="three statements held")
        time.sleep(0.3)
        assert not any(bg.done() for bg in bgs)
    finally:
        set_paused(app, b, 3, False)
    t1 = time.monotonic()
    assert bgs[0].result(5 * SLOW).rows == count[3]
    assert bgs[1].result(5 * SLOW).rows == [[str(direct(app, "SELECT count(*) FROM documents")[0][0])]]
    assert bgs[2].result(5 * SLOW) == count[3]
    assert time.monotonic() - t1 < 1 * SLOW
    assert stats(b)["pause_timeouts"] == 0
    assert sum(" org=3 decision=paused " in l for l in route_lines(b)) == 3, route_lines(b)


def test_a_statement_paused_longer_than_pause_timeout_fails_with_55P03(router, app):
    b = router(extra="pause_timeout = 300ms\n")
    w = b.login("app", USER)
    try:
        set_paused(app, b, 3, True)
        t0 = time.monotonic()
        res = w.query("SELECT count(*) FROM documents WHERE organization_id = 3", raise_error=False,
                      timeout=5 * SLOW)
        waited = time.monotonic() - t0
        assert_error(res.error, "55P03", "organization 3 is paused")
        assert "pause_timeout (300ms)" in res.error.message
        assert 0.25 <= waited < 2 * SLOW, waited
        assert w.scalar("SELECT 1") == "1"                  # the session goes on
        assert stats(b)["pause_timeouts"] == 1
    finally:
        set_paused(app, b, 3, False)
    assert w.query("SELECT count(*) FROM documents WHERE organization_id = 3").error is None
    res = b.admin_result("SET plugin.org_routing.pause_timeout = '0'")
    assert_error(res.error, "22023", "must be a duration")


# ---------------------------------------------- generic-plan trap --

def test_no_prepared_statement_on_a_parent_runs_with_a_generic_plan(router, app):
    """PostgreSQL builds a generic plan over every partition at a prepared
    statement's 6th execution (and uses it when it looks cheaper, or always
    with force_generic_plan): org_routing sets plan_cache_mode =
    force_custom_plan on the server with its prefix. The role's default is
    made force_generic_plan here, so that only the plugin's setting can
    explain custom plans."""
    q = "SELECT count(*) FROM documents WHERE organization_id = %s"
    n1 = direct(app, "SELECT count(*) FROM documents WHERE organization_id = 1")[0][0]
    direct_admin(app, f"ALTER ROLE {USER} IN DATABASE {APP_DB} SET plan_cache_mode = force_generic_plan")
    try:
        for force in ("on", "off", "auto"):      # auto: organizations 2 and 5 have partitions here
            b = router(settings={"pool_mode": "transaction", "default_pool_size": 1},
                       extra=f"force_custom_plan = {force}\n")
            with b.connect("app", USER, prepare_threshold=5) as c:
                for _ in range(8):
                    assert c.execute(q, [1], prepare=True).fetchone()[0] == n1
                c.execute("PREPARE p (bigint) AS SELECT count(*) FROM documents WHERE organization_id = $1")
                for _ in range(7):
                    assert c.execute("EXECUTE p (1)").fetchone()[0] == n1
                plan = "\n".join(r[0] for r in c.execute("EXPLAIN EXECUTE p (1)").fetchall())
                rows = c.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                                 "WHERE statement LIKE '%documents%' ORDER BY statement").fetchall()
                mode = c.execute("SHOW plan_cache_mode").fetchone()[0]
                c.execute("DEALLOCATE p")
            assert len(rows) == 2, rows
            if force != "off":
                assert mode == "force_custom_plan"
                assert all(r[1] == 0 and r[2] >= 7 for r in rows), rows
                assert "'1'::bigint" in plan and "$1" not in plan, plan      # a custom plan
                assert stats(b)["plan_mode_sets"] >= 1
            else:
                assert mode == "force_generic_plan"
                assert all(r[1] >= 7 for r in rows), rows
                assert "$1" in plan, plan
                assert stats(b)["plan_mode_sets"] == 0
    finally:
        direct_admin(app, f"ALTER ROLE {USER} IN DATABASE {APP_DB} RESET plan_cache_mode")


# ---------------------------------------- protocol features unchanged --

def test_protocol_features_keep_working_through_the_plugin(router, app):
    b = router(settings={"pool_mode": "session"})
    n3 = direct(app, "SELECT count(*) FROM documents WHERE organization_id = 3")[0][0]
    w = b.login("app", USER)
    # a multi-statement Query message
    res = w.query(f"SELECT 1; SELECT count(*) FROM documents WHERE organization_id = 3; SELECT {SETTING}")
    assert res.rows == [["1"], [str(n3)], ["3"]] and res.tags == ["SELECT 1"] * 3
    with b.connect("app", USER, autocommit=False) as c:
        # transactions: rollback and commit
        c.execute("INSERT INTO documents (organization_id, project_id, title) VALUES (3, 7, 'txn')")
        c.rollback()
        assert c.execute("SELECT count(*) FROM documents WHERE organization_id = 3 AND title = 'txn'"
                         ).fetchone()[0] == 0
        c.execute("INSERT INTO documents (organization_id, project_id, title) VALUES (3, 7, 'txn')")
        c.commit()
        assert direct(app, "SELECT count(*) FROM documents WHERE title = 'txn'")[0][0] == 1
        # a server-side cursor (DECLARE / FETCH)
        with c.cursor(name="feed") as cur:
            cur.execute("SELECT id FROM documents WHERE organization_id = 2 ORDER BY id")
            assert len(cur.fetchmany(5)) == 5 and len(cur.fetchall()) == DOCS_PER_ORG - 5
        c.commit()
        # executemany
        c.cursor().executemany("INSERT INTO versions (organization_id, document_id, body) VALUES (%s, 1, 'many')",
                               [(1,), (2,), (3,)])
        c.commit()
        assert direct(app, "SELECT count(*) FROM versions WHERE body = 'many'")[0][0] == 3
        c.execute("DELETE FROM versions WHERE body = 'many'")
        c.execute("DELETE FROM documents WHERE title = 'txn'")
        c.commit()
    with b.connect("app", USER, prepare_threshold=2) as c:
        # prepared statements, executed again and again
        for i in range(6):
            org = ORGS[i % 3]
            assert c.execute("SELECT count(*) FROM documents WHERE organization_id = %s", [org],
                             prepare=True).fetchone()[0] == direct(
                app, "SELECT count(*) FROM documents WHERE organization_id = %s", [org])[0][0]
        c.execute("PREPARE p (bigint) AS SELECT count(*) FROM versions WHERE organization_id = $1")
        assert c.execute("EXECUTE p (3)").fetchone()[0] == 2 * n3
        # COPY in both directions
        with c.cursor().copy("COPY versions (organization_id, document_id, body) FROM STDIN") as cp:
            cp.write_row((1, 1, "c1"))
        assert copy_out(c, "COPY (SELECT body FROM versions WHERE organization_id = 1 AND body = 'c1') "
                           "TO STDOUT") == b"c1\n"
        c.execute("DELETE FROM versions WHERE body = 'c1'")
    # LISTEN / NOTIFY
    got = []
    with b.connect("app", USER) as listener, b.connect("app", USER) as talker:
        listener.add_notify_handler(lambda n: got.append((n.channel, n.payload)))
        listener.execute("LISTEN lokadb_test")
        talker.execute("NOTIFY lokadb_test, 'hello'")
        wait_until(lambda: listener.execute("SELECT 1") and got, 5 * SLOW, what="the notification")
    assert got == [("lokadb_test", "hello")]


def test_transaction_pooling_sets_the_organization_on_whichever_server_runs_it(router):
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    a, o = b.login("app", USER), b.login("app", USER)
    q_none = f"SELECT {SETTING}, count(*) FROM documents"
    a.query("SET lokadb.org = 1")                   # runs on the one server, which keeps it
    assert org_of(o, q_none) == ""                  # another client: cleared before its statement
    assert org_of(a, q_none) == "1"
    assert org_of(o, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3") == "3"
    assert org_of(a, q_none) == "1"
    a.query("BEGIN")
    assert org_of(a, f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3") == "3"
    before = stats(b)["prefixes"]
    assert org_of(a, f"SELECT {SETTING}, count(*) FROM versions WHERE organization_id = 3") == "3"
    assert stats(b)["prefixes"] == before           # same server inside the block: known
    a.query("COMMIT")
    # concurrent clients of different organizations on a pool of 2
    b2 = router(settings={"pool_mode": "transaction", "default_pool_size": 2})
    errors_seen = []

    def worker(org):
        try:
            with b2.connect("app", USER) as c:
                for _ in range(40):
                    r = c.execute(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = {org}"
                                  ).fetchone()
                    if r[0] != str(org):
                        errors_seen.append((org, r))
        except Exception as e:  # noqa: BLE001 -- reported below
            errors_seen.append((org, repr(e)))
    threads = [threading.Thread(target=worker, args=(org,)) for org in ORGS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30 * SLOW)
    assert errors_seen == []


UNUSUAL = [
    "EXPLAIN (COSTS OFF) SELECT * FROM documents WHERE organization_id = 3",
    "SELECT count(*) FROM documents WHERE organization_id = 2 UNION ALL "
    "SELECT count(*) FROM documents WHERE organization_id = 2",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
    "SELECT count(*) FROM r, documents d WHERE d.organization_id = 2",
    "SELECT count(*) FROM documents TABLESAMPLE SYSTEM (100) WHERE organization_id = 2",
    "SELECT count(*) FROM documents d, LATERAL (SELECT count(*) FROM versions v "
    "WHERE v.document_id = d.id AND v.organization_id = 2) x WHERE d.organization_id = 2",
    "SELECT (SELECT count(*) FROM documents WHERE organization_id = 2), "
    "(SELECT count(*) FROM documents WHERE organization_id = 3)",
    "SELECT count(*) FROM documents WHERE (organization_id, id) = (2, 1)",
    "SELECT count(*) FROM public.documents d FULL JOIN versions v ON v.document_id = d.id "
    "AND v.organization_id = 2 WHERE d.organization_id = 2",
    "BEGIN; LOCK TABLE documents IN SHARE MODE; ROLLBACK",
    "SELECT count(*) FROM documents WHERE organization_id = $1",
    "SELECT * FROM documents WHERE organization_id = 2 AND no_such_column = 1",
    "SELEC 1 FROM documents",
    "INSERT INTO documents VALUES (2, DEFAULT, 1, 'no column list') RETURNING title",
    "INSERT INTO documents (organization_id, project_id, title) SELECT 2, 1, 'from select' RETURNING title",
    "SELECT count(*) FROM documents " + " ".join(f"JOIN versions v{i} ON v{i}.document_id = documents.id "
                                                 f"AND v{i}.organization_id = documents.organization_id"
                                                 for i in range(3)) + " WHERE documents.organization_id = 2",
    "SELECT count(*) FROM documents WHERE organization_id = 2 AND " +
    " AND ".join(f"{i} = {i}" for i in range(80)),
]


def outcome(w, stmt):
    res = w.query(stmt, raise_error=False)
    return (res.error.sqlstate if res.error else None), res.rows


def test_unusual_statements_behave_as_without_the_plugin(router, app):
    b = router()
    with Wire(port=app.port, timeout=10 * SLOW) as d:
        d.login(USER, APP_DB)
        w = b.login("app", USER)
        for stmt in UNUSUAL:
            got, want = outcome(w, stmt), outcome(d, stmt)
            if stmt.startswith("EXPLAIN"):
                got, want = got[0], want[0]         # plans differ only by what was pruned
            assert got == want, stmt
    direct(app, "DELETE FROM documents WHERE title IN ('no column list', 'from select')")
    assert b.alive()

# ------------------------------------------------------ catalog changes --

def test_a_live_session_sees_an_organization_isolated_after_it_connected(router, app):
    b = router()
    w = b.login("app", USER)
    stmt = "SELECT count(*) FROM documents WHERE organization_id = 4"
    w.query(stmt)
    assert route_lines(b)[-1].endswith("rewrite=no prefix=sent")
    v0 = int(b.admin_dicts("SHOW META_CACHE")[0]["version"])
    with app.connect(dbname=APP_DB) as c:
        with c.transaction():
            c.execute("INSERT INTO organizations VALUES (4, 'org 4') ON CONFLICT DO NOTHING")
            for t in ("documents", "versions"):
                c.execute(f"CREATE TABLE IF NOT EXISTS {t}_o4 PARTITION OF {t} FOR VALUES IN (4) "
                          "PARTITION BY LIST (organization_id)")
                c.execute(f"CREATE TABLE IF NOT EXISTS {t}_o4_1 PARTITION OF {t}_o4 FOR VALUES IN (4)")
                c.execute(f"GRANT ALL ON {t}_o4_1 TO PUBLIC")
            c.execute("INSERT INTO lokadb.orgs (id, name, isolated) VALUES ('4', 'org 4', true)")
            c.execute("INSERT INTO lokadb.partitions VALUES ('public', 'documents', '4', 'documents_o4', "
                      "'documents_o4_1'), ('public', 'versions', '4', 'versions_o4', 'versions_o4_1')")
    wait_until(lambda: int(b.admin_dicts("SHOW META_CACHE")[0]["version"]) > v0, 5 * SLOW,
               what="meta_cache to load the change")
    w.query(stmt)
    assert "rewrite=leaf" in route_lines(b)[-1] and "documents_o4_1" in route_lines(b)[-1]
    assert stats(b)["parse_cache_invalidations"] >= 1


# --------------------------------------------- route_log, SHOW, settings --

def test_route_log_is_off_by_default_and_writes_one_line_per_statement_when_on(router):
    b = router(route_log="off", extra=STATEMENT_ORG)
    assert b.show_config()["plugin.org_routing.route_log"]["default"] == "off"
    w = b.login("app", USER)
    w.query("SELECT count(*) FROM documents WHERE organization_id = 3")
    assert route_lines(b) == []
    b.admin("SET plugin.org_routing.route_log = 'on'")
    w.query("SELECT count(*) FROM documents WHERE organization_id = 2")
    w.query("SELECT count(*) FROM projects")
    lines = route_lines(b)
    assert len(lines) == 2, lines
    assert re.search(r"LOG plugin org_routing: C-\d+ Q org=2 decision=statement target=SELECT .*documents_o2_1"
                     r".* rewrite=leaf prefix=sent$", lines[0]), lines[0]
    assert re.search(r"C-\d+ Q org=- decision=pass target=- rewrite=no prefix=-$", lines[1]), lines[1]
    res = b.admin_result("SET plugin.org_routing.route_log = 'maybe'")
    assert_error(res.error, "22023", "must be on or off")


def test_show_org_routing_counts_the_parse_cache_and_the_decisions(router):
    b = router(extra="parse_cache_size = 16\n")
    assert list(b.admin_dicts("SHOW ORG_ROUTING")[0].keys()) == SHOW_COLUMNS
    w = b.login("app", USER)
    st0 = stats(b)
    for _ in range(3):
        w.query("SELECT count(*) FROM documents WHERE organization_id = 3")
    st = stats(b)
    assert st["parse_cache_misses"] - st0["parse_cache_misses"] == 1
    assert st["parse_cache_hits"] - st0["parse_cache_hits"] == 2
    assert st["statements_routed"] - st0["statements_routed"] == 3
    assert st["org_from_statement"] - st0["org_from_statement"] == 3
    # statements that name no LokaDB table (and change nothing of the session)
    # pass on the prefilter: not parsed, not cached
    for i in range(20):
        w.query(f"SELECT {i}")
    st2 = stats(b)
    assert st2["statements_prefiltered"] - st["statements_prefiltered"] == 20
    assert st2["parse_cache_misses"] == st["parse_cache_misses"]
    # ones that do name a LokaDB table (here in a string) are parsed and cached, within the bound
    # (by their normalized text: the aliases make 20 different ones)
    for i in range(20):
        w.query(f"SELECT {i} AS c{i}, 'documents'")
    st = stats(b)
    assert st["parse_cache_size"] == 16 and st["parse_cache_entries"] <= 16 and st["parse_cache_evictions"] >= 4
    assert st["statements_passed"] >= 40
    res = b.admin_result("SET plugin.org_routing.parse_cache_size = '3'")
    assert_error(res.error, "22023", "must be a number of statements 16..1000000")


def test_org_routing_needs_meta_cache(bouncer_factory, app):
    b = bouncer_factory(settings={"plugins": "org_routing"}, start=False)
    r = b.run_foreground()
    assert r.returncode != 0
    assert "org_routing needs the plugin meta_cache" in r.stderr



def test_a_statement_in_the_middle_of_a_batch_gets_its_organization(router):
    """A Query between the messages of an extended-protocol batch would end
    the batch (and after an error in it PostgreSQL would skip the Query): in
    the middle of a batch the organization goes in hidden extended-protocol
    messages, whose replies the client never sees."""
    b = router()
    w = b.login("app", USER)
    q1 = Wire.parse_msg(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 1")
    q3 = Wire.parse_msg(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3")
    qp = Wire.parse_msg(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = $1")
    bad = Wire.parse_msg("SELECT no_such_column FROM projects")
    n = {o: str(direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = %s", [o])[0][0])
         for o in (1, 3)}
    one = Wire.bind_msg() + Wire.execute_msg()
    w.send(q1 + one + q3 + one + qp + Wire.bind_msg(params=[1]) + Wire.execute_msg() + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    assert res.error is None and res.rows == [["1", n[1]], ["3", n[3]], ["1", n[1]]]
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C"] * 3 + [b"Z"]
    # an error early in the batch: PostgreSQL skips to the Sync (the hidden
    # messages too), the client gets its error and the session goes on
    w.send(bad + one + q3 + one + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    assert_error(res.error, "42703", "no_such_column")
    assert [m[0] for m in res.messages] == [b"E", b"Z"]
    assert w.query(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3").rows == [["3", n[3]]]
    # a failing statement behind the hidden messages: its own error, nothing else
    w.send(q1 + one + Wire.parse_msg("SELECT 1 / (count(*) - count(*)) FROM documents WHERE organization_id = 3") +
           one + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    assert_error(res.error, "22012", "division by zero")
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C", b"1", b"2", b"E", b"Z"]
    assert stats(b)["prefixes_skipped"] == 0
    w.send(q3 + one + q1 + one + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    assert res.error is None and res.rows == [["3", n[3]], ["1", n[1]]]


def test_an_explain_of_a_write_inside_a_batch_gets_its_organization(router):
    """EXPLAIN of an INSERT, UPDATE or DELETE runs behind other messages of a
    batch as the write itself does: in the middle of a batch it gets its
    organization in front of it like the write (it used to get none), and it
    runs on the table as written."""
    b = router(extra=STATEMENT_ORG)
    w = b.login("app", USER)
    one = Wire.bind_msg() + Wire.execute_msg()
    setting = Wire.parse_msg(f"SELECT {SETTING}") + one
    for o, other in ((3, 1), (ISOLATED, 3)):
        for stmt in (f"EXPLAIN UPDATE documents SET title = title WHERE organization_id = {o}",
                     f"EXPLAIN (COSTS OFF) DELETE FROM documents WHERE organization_id = {o} AND id = -1",
                     f"EXPLAIN INSERT INTO documents (organization_id, project_id, title) VALUES ({o}, 1, 'x')"):
            first = Wire.parse_msg(f"SELECT count(*) FROM documents WHERE organization_id = {other}") + one
            w.send(first + Wire.parse_msg(stmt) + one + setting + Wire.sync_msg())
            res = w.read_until_ready(timeout=5 * SLOW)
            assert res.error is None, stmt
            assert res.tags == ["SELECT 1", "EXPLAIN", "SELECT 1"], stmt
            assert res.rows[-1] == [str(o)], stmt
            plan = " ".join(r[0] for r in res.rows[1:-1])
            assert "documents" in plan, plan
    # as a simple Query: the organization in front of it in the same Query
    assert w.query("EXPLAIN DELETE FROM documents WHERE organization_id = 1").error is None
    assert w.query(f"SELECT {SETTING}").rows == [["1"]]
    assert w.query("SELECT count(*) FROM documents WHERE title = 'x'").rows == [["0"]]


def test_a_declare_lock_truncate_or_create_table_as_inside_a_batch_gets_its_organization(router):
    """DECLARE, LOCK, TRUNCATE and CREATE TABLE AS on LokaDB tables run behind other
    messages of a batch as alone: in the middle of a batch they get their
    organization in front of them (they used to get none: the server kept the
    batch's earlier one). The cursor reads its organization's rows."""
    b = router(extra=STATEMENT_ORG)
    w = b.login("app", USER)
    one = Wire.bind_msg() + Wire.execute_msg()
    setting = Wire.parse_msg(f"SELECT {SETTING}") + one
    counts = {o: direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = %s", [o])[0][0]
              for o in ORGS}
    assert w.query("BEGIN").error is None
    for o, other in ((3, 1), (ISOLATED, 3)):
        first = Wire.parse_msg(f"SELECT count(*) FROM documents WHERE organization_id = {other}") + one
        for stmt, tag in ((f"DECLARE c{o} CURSOR FOR SELECT id FROM documents WHERE organization_id = {o}",
                           "DECLARE CURSOR"),
                          (f"CREATE TEMP TABLE t{o} AS SELECT id FROM documents WHERE organization_id = {o}",
                           f"SELECT {counts[o]}")):
            w.send(first + Wire.parse_msg(stmt) + one + setting + Wire.sync_msg())
            res = w.read_until_ready(timeout=5 * SLOW)
            assert res.error is None, (stmt, res.error)
            assert res.tags == ["SELECT 1", tag, "SELECT 1"], stmt
            assert res.rows[-1] == [str(o)], stmt
        assert w.query(f"SELECT count(*) FROM t{o}").rows == [[str(counts[o])]]
        fetched = w.query(f"FETCH ALL FROM c{o}")
        assert fetched.error is None and len(fetched.rows) == counts[o]
    # LOCK and TRUNCATE (rolled back with the block below) name no
    # organization: the session's goes in front of them
    assert w.query("SET lokadb.org = '5'").error is None
    for stmt, tag in (("LOCK TABLE documents IN ACCESS SHARE MODE", "LOCK TABLE"),
                      ("TRUNCATE versions", "TRUNCATE TABLE")):
        w.send(Wire.parse_msg("SELECT count(*) FROM documents WHERE organization_id = 1") + one
               + Wire.parse_msg(stmt) + one + setting + Wire.sync_msg())
        res = w.read_until_ready(timeout=5 * SLOW)
        assert res.error is None, (stmt, res.error)
        assert res.tags == ["SELECT 1", tag, "SELECT 1"], stmt
        assert res.rows[-1] == ["5"], stmt
    assert w.query("ROLLBACK").error is None
    assert w.query("SELECT count(*) > 0 FROM versions").rows == [["t"]]
    # outside a block a DECLARE fails as it does alone, and the next statement is unharmed
    w.send(Wire.parse_msg("SELECT count(*) FROM documents WHERE organization_id = 1") + one
           + Wire.parse_msg("DECLARE d CURSOR FOR SELECT id FROM documents WHERE organization_id = 3") + one
           + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    assert res.error is not None and res.error.sqlstate == "25P01", res.error
    assert w.query(f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3").rows == \
        [["3", str(counts[3])]]


def test_psycopg_pipelines_and_unnamed_statements_get_each_statements_organization(router):
    """What an ORM on psycopg sends: unnamed statements with the organization
    as a parameter, in pipelines, in transaction pooling with clients sharing
    the servers. Every statement runs with its own organization, whether the
    server had it (nothing sent), or got it in front of the statement."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": "2"})
    counts = {o: direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = %s", [o])[0][0]
              for o in (1, 3)}
    q = f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = %s"
    conns = [b.connect("app", USER, prepare_threshold=None) for _ in range(3)]
    try:
        for rnd in range(4):
            for i, c in enumerate(conns):
                orgs = [1, 3, 3, 1] if (rnd + i) % 2 else [3, 1, 1, 3]
                with c.pipeline():
                    curs = [c.execute(q, [o]) for o in orgs]
                assert [tuple(cur.fetchone()) for cur in curs] == [(str(o), counts[o]) for o in orgs]
                # and alone, outside a pipeline (a Bind of the unnamed statement)
                assert tuple(c.execute(q, [orgs[-1]]).fetchone()) == (str(orgs[-1]), counts[orgs[-1]])
    finally:
        for c in conns:
            c.close()
    st = stats(b)
    assert st["prefixes_skipped"] == 0
    assert st["prefixes"] > 0 and st["prefixes_known"] > 0


def test_a_parse_sent_alone_after_a_prefix_keeps_its_server(router):
    # the ReadyForQuery of the prefix must not make the core release the server mid-batch
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 2}, extra="force_custom_plan = off\n")
    w = b.login("app", USER)
    w.send(Wire.parse_msg("SELECT count(*) FROM documents WHERE organization_id = 1"))   # prefix + Parse
    time.sleep(0.3)                         # the prefix's ReadyForQuery comes back meanwhile
    other = b.login("app", USER)
    other.query("BEGIN")
    other.query("SELECT 1")                 # takes a server: it must not be w's
    w.send(Wire.bind_msg() + Wire.execute_msg() + Wire.sync_msg())
    res = w.read_until_ready(timeout=5 * SLOW)
    other.query("ROLLBACK")
    assert res.error is None, res.error



# ------------------------------------------ prefixes the core knows (ABI 1.4) --

def _org_query(org):
    return f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = {org}"


def test_no_prefix_when_the_server_already_has_the_organization(router):
    """The core tracks what the set_config prefixes gave each server
    connection: a server that has the organization already gets none, whoever
    the client is (transaction pooling, one server)."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w1 = b.login("app", USER)
    w2 = b.login("app", USER)
    st0 = stats(b)
    n0 = len(route_lines(b))
    assert org_of(w1, _org_query(3)) == "3"                  # sent
    assert org_of(w1, _org_query(3)) == "3"                  # known: same server, value stuck
    assert org_of(w2, _org_query(3)) == "3"                  # another client, same server: known
    assert org_of(w2, _org_query(1)) == "1"                  # another organization: sent
    assert org_of(w1, _org_query(1)) == "1"                  # known
    st = stats(b)
    assert st["prefixes"] - st0["prefixes"] == 2, st
    assert st["prefixes_known"] - st0["prefixes_known"] == 3, st
    lines = route_lines(b)[n0:]
    assert [l.rsplit("prefix=", 1)[1] for l in lines] == ["sent", "known", "known", "sent", "known"], lines


def test_server_org_session_gives_the_server_the_clients_own_organization(router):
    """server_org = session: before a statement on LokaDB tables the server's
    lokadb.org is what the client's session set (as on a connection of its
    own), not the statement's organization; routing, leaf addressing and
    affinity still follow the statement. With many organizations and no
    session organization, the servers get no prefix at each change."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, extra="server_org = session\n")
    w1 = b.login("app", USER)
    w2 = b.login("app", USER)
    st0 = stats(b)
    n0 = len(route_lines(b))
    assert org_of(w1, _org_query(3)) == ""                   # sent once: the session has none
    for org in (1, 3, ISOLATED, ISOLATED2, 1):               # known: no prefix for other organizations
        assert org_of(w1, _org_query(org)) == "", org
    leaf = f"SELECT {SETTING}, count(*), min(tableoid::regclass::text) FROM documents WHERE organization_id = 2"
    assert w1.query(leaf).rows == [["", str(DOCS_PER_ORG), "documents_o2_1"]]
    w2.query("SET lokadb.org = 3")
    assert org_of(w2, _org_query(1)) == "3"                  # the session's, though the rows are organization 1's
    assert w2.query(leaf).rows == [["3", str(DOCS_PER_ORG), "documents_o2_1"]]
    assert org_of(w1, _org_query(1)) == ""                   # same server, another client: its own again
    st = stats(b)
    # w1's first, w2's after its SET, w1's after w2 (with server_org = statement: all 10)
    assert (st["prefixes"] - st0["prefixes"], st["prefixes_known"] - st0["prefixes_known"]) == (3, 7), st
    lines = route_lines(b)[n0:]
    assert [l.rsplit("prefix=", 1)[1] for l in lines if " org=-" not in l].count("sent") == 3, lines
    assert any("rewrite=leaf" in l and "org=2" in l for l in lines), lines
    # the other value gives the statement's organization again, and nothing else is taken
    b.admin("SET plugin.org_routing.server_org = 'statement'")
    assert org_of(w1, _org_query(1)) == "1"
    res = b.admin_result("SET plugin.org_routing.server_org = 'client'")
    assert_error(res.error, "22023", "must be statement, session or auto")


def _readers(b):
    return b.admin_dicts("SHOW META_CACHE")[0]["setting_readers"]


def test_server_org_auto_sets_the_statements_organization_where_code_reads_settings(router, app):
    """server_org = auto (the default): the server's lokadb.org is the
    statement's organization where something may read it, the client's own
    session value elsewhere. Something: the statement's own text
    (current_setting, pg_settings, SHOW, lokadb.org), or code in the cloud
    database (a function, view, policy ... that reads settings), which the
    catalog's event trigger announces to live proxies."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    assert _readers(b) == "f"
    w = b.login("app", USER)
    plain = "SELECT count(*) FROM documents WHERE organization_id = {}"
    st0 = stats(b)
    for org in (1, 3, ISOLATED, 1, 3):                       # no reader: the session's "" once
        assert w.query(plain.format(org)).rows == [[str(DOCS_PER_ORG)]], org
    st = stats(b)
    assert (st["prefixes"] - st0["prefixes"], st["prefixes_known"] - st0["prefixes_known"]) == (1, 4), st
    assert org_of(w, _org_query(3)) == "3"                   # the statement reads it: its own
    st1 = stats(b)                                           # a comment naming it is enough
    assert w.query("/* lokadb.org */ " + plain.format(1)).rows == [[str(DOCS_PER_ORG)]]
    assert stats(b)["prefixes"] - st1["prefixes"] == 1
    v0 = int(b.admin_dicts("SHOW META_CACHE")[0]["version"])
    direct_admin(app, "CREATE FUNCTION public.org_now() RETURNS text LANGUAGE plpgsql STABLE "
                      "AS $$BEGIN RETURN current_setting('lokadb.org', true); END$$")
    try:
        wait_until(lambda: _readers(b) == "t", 10 * SLOW, what="the reader announced to the proxy")
        assert int(b.admin_dicts("SHOW META_CACHE")[0]["version"]) > v0
        for org in (1, 3, ISOLATED):                        # code reads it: every statement's own
            assert org_of(w, f"SELECT org_now(), count(*) FROM documents WHERE organization_id = {org}") \
                == str(org)
        st1 = stats(b)
        assert w.query(plain.format(1)).rows == [[str(DOCS_PER_ORG)]]
        assert stats(b)["prefixes"] - st1["prefixes"] == 1
        w.query("SET lokadb.org = 2")
        assert org_of(w, "SELECT org_now(), count(*) FROM documents WHERE organization_id = 3") == "3"
    finally:
        direct_admin(app, "DROP FUNCTION public.org_now()")
    wait_until(lambda: _readers(b) == "f", 10 * SLOW, what="the reader's drop announced to the proxy")
    st2 = stats(b)
    for org in (1, 3, 1):                                    # the session's "2", once
        assert w.query(plain.format(org)).rows == [[str(DOCS_PER_ORG)]], org
    st = stats(b)
    assert st["prefixes"] - st2["prefixes"] == 1, st
    assert org_of(w, "SHOW lokadb.org") == "2"
    assert org_of(w, "SELECT current_setting('lokadb.org'), 1 FROM documents WHERE organization_id = 3 "
                     "LIMIT 1") == "3"


@pytest.mark.parametrize("ddl, undo", [
    ("CREATE VIEW public.v_org AS SELECT current_setting('lokadb.org', true) AS org", "DROP VIEW public.v_org"),
    ("CREATE VIEW public.v_set AS SELECT setting FROM pg_settings WHERE name = 'lokadb.org'",
     "DROP VIEW public.v_set"),
    ("CREATE POLICY p_org ON documents USING (organization_id::text = current_setting('lokadb.org', true))",
     "DROP POLICY p_org ON documents"),
    ("ALTER TABLE documents ALTER COLUMN title SET DEFAULT current_setting('lokadb.org', true)",
     "ALTER TABLE documents ALTER COLUMN title DROP DEFAULT"),
    ("CREATE FUNCTION public.org_sql() RETURNS text LANGUAGE sql STABLE RETURN current_setting('lokadb.org')",
     "DROP FUNCTION public.org_sql()"),
    ("CREATE PROCEDURE public.org_show() LANGUAGE plpgsql AS $$BEGIN EXECUTE 'SHOW lokadb.org'; END$$",
     "DROP PROCEDURE public.org_show()"),
])
def test_setting_readers_of_every_kind_are_found(router, app, ddl, undo):
    """What meta_cache counts as code that may read lokadb.org, each kind
    announced at once by the catalog's event trigger and gone with its drop."""
    b = router()
    assert _readers(b) == "f"
    direct_admin(app, ddl)
    try:
        wait_until(lambda: _readers(b) == "t", 10 * SLOW, what="the reader announced to the proxy")
    finally:
        direct_admin(app, undo)
    wait_until(lambda: _readers(b) == "f", 10 * SLOW, what="the reader's drop announced to the proxy")


def test_a_rolled_back_set_config_is_not_taken_as_known(router):
    """A prefix that ran inside a transaction block may be rolled back: the
    core does not record it, and the next statement gets the prefix again."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    assert org_of(w, _org_query(1)) == "1"
    w.query("BEGIN")
    assert org_of(w, _org_query(3)) == "3"                  # the prefix runs inside the block
    w.query("ROLLBACK")                                      # ... and is rolled back: the server has 1
    st0 = stats(b)
    assert org_of(w, _org_query(3)) == "3"                  # so it is sent again
    assert stats(b)["prefixes"] - st0["prefixes"] == 1
    st0 = stats(b)
    assert org_of(w, _org_query(1)) == "1"
    assert org_of(w, _org_query(1)) == "1"
    st = stats(b)
    assert st["prefixes"] - st0["prefixes"] == 1 and st["prefixes_known"] - st0["prefixes_known"] == 1, st


def test_the_client_own_set_discard_and_reset_make_the_core_forget(router):
    """SET lokadb.org, DISCARD ALL and RESET ALL sent by a client change the
    server's value behind the core's back: it forgets what it knew, and the
    next statement gets its prefix (the statement sees the right value)."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w1 = b.login("app", USER)
    w2 = b.login("app", USER)
    for change in ["SET lokadb.org = '1'", "DISCARD ALL", "RESET ALL", "SELECT set_config('lokadb.org', '5', false)",
                   "RESET lokadb.org"]:
        assert org_of(w1, _org_query(3)) == "3"
        assert org_of(w1, _org_query(3)) == "3"              # known now
        w2.query(change)                                      # the same server, another client
        st0 = stats(b)
        assert org_of(w1, _org_query(3)) == "3", change      # the server's value was changed: sent again
        assert stats(b)["prefixes"] - st0["prefixes"] == 1, change
        if change.startswith("SET") or change.startswith("SELECT"):
            w2.query("RESET lokadb.org")


def test_server_reset_query_makes_the_core_forget(router):
    """Session pooling: the server's DISCARD ALL at a client's end clears what
    the core knew; the next client's statement gets its prefix."""
    b = router(settings={"pool_mode": "session", "default_pool_size": 1})
    w = b.login("app", USER)
    assert org_of(w, _org_query(3)) == "3"
    w.close()
    w = b.login("app", USER)
    st0 = stats(b)
    assert org_of(w, _org_query(3)) == "3"
    assert stats(b)["prefixes"] - st0["prefixes"] == 1


# ------------------------------------ analyses shared by normalized texts --

NORMALIZED_READS = [
    "SELECT id, title, project_id FROM documents WHERE organization_id = {o} AND id = {id}",
    # the organization as a string, other literals around it, LIMIT
    "SELECT id, title FROM documents WHERE organization_id = '{o}' AND title <> 'it''s {id}' "
    "AND id >= {id} ORDER BY id LIMIT 3",
    # a cast literal, an IN list, a join with a cloud table
    "SELECT d.id, p.name FROM documents d JOIN projects p ON p.id = d.project_id "
    "WHERE d.organization_id = '{o}'::bigint AND d.id IN ({id}, {id2}) ORDER BY d.id",
    # a typmod (no placeholder may stand there: the text is analyzed as written)
    "SELECT id, title::varchar(4) FROM documents WHERE organization_id = {o} AND id = {id}",
    # a negative literal (PostgreSQL folds the sign into the constant: left as written)
    "SELECT count(*) FROM documents WHERE organization_id = {o} AND id > -{id}",
]


def test_normalized_statements_give_the_results_of_the_statements_as_written(router, app):
    """Simple Queries that differ only by literals share one analysis and one
    leaf-rewrite template per organization; every literal value gets its own
    rows: each statement is compared with PostgreSQL's answer to the text as
    written, for every organization and several ids."""
    b = router()
    w = b.login("app", USER)
    ids = {o: [r[0] for r in direct(app, f"SELECT id FROM documents WHERE organization_id = {o} ORDER BY id")]
           for o in ORGS}
    st0 = stats(b)
    n = 0
    with Wire(port=app.port, timeout=10 * SLOW) as d:
        d.login(USER, APP_DB)
        for tmpl in NORMALIZED_READS:
            for o in ORGS:
                for k in (0, 7, len(ids[o]) - 1):
                    stmt = tmpl.format(o=o, id=ids[o][k], id2=ids[o][(k + 3) % len(ids[o])])
                    expected = d.query(stmt).rows
                    assert expected, stmt
                    assert w.query(stmt).rows == expected, stmt
                    n += 1
    st = stats(b)
    # one analysis for each of the first three; the typmod's text is analyzed
    # as written; the last is normalized but its negative literal stays in the
    # text (one analysis per id)
    per = len(ORGS) * 3
    assert st["statements_normalized"] - st0["statements_normalized"] == 4 * per, (st, st0)
    assert st["normalized_cache_hits"] - st0["normalized_cache_hits"] == 3 * (per - 1), (st, st0)
    lines = route_lines(b)
    leaf = [l for l in lines if "rewrite=leaf" in l]
    assert any("documents_o2_1" in l for l in leaf) and any("documents_o5_1" in l for l in leaf), lines
    # the literal of each message is in its own rewritten text
    for k in (0, 7):
        assert any(f"id = {ids[5][k]}" in l and "documents_o5_1" in l for l in leaf), leaf
    # writes: an UPDATE and an INSERT with fresh literals land in the organization's leaf
    for o in (ISOLATED, ISOLATED2):
        for i in range(3):
            w.query(f"INSERT INTO versions (organization_id, document_id, body) VALUES ({o}, {ids[o][i]}, 'norm {o} {i}')")
            res = w.query(f"UPDATE versions SET body = body || ' upd' WHERE organization_id = {o} AND "
                          f"body = 'norm {o} {i}' RETURNING body")
            assert res.rows == [[f"norm {o} {i} upd"]]
        assert direct(app, f"SELECT DISTINCT tableoid::regclass::text FROM versions WHERE body LIKE 'norm {o} %'") == \
            [(f"versions_o{o}_1",)]
        w.query(f"DELETE FROM versions WHERE organization_id = {o} AND body LIKE 'norm {o} %'")
    assert direct(app, "SELECT count(*) FROM versions WHERE body LIKE 'norm %'") == [(0,)]


def test_repeated_inserts_follow_catalog_search_path_and_cache_changes(router, app):
    """The same INSERT sent again and again (literals aside) is normalized
    from its shape (tried first), finds its analysis through the shape's
    memo of the parse-cache entry and fills a compiled leaf template: each
    of them must give way when what it stands for changes. Between two
    identical inserts: the organization stops being isolated (to the
    parent) and is isolated again (to the leaf); the search path makes
    `versions` another schema's plain table (not routed); the parse cache is
    rebuilt (parse_cache_size) and its entries evicted. Each row lands where
    PostgreSQL puts the text as the route decided, and the client's rows
    are all there."""
    b = router(extra="parse_cache_size = 16\n")
    w = b.login("app", USER)
    # (the words of the body name a LokaDB table on any search path: the
    # prefilter lets every one of them through to the parse cache)
    # (it reads its organization's rows too, so it is addressed to the leaves: an INSERT whose one
    # LokaDB table is its target stays on the parent)
    ins = ("INSERT INTO versions (organization_id, document_id, body) VALUES ({o}, {d}, 'memo {n} public.documents' "
           "|| coalesce((SELECT '' FROM versions WHERE organization_id = {o} LIMIT 0), ''))")
    doc = direct(app, f"SELECT id FROM documents WHERE organization_id = {ISOLATED2} ORDER BY id LIMIT 1")[0][0]
    n = [0]

    def insert(o=ISOLATED2):
        n[0] += 1
        log0 = app.log_size()
        w.query(ins.format(o=o, d=doc, n=n[0]))
        ran = executed(app, log0, needle=f"'memo {n[0]} ")
        assert len(ran) == 1, ran
        return ran[0], route_lines(b)[-1]

    def where(k):
        """Where PostgreSQL put the row of insert k."""
        body = f"memo {k} public.documents"
        rows = direct(app, "SELECT tableoid::regclass::text FROM public.versions WHERE body = %s", [body])
        if direct(app, "SELECT to_regclass('other.versions') IS NOT NULL")[0][0]:
            rows += direct(app, "SELECT 'other.versions' FROM other.versions WHERE body = %s", [body])
        return rows

    def catalog_change(sql):
        v0 = int(b.admin_dicts("SHOW META_CACHE")[0]["version"])
        direct_admin(app, sql)
        wait_until(lambda: int(b.admin_dicts("SHOW META_CACHE")[0]["version"]) > v0, 5 * SLOW,
                   what="meta_cache to load the change")

    try:
        for _ in range(3):
            ran, line = insert()
            assert "versions_o5_1 AS versions" in ran and "rewrite=leaf" in line, (ran, line)
            assert where(n[0]) == [("versions_o5_1",)]
        st0 = stats(b)
        insert()
        st1 = stats(b)
        assert st1["normalized_cache_hits"] - st0["normalized_cache_hits"] == 1, (st0, st1)
        assert st1["rewrites_made"] == st0["rewrites_made"], (st0, st1)
        # the organization leaves its partition: the same insert goes to the parent
        catalog_change(f"UPDATE lokadb.orgs SET isolated = false WHERE id = '{ISOLATED2}'")
        ran, line = insert()
        assert "versions_o5" not in ran and "rewrite=no" in line, (ran, line)
        assert where(n[0]) == [("versions_o5_1",)]        # PostgreSQL's own routing of the parent
        catalog_change(f"UPDATE lokadb.orgs SET isolated = true WHERE id = '{ISOLATED2}'")
        ran, line = insert()
        assert "versions_o5_1 AS versions" in ran and "rewrite=leaf" in line, (ran, line)
        # another organization of the same shape: its own leaf, or the parent
        ran, line = insert(ISOLATED)
        assert "versions_o2_1 AS versions" in ran and "org=2 " in line, (ran, line)
        ran, line = insert(3)
        assert "versions_o" not in ran and "org=3 " in line and "rewrite=no" in line, (ran, line)
        # a plain table named versions comes first on the search path (the
        # catalog reloads to know of it): not routed, it lands there
        direct_admin(app, "CREATE TABLE other.versions (organization_id bigint, document_id bigint, body text); "
                          "GRANT ALL ON other.versions TO PUBLIC")
        catalog_change("UPDATE lokadb.orgs SET name = name WHERE id = '1'")
        w.query("SET search_path = other, public")
        st_pre = stats(b)["statements_prefiltered"]
        ran, line = insert()
        assert "versions_o5" not in ran and "decision=pass" in line, (ran, line)
        assert where(n[0]) == [("other.versions",)]
        assert stats(b)["statements_prefiltered"] == st_pre, "the prefilter let it through"
        w.query("RESET search_path")
        ran, line = insert()
        assert "versions_o5_1 AS versions" in ran and "rewrite=leaf" in line, (ran, line)
        # the parse cache rebuilt, then its entries evicted by other texts
        b.admin("SET plugin.org_routing.parse_cache_size = '32'")
        ran, line = insert()
        assert "versions_o5_1 AS versions" in ran and "rewrite=leaf" in line, (ran, line)
        for i in range(40):
            w.query(f"SELECT {i} AS c{i}, count(*) FROM documents WHERE organization_id = 3")
        assert stats(b)["parse_cache_evictions"] > 0
        ran, line = insert()
        assert "versions_o5_1 AS versions" in ran and "rewrite=leaf" in line, (ran, line)
        assert direct(app, "SELECT count(*) FROM versions WHERE body LIKE 'memo %'")[0][0] + \
            direct(app, "SELECT count(*) FROM other.versions")[0][0] == n[0]
    finally:
        direct_admin(app, f"UPDATE lokadb.orgs SET isolated = true WHERE id = '{ISOLATED2}'")
        direct_admin(app, "DELETE FROM versions WHERE body LIKE 'memo %'")
        direct_admin(app, "DROP TABLE IF EXISTS other.versions")
        direct_admin(app, "UPDATE lokadb.orgs SET name = name WHERE id = '1'")


def test_statements_with_session_effects_are_not_normalized(router):
    """set_config('lokadb.org', '5', false) and SET must be analyzed as written
    (their literals are what they do)."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    st0 = stats(b)
    for o in ("1", "5", "3"):
        w.query(f"SELECT set_config('lokadb.org', '{o}', false)")
        assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents") == o
        w.query(f"SET lokadb.org = '{o}'")
        assert org_of(w, f"SELECT {SETTING}, count(*) FROM documents WHERE id > 0") == o
    # (the word lokadb keeps every one of them from being normalized)
    assert stats(b)["statements_normalized"] == st0["statements_normalized"]
    w.query("SELECT count(*) FROM documents WHERE id > 0")
    assert stats(b)["statements_normalized"] == st0["statements_normalized"] + 1


def test_a_known_shape_with_session_words_in_its_literals_is_analyzed_as_written(router):
    """A simple Query of a known shape is normalized before the prefilter,
    whose answer is memoized with the shape: the words of the message's own
    string literals still count, as when the whole text is read (a session
    word in a literal: analyzed as written, not normalized)."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    shape = "SELECT count(*) FROM documents WHERE organization_id = {o} AND title <> '{t}'"
    (cnt,) = w.query("SELECT count(*) FROM documents WHERE organization_id = 1").rows[0]
    st0 = stats(b)
    assert w.query(shape.format(o=1, t="x")).rows[0][0] == cnt
    w.query(shape.format(o=2, t="y"))
    st1 = stats(b)
    assert st1["statements_normalized"] == st0["statements_normalized"] + 2, (st0, st1)
    assert st1["normalized_cache_hits"] == st0["normalized_cache_hits"] + 1, (st0, st1)
    for o, t in ((3, "lokadb"), (4, "a RESET b"), (5, "it''s commit"), (1, "x.Set_Config(y)"),
                 (2, "PLAN_CACHE_MODE"), (3, "_x begin")):
        w.query(shape.format(o=o, t=t))
    st2 = stats(b)
    assert st2["statements_normalized"] == st1["statements_normalized"], (st1, st2)
    # and the shape still serves the texts without session words (longer or
    # shorter words, a word that starts like one, digits and $ inside words)
    for t in ("it''s", "commits rollbacks", "en", "lokadbx", "x1begin", "begin$1", "set_configs"):
        assert w.query(shape.format(o=1, t=t)).rows[0][0] == cnt
    st3 = stats(b)
    assert st3["statements_normalized"] == st2["statements_normalized"] + 7, (st2, st3)
    assert st3["normalized_cache_hits"] == st2["normalized_cache_hits"] + 7, (st2, st3)


def test_odd_literal_texts_get_postgresql_answer_and_the_session_goes_on(router, app):
    """Texts the normalizer leaves as written, or that PostgreSQL refuses,
    through the same path: each gets PostgreSQL's own answer (rows or its
    error), compared with PostgreSQL directly, and the session goes on."""
    b = router()
    many = " OR ".join(f"id = {i}" for i in range(1, 400))
    stmts = [
        "SELECT count(*) FROM documents WHERE organization_id = 'unterminated",
        "SELECT count(*) FROM documents WHERE organization_id = 99999999999999999999",
        "SELECT count(*) FROM documents WHERE organization_id = 3000000000",
        "SELECT count(*) FROM documents WHERE organization_id = E'2' AND title <> E'a\\\\b'",
        "SELECT count(*) FROM documents WHERE organization_id = $$2$$",
        "SELECT count(*) FROM documents WHERE organization_id = 2 AND created_at > DATE '2020-01-01'",
        "SELECT count(*) FROM documents WHERE organization_id = 2 AND created_at > now() - INTERVAL '1 day'",
        "SELECT count(*) FROM documents WHERE organization_id = 2 AND title = 'a'\n'b'",
        "SELECT count(*) FROM documents WHERE organization_id = 0x2",
        "SELECT count(*) FROM documents WHERE organization_id = $1",
        "SELECT count(*) FROM documents WHERE organization_id = 2; SELECT count(*) FROM versions WHERE organization_id = 5",
        f"SELECT count(*) FROM documents WHERE organization_id = 5 AND ({many})",
        "SELECT count(*) FROM documents WHERE organization_id = 5 AND title = '\x01\x02'",
    ]
    w = b.login("app", USER)
    with Wire(port=app.port, timeout=10 * SLOW) as d:
        d.login(USER, APP_DB)
        for stmt in stmts:
            want = d.query(stmt, raise_error=False)
            got = w.query(stmt, raise_error=False)
            if want.error is not None:
                assert got.error is not None and got.error.fields.get("C") == want.error.fields.get("C"), stmt
            else:
                assert got.error is None and got.rows == want.rows, stmt
            assert w.query("SELECT 1").rows == [["1"]]


# ------------------------- the values in front of the statement (ABI 1.7) --

def _wire_reply(w, stmt):
    """The messages of one simple Query, as (type, fields or payload) pairs."""
    w.send_msg(b"Q", stmt.encode() + b"\0")
    out = []
    while True:
        typ, payload = w.read_msg()
        out.append((typ.decode(), parse_error_fields(payload) if typ in (b"E", b"N") else payload))
        if typ == b"Z":
            return out


def test_the_organization_goes_in_front_of_the_statement_in_one_query(router, app):
    """A simple-Query SELECT/INSERT/UPDATE/DELETE gets its values as SET
    statements in front of it, in the same Query (one statement less for
    PostgreSQL); the client gets exactly PostgreSQL's reply to its own text,
    without the SETs' CommandCompletes."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    for i, o in enumerate((3, 1, 3)):
        stmt = f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = {o}"
        log0 = app.log_size()
        got = _wire_reply(w, stmt)
        ran = executed(app, log0)
        assert ran == [f"SET lokadb.org = '{o}'; {stmt}"], ran     # no plan_cache_mode: no plan cache
        assert [t for t, _ in got] == ["T", "D", "C", "Z"], got
        assert got[2][1] == b"SELECT 1\0" and got[3][1] == b"I"
        assert _parse_data_row(got[1][1])[0] == str(o)
    # an UPDATE, a DELETE and an INSERT get their tags (not SET's)
    for stmt, tag in [("UPDATE documents SET title = title WHERE organization_id = 1 AND id < 0", b"UPDATE 0\0"),
                      ("DELETE FROM versions WHERE organization_id = 3 AND id < 0", b"DELETE 0\0"),
                      ("INSERT INTO versions (organization_id, document_id, body) "
                       "SELECT organization_id, id, 'x' FROM documents WHERE organization_id = 1 AND id < 0",
                       b"INSERT 0 0\0")]:
        got = _wire_reply(w, stmt)
        assert [t for t, _ in got] == ["C", "Z"] and got[0][1] == tag, (stmt, got)


def test_an_error_of_a_statement_with_values_in_front_is_reported_as_without(router, app):
    """An error in the statement is the one PostgreSQL gives for the client's
    text alone (same fields, the position in the client's own text); the SETs
    were rolled back with it, and the core sends them again."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, extra=STATEMENT_ORG)
    w = b.login("app", USER)
    bad = [
        # a position (the cast's literal): must point into the client's text
        f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = 3 AND title = 'a' AND id = 'x'::int",
        "SELECT count(*) / 0 FROM documents WHERE organization_id = 3",
        "SELECT no_such_column FROM documents WHERE organization_id = 3",
        "INSERT INTO versions (organization_id, document_id, body) VALUES (3, 1, NULL)",
    ]
    with Wire(port=app.port, timeout=10 * SLOW) as d:
        d.login(USER, APP_DB)
        for stmt in bad:
            want = _wire_reply(d, stmt)
            st0 = stats(b)
            got = _wire_reply(w, stmt)
            assert [t for t, _ in got] == [t for t, _ in want] and got[-2][0] == "E", (stmt, got, want)
            assert got[:-2] == want[:-2], stmt                              # (a RowDescription)
            assert stmt != bad[0] or int(got[-2][1]["P"]) > 0                # (a position is tested)
            for k in "SCMP":
                assert got[-2][1].get(k) == want[-2][1].get(k), (stmt, k, got, want)
            assert stats(b)["prefixes"] - st0["prefixes"] == 1, stmt       # it had the SETs in front
            st0 = stats(b)
            assert org_of(w, _org_query(3)) == "3"                          # rolled back: sent again
            assert stats(b)["prefixes"] - st0["prefixes"] == 1, stmt
            w.query("SELECT 1 FROM documents WHERE organization_id = 1")    # the next one needs them again


def test_a_warning_of_a_statement_with_values_in_front_points_into_the_client_text(router, app):
    """A warning with a position (PostgreSQL's nonstandard-escape warning) is
    given like an error: with the position in the client's own text, not in
    the text with the SETs in front."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    stmt = "SELECT count(*), 'a\\b' FROM documents WHERE organization_id = 3"
    with Wire(port=app.port, timeout=10 * SLOW) as d:
        d.login(USER, APP_DB)
        d.query("SET standard_conforming_strings = off")
        want = _wire_reply(d, stmt)
    w.query("SET standard_conforming_strings = off")
    st0 = stats(b)
    got = _wire_reply(w, stmt)
    assert stats(b)["prefixes"] - st0["prefixes"] == 1, got          # it had the SETs in front
    assert [t for t, _ in got] == [t for t, _ in want], (got, want)
    notes = [(g, x) for (t, g), (_, x) in zip(got, want) if t == "N"]
    assert len(notes) == 1 and int(notes[0][1]["P"]) > 0, want
    for k in "SCMP":
        assert notes[0][0].get(k) == notes[0][1].get(k), (k, got, want)


def test_values_in_front_inside_a_block_follow_the_block(router, app):
    """Inside a transaction block the SETs run in the block: a ROLLBACK
    reverts them (the core does not take them as known), an aborted block
    answers its statements with PostgreSQL's own error, and COMMIT keeps the
    organization the statements ran with."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    assert org_of(w, _org_query(1)) == "1"
    w.query("BEGIN")
    assert org_of(w, _org_query(3)) == "3"
    w.query("ROLLBACK")
    assert w.query(f"SELECT {SETTING}").rows == [["1"]]         # the block's SET was rolled back
    assert org_of(w, _org_query(3)) == "3"
    w.query("BEGIN")
    assert w.query("SELECT 1/0", raise_error=False).error is not None
    got = _wire_reply(w, _org_query(1))
    assert [t for t, _ in got] == ["E", "Z"] and got[0][1]["C"] == "25P02" and got[1][1] == b"E", got
    w.query("ROLLBACK")
    assert org_of(w, _org_query(1)) == "1"                      # sent again, and seen
    w.query("BEGIN")
    assert org_of(w, _org_query(5)) == "5"
    w.query("COMMIT")
    st0 = stats(b)
    assert w.query(f"SELECT {SETTING}").rows == [["5"]]
    assert org_of(w, _org_query(1)) == "1"
    assert stats(b)["prefixes"] - st0["prefixes"] == 1


def test_pipelined_queries_with_values_in_front_each_get_their_reply(router, app):
    """Several Queries in one write, each with its own organization in front:
    each reply is its own (no SET reply in between), and the core knows the
    value the last one left on the server."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    w = b.login("app", USER)
    orgs = [3, 1, 5, 5, 2, 1]
    w.send(b"".join(message(b"Q", (_org_query(o) + "\0").encode()) for o in orgs))
    for o in orgs:
        res = w.read_until_ready()
        assert res.error is None and res.rows[0][0] == str(o) and res.tags == ["SELECT 1"], (o, res.messages)
    st0 = stats(b)
    assert org_of(w, _org_query(1)) == "1"
    assert org_of(w, _org_query(3)) == "3"
    st = stats(b)
    assert st["prefixes_known"] - st0["prefixes_known"] == 1 and st["prefixes"] - st0["prefixes"] == 1, st


def test_statements_that_refuse_a_block_get_the_values_in_a_query_of_their_own(router, app):
    """Statements other than one SELECT/INSERT/UPDATE/DELETE (several
    statements, VACUUM, which refuses transaction blocks) keep the values in a
    hidden Query of their own before them."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1}, extra=STATEMENT_ORG)
    w = b.login("app", USER)
    w.query("SET lokadb.org = '3'")
    w.query("VACUUM documents")                 # with the session's organization, which it gets before it
    assert w.query(f"SELECT {SETTING}").rows == [["3"]]
    log0 = app.log_size()
    two = ("SELECT count(*) FROM documents WHERE organization_id = 1; "
           "SELECT count(*) FROM versions WHERE organization_id = 1")
    res = w.query(two)
    assert res.tags == ["SELECT 1", "SELECT 1"] and res.error is None
    ran = [t for t in executed(app, log0, needle="") if "organization_id = 1" in t or "lokadb.org" in t]
    assert ran == ["SET lokadb.org = '1'", two], ran


def test_a_failed_statement_with_values_in_front_leaves_no_belief_in_session_pooling(router, app):
    """Session pooling (the plugin trusts what it last set on the client's
    own server): a statement that fails takes its SETs with it, so the next
    statement of that organization still gets them."""
    b = router(settings={"pool_mode": "session", "default_pool_size": 1})
    w = b.login("app", USER)
    for _ in range(2):
        assert org_of(w, _org_query(3)) == "3"
    bad = "SELECT count(*) FROM documents WHERE organization_id = 1 AND id = 'x'::int"
    assert w.query(bad, raise_error=False).error.fields["C"] == "22P02"
    assert org_of(w, _org_query(1)) == "1"
    assert org_of(w, _org_query(1)) == "1"
    assert w.query(f"SELECT {SETTING}").rows == [["1"]]


def test_named_prepared_statements_get_each_statements_organization(router, app):
    """psycopg's prepared statements (a Bind of a named statement that starts
    its batch, as after prepare_threshold): the organization goes as the
    core's extended messages in front of the Bind, in its transaction, so a
    failing statement leaves no organization behind that the pooler would
    take as set."""
    b = router(settings={"pool_mode": "transaction", "default_pool_size": "2"})
    counts = {o: direct(b.pg, "SELECT count(*) FROM documents WHERE organization_id = %s", [o])[0][0]
              for o in (1, 3)}
    q = f"SELECT {SETTING}, count(*) FROM documents WHERE organization_id = %s"
    bad = "SELECT 1 / (count(*) - count(*)) FROM documents WHERE organization_id = %s"
    conns = [b.connect("app", USER, prepare_threshold=0) for _ in range(3)]
    log0 = app.log_size()
    try:
        for rnd in range(3):
            for i, c in enumerate(conns):
                for o in ([1, 3, 3, 1] if (rnd + i) % 2 else [3, 1, 1, 3]):
                    assert tuple(c.execute(q, [o], prepare=True).fetchone()) == (str(o), counts[o])
                with pytest.raises(errors.DivisionByZero):
                    c.execute(bad, [1 if i % 2 else 3], prepare=True)
    finally:
        for c in conns:
            c.close()
    st = stats(b)
    assert st["prefixes_skipped"] == 0 and st["prefixes"] > 0
    sets = re.findall(r"(statement|execute [^:]*): SET lokadb\.org", app.log_since(log0))
    assert sets and set(sets) == {"execute lokadb_hidden_ext/lokadb_hidden_ext"}, sets



def test_statements_on_a_leaf_keep_postgresqls_plan_choice(router, app):
    """force_custom_plan = auto with isolated organizations: a prepared
    statement addressed to an organization's leaf runs with plan_cache_mode =
    auto, so PostgreSQL may keep its generic plan (flat on a leaf: no
    planning per execution); one left on a parent keeps force_custom_plan,
    also when both alternate on one server connection; an EXECUTE of a
    statement prepared with PREPARE, after leaf statements, gets
    force_custom_plan back (extended protocol and simple Query)."""
    leaf_q = "SELECT count(*) FROM documents WHERE organization_id = %s AND id > %s"
    parent_q = "SELECT count(*) FROM documents WHERE organization_id = %s AND id >= %s"
    n1 = direct(app, "SELECT count(*) FROM documents WHERE organization_id = 1")[0][0]
    n2 = direct(app, f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}")[0][0]
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})

    def plans(c, like):
        return c.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                         "WHERE statement LIKE %s", [like]).fetchall()

    with b.connect("app", USER, prepare_threshold=0) as c:
        for _ in range(8):
            assert c.execute(leaf_q, [ISOLATED, 0], prepare=True).fetchone()[0] == n2
            assert c.execute(parent_q, [1, 0], prepare=True).fetchone()[0] == n1
        (leaf,) = plans(c, "%documents_o2_1 documents WHERE organization_id = $1 AND id > $2")
        (parent,) = plans(c, "%documents WHERE organization_id = $1 AND id >= $2")
        assert leaf[1] >= 1, leaf                                 # PostgreSQL's generic plan
        assert parent[1] == 0 and parent[2] >= 8, parent          # never the generic one
        sets = stats(b)["plan_mode_sets"]
        assert sets >= 15, sets                                   # switched at every alternation
        c.execute("PREPARE p (bigint) AS SELECT count(*) FROM documents WHERE organization_id = $1")
        for _ in range(7):
            assert c.execute(leaf_q, [ISOLATED, 0], prepare=True).fetchone()[0] == n2
            assert c.execute("EXECUTE p (1)").fetchone()[0] == n1
        assert c.execute("SHOW plan_cache_mode").fetchone()[0] == "force_custom_plan"
        p = c.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'p'").fetchall()
        assert p == [(0, 7)], p
        c.execute("DEALLOCATE p")
    w = b.login("app", USER)
    try:
        assert [t for t, _ in _wire_reply(w, "PREPARE q (bigint) AS SELECT count(*) FROM documents "
                                             "WHERE organization_id = $1")] == ["C", "Z"]
        for _ in range(7):
            got = _wire_reply(w, f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}")
            assert [t for t, _ in got] == ["T", "D", "C", "Z"], got
            got = _wire_reply(w, "EXECUTE q (1)")
            assert [t for t, _ in got] == ["T", "D", "C", "Z"], got
            assert _parse_data_row(got[1][1])[0] == str(n1)
        got = _wire_reply(w, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'q'")
        assert _parse_data_row(got[1][1]) == ["0", "7"], got
    finally:
        w.close()


def test_an_insert_of_an_isolated_organization_stays_on_the_parent_without_a_plan_mode(router, app):
    """An INSERT whose one LokaDB table is its target is left on the parent,
    where PostgreSQL routes its rows to the organization's leaf at run time:
    its rows land in the leaf, route_log says rewrite=no, inserts_on_parent
    counts it, and with force_custom_plan = auto it asks for no plan mode (its
    plan has no partition), so a server alternating it with leaf reads gets
    no plan_cache_mode switch at each turn."""
    read = "SELECT count(*) FROM documents WHERE organization_id = %s AND id > %s"
    ins = "INSERT INTO versions (organization_id, document_id, body) VALUES (%s, %s, 'parent insert') RETURNING id"
    n2 = direct(app, f"SELECT count(*) FROM documents WHERE organization_id = {ISOLATED}")[0][0]
    doc = direct(app, f"SELECT min(id) FROM documents WHERE organization_id = {ISOLATED}")[0][0]
    b = router(settings={"pool_mode": "transaction", "default_pool_size": 1})
    st0 = stats(b)
    try:
        with b.connect("app", USER, prepare_threshold=0) as c:
            mark = len(b.log())
            for _ in range(6):
                assert c.execute(read, [ISOLATED, 0], prepare=True).fetchone()[0] == n2
                assert c.execute(ins, [ISOLATED, doc], prepare=True).fetchone()[0] > 0
            assert c.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"
            lines = route_lines(b, mark)
        st1 = stats(b)
        binds = [l for l in lines if " B org=2 " in l and "target=public.versions" in l]
        assert len(binds) >= 1 and all("rewrite=no" in l for l in binds), lines
        assert any(" B org=2 " in l and "rewrite=leaf" in l for l in lines), lines
        assert st1["inserts_on_parent"] - st0["inserts_on_parent"] == 6, (st0, st1)
        assert st1["plan_mode_sets"] - st0["plan_mode_sets"] <= 1, (st0, st1)     # auto once, then kept
        assert direct(app, "SELECT tableoid::regclass::text, count(*) FROM versions "
                           "WHERE body = 'parent insert' GROUP BY 1") == [("versions_o2_1", 6)]
        # an organization in DEFAULT: on the parent as before, not counted
        with b.connect("app", USER) as c:
            c.execute(ins, [1, direct(app, "SELECT min(id) FROM documents WHERE organization_id = 1")[0][0]])
        assert stats(b)["inserts_on_parent"] == st1["inserts_on_parent"]
    finally:
        direct_admin(app, "DELETE FROM versions WHERE body = 'parent insert'")


def test_force_custom_plan_auto_follows_whether_an_organization_has_partitions(router, app):
    """force_custom_plan = auto (the default): while every organization is in
    DEFAULT (each parent has one partition) prepared statements keep
    PostgreSQL's plan choice, which saves planning at every execution; once
    the catalog gives an organization partitions of its own, the servers get
    plan_cache_mode = force_custom_plan with the next statement. The role's
    default is force_generic_plan here, so that only the plugin's setting
    can explain custom plans."""
    db = f"or_auto_{os.getpid()}"
    app.sql(f"CREATE DATABASE {db}")
    try:
        with app.connect(dbname=db) as c:
            c.execute(CATALOG_SQL)
            c.execute(SCHEMA_SQL)
            c.execute(DATA_SQL.format(orgs="{1,3}", per_project=4))
            c.execute("INSERT INTO lokadb.orgs (id, name) VALUES ('1', 'org 1'), ('3', 'org 3');"
                      "INSERT INTO lokadb.tables (schema_name, table_name, org_column, org_type, default_part) "
                      "VALUES ('public', 'documents', 'organization_id', 'bigint', 'documents_default'), "
                      "('public', 'versions', 'organization_id', 'bigint', 'versions_default')")
            c.execute(f"ALTER ROLE {USER} IN DATABASE {db} SET plan_cache_mode = force_generic_plan")
        b = router(route_log="off", settings={"pool_mode": "transaction", "default_pool_size": 1}, db=db)
        assert [r for r in b.admin_dicts("SHOW CONFIG") if r["key"] == "plugin.org_routing.force_custom_plan"][0][
            "value"] == "auto"
        q = "SELECT count(*) FROM documents WHERE organization_id = %s"

        def plans(c):
            return c.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                             "WHERE statement LIKE 'SELECT count(*)%'").fetchall()

        with b.connect("app", USER, prepare_threshold=0) as c:
            n1 = c.execute(q, [1], prepare=True).fetchone()[0]
            assert n1 == 12
            for _ in range(7):
                assert c.execute(q, [1], prepare=True).fetchone()[0] == n1
            assert c.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"
            (before,) = plans(c)
            assert before[0] >= 8 and before[1] == 0, before
            assert stats(b)["plan_mode_sets"] == 0
            # organization 3 gets partitions of its own (as ISOLATE ORG records them)
            with app.connect(dbname=db) as a:
                a.execute("UPDATE lokadb.orgs SET isolated = true WHERE id = '3'")
                a.execute("INSERT INTO lokadb.partitions (schema_name, table_name, org_id, container, leaf) "
                          "VALUES ('public', 'documents', '3', 'documents_o3', 'documents_o3_1'), "
                          "('public', 'versions', '3', 'versions_o3', 'versions_o3_1')")
            wait_until(lambda: int(b.admin_dicts("SHOW META_CACHE")[0]["partitions"]) == 2, 10 * SLOW,
                       what="meta_cache to load the partitions")
            for _ in range(8):
                assert c.execute(q, [1], prepare=True).fetchone()[0] == n1
            (after,) = plans(c)
            assert after[0] == before[0] and after[1] >= 8, (before, after)
            assert c.execute("SHOW plan_cache_mode").fetchone()[0] == "force_custom_plan"
            assert stats(b)["plan_mode_sets"] >= 1
    finally:
        app.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_statements_that_refuse_a_pipeline_run_with_the_extended_protocol(router):
    """VACUUM, ANALYZE and the like sent with the extended protocol (psycopg in
    autocommit) with a session organization: PostgreSQL refuses VACUUM behind
    another Execute of the same batch, so the organization must not go
    inside the batch in front of it."""
    b = router(settings={"pool_mode": "transaction"})
    c = b.connect("app", USER, autocommit=True, options="-c lokadb.org=1")
    try:
        for sql in ("VACUUM documents", "ANALYZE documents", "VACUUM (ANALYZE) documents, versions"):
            c.execute(sql)
        w = b.login("app", USER, params={"options": "-c lokadb.org=3"})
        one = Wire.bind_msg() + Wire.execute_msg()
        w.send(Wire.parse_msg("VACUUM documents") + one + Wire.sync_msg())
        res = w.read_until_ready()
        assert res.error is None and res.tags == ["VACUUM"]
        w.send(Wire.parse_msg("VACUUM documents", name="v") + Wire.sync_msg())
        assert w.read_until_ready().error is None
        w.send(Wire.bind_msg(stmt="v") + Wire.execute_msg() + Wire.sync_msg())
        res = w.read_until_ready()
        assert res.error is None and res.tags == ["VACUUM"]
    finally:
        c.close()
