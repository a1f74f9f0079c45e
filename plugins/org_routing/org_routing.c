/* SPDX-License-Identifier: ISC */
/*
 * org_routing -- decide each statement's organization (DESIGN §8), make the
 * server session agree with it, address single-organization statements to
 * the organization's leaf partitions, refuse COPY ... TO that would read
 * every organization.
 *
 * Hooks:
 *   CONFIG_CHECK/APPLY  [plugin.org_routing] route_log, parse_cache_size,
 *                       rewrite, databases; needs the meta_cache.v1 service.
 *   CLIENT_STARTUP      watch the queries of clients of the routed databases;
 *                       the session's organization and search_path from
 *                       options=-c lokadb.org=... -c search_path=...
 *   QUERY               Q, P, B: look the text up in the parse cache
 *                       (cache.c / analyze.c), then decide (below).
 *   ROUTE               only notes that the client is about to get a server
 *                       (so it is not "sticky", see below).
 *   TXN_END             ends what lasts for a transaction (SET LOCAL, the
 *                       server the client held).
 *   CLIENT_CLOSE        frees the client's state.
 * Console: SHOW ORG_ROUTING.
 *
 * The decision, per message:
 *   organization = the common value of the terms of every LokaDB table
 *   occurrence of the (first LokaDB) statement; else the session's
 *   organization (SET LOCAL, then SET / options); else none.
 *   - Q and P: decided at once unless a term is a parameter; then at the Bind.
 *   - before the statement: query_prefix("SELECT set_config('lokadb.org',
 *     'X', false)") unless the server is known to have X already (the
 *     prefix travels in the same write as the statement: no round trip).
 *   - COPY ... TO reading LokaDB tables without an organization: 0A000.
 *   - one statement scoped by its own terms to an organization that has
 *     leaves: rewritten to the leaves (rewrite.c); COPY table TO with the
 *     session's organization: rewritten to COPY (SELECT ... WHERE ...).
 *
 * What the plugin knows about the server a statement will run on: the core
 * does not say at QUERY time (the server is picked after the hook, and the
 * API has no accessor for it), so the plugin tracks its belief per client:
 * `cur` is the value the client's server has, valid while the client
 * certainly keeps that server: inside a transaction block, between a Parse
 * and the Bind of the same batch, or for a "sticky" client (one that ran a
 * transaction without a ROUTE call before it: session pooling). Everywhere
 * else the prefix is sent (a cost of a few microseconds on the server, not a
 * round trip).
 *
 * Where a prefix may not go (prefixes_skipped, README "Where no prefix can
 * go"): before a Bind of the unnamed statement (a simple Query drops
 * PostgreSQL's unnamed prepared statement), and after a Parse or Bind of
 * the same batch (the core hides every reply up to the prefix's
 * ReadyForQuery, and PostgreSQL skips the Query after an error in the
 * batch). `batch_open` tracks the latter: set by P/B, cleared by a Query
 * and by TXN_END. Such a statement runs with the server's current value.
 * Blocks sent with the extended protocol get the session's organization
 * before their BEGIN, the last point where a prefix is known to be safe.
 */
#include <lokadb/plugin.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "org_routing.h"

#define OR_DEFAULT_PATH "\"$user\", public"
#define OR_ORG_MAX 64			/* longest organization id handled */
#define OR_PREFIX_MAX 256

static const lk_api *api;

/* Counters of SHOW ORG_ROUTING, in its column order. */
enum or_counter {
	N_PASSED, N_ROUTED, N_ORG_STATEMENT, N_ORG_SESSION, N_ORG_NONE, N_PREFIXES, N_PREFIXES_SKIPPED,
	N_REFUSED, N_REWRITTEN, N_REWRITE_FAILED, N_PARSE_ERRORS, N_SESSION_CHANGES, N_HELD, N_COUNT
};
static const char *const counter_names[N_COUNT] = {
	"statements_passed", "statements_routed", "org_from_statement", "org_from_session", "org_none",
	"prefixes", "prefixes_skipped", "refused", "rewritten", "rewrite_failed", "parse_errors",
	"session_changes", "held_for_catalog",
};

/* The plugin's state (api->set_data). */
struct orr {
	lk_plugin *self;
	const struct meta_cache_api *mc;
	struct or_cache *cache;
	size_t cache_size;
	bool route_log, rewrite;
	char *databases;
	bool warned_not_ready;
	uint64_t n[N_COUNT];
};

