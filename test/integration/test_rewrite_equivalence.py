# SPDX-License-Identifier: ISC
"""org_routing's leaf addressing, differentially: a corpus of statements of
the shapes ORMs (Django, SQLAlchemy, Rails, Hibernate) and people send to a
multi-tenant schema, each run on PostgreSQL directly and through lokadb
(`plugins = meta_cache org_routing`, route_log on), with the results
compared exactly (columns, rows, command tags, errors; rows in order only
where the statement orders them deterministically).

Each statement runs with the simple protocol (raw Wire, the organization a
literal), with the extended protocol (psycopg, the organization a Bind
parameter of the unnamed statement) and as a named prepared statement
(psycopg prepare=True, bound for organizations 2, 1, 5, 2 in turn; the
simple protocol also sends them in turn, so a shape's leaf template serves
each). Writes run in a transaction that is rolled back, with a check query
before the ROLLBACK (psycopg prepares them again after each ROLLBACK).
route_log says whether lokadb addressed the statement to a leaf
(`rewrite=leaf`); the test asserts it where the rules of
plugins/org_routing/README.md say it must (every LokaDB table constrained to
one isolated organization) or must not (several organizations, rows that
may move, ONLY, an organization the statement does not constrain).

Also: named statements on leaves bound again for another organization
inside a psycopg pipeline, and the prepared corpus through transaction
pooling (two clients, two server connections).

Cases marked xfail(strict) are findings (FINDING n in the reason): lokadb's
result differs from PostgreSQL's, or lokadb fails a statement PostgreSQL
runs. The schema is test_org_routing's (organizations 2 and 5
isolated, 1 and 3 in DEFAULT) in a database of this module's own, plus a
view, a statement-level trigger and a schema `tenant_copy` whose `documents`
is a plain table."""

import os
import re

import psycopg
import pytest

from lokadb_harness import SLOW, Bouncer, Wire, wait_until
from test_org_routing import USER, create_app_db

EQ_DB = f"or_eq_{os.getpid()}"
ISOLATED = (2, 5)

EXTRA_SQL = """
CREATE VIEW doc_titles AS SELECT organization_id, id, title FROM documents;
CREATE SCHEMA tenant_copy;
CREATE TABLE tenant_copy.documents (organization_id bigint, id bigint, title text);
INSERT INTO tenant_copy.documents VALUES (2, 1, 'archived copy of org 2'), (5, 1, 'archived copy of org 5');
CREATE TABLE stmt_audit (n bigserial, what text);
CREATE FUNCTION audit_statement() RETURNS trigger LANGUAGE plpgsql AS
    $$BEGIN INSERT INTO stmt_audit (what) VALUES (TG_OP || ' ' || TG_TABLE_NAME); RETURN NULL; END$$;
CREATE TRIGGER versions_audit AFTER UPDATE ON versions FOR EACH STATEMENT EXECUTE FUNCTION audit_statement();
GRANT USAGE ON SCHEMA tenant_copy TO PUBLIC;
GRANT ALL ON ALL TABLES IN SCHEMA public, tenant_copy TO PUBLIC;
GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO PUBLIC;
"""


# ------------------------------------------------------------------ setup --

@pytest.fixture(scope="module")
def eq_db(pg):
    """This module's application database: test_org_routing's schema, rows and catalog, plus EXTRA_SQL."""
    create_app_db(pg, EQ_DB, EXTRA_SQL)
    yield pg
    pg.sql(f"DROP DATABASE IF EXISTS {EQ_DB} WITH (FORCE)")


@pytest.fixture(scope="module")
def eq_lokadb(eq_db, tmp_tree):
    """One lokadb for the module (session pooling, so DISCARD ALL after every client)."""
    raw = (f"[plugin.meta_cache]\ncloud = host=127.0.0.1 port={eq_db.port} dbname={EQ_DB} user=postgres\n"
           "verify = 0\n\n[plugin.org_routing]\nroute_log = on\nrewrite = on\n")
    b = Bouncer(eq_db, tmp_tree.new_dir("bouncer"), settings={"plugins": "meta_cache org_routing"},
                databases={"app": f"host=127.0.0.1 port={eq_db.port} dbname={EQ_DB}"}, raw=raw)
    try:
        b.start()
        wait_until(lambda: b.admin_dicts("SHOW META_CACHE")[0]["state"] == "ready", 10 * SLOW,
                   what="meta_cache to load the catalog")
        yield b
    finally:
        findings = b.teardown()
    assert not findings, "sanitizer reports:\n" + "\n".join(findings[:40])


class RouteLog:
    """route_log lines of a lokadb written after a mark."""

    def __init__(self, b):
        self.path = b.logpath

    def mark(self):
        return os.path.getsize(self.path) if self.path.exists() else 0

    def since(self, mark):
        with open(self.path, "rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        # one record per log line, but a rewritten text may hold a newline of the client's
        records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d)", text)
        return [r for r in records if "plugin org_routing:" in r and " org=" in r]


# ----------------------------------------------------------------- corpus --

MODES = ("simple", "extended", "prepared")


class Case:
    """A statement of the corpus.

    sql:      the text; {o} is the organization (a literal with the simple
              protocol, the Bind parameter %(o)s with psycopg), {ob} the same
              as a binary parameter, {oarr} an array of it.
    leaf:     for an isolated organization: True (must be addressed to its
              leaf), False (must not: a rewrite would be wrong), None (either
              is right: README says the shape is not followed, or the rewrite
              fails and the parent serves), or a function of the organization
              giving one of those. A statement without
              {o} is judged as written.
    ordered:  the statement orders its rows deterministically.
    txn:      run in a transaction rolled back at the end (setup too).
    check:    a query run after the statement, before the ROLLBACK.
    setup:    statements run first on the same connection.
    modes:    the protocols to run it with.
    finding:  xfail reason (FINDING n: ...) for `finding_modes` (default: all).
    """

    def __init__(self, name, sql, leaf, ordered=False, txn=False, check=None, setup=(), modes=MODES,
                 finding=None, finding_modes=None):
        self.name, self.sql, self.leaf, self.ordered = name, sql, leaf, ordered
        self.txn, self.check, self.setup, self.modes = txn, check, tuple(setup), modes
        self.finding, self.finding_modes = finding, finding_modes or modes

    @property
    def has_org(self):
        return any(p in self.sql for p in ("{o}", "{ob}", "{oarr}"))

    def expect_leaf(self, org):
        if self.has_org and org not in ISOLATED:
            return False                 # no leaf of its own: nothing to address
        return self.leaf(org) if callable(self.leaf) else self.leaf


F15 = ("FINDING 15: an error of a rewritten statement is reported on the rewritten text: its position, "
       "and relation names (documents_o2_1), are not the client's")


