/* SPDX-License-Identifier: ISC */
/*
 * rewrite.c -- address a single-organization statement to its leaves.
 *
 * Two rewrites, both made on the protobuf tree of the statement and turned
 * back into text with pg_query_deparse_protobuf():
 *
 *   - leaf addressing: every occurrence of a LokaDB table becomes the leaf
 *     partition of the organization (same schema). The occurrence keeps its
 *     alias, or gets the table's own name as alias, so every column reference
 *     of the statement still resolves. The statement's own organization
 *     condition stays: the leaf holds only that organization, so the
 *     condition is true for every row of it and the result is the same; the
 *     planner just no longer has the parent's partitions to prune (and an
 *     ORDER BY ... LIMIT runs on the leaf).
 *   - COPY table TO: becomes COPY (SELECT cols FROM table-or-leaf AS table
 *     WHERE org_col = 'org') TO, options kept: the session's organization
 *     chose the rows.
 *
 * The caller (org_routing.c) decides when: only statements whose every
 * LokaDB occurrence is scoped to the same organization (analyze.c proves
 * the scoping), single-statement messages, and catalog-known leaves.
 * Statements with schema.table.column references are not rewritten (an
 * alias hides the table's real name).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#include "org_routing.h"

#define RW_MAX_CTES 64
#define RW_MAX_RVS 64

struct rw {
	const struct or_names *names;
	const char *ctes[RW_MAX_CTES];
	int nctes;
	PgQuery__RangeVar *rv[RW_MAX_RVS];
	const struct mc_table *t[RW_MAX_RVS];
	int nrv;
	bool overflow;
};

bool or_quote_literal(const char *text, char *buf, size_t len)
{
	size_t o = 0;

	if (len < 3)
		return false;
	buf[o++] = '\'';
	for (const char *p = text; *p; p++) {
		if (o + 3 >= len)
			return false;
		if (*p == '\'')
			buf[o++] = '\'';
		buf[o++] = *p;
	}
	buf[o++] = '\'';
	buf[o] = 0;
	return true;
}

/* "name" with quotes doubled; false if it does not fit. */
static bool quote_ident(const char *name, char *buf, size_t len)
{
	size_t o = 0;

	if (len < 3)
		return false;
	buf[o++] = '"';
	for (const char *p = name; *p; p++) {
		if (o + 3 >= len)
			return false;
		if (*p == '"')
			buf[o++] = '"';
		buf[o++] = *p;
	}
	buf[o++] = '"';
	buf[o] = 0;
	return true;
}

static void set_str(char **field, const char *v)
{
	if (*field && *field != protobuf_c_empty_string)
		free(*field);
	*field = strdup(v);
}

static bool collect_ctes(void *arg, ProtobufCMessage *m)
{
	struct rw *w = arg;

	if (m->descriptor == &pg_query__common_table_expr__descriptor) {
		if (w->nctes == RW_MAX_CTES) {
			w->overflow = true;
			return false;
		}
		w->ctes[w->nctes++] = ((PgQuery__CommonTableExpr *)m)->ctename;
	}
	return true;
}

static bool is_cte(const struct rw *w, const PgQuery__RangeVar *rv)
{
	if (rv->schemaname && *rv->schemaname)
		return false;
	for (int i = 0; i < w->nctes; i++)
		if (strcmp(w->ctes[i], rv->relname) == 0)
			return true;
	return false;
}

static bool collect_rvs(void *arg, ProtobufCMessage *m)
{
	struct rw *w = arg;
	PgQuery__RangeVar *rv;
	const struct mc_table *t;

	if (m->descriptor == &pg_query__into_clause__descriptor)
		return false;
	if (m->descriptor != &pg_query__range_var__descriptor)
		return true;
	rv = (PgQuery__RangeVar *)m;
	if (!rv->relname || is_cte(w, rv) || !(t = or_resolve(w->names, rv->schemaname, rv->relname)))
		return true;
	if (w->nrv == RW_MAX_RVS) {
		w->overflow = true;
		return false;
	}
	w->rv[w->nrv] = rv;
	w->t[w->nrv] = t;
	w->nrv++;
	return true;
}

/* Point rv at `leaf` of table t, keeping the name it is referred to by. */
static bool rename_rv(PgQuery__RangeVar *rv, const struct mc_table *t, const char *leaf)
{
	if (!rv->alias) {
		PgQuery__Alias *al = malloc(sizeof(*al));
		if (!al)
			return false;
		pg_query__alias__init(al);
		al->aliasname = strdup(rv->relname);
		rv->alias = al;
		if (!al->aliasname)
			return false;
	}
	set_str(&rv->schemaname, t->schema);
	set_str(&rv->relname, leaf);
	return rv->schemaname && rv->relname;
}

