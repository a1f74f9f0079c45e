/* SPDX-License-Identifier: ISC */
/*
 * rewrite.c -- address a single-organization statement to its leaves.
 *
 * Two rewrites:
 *
 *   - leaf addressing, made in the client's text itself: the name of every
 *     occurrence of a LokaDB table (found where libpg_query's parse tree
 *     says it starts, its parts read with the scanner) becomes the leaf
 *     partition of the organization (same schema), and an occurrence
 *     without an alias gets the name it was written with as one, so every
 *     column reference of the statement still resolves. Nothing else of the
 *     text changes: PostgreSQL parses the statement the client wrote, but
 *     for the relations. The statement's own organization condition stays:
 *     the leaf holds only that organization, so the condition is true for
 *     every row of it and the result is the same; the planner just no
 *     longer has the parent's partitions to prune (and an ORDER BY ...
 *     LIMIT runs on the leaf).
 *   - COPY table TO: becomes COPY (SELECT cols FROM table-or-leaf AS table
 *     WHERE org_col = 'org') TO, options kept: the session's organization
 *     chose the rows. Made on the protobuf tree and turned back into text
 *     with pg_query_deparse_protobuf().
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
	PgQuery__RangeVar *rv[RW_MAX_RVS];	/* every relation the statement names */
	const struct mc_table *t[RW_MAX_RVS];	/* ... its LokaDB table, or NULL */
	bool cte[RW_MAX_RVS];			/* ... a WITH query's name */
	int nrv;
	const PgQuery__RangeVar *ins[RW_MAX_RVS];	/* the INSERT targets */
	int nins;
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

	if (m->descriptor == &pg_query__into_clause__descriptor)
		return false;
	if (m->descriptor == &pg_query__insert_stmt__descriptor) {
		if (w->nins == RW_MAX_RVS) {
			w->overflow = true;
			return false;
		}
		w->ins[w->nins++] = ((PgQuery__InsertStmt *)m)->relation;
		return true;
	}
	if (m->descriptor != &pg_query__range_var__descriptor)
		return true;
	rv = (PgQuery__RangeVar *)m;
	if (!rv->relname)
		return true;
	if (w->nrv == RW_MAX_RVS) {
		w->overflow = true;
		return false;
	}
	w->rv[w->nrv] = rv;
	w->cte[w->nrv] = is_cte(w, rv);
	w->t[w->nrv] = w->cte[w->nrv] ? NULL : or_resolve(w->names, rv->schemaname, rv->relname);
	w->nrv++;
	return true;
}

/* A name a leaf marker can carry: no double quote (it goes inside one), no control byte. */
static bool markable(const char *name)
{
	for (const char *p = name; *p; p++)
		if (*p == '"' || (unsigned char)*p < 0x20)
			return false;
	return true;
}

/* The leaf marker of table t (see OR_LEAF_MARK), quoted, with the numbers
 * of its span; false: t's names cannot be carried. */
static bool leaf_marker(const struct mc_table *t, size_t pre, size_t post, size_t client, char *buf, size_t len)
{
	int n;

	if (!markable(t->schema) || !markable(t->name))
		return false;
	n = snprintf(buf, len, "\"%c%s%c%s%c%zu.%zu.%zu%c\"", OR_LEAF_MARK, t->schema, OR_LEAF_SEP, t->name,
		     OR_LEAF_SPAN, pre, post, client, OR_LEAF_END);
	return n > 0 && (size_t)n < len;
}

/* `name` as an identifier: bare when the scanner reads it as one plain
 * identifier of its own ([a-z_][a-z0-9_$]*, not a keyword), else quoted. */
static bool put_name(char *buf, size_t len, const char *name)
{
	size_t n = 0;
	bool bare = (*name >= 'a' && *name <= 'z') || *name == '_';
	struct or_tok *tk;

	for (const char *p = name; *p && bare; p++)
		bare = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '$';
	if (bare && (tk = or_scan_tokens(name, &n)) != NULL) {
		bare = n == 1 && tk[0].token == PG_QUERY__TOKEN__IDENT;
		free(tk);
	} else {
		bare = false;
	}
	if (bare)
		return snprintf(buf, len, "%s", name) < (int)len;
	return quote_ident(name, buf, len);
}

/* One occurrence to address to its leaf: its name as written is
 * text[from, to); an alias goes at `at` (after a `*`) unless it has one. */
struct edit {
	int rv;				/* w->rv[rv] */
	int64_t from, to, at;
	const char *leaf;		/* quoted or bare, ready to write */
	int alias;			/* 0: has one; 1: name it `as`; 2: ... with AS (an INSERT target) */
	int64_t as_from, as_to;		/* the last part of the name as written: the alias */
	char schema[2 * NAMEDATALEN_OR + 3];
};

static int edit_cmp(const void *a, const void *b)
{
	const struct edit *x = a, *y = b;

	return x->from < y->from ? -1 : x->from > y->from;
}

/* The token that starts at byte `at` (tokens in text order), or -1. */
static long tok_at(const struct or_tok *tk, size_t n, int64_t at)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (tk[mid].start < at)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && tk[lo].start == at ? (long)lo : -1;
}

/* Where the name of rv is in the text: e->from, to, at, as_from, as_to. */
static bool find_name(const struct or_tok *tk, size_t n, const PgQuery__RangeVar *rv, struct edit *e)
{
	int parts = 1 + (rv->schemaname && *rv->schemaname) + (rv->catalogname && *rv->catalogname);
	long k = tok_at(tk, n, rv->location);

	if (rv->location < 0 || k < 0)
		return false;
	e->from = tk[k].start;
	for (int p = 1; p < parts; p++) {
		if ((size_t)k + 2 >= n || tk[k + 1].token != PG_QUERY__TOKEN__ASCII_46)
			return false;
		k += 2;
	}
	e->to = e->at = tk[k].end;
	e->as_from = tk[k].start;
	e->as_to = tk[k].end;
	if ((size_t)k + 1 < n && tk[k + 1].token == PG_QUERY__TOKEN__ASCII_42)	/* documents * */
		e->at = tk[k + 1].end;
	return true;
}