CASES = [
    # ---------------------------------------------------------- basics --
    Case("eq_literal", "SELECT id, title, project_id FROM documents WHERE organization_id = {o} AND id % 5 = 0",
         True),
    Case("select_star_order_limit_offset",
         "SELECT * FROM documents WHERE organization_id = {o} ORDER BY id DESC LIMIT 5 OFFSET 2", True, ordered=True),
    Case("constant_on_the_left", "SELECT count(*) FROM documents WHERE {o} = organization_id", True),
    Case("param_cast_bigint", "SELECT count(*), max(id) FROM documents WHERE organization_id = {o}::bigint", True),
    Case("string_cast_chain", "SELECT count(*) FROM documents WHERE organization_id = '2'::text::bigint", True),
    Case("int_cast", "SELECT count(*) FROM versions WHERE organization_id = 2::int", True),
    Case("string_literal", "SELECT count(*) FROM versions WHERE organization_id = '5'", True),
    Case("leading_zeros", "SELECT count(*) FROM documents WHERE organization_id = 002", True),
    Case("bool_cast_changes_the_value", "SELECT count(*) FROM documents WHERE organization_id = 5::bool::int",
         False),
    Case("binary_param", "SELECT count(*), min(body) FROM versions WHERE organization_id = {ob}", True,
         modes=("extended", "prepared")),
    Case("in_one_value", "SELECT count(*) FROM documents WHERE organization_id IN ({o})", True),
    Case("in_two_values", "SELECT organization_id, count(*) FROM documents WHERE organization_id IN ({o}, 3) "
         "GROUP BY 1 ORDER BY 1", False, ordered=True),
    Case("any_array_param", "SELECT count(*) FROM documents WHERE organization_id = ANY({oarr})", None),
    Case("or_on_the_organization", "SELECT organization_id, count(*) FROM documents "
         "WHERE organization_id = {o} OR organization_id = 3 GROUP BY 1 ORDER BY 1", False, ordered=True),
    Case("or_below_a_scoping_and", "SELECT id FROM documents WHERE organization_id = {o} "
         "AND (title LIKE '%.1' OR organization_id = 3)", True),
    Case("two_organizations_anded", "SELECT count(*) FROM documents WHERE organization_id = {o} "
         "AND organization_id = 5", lambda o: o == 5),
    Case("null_organization", "SELECT count(*) FROM documents WHERE organization_id = NULL", False),
    Case("not_equal", "SELECT count(*) FROM documents WHERE organization_id <> {o}", False),
    Case("is_not_distinct_from", "SELECT count(*) FROM documents WHERE organization_id IS NOT DISTINCT FROM {o}",
         None),
    Case("organization_from_a_subselect", "SELECT count(*) FROM documents "
         "WHERE organization_id = (SELECT id FROM organizations WHERE id = {o})", None),
    Case("nested_parentheses", "SELECT count(*) FROM documents WHERE ((organization_id = {o}) AND (id > 0))", True),
    # ---------------------------------------------- names and aliases --
    Case("unqualified_column_with_alias",
         "SELECT d.id FROM documents d WHERE organization_id = {o} ORDER BY d.id LIMIT 3", True, ordered=True),
    Case("quoted_identifiers", 'SELECT "d"."id", "title" FROM "documents" AS "d" WHERE "d"."organization_id" = {o} '
         "ORDER BY 1 LIMIT 4", True, ordered=True),
    Case("schema_qualified", "SELECT count(*) FROM public.documents WHERE organization_id = {o}", True),
    Case("schema_qualified_table_name_refs", "SELECT documents.id FROM public.documents "
         "WHERE documents.organization_id = {o} ORDER BY documents.id LIMIT 3", True, ordered=True),
    Case("three_part_column_refs", "SELECT public.documents.id FROM public.documents "
         "WHERE public.documents.organization_id = {o} ORDER BY 1 LIMIT 3", False, ordered=True),
    Case("aliases_shadow_table_names", "SELECT versions.id, documents.body FROM documents AS versions "
         "JOIN versions AS documents ON documents.document_id = versions.id "
         "AND documents.organization_id = versions.organization_id "
         "WHERE versions.organization_id = {o} ORDER BY 1, 2 LIMIT 10", True, ordered=True),
    Case("column_alias_list_renames_the_organization_column",
         "SELECT count(*) FROM documents AS d(id, organization_id) WHERE d.organization_id = {o}",
         False),
    Case("dollar_in_names_and_strings", 'SELECT count(*) AS "n$1", min(title) AS x$2 FROM documents '
         "WHERE organization_id = {o} AND title <> '$1' AND title <> 'it''s'", True),
    Case("escape_and_dollar_quoted_strings", "SELECT count(*) FROM documents WHERE organization_id = {o} "
         "AND title <> E'a\\nb' AND title <> $q$x$q$", True, modes=("simple",)),
    Case("trailing_semicolons", "SELECT count(*) FROM documents WHERE organization_id = {o};;", True,
         modes=("simple",)),
    Case("comments_and_odd_whitespace", "/* tenant 5, it's $1 */\n  SELECT\tcount(*)\n FROM   documents -- organization_id = 5"
         "\n WHERE organization_id\n\t=  {o}  ", True),
    # ---------------------------------------------------------- joins --
    Case("self_join_same_organization", "SELECT a.id, b.id FROM documents a JOIN documents b "
         "ON b.project_id = a.project_id AND b.organization_id = a.organization_id "
         "WHERE a.organization_id = {o} AND a.id < b.id AND b.id - a.id < 4", True),
    Case("self_join_two_organizations", "SELECT count(*) FROM documents a JOIN documents b ON b.title = a.title "
         "WHERE a.organization_id = {o} AND b.organization_id = 3", False),
    Case("orm_feed_with_a_cloud_table", "SELECT d.id, d.title, p.name FROM documents d "
         "JOIN projects p ON p.id = d.project_id WHERE d.organization_id = {o} ORDER BY d.id DESC LIMIT 10", True,
         ordered=True),
    Case("organization_in_join_on", "SELECT d.id, v.body FROM documents d JOIN versions v ON v.document_id = d.id "
         "AND v.organization_id = {o} AND d.organization_id = {o} ORDER BY v.id LIMIT 6", True, ordered=True),
    Case("organization_through_a_cloud_column", "SELECT count(*) FROM documents d JOIN projects p "
         "ON p.id = d.project_id AND p.organization_id = d.organization_id WHERE p.organization_id = {o}", True),
    Case("left_join_nullable_side_scoped", "SELECT d.id, count(v.id) FROM documents d LEFT JOIN versions v "
         "ON v.document_id = d.id AND v.organization_id = d.organization_id WHERE d.organization_id = {o} "
         "GROUP BY d.id ORDER BY d.id LIMIT 5", True, ordered=True),
    Case("left_join_nullable_side_unscoped", "SELECT d.id, count(v.id) FROM documents d LEFT JOIN versions v "
         "ON v.document_id = d.id WHERE d.organization_id = {o} GROUP BY d.id ORDER BY d.id LIMIT 5", False,
         ordered=True),
    Case("left_join_preserved_side_only_in_on", "SELECT count(*), count(v.id) FROM documents d "
         "LEFT JOIN versions v ON v.document_id = d.id AND d.organization_id = {o} AND v.organization_id = {o}",
         False),
    Case("right_join", "SELECT v.id, d.title FROM versions v RIGHT JOIN documents d ON d.id = v.document_id "
         "AND v.organization_id = {o} WHERE d.organization_id = {o} ORDER BY d.id, v.id LIMIT 8", True, ordered=True),
    Case("full_join_on_only", "SELECT count(*) FROM documents d FULL JOIN versions v ON v.document_id = d.id "
         "AND v.organization_id = {o} AND d.organization_id = {o}", False),
    Case("full_join_scoped_by_where", "SELECT d.id, v.id FROM documents d FULL JOIN versions v "
         "ON v.document_id = d.id WHERE d.organization_id = {o} AND v.organization_id = {o}", True),
    Case("or_in_join_on", "SELECT count(*) FROM documents d JOIN versions v ON v.document_id = d.id "
         "AND (v.organization_id = {o} OR v.organization_id = 3) WHERE d.organization_id = {o}", False),
    Case("using_organization_id", "SELECT count(*) FROM documents d JOIN versions v USING (organization_id) "
         "WHERE organization_id = {o} AND v.document_id = d.id", None),
    Case("using_with_a_cloud_table", "SELECT count(*) FROM documents d JOIN projects p USING (organization_id) "
         "WHERE organization_id = {o} AND p.id = d.project_id", True),
    Case("nested_join_unqualified_column_of_a_cloud_table", "SELECT count(*) FROM documents d "
         "CROSS JOIN (projects p JOIN organizations o ON o.id = p.organization_id AND organization_id = {o})",
         False),
    Case("lateral", "SELECT d.id, l.body FROM documents d CROSS JOIN LATERAL (SELECT body FROM versions v "
         "WHERE v.organization_id = {o} AND v.document_id = d.id ORDER BY v.id DESC LIMIT 1) l "
         "WHERE d.organization_id = {o} ORDER BY d.id LIMIT 5", True, ordered=True),
    Case("lateral_correlated_organization", "SELECT d.id, l.n FROM documents d CROSS JOIN LATERAL "
         "(SELECT count(*) AS n FROM versions v WHERE v.organization_id = d.organization_id "
         "AND v.document_id = d.id) l WHERE d.organization_id = {o} ORDER BY d.id LIMIT 5", None, ordered=True),
    Case("values_list_join", "SELECT d.id, x.label FROM documents d JOIN (VALUES (31, 'a'), (35, 'b'), (95, 'c')) "
         "AS x(id, label) ON x.id = d.id WHERE d.organization_id = {o} ORDER BY 1", True, ordered=True),
    Case("join_alias_hides_the_inner_table", "SELECT count(*) FROM documents d WHERE d.organization_id = {o} "
         "AND EXISTS (SELECT 1 FROM (documents d JOIN projects p ON p.id = d.project_id) AS j "
         "WHERE d.organization_id = {o} AND j.title = 'doc 1.1')", False),
    Case("public_and_other_documents_unaliased", "SELECT count(*), min(note) FROM public.documents, "
         "other.documents WHERE organization_id = {o}", None),
    # ---------------------------------------------------- subqueries --
    Case("subquery_in_from", "SELECT s.project_id, s.n FROM (SELECT project_id, count(*) AS n FROM documents "
         "WHERE organization_id = {o} GROUP BY project_id) s ORDER BY 1", True, ordered=True),
    Case("in_subquery_scoped", "SELECT id FROM documents WHERE organization_id = {o} AND id IN "
         "(SELECT document_id FROM versions WHERE organization_id = {o} AND body LIKE 'v2%') ORDER BY id LIMIT 5",
         True, ordered=True),
    Case("in_subquery_unscoped", "SELECT id FROM documents WHERE organization_id = {o} AND id IN "
         "(SELECT document_id FROM versions WHERE body LIKE 'v2%') ORDER BY id LIMIT 5", False, ordered=True),
    Case("scalar_subquery_in_select_list", "SELECT d.id, (SELECT count(*) FROM versions v "
         "WHERE v.organization_id = {o} AND v.document_id = d.id) FROM documents d WHERE d.organization_id = {o} "
         "ORDER BY d.id LIMIT 5", True, ordered=True),
    Case("scalar_subquery_of_another_organization", "SELECT id, (SELECT count(*) FROM versions "
         "WHERE organization_id = 3) FROM documents WHERE organization_id = {o} ORDER BY id LIMIT 3", False,
         ordered=True),
    Case("exists_correlated_on_organization", "SELECT d.id FROM documents d WHERE d.organization_id = {o} AND "
         "EXISTS (SELECT 1 FROM versions v WHERE v.organization_id = d.organization_id AND v.document_id = d.id) "
         "ORDER BY 1 LIMIT 4", None, ordered=True),
    Case("not_exists_scoped", "SELECT d.id FROM documents d WHERE d.organization_id = {o} AND NOT EXISTS "
         "(SELECT 1 FROM versions v WHERE v.organization_id = {o} AND v.document_id = d.id "
         "AND v.body LIKE 'v2%') ORDER BY 1", True, ordered=True),
    Case("exists_of_another_organization", "SELECT count(*) FROM documents WHERE organization_id = {o} AND "
         "EXISTS (SELECT 1 FROM versions WHERE organization_id = 3)", False),
    Case("select_exists", "SELECT EXISTS (SELECT 1 FROM documents WHERE organization_id = {o} AND title LIKE 'doc%')",
         True),
    # ---------------------------------------------------------- CTEs --
    Case("cte_and_outer_join", "WITH recent AS (SELECT * FROM documents WHERE organization_id = {o} "
         "ORDER BY created_at DESC, id DESC LIMIT 5) SELECT r.id, count(v.id) FROM recent r "
         "LEFT JOIN versions v ON v.document_id = r.id AND v.organization_id = {o} GROUP BY r.id ORDER BY r.id",
         True, ordered=True),
    Case("cte_named_like_the_table", "WITH documents AS (SELECT * FROM public.documents WHERE organization_id = {o}) "
         "SELECT count(*), min(id) FROM documents", True),
    Case("cte_name_hides_the_outer_table", "SELECT count(*) FROM documents WHERE organization_id = {o} AND id IN "
         "(WITH documents AS (SELECT document_id AS id FROM versions WHERE organization_id = {o}) "
         "SELECT id FROM documents)", None),
    Case("cte_unscoped_body", "WITH x AS (SELECT * FROM versions) SELECT count(*) FROM documents d "
         "JOIN x ON x.document_id = d.id WHERE d.organization_id = {o}", False),
    Case("with_recursive", "WITH RECURSIVE chain(id, n) AS (SELECT min(id), 1 FROM documents "
         "WHERE organization_id = {o} UNION ALL SELECT d.id, c.n + 1 FROM chain c JOIN documents d "
         "ON d.organization_id = {o} AND d.id = c.id + 1 WHERE c.n < 5) SELECT * FROM chain ORDER BY n", True,
         ordered=True),
    # ------------------------------------------------ set operations --
    Case("union_same_organization", "SELECT id FROM documents WHERE organization_id = {o} AND id % 3 = 0 "
         "UNION SELECT document_id FROM versions WHERE organization_id = {o} AND id % 4 = 0", True),
    Case("union_all_two_organizations", "SELECT id, organization_id FROM documents WHERE organization_id = {o} "
         "UNION ALL SELECT id, organization_id FROM documents WHERE organization_id = 3", False),
    Case("intersect_except", "(SELECT document_id FROM versions WHERE organization_id = {o}) INTERSECT "
         "(SELECT id FROM documents WHERE organization_id = {o}) EXCEPT "
         "SELECT id FROM documents WHERE organization_id = {o} AND id % 2 = 0", True),
    # --------------------------------------------- grouping, windows --
    Case("window_functions", "SELECT id, project_id, row_number() OVER (PARTITION BY project_id ORDER BY id), "
         "sum(id) OVER (ORDER BY id ROWS BETWEEN 1 PRECEDING AND CURRENT ROW), lag(title) OVER w "
         "FROM documents WHERE organization_id = {o} WINDOW w AS (ORDER BY id) ORDER BY id", True, ordered=True),
    Case("distinct_on", "SELECT DISTINCT ON (project_id) project_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY project_id, id DESC", True, ordered=True),
    Case("group_by_having", "SELECT project_id, count(*) FROM documents WHERE organization_id = {o} "
         "GROUP BY project_id HAVING count(*) > 5 ORDER BY project_id", True, ordered=True),
    Case("rollup_and_filter", "SELECT project_id, date_trunc('hour', created_at), count(*) FILTER (WHERE id % 2 = 0) "
         "FROM documents WHERE organization_id = {o} GROUP BY ROLLUP (project_id, date_trunc('hour', created_at)) "
         "ORDER BY 1 NULLS FIRST, 2 NULLS FIRST", True, ordered=True),
    Case("ordered_set_aggregates", "SELECT project_id, string_agg(title, ',' ORDER BY id), "
         "array_agg(id ORDER BY id DESC), percentile_cont(0.5) WITHIN GROUP (ORDER BY id) FROM documents "
         "WHERE organization_id = {o} GROUP BY project_id ORDER BY 1", True, ordered=True),
    Case("fetch_first_with_ties", "SELECT project_id, id FROM documents WHERE organization_id = {o} "
         "ORDER BY project_id FETCH FIRST 3 ROWS WITH TIES", True),
    Case("expressions_the_deparser_rewrites", "SELECT id, substring(title FROM 1 FOR 5), trim(BOTH ' ' FROM title), "
         "position('.' IN title), extract(hour FROM created_at), coalesce(nullif(project_id, 0), -1), "
         "greatest(id, 40), title COLLATE \"C\", created_at AT TIME ZONE 'UTC', "
         "CASE WHEN id % 2 = 0 THEN 'even' ELSE 'odd' END, title ILIKE 'DOC%', title SIMILAR TO 'doc%', "
         "id BETWEEN 35 AND 45, id IS DISTINCT FROM 40, ARRAY[id, project_id], (id, project_id) < (40, 0), "
         "created_at < timestamptz '2024-01-01' + interval '5 hours', current_date IS NOT NULL "
         "FROM documents WHERE organization_id = {o} ORDER BY id LIMIT 5", True, ordered=True),
    Case("deparser_precedence_and_casts", "SELECT d.id, - -d.id, (d.id)::text || 'x' COLLATE \"C\", "
         "(d).title, d.title LIKE 'doc!_%' ESCAPE '!', d.id = ANY(ARRAY[31, 32]), "
         "d.id > ALL(ARRAY[1, 2]), (d.id > 40) IS TRUE, NOT (d.id > 40) IS NOT FALSE, "
         "d.created_at::timestamp(0) without time zone, CAST(d.created_at AS timestamptz(3)), "
         "interval '1 day 2 hours' * 2, date_trunc('day', d.created_at) + interval '1' hour, "
         "(d.created_at, interval '1 hour') OVERLAPS (timestamptz '2024-01-01 01:00+00', interval '1 hour'), "
         "d.title::varchar(3), 2 ^ 3 ^ 2, -2 ^ 2, 10 - 3 - 2, 10 - (3 - 2), 2 * 3 % 4, NULLIF(d.id, 31) IS NULL, "
         "ROW(d.id, d.title)::text, OVERLAY(d.title PLACING 'X' FROM 1 FOR 1), d.title ~ '^doc', 'a' || 1 || 'b', "
         "d.id BETWEEN SYMMETRIC 50 AND 40, (SELECT max(v.id) FROM versions v WHERE v.organization_id = {o} "
         "AND v.document_id = d.id) FROM documents d WHERE d.organization_id = {o} ORDER BY d.id LIMIT 4", True,
         ordered=True),
    Case("deparser_array_subscript", "SELECT d.id, (ARRAY[d.id, d.project_id])[2] FROM documents d "
         "WHERE d.organization_id = {o} ORDER BY d.id LIMIT 3", True, ordered=True),
    Case("django_date_lookup", 'SELECT "documents"."id" FROM "documents" WHERE ("documents"."organization_id" = {o} '
         'AND ("documents"."created_at" AT TIME ZONE \'UTC\')::date = \'2024-01-01\'::date) '
         'ORDER BY "documents"."id" ASC', True, ordered=True),
    Case("boolean_expression_cast", "SELECT id, (id > 40 AND project_id > 4)::int, (NOT id > 40)::int "
         "FROM documents WHERE organization_id = {o} ORDER BY id LIMIT 5", True, ordered=True),
    Case("in_list_of_70_ids", "SELECT count(*) FROM documents WHERE organization_id = {o} AND id IN (31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100)",
         True),
    Case("quoted_strings", "SELECT count(*) FROM documents WHERE organization_id = {o} "
         "AND title <> 'a \"documents\" b' AND title <> 'é'", True),
    # (N'x' normalizes to N$1, an identifier: the template loses $1, the rewrite fails, the parent serves)
    Case("national_character_string", "SELECT count(*) FROM documents WHERE organization_id = {o} "
         "AND title <> N'x'", None),
    Case("json", "SELECT jsonb_build_object('id', id, 'title', title) -> 'title', to_jsonb(d) ->> 'title', "
         "row_to_json(d)::text FROM documents d WHERE d.organization_id = {o} ORDER BY d.id LIMIT 3", True,
         ordered=True),
    # ---------------------------------------------- row-level locks --
    Case("for_update", "SELECT id FROM documents WHERE organization_id = {o} ORDER BY id LIMIT 3 FOR UPDATE",
         True, ordered=True, txn=True),
    Case("for_share_of_alias", "SELECT d.id, p.name FROM documents d JOIN projects p ON p.id = d.project_id "
         "WHERE d.organization_id = {o} ORDER BY d.id LIMIT 3 FOR SHARE OF d", True, ordered=True, txn=True),
    # (the RangeVar of `OF documents` counts as an unscoped occurrence: not addressed, which is safe)
    Case("for_update_of_table_name_skip_locked", "SELECT documents.id FROM documents WHERE organization_id = {o} "
         "ORDER BY 1 LIMIT 2 FOR UPDATE OF documents SKIP LOCKED", None, ordered=True, txn=True),
    Case("for_update_of_alias_skip_locked", "SELECT d.id FROM documents d WHERE d.organization_id = {o} "
         "ORDER BY d.id LIMIT 2 FOR UPDATE OF d SKIP LOCKED", True, ordered=True, txn=True),
    Case("hibernate_for_no_key_update_of_alias_nowait", "select d1_0.id from documents d1_0 "
         "where d1_0.organization_id={o} order by d1_0.id fetch first 1 rows only for no key update of d1_0 nowait",
         True, ordered=True, txn=True),
    # ------------------------------------ system columns, row types --
    Case("tableoid", "SELECT tableoid::regclass::text, count(*) FROM documents WHERE organization_id = {o} "
         "GROUP BY 1", True),
    # a whole row has the row type of the relation scanned: such statements stay on the parent
    Case("whole_row_type", "SELECT pg_typeof(d)::text, count(*) FROM documents d WHERE d.organization_id = {o} "
         "GROUP BY 1", False),
    Case("whole_row_of_the_table_name", "SELECT documents FROM documents WHERE organization_id = {o} "
         "ORDER BY id LIMIT 3", False, ordered=True),
    Case("whole_row_star_in_a_function", "SELECT pg_typeof(d.*)::text, row_to_json(d.*)->>'title' FROM documents d "
         "WHERE d.organization_id = {o} ORDER BY d.id LIMIT 2", False, ordered=True),
    Case("whole_row_in_a_subquery", "SELECT p.name, (SELECT pg_typeof(v)::text FROM versions v "
         "WHERE v.document_id = d.id AND v.organization_id = {o} LIMIT 1) FROM documents d "
         "JOIN projects p ON p.id = d.project_id WHERE d.organization_id = {o} ORDER BY d.id LIMIT 3", False,
         ordered=True),
    Case("whole_row_shown_by_no_type", "SELECT json_agg(d ORDER BY d.id)::text, count(d), "
         "max((d).title), bool_and(d IS NOT NULL), min(d::text), pg_typeof(d::documents)::text "
         "FROM documents d WHERE d.organization_id = {o} GROUP BY d::documents", True),
    Case("star_of_an_alias_expands", "SELECT d.*, p.name FROM documents d JOIN projects p ON p.id = d.project_id "
         "WHERE d.organization_id = {o} ORDER BY d.id LIMIT 3", True, ordered=True),
    Case("row_of_the_columns_is_a_record", "SELECT pg_typeof(ROW(d.id, d.title))::text, count(*) FROM documents d "
         "WHERE d.organization_id = {o} GROUP BY 1", True),
    Case("only", "SELECT count(*) FROM ONLY documents WHERE organization_id = {o}", False),
    Case("inheritance_star", "SELECT count(*) FROM documents* WHERE organization_id = {o}", True),
    Case("tablesample_repeatable", "SELECT id FROM documents TABLESAMPLE BERNOULLI (50) REPEATABLE (7) "
         "WHERE organization_id = {o}", None),
    # -------------------------------------------------------- views --
    Case("view_over_a_tenant_table", "SELECT * FROM doc_titles WHERE organization_id = {o} ORDER BY id LIMIT 3",
         False, ordered=True),
    Case("view_joined_with_a_tenant_table", "SELECT t.title, v.body FROM doc_titles t JOIN versions v "
         "ON v.document_id = t.id AND v.organization_id = t.organization_id WHERE t.organization_id = {o} "
         "ORDER BY v.id LIMIT 4", True, ordered=True),
    Case("other_schema_same_name", "SELECT id, note FROM other.documents", False),
    # ---------------------------------------------------- ORM shapes --
    Case("django_filter", 'SELECT "documents"."id", "documents"."title" FROM "documents" INNER JOIN "projects" '
         'ON ("documents"."project_id" = "projects"."id") WHERE ("documents"."organization_id" = {o} '
         'AND "projects"."name"::text LIKE \'project%\') ORDER BY "documents"."id" ASC LIMIT 21', True, ordered=True),
    Case("django_exists", 'SELECT 1 AS "a" FROM "documents" WHERE ("documents"."organization_id" = {o} '
         'AND "documents"."id" = 40) LIMIT 1', True),
    Case("sqlalchemy_in_subquery", "SELECT documents.id AS documents_id, documents.title AS documents_title "
         "FROM documents WHERE documents.organization_id = {o} AND documents.id IN (SELECT versions.document_id "
         "FROM versions WHERE versions.organization_id = {o}) ORDER BY documents.id LIMIT 5 OFFSET 1", True,
         ordered=True),
    Case("rails_where_in", 'SELECT "documents".* FROM "documents" WHERE "documents"."organization_id" = {o} '
         'AND "documents"."project_id" IN (SELECT "projects"."id" FROM "projects" '
         'WHERE "projects"."organization_id" = {o}) ORDER BY "documents"."created_at" DESC, "documents"."id" DESC '
         "LIMIT 3", True, ordered=True),
    Case("hibernate_left_join_fetch_first", "select d1_0.id,d1_0.title,v1_0.body from documents d1_0 left join "
         "versions v1_0 on d1_0.id=v1_0.document_id and d1_0.organization_id=v1_0.organization_id "
         "where d1_0.organization_id={o} order by d1_0.id,v1_0.id offset 2 rows fetch first 5 rows only", True,
         ordered=True),
    # ---------------------------------------------------- statements --
    Case("multi_statement_two_organizations", "SELECT count(*) FROM documents WHERE organization_id = 2; "
         "SELECT count(*) FROM documents WHERE organization_id = 5", False, modes=("simple",)),
    Case("multi_statement_one_organization", "SELECT count(*) FROM documents WHERE organization_id = 2; "
         "SELECT count(*) FROM versions WHERE organization_id = 2", False, modes=("simple",)),
    Case("sql_prepare_execute", "EXECUTE eq_count({o})", False,
         setup=("PREPARE eq_count(bigint) AS SELECT count(*) FROM documents WHERE organization_id = $1",),
         modes=("simple",)),
    Case("copy_query_to_stdout", "COPY (SELECT id, title FROM documents WHERE organization_id = {o} ORDER BY id) "
         "TO STDOUT", True, ordered=True, modes=("simple",)),
    Case("declare_cursor", "DECLARE eq_cur CURSOR FOR SELECT id, title FROM documents WHERE organization_id = {o} "
         "ORDER BY id", None, txn=True, check="FETCH 3 FROM eq_cur", modes=("simple",)),
    Case("create_temp_table_as", "CREATE TEMP TABLE eq_tmp ON COMMIT DROP AS SELECT id FROM documents "
         "WHERE organization_id = {o}", None, txn=True, check="SELECT count(*), min(id) FROM eq_tmp",
         modes=("simple",)),
    Case("error_position_in_a_rewritten_statement", "SELECT count(*) FROM documents WHERE organization_id = 2 "
         "AND nosuchcol = 1", True),
    Case("error_naming_the_table", "UPDATE documents SET nosuchcol = 1 WHERE organization_id = 2", True, txn=True),
    Case("error_position_after_two_renamed_tables_and_non_ascii_text", "SELECT d.id, 'héllo wörld' AS greeting "
         "FROM documents d JOIN versions ON versions.document_id = d.id AND versions.organization_id = 2 "
         "WHERE d.organization_id = 2 AND d.title <> 'ünïcode' AND versions.nosuchcol = 1", True),
    # an INSERT whose one LokaDB table is its target stays on the parent (PostgreSQL routes its
    # rows); one that reads the organization's rows too is addressed to the leaves as a whole
    Case("error_naming_an_insert_target", "INSERT INTO documents (organization_id, id, nosuchcol) "
         "VALUES (2, 999001, 1)", False, txn=True),
    Case("error_naming_an_insert_target_that_reads_a_leaf", "INSERT INTO documents (organization_id, id, nosuchcol) "
         "VALUES (2, (SELECT max(id) + 1 FROM versions WHERE organization_id = 2), 1)", True, txn=True),
    Case("error_inside_the_renamed_name", "SELECT documents.nosuchcol FROM public.documents "
         "WHERE organization_id = 2", True),
    # ------------------------------------------- session organization --
    Case("session_organization_statement_without_one", "SELECT organization_id, count(*) FROM documents "
         "GROUP BY 1 ORDER BY 1", False, ordered=True, setup=("SET lokadb.org = 2",)),
    Case("session_organization_and_a_statement_organization", "SELECT count(*), min(id) FROM documents "
         "WHERE organization_id = {o}", True, setup=("SET lokadb.org = 5",)),
    Case("session_organization_set_in_the_same_query", "SET lokadb.org = 2; SELECT count(*) FROM documents", False,
         modes=("simple",)),
    # --------------------------------------------------- search_path --
    Case("search_path_other_first_plain_table", "SELECT id, note FROM documents ORDER BY id", False,
         ordered=True, setup=("SET search_path = other, public",)),
    Case("search_path_other_first_tenant_table", "SELECT count(*) FROM versions WHERE organization_id = {o}", True,
         setup=("SET search_path = other, public",)),
    Case("search_path_tenant_copy_followed", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", False, ordered=True,
         setup=("SET search_path = tenant_copy, public",)),
    Case("search_path_set_local", "SELECT organization_id, id, title FROM documents WHERE organization_id = {o} "
         "ORDER BY id", False, ordered=True, txn=True, setup=("SET LOCAL search_path = tenant_copy, public",)),
    Case("search_path_set_config", "SELECT organization_id, id, title FROM documents WHERE organization_id = {o} "
         "ORDER BY id", False, ordered=True, txn=True,
         setup=("SELECT set_config('search_path', 'tenant_copy, public', false)",)),
    Case("search_path_change_rolled_back", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", False, ordered=True,
         setup=("SET search_path = tenant_copy, public", "BEGIN", "SET search_path = public", "ROLLBACK")),
    Case("search_path_change_in_a_failed_query", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", False, ordered=True,
         setup=("SET search_path = tenant_copy, public", "SET search_path = public; SELECT 1/0"),
         modes=("simple",)),
    Case("temporary_table_hides_the_tenant_table", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", False, ordered=True, txn=True,
         setup=("CREATE TEMP TABLE documents (organization_id bigint, id bigint, title text) ON COMMIT DROP",
                "INSERT INTO documents VALUES (2, 1, 'temporary 2'), (5, 1, 'temporary 5')")),
    Case("temporary_view_hides_the_tenant_table", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", False, ordered=True, txn=True,
         setup=("CREATE TEMP VIEW documents AS SELECT organization_id, id, 'view ' || title AS title "
                "FROM public.documents WHERE id % 7 = 0",)),
    Case("temporary_table_dropped_again", "SELECT organization_id, id, title FROM documents "
         "WHERE organization_id = {o} ORDER BY id", True, ordered=True, txn=True,
         setup=("CREATE TEMP TABLE documents (organization_id bigint, id bigint, title text)",
                "DROP TABLE documents")),
    # -------------------------------------------------------- writes --
    Case("insert_values_returning", "INSERT INTO documents (organization_id, project_id, title) VALUES "
         "({o}, 1, 'eq insert a'), ({o}, 2, 'eq insert b') RETURNING organization_id, project_id, title, "
         "tableoid::regclass::text", False, txn=True,
         check="SELECT organization_id, title, tableoid::regclass::text FROM documents "
               "WHERE title LIKE 'eq insert%' ORDER BY title"),
    Case("insert_values_reading_its_organization", "INSERT INTO versions (organization_id, document_id, body) "
         "VALUES ({o}, (SELECT max(id) FROM documents WHERE organization_id = {o}), 'eq sub') "
         "RETURNING organization_id, body, tableoid::regclass::text", True, txn=True,
         check="SELECT organization_id, document_id, tableoid::regclass::text FROM versions WHERE body = 'eq sub'"),
    Case("insert_into_a_cloud_table_from_its_organization", "INSERT INTO projects (id, organization_id, name) "
         "SELECT 900000 + id, organization_id, 'eq from ' || title FROM documents WHERE organization_id = {o} "
         "AND id % 25 = 0 RETURNING id, organization_id, name", True, txn=True,
         check="SELECT count(*), min(name) FROM projects WHERE name LIKE 'eq from %'"),
    Case("insert_values_two_organizations", "INSERT INTO documents (organization_id, project_id, title) VALUES "
         "({o}, 1, 'eq insert a'), (3, 2, 'eq insert b') RETURNING organization_id, title", False, txn=True,
         check="SELECT organization_id, title FROM documents WHERE title LIKE 'eq insert%' ORDER BY title"),
    Case("django_insert_returning", 'INSERT INTO "versions" ("organization_id", "document_id", "body") '
         "VALUES ({o}, 40, 'django') RETURNING \"versions\".\"organization_id\", \"versions\".\"body\"", False,
         txn=True, check="SELECT organization_id, document_id FROM versions WHERE body = 'django'"),
    Case("insert_select", "INSERT INTO versions (organization_id, document_id, body) SELECT organization_id, id, "
         "'eq copy' FROM documents WHERE organization_id = {o} AND id % 10 = 0 "
         "RETURNING organization_id, document_id, body", None, txn=True,
         check="SELECT count(*) FROM versions WHERE body = 'eq copy'"),
    Case("insert_on_conflict_do_nothing", "INSERT INTO documents (organization_id, project_id, title) "
         "VALUES ({o}, 1, 'eq upsert') ON CONFLICT DO NOTHING RETURNING organization_id, title", False, txn=True),
    Case("insert_on_conflict_with_target", "INSERT INTO documents (organization_id, id, project_id, title) "
         "VALUES ({o}, 31, 1, 'eq upsert') ON CONFLICT (organization_id, id) DO UPDATE SET title = excluded.title "
         "RETURNING organization_id, id, title", False, txn=True),       # 42P10 on the parent, as PostgreSQL
    Case("update_returning", "UPDATE documents SET title = title || ' (eq)' WHERE organization_id = {o} "
         "AND id % 4 = 1 RETURNING id, title", True, txn=True,
         check="SELECT count(*) FROM documents WHERE title LIKE '% (eq)'"),
    Case("update_of_the_organization_column", "UPDATE documents SET organization_id = 3 "
         "WHERE organization_id = {o} AND id % 10 = 3 RETURNING id, organization_id, tableoid::regclass::text",
         False, txn=True, check="SELECT organization_id, count(*) FROM documents GROUP BY 1 ORDER BY 1"),
    Case("update_multi_assign_of_the_organization_column", "UPDATE documents SET (organization_id, title) = "
         "(3, title) WHERE organization_id = {o} AND id % 10 = 4 RETURNING id, organization_id", False, txn=True,
         check="SELECT organization_id, count(*) FROM documents GROUP BY 1 ORDER BY 1"),
    Case("django_bulk_update_case", 'UPDATE "documents" SET "title" = CASE WHEN ("documents"."id" = 31) THEN \'x\' '
         'WHEN ("documents"."id" = 95) THEN \'y\' ELSE NULL END WHERE ("documents"."organization_id" = {o} '
         'AND "documents"."id" IN (31, 95)) RETURNING "documents"."id", "documents"."title"', True, txn=True),
    # (versions has a statement-level UPDATE trigger: its UPDATEs stay on the parent, below)
    Case("update_from", "UPDATE documents d SET title = d.title || ' @' || v.body FROM versions v "
         "WHERE d.id = v.document_id AND d.organization_id = v.organization_id AND d.organization_id = {o} "
         "AND d.id % 5 = 0 AND v.body LIKE 'v1 %' RETURNING d.id, d.title", True, txn=True),
    Case("update_from_another_organization", "UPDATE versions v SET body = v.body || '!' FROM documents d "
         "WHERE d.title = 'doc 7.1' AND d.organization_id = 3 AND v.organization_id = {o} AND v.id % 7 = 0 "
         "RETURNING v.id, v.body", False, txn=True),
    Case("update_set_from_a_subquery_of_another_organization", "UPDATE versions SET body = (SELECT min(title) "
         "FROM documents WHERE organization_id = 3) WHERE organization_id = {o} AND id % 11 = 0 RETURNING id, body",
         False, txn=True),
    Case("update_fires_statement_trigger", "UPDATE versions SET body = body WHERE organization_id = {o} "
         "AND id % 9 = 0", False, txn=True, check="SELECT what, count(*) FROM stmt_audit GROUP BY 1"),
    Case("update_from_fires_statement_trigger", "UPDATE versions v SET body = v.body || ' @' || d.title "
         "FROM documents d WHERE d.id = v.document_id AND d.organization_id = v.organization_id "
         "AND v.organization_id = {o} AND d.id % 5 = 0 RETURNING v.id, v.body", False, txn=True,
         check="SELECT what, count(*) FROM stmt_audit GROUP BY 1"),
    Case("insert_beside_an_update_trigger", "INSERT INTO versions (organization_id, document_id, body) "
         "VALUES ({o}, 41, 'no insert trigger') RETURNING organization_id, body", False, txn=True,
         check="SELECT what, count(*) FROM stmt_audit GROUP BY 1"),
    Case("delete_returning", "DELETE FROM versions WHERE organization_id = {o} AND id % 6 = 0 "
         "RETURNING id, document_id", True, txn=True,
         check="SELECT organization_id, count(*) FROM versions GROUP BY 1 ORDER BY 1"),
    Case("delete_using", "DELETE FROM versions v USING documents d WHERE d.id = v.document_id "
         "AND d.organization_id = {o} AND v.organization_id = d.organization_id AND d.id % 3 = 0 RETURNING v.id",
         True, txn=True, check="SELECT organization_id, count(*) FROM versions GROUP BY 1 ORDER BY 1"),
    Case("delete_returning_the_whole_row", "DELETE FROM versions WHERE organization_id = {o} AND id % 13 = 0 "
         "RETURNING versions", False, txn=True),
    Case("delete_only", "DELETE FROM ONLY documents WHERE organization_id = {o} RETURNING id", False, txn=True),
    Case("data_modifying_cte_update", "WITH changed AS (UPDATE documents SET title = title || ' (edited)' "
         "WHERE organization_id = {o} AND id % 10 = 1 RETURNING id, project_id, title) "
         "SELECT count(*), min(title) FROM changed", True, txn=True),
    Case("data_modifying_cte_update_with_a_trigger", "WITH changed AS (UPDATE versions SET body = body "
         "|| ' (edited)' WHERE organization_id = {o} AND document_id % 10 = 1 RETURNING id) "
         "SELECT count(*) FROM changed", False, txn=True, check="SELECT what, count(*) FROM stmt_audit GROUP BY 1"),
    Case("data_modifying_cte_insert", "WITH ins AS (INSERT INTO versions (organization_id, document_id, body) "
         "VALUES ({o}, 40, 'eq cte insert') RETURNING organization_id, body) SELECT i.organization_id, i.body, "
         "(SELECT count(*) FROM versions WHERE organization_id = {o}) FROM ins i", True, txn=True,
         check="SELECT count(*) FROM versions WHERE body = 'eq cte insert'"),
    Case("data_modifying_cte_moves_rows", "WITH moved AS (UPDATE documents SET organization_id = 3 "
         "WHERE organization_id = {o} AND id % 10 = 5 RETURNING id) SELECT count(*) FROM moved", False, txn=True,
         check="SELECT organization_id, count(*) FROM documents GROUP BY 1 ORDER BY 1"),
]