/* A name a leaf marker can carry: no double quote (the deparser would double it), no control byte. */
static bool markable(const char *name)
{
	for (const char *p = name; *p; p++)
		if (*p == '"' || (unsigned char)*p < 0x20)
			return false;
	return true;
}

/* The leaf marker of table t (see OR_LEAF_MARK); false: t's names cannot be carried. */
static bool leaf_marker(const struct mc_table *t, char *buf, size_t len)
{
	int n;

	if (!markable(t->schema) || !markable(t->name))
		return false;
	n = snprintf(buf, len, "%c%s%c%s%c", OR_LEAF_MARK, t->schema, OR_LEAF_SEP, t->name, OR_LEAF_END);
	return n > 0 && (size_t)n < len;
}

/* Every LokaDB occurrence to its leaf for `org`, or to its leaf marker
 * when org is NULL: OR_RW_NONE if one of them has none. */
static enum or_rw_result to_leaves(struct rw *w, ProtobufCMessage *stmt, const char *org)
{
	const char *leaf[RW_MAX_RVS];
	char mark[RW_MAX_RVS][2 * NAMEDATALEN_OR + 4];

	or_walk(stmt, collect_ctes, w);
	if (!w->overflow)
		or_walk(stmt, collect_rvs, w);
	if (w->overflow || w->nrv == 0)
		return OR_RW_NONE;
	for (int i = 0; i < w->nrv; i++) {
		if (org)
			leaf[i] = w->names->mc->leaf(w->t[i]->schema, w->t[i]->name, org);
		else
			leaf[i] = leaf_marker(w->t[i], mark[i], sizeof(mark[i])) ? mark[i] : NULL;
		if (!leaf[i])
			return OR_RW_NONE;
	}
	for (int i = 0; i < w->nrv; i++)
		if (!rename_rv(w->rv[i], w->t[i], leaf[i]))
			return OR_RW_FAILED;
	return OR_RW_DONE;
}

/* The SELECT a COPY table TO becomes, as text; NULL when it does not fit. */
static char *copy_select(const PgQuery__CopyStmt *cp, const struct mc_table *t, const char *rel,
			 const char *org)
{
	size_t cap = 256 + strlen(org) * 2 + strlen(rel) * 2 + strlen(t->schema) * 2 +
		     strlen(t->name) * 4 + strlen(t->org_column) * 2;
	char *s, q1[256], q2[256], q3[256], lit[256];
	size_t o;

	for (size_t i = 0; i < cp->n_attlist; i++) {
		const PgQuery__Node *n = cp->attlist[i];
		if (n->node_case != PG_QUERY__NODE__NODE_STRING)
			return NULL;
		cap += 2 * strlen(n->string->sval) + 4;
	}
	s = malloc(cap);
	if (!s)
		return NULL;
	o = (size_t)snprintf(s, cap, "SELECT ");
	for (size_t i = 0; i < cp->n_attlist; i++) {
		char q[256];
		if (!quote_ident(cp->attlist[i]->string->sval, q, sizeof(q)))
			goto fail;
		o += (size_t)snprintf(s + o, cap - o, "%s%s", i ? ", " : "", q);
	}
	if (cp->n_attlist == 0)
		o += (size_t)snprintf(s + o, cap - o, "*");
	if (!quote_ident(t->schema, q1, sizeof(q1)) || !quote_ident(rel, q2, sizeof(q2)) ||
	    !quote_ident(t->name, q3, sizeof(q3)) || !or_quote_literal(org, lit, sizeof(lit)))
		goto fail;
	o += (size_t)snprintf(s + o, cap - o, " FROM %s.%s AS %s WHERE %s.", q1, q2, q3, q3);
	if (!quote_ident(t->org_column, q1, sizeof(q1)))
		goto fail;
	snprintf(s + o, cap - o, "%s = %s", q1, lit);
	return s;
fail:
	free(s);
	return NULL;
}

/* COPY table TO -> COPY (SELECT ... WHERE org_col = 'org') TO. */
static enum or_rw_result copy_to_query(struct rw *w, PgQuery__CopyStmt *cp, const char *org, bool to_leaf)
{
	const struct mc_table *t = or_resolve(w->names, cp->relation->schemaname, cp->relation->relname);
	const char *leaf = NULL;
	PgQueryProtobufParseResult pr;
	PgQuery__ParseResult *sub;
	char *sql;

