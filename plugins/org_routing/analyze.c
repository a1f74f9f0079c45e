/* SPDX-License-Identifier: ISC */
/*
 * analyze.c -- what a statement text means for organization routing.
 *
 * or_analyze() parses a message text with libpg_query (protobuf form,
 * unpacked into protobuf-c structs) and records, per statement:
 *
 *   - every occurrence of a LokaDB table (a RangeVar resolved through the
 *     catalog of meta_cache, unqualified names along the session's
 *     search_path; names of CTEs are not tables);
 *   - for each occurrence, the organization terms that scope it: the
 *     constants and parameters its organization column is equal to in the
 *     statement (DESIGN §8: top-level AND-ed `org_col = const | $n` in WHERE
 *     and JOIN ... ON, propagated through `a.col = b.col` equalities, or the
 *     organization column of every INSERT VALUES row);
 *   - its effect on the session (SET/RESET lokadb.org, set_config, SET
 *     search_path, RESET ALL, DISCARD ALL, BEGIN, ROLLBACK).
 *
 * The walk over the tree is generic: protobuf-c descriptors give every
 * message field, so RangeVars are found wherever the grammar puts them
 * (FROM, JOIN, subqueries, CTEs, DML targets, COPY, EXPLAIN, DECLARE, LOCK,
 * TRUNCATE ...) without a case per node type. Only the "query levels"
 * (SELECT, INSERT, UPDATE, DELETE) are looked at structurally, to find the
 * equalities that scope the tables of their own FROM list.
 *
 * Soundness (what must stay true): a term is recorded for an occurrence
 * only if every row of that occurrence that can influence the result has
 * its organization column equal to the term. That is what lets rewrite.c
 * replace the table by the organization's leaf with identical results.
 * Hence: equalities under OR/NOT are ignored; the ON clause of an outer join
 * scopes only its nullable side; a FULL JOIN's ON scopes nothing; any limit
 * overflow drops terms (an occurrence without terms is "unscoped", which is
 * always safe).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#include "org_routing.h"

#define LV_MAX_ITEMS 32		/* FROM items of one query level we follow */
#define LV_MAX_NODES 64		/* distinct columns in equalities of one level */
#define LV_MAX_LINKS 64		/* term links of one level */
#define LV_MAX_OUTER 16		/* outer-join inheritances of one level */
#define AN_MAX_CTES 64
#define AN_MAX_REFNAMES 32	/* names of LokaDB table occurrences a whole row is looked for by */
#define AN_MAX_TYPELESS 16

typedef PgQuery__Node Node;

/* One FROM item of a query level. */
struct lv_item {
	PgQuery__RangeVar *rv;		/* NULL for subqueries, functions */
	const char *refname;		/* alias, or relation name */
	const struct mc_table *t;	/* LokaDB table, or NULL */
	int path;			/* position bits: which join sides it is under */
	bool hidden;			/* under a join with an alias: its name is not seen outside */
	bool renamed;			/* an alias with column names: its columns are not the table's */
};

/* A column in an equality: union-find node. */
struct lv_node {
	int item;
	const char *col;
	int parent;
};

struct lv_link {
	int node;
	struct or_term term;		/* value: into buf, or into the tree (both outlive the level) */
	char buf[16];
};

/* x (nullable side of an outer join) inherits the terms of y's class. */
struct lv_inherit {
	int x, y;
};

struct level {
	struct lv_item items[LV_MAX_ITEMS];
	int nitems;
	struct lv_node nodes[LV_MAX_NODES];
	int nnodes;
	struct lv_link links[LV_MAX_LINKS];
	int nlinks;
	struct lv_inherit inh[LV_MAX_OUTER];
	int ninh;
};

/* The state of one or_analyze() call. */
struct an {
	const struct or_names *names;
	struct or_analysis *a;
	const char *ctes[AN_MAX_CTES];
	int nctes;
	bool cte_overflow;
	const void **seen;		/* RangeVars already recorded (by a level) */
	int nseen, seencap;
	int refcap, termcap;
	bool oom;
	bool three_part_colref;		/* a ColumnRef schema.table.col: aliases would break it */
	bool guarded;			/* a parent has what a statement on its leaf would bypass (table_guard) */
	const void *top_insert;		/* the statement's INSERT target (a RangeVar), else NULL */
	bool top_insert_ref;		/* ... a LokaDB table: one of the statement's refs */
	/* the names the statement's LokaDB table occurrences are known by (alias, or relation name) */
	const char *refnames[AN_MAX_REFNAMES];
	int nrefnames;			/* > AN_MAX_REFNAMES: more than that (not followed) */
	const void *typeless[AN_MAX_TYPELESS];	/* ColumnRefs whose row type the result cannot show */
	int ntypeless;
	bool whole_row;			/* a LokaDB table's row as one value: its type is the leaf's there */
	struct or_stmt *st;		/* the statement being analyzed */
};

/* ================= small helpers ================= */

bool or_is_org_guc(const char *name)
{
	return name && strcasecmp(name, "lokadb.org") == 0;
}

static const char *str_of(const Node *n)
{
	if (n && n->node_case == PG_QUERY__NODE__NODE_STRING && n->string)
		return n->string->sval;
	return NULL;
}

static bool is_msg(const ProtobufCMessage *m, const ProtobufCMessageDescriptor *d)
{
	return m && m->descriptor == d;
}

static char *dup_or_oom(struct an *x, const char *s)
{
	char *d = strdup(s ? s : "");

	if (!d)
		x->oom = true;
	return d;
}

bool or_temps_has(const struct or_temps *t, const char *name, size_t len)
{
	for (int i = 0; t && i < t->n; i++)
		if (strlen(t->v[i].name) == len && memcmp(t->v[i].name, name, len) == 0)
			return true;
	return false;
}

const struct mc_table *or_resolve(const struct or_names *names, const char *schema, const char *rel)
{
	if (!names->mc || !rel || !*rel)
		return NULL;
	if (schema && *schema)
		return names->mc->table(schema, rel);
	if (or_temps_has(names->temps, rel, strlen(rel)))
		return NULL;	/* the session's temporary relation comes first */
	return names->mc->table_search(rel, names->search_path, names->user);
}

static bool is_cte_name(const struct an *x, const PgQuery__RangeVar *rv)
{
	if (rv->schemaname && *rv->schemaname)
		return false;
	for (int i = 0; i < x->nctes; i++)
		if (strcmp(x->ctes[i], rv->relname) == 0)
			return true;
	return false;
}

/*
 * Does t's parent have what a statement on its leaf would bypass, for
 * command `cmd` ('i', 'u', 'd'; 0: any statement that names it)?
 * meta_cache's table_guard: 'r' row-level security, 'a' a leaf with other
 * privileges than the parent, for every statement; 'i', 'u', 'd' rules or
 * statement-level triggers of that command.
 */
static void table_guard(struct an *x, const struct mc_table *t, char cmd)
{
	const struct meta_cache_api *mc = x->names->mc;
	const char *g;

	if (!t || mc->size < offsetof(struct meta_cache_api, table_guard) + sizeof(mc->table_guard) ||
	    !mc->table_guard || !(g = mc->table_guard(t)))
		return;
	if (strchr(g, 'r') || strchr(g, 'a') || (cmd && strchr(g, cmd)))
		x->guarded = true;
}