def _params():
    out = []
    for case in CASES:
        for mode in case.modes:
            marks = []
            if case.finding and mode in case.finding_modes:
                marks.append(pytest.mark.xfail(strict=True, reason=case.finding))
            out.append(pytest.param(case, mode, id=f"{case.name}-{mode}", marks=marks))
    return out


# ---------------------------------------------------------------- running --

def _sql_for(case, mode):
    """The text and parameters of a case for a protocol (organization still to be bound)."""
    if mode == "simple":
        return case.sql, None
    if not case.has_org:
        return case.sql, None
    text = case.sql.replace("%", "%%")
    return text.replace("{oarr}", "%(oarr)s").replace("{ob}", "%(o)b").replace("{o}", "%(o)s"), True


def _literal(case, org):
    return case.sql.replace("{oarr}", f"ARRAY[{org}]::bigint[]").replace("{ob}", str(org)).replace("{o}", str(org))


def _canon(case, rows):
    return rows if case.ordered else sorted(rows, key=repr)


def _wire_result(case, res):
    if res.error is not None:
        return {"error": tuple(res.error.fields.get(k) for k in "CMPt")}
    copied = [payload for typ, payload in res.messages if typ == b"d"]
    return {"columns": res.columns, "rows": _canon(case, res.rows), "tags": res.tags,
            "copy": copied if case.ordered else sorted(copied)}