/* Per client (client_ctx), for watched clients only. */
struct orc {
	char *session_org;		/* SET lokadb.org / options; NULL: none */
	char *local_org;		/* SET LOCAL, until the transaction ends */
	char *saved_org;		/* session_org at BEGIN, back on ROLLBACK */
	bool saved;
	char *search_path;		/* NULL: PostgreSQL's default */
	uint64_t sp_key;
	char *cur;			/* lokadb.org the client's server has ("" = none) */
	bool cur_valid;
	bool sticky;			/* keeps its server between transactions */
	bool routed;			/* a ROUTE since its last TXN_END */
	bool changed_in_block;		/* lokadb.org changed inside a block: may revert */
	bool batch_open;		/* a Parse/Bind went to the server since its last idle ReadyForQuery */
	uint64_t txns;
	lk_event *held;			/* a message waiting for meta_cache's reload */
	lk_client *c;			/* back pointers for meta_cache's callback */
	struct orr *g;
};

/* How a statement's organization was found. */
enum or_source { SRC_NONE, SRC_STATEMENT, SRC_SESSION, SRC_PENDING };
static const char *const source_names[] = { "none", "statement", "session", "pending" };

/* A decision under construction. */
struct decision {
	enum or_source src;
	char org[OR_ORG_MAX + 1];
	bool params;			/* the organization came from Bind values */
	const struct or_stmt *first;	/* the first statement on LokaDB tables */
	bool after_set;			/* a statement before it sets lokadb.org itself */
	const char *refusal;		/* why it is refused (a format with %s, %s) */
	const struct or_ref *refused_ref;
	const char *rewrite;		/* "leaf", "copy", "no", "failed" */
	const char *prefix;		/* "sent", "known", "skipped", "-" */
	char target[256];
};

static struct orr *G(lk_plugin *self)
{
	return api->get_data(self);
}

/* ================= settings ================= */

static bool parse_bool(const char *v, bool *out)
{
	static const char *const yes[] = { "on", "true", "yes", "1" }, *const no[] = { "off", "false", "no", "0" };

	for (size_t i = 0; v && i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0)
			return (*out = true);
		if (strcasecmp(v, no[i]) == 0)
			return !(*out = false);
	}
	return false;
}

static bool parse_size(const char *v, size_t *out)
{
	char *end;
	unsigned long long n;

	if (!v || !*v)
		return false;
	n = strtoull(v, &end, 10);
	if (*end || n < 16 || n > 1000000)
		return false;
	*out = (size_t)n;
	return true;
}

static int or_config_check(lk_plugin *self, lk_event *ev)
{
	bool b;
	size_t n;

	(void)self;
	if (!parse_bool(api->config_get(ev, "route_log"), &b))
		return api->config_error(ev, "route_log", "must be on or off");
	if (!parse_bool(api->config_get(ev, "rewrite"), &b))
		return api->config_error(ev, "rewrite", "must be on or off");
	if (!parse_size(api->config_get(ev, "parse_cache_size"), &n))
		return api->config_error(ev, "parse_cache_size", "must be a number of statements 16..1000000");
	if (!api->service_lookup(META_CACHE_SERVICE))
		return api->fail(ev, "F0000", "org_routing needs the plugin meta_cache (plugins = meta_cache org_routing)");
	return LK_CONTINUE;
}

static int or_config_apply(lk_plugin *self, lk_event *ev)
{
	struct orr *g = G(self);
	const char *dbs = api->config_get(ev, "databases");
	size_t n = g->cache_size;

	parse_bool(api->config_get(ev, "route_log"), &g->route_log);
	parse_bool(api->config_get(ev, "rewrite"), &g->rewrite);
	parse_size(api->config_get(ev, "parse_cache_size"), &n);
	free(g->databases);
	g->databases = strdup(dbs ? dbs : "");
	g->mc = api->service_lookup(META_CACHE_SERVICE);
	if (!g->cache || n != g->cache_size) {
		struct or_cache *c = or_cache_new(n);
		if (c) {
			or_cache_free(g->cache);
			g->cache = c;
			g->cache_size = n;
		} else {
			api->log(self, LK_LOG_ERROR, "out of memory for a parse cache of %zu statements", n);
		}
	}
	return LK_CONTINUE;
}

/* ================= small helpers ================= */

static void set_owned(char **dst, const char *v)
{
	char *d = v ? strdup(v) : NULL;

	free(*dst);
	*dst = d;
}