/* The LokaDB table a RangeVar names, or NULL (not one, or a CTE). */
static const struct mc_table *rv_table(const struct an *x, const PgQuery__RangeVar *rv)
{
	if (!rv || !rv->relname || is_cte_name(x, rv))
		return NULL;
	if (x->cte_overflow && !(rv->schemaname && *rv->schemaname))
		return NULL;	/* cannot tell a CTE from a table: leave it unscoped... as a non-table */
	return or_resolve(x->names, rv->schemaname, rv->relname);
}

/* ================= the generic walk ================= */

/*
 * Call fn(arg, m), then (if it returned true) fn on every message below m,
 * in field order (pre-order). Oneof fields (the Node union) are followed
 * only for the case that is set.
 */
void or_walk(ProtobufCMessage *m, or_visit_fn fn, void *arg)
{
	const ProtobufCMessageDescriptor *d;

	if (!m || !fn(arg, m))
		return;
	d = m->descriptor;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char *base = (char *)m;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)(base + f->quantifier_offset) != f->id)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			ProtobufCMessage **v = *(ProtobufCMessage ***)(base + f->offset);
			for (size_t j = 0; j < n && v; j++)
				or_walk(v[j], fn, arg);
		} else {
			or_walk(*(ProtobufCMessage **)(base + f->offset), fn, arg);
		}
	}
}

static bool collect_ctes(void *arg, ProtobufCMessage *m)
{
	struct an *x = arg;

	if (is_msg(m, &pg_query__common_table_expr__descriptor)) {
		PgQuery__CommonTableExpr *cte = (PgQuery__CommonTableExpr *)m;
		if (x->nctes < AN_MAX_CTES)
			x->ctes[x->nctes++] = cte->ctename;
		else
			x->cte_overflow = true;
	}
	return true;
}

/* ================= refs and terms ================= */

static int add_term(struct an *x, const struct or_term *t)
{
	struct or_analysis *a = x->a;

	if (a->nterms == x->termcap) {
		int cap = x->termcap ? x->termcap * 2 : 8;
		struct or_term *v = realloc(a->terms, sizeof(*v) * (size_t)cap);
		if (!v) {
			x->oom = true;
			return -1;
		}
		a->terms = v;
		x->termcap = cap;
	}
	a->terms[a->nterms].param = t->param;
	a->terms[a->nterms].value = t->param ? NULL : dup_or_oom(x, t->value);
	if (t->param)
		a->params = true;
	return a->nterms++;
}

static bool seen_before(struct an *x, const void *rv)
{
	for (int i = 0; i < x->nseen; i++)
		if (x->seen[i] == rv)
			return true;
	return false;
}

static void mark_seen(struct an *x, const void *rv)
{
	if (x->nseen == x->seencap) {
		int cap = x->seencap ? x->seencap * 2 : 16;
		const void **v = realloc(x->seen, sizeof(*v) * (size_t)cap);
		if (!v) {
			x->oom = true;
			return;
		}
		x->seen = v;
		x->seencap = cap;
	}
	x->seen[x->nseen++] = rv;
}

/* Record an occurrence of LokaDB table t; its terms are added right after. */
/* The name a LokaDB table occurrence is known by in its statement (whole_row_visit). */
static void note_refname(struct an *x, const PgQuery__RangeVar *rv)
{
	const char *name = rv->alias && rv->alias->aliasname ? rv->alias->aliasname : rv->relname;

	if (x->nrefnames < AN_MAX_REFNAMES && name)
		x->refnames[x->nrefnames] = name;
	x->nrefnames++;
}

static struct or_ref *add_ref(struct an *x, const struct mc_table *t, const void *rv)
{
	struct or_analysis *a = x->a;
	struct or_ref *r;

	if (a->nrefs == x->refcap) {
		int cap = x->refcap ? x->refcap * 2 : 4;
		struct or_ref *v = realloc(a->refs, sizeof(*v) * (size_t)cap);
		if (!v) {
			x->oom = true;
			return NULL;
		}
		a->refs = v;
		x->refcap = cap;
	}
	r = &a->refs[a->nrefs++];
	memset(r, 0, sizeof(*r));
	r->schema = dup_or_oom(x, t->schema);
	r->name = dup_or_oom(x, t->name);
	r->org_column = dup_or_oom(x, t->org_column);
	r->org_type = dup_or_oom(x, t->org_type);
	r->term0 = a->nterms;
	x->st->nrefs++;
	a->tables = true;
	mark_seen(x, rv);
	note_refname(x, rv);
	return r;
}

/* ================= operands of equalities ================= */

enum opnd_kind { OP_OTHER, OP_COL, OP_TERM };

struct opnd {
	enum opnd_kind kind;
	const char *qual, *qual2;	/* ColumnRef qualifiers (table, or schema + table) */
	const char *col;
	struct or_term term;		/* value: into num (integers) or into the tree */
	char num[16];
};

/* A constant's text: integers printed, strings and numerics as written. */
static bool const_text(const PgQuery__AConst *c, char *buf, size_t len, const char **out)
{
	if (c->isnull)
		return false;
	switch (c->val_case) {
	case PG_QUERY__A__CONST__VAL_IVAL:
		snprintf(buf, len, "%d", c->ival ? c->ival->ival : 0);
		*out = buf;
		return true;
	case PG_QUERY__A__CONST__VAL_FVAL:
		*out = c->fval ? c->fval->fval : NULL;
		return *out != NULL;
	case PG_QUERY__A__CONST__VAL_SVAL:
		*out = c->sval ? c->sval->sval : NULL;
		return *out != NULL;
	default:
		return false;
	}
}

/*
 * A cast that keeps the value an organization id is written with: to an
 * integer type, text, varchar or uuid, without a length. Others may change
 * it (5::bool::int is 1, '12'::char(1) is '1', 2.7::int is 3).
 */
static bool cast_keeps_value(const PgQuery__TypeName *tn)
{
	static const char *const keep[] = { "int2", "int4", "int8", "text", "varchar", "uuid" };
	const Node *last;

	if (!tn || tn->n_names == 0 || tn->n_typmods || tn->n_array_bounds || tn->setof || tn->pct_type)
		return false;
	last = tn->names[tn->n_names - 1];
	if (last->node_case != PG_QUERY__NODE__NODE_STRING || !last->string->sval)
		return false;
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		if (strcmp(last->string->sval, keep[i]) == 0)
			return true;
	return false;
}