def run_simple(case, w, org, log=None):
    """The case on a raw connection (simple protocol); (outcome, route_log lines of the statement)."""
    lines = []
    if case.txn:
        w.query("BEGIN")
    for s in case.setup:
        w.query(s, raise_error=False)
    mark = log.mark() if log else None
    out = _wire_result(case, w.query(_literal(case, org), raise_error=False))
    if log:
        lines = log.since(mark)
    if case.check:
        out["check"] = _wire_result(case, w.query(case.check, raise_error=False))
    if case.txn:
        w.query("ROLLBACK")
    return out, lines


def _psycopg_result(case, c, sql, params, prepare):
    try:
        # (without parameters psycopg sends a simple Query unless the results are binary)
        cur = c.execute(sql, params, prepare=prepare, binary=params is None and not prepare or None)
    except psycopg.Error as e:
        return {"error": (e.sqlstate, e.diag.message_primary, e.diag.statement_position, e.diag.table_name)}
    if cur.description is None:
        return {"status": cur.statusmessage}
    return {"columns": [(d.name, d.type_code) for d in cur.description],
            "rows": _canon(case, [tuple(r) for r in cur.fetchall()]), "status": cur.statusmessage}


def run_psycopg(case, conn, org, prepare, log=None):
    """The case on a psycopg connection (extended protocol); (outcome, route_log lines of the statement)."""
    sql, has_params = _sql_for(case, "prepared" if prepare else "extended")
    params = {"o": org, "oarr": [org]} if has_params else None
    lines = []
    if case.txn:
        conn.execute("BEGIN")
    for s in case.setup:
        try:
            conn.execute(s)
        except psycopg.Error:
            pass
    mark = log.mark() if log else None
    out = _psycopg_result(case, conn, sql, params, prepare)
    if log:
        lines = log.since(mark)
    if case.check:
        out["check"] = _psycopg_result(case, conn, case.check, None, False)
    if case.txn:
        conn.execute("ROLLBACK")
    return out, lines