/*
 * Every LokaDB occurrence to its leaf for `org`, or to its leaf marker when
 * org is NULL, in the text itself: only the names change, everything else
 * stays as the client wrote it (PostgreSQL parses what it would have
 * parsed). OR_RW_NONE if one of them has no leaf, or if the alias it needs
 * is the name of another relation of the statement written without one.
 */
static enum or_rw_result to_leaves(struct rw *w, ProtobufCMessage *stmt, const char *sql, const char *org,
				   char **out)
{
	struct edit e[RW_MAX_RVS];
	char mark[2 * NAMEDATALEN_OR + 72], leafq[RW_MAX_RVS][2 * NAMEDATALEN_OR + 3];
	struct or_tok *tk;
	size_t ntk, need, o, from;
	int ne = 0;
	char *s;

	or_walk(stmt, collect_ctes, w);
	if (!w->overflow)
		or_walk(stmt, collect_rvs, w);
	if (w->overflow)
		return OR_RW_NONE;
	for (int i = 0; i < w->nrv; i++) {
		const struct mc_table *t = w->t[i];
		const char *leaf;
		if (!t)
			continue;
		e[ne].alias = w->rv[i]->alias ? 0 : 1;
		for (int j = 0; j < w->nins; j++)
			if (w->ins[j] == w->rv[i] && e[ne].alias)
				e[ne].alias = 2;
		/* FROM public.documents, other.documents: PostgreSQL takes two
		 * relations without aliases, but not the alias documents next to
		 * other.documents (the same relation or a WITH query of that name
		 * in the same FROM would clash already) */
		for (int j = 0; e[ne].alias && j < w->nrv; j++)
			if (!w->rv[j]->alias && !w->cte[j] && w->t[j] != t &&
			    strcmp(w->rv[j]->relname, w->rv[i]->relname) == 0)
				return OR_RW_NONE;
		if (org) {
			if (!(leaf = w->names->mc->leaf(t->schema, t->name, org)) ||
			    !put_name(leafq[ne], sizeof(leafq[ne]), leaf))
				return OR_RW_NONE;
			e[ne].leaf = leafq[ne];
		} else {
			if (!markable(t->schema) || !markable(t->name))
				return OR_RW_NONE;
			e[ne].leaf = NULL;	/* its marker, written with its span's numbers */
		}
		if (!put_name(e[ne].schema, sizeof(e[ne].schema), t->schema))
			return OR_RW_NONE;
		e[ne].rv = i;
		ne++;
	}
	if (ne == 0)
		return OR_RW_NONE;
	if (!(tk = or_scan_tokens(sql, &ntk)))
		return OR_RW_FAILED;
	need = strlen(sql) + 1;
	for (int i = 0; i < ne; i++) {
		if (!find_name(tk, ntk, w->rv[e[i].rv], &e[i])) {
			free(tk);
			return OR_RW_FAILED;
		}
		need += strlen(e[i].schema) + 1 + (e[i].leaf ? strlen(e[i].leaf) : sizeof(mark)) + 4 +
			(size_t)(e[i].as_to - e[i].as_from) + 1;
	}
	free(tk);
	qsort(e, (size_t)ne, sizeof(e[0]), edit_cmp);
	for (int i = 1; i < ne; i++)
		if (e[i].from < e[i - 1].at)
			return OR_RW_FAILED;
	if (!(s = malloc(need)))
		return OR_RW_FAILED;
	o = from = 0;
	for (int i = 0; i < ne; i++) {
		const struct edit *x = &e[i];
		const char *sep = x->alias == 2 ? " AS " : " ", *leaf = x->leaf;
		size_t post = (size_t)(x->at - x->to) + (x->alias ? strlen(sep) + (size_t)(x->as_to - x->as_from) : 0);
		if (!leaf && !leaf_marker(w->t[x->rv], strlen(x->schema) + 1, post, (size_t)(x->at - x->from), mark,
					  sizeof(mark))) {
			free(s);
			return OR_RW_FAILED;
		}
		memcpy(s + o, sql + from, (size_t)x->from - from);
		o += (size_t)x->from - from;
		o += (size_t)sprintf(s + o, "%s.%s", x->schema, leaf ? leaf : mark);
		memcpy(s + o, sql + x->to, (size_t)(x->at - x->to));		/* a ` *` after the name */
		o += (size_t)(x->at - x->to);
		if (x->alias) {
			memcpy(s + o, sep, strlen(sep));
			o += strlen(sep);
			memcpy(s + o, sql + x->as_from, (size_t)(x->as_to - x->as_from));
			o += (size_t)(x->as_to - x->as_from);
		}
		from = (size_t)x->at;
	}
	strcpy(s + o, sql + from);
	*out = s;
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
	    stmt->copy_stmt->relation) {
		rc = org ? copy_to_query(&w, stmt->copy_stmt, org, to_leaf) : OR_RW_NONE;
		if (rc == OR_RW_FAILED)
			*err = "could not change the statement's tree";
		else if (rc == OR_RW_DONE)
			rc = deparse(tree, out, err);
	} else if (to_leaf) {
		rc = to_leaves(&w, &stmt->base, sql, org, out);
		if (rc == OR_RW_FAILED)
			*err = "could not find a table's name in the text";
	}
done:
	if (tree)
		pg_query__parse_result__free_unpacked(tree, NULL);
	return rc;
}