/* Classify an operand (integer constants are printed into o->num). */
static void classify(const Node *n, struct opnd *o)
{
	memset(o, 0, sizeof(*o));
	if (!n)
		return;
	switch (n->node_case) {
	case PG_QUERY__NODE__NODE_TYPE_CAST:
		if (n->type_cast->arg && n->type_cast->arg->node_case != PG_QUERY__NODE__NODE_COLUMN_REF &&
		    cast_keeps_value(n->type_cast->type_name))
			classify(n->type_cast->arg, o);
		return;
	case PG_QUERY__NODE__NODE_PARAM_REF:
		if (n->param_ref->number > 0) {
			o->kind = OP_TERM;
			o->term.param = n->param_ref->number;
		}
		return;
	case PG_QUERY__NODE__NODE_A_CONST: {
		const char *v;
		if (const_text(n->a_const, o->num, sizeof(o->num), &v)) {
			o->kind = OP_TERM;
			o->term.value = (char *)v;
		}
		return;
	}
	case PG_QUERY__NODE__NODE_COLUMN_REF: {
		const PgQuery__ColumnRef *cr = n->column_ref;
		size_t k = cr->n_fields;
		if (k < 1 || k > 3 || !str_of(cr->fields[k - 1]))
			return;		/* a.* or something odd */
		o->kind = OP_COL;
		o->col = str_of(cr->fields[k - 1]);
		o->qual = k >= 2 ? str_of(cr->fields[k - 2]) : NULL;
		o->qual2 = k == 3 ? str_of(cr->fields[0]) : NULL;
		return;
	}
	default:
		return;
	}
}

/* ================= one query level ================= */

struct eq_scope {
	bool outer;
	int nullable_mask, nullable_bits;
	/* the ON of a join: the items under it are (path & in_mask) == in_path
	 * with one of in_bits; in_bits 0: WHERE, every item */
	int in_mask, in_path, in_bits;
};

/* Does the qualification of scope sc see item i's columns unqualified? */
static bool in_scope(const struct lv_item *it, const struct eq_scope *sc)
{
	return !sc->in_bits || ((it->path & sc->in_mask) == sc->in_path && (it->path & sc->in_bits));
}

/* The item a qualified column belongs to, or -1. */
static int item_by_qual(const struct level *lv, const char *schema, const char *qual, const struct eq_scope *sc)
{
	for (int i = 0; i < lv->nitems; i++) {
		const struct lv_item *it = &lv->items[i];
		if (!it->refname || strcmp(it->refname, qual) != 0)
			continue;
		if (it->hidden && !(sc->in_bits && in_scope(it, sc)))
			continue;	/* (a JOIN b ON ...) AS j: a and b are names only in that ON */
		if (schema && (!it->rv || !it->rv->schemaname || strcmp(it->rv->schemaname, schema) != 0) &&
		    !(it->t && strcmp(it->t->schema, schema) == 0))
			continue;
		return i;
	}
	return -1;
}

/*
 * The node of a column (created on first use), or -1 when it does not
 * belong to an item of this level. An unqualified column is the
 * organization column of the only LokaDB item the qualification sees (the
 * level's, or those under the join whose ON it is) that has a column of
 * that name (PostgreSQL refuses the statement when the name is ambiguous,
 * so picking the only candidate is right whenever it runs). Not a column
 * of an item whose alias renames its columns.
 */
static int node_of(struct level *lv, const struct opnd *o, const struct eq_scope *sc)
{
	int item = -1;

	if (o->qual) {
		item = item_by_qual(lv, o->qual2, o->qual, sc);
	} else {
		for (int i = 0; i < lv->nitems; i++) {
			if (lv->items[i].t && in_scope(&lv->items[i], sc) &&
			    strcmp(lv->items[i].t->org_column, o->col) == 0) {
				if (item >= 0)
					return -1;
				item = i;
			}
		}
	}
	if (item < 0 || lv->items[item].renamed)
		return -1;
	for (int i = 0; i < lv->nnodes; i++)
		if (lv->nodes[i].item == item && strcmp(lv->nodes[i].col, o->col) == 0)
			return i;
	if (lv->nnodes == LV_MAX_NODES)
		return -1;
	lv->nodes[lv->nnodes] = (struct lv_node){ item, o->col, lv->nnodes };
	return lv->nnodes++;
}

static int find(struct level *lv, int n)
{
	while (lv->nodes[n].parent != n) {
		lv->nodes[n].parent = lv->nodes[lv->nodes[n].parent].parent;
		n = lv->nodes[n].parent;
	}
	return n;
}

static void unite(struct level *lv, int a, int b)
{
	a = find(lv, a);
	b = find(lv, b);
	if (a != b)
		lv->nodes[a].parent = b;
}

/* Attach a term to a node; a short value is copied (it may live in an operand). */
static void link_term(struct level *lv, int node, const struct or_term *t)
{
	struct lv_link *l;

	if (node < 0 || lv->nlinks == LV_MAX_LINKS)
		return;
	l = &lv->links[lv->nlinks++];
	l->node = node;
	l->term = *t;
	if (t->value && strlen(t->value) < sizeof(l->buf)) {
		memcpy(l->buf, t->value, strlen(t->value) + 1);
		l->term.value = l->buf;
	}
}

/* Is `op` (the name list of an A_Expr) the operator "="? */
static bool is_eq(const PgQuery__AExpr *e)
{
	return e->n_name == 1 && str_of(e->name[0]) && strcmp(str_of(e->name[0]), "=") == 0;
}

/*
 * One equality of a WHERE or inner-join ON (symmetric: both columns are
 * equal in every row that gets through) or of an outer join's ON (scope:
 * `nullable` is the path mask of the nullable side; constants bind only
 * nullable items, column pairs make the nullable one inherit).
 */
static bool item_nullable(const struct level *lv, int node, const struct eq_scope *sc)
{
	return (lv->items[lv->nodes[node].item].path & sc->nullable_mask) == sc->nullable_bits;
}

static void equality(struct level *lv, const Node *l, const Node *r, const struct eq_scope *sc)
{
	struct opnd a, b;

	classify(l, &a);
	classify(r, &b);
	if (a.kind == OP_TERM && b.kind == OP_COL) {
		struct opnd t = a;
		a = b;
		b = t;
		if (b.term.value == a.num)
			b.term.value = b.num;	/* the swap moved the text */
	}
	if (a.kind != OP_COL)
		return;
	if (b.kind == OP_TERM) {
		int n = node_of(lv, &a, sc);
		if (n >= 0 && (!sc->outer || item_nullable(lv, n, sc)))
			link_term(lv, n, &b.term);
	} else if (b.kind == OP_COL) {
		int na = node_of(lv, &a, sc), nb = node_of(lv, &b, sc);
		if (na < 0 || nb < 0)
			return;
		if (!sc->outer) {
			unite(lv, na, nb);
			return;
		}
		if (lv->ninh == LV_MAX_OUTER)
			return;
		if (item_nullable(lv, na, sc) && !item_nullable(lv, nb, sc))
			lv->inh[lv->ninh++] = (struct lv_inherit){ na, nb };
		else if (item_nullable(lv, nb, sc) && !item_nullable(lv, na, sc))
			lv->inh[lv->ninh++] = (struct lv_inherit){ nb, na };
		else if (item_nullable(lv, na, sc) && item_nullable(lv, nb, sc))
			unite(lv, na, nb);
	}
}