def check_route(case, mode, org, lines, what):
    """What route_log says of one run of the case, against the case's expectation."""
    want = case.expect_leaf(org)
    leaf = [l for l in lines if "rewrite=leaf" in l]
    if want is not None:
        assert not any("rewrite=failed" in l for l in lines), (what, lines)
    if want is True:
        assert leaf, f"{what}: not addressed to a leaf: {lines}"
        if case.has_org:        # (route_log shows 255 bytes of the text: the leaf may be cut off)
            assert all(f"_o{org}_1" in l or not re.search(r"_o\d+_1", l) for l in leaf), (what, leaf)
    elif want is False:
        assert not leaf, f"{what}: addressed to a leaf, which changes the result: {leaf}"
    for o in ISOLATED:
        if case.has_org and o != org:
            assert not any(f"_o{o}_1" in l for l in leaf), (what, leaf)


def _conn(port, dbname):
    # psycopg's default prepared_max (100) is below the corpus's statements: over it psycopg drops
    # its oldest with SQL DEALLOCATE, which lokadb answers in transaction pooling (doc/usage.md)
    return psycopg.connect(host="127.0.0.1", port=port, dbname=dbname, user=USER, autocommit=True,
                           sslmode="disable", gssencmode="disable", connect_timeout=int(10 * SLOW),
                           prepare_threshold=100)     # (prepare=True prepares; nothing else does)