	if (!t)
		return OR_RW_NONE;
	if (to_leaf)
		leaf = w->names->mc->leaf(t->schema, t->name, org);
	sql = copy_select(cp, t, leaf ? leaf : t->name, org);
	if (!sql)
		return OR_RW_FAILED;
	pr = pg_query_parse_protobuf(sql);
	free(sql);
	if (pr.error) {
		pg_query_free_protobuf_parse_result(pr);
		return OR_RW_FAILED;
	}
	sub = pg_query__parse_result__unpack(NULL, pr.parse_tree.len, (const uint8_t *)pr.parse_tree.data);
	pg_query_free_protobuf_parse_result(pr);
	if (!sub || sub->n_stmts != 1) {
		if (sub)
			pg_query__parse_result__free_unpacked(sub, NULL);
		return OR_RW_FAILED;
	}
	cp->query = sub->stmts[0]->stmt;	/* stolen from sub */
	sub->stmts[0]->stmt = NULL;
	pg_query__parse_result__free_unpacked(sub, NULL);
	protobuf_c_message_free_unpacked(&cp->relation->base, NULL);
	cp->relation = NULL;
	for (size_t i = 0; i < cp->n_attlist; i++)
		protobuf_c_message_free_unpacked(&cp->attlist[i]->base, NULL);
	free(cp->attlist);
	cp->attlist = NULL;
	cp->n_attlist = 0;
	return OR_RW_DONE;
}

static enum or_rw_result deparse(PgQuery__ParseResult *tree, char **out, const char **err)
{
	size_t n = pg_query__parse_result__get_packed_size(tree);
	uint8_t *buf = malloc(n ? n : 1);
	PgQueryDeparseResult dr;
	PgQueryProtobuf pb;

	if (!buf) {
		*err = "out of memory";
		return OR_RW_FAILED;
	}
	pg_query__parse_result__pack(tree, buf);
	pb.len = n;
	pb.data = (char *)buf;
	dr = pg_query_deparse_protobuf(pb);
	free(buf);
	if (dr.error || !dr.query) {
		*err = "the deparser refused the statement";
		pg_query_free_deparse_result(dr);
		return OR_RW_FAILED;
	}
	*out = strdup(dr.query);
	pg_query_free_deparse_result(dr);
	if (!*out) {
		*err = "out of memory";
		return OR_RW_FAILED;
	}
	return OR_RW_DONE;
}

enum or_rw_result or_rewrite(const char *sql, const struct or_analysis *a, const struct or_names *names,
			     const char *org, bool to_leaf, char **out, const char **err)
{
	PgQueryProtobufParseResult pr;
	PgQuery__ParseResult *tree;
	PgQuery__Node *stmt;
	struct rw w;
	enum or_rw_result rc = OR_RW_NONE;

	*out = NULL;
	*err = "";
	if (a->nstmts != 1 || !a->stmts[0].rewritable || !names->mc)
		return OR_RW_NONE;
	if (!org && strchr(sql, OR_LEAF_MARK))
		return OR_RW_NONE;	/* the text itself holds the marker byte */
	pr = pg_query_parse_protobuf(sql);
	if (pr.error) {
		pg_query_free_protobuf_parse_result(pr);
		*err = "the statement does not parse";
		return OR_RW_FAILED;
	}
	tree = pg_query__parse_result__unpack(NULL, pr.parse_tree.len, (const uint8_t *)pr.parse_tree.data);
	pg_query_free_protobuf_parse_result(pr);
	if (!tree || tree->n_stmts != 1 || !tree->stmts[0]->stmt) {
		*err = "the statement does not unpack";
		rc = OR_RW_FAILED;
		goto done;
	}
	memset(&w, 0, sizeof(w));
	w.names = names;
	stmt = tree->stmts[0]->stmt;
	if (a->stmts[0].kind == OR_K_COPY_TO_TABLE && stmt->node_case == PG_QUERY__NODE__NODE_COPY_STMT &&
	    stmt->copy_stmt->relation)
		rc = org ? copy_to_query(&w, stmt->copy_stmt, org, to_leaf) : OR_RW_NONE;
	else if (to_leaf)
		rc = to_leaves(&w, &stmt->base, org);
	if (rc == OR_RW_FAILED)
		*err = "could not change the statement's tree";
	if (rc == OR_RW_DONE)
		rc = deparse(tree, out, err);
done:
	if (tree)
		pg_query__parse_result__free_unpacked(tree, NULL);
	return rc;
}