/* The top-level AND-ed equalities of a qualification. */
static void quals(struct level *lv, const Node *q, const struct eq_scope *sc)
{
	if (!q)
		return;
	if (q->node_case == PG_QUERY__NODE__NODE_BOOL_EXPR &&
	    q->bool_expr->boolop == PG_QUERY__BOOL_EXPR_TYPE__AND_EXPR) {
		for (size_t i = 0; i < q->bool_expr->n_args; i++)
			quals(lv, q->bool_expr->args[i], sc);
		return;
	}
	if (q->node_case != PG_QUERY__NODE__NODE_A_EXPR)
		return;
	const PgQuery__AExpr *e = q->a_expr;
	if (e->kind == PG_QUERY__A__EXPR__KIND__AEXPR_OP && is_eq(e)) {
		equality(lv, e->lexpr, e->rexpr, sc);
	} else if (e->kind == PG_QUERY__A__EXPR__KIND__AEXPR_IN && is_eq(e) && e->rexpr &&
		   e->rexpr->node_case == PG_QUERY__NODE__NODE_LIST && e->rexpr->list->n_items == 1) {
		equality(lv, e->lexpr, e->rexpr->list->items[0], sc);
	}
}

static void add_item(struct an *x, struct level *lv, const Node *n, int path)
{
	struct lv_item *it;

	if (lv->nitems == LV_MAX_ITEMS)
		return;
	it = &lv->items[lv->nitems];
	memset(it, 0, sizeof(*it));
	it->path = path;
	if (n->node_case == PG_QUERY__NODE__NODE_RANGE_VAR) {
		it->rv = n->range_var;
		it->refname = it->rv->alias && it->rv->alias->aliasname ? it->rv->alias->aliasname
									: it->rv->relname;
		it->t = rv_table(x, it->rv);
		it->renamed = it->rv->alias && it->rv->alias->n_colnames > 0;
	} else if (n->node_case == PG_QUERY__NODE__NODE_RANGE_SUBSELECT && n->range_subselect->alias) {
		it->refname = n->range_subselect->alias->aliasname;
	} else if (n->node_case == PG_QUERY__NODE__NODE_RANGE_FUNCTION && n->range_function->alias) {
		it->refname = n->range_function->alias->aliasname;
	}
	lv->nitems++;
}

/*
 * A FROM item: tables become items; a join's ON is remembered with the
 * scope it has. `path` grows by two bits per join level (01: under the left
 * side, 10: under the right side), so an outer join can tell its nullable
 * side. Deeper than 15 joins, items are still found but outer-join scopes
 * are not used (conservative).
 */
struct pending_on {
	const Node *q;
	struct eq_scope sc;
};

struct from_walk {
	struct pending_on on[LV_MAX_OUTER * 2];
	int non;
	bool usable;
};

static void from_item(struct an *x, struct level *lv, const Node *n, int path, int depth,
		      struct from_walk *fw)
{
	const PgQuery__JoinExpr *j;
	int lbit, rbit, first = lv->nitems;

	if (!n)
		return;
	if (n->node_case != PG_QUERY__NODE__NODE_JOIN_EXPR) {
		add_item(x, lv, n, path);
		return;
	}
	j = n->join_expr;
	/* deeper than 15: the sides keep their parent's path (no bits left) */
	lbit = depth < 15 ? 1 << (2 * depth) : 0;
	rbit = depth < 15 ? 2 << (2 * depth) : 0;
	fw->usable = fw->usable && depth < 15;
	from_item(x, lv, j->larg, path | lbit, depth + !!lbit, fw);
	from_item(x, lv, j->rarg, path | rbit, depth + !!rbit, fw);
	for (int i = first; j->alias && i < lv->nitems; i++)
		lv->items[i].hidden = true;
	if (!lbit || !j->quals || fw->non == (int)(sizeof(fw->on) / sizeof(fw->on[0])))
		return;
	struct pending_on *p = &fw->on[fw->non];
	p->q = j->quals;
	p->sc.outer = j->jointype != PG_QUERY__JOIN_TYPE__JOIN_INNER;
	p->sc.in_mask = lbit - 1;
	p->sc.in_path = path;
	p->sc.in_bits = lbit | rbit;
	p->sc.nullable_mask = lbit | rbit;
	switch (j->jointype) {
	case PG_QUERY__JOIN_TYPE__JOIN_INNER:
		break;
	case PG_QUERY__JOIN_TYPE__JOIN_LEFT:
		p->sc.nullable_bits = rbit;
		break;
	case PG_QUERY__JOIN_TYPE__JOIN_RIGHT:
		p->sc.nullable_bits = lbit;
		break;
	default:
		return;		/* FULL (and anything else): its ON scopes nothing */
	}
	fw->non++;
}

/* The terms of every node's class, after all equalities are in. */
static void class_terms(struct level *lv, int node, const struct or_term **out, int *n, int max)
{
	int root = find(lv, node);

	for (int i = 0; i < lv->nlinks && *n < max; i++)
		if (find(lv, lv->links[i].node) == root)
			out[(*n)++] = &lv->links[i].term;
}

/*
 * Outer joins: a nullable item equal to a preserved one gets the preserved
 * class's terms (every row of it that survives matched such a row).
 */
static void apply_inherits(struct level *lv)
{
	for (int k = 0; k < lv->ninh; k++) {
		const struct or_term *t[LV_MAX_LINKS];
		int n = 0;
		class_terms(lv, lv->inh[k].y, t, &n, LV_MAX_LINKS);
		for (int i = 0; i < n; i++) {
			struct or_term copy = *t[i];
			link_term(lv, lv->inh[k].x, &copy);
		}
	}
}

/* Record the level's LokaDB items with the terms of their organization column. */
static void record_items(struct an *x, struct level *lv)
{
	for (int i = 0; i < lv->nitems && !x->oom; i++) {
		const struct lv_item *it = &lv->items[i];
		const struct or_term *t[LV_MAX_LINKS];
		int n = 0, node = -1;
		struct or_ref *r;

		if (!it->t || seen_before(x, it->rv))
			continue;
		for (int k = 0; k < lv->nnodes; k++)
			if (lv->nodes[k].item == i && strcmp(lv->nodes[k].col, it->t->org_column) == 0)
				node = k;
		if (!add_ref(x, it->t, it->rv))
			return;
		if (node >= 0)
			class_terms(lv, node, t, &n, LV_MAX_LINKS);
		for (int k = 0; k < n; k++)
			add_term(x, t[k]);
		r = &x->a->refs[x->a->nrefs - 1];
		r->nterms = x->a->nterms - r->term0;
	}
}

/* FROM list + WHERE of a SELECT, UPDATE (FROM) or DELETE (USING). */
static void level_from_where(struct an *x, struct level *lv, Node **from, size_t nfrom, const Node *where)
{
	struct from_walk fw = { .non = 0, .usable = true };
	struct eq_scope inner = { 0 };

	for (size_t i = 0; i < nfrom; i++)
		from_item(x, lv, from[i], 0, 0, &fw);
	quals(lv, where, &inner);
	for (int i = 0; i < fw.non; i++)
		if (!fw.on[i].sc.outer)
			quals(lv, fw.on[i].q, &fw.on[i].sc);
	for (int i = 0; i < fw.non && fw.usable; i++)
		if (fw.on[i].sc.outer)
			quals(lv, fw.on[i].q, &fw.on[i].sc);
	apply_inherits(lv);
}