# ------------------------------------------------------------------ tests --

@pytest.mark.parametrize("case, mode", _params())
def test_rewritten_statement_returns_what_postgresql_returns(eq_db, eq_lokadb, case, mode):
    log = RouteLog(eq_lokadb)
    if mode == "simple":
        # one connection each: a shape and its leaf template serve the organizations in turn
        with Wire(port=eq_db.port, timeout=10 * SLOW) as direct, \
                Wire(port=eq_lokadb.port, timeout=10 * SLOW) as routed:
            direct.login(USER, EQ_DB)
            routed.login(USER, "app")
            for org in (2, 5, 1, 2) if case.has_org else (2,):
                what = f"[{mode} org={org}] {_literal(case, org)}"
                expected, _ = run_simple(case, direct, org)
                got, lines = run_simple(case, routed, org, log)
                assert got == expected, what
                check_route(case, mode, org, lines, what)
        return
    orgs = (2, 1, 5, 2) if mode == "prepared" and case.has_org else (2,)
    prepare = mode == "prepared"
    with _conn(eq_db.port, EQ_DB) as direct, _conn(eq_lokadb.port, "app") as routed:
        for org in orgs:
            what = f"[{mode} org={org}] {case.sql}"
            expected, _ = run_psycopg(case, direct, org, prepare)
            got, lines = run_psycopg(case, routed, org, prepare, log)
            assert got == expected, what
            check_route(case, mode, org, lines, what)