/* Is `name` in the comma/space separated `list`? */
static bool in_list(const char *list, const char *name)
{
	size_t n = strlen(name);

	while (list && *list) {
		list += strspn(list, ", \t");
		size_t len = strcspn(list, ", \t");
		if (len == n && len > 0 && memcmp(list, name, n) == 0)
			return true;
		list += len;
	}
	return false;
}

static bool type_is(const char *type, const char *const *names)
{
	for (; *names; names++)
		if (strcmp(type, *names) == 0)
			return true;
	return false;
}

static const char *const int_types[] = { "bigint", "integer", "smallint", "int8", "int4", "int2", NULL };

/*
 * An organization value in the canonical text of the column's type:
 * integers without sign or leading zeros, uuids in lower-case 8-4-4-4-12,
 * anything else as given. false: not a usable organization id.
 */
static bool normalize(const char *type, const char *in, size_t len, char *out)
{
	if (len == 0 || len > OR_ORG_MAX)
		return false;
	if (type_is(type, int_types)) {
		char buf[OR_ORG_MAX + 1], *end;
		long long v;
		memcpy(buf, in, len);
		buf[len] = 0;
		v = strtoll(buf, &end, 10);
		if (end == buf || *end)
			return false;
		snprintf(out, OR_ORG_MAX + 1, "%lld", v);
		return true;
	}
	if (strcmp(type, "uuid") == 0) {
		char hex[33];
		int n = 0;
		for (size_t i = 0; i < len; i++) {
			if (isxdigit((unsigned char)in[i]) && n < 32)
				hex[n++] = (char)tolower((unsigned char)in[i]);
			else if (in[i] != '-' && in[i] != '{' && in[i] != '}')
				return false;
		}
		if (n != 32)
			return false;
		snprintf(out, OR_ORG_MAX + 1, "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8, hex + 12, hex + 16, hex + 20);
		return true;
	}
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)in[i] < 0x20)
			return false;
	memcpy(out, in, len);
	out[len] = 0;
	return true;
}