/* Terms of an INSERT target: the organization column of every VALUES row. */
static void insert_terms(struct an *x, const PgQuery__InsertStmt *ins, const struct mc_table *t)
{
	const PgQuery__SelectStmt *sel;
	size_t col = (size_t)-1;

	for (size_t i = 0; i < ins->n_cols; i++) {
		const Node *c = ins->cols[i];
		if (c->node_case == PG_QUERY__NODE__NODE_RES_TARGET && c->res_target->name &&
		    strcmp(c->res_target->name, t->org_column) == 0 && c->res_target->n_indirection == 0)
			col = i;
	}
	if (col == (size_t)-1 || !ins->select_stmt || ins->select_stmt->node_case != PG_QUERY__NODE__NODE_SELECT_STMT)
		return;
	sel = ins->select_stmt->select_stmt;
	if (sel->n_values_lists == 0)
		return;		/* INSERT ... SELECT: unscoped (not followed in this version) */
	int first = x->a->nterms;
	for (size_t i = 0; i < sel->n_values_lists; i++) {
		const Node *row = sel->values_lists[i];
		struct opnd o;
		if (!row || row->node_case != PG_QUERY__NODE__NODE_LIST || row->list->n_items <= col)
			goto unscoped;
		classify(row->list->items[col], &o);
		if (o.kind != OP_TERM)
			goto unscoped;
		add_term(x, &o.term);
	}
	return;
unscoped:
	for (int i = first; i < x->a->nterms; i++)
		free(x->a->terms[i].value);
	x->a->nterms = first;
}

static void level_insert(struct an *x, PgQuery__InsertStmt *ins)
{
	const struct mc_table *t = rv_table(x, ins->relation);
	struct or_ref *r;

	if (!t || seen_before(x, ins->relation))
		return;
	/* ON CONFLICT (cols) / ON CONSTRAINT needs a unique index of the table
	 * it names: a leaf has one, a LokaDB parent none (PostgreSQL: 42P10).
	 * On the leaf it would work for isolated organizations only. */
	if (ins->on_conflict_clause && ins->on_conflict_clause->infer)
		x->st->rewritable = false;
	r = add_ref(x, t, ins->relation);
	if (!r)
		return;
	if ((const void *)ins->relation == x->top_insert)
		x->top_insert_ref = true;
	insert_terms(x, ins, t);
	r = &x->a->refs[x->a->nrefs - 1];
	r->nterms = x->a->nterms - r->term0;
}

/* Does an UPDATE's SET list assign the organization column of its target? */
static bool sets_org_column(const PgQuery__UpdateStmt *u, const struct mc_table *t)
{
	for (size_t i = 0; i < u->n_target_list; i++) {
		const Node *n = u->target_list[i];
		if (n->node_case == PG_QUERY__NODE__NODE_RES_TARGET && n->res_target->name &&
		    strcmp(n->res_target->name, t->org_column) == 0)
			return true;
	}
	return false;
}

/* UPDATE/DELETE: the target is item 0 of the level, then FROM / USING. */
static void level_dml(struct an *x, PgQuery__RangeVar *rel, Node **from, size_t nfrom, const Node *where)
{
	struct level *lv = calloc(1, sizeof(*lv));
	Node target = PG_QUERY__NODE__INIT;

	if (!lv) {
		x->oom = true;
		return;
	}
	target.node_case = PG_QUERY__NODE__NODE_RANGE_VAR;
	target.range_var = rel;
	add_item(x, lv, &target, 0);
	level_from_where(x, lv, from, nfrom, where);
	record_items(x, lv);
	free(lv);
}

static void level_select(struct an *x, PgQuery__SelectStmt *s)
{
	struct level *lv;

	if (s->n_from_clause == 0)
		return;
	lv = calloc(1, sizeof(*lv));
	if (!lv) {
		x->oom = true;
		return;
	}
	level_from_where(x, lv, s->from_clause, s->n_from_clause, s->where_clause);
	record_items(x, lv);
	free(lv);
}

/*
 * The visitor of the main walk: query levels first (pre-order: a level is
 * seen before the RangeVars of its FROM list), then every RangeVar not
 * recorded by a level (COPY, LOCK, TRUNCATE, ...) as an unscoped occurrence.
 */
static bool visit(void *arg, ProtobufCMessage *m)
{
	struct an *x = arg;
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (d == &pg_query__select_stmt__descriptor) {
		level_select(x, (PgQuery__SelectStmt *)m);
	} else if (d == &pg_query__insert_stmt__descriptor) {
		PgQuery__InsertStmt *ins = (PgQuery__InsertStmt *)m;
		const struct mc_table *t = rv_table(x, ins->relation);
		table_guard(x, t, 'i');
		if (ins->on_conflict_clause &&
		    ins->on_conflict_clause->action == PG_QUERY__ON_CONFLICT_ACTION__ONCONFLICT_UPDATE)
			table_guard(x, t, 'u');		/* its UPDATE triggers fire too */
		level_insert(x, ins);
	} else if (d == &pg_query__update_stmt__descriptor) {
		PgQuery__UpdateStmt *u = (PgQuery__UpdateStmt *)m;
		const struct mc_table *t = rv_table(x, u->relation);
		if (t && sets_org_column(u, t))
			x->st->rewritable = false;	/* it may move rows to another organization */
		table_guard(x, t, 'u');
		level_dml(x, u->relation, u->from_clause, u->n_from_clause, u->where_clause);
	} else if (d == &pg_query__delete_stmt__descriptor) {
		PgQuery__DeleteStmt *del = (PgQuery__DeleteStmt *)m;
		table_guard(x, rv_table(x, del->relation), 'd');
		level_dml(x, del->relation, del->using_clause, del->n_using_clause, del->where_clause);
	} else if (d == &pg_query__into_clause__descriptor) {
		return false;		/* SELECT INTO / CREATE TABLE AS: a new table, not a read */
	} else if (d == &pg_query__param_ref__descriptor) {
		if (((PgQuery__ParamRef *)m)->number > x->a->max_param)
			x->a->max_param = ((PgQuery__ParamRef *)m)->number;
	} else if (d == &pg_query__column_ref__descriptor) {
		if (((PgQuery__ColumnRef *)m)->n_fields >= 3)
			x->three_part_colref = true;
	} else if (d == &pg_query__range_var__descriptor) {
		PgQuery__RangeVar *rv = (PgQuery__RangeVar *)m;
		const struct mc_table *t = rv_table(x, rv);
		if (t && !rv->inh)
			x->st->rewritable = false;	/* ONLY parent reads no partition: a leaf would */
		table_guard(x, t, 0);
		if (t && !seen_before(x, rv))
			add_ref(x, t, rv);
	}
	return !x->oom;
}

static bool is_refname(const struct an *x, const char *name)
{
	if (x->nrefnames > AN_MAX_REFNAMES)
		return true;	/* not followed: taken for one */
	for (int i = 0; i < x->nrefnames; i++)
		if (strcmp(x->refnames[i], name) == 0)
			return true;
	return false;
}