@pytest.mark.parametrize("literal", [False, True], ids=["parameter", "literal"])
def test_a_named_statement_bound_after_a_search_path_change(eq_db, eq_lokadb, literal):
    sql = ("SELECT organization_id, id, title FROM documents WHERE organization_id = "
           + ("2" if literal else "%(o)s") + " ORDER BY id LIMIT 3")
    params = None if literal else {"o": 2}
    log = RouteLog(eq_lokadb)
    mark = log.mark()
    got = []
    for port, dbname in ((eq_db.port, EQ_DB), (eq_lokadb.port, "app")):
        with _conn(port, dbname) as c:
            first = c.execute(sql, params, prepare=True).fetchall()
            c.execute("SET search_path = tenant_copy, public")
            got.append((first, c.execute(sql, params, prepare=True).fetchall()))
    assert any("rewrite=leaf" in l for l in log.since(mark))
    assert got[0][1] == [(2, 1, "archived copy of org 2")]
    assert got[1] == got[0], sql


RD_SQL = ("SELECT d.id, d.title, v.body, p.name, 1 AS one FROM documents d JOIN versions v ON v.document_id = d.id "
          "AND v.organization_id = d.organization_id JOIN projects p ON p.id = d.project_id "
          "WHERE d.organization_id = {o} ORDER BY d.id, v.id LIMIT 2")