static uint64_t be(const unsigned char *p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

/* A binary Bind value of the column's type as text; false if it cannot be read. */
static bool binary_text(const char *type, const char *v, int len, char *out)
{
	const unsigned char *p = (const unsigned char *)v;
	char buf[OR_ORG_MAX + 1];

	if (type_is(type, int_types) && (len == 8 || len == 4 || len == 2)) {
		int64_t x = len == 8 ? (int64_t)be(p, 8) : len == 4 ? (int32_t)be(p, 4) : (int16_t)be(p, 2);
		snprintf(out, OR_ORG_MAX + 1, "%" PRId64, x);
		return true;
	}
	if (strcmp(type, "uuid") == 0 && len == 16) {
		for (int i = 0; i < 16; i++)
			snprintf(buf + 2 * i, 3, "%02x", p[i]);
		return normalize(type, buf, 32, out);
	}
	if (strcmp(type, "text") == 0 || strncmp(type, "character varying", 17) == 0)
		return normalize(type, v, (size_t)len, out);
	return false;
}

/* The value of term t for a table whose organization column is of `type`. */
static bool term_value(lk_event *ev, const char *type, const struct or_term *t, char *out)
{
	const char *v;
	int len, fmt;

	if (!t->param)
		return normalize(type, t->value, strlen(t->value), out);
	if (!ev || api->query_type(ev) != 'B' || t->param > api->query_nparams(ev))
		return false;
	v = api->query_param(ev, t->param - 1, &len, &fmt);
	if (!v)
		return false;
	if (fmt == 1)
		return binary_text(type, v, len, out);
	return normalize(type, v, (size_t)len, out);
}

static const char *session_org(const struct orc *x)
{
	return x->local_org ? x->local_org : x->session_org;
}

/* ================= deciding ================= */

/*
 * The organization of statement st from its own terms: SRC_STATEMENT with
 * org, SRC_PENDING when a parameter is needed and this is not a Bind, or
 * SRC_NONE (an unscoped occurrence, or terms that disagree).
 */
static enum or_source statement_org(lk_event *ev, const struct or_analysis *a, const struct or_stmt *st,
				    char *org, bool *params, const struct or_ref **unscoped)
{
	bool have = false, bind = api->query_type(ev) == 'B';

	*params = false;
	for (int i = st->ref0; i < st->ref0 + st->nrefs; i++) {
		const struct or_ref *r = &a->refs[i];
		if (r->nterms == 0) {
			*unscoped = r;
			return SRC_NONE;
		}
		for (int k = r->term0; k < r->term0 + r->nterms; k++) {
			const struct or_term *t = &a->terms[k];
			char v[OR_ORG_MAX + 1];
			if (t->param && !bind)
				return SRC_PENDING;
			if (!term_value(ev, r->org_type, t, v))
				return SRC_NONE;
			if (t->param)
				*params = true;
			if (have && strcmp(v, org) != 0)
				return SRC_NONE;
			if (!have)
				memcpy(org, v, strlen(v) + 1);
			have = true;
		}
	}
	return have ? SRC_STATEMENT : SRC_NONE;
}

static bool is_copy_to(const struct or_stmt *st)
{
	return st->kind == OR_K_COPY_TO_TABLE || st->kind == OR_K_COPY_TO_QUERY;
}

/* The organization of the first LokaDB statement, and refusals of any. */
static void decide_org(lk_event *ev, const struct orc *x, const struct or_analysis *a, struct decision *d)
{
	for (int i = 0; i < a->nstmts; i++) {
		const struct or_stmt *st = &a->stmts[i];
		const struct or_ref *unscoped = NULL;
		char org[OR_ORG_MAX + 1];
		bool params;
		enum or_source src;

		if (st->nrefs == 0)
			continue;
		src = statement_org(ev, a, st, org, &params, &unscoped);
		if (src == SRC_NONE && session_org(x) && st->kind != OR_K_COPY_TO_QUERY) {
			src = SRC_SESSION;
			snprintf(org, sizeof(org), "%s", session_org(x));
		}
		if (src == SRC_NONE && is_copy_to(st) && !d->refusal) {
			d->refusal = st->kind == OR_K_COPY_TO_TABLE
				? "COPY of LokaDB table %s.%s would read every organization: choose one with "
				  "SET lokadb.org = '<id>', or COPY (SELECT ... WHERE %s = <id>) TO ..."
				: "COPY (query) reads LokaDB table %s.%s without an organization: add "
				  "WHERE %s = <id> for every LokaDB table of the query";
			d->refused_ref = unscoped ? unscoped : &a->refs[st->ref0];
		}
		if (d->first)
			continue;
		d->first = st;
		for (int k = 0; k < i; k++)
			if (a->stmts[k].effect == OR_FX_SET_ORG || a->stmts[k].effect == OR_FX_RESET_ORG ||
			    a->stmts[k].effect == OR_FX_RESET_ALL)
				d->after_set = true;
		d->src = src;
		d->params = params && src == SRC_STATEMENT;
		if (src == SRC_STATEMENT || src == SRC_SESSION)
			memcpy(d->org, org, strlen(org) + 1);
	}
}

/* The tables of the first LokaDB statement, for route_log ("schema.name,..."). */
static void describe_target(const struct or_analysis *a, const struct or_stmt *st, struct decision *d)
{
	size_t o = 0;

	d->target[0] = 0;
	if (!st)
		return;
	for (int i = st->ref0; i < st->ref0 + st->nrefs && o < sizeof(d->target); i++) {
		const struct or_ref *r = &a->refs[i];
		int n = snprintf(d->target + o, sizeof(d->target) - o, "%s%s.%s", o ? "," : "", r->schema, r->name);
		if (n < 0)
			break;
		o += (size_t)n;
	}
}

/* ================= session effects ================= */

/* The value a SET or set_config gives lokadb.org ("" clears it). */
static bool effect_value(lk_event *ev, const struct or_term *t, char *out)
{
	const char *v = t->value;
	int len = 0, fmt = 0;

	if (t->param && api->query_type(ev) == 'B' && t->param <= api->query_nparams(ev))
		v = api->query_param(ev, t->param - 1, &len, &fmt);
	else if (t->param)
		return false;
	if (v && fmt == 0 && (t->param ? len == 0 : *v == 0)) {
		out[0] = 0;
		return true;
	}
	return v && term_value(ev, "text", t, out);
}

/* What a statement that ran does to what the plugin knows of the session. */
static void apply_effect(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, const struct or_stmt *st)
{
	bool in_block = api->client_in_transaction(c);
	char v[OR_ORG_MAX + 1];

	switch (st->effect) {
	case OR_FX_SET_ORG:
		if (!effect_value(ev, &st->val, v))
			return;
		set_owned(st->is_local ? &x->local_org : &x->session_org, v[0] ? v : NULL);
		if (!st->is_local)
			set_owned(&x->local_org, NULL);
		set_owned(&x->cur, v);
		x->cur_valid = true;
		break;
	case OR_FX_RESET_ORG:
		set_owned(&x->session_org, NULL);
		set_owned(&x->local_org, NULL);
		set_owned(&x->cur, "");
		x->cur_valid = true;
		break;
	case OR_FX_RESET_ALL:
		set_owned(&x->session_org, NULL);
		set_owned(&x->local_org, NULL);
		set_owned(&x->search_path, NULL);
		set_owned(&x->cur, "");
		x->cur_valid = true;
		x->sp_key = or_hash(api->client_user(c), strlen(api->client_user(c)), 0);
		break;
	case OR_FX_SET_PATH:
	case OR_FX_RESET_PATH:
		if (st->is_local)
			return;
		set_owned(&x->search_path, st->effect == OR_FX_SET_PATH ? st->val.value : NULL);
		x->sp_key = or_hash(x->search_path ? x->search_path : "", x->search_path ? strlen(x->search_path) : 0,
				    or_hash(api->client_user(c), strlen(api->client_user(c)), 0));
		return;
	case OR_FX_BEGIN:
		if (!in_block) {
			set_owned(&x->saved_org, x->session_org);
			x->saved = true;
		}
		return;
	case OR_FX_ROLLBACK:
		if (x->saved)
			set_owned(&x->session_org, x->saved_org);
		set_owned(&x->local_org, NULL);
		x->cur_valid = false;
		return;
	default:
		return;
	}
	if (in_block)
		x->changed_in_block = true;
	g->n[N_SESSION_CHANGES]++;
}

static void apply_effects(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, const struct or_analysis *a)
{
	for (int i = 0; a->effects && i < a->nstmts; i++)
		if (a->stmts[i].effect != OR_FX_NONE)
			apply_effect(g, ev, c, x, &a->stmts[i]);
}

/* ================= acting ================= */

/*
 * Make the server's lokadb.org be d->org ("" when none) before the message,
 * unless the client's server is known to have it. A Bind of the unnamed
 * statement cannot be preceded by a Query (it would drop the statement).
 */
static void ensure_org(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, struct decision *d)
{
	char sql[OR_PREFIX_MAX], lit[2 * OR_ORG_MAX + 4];

	if (x->cur_valid && x->cur && strcmp(x->cur, d->org) == 0) {
		d->prefix = "known";
		return;
	}
	if ((api->query_type(ev) == 'B' && api->query_statement(ev)[0] == 0) ||
	    (api->query_type(ev) != 'Q' && x->batch_open)) {
		d->prefix = "skipped";
		g->n[N_PREFIXES_SKIPPED]++;
		return;
	}
	if (!or_quote_literal(d->org, lit, sizeof(lit)))
		return;
	snprintf(sql, sizeof(sql), "SELECT set_config('lokadb.org', %s, false)", lit);
	if (api->query_prefix(ev, sql) != 0)
		return;
	d->prefix = "sent";
	g->n[N_PREFIXES]++;
	set_owned(&x->cur, d->org);
	x->cur_valid = x->cur != NULL;
	if (api->client_in_transaction(c))
		x->changed_in_block = true;
}

/* Address a single-organization statement to its leaves (Q and P only). */
static void maybe_rewrite(struct orr *g, lk_event *ev, const struct orc *x, const struct or_analysis *a,
			  struct decision *d)
{
	struct or_names names = { g->mc, x->search_path ? x->search_path : OR_DEFAULT_PATH, NULL };
	struct or_rewrite_memo *m;
	const char *err, *sql = api->query_sql(ev);
	bool copy_table = d->first->kind == OR_K_COPY_TO_TABLE;
	enum or_rw_result rc;
	char *out;

	if (api->query_type(ev) == 'B' || a->nstmts != 1 || !d->first->rewritable)
		return;
	if (!(copy_table ? d->src != SRC_NONE : (g->rewrite && d->src == SRC_STATEMENT)))
		return;
	names.user = api->client_user(api->ev_client(ev));
	m = or_cache_memo(g->cache, a);
	if (!(m->org && strcmp(m->org, d->org) == 0 && m->version == g->mc->version())) {
		rc = or_rewrite(sql, a, &names, d->org, g->rewrite, &out, &err);
		if (rc == OR_RW_FAILED) {
			g->n[N_REWRITE_FAILED]++;
			d->rewrite = "failed";
			api->log(g->self, LK_LOG_WARNING, "C-%" PRIu64 " could not rewrite a statement for organization %s: %s",
				 api->client_id(api->ev_client(ev)), d->org, err);
			return;
		}
		free(m->org);
		free(m->sql);
		m->org = strdup(d->org);
		m->sql = rc == OR_RW_DONE ? out : NULL;
		m->version = g->mc->version();
	}
	if (!m->sql || api->query_rewrite(ev, m->sql) != 0)
		return;
	g->n[N_REWRITTEN]++;
	d->rewrite = copy_table ? "copy" : "leaf";
	snprintf(d->target, sizeof(d->target), "%s", m->sql);
}

static void route_log(struct orr *g, lk_event *ev, const struct decision *d, const char *decision)
{
	if (!g->route_log)
		return;
	api->log(g->self, LK_LOG_INFO, "C-%" PRIu64 " %c org=%s decision=%s target=%s rewrite=%s prefix=%s",
		 api->client_id(api->ev_client(ev)), api->query_type(ev), d->org[0] ? d->org : "-", decision,
		 d->target[0] ? d->target : "-", d->rewrite, d->prefix);
}

/* A message on LokaDB tables, or with session effects. */
static int route_message(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, const struct or_analysis *a)
{
	struct decision d = { .src = SRC_NONE, .rewrite = "no", .prefix = "-" };
	char type = api->query_type(ev);

	decide_org(ev, x, a, &d);
	if (d.refusal) {
		const struct or_ref *r = d.refused_ref;
		g->n[N_REFUSED]++;
		describe_target(a, d.first, &d);
		route_log(g, ev, &d, "refused");
		return api->fail(ev, "0A000", d.refusal, r->schema, r->name, r->org_column);
	}
	describe_target(a, d.first, &d);
	if (d.first && d.src == SRC_PENDING) {
		route_log(g, ev, &d, "pending");	/* the Bind decides (a Query: PREPARE ... $1) */
	} else if (d.first && type == 'B' && !d.params) {
		/* decided at the Parse; a later Bind (a new transaction) may need the prefix again */
		ensure_org(g, ev, c, x, &d);
		if (strcmp(d.prefix, "known") != 0)
			route_log(g, ev, &d, source_names[d.src]);
	} else if (d.first) {
		g->n[N_ROUTED]++;
		g->n[d.src == SRC_STATEMENT ? N_ORG_STATEMENT : d.src == SRC_SESSION ? N_ORG_SESSION : N_ORG_NONE]++;
		maybe_rewrite(g, ev, x, a, &d);
		if (!d.after_set)
			ensure_org(g, ev, c, x, &d);
		route_log(g, ev, &d, d.params ? "param" : source_names[d.src]);
	} else if (a->stmts[0].effect == OR_FX_BEGIN && session_org(x)) {
		/* A block's later Parses are not batch starts that the plugin can
		 * recognize (see ensure_org): give the block the session's
		 * organization now, while the prefix is safe. */
		snprintf(d.org, sizeof(d.org), "%s", session_org(x));
		ensure_org(g, ev, c, x, &d);
		route_log(g, ev, &d, "begin");
	} else {
		route_log(g, ev, &d, "set");
	}
	if (type != 'P')
		apply_effects(g, ev, c, x, a);		/* they happen after the prefix, in the message */
	return LK_CONTINUE;
}

/* ================= hooks ================= */

/* Route a message whose catalog is current. */
static int route_now(struct orr *g, lk_event *ev, lk_client *c, struct orc *x)
{
	const struct or_analysis *a;
	struct or_names names;
	const char *sql = api->query_sql(ev);

	if (!sql)
		return LK_CONTINUE;
	names.mc = g->mc;
	names.search_path = x->search_path ? x->search_path : OR_DEFAULT_PATH;
	names.user = api->client_user(c);
	a = or_cache_get(g->cache, sql, x->sp_key, g->mc->version(), &names);
	if (!a)
		return LK_CONTINUE;
	if (a->parse_error)
		g->n[N_PARSE_ERRORS]++;
	if (!a->tables && !a->effects) {
		g->n[N_PASSED]++;
		if (g->route_log) {
			struct decision d = { .rewrite = "no", .prefix = "-" };
			route_log(g, ev, &d, "pass");
		}
		return LK_CONTINUE;
	}
	return route_message(g, ev, c, x, a);
}

static bool mc_has_wait(const struct meta_cache_api *mc)
{
	return mc->size >= offsetof(struct meta_cache_api, wait_cancel) + sizeof(mc->wait_cancel) &&
	       mc->wait && mc->wait_cancel;
}

/* meta_cache loaded the change it knew of: route the held message now. */
static void catalog_loaded(void *arg, uint64_t version)
{
	struct orc *x = arg;
	struct orr *g = x->g;
	lk_client *c = x->c;
	lk_event *ev = x->held;
	int rc;

	(void)version;
	if (!ev)
		return;
	x->held = NULL;
	g->n[N_HELD]++;
	rc = route_now(g, ev, c, x);
	if (api->query_type(ev) != 'Q')
		x->batch_open = true;
	api->resume(c, rc == LK_ERROR ? LK_ERROR : LK_CONTINUE);
}

static int or_query(lk_plugin *self, lk_event *ev)
{
	struct orr *g = G(self);
	lk_client *c = api->ev_client(ev);
	struct orc *x = api->client_ctx(self, c);

	if (!x || !g->cache || !g->mc)
		return LK_CONTINUE;
	if (api->query_type(ev) == 'Q')
		x->batch_open = false;	/* a client sends a Query only between batches */
	if (!g->mc->ready()) {
		if (!g->warned_not_ready)
			api->log(self, LK_LOG_WARNING, "the catalog is not loaded yet: statements pass unrouted");
		g->warned_not_ready = true;
		return LK_CONTINUE;
	}
	/* A change announced but not loaded yet: no statement runs with the old catalog. */
	if (mc_has_wait(g->mc) && g->mc->wait(catalog_loaded, x) == 0) {
		x->held = ev;
		return LK_ASYNC;
	}
	int rc = route_now(g, ev, c, x);
	if (api->query_type(ev) != 'Q')
		x->batch_open = true;	/* until the server is idle again (TXN_END) or a Query */
	return rc;
}

/* options=-c lokadb.org=X -c search_path=Y (also -cname=v, --name=v; "\ " escapes a blank). */
static void startup_options(struct orc *x, const char *opts)
{
	char tok[512];
	bool expect = false;

	while (opts && *opts) {
		size_t n = 0;
		char *name, *eq;
		while (*opts == ' ' || *opts == '\t')
			opts++;
		while (*opts && *opts != ' ' && *opts != '\t' && n + 1 < sizeof(tok)) {
			if (*opts == '\\' && opts[1])
				opts++;
			tok[n++] = *opts++;
		}
		tok[n] = 0;
		if (n == 0)
			break;
		name = tok;
		if (strcmp(tok, "-c") == 0) {
			expect = true;
			continue;
		}
		if (!expect && strncmp(tok, "--", 2) == 0)
			name += 2;
		else if (!expect && strncmp(tok, "-c", 2) == 0)
			name += 2;
		else if (!expect)
			continue;
		expect = false;
		if (!(eq = strchr(name, '=')))
			continue;
		*eq = 0;
		for (char *p = name; *p; p++)
			if (*p == '-')
				*p = '_';
		if (or_is_org_guc(name))
			set_owned(&x->session_org, eq[1] ? eq + 1 : NULL);
		else if (strcasecmp(name, "search_path") == 0)
			set_owned(&x->search_path, eq + 1);
	}
}

static int or_client_startup(lk_plugin *self, lk_event *ev)
{
	struct orr *g = G(self);
	lk_client *c = api->ev_client(ev);
	const char *db = api->client_database(c), *user = api->client_user(c);
	struct orc *x;

	if (!db || strcmp(db, "lokadb") == 0 || strcmp(db, "pgbouncer") == 0)
		return LK_CONTINUE;
	if (g->databases && *g->databases && !in_list(g->databases, db))
		return LK_CONTINUE;
	x = calloc(1, sizeof(*x));
	if (!x)
		return api->fail(ev, "53200", "out of memory");
	startup_options(x, api->client_param(c, "options"));
	x->sp_key = or_hash(x->search_path ? x->search_path : "", x->search_path ? strlen(x->search_path) : 0,
			    or_hash(user, strlen(user), 0));
	x->c = c;
	x->g = g;
	api->client_set_ctx(self, c, x);
	api->client_watch_queries(c, 1);
	return LK_CONTINUE;
}

static int or_route(lk_plugin *self, lk_event *ev)
{
	struct orc *x = api->client_ctx(self, api->ev_client(ev));

	if (x) {
		x->routed = true;
		x->sticky = false;
	}
	return LK_CONTINUE;
}

static int or_txn_end(lk_plugin *self, lk_event *ev)
{
	struct orc *x = api->client_ctx(self, api->ev_client(ev));

	if (!x)
		return LK_CONTINUE;
	x->txns++;
	if (!x->routed && x->txns > 1)
		x->sticky = true;
	x->routed = false;
	if (!x->sticky || x->changed_in_block || x->local_org)
		x->cur_valid = false;
	x->changed_in_block = false;
	x->batch_open = false;
	set_owned(&x->local_org, NULL);
	set_owned(&x->saved_org, NULL);
	x->saved = false;
	return LK_CONTINUE;
}

static int or_client_close(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct orc *x = api->client_ctx(self, c);

	if (!x)
		return LK_CONTINUE;
	struct orr *g = G(self);
	if (x->held && g->mc && mc_has_wait(g->mc))
		g->mc->wait_cancel(catalog_loaded, x);
	free(x->session_org);
	free(x->local_org);
	free(x->saved_org);
	free(x->search_path);
	free(x->cur);
	free(x);
	api->client_set_ctx(self, c, NULL);
	return LK_CONTINUE;
}

/* ================= console ================= */

static int or_show(lk_plugin *self, lk_result *res, const char *args)
{
	struct orr *g = G(self);
	struct or_cache_stats st = { 0 };
	enum { NCACHE = 6, NCOLS = NCACHE + N_COUNT };
	const char *names[NCOLS] = { "parse_cache_entries", "parse_cache_size", "parse_cache_hits",
				     "parse_cache_misses", "parse_cache_evictions", "parse_cache_invalidations" };
	uint32_t types[NCOLS];
	char buf[NCOLS][24];
	const char *vals[NCOLS];
	uint64_t v[NCOLS];

	if (args && *args)
		return api->result_error(res, "42601", "SHOW ORG_ROUTING takes no arguments");
	if (g->cache)
		or_cache_stats(g->cache, &st);
	v[0] = st.entries;
	v[1] = st.capacity;
	v[2] = st.hits;
	v[3] = st.misses;
	v[4] = st.evictions;
	v[5] = st.invalidations;
	for (int i = 0; i < N_COUNT; i++) {
		names[NCACHE + i] = counter_names[i];
		v[NCACHE + i] = g->n[i];
	}
	for (int i = 0; i < NCOLS; i++) {
		types[i] = LK_TYPE_INT8;
		snprintf(buf[i], sizeof(buf[i]), "%" PRIu64, v[i]);
		vals[i] = buf[i];
	}
	api->result_columns(res, NCOLS, names, types);
	api->result_row(res, vals);
	return LK_HANDLED;
}

/* ================= init ================= */

static int or_init(lk_plugin *self, const lk_api *a)
{
	struct orr *g;

	api = a;
	g = calloc(1, sizeof(*g));
	if (!g) {
		api->init_error(self, "out of memory");
		return -1;
	}
	g->self = self;
	api->set_data(self, g);
	if (api->config_declare(self, "route_log", "off",
				"one INFO line per statement: client, organization, decision, target, rewrite") ||
	    api->config_declare(self, "parse_cache_size", "4096",
				"statements whose analysis is kept (clock eviction), 16..1000000") ||
	    api->config_declare(self, "rewrite", "on",
				"address single-organization statements to the organization's leaf partitions") ||
	    api->config_declare(self, "databases", NULL,
				"[databases] entries whose clients are routed (empty: all)") ||
	    api->hook(self, LK_HOOK_CONFIG_CHECK, or_config_check, 0) ||
	    api->hook(self, LK_HOOK_CONFIG_APPLY, or_config_apply, 0) ||
	    api->hook(self, LK_HOOK_CLIENT_STARTUP, or_client_startup, 0) ||
	    api->hook(self, LK_HOOK_QUERY, or_query, 0) ||
	    api->hook(self, LK_HOOK_ROUTE, or_route, 0) ||
	    api->hook(self, LK_HOOK_TXN_END, or_txn_end, 0) ||
	    api->hook(self, LK_HOOK_CLIENT_CLOSE, or_client_close, 0) ||
	    api->console_register(self, "SHOW ORG_ROUTING", 0, or_show,
				  "org_routing: parse cache and routing counters")) {
		api->init_error(self, "could not register its settings, hooks or command");
		return -1;
	}
	/* options=-c lokadb.org=X at connect: accepted, read in CLIENT_STARTUP */
	if (LK_API_HAS(api, startup_parameter) && api->startup_parameter(self, "lokadb.org") != 0) {
		api->init_error(self, "could not declare the startup parameter lokadb.org");
		return -1;
	}
	return 0;
}

static void or_fini(lk_plugin *self)
{
	struct orr *g = G(self);

	if (!g)
		return;
	or_cache_free(g->cache);
	free(g->databases);
	free(g);
}

LK_PLUGIN("org_routing", "0.1", or_init, or_fini)