/* A ColumnRef whose row type the result cannot show (whole_row_visit): noted on its parent node. */
static void typeless(struct an *x, const Node *n)
{
	if (n && n->node_case == PG_QUERY__NODE__NODE_COLUMN_REF && x->ntypeless < AN_MAX_TYPELESS)
		x->typeless[x->ntypeless++] = n->column_ref;
}

/* pg_catalog functions whose result is the same for a row of any type with the same columns. */
static bool typeless_function(const PgQuery__FuncCall *f)
{
	static const char *const names[] = {
		"to_json", "to_jsonb", "row_to_json", "json_agg", "jsonb_agg", "json_build_object",
		"jsonb_build_object", "json_build_array", "jsonb_build_array", "json_object_agg",
		"jsonb_object_agg", "count", "num_nulls", "num_nonnulls",
	};
	const char *name, *schema = NULL;

	if (f->n_funcname == 2)
		schema = str_of(f->funcname[0]);
	else if (f->n_funcname != 1)
		return false;
	name = str_of(f->funcname[f->n_funcname - 1]);
	if (!name || (schema && strcmp(schema, "pg_catalog") != 0))
		return false;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i]) == 0)
			return true;
	return false;
}

/*
 * A LokaDB table's row as one value (`d`, `d.*` other than as a target
 * list's entry, which expands into the columns). PostgreSQL gives it the
 * row type of the relation scanned, on a leaf the leaf's: `pg_typeof(d)`,
 * and the column type of `SELECT d` or `RETURNING documents` in
 * RowDescription would differ. Such a statement stays on the parent,
 * unless each such value is only cast, tested for NULL, a field taken of
 * it (`(d).title`), or given to a function that shows no type
 * (`row_to_json(d)`, `count(d)`, typeless_function). A column that has
 * the name of an occurrence is taken for its row: that only keeps a
 * statement on the parent.
 */
static bool whole_row_visit(void *arg, ProtobufCMessage *m)
{
	struct an *x = arg;
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (d == &pg_query__res_target__descriptor) {
		const PgQuery__ResTarget *rt = (const PgQuery__ResTarget *)m;
		if (rt->val && rt->val->node_case == PG_QUERY__NODE__NODE_COLUMN_REF) {
			const PgQuery__ColumnRef *cr = rt->val->column_ref;
			if (cr->n_fields && cr->fields[cr->n_fields - 1]->node_case == PG_QUERY__NODE__NODE_A_STAR)
				typeless(x, rt->val);	/* `d.*`: the columns */
		}
	} else if (d == &pg_query__type_cast__descriptor) {
		typeless(x, ((const PgQuery__TypeCast *)m)->arg);
	} else if (d == &pg_query__null_test__descriptor) {
		typeless(x, ((const PgQuery__NullTest *)m)->arg);
	} else if (d == &pg_query__a__indirection__descriptor) {
		const PgQuery__AIndirection *ind = (const PgQuery__AIndirection *)m;
		if (ind->n_indirection && str_of(ind->indirection[0]))
			typeless(x, ind->arg);	/* (d).title */
	} else if (d == &pg_query__func_call__descriptor) {
		const PgQuery__FuncCall *f = (const PgQuery__FuncCall *)m;
		if (typeless_function(f))
			for (size_t i = 0; i < f->n_args; i++)
				typeless(x, f->args[i]);
	} else if (d == &pg_query__column_ref__descriptor) {
		const PgQuery__ColumnRef *cr = (const PgQuery__ColumnRef *)m;
		const char *name = NULL;
		for (int i = 0; i < x->ntypeless; i++)
			if (x->typeless[i] == cr)
				return true;
		if (cr->n_fields == 1)
			name = str_of(cr->fields[0]);
		else if (cr->n_fields == 2 && cr->fields[1]->node_case == PG_QUERY__NODE__NODE_A_STAR)
			name = str_of(cr->fields[0]);
		if (name && is_refname(x, name))
			x->whole_row = true;
	}
	return !x->whole_row;
}

/* ================= session effects ================= */

/* The value of SET name = v (a single constant) as text, in *o. */
static bool set_value(const PgQuery__VariableSetStmt *v, struct opnd *o)
{
	if (v->n_args != 1)
		return false;
	classify(v->args[0], o);
	return o->kind == OP_TERM && !o->term.param && o->term.value;
}

/* SET search_path = a, b: the list as PostgreSQL would show it (each name quoted). */
static char *path_text(const PgQuery__VariableSetStmt *v)
{
	size_t cap = 2;
	char *s, *p;

	for (size_t i = 0; i < v->n_args; i++) {
		struct opnd o;
		classify(v->args[i], &o);
		if (o.kind != OP_TERM || o.term.param || !o.term.value)
			return NULL;
		cap += 2 * strlen(o.term.value) + 4;
	}
	s = p = malloc(cap);
	if (!s)
		return NULL;
	for (size_t i = 0; i < v->n_args; i++) {
		struct opnd o;
		classify(v->args[i], &o);
		if (i)
			p += sprintf(p, ", ");
		*p++ = '"';
		for (const char *c = o.term.value; *c; c++) {
			if (*c == '"')
				*p++ = '"';
			*p++ = *c;
		}
		*p++ = '"';
	}
	*p = 0;
	return s;
}

static void effect_set(struct an *x, const PgQuery__VariableSetStmt *v)
{
	struct or_stmt *st = x->st;
	bool org = or_is_org_guc(v->name);
	bool path = v->name && strcasecmp(v->name, "search_path") == 0;

	st->is_local = v->is_local;
	switch (v->kind) {
	case PG_QUERY__VARIABLE_SET_KIND__VAR_SET_VALUE:
		if (org) {
			struct opnd o;
			if (!set_value(v, &o))
				return;
			st->effect = OR_FX_SET_ORG;
			st->val.value = dup_or_oom(x, o.term.value);
		} else if (path) {
			st->val.value = path_text(v);
			st->effect = st->val.value ? OR_FX_SET_PATH : OR_FX_NONE;
		}
		return;
	case PG_QUERY__VARIABLE_SET_KIND__VAR_SET_DEFAULT:
	case PG_QUERY__VARIABLE_SET_KIND__VAR_RESET:
		if (org)
			st->effect = OR_FX_RESET_ORG;
		else if (path)
			st->effect = OR_FX_RESET_PATH;
		return;
	case PG_QUERY__VARIABLE_SET_KIND__VAR_RESET_ALL:
		st->effect = OR_FX_RESET_ALL;
		return;
	default:
		return;
	}
}

static const char *func_name(const PgQuery__FuncCall *f)
{
	return f->n_funcname ? str_of(f->funcname[f->n_funcname - 1]) : NULL;
}