def _described(c, how):
    """Each RowDescription the client gets for RD_SQL (table OID, column number of each column)."""
    pg = c.pgconn
    cols = lambda res: [(res.ftable(i), res.ftablecol(i)) for i in range(res.nfields)]
    out = []
    if how == "simple":
        for org in (2, 5, 1):
            out.append(cols(pg.exec_(RD_SQL.format(o=org).encode())))
    elif how == "extended":
        for org in (2, 5, 1):
            out.append(cols(c.execute(RD_SQL.format(o="%(o)s"), {"o": org}).pgresult))
    else:   # a named statement bound for one organization after another, and its Describes
        pg.prepare(b"rd", RD_SQL.format(o="$1::bigint").encode())
        for org in (b"2", b"5", None, b"1", b"2", None):
            out.append(cols(pg.exec_prepared(b"rd", [org]) if org else pg.describe_prepared(b"rd")))
        pg.exec_(b"DEALLOCATE rd")
    return out


@pytest.mark.parametrize("how", ["simple", "extended", "named"])
def test_row_description_names_the_table_the_client_named(eq_db, eq_lokadb, how):
    """RowDescription's table OID and column number (JDBC getBaseTableName, Npgsql GetColumnSchema,
    editable result grids) are the table's the client named, also when the statement went to a
    leaf, in every protocol, for a named statement's Describe before and after its Binds."""
    log = RouteLog(eq_lokadb)
    mark = log.mark()
    with _conn(eq_db.port, EQ_DB) as direct, _conn(eq_lokadb.port, "app") as routed:
        want = _described(direct, how)
        got = _described(routed, how)
        leaves = {r[0] for r in routed.execute("SELECT oid FROM pg_class WHERE relname LIKE '%\\_o_\\_%'")}
    assert sum("rewrite=leaf" in l for l in log.since(mark)) >= 2, "\n".join(log.since(mark))
    assert want[0][0][0] != 0 and want[0][4] == (0, 0)
    assert not leaves & {oid for rd in got for oid, _ in rd}
    assert got == want


def test_a_row_description_larger_than_a_read_is_renamed_whole(eq_db, eq_lokadb):
    """A RowDescription of 1,600 columns (about 100 KB with these names) arrives over several reads:
    lokadb waits for all of it before it renames its columns, and the rows follow it intact."""
    cols = ", ".join(f"d.title AS title_with_a_long_name_to_make_the_message_large_{i:04d}" for i in range(1600))
    sql = f"SELECT d.id, {cols} FROM documents d WHERE d.organization_id = 2 ORDER BY d.id LIMIT 3"
    log = RouteLog(eq_lokadb)
    mark = log.mark()
    got = []
    for port, dbname in ((eq_db.port, EQ_DB), (eq_lokadb.port, "app")):
        with _conn(port, dbname) as c:
            res = c.pgconn.exec_(sql.encode())
            got.append(([(res.ftable(i), res.ftablecol(i), res.fname(i)) for i in range(res.nfields)],
                        [[res.get_value(r, k) for k in range(res.nfields)] for r in range(res.ntuples)]))
    assert any("rewrite=leaf" in l for l in log.since(mark))
    assert len(got[0][0]) == 1601 and len(got[0][1]) == 3
    assert got[1] == got[0]


def test_row_description_through_transaction_pooling(eq_db, eq_lokadb_transaction_pool):
    """The same through the core's statement cache: two clients, two server connections."""
    b = eq_lokadb_transaction_pool
    with _conn(eq_db.port, EQ_DB) as direct, _conn(b.port, "app") as r1, _conn(b.port, "app") as r2:
        for how in ("simple", "extended", "named"):
            want = _described(direct, how)
            assert _described(r1, how) == want, how
            assert _described(r2, how) == want, how
    assert any("rewrite=leaf" in l for l in RouteLog(b).since(0))


def _pipelined(case_list, port, dbname):
    """Each statement prepared and bound for organization 2, then all bound for 5 in one pipeline."""
    out = []
    with _conn(port, dbname) as c:
        for case in case_list:
            sql, _ = _sql_for(case, "prepared")
            out.append(_psycopg_result(case, c, sql, {"o": 2, "oarr": [2]}, True))
        try:
            with c.pipeline():
                curs = [(case, c.execute(_sql_for(case, "prepared")[0], {"o": 5, "oarr": [5]}, prepare=True))
                        for case in case_list]
            out += [_canon(case, cur.fetchall()) for case, cur in curs]
        except psycopg.Error as e:
            out.append(("error", e.sqlstate))
    return out


@pytest.mark.parametrize("n", [8, 9, 12])
def test_named_statements_on_leaves_rebound_for_another_organization_in_a_pipeline(eq_db, eq_lokadb, n):
    """psycopg's pipeline mode: each statement with organization 2's leaf text is parsed back to the
    client's text for organization 5, however many there are (README, "Parsing again at the Bind");
    statements left on the parent there give the same rows."""
    selects = [c for c in CASES if c.has_org and c.leaf is True and not c.txn and not c.setup and not c.finding
               and "prepared" in c.modes and "{ob}" not in c.sql][:n]
    assert len(selects) == n
    log = RouteLog(eq_lokadb)
    mark = log.mark()
    got = _pipelined(selects, eq_lokadb.port, "app")
    assert sum("rewrite=leaf" in l and "_o2_1" in l for l in log.since(mark)) >= n
    assert got == _pipelined(selects, eq_db.port, EQ_DB)


@pytest.fixture
def eq_lokadb_transaction_pool(eq_db, bouncer_factory):
    raw = (f"[plugin.meta_cache]\ncloud = host=127.0.0.1 port={eq_db.port} dbname={EQ_DB} user=postgres\n"
           "verify = 0\n\n[plugin.org_routing]\nroute_log = on\n")
    b = bouncer_factory(settings={"plugins": "meta_cache org_routing", "pool_mode": "transaction",
                                  "default_pool_size": 2},
                        databases={"app": f"host=127.0.0.1 port={eq_db.port} dbname={EQ_DB}"}, raw=raw)
    wait_until(lambda: b.admin_dicts("SHOW META_CACHE")[0]["state"] == "ready", 10 * SLOW,
               what="meta_cache to load the catalog")
    return b


def test_named_statements_through_transaction_pooling(eq_db, eq_lokadb_transaction_pool):
    """The corpus's prepared statements (without session state) from two clients taking turns on a
    pool of two server connections: the core's statement cache holds each client's text and leaf texts.
    The errors of leaf texts are the client's there too (the Parse of the core's own statement name)."""
    b = eq_lokadb_transaction_pool
    cases = [c for c in CASES if (c.has_org or c.name.startswith("error_")) and not c.setup
             and "prepared" in c.modes and not c.finding]
    assert sum(c.name.startswith("error_") for c in cases) >= 5
    with _conn(eq_db.port, EQ_DB) as direct, _conn(b.port, "app") as r1, _conn(b.port, "app") as r2:
        for org in (2, 1, 5, 2):
            for i, case in enumerate(cases):
                routed = r1 if (i + org) % 2 else r2
                what = f"[transaction pooling org={org}] {case.sql}"
                assert run_psycopg(case, routed, org, True)[0] == run_psycopg(case, direct, org, True)[0], what
    assert any("rewrite=leaf" in l for l in RouteLog(b).since(0))


def test_the_corpus_is_broad():
    """A guard for the corpus itself: most statements are shapes that must go to a leaf."""
    assert sum(1 for c in CASES if c.leaf is True) >= 40
    assert len(CASES) >= 60