/* SELECT set_config('lokadb.org' or 'search_path', v, is_local) (alone in its target list, no FROM). */
static void effect_set_config(struct an *x, const PgQuery__SelectStmt *s)
{
	const PgQuery__FuncCall *f;
	struct opnd name, val, loc;

	if (s->n_target_list != 1 || s->n_from_clause || s->op != PG_QUERY__SET_OPERATION__SETOP_NONE ||
	    s->target_list[0]->node_case != PG_QUERY__NODE__NODE_RES_TARGET)
		return;
	const Node *v = s->target_list[0]->res_target->val;
	if (!v || v->node_case != PG_QUERY__NODE__NODE_FUNC_CALL)
		return;
	f = v->func_call;
	if (!func_name(f) || strcmp(func_name(f), "set_config") != 0 || f->n_args != 3)
		return;
	classify(f->args[0], &name);
	classify(f->args[1], &val);
	if (name.kind != OP_TERM || name.term.param || val.kind != OP_TERM)
		return;
	bool path = name.term.value && strcasecmp(name.term.value, "search_path") == 0;
	if (!path && !or_is_org_guc(name.term.value))
		return;
	if (path && (val.term.param || !val.term.value))
		return;		/* a path only known at the Bind: not followed */
	if (f->args[2]->node_case == PG_QUERY__NODE__NODE_A_CONST &&
	    f->args[2]->a_const->val_case == PG_QUERY__A__CONST__VAL_BOOLVAL) {
		x->st->is_local = f->args[2]->a_const->boolval && f->args[2]->a_const->boolval->boolval;
	} else {
		classify(f->args[2], &loc);
		if (loc.kind != OP_TERM || loc.term.param || !loc.term.value)
			return;
		x->st->is_local = strcasecmp(loc.term.value, "true") == 0 || strcasecmp(loc.term.value, "t") == 0 ||
				  strcmp(loc.term.value, "1") == 0 || strcasecmp(loc.term.value, "on") == 0;
	}
	x->st->effect = path ? OR_FX_SET_PATH : OR_FX_SET_ORG;
	x->st->val.param = val.term.param;
	x->st->val.value = val.term.param ? NULL : dup_or_oom(x, val.term.value);
	if (val.term.param)
		x->a->params = true;
}

static bool temp_schema(const char *s)
{
	return s && (strcmp(s, "pg_temp") == 0 || strncmp(s, "pg_temp_", 8) == 0);
}

/* A temporary relation made: CREATE TEMP TABLE/VIEW, CREATE TEMP TABLE AS, SELECT INTO TEMP. */
static void effect_temp(struct an *x, const PgQuery__RangeVar *rv, bool at_commit)
{
	if (!rv || !rv->relname || !*rv->relname ||
	    !((rv->relpersistence && strcmp(rv->relpersistence, "t") == 0) || temp_schema(rv->schemaname)))
		return;
	x->st->effect = OR_FX_TEMP_CREATE;
	x->st->is_local = at_commit;
	x->st->val.value = dup_or_oom(x, rv->relname);
}

/* The name a DROP object (a list of names) gives a temporary relation: unqualified or pg_temp., else NULL. */
static const char *dropped_name(const Node *o)
{
	const char *name = NULL;

	if (!o || o->node_case != PG_QUERY__NODE__NODE_LIST)
		return NULL;
	if (o->list->n_items == 1)
		name = str_of(o->list->items[0]);
	else if (o->list->n_items == 2 && temp_schema(str_of(o->list->items[0])))
		name = str_of(o->list->items[1]);
	return name && *name ? name : NULL;
}

/* DROP TABLE/VIEW: those names, NUL after each and an empty one last. */
static void effect_drop(struct an *x, const PgQuery__DropStmt *d)
{
	size_t len = 1, o = 0;
	const char *name;
	char *v;

	if (d->remove_type != PG_QUERY__OBJECT_TYPE__OBJECT_TABLE && d->remove_type != PG_QUERY__OBJECT_TYPE__OBJECT_VIEW)
		return;
	for (size_t i = 0; i < d->n_objects; i++)
		if ((name = dropped_name(d->objects[i])))
			len += strlen(name) + 1;
	if (len == 1)
		return;
	if (!(v = malloc(len))) {
		x->oom = true;
		return;
	}
	for (size_t i = 0; i < d->n_objects; i++)
		if ((name = dropped_name(d->objects[i]))) {
			memcpy(v + o, name, strlen(name) + 1);
			o += strlen(name) + 1;
		}
	v[o] = 0;
	x->st->effect = OR_FX_TEMP_DROP;
	x->st->val.value = v;
}

static void effects(struct an *x, const Node *n)
{
	switch (n->node_case) {
	case PG_QUERY__NODE__NODE_VARIABLE_SET_STMT:
		effect_set(x, n->variable_set_stmt);
		break;
	case PG_QUERY__NODE__NODE_SELECT_STMT:
		if (n->select_stmt->into_clause)
			effect_temp(x, n->select_stmt->into_clause->rel,
				    n->select_stmt->into_clause->on_commit == PG_QUERY__ON_COMMIT_ACTION__ONCOMMIT_DROP);
		else
			effect_set_config(x, n->select_stmt);
		break;
	case PG_QUERY__NODE__NODE_CREATE_STMT:
		effect_temp(x, n->create_stmt->relation,
			    n->create_stmt->oncommit == PG_QUERY__ON_COMMIT_ACTION__ONCOMMIT_DROP);
		break;
	case PG_QUERY__NODE__NODE_VIEW_STMT:
		effect_temp(x, n->view_stmt->view, false);
		break;
	case PG_QUERY__NODE__NODE_DROP_STMT:
		effect_drop(x, n->drop_stmt);
		break;
	case PG_QUERY__NODE__NODE_EXECUTE_STMT:
		x->a->executes = true;
		break;
	case PG_QUERY__NODE__NODE_EXPLAIN_STMT:
		if (n->explain_stmt->query && n->explain_stmt->query->node_case == PG_QUERY__NODE__NODE_EXECUTE_STMT)
			x->a->executes = true;
		break;
	case PG_QUERY__NODE__NODE_CREATE_TABLE_AS_STMT:
		if (n->create_table_as_stmt->query &&
		    n->create_table_as_stmt->query->node_case == PG_QUERY__NODE__NODE_EXECUTE_STMT)
			x->a->executes = true;
		if (n->create_table_as_stmt->into)
			effect_temp(x, n->create_table_as_stmt->into->rel,
				    n->create_table_as_stmt->into->on_commit == PG_QUERY__ON_COMMIT_ACTION__ONCOMMIT_DROP);
		break;
	case PG_QUERY__NODE__NODE_DISCARD_STMT:
		if (n->discard_stmt->target == PG_QUERY__DISCARD_MODE__DISCARD_ALL)
			x->st->effect = OR_FX_DISCARD_ALL;
		else if (n->discard_stmt->target == PG_QUERY__DISCARD_MODE__DISCARD_TEMP)
			x->st->effect = OR_FX_DISCARD_TEMP;
		break;
	case PG_QUERY__NODE__NODE_TRANSACTION_STMT:
		switch (n->transaction_stmt->kind) {
		case PG_QUERY__TRANSACTION_STMT_KIND__TRANS_STMT_BEGIN:
		case PG_QUERY__TRANSACTION_STMT_KIND__TRANS_STMT_START:
			x->st->effect = OR_FX_BEGIN;
			break;
		case PG_QUERY__TRANSACTION_STMT_KIND__TRANS_STMT_ROLLBACK:
			x->st->effect = OR_FX_ROLLBACK;
			x->a->ends_txn = true;
			break;
		case PG_QUERY__TRANSACTION_STMT_KIND__TRANS_STMT_COMMIT:
		case PG_QUERY__TRANSACTION_STMT_KIND__TRANS_STMT_PREPARE:
			x->a->ends_txn = true;	/* not an effect: still passes untouched */
			break;
		default:
			break;
		}
		break;
	default:
		break;
	}
	if (x->st->effect != OR_FX_NONE)
		x->a->effects = true;
}

/* ================= statements ================= */

static enum or_kind kind_of(const Node *n, bool *rewritable)
{
	*rewritable = false;
	switch (n->node_case) {
	case PG_QUERY__NODE__NODE_SELECT_STMT:
		*rewritable = !n->select_stmt->into_clause;
		return OR_K_SELECT;
	case PG_QUERY__NODE__NODE_INSERT_STMT:
		*rewritable = true;
		return OR_K_INSERT;
	case PG_QUERY__NODE__NODE_UPDATE_STMT:
		*rewritable = true;
		return OR_K_UPDATE;
	case PG_QUERY__NODE__NODE_DELETE_STMT:
		*rewritable = true;
		return OR_K_DELETE;
	case PG_QUERY__NODE__NODE_EXPLAIN_STMT: {
		/* EXPLAIN has its statement's kind. Of a SELECT it is addressed like
		 * the SELECT: the plan shown is the one the statement gets (for a
		 * moved organization, what postgres_fdw pushes down to its site). Of
		 * a write it runs in a batch like the write, and gets its
		 * organization there, on the table as written. */
		const Node *q = n->explain_stmt->query;
		enum or_kind k = q ? kind_of(q, rewritable) : OR_K_OTHER;
		if (k != OR_K_SELECT)
			*rewritable = false;
		return k;
	}
	case PG_QUERY__NODE__NODE_COPY_STMT: {
		const PgQuery__CopyStmt *c = n->copy_stmt;
		if (c->is_from)
			return OR_K_COPY_FROM;
		*rewritable = true;
		return c->relation ? OR_K_COPY_TO_TABLE : OR_K_COPY_TO_QUERY;
	}
	default:
		return OR_K_OTHER;
	}
}

static void analyze_stmt(struct an *x, const PgQuery__RawStmt *raw)
{
	const Node *n = raw->stmt;
	bool rewritable;

	if (!n)
		return;
	x->st->kind = (uint8_t)kind_of(n, &rewritable);
	x->st->rewritable = rewritable;
	/* Utility statements on LokaDB tables that PostgreSQL runs as well behind
	 * other messages of a batch (not VACUUM, CREATE DATABASE ... "cannot be
	 * executed within a pipeline"): they may get their organization there. */
	x->st->batchable = n->node_case == PG_QUERY__NODE__NODE_DECLARE_CURSOR_STMT ||
			   n->node_case == PG_QUERY__NODE__NODE_LOCK_STMT ||
			   n->node_case == PG_QUERY__NODE__NODE_TRUNCATE_STMT ||
			   n->node_case == PG_QUERY__NODE__NODE_CREATE_TABLE_AS_STMT;
	x->st->ref0 = x->a->nrefs;
	x->nctes = 0;
	x->cte_overflow = false;
	x->three_part_colref = false;
	x->guarded = false;
	x->top_insert = n->node_case == PG_QUERY__NODE__NODE_INSERT_STMT ? (const void *)n->insert_stmt->relation : NULL;
	x->top_insert_ref = false;
	x->nrefnames = 0;
	x->ntypeless = 0;
	x->whole_row = false;
	or_walk((ProtobufCMessage *)n, collect_ctes, x);
	if (!x->oom)
		or_walk((ProtobufCMessage *)n, visit, x);
	if (!x->oom && x->st->rewritable && x->st->nrefs && !x->three_part_colref && !x->guarded)
		or_walk((ProtobufCMessage *)n, whole_row_visit, x);
	if (x->three_part_colref || x->guarded || x->whole_row)
		x->st->rewritable = false;	/* (guards: the parent's, which a leaf statement would bypass) */
	/* An INSERT whose one LokaDB table is its target stays on the parent:
	 * PostgreSQL routes its rows at run time (no partition in its plan,
	 * custom or generic), where a row sent to a leaf also has the leaf's
	 * partition constraint checked (doc/lokadb.md, "Routing rules"). */
	x->st->parent_insert = x->st->kind == OR_K_INSERT && x->st->nrefs == 1 && x->top_insert_ref;
	if (x->st->parent_insert)
		x->st->rewritable = false;
	if (x->st->nrefs == 0)
		x->st->kind = OR_K_OTHER;
	effects(x, n);
}

void or_analysis_free(struct or_analysis *a)
{
	if (!a)
		return;
	for (int i = 0; i < a->nrefs; i++) {
		free(a->refs[i].schema);
		free(a->refs[i].name);
		free(a->refs[i].org_column);
		free(a->refs[i].org_type);
	}
	for (int i = 0; i < a->nterms; i++)
		free(a->terms[i].value);
	for (int i = 0; i < a->nstmts; i++)
		free(a->stmts[i].val.value);
	free(a->refs);
	free(a->terms);
	free(a->stmts);
	memset(a, 0, sizeof(*a));
}

static bool word_char(char ch)
{
	return isalnum((unsigned char)ch) || ch == '_' || ch == '$' || (unsigned char)ch >= 0x80;
}

bool or_names_settings(const char *sql)
{
	static const char *const words[] = { "current_setting", "_settings", "lokadb.org" };

	for (const char *p = sql; *p; p++) {
		for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
			if (strncasecmp(p, words[i], strlen(words[i])) == 0)
				return true;
		if (strncasecmp(p, "show", 4) == 0 && (p == sql || !word_char(p[-1])) && !word_char(p[4]))
			return true;
	}
	return false;
}

bool or_analyze(const char *sql, const struct or_names *names, struct or_analysis *out)
{
	PgQueryProtobufParseResult pr;
	PgQuery__ParseResult *tree;
	struct an x;

	memset(out, 0, sizeof(*out));
	memset(&x, 0, sizeof(x));
	pr = pg_query_parse_protobuf(sql);
	if (pr.error) {
		out->parse_error = true;
		out->max_param = -1;
		pg_query_free_protobuf_parse_result(pr);
		return true;
	}
	tree = pg_query__parse_result__unpack(NULL, pr.parse_tree.len, (const uint8_t *)pr.parse_tree.data);
	pg_query_free_protobuf_parse_result(pr);
	if (!tree) {
		out->parse_error = true;
		out->max_param = -1;
		return true;
	}
	x.names = names;
	x.a = out;
	out->reads_settings = or_names_settings(sql);
	out->stmts = calloc(tree->n_stmts ? tree->n_stmts : 1, sizeof(*out->stmts));
	if (!out->stmts)
		x.oom = true;
	for (size_t i = 0; i < tree->n_stmts && !x.oom; i++) {
		x.st = &out->stmts[out->nstmts++];
		analyze_stmt(&x, tree->stmts[i]);
	}
	pg_query__parse_result__free_unpacked(tree, NULL);
	free(x.seen);
	if (x.oom) {
		or_analysis_free(out);
		return false;
	}
	return true;
}
