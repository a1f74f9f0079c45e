/* SPDX-License-Identifier: ISC */
/*
 * org_routing -- decide each statement's organization (DESIGN §8), make the
 * server session agree with it, address single-organization statements to
 * the organization's leaf partitions, refuse COPY ... TO that would read
 * every organization, keep each organization on its own server connections
 * (pool affinity), hold the statements of a paused organization, and keep
 * PostgreSQL's generic plans away from prepared statements.
 *
 * Hooks:
 *   CONFIG_CHECK/APPLY  [plugin.org_routing] route_log, parse_cache_size,
 *                       rewrite, databases, org_affinity, pause_timeout,
 *                       force_custom_plan; needs the meta_cache.v1 service
 *                       (on_change is subscribed once).
 *   CLIENT_STARTUP      watch the queries of clients of the routed databases;
 *                       the session's organization and search_path from
 *                       options=-c lokadb.org=... -c search_path=...
 *   QUERY               Q, P, B: look the text up in the parse cache
 *                       (cache.c / analyze.c), then decide (below).
 *   ROUTE               notes that the client is about to get a server (so it
 *                       is not "sticky", see below); gives the affinity if no
 *                       QUERY did for this transaction.
 *   TXN_END             ends what lasts for a transaction (SET LOCAL, the
 *                       server the client held, the batch).
 *   CLIENT_CLOSE        frees the client's state, cancels its holds.
 * Console: SHOW ORG_ROUTING.
 *
 * The decision, per message:
 *   organization = the common value of the terms of every LokaDB table
 *   occurrence of the (first LokaDB) statement; else the session's
 *   organization (SET LOCAL, then SET / options); else none.
 *   - Q and P: decided at once unless a term is a parameter; then at the Bind.
 *   - an organization with lokadb.orgs.paused: the message is held (LK_ASYNC)
 *     until a catalog change unpauses it, or fails after pause_timeout.
 *   - api->client_set_affinity(organization) while the client has no
 *     transaction open: the pool prefers a server that served it.
 *   - before the statement: query_prefix("SELECT set_config('lokadb.org',
 *     'X', false)") unless the server is known to have X already; X is the
 *     statement's organization, or with server_org = session (auto: where
 *     nothing may read it, org_of_session) the client's own (the
 *     prefix travels in the same write as the statement: no round trip);
 *     with force_custom_plan, plan_cache_mode goes in the same statement.
 *   - COPY ... TO reading LokaDB tables without an organization: 0A000.
 *   - one statement scoped by its own terms to an organization that has
 *     leaves: rewritten to the leaves (rewrite.c) at the Query or Parse;
 *     with the organization in a parameter, the statement is parsed again
 *     at the Bind (api->query_reparse) with the leaf text, or back with the
 *     client's text (`pstmts` remembers what each statement has on the
 *     server). COPY table TO with the session's organization: rewritten to
 *     COPY (SELECT ... WHERE ...).
 *
 * What the plugin knows about the server a statement will run on: the core
 * does not say at QUERY time (the server is picked after the hook, and the
 * API has no accessor for it), so the plugin tracks its belief per client:
 * `cur` is the value the client's server has, valid while the client
 * certainly keeps that server: inside a transaction block, between a Parse
 * and the Bind of the same batch, or for a "sticky" client (one that ran a
 * transaction without a ROUTE call before it: session pooling). Everywhere
 * else the prefix is sent (a cost of a few microseconds on the server, not a
 * round trip). `pcm` is the same belief for plan_cache_mode.
 *
 * Where a simple Query may not go (README "Inside an extended-protocol
 * batch"): before a Bind of the unnamed statement (a simple Query drops
 * PostgreSQL's unnamed prepared statement), and after a Parse or Bind of
 * the same batch (the Query would end the batch, and PostgreSQL skips it
 * after an error in the batch). `batch_open` tracks the latter: set by P/B,
 * cleared by a Query and by a TXN_END that ends the batch (txn_end_batch).
 * A core of ABI 1.8 sends query_set_var values there as hidden
 * extended-protocol messages (core_sends_anywhere); with an older core, or
 * with query_prefix, the statement runs with the server's current value
 * (prefixes_skipped). Blocks sent with the extended protocol also get the
 * session's organization before their BEGIN.
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
	N_REFUSED, N_REWRITTEN, N_REWRITE_FAILED, N_PARSE_ERRORS, N_SESSION_CHANGES, N_HELD,
	N_REPARSED, N_HELD_PAUSE, N_PAUSE_TIMEOUTS, N_PLAN_MODE, N_REPARSE_LOST, N_REPARSE_REFUSED, N_PREFILTERED,
	N_PREFIXES_KNOWN, N_NORMALIZED, N_NORM_HITS, N_REWRITES_MADE, N_HELD_ANSWERS, N_PARENT_INSERTS,
	N_COUNT
};
static const char *const counter_names[N_COUNT] = {
	"statements_passed", "statements_routed", "org_from_statement", "org_from_session", "org_none",
	"prefixes", "prefixes_skipped", "refused", "rewritten", "rewrite_failed", "parse_errors",
	"session_changes", "held_for_catalog", "reparsed", "held_for_pause", "pause_timeouts",
	"plan_mode_sets", "reparses_lost", "reparses_refused", "statements_prefiltered",
	"prefixes_known", "statements_normalized", "normalized_cache_hits", "rewrites_made",
	"held_for_answers", "inserts_on_parent",
};

struct orc;
struct plog;

/* A word the prefilter looked up along a search path (see word_is_table). */
#define WORD_MEMO 1024
struct word_memo {
	uint64_t sp_key, key;		/* orc.sp_key (search path, user), cat_key() */
	uint8_t len;			/* 0: free */
	bool table;
	char word[64];
};

/* The plugin's state (api->set_data). */
struct orr {
	lk_plugin *self;
	const struct meta_cache_api *mc;
	struct or_cache *cache;
	size_t cache_size;
	bool route_log, rewrite;
	int force_plan;			/* force_custom_plan: FP_OFF, FP_ON, FP_AUTO */
	int server_org;			/* server_org: SO_STATEMENT, SO_SESSION, SO_AUTO */
	int org_affinity;		/* organizations per server connection (0: no affinity) */
	uint64_t pause_timeout;		/* usec a statement of a paused organization waits at most */
	char *databases;
	bool warned_not_ready;
	bool subscribed;		/* on_change of meta_cache registered */
	uint64_t gen;			/* catalog changes seen by on_change */
	struct word_memo *words;	/* the prefilter's table_search answers (WORD_MEMO slots) */
	struct orc *paused;		/* clients holding a statement of a paused organization */
	lk_timer *release;		/* a pass over `paused` is due (after a catalog change) */
	uint64_t n[N_COUNT];
};

/* A statement of the client whose text org_routing changed (Parse rewrite or
 * Bind re-parse): the core reports the changed text at the next Bind. */
struct or_pstmt {
	char *name;
	char *orig;			/* the text the client sent */
	char *cur;			/* the text the server has now */
	int max_param;			/* the highest $n of orig (or_analysis) */
	struct or_pstmt *next;
};
#define OR_PSTMT_MAX 256
#define OR_REPARSE_LEAF_MAX 4		/* re-parses to a leaf per batch */

/* The plan_cache_mode values org_routing gives servers (README "Generic plans"). */
enum { PCM_NONE, PCM_CUSTOM, PCM_AUTO };
static const char *const pcm_values[] = { NULL, "force_custom_plan", "auto" };

/* Per client (client_ctx), for watched clients only. */
struct orc {
	char *session_org;		/* SET lokadb.org / options; NULL: none */
	char *local_org;		/* SET LOCAL, until the transaction ends */
	char *saved_org;		/* session_org at BEGIN, back on ROLLBACK */
	bool saved;
	char *search_path;		/* NULL: PostgreSQL's default */
	char *local_path;		/* SET LOCAL search_path, until the transaction ends */
	char *saved_path;		/* search_path at BEGIN, back on ROLLBACK (with `saved`) */
	struct or_temps temps;		/* the session's temporary tables and views (they hide tables) */
	uint64_t sp_key;
	char *cur;			/* lokadb.org the client's server has ("" = none) */
	bool cur_valid;
	bool inline_req;		/* the message asked for its values in front (query_vars_inline) */
	bool sticky;			/* keeps its server between transactions */
	bool routed;			/* a ROUTE since its last TXN_END */
	bool changed_in_block;		/* lokadb.org changed inside a block: may revert */
	bool batch_open;		/* a Parse/Bind went to the server since its last idle ReadyForQuery */
	int batch_reparses;		/* re-parses asked for since then */
	/* What came since the last idle ReadyForQuery (TXN_END), to guess
	 * whether it ended the client's batch (see or_txn_end) */
	uint16_t hooked_p, hooked_b;	/* Parses and Binds */
	bool p_after_b;			/* a Parse after a Bind */
	bool hooked_any;		/* any Query, Parse or Bind */
	bool last_ends_txn;		/* the last one was a COMMIT or ROLLBACK */
	bool pipelines;			/* seen sending past a Sync (no leaf re-parses at its Binds) */
	bool unsettled;			/* a session effect sent since its last TXN_END: an error may undo it */
	bool sent_block;		/* a BEGIN sent, its COMMIT or ROLLBACK not (unsettled effects stay in it) */
	lk_event *answer_ev;		/* a message sent past a Sync behind an unsettled effect, waiting for
					 * the answers before it (api->client_on_answered) */
	uint8_t calm;			/* single-statement batches since; 8 clear `pipelines` */
	uint64_t txns;
	lk_event *held;			/* a message waiting for meta_cache's reload */
	lk_client *c;			/* back pointers for meta_cache's callback */
	struct orr *g;
	struct or_pstmt *pstmts;	/* statements whose text was changed, newest first */
	int npstmts;
	char *aff;			/* the affinity key given to the core (NULL: none) */
	int aff_max;
	bool aff_txn;			/* the QUERY hook chose it for the coming transaction */
	char *last_org;			/* the organization of its last decided statement */
	uint8_t pcm;			/* the plan_cache_mode its server has (PCM_NONE: not known) */
	uint8_t pcm_want;		/* ... that the message being decided asked for */
	bool pcm_in_block;		/* ... set inside the current block (a ROLLBACK reverts it) */
	bool block_lokadb;		/* a statement on LokaDB tables ran in the current block */
	lk_event *paused_ev;		/* a message held while its organization is paused */
	char pause_org[OR_ORG_MAX + 1];
	lk_timer *pause_timer;		/* pause_timeout of paused_ev */
	struct orc *pnext, **pprev;	/* in orr.paused */
	struct plog *plog;		/* route_log line waiting for the core's prefix decision */
	int pcm_bit;			/* plan_cache_mode's bit in vars_done's `sent` (-1: not asked) */
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
	const char *prefix;		/* "sent", "known", "skipped", "-"; "core": the core decides (query_set_var) */
	bool reparsed;			/* B: the statement is parsed again first */
	bool of_session;		/* the server gets the session's organization (server_org) */
	char target[256];
};

static void subscribe(struct orr *g);

/* The literals of the message being decided when its analysis is the one of
 * its normalized text (normalize.c): $k of that analysis is literal k, not
 * a Bind parameter. NULL otherwise. */
static const struct or_norm *cur_norm;
static void forget_var(lk_event *ev, const char *name);

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

enum { FP_OFF, FP_ON, FP_AUTO };

enum { SO_STATEMENT, SO_SESSION, SO_AUTO };

/* server_org: statement, session or auto. */
static bool parse_server_org(const char *v, int *out)
{
	static const char *const words[] = { "statement", "session", "auto" };

	for (int i = 0; v && i < 3; i++)
		if (strcasecmp(v, words[i]) == 0)
			return (*out = i), true;
	return false;
}

/* force_custom_plan: on, off (parse_bool's words) or auto. */
static bool parse_force_plan(const char *v, int *out)
{
	bool b;

	if (v && strcasecmp(v, "auto") == 0)
		return (*out = FP_AUTO);
	if (!parse_bool(v, &b))
		return false;
	*out = b ? FP_ON : FP_OFF;
	return true;
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

/* 0..32: organizations remembered per server connection. */
static bool parse_affinity(const char *v, int *out)
{
	char *end;
	long n;

	if (!v || !*v)
		return false;
	n = strtol(v, &end, 10);
	if (*end || n < 0 || n > 32)
		return false;
	*out = (int)n;
	return true;
}

/* A duration: N (seconds), Nms, Ns, Nmin; 1 ms .. 1 day, into usec. */
static bool parse_duration(const char *v, uint64_t *out)
{
	char *end;
	double n;
	uint64_t unit = 1000000;

	if (!v || !*v)
		return false;
	n = strtod(v, &end);
	while (*end == ' ')
		end++;
	if (strcmp(end, "ms") == 0)
		unit = 1000;
	else if (strcmp(end, "min") == 0)
		unit = 60000000;
	else if (*end && strcmp(end, "s") != 0)
		return false;
	if (!(n * (double)unit >= 1000.0 && n * (double)unit <= 86400e6))
		return false;
	*out = (uint64_t)(n * (double)unit);
	return true;
}

static int or_config_check(lk_plugin *self, lk_event *ev)
{
	bool b;
	size_t n;
	int k;
	uint64_t us;

	(void)self;
	if (!parse_bool(api->config_get(ev, "route_log"), &b))
		return api->config_error(ev, "route_log", "must be on or off");
	if (!parse_bool(api->config_get(ev, "rewrite"), &b))
		return api->config_error(ev, "rewrite", "must be on or off");
	if (!parse_size(api->config_get(ev, "parse_cache_size"), &n))
		return api->config_error(ev, "parse_cache_size", "must be a number of statements 16..1000000");
	if (!parse_force_plan(api->config_get(ev, "force_custom_plan"), &k))
		return api->config_error(ev, "force_custom_plan", "must be on, off or auto");
	if (!parse_affinity(api->config_get(ev, "org_affinity"), &k))
		return api->config_error(ev, "org_affinity", "must be a number of organizations per server 0..32 (0: off)");
	if (!parse_server_org(api->config_get(ev, "server_org"), &k))
		return api->config_error(ev, "server_org", "must be statement, session or auto");
	if (!parse_duration(api->config_get(ev, "pause_timeout"), &us))
		return api->config_error(ev, "pause_timeout", "must be a duration from 1ms to 1 day (30s, 500ms, 2min)");
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
	bool rw = g->rewrite;
	parse_bool(api->config_get(ev, "rewrite"), &g->rewrite);
	if (rw != g->rewrite)
		g->gen++;	/* memoized rewrites were made under the other value */
	parse_size(api->config_get(ev, "parse_cache_size"), &n);
	parse_force_plan(api->config_get(ev, "force_custom_plan"), &g->force_plan);
	parse_affinity(api->config_get(ev, "org_affinity"), &g->org_affinity);
	parse_server_org(api->config_get(ev, "server_org"), &g->server_org);
	parse_duration(api->config_get(ev, "pause_timeout"), &g->pause_timeout);
	free(g->databases);
	g->databases = strdup(dbs ? dbs : "");
	g->mc = api->service_lookup(META_CACHE_SERVICE);
	subscribe(g);
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

/* x->cur and x->last_org: NULL or OR_ORG_MAX + 1 bytes, written in place
 * (they change with nearly every routed statement). NULL when out of memory. */
static void set_cur(char **dst, const char *v)
{
	size_t n = strlen(v);

	if (n > OR_ORG_MAX) {
		free(*dst);
		*dst = NULL;
		return;
	}
	if (!*dst && !(*dst = malloc(OR_ORG_MAX + 1)))
		return;
	memcpy(*dst, v, n + 1);
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
		size_t i = 0;
		while (i < len && i < 18 && in[i] >= '0' && in[i] <= '9')
			i++;
		if (i == len && (in[0] != '0' || len == 1)) {	/* already canonical */
			memcpy(out, in, len);
			out[len] = 0;
			return true;
		}
		memcpy(buf, in, len);
		buf[len] = 0;
		v = strtoll(buf, &end, 10);
		if (end == buf || *end)
			return false;
		or_format_int(v, out);		/* OR_ORG_MAX is more than 20 */
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
	if (cur_norm)
		return t->param <= cur_norm->n &&
		       normalize(type, cur_norm->vals[t->param - 1], strlen(cur_norm->vals[t->param - 1]), out);
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

/* The search_path tables are resolved along. */
static const char *path_of(const struct orc *x)
{
	return x->local_path ? x->local_path : x->search_path ? x->search_path : OR_DEFAULT_PATH;
}

/* After a change of the path or of the temporary relations: the key of what was resolved along it (with the user). */
static void path_changed(struct orc *x, lk_client *c)
{
	const char *p = path_of(x), *u = api->client_user(c);

	x->sp_key = or_hash(p, strlen(p), or_hash(u, strlen(u), 0));
	for (int i = 0; i < x->temps.n; i++)
		x->sp_key = or_hash(x->temps.v[i].name, strlen(x->temps.v[i].name) + 1, x->sp_key);
}

static void temp_del(struct or_temps *t, int i)
{
	free(t->v[i].name);
	t->v[i] = t->v[--t->n];
}

/* A temporary relation made (ON COMMIT DROP: at_commit), by the open transaction (in_block). */
static void temps_add(struct or_temps *t, const char *name, bool at_commit)
{
	if (!name || or_temps_has(t, name, strlen(name)))
		return;
	if (t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 4;
		struct or_temp *v = realloc(t->v, (size_t)cap * sizeof(*v));
		if (!v)
			return;
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n].name = strdup(name);
	if (!t->v[t->n].name)
		return;
	t->v[t->n].at_commit = at_commit;
	t->v[t->n].in_block = true;
	t->n++;
}

/* Forget the temporary relations: all, those of a rolled-back transaction, or those dropped at its commit. */
enum { TEMPS_ALL, TEMPS_ROLLBACK, TEMPS_COMMIT };
static bool temps_end(struct or_temps *t, int how)
{
	bool changed = false;

	for (int i = t->n; i-- > 0;) {
		if (how == TEMPS_ALL || (how == TEMPS_ROLLBACK && (t->v[i].in_block || t->v[i].at_commit)) ||
		    (how == TEMPS_COMMIT && t->v[i].at_commit)) {
			temp_del(t, i);
			changed = true;
		} else if (how == TEMPS_COMMIT) {
			t->v[i].in_block = false;
		}
	}
	return changed;
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
			if (t->param && !bind && !cur_norm)
				return SRC_PENDING;
			if (!term_value(ev, r->org_type, t, v))
				return SRC_NONE;
			if (t->param && !cur_norm)
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
			    a->stmts[k].effect == OR_FX_RESET_ALL || a->stmts[k].effect == OR_FX_DISCARD_ALL)
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

	if (!in_block && !x->saved) {
		/* what a ROLLBACK, or an error that rolls the transaction back, gives back */
		set_owned(&x->saved_org, x->session_org);
		set_owned(&x->saved_path, x->search_path);
		x->saved = true;
	}
	if (st->effect == OR_FX_BEGIN)
		x->sent_block = true;
	else if (st->effect != OR_FX_ROLLBACK)
		x->unsettled = true;	/* until its transaction is known to have ended well (or_query) */
	if (st->effect != OR_FX_ROLLBACK && LK_API_HAS(api, query_mark_txn))
		api->query_mark_txn(ev);	/* TXN_END says how its own transaction ended */
	switch (st->effect) {
	case OR_FX_SET_ORG:
		forget_var(ev, "lokadb.org");
		if (!effect_value(ev, &st->val, v))
			return;
		set_owned(st->is_local ? &x->local_org : &x->session_org, v[0] ? v : NULL);
		if (!st->is_local)
			set_owned(&x->local_org, NULL);
		set_cur(&x->cur, v);
		x->cur_valid = true;
		break;
	case OR_FX_RESET_ORG:
		forget_var(ev, "lokadb.org");
		set_owned(&x->session_org, NULL);
		set_owned(&x->local_org, NULL);
		set_cur(&x->cur, "");
		x->cur_valid = true;
		break;
	case OR_FX_TEMP_CREATE:
		temps_add(&x->temps, st->val.value, st->is_local);
		path_changed(x, c);
		return;
	case OR_FX_TEMP_DROP:
		for (const char *n = st->val.value; n && *n; n += strlen(n) + 1)
			for (int i = x->temps.n; i-- > 0;)
				if (strcmp(x->temps.v[i].name, n) == 0)
					temp_del(&x->temps, i);
		path_changed(x, c);
		return;
	case OR_FX_DISCARD_TEMP:
		if (temps_end(&x->temps, TEMPS_ALL))
			path_changed(x, c);
		return;
	case OR_FX_DISCARD_ALL:
		temps_end(&x->temps, TEMPS_ALL);
		/* fall through */
	case OR_FX_RESET_ALL:
		forget_var(ev, "lokadb.org");
		forget_var(ev, "plan_cache_mode");
		x->pcm = PCM_NONE;		/* RESET ALL / DISCARD ALL reset plan_cache_mode too */
		set_owned(&x->session_org, NULL);
		set_owned(&x->local_org, NULL);
		set_owned(&x->search_path, NULL);
		set_owned(&x->local_path, NULL);
		set_cur(&x->cur, "");
		x->cur_valid = true;
		path_changed(x, c);
		break;
	case OR_FX_SET_PATH:
	case OR_FX_RESET_PATH: {
		const char *v = st->effect == OR_FX_SET_PATH ? st->val.value : NULL;
		if (st->is_local) {
			set_owned(&x->local_path, v ? v : OR_DEFAULT_PATH);
		} else {
			set_owned(&x->search_path, v);
			set_owned(&x->local_path, NULL);	/* a SET after a SET LOCAL outlasts it */
		}
		path_changed(x, c);
		return;
	}
	case OR_FX_BEGIN:	/* (saved above) */
		return;
	case OR_FX_ROLLBACK:
		if (x->saved) {
			set_owned(&x->session_org, x->saved_org);
			set_owned(&x->search_path, x->saved_path);
		}
		set_owned(&x->local_path, NULL);
		temps_end(&x->temps, TEMPS_ROLLBACK);
		path_changed(x, c);
		set_owned(&x->local_org, NULL);
		x->cur_valid = false;
		if (x->pcm_in_block) {
			x->pcm = PCM_NONE;
			x->pcm_in_block = false;
		}
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

/* The key parse-cache entries and rewrite memos are valid for. */
static uint64_t cat_key(const struct orr *g)
{
	return (g->mc->version() << 20) ^ g->gen;
}

/*
 * Is plan_cache_mode = force_custom_plan wanted on the servers? With `auto`,
 * while some organization has partitions of its own: a prepared statement
 * on a parent then risks PostgreSQL's generic plan over every partition
 * (README, "Generic plans"). With every organization in DEFAULT a parent has
 * its DEFAULT partition alone and the generic plan is the cheap one. A
 * meta_cache without n_partitions: as `on`.
 */
static bool force_custom(const struct orr *g)
{
	if (g->force_plan != FP_AUTO)
		return g->force_plan == FP_ON;
	if (g->mc->size < offsetof(struct meta_cache_api, n_partitions) + sizeof(g->mc->n_partitions) ||
	    !g->mc->n_partitions)
		return true;
	return g->mc->n_partitions() > 0;
}

/* A core of ABI 1.8 sends query_set_var values also where no simple Query may go. */
static bool core_sends_anywhere(void)
{
	return LK_API_HAS(api, query_set_var) && api->abi_minor >= 8;
}

/* force_custom_plan for the statement, if force_custom() wants it on the servers. */
static int pcm_custom(const struct orr *g)
{
	return force_custom(g) ? PCM_CUSTOM : PCM_NONE;
}

/* force_custom_plan where a core before ABI 1.8 needs it (plan_mode_for). */
static int old_core_plan_mode(const struct orr *g)
{
	return core_sends_anywhere() ? PCM_NONE : pcm_custom(g);
}

/*
 * The plan_cache_mode a message on LokaDB tables asks for. PostgreSQL's plan
 * cache picks a plan at a Bind (and at an EXECUTE, see route_message); a
 * simple Query is planned for its own values: none. Left on a parent:
 * force_custom_plan, while force_custom() wants it. Addressed to its
 * organization's leaves with `auto`: PostgreSQL's own choice, as a leaf's
 * generic plan touches the leaf alone and saves a planning per execution.
 * An INSERT whose one LokaDB table is its target (parent_insert) has no
 * partition in its plan: with `auto` it asks for nothing, so that the mode
 * does not flip between it and the reads around it.
 * A core before ABI 1.8 cannot send values before every Bind: there every
 * Query, Parse, BEGIN and PREPARE also asks for force_custom_plan
 * (old_core_plan_mode), as the Binds behind them may get nothing.
 */
static int plan_mode_for(const struct orr *g, lk_event *ev, const struct decision *d)
{
	if (!force_custom(g))
		return PCM_NONE;
	if (api->query_type(ev) == 'Q' || !core_sends_anywhere())
		return old_core_plan_mode(g);
	if (g->force_plan == FP_AUTO && d->first && d->first->parent_insert)
		return PCM_NONE;	/* (a Parse or Bind: one statement, whose plan has no partition) */
	return g->force_plan == FP_AUTO && strcmp(d->rewrite, "leaf") == 0 ? PCM_AUTO : PCM_CUSTOM;
}

/*
 * May a simple Query go before this message? Not before a Bind of the
 * unnamed statement (it would drop the statement), not after a Parse or Bind
 * of the same batch (README "Inside an extended-protocol batch").
 */
static bool prefix_safe(lk_event *ev, const struct orc *x)
{
	char type = api->query_type(ev);

	return !((type == 'B' && api->query_statement(ev)[0] == 0) || (type != 'Q' && x->batch_open));
}

static void note_plan_mode(struct orr *g, lk_client *c, struct orc *x)
{
	x->pcm = x->pcm_want;
	if (api->client_in_transaction(c))
		x->pcm_in_block = true;
	g->n[N_PLAN_MODE]++;
}

/* A route_log line kept until the core has decided the prefix (vars_done). */
struct plog {
	struct decision d;
	char type;
	const char *what;
};

static void route_log_line(struct orr *g, lk_client *c, char type, const struct decision *d, const char *decision);

/* The core decided the message's query_set_var values (it has its server now). */
static void vars_done(lk_plugin *self, lk_client *c, int outcome, unsigned sent, void *arg)
{
	struct orr *g = G(self);
	struct orc *x = arg;
	const char *what = "known";

	if (outcome == LK_VARS_SENT) {
		what = "sent";
		g->n[N_PREFIXES]++;
		if (x->pcm_bit >= 0)
			x->pcm = x->pcm_want;
		if (x->pcm_bit >= 0 && (sent & (1u << x->pcm_bit))) {
			if (api->client_in_transaction(c) || x->changed_in_block)
				x->pcm_in_block = true;	/* (also: sent inside a batch, see ensure_org) */
			g->n[N_PLAN_MODE]++;
		}
		if (x->inline_req && !api->client_in_transaction(c)) {
			/* in front of the statement, outside a block: if the statement
			 * fails they are rolled back with it. The core records them
			 * only if it succeeds: let it decide next time. */
			x->cur_valid = false;
			x->pcm = PCM_NONE;
		}
	} else if (outcome == LK_VARS_KNOWN) {
		g->n[N_PREFIXES_KNOWN]++;
		if (x->pcm_bit >= 0)
			x->pcm = x->pcm_want;	/* the core knows its server has it (outside a block) */
	} else {
		what = "skipped";
		g->n[N_PREFIXES_SKIPPED]++;
		x->cur_valid = false;	/* the server keeps whatever it had */
	}
	if (x->plog) {
		x->plog->d.prefix = what;
		route_log_line(g, c, x->plog->type, &x->plog->d, x->plog->what);
		free(x->plog);
		x->plog = NULL;
	}
}

/* The message changes `name` on its server itself: the core forgets what it knew. */
static void forget_var(lk_event *ev, const char *name)
{
	if (LK_API_HAS(api, query_set_var))
		api->query_set_var(ev, name, NULL);
}

/*
 * Make the server's lokadb.org be d->org ("" when none; with d->of_session
 * the client's session organization instead) before the message,
 * unless the client's server is known to have it; plan_cache_mode =
 * pcm_values[want] (unless PCM_NONE) goes with it while the server is not
 * known to have it. With ABI 1.5 the core decides once it has picked the server
 * (query_set_var): it knows which values each server connection has, so a
 * server that already has the organization (org_affinity) gets no prefix.
 */
static void ensure_org(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, struct decision *d, int want)
{
	char sql[OR_PREFIX_MAX], lit[2 * OR_ORG_MAX + 4];
	bool pcm = want != PCM_NONE && x->pcm != want;
	/* server_org = session (or auto, nothing reads it): what the client's session says */
	const char *org = !d->of_session ? d->org : session_org(x) ? session_org(x) : "";

	x->pcm_bit = -1;
	x->pcm_want = (uint8_t)want;
	if (!pcm && x->cur_valid && x->cur && strcmp(x->cur, org) == 0) {
		d->prefix = "known";
		return;
	}
	if (!prefix_safe(ev, x) && !core_sends_anywhere()) {
		d->prefix = "skipped";
		g->n[N_PREFIXES_SKIPPED]++;
		return;
	}
	if (LK_API_HAS(api, query_set_var) && api->query_set_var(ev, "lokadb.org", org) >= 0 &&
	    (want == PCM_NONE || (x->pcm_bit = api->query_set_var(ev, "plan_cache_mode", pcm_values[want])) >= 0) &&
	    api->query_on_vars(g->self, ev, vars_done, x) == 0) {
		d->prefix = "core";
		set_cur(&x->cur, org);
		x->cur_valid = x->cur != NULL;
		/* inside a block it may be rolled back; before a Parse or Bind the core
		 * may send it inside the batch, where it ends with the transaction */
		if (api->client_in_transaction(c) || (core_sends_anywhere() && api->query_type(ev) != 'Q'))
			x->changed_in_block = true;
		return;
	}
	if (!prefix_safe(ev, x)) {	/* query_prefix is a simple Query: not here */
		d->prefix = "skipped";
		g->n[N_PREFIXES_SKIPPED]++;
		return;
	}
	if (!or_quote_literal(org, lit, sizeof(lit)))
		return;
	snprintf(sql, sizeof(sql), "SELECT set_config('lokadb.org', %s, false)%s%s%s", lit,
		 pcm ? ", set_config('plan_cache_mode', '" : "", pcm ? pcm_values[want] : "", pcm ? "', false)" : "");
	if (api->query_prefix(ev, sql) != 0)
		return;
	d->prefix = "sent";
	g->n[N_PREFIXES]++;
	if (pcm)
		note_plan_mode(g, c, x);
	set_cur(&x->cur, org);
	x->cur_valid = x->cur != NULL;
	if (api->client_in_transaction(c))
		x->changed_in_block = true;
}

/* plan_cache_mode alone, where no organization is needed or known yet (an
 * EXECUTE, a Query's PREPARE waiting for its EXECUTE, a BEGIN without a
 * session organization). */
static void ensure_plan_mode(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, struct decision *d, int want)
{
	char sql[96];

	x->pcm_bit = -1;
	if (want == PCM_NONE || x->pcm == want || (!prefix_safe(ev, x) && !core_sends_anywhere()))
		return;
	x->pcm_want = (uint8_t)want;
	if (LK_API_HAS(api, query_set_var) &&
	    (x->pcm_bit = api->query_set_var(ev, "plan_cache_mode", pcm_values[want])) >= 0 &&
	    api->query_on_vars(g->self, ev, vars_done, x) == 0) {
		d->prefix = "core";
		return;
	}
	x->pcm_bit = -1;
	snprintf(sql, sizeof(sql), "SELECT set_config('plan_cache_mode', '%s', false)", pcm_values[want]);
	if (!prefix_safe(ev, x) || api->query_prefix(ev, sql) != 0)
		return;
	d->prefix = "sent";
	g->n[N_PREFIXES]++;
	note_plan_mode(g, c, x);
}

/* ---- statements whose text the plugin changed ---- */

static struct or_pstmt *pstmt_find(const struct orc *x, const char *name)
{
	for (struct or_pstmt *p = x->pstmts; p; p = p->next)
		if (strcmp(p->name, name) == 0)
			return p;
	return NULL;
}

static void pstmt_free(struct or_pstmt *p)
{
	free(p->name);
	free(p->orig);
	free(p->cur);
	free(p);
}

static void pstmt_forget(struct orc *x, const char *name)
{
	for (struct or_pstmt **pp = &x->pstmts; *pp; pp = &(*pp)->next) {
		if (strcmp((*pp)->name, name) == 0) {
			struct or_pstmt *p = *pp;
			*pp = p->next;
			pstmt_free(p);
			x->npstmts--;
			return;
		}
	}
}

/* The record whose text on the server is `cur` (a core of ABI 1.15 gives back a
 * statement's text when PostgreSQL refuses or skips the client's Parse of a new one). */
static struct or_pstmt *pstmt_match(const struct orc *x, const char *name, const char *cur)
{
	for (struct or_pstmt *p = x->pstmts; p; p = p->next)
		if (strcmp(p->name, name) == 0 && strcmp(p->cur, cur) == 0)
			return p;
	return NULL;
}

/*
 * Statement `name` now has text `cur` on the server for the client's
 * `orig`. With a core that gives texts back, the name's record before
 * stays too (one), for a Parse of the name that PostgreSQL refuses.
 */
static void pstmt_set(struct orc *x, const char *name, const char *orig, const char *cur, int max_param)
{
	struct or_pstmt *p = calloc(1, sizeof(*p));

	if (LK_API_HAS(api, client_on_answered)) {
		struct or_pstmt *same = pstmt_match(x, name, cur), **pp;
		int n = 0;
		if (same && strcmp(same->orig, orig) == 0) {
			free(p);
			return;
		}
		for (pp = &x->pstmts; *pp;) {	/* keep the newest other one of the name */
			if (strcmp((*pp)->name, name) == 0 && (*pp == same || ++n > 1)) {
				struct or_pstmt *old = *pp;
				*pp = old->next;
				pstmt_free(old);
				x->npstmts--;
			} else {
				pp = &(*pp)->next;
			}
		}
	} else {
		pstmt_forget(x, name);
	}
	if (!p || !(p->name = strdup(name)) || !(p->orig = strdup(orig)) || !(p->cur = strdup(cur))) {
		if (p)
			pstmt_free(p);
		return;
	}
	p->max_param = max_param;
	if (x->npstmts >= OR_PSTMT_MAX) {	/* bounded: drop the oldest (the tail) */
		struct or_pstmt **pp = &x->pstmts;
		while ((*pp)->next)
			pp = &(*pp)->next;
		pstmt_free(*pp);
		*pp = NULL;
		x->npstmts--;
	}
	p->next = x->pstmts;
	x->pstmts = p;
	x->npstmts++;
}

/* ---- rewrites ---- */

/* Does the organization have a leaf partition in a table the statement touches?
 * (Checked before a rewrite, which costs a parse: most organizations stay in
 * DEFAULT, and the memo of an entry keeps only a few organizations.) */
static bool any_leaf(struct orr *g, const struct or_analysis *a, const char *org)
{
	for (int i = 0; i < a->nrefs; i++)
		if (g->mc->leaf(a->refs[i].schema, a->refs[i].name, org))
			return true;
	return false;
}

/* The memo and template key of leaf templates: they serve every organization
 * (no organization id holds a control byte: see normalize()). */
static const char ORG_ANY[] = { OR_LEAF_MARK, 0 };

struct leaf_arg {
	const struct meta_cache_api *mc;
	const char *org;
};

static const char *leaf_of(void *arg, const char *schema, const char *table)
{
	const struct leaf_arg *l = arg;

	return l->mc->leaf(schema, table, l->org);
}

/*
 * A memoized rewrite made ready for this message: the literals of a
 * normalized text put back, the leaves of d->org put in a leaf template's
 * markers (valid until the next call). NULL: not rewritable for d->org.
 */
static char *fill_buf;		/* what filled() returns, reused */
static size_t fill_cap;
static struct or_spans fill_spans;	/* ... and where it differs from the client's text (bad: not known) */

static const char *filled(const struct orr *g, struct or_rewrite_memo *m, int i, bool tmpl,
			  const struct decision *d)
{
	struct leaf_arg l = { g->mc, d->org };
	const char *res = m->slot[i].sql;
	bool no_leaf, ok;

	fill_spans.bad = true;
	if (!res)
		return NULL;
	if (!tmpl && !cur_norm)
		return res;
	/* compiled at its first use, kept with it in the memo */
	if (m->slot[i].tpl || (m->slot[i].tpl = or_template_compile(res)))
		ok = or_template_run(m->slot[i].tpl, cur_norm, tmpl ? leaf_of : NULL, &l, &no_leaf, &fill_buf,
				     &fill_cap, tmpl ? &fill_spans : NULL);
	else
		ok = or_template_fill_buf(res, cur_norm, tmpl ? leaf_of : NULL, &l, &no_leaf, &fill_buf, &fill_cap);
	return ok ? fill_buf : NULL;
}

/*
 * `sql` (analyzed as a) rewritten for d->org: to the leaves when to_leaf,
 * COPY table TO as COPY (query) TO. A leaf rewrite is made once per
 * parse-cache entry as a leaf template, whatever the number of
 * organizations, and filled in with the organization's leaves per message
 * (the entry of a normalized text keeps it with its $k marked, filled in
 * with the message's literals too); a COPY rewrite is memoized per
 * organization. NULL: nothing to
 * rewrite (or it failed: d->rewrite).
 */
static const char *rewritten(struct orr *g, lk_event *ev, const struct orc *x, const struct or_analysis *a,
			     const char *sql, struct decision *d, bool to_leaf)
{
	struct or_names names = { g->mc, path_of(x), NULL, &x->temps };
	struct or_rewrite_memo *m = or_cache_memo(g->cache, a);
	bool tmpl = to_leaf && d->first->kind != OR_K_COPY_TO_TABLE;
	const char *org = tmpl ? ORG_ANY : d->org, *err;
	uint64_t key = cat_key(g);
	enum or_rw_result rc;
	char *out;
	int i;

	/* a known template: filled in (NULL if the organization lacks a leaf) */
	if ((i = or_memo_find(m, org, key)) >= 0)
		return filled(g, m, i, tmpl, d);
	if (tmpl && !any_leaf(g, a, d->org))
		return NULL;	/* the organization has no partition of its own: nothing to address */
	names.user = api->client_user(api->ev_client(ev));
	g->n[N_REWRITES_MADE]++;
	rc = or_rewrite(sql, a, &names, tmpl ? NULL : d->org, to_leaf, &out, &err);
	if (rc == OR_RW_DONE && cur_norm) {	/* the literals' $k marked, to be filled per message */
		char *tpl = or_template_encode(out, cur_norm->n);
		free(out);
		out = tpl;
		if (!tpl) {
			rc = OR_RW_FAILED;
			err = "the rewrite of the normalized text does not keep each literal once";
		}
	}
	if (rc == OR_RW_FAILED) {
		g->n[N_REWRITE_FAILED]++;
		d->rewrite = "failed";
		api->log(g->self, LK_LOG_WARNING, "C-%" PRIu64 " could not rewrite a statement for organization %s: %s",
			 api->client_id(api->ev_client(ev)), d->org, err);
		out = NULL;	/* remembered as "not rewritable" */
	}
	if (!or_memo_put(m, org, key, rc == OR_RW_DONE ? out : NULL))
		return NULL;
	return (i = or_memo_find(m, org, key)) >= 0 ? filled(g, m, i, tmpl, d) : NULL;
}

/* The RowDescriptions of a statement addressed to leaves name the client's tables (ABI 1.13). */
static void result_tables(const struct orr *g, lk_event *ev)
{
	const struct meta_cache_api *mc = g->mc;
	lk_tables *t;

	if (LK_API_HAS(api, query_result_tables) &&
	    mc->size >= offsetof(struct meta_cache_api, result_tables) + sizeof(mc->result_tables) &&
	    mc->result_tables && (t = mc->result_tables()))
		api->query_result_tables(ev, t);
}

/* An INSERT of an isolated organization left on the parent (parent_insert): inserts_on_parent,
 * once per Query or Bind. */
static void count_parent_insert(struct orr *g, const struct or_analysis *a, const struct decision *d)
{
	const struct mc_org *o;

	if (a->nstmts == 1 && d->first->parent_insert && g->rewrite && d->src == SRC_STATEMENT &&
	    (o = g->mc->org(d->org)) && o->isolated)
		g->n[N_PARENT_INSERTS]++;
}

/* Address a single-organization Query or Parse to its leaves. */
static void maybe_rewrite(struct orr *g, lk_event *ev, struct orc *x, const struct or_analysis *a,
			  struct decision *d)
{
	char type = api->query_type(ev);
	bool copy_table = d->first->kind == OR_K_COPY_TO_TABLE;
	const char *res;
	char *orig = NULL;

	if (type == 'B' || a->nstmts != 1)
		return;
	if (!d->first->rewritable) {
		if (type == 'Q')	/* (a Parse's: at its Binds, bind_text) */
			count_parent_insert(g, a, d);
		return;
	}
	if (!(copy_table ? d->src != SRC_NONE : (g->rewrite && d->src == SRC_STATEMENT)))
		return;
	res = rewritten(g, ev, x, a, cur_norm ? cur_norm->text : api->query_sql(ev), d, g->rewrite);
	if (!res)
		return;
	/* a Parse's Binds see `res`: remember what it was */
	if (type == 'P' && !(orig = strdup(api->query_sql(ev))))
		return;
	if (api->query_rewrite(ev, res) == 0) {
		g->n[N_REWRITTEN]++;
		d->rewrite = copy_table ? "copy" : "leaf";
		/* where it differs, for PostgreSQL's errors about it (the core checks the rest is the client's) */
		if (!copy_table && !fill_spans.bad && fill_spans.n > 0 && LK_API_HAS(api, query_text_spans))
			api->query_text_spans(ev, fill_spans.s, fill_spans.n);
		if (!copy_table)
			result_tables(g, ev);
		if (g->route_log)
			snprintf(d->target, sizeof(d->target), "%s", res);
		if (type == 'P')
			pstmt_set(x, api->query_statement(ev), orig, res, a->max_param);
	}
	if (type == 'P')
		free(orig);
}

/*
 * At a Bind: the text the bound statement must have for this Bind's
 * organization (the leaves of an isolated organization, else the client's
 * text); when the server's text `cur` differs, the statement is parsed
 * again (api->query_reparse) right before the Bind.
 *
 * Each re-parse costs the server a Parse (or, with the core's prepared
 * statements, a Parse once per text and connection), so a batch (up to the
 * server's next idle ReadyForQuery, or a Query) gets at most
 * OR_REPARSE_LEAF_MAX of them to a leaf, and none inside a pipeline: after
 * that the statement stays on (or goes back to) the client's text, which
 * is right for every organization. Going back is never refused: it costs
 * one Parse, as the unnamed statement does at every Bind. false: the
 * statement has a leaf text of another organization and cannot be parsed
 * again (a core without query_reparse): the Bind must fail.
 */
static bool set_text(struct orr *g, lk_event *ev, struct orc *x, struct decision *d, const char *orig,
		     const char *want, const char *cur, int max_param);

static bool bind_text(struct orr *g, lk_event *ev, struct orc *x, const struct or_analysis *a,
		      struct decision *d, const char *orig, const char *cur)
{
	const char *want = orig;

	if (g->rewrite && a->nstmts == 1 && d->first->rewritable && d->src == SRC_STATEMENT &&
	    d->first->kind != OR_K_COPY_TO_TABLE && d->first->kind != OR_K_COPY_TO_QUERY) {
		const char *leaf = rewritten(g, ev, x, a, orig, d, true);
		if (leaf && ((!x->pipelines && x->batch_reparses < OR_REPARSE_LEAF_MAX) || strcmp(leaf, cur) == 0))
			want = leaf;
	} else if (a->nstmts == 1 && !d->first->rewritable) {
		count_parent_insert(g, a, d);
	}
	if (want != orig) {
		d->rewrite = "leaf";
		if (g->route_log)
			snprintf(d->target, sizeof(d->target), "%s", want);
	}
	return set_text(g, ev, x, d, orig, want, cur, a->max_param);
}

/*
 * Does PostgreSQL refuse this Bind for its number of values? It counts the
 * statement's parameters as the larger of the types its Parse declared and
 * the highest $n of its text (max_param, the same in a leaf text), and
 * checks them first (08P01), before the statement's text is looked at
 * again: a re-parse in front of the Bind would fail first with an error of
 * its own (after a SET search_path, its text may name another table).
 */
static bool bind_miscounted(lk_event *ev, int max_param)
{
	int declared;

	if (max_param < 0 || !LK_API_HAS(api, query_stmt_declared) || (declared = api->query_stmt_declared(ev)) < 0)
		return false;
	return api->query_nparams(ev) != (declared > max_param ? declared : max_param);
}

/*
 * The server's text of the Bound statement (`cur`) to `want` (the client's
 * own `orig`, whose highest $n is max_param, or a leaf text), by parsing it
 * again within the batch's limits (bind_text). A Bind PostgreSQL refuses
 * for its number of values goes as it is. false: the text cannot be
 * changed, and the Bind must fail.
 */
static bool set_text(struct orr *g, lk_event *ev, struct orc *x, struct decision *d, const char *orig,
		     const char *want, const char *cur, int max_param)
{
	const char *name = api->query_statement(ev);

	if (strcmp(want, cur) == 0)
		return true;
	if (bind_miscounted(ev, max_param)) {
		d->rewrite = "miscounted";
		return true;
	}
	if (!LK_API_HAS(api, query_reparse) || api->query_reparse(ev, want) != 0) {
		/* the server has another organization's leaf text: the Bind must not run with it */
		d->rewrite = "failed";
		g->n[N_REPARSE_REFUSED]++;
		return false;
	}
	x->batch_reparses++;
	g->n[N_REPARSED]++;
	d->reparsed = true;
	if (want == orig) {
		d->rewrite = "parent";
		pstmt_forget(x, name);
	} else {
		g->n[N_REWRITTEN]++;
		pstmt_set(x, name, orig, want, max_param);
		result_tables(g, ev);	/* the statement's and its portal's */
	}
	return true;
}

static void route_log_line(struct orr *g, lk_client *c, char type, const struct decision *d, const char *decision)
{
	api->log(g->self, LK_LOG_INFO, "C-%" PRIu64 " %c org=%s decision=%s target=%s rewrite=%s prefix=%s%s",
		 api->client_id(c), type, d->org[0] ? d->org : "-", decision,
		 d->target[0] ? d->target : "-", d->rewrite, d->prefix, d->reparsed ? " reparse=yes" : "");
}

/* A line whose prefix the core has not decided yet comes out of plog_flush
 * or vars_done (prefix=sent, known or skipped). */
static void plog_flush(struct orr *g, struct orc *x)
{
	if (!x->plog)
		return;
	x->plog->d.prefix = "unsent";	/* the message never reached a server */
	route_log_line(g, x->c, x->plog->type, &x->plog->d, x->plog->what);
	free(x->plog);
	x->plog = NULL;
}

static void route_log(struct orr *g, lk_event *ev, const struct decision *d, const char *decision)
{
	lk_client *c = api->ev_client(ev);
	struct orc *x;

	if (!g->route_log)
		return;
	if (strcmp(d->prefix, "core") == 0 && (x = api->client_ctx(g->self, c)) != NULL) {
		plog_flush(g, x);
		if ((x->plog = malloc(sizeof(*x->plog))) != NULL) {
			x->plog->d = *d;
			x->plog->type = api->query_type(ev);
			x->plog->what = decision;
			return;
		}
	}
	route_log_line(g, c, api->query_type(ev), d, decision);
}

/* ---- organization affinity of the pool ---- */

/* The key the core's pool prefers a server by, for the client's next transaction. */
static void give_affinity(struct orr *g, lk_client *c, struct orc *x, const char *org)
{
	if (!LK_API_HAS(api, client_set_affinity) || api->client_in_transaction(c))
		return;
	if (g->org_affinity == 0 || (org && !*org))
		org = NULL;
	if (org) {	/* DEFAULT's organizations share one partition: no affinity */
		const struct mc_org *o = g->mc->org(org);
		if (!o || !o->isolated)
			org = NULL;
	}
	x->aff_txn = true;
	if (org ? x->aff && strcmp(org, x->aff) == 0 && x->aff_max == g->org_affinity : !x->aff)
		return;
	set_owned(&x->aff, org);
	x->aff_max = g->org_affinity;
	api->client_set_affinity(c, x->aff, g->org_affinity);
}

/* Without an organization of its own, the next transaction is predicted to
 * be the session's organization, else the last one the client used. */
static const char *predicted_org(const struct orc *x)
{
	return session_org(x) ? session_org(x) : x->last_org;
}

static void affinity_for(struct orr *g, lk_client *c, struct orc *x, const struct decision *d)
{
	const char *org = predicted_org(x);

	if (d->first && (d->src == SRC_STATEMENT || d->src == SRC_SESSION) && d->org[0]) {
		org = d->org;
		if (!x->last_org || strcmp(x->last_org, org) != 0)
			set_cur(&x->last_org, org);
	}
	give_affinity(g, c, x, org);
}

/* ---- paused organizations ---- */

static bool org_paused(const struct orr *g, const char *org)
{
	const struct mc_org *o = org[0] ? g->mc->org(org) : NULL;

	return o && o->paused;
}

static void pause_unlink(struct orc *x)
{
	if (!x->pprev)
		return;
	*x->pprev = x->pnext;
	if (x->pnext)
		x->pnext->pprev = x->pprev;
	x->pnext = NULL;
	x->pprev = NULL;
}

static void pause_expired(lk_plugin *self, void *arg)
{
	struct orc *x = arg;
	struct orr *g = G(self);
	lk_event *ev = x->paused_ev;

	x->pause_timer = NULL;		/* freed before this call */
	if (!ev)
		return;
	pause_unlink(x);
	x->paused_ev = NULL;
	g->n[N_PAUSE_TIMEOUTS]++;
	api->log(self, LK_LOG_WARNING, "C-%" PRIu64 " organization %s stayed paused longer than pause_timeout (%s): "
		 "statement failed", api->client_id(x->c), x->pause_org, api->setting(self, "pause_timeout"));
	api->resume_error(x->c, "55P03",
			  "organization %s is paused (its data is being moved) and stayed paused longer than "
			  "pause_timeout (%s): the statement was not run", x->pause_org,
			  api->setting(self, "pause_timeout"));
}

/* Hold the message until its organization is unpaused (or pause_timeout). */
static int hold_paused(struct orr *g, lk_event *ev, struct orc *x, struct decision *d)
{
	if (!x->pause_timer) {
		x->pause_timer = api->timer_add(g->self, g->pause_timeout, 0, pause_expired, x);
		if (!x->pause_timer)
			return api->fail(ev, "53200", "out of memory");
	}
	g->n[N_HELD_PAUSE]++;
	snprintf(x->pause_org, sizeof(x->pause_org), "%s", d->org);
	x->paused_ev = ev;
	x->pnext = g->paused;
	if (g->paused)
		g->paused->pprev = &x->pnext;
	g->paused = x;
	x->pprev = &g->paused;
	route_log(g, ev, d, "paused");
	return LK_ASYNC;
}

/*
 * Only statements that start a transaction, or come in a block that has not
 * touched a LokaDB table yet, are held: a block that has may hold the locks
 * the switch of the move waits for, and holding it would stall both.
 */
static bool may_hold(lk_client *c, const struct orc *x)
{
	return !api->client_in_transaction(c) || !x->block_lokadb;
}

/*
 * May the session values go in front of this statement, in its transaction
 * (query_vars_inline)? One statement without session effects that runs the
 * same in the implicit transaction block it then shares with the SETs: a
 * SELECT, INSERT, UPDATE or DELETE, also under EXPLAIN (analyze.c gives an
 * EXPLAIN its statement's kind); for a Parse or Bind also a COPY (the
 * core's extended messages go in front of it, ABI 1.9; an older core
 * refuses those), and a DECLARE, LOCK, TRUNCATE or CREATE TABLE AS
 * (batchable: in the extended protocol's batch they run as alone; not in
 * front of a Query, whose implicit block would let a DECLARE or LOCK
 * outside a transaction block run where alone it fails). Not a statement
 * that refuses blocks or a pipeline (VACUUM, CREATE DATABASE), a COMMIT, a
 * second statement of the client's: those get the values in a Query of
 * their own, or, inside a batch, not at all. Nor a Query's EXECUTE: an
 * error in the prepared statement's text has its position in that text,
 * which the values in front of the client's do not move.
 */
static bool want_inline(lk_event *ev, const struct or_analysis *a)
{
	const struct or_stmt *st = &a->stmts[0];
	bool q = api->query_type(ev) == 'Q';
	int last = q ? OR_K_DELETE : OR_K_COPY_FROM;

	/* (making a temporary table is no effect on what the values set) */
	return a->nstmts == 1 && !a->ends_txn && !a->parse_error &&
	       (st->effect == OR_FX_NONE || st->effect == OR_FX_TEMP_CREATE) &&
	       ((st->kind >= OR_K_SELECT && st->kind <= last) || (a->executes && !q) || (!q && st->batchable)) &&
	       LK_API_HAS(api, query_vars_inline) && api->query_vars_inline(ev) == 0;
}

/* The Bind whose statement cannot be parsed again (bind_text, set_text) fails. */
static int reparse_refused(struct orr *g, lk_event *ev, struct decision *d)
{
	route_log(g, ev, d, "refused");
	return api->fail(ev, "0A000", "org_routing cannot parse statement \"%s\" again for organization "
			 "%s: its text on the server is another organization's and the core cannot parse it again",
			 api->query_statement(ev), d->org[0] ? d->org : "(none)");
}

/*
 * A message that touches no LokaDB table passes; a Bind of a statement whose
 * server text the plugin changed (`orig` is then the client's text, not
 * `sql`) gets the client's text back first: after a SET search_path its
 * text may name no LokaDB table any more.
 */
static int pass_message(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, const char *orig,
			const char *sql)
{
	bool back = orig != sql && api->query_type(ev) == 'B';

	g->n[N_PASSED]++;
	give_affinity(g, c, x, predicted_org(x));
	if (back || g->route_log) {
		struct decision d = { .rewrite = "no", .prefix = "-" };
		const struct or_pstmt *p = back ? pstmt_match(x, api->query_statement(ev), sql) : NULL;
		if (back && !set_text(g, ev, x, &d, orig, orig, sql, p ? p->max_param : -1))
			return reparse_refused(g, ev, &d);
		route_log(g, ev, &d, "pass");
	}
	return LK_CONTINUE;
}

/*
 * Does the server get the client's session organization rather than the
 * statement's (server_org)? With `auto`, the statement's only where some code
 * may read it: code in the cloud database that reads settings (meta_cache's
 * setting_readers) or the statement's own text. A meta_cache without
 * setting_readers: as `statement`.
 */
static bool org_of_session(const struct orr *g, const struct or_analysis *a)
{
	if (g->server_org != SO_AUTO)
		return g->server_org == SO_SESSION;
	if (a->reads_settings ||
	    g->mc->size < offsetof(struct meta_cache_api, setting_readers) + sizeof(g->mc->setting_readers) ||
	    !g->mc->setting_readers)
		return false;
	return !g->mc->setting_readers();
}

/* A message on LokaDB tables, or with session effects. */
static int route_message(struct orr *g, lk_event *ev, lk_client *c, struct orc *x, const struct or_analysis *a,
			 const char *orig, const char *cur)
{
	struct decision d = { .src = SRC_NONE, .rewrite = "no", .prefix = "-" };
	char type = api->query_type(ev);

	x->inline_req = false;
	decide_org(ev, x, a, &d);
	d.of_session = org_of_session(g, a);
	if (d.refusal) {
		const struct or_ref *r = d.refused_ref;
		g->n[N_REFUSED]++;
		describe_target(a, d.first, &d);
		route_log(g, ev, &d, "refused");
		return api->fail(ev, "0A000", d.refusal, r->schema, r->name, r->org_column);
	}
	if (g->route_log)
		describe_target(a, d.first, &d);
	if (d.first && d.src != SRC_PENDING && org_paused(g, d.org) && may_hold(c, x))
		return hold_paused(g, ev, x, &d);
	affinity_for(g, c, x, &d);
	if (d.first && d.src == SRC_PENDING) {
		/* the Bind decides (a Query: PREPARE ... $1, whose EXECUTE asks for
		 * plan_cache_mode itself). With an older core plan_cache_mode goes
		 * here, before a Query only: before a Parse, the prefix's
		 * ReadyForQuery can reach the core before the client's Sync, and
		 * the core then takes the server for idle (see README, "Needs from
		 * the core") */
		if (type == 'Q')
			ensure_plan_mode(g, ev, c, x, &d, old_core_plan_mode(g));
		route_log(g, ev, &d, "pending");
	} else if (d.first && type == 'B') {
		if (d.params) {		/* decided now, with the values */
			g->n[N_ROUTED]++;
			g->n[N_ORG_STATEMENT]++;
		}
		if (!bind_text(g, ev, x, a, &d, orig, cur))
			return reparse_refused(g, ev, &d);
		/* decided at the Parse: a later Bind (a new transaction) may need the prefix again */
		x->inline_req = want_inline(ev, a);
		ensure_org(g, ev, c, x, &d, plan_mode_for(g, ev, &d));
		if (d.params || d.reparsed || strcmp(d.prefix, "known") != 0)
			route_log(g, ev, &d, d.params ? "param" : source_names[d.src]);
	} else if (d.first) {
		g->n[N_ROUTED]++;
		g->n[d.src == SRC_STATEMENT ? N_ORG_STATEMENT : d.src == SRC_SESSION ? N_ORG_SESSION : N_ORG_NONE]++;
		maybe_rewrite(g, ev, x, a, &d);
		x->inline_req = want_inline(ev, a);
		/* a Parse needs no organization (PostgreSQL plans and runs at the
		 * Bind, which ensures it): a core that sends values inside batches
		 * gets them there, once */
		if (!d.after_set && !(type == 'P' && core_sends_anywhere()))
			ensure_org(g, ev, c, x, &d, plan_mode_for(g, ev, &d));
		route_log(g, ev, &d, source_names[d.src]);
	} else if (a->stmts[0].effect == OR_FX_BEGIN) {
		/* A block's later Parses are not batch starts that the plugin can
		 * recognize (see ensure_org): give the block the session's
		 * organization (and plan_cache_mode) now, while a prefix is safe. */
		if (session_org(x)) {
			snprintf(d.org, sizeof(d.org), "%s", session_org(x));
			ensure_org(g, ev, c, x, &d, old_core_plan_mode(g));
		} else if (type == 'Q') {
			ensure_plan_mode(g, ev, c, x, &d, old_core_plan_mode(g));
		}
		route_log(g, ev, &d, "begin");
	} else if (a->executes) {
		/* EXECUTE of a statement prepared with PREPARE, perhaps on a parent:
		 * PostgreSQL's plan cache picks its plan now (at the Bind with the
		 * extended protocol) */
		if (type != 'P') {
			x->inline_req = want_inline(ev, a);
			ensure_plan_mode(g, ev, c, x, &d, pcm_custom(g));
		}
		route_log(g, ev, &d, "execute");
	} else {
		route_log(g, ev, &d, "set");
	}
	if (d.first)
		x->block_lokadb = true;
	if (type != 'P')
		apply_effects(g, ev, c, x, a);		/* they happen after the prefix, in the message */
	return LK_CONTINUE;
}

/* ================= hooks ================= */

/* Route a message whose catalog is current. LK_ASYNC: held (paused organization). */
#define MM_TABLE 1u		/* may_matter: a word names a LokaDB table */
#define MM_SESSION 2u		/* ... a word of a statement on the session or the transaction */
#define MM_PLAN_MODE 4u		/* ... the word plan_cache_mode */
static unsigned may_matter(struct orr *g, const struct orc *x, const char *user, const char *sql, unsigned found);

/* Salt of the parse-cache key of normalized texts (their memos hold templates). */
#define OR_NORM_SALT 0x6e6f726d2d6b6579ULL

/* Can the analysis of a normalized text stand for the text's own? One
 * SELECT/INSERT/UPDATE/DELETE that changes nothing of the session, or a
 * statement on no LokaDB table. Anything else is analyzed as written. */
static bool norm_usable(const struct or_analysis *a)
{
	if (a->parse_error || a->effects || a->ends_txn || a->nstmts != 1)
		return false;
	if (!a->tables)
		return true;
	switch (a->stmts[0].kind) {
	case OR_K_SELECT:
	case OR_K_INSERT:
	case OR_K_UPDATE:
	case OR_K_DELETE:
		return true;
	default:
		return false;
	}
}

static int route_now(struct orr *g, lk_event *ev, lk_client *c, struct orc *x)
{
	const struct or_analysis *a = NULL;
	struct or_names names;
	const char *sql = api->query_sql(ev), *orig = sql;
	char type = api->query_type(ev), *orig_copy = NULL;
	int rc = LK_CONTINUE;
	unsigned mm;
	struct or_norm nm = { 0 };

	if (!sql)
		return LK_CONTINUE;
	if (type == 'P' && x->pstmts && !LK_API_HAS(api, client_on_answered)) {
		pstmt_forget(x, api->query_statement(ev));	/* a new text for that name */
	} else if (type == 'B' && x->pstmts && LK_API_HAS(api, client_on_answered)) {
		/* the core's text is the server's (it gives back one PostgreSQL kept) */
		struct or_pstmt *p = pstmt_match(x, api->query_statement(ev), sql);
		if (p && strcmp(p->orig, sql) != 0) {
			if (!(orig_copy = strdup(p->orig)))
				return LK_CONTINUE;
			orig = orig_copy;	/* decide on the client's own text */
		}
	} else if (type == 'B' && x->pstmts) {
		struct or_pstmt *p = pstmt_find(x, api->query_statement(ev));
		if (p && strcmp(p->cur, sql) != 0) {
			/* the core did not apply a re-parse: the server has `sql` */
			g->n[N_REPARSE_LOST]++;
			set_owned(&p->cur, sql);
		}
		if (p && strcmp(p->orig, sql) == 0) {
			pstmt_forget(x, api->query_statement(ev));
		} else if (p && p->cur) {
			if (!(orig_copy = strdup(p->orig)))
				return LK_CONTINUE;
			orig = orig_copy;	/* decide on the client's own text */
		}
	}
	if (type == 'Q' && or_normalize_known(orig, &nm) && or_shape_mm_usable(&nm)) {
		/* a text of a known shape: the prefilter's answer for its
		 * normalized text is memoized, its string literals are read */
		uint64_t ck = cat_key(g);
		if (!or_shape_mm_get(&nm, x->sp_key, ck, &mm)) {
			mm = may_matter(g, x, api->client_user(c), nm.text, 0);
			or_shape_mm_put(&nm, x->sp_key, ck, mm);
		}
		for (int i = 0; i < nm.n; i++)
			if (nm.toks[i][0] == '\'')
				mm = may_matter(g, x, api->client_user(c), nm.toks[i], mm);
	} else {
		or_norm_free(&nm);
		mm = may_matter(g, x, api->client_user(c), orig, 0);
	}
	if (mm & MM_PLAN_MODE) {
		forget_var(ev, "plan_cache_mode");	/* a SET or set_config of it, perhaps */
		x->pcm = PCM_NONE;
	}
	if (!mm) {
		g->n[N_PREFILTERED]++;
		x->last_ends_txn = false;
		rc = pass_message(g, ev, c, x, orig, sql);
		goto done;
	}
	names.mc = g->mc;
	names.search_path = path_of(x);
	names.user = api->client_user(c);
	names.temps = &x->temps;
	/* A simple Query naming tables only: its analysis is shared by every
	 * text that differs from it only by literals (normalize.c). */
	if (type == 'Q' && mm == MM_TABLE && (nm.text || or_normalize(orig, &nm))) {
		/* the shape remembers its entry: no hash of the normalized text */
		uint64_t nk = x->sp_key ^ OR_NORM_SALT, ck = cat_key(g);
		struct or_cache_ref ref;
		bool hit = or_shape_entry_get(&nm, nk, &ref) && (a = or_cache_at(g->cache, &ref, nk, ck)) != NULL;
		if (!hit) {
			struct or_cache_stats st0, st;
			or_cache_stats(g->cache, &st0);
			a = or_cache_get_ref(g->cache, nm.text, nk, ck, &names, &ref);
			or_cache_stats(g->cache, &st);
			hit = st.hits != st0.hits;
			if (a && ref.gen)
				or_shape_entry_put(&nm, nk, &ref);
		}
		if (a && norm_usable(a)) {
			g->n[N_NORMALIZED]++;
			if (hit)
				g->n[N_NORM_HITS]++;
			cur_norm = &nm;
		} else {
			a = NULL;
			or_norm_free(&nm);
		}
	}
	if (!a)
		a = or_cache_get(g->cache, orig, x->sp_key, cat_key(g), &names);
	if (!a)
		goto done;
	x->last_ends_txn = a->ends_txn;
	if (a->ends_txn && type != 'P')
		x->sent_block = false;	/* (a Parse ends nothing: its Bind runs it) */
	if (a->parse_error)
		g->n[N_PARSE_ERRORS]++;
	if (!a->tables && !a->effects && !(a->executes && force_custom(g))) {
		rc = pass_message(g, ev, c, x, orig, sql);
		goto done;
	}
	rc = route_message(g, ev, c, x, a, orig, sql);
done:
	cur_norm = NULL;
	or_norm_free(&nm);
	free(orig_copy);
	return rc;
}

static bool mc_has_wait(const struct meta_cache_api *mc)
{
	return mc->size >= offsetof(struct meta_cache_api, wait_cancel) + sizeof(mc->wait_cancel) &&
	       mc->wait && mc->wait_cancel;
}

static void catalog_loaded(void *arg, uint64_t version);

/* Hold the message while meta_cache reloads, else route it. */
static int decide_message(struct orr *g, lk_event *ev, lk_client *c, struct orc *x)
{
	int rc;

	/* A change announced but not loaded yet: no statement runs with the old catalog. */
	if (mc_has_wait(g->mc) && g->mc->wait(catalog_loaded, x) == 0) {
		x->held = ev;
		return LK_ASYNC;
	}
	rc = route_now(g, ev, c, x);
	if (rc != LK_ASYNC && api->query_type(ev) != 'Q')
		x->batch_open = true;	/* until the server is idle again (TXN_END) or a Query */
	return rc;
}

/* A held message may go on: decide it (it may be held again) and resume. */
static void continue_message(struct orr *g, lk_event *ev, lk_client *c, struct orc *x)
{
	int rc = decide_message(g, ev, c, x);

	if (rc != LK_ASYNC)
		api->resume(c, rc == LK_ERROR ? LK_ERROR : LK_CONTINUE);
}

/* meta_cache loaded the change it knew of: route the held message now. */
static void catalog_loaded(void *arg, uint64_t version)
{
	struct orc *x = arg;
	lk_event *ev = x->held;

	(void)version;
	if (!ev)
		return;
	x->held = NULL;
	x->g->n[N_HELD]++;
	continue_message(x->g, ev, x->c, x);
}

/* The batches before a held message are answered, and TXN_END settled what they did: decide it. */
static void batches_answered(lk_plugin *self, lk_client *c, void *arg)
{
	struct orc *x = arg;
	lk_event *ev = x->answer_ev;

	if (!ev)
		return;
	x->answer_ev = NULL;
	if (x->unsettled)
		x->sent_block = true;	/* no TXN_END: its server is in a block (a BEGIN not seen as one) */
	continue_message(G(self), ev, c, x);
}

/* After a catalog change: release the messages whose organization is no longer paused. */
static void release_paused(lk_plugin *self, void *arg)
{
	struct orr *g = arg;

	(void)self;
	g->release = NULL;
	for (;;) {
		struct orc *x = g->paused;
		lk_event *ev;
		while (x && org_paused(g, x->pause_org))
			x = x->pnext;
		if (!x)
			break;
		pause_unlink(x);
		if (x->pause_timer) {
			api->timer_cancel(x->pause_timer);
			x->pause_timer = NULL;
		}
		ev = x->paused_ev;
		x->paused_ev = NULL;
		continue_message(g, ev, x->c, x);	/* may hold it again, or resume it */
	}
}

static void on_catalog_change(void *arg, uint64_t version)
{
	struct orr *g = arg;

	(void)version;
	g->gen++;
	if (g->paused && !g->release)	/* from the loop, not inside meta_cache's callback */
		g->release = api->timer_add(g->self, 0, 0, release_paused, g);
}

static void subscribe(struct orr *g)
{
	if (!g->subscribed && g->mc && g->mc->on_change && g->mc->on_change(on_catalog_change, g) == 0)
		g->subscribed = true;
}

/*
 * Does the unqualified `word` (n bytes) name a LokaDB table along the
 * client's search path? meta_cache's table_search (a hash lookup per schema
 * of the path, about 1,100 instructions) is asked once per word, search path
 * and catalog; the prefilter looks up every word of a statement until one
 * is a table (9 for the benchmark's read: SELECT, the columns, FROM), and
 * the same words come again and again.
 */
static bool word_is_table(struct orr *g, const struct orc *x, const char *word, size_t n, const char *path,
			  const char *user)
{
	uint64_t key = cat_key(g), h = or_hash(word, n, x->sp_key);
	struct word_memo *m;

	if (or_temps_has(&x->temps, word, n))
		return true;	/* the session's temporary relation: parsed, so that its DROP is seen */
	if (!g->words && !(g->words = calloc(WORD_MEMO, sizeof(*g->words))))
		return g->mc->table_search(word, path, user) != NULL;
	m = &g->words[h % WORD_MEMO];
	if (m->len != n || m->sp_key != x->sp_key || m->key != key || memcmp(m->word, word, n) != 0) {
		if (n >= sizeof(m->word))
			return g->mc->table_search(word, path, user) != NULL;
		m->table = g->mc->table_search(word, path, user) != NULL;
		m->len = (uint8_t)n;
		m->sp_key = x->sp_key;
		m->key = key;
		memcpy(m->word, word, n);
	}
	return m->table;
}

/* Byte classes of may_matter (C locale, as PostgreSQL's scanner): */
#define CC_START 1u	/* starts a word: a letter, _ or a byte >= 0x80 */
#define CC_WORD 2u	/* continues one: also digits and $ */
#define CC_SPACE 4u	/* isspace() */

static unsigned char cclass[256];

static void cclass_init(void)
{
	for (int c = 0; c < 256; c++) {
		unsigned k = 0;
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80)
			k |= CC_START | CC_WORD;
		if ((c >= '0' && c <= '9') || c == '$')
			k |= CC_WORD;
		if (c == ' ' || (c >= '\t' && c <= '\r'))
			k |= CC_SPACE;
		cclass[c] = (unsigned char)k;
	}
}

/* The words of statements on the session or the transaction, lower-case,
 * in byte order: a word is compared only with those of its first byte. */
static const char *const mm_keywords[] = {
	"abort", "begin", "commit", "deallocate", "discard", "end", "execute", "lokadb", "plan_cache_mode",
	"prepare", "reset", "rollback", "search_path", "set_config", "start", NULL
};
enum { PLAN_MODE_WORD = 8 };	/* mm_keywords[8] */

/* MM_SESSION (| MM_PLAN_MODE) if the lower-case word (n bytes) is one of them. */
static unsigned mm_keyword(const char *word, size_t n)
{
	static signed char first[26];	/* a..z: the first keyword with that byte, -1: none */
	static unsigned char len[sizeof(mm_keywords) / sizeof(mm_keywords[0])];
	unsigned char c = (unsigned char)word[0];

	if (!len[0]) {
		memset(first, -1, sizeof(first));
		for (int k = 0; mm_keywords[k]; k++) {
			len[k] = (unsigned char)strlen(mm_keywords[k]);
			if (first[mm_keywords[k][0] - 'a'] < 0)
				first[mm_keywords[k][0] - 'a'] = (signed char)k;
		}
	}
	if (n < 3 || n > 15 || c < 'a' || c > 'z' || first[c - 'a'] < 0)
		return 0;
	for (int k = first[c - 'a']; mm_keywords[k] && mm_keywords[k][0] == word[0]; k++)
		if (len[k] == n && memcmp(word, mm_keywords[k], n) == 0)
			return MM_SESSION | (k == PLAN_MODE_WORD ? MM_PLAN_MODE : 0);
	return 0;
}

/*
 * Prefilter: can this text matter to routing at all? It can when one of its
 * words (anywhere: identifiers, strings, comments) names a LokaDB table as
 * PostgreSQL would resolve it (schema.name, or name along the search_path),
 * or is a word of a statement that changes the session or ends a
 * transaction. Otherwise the message passes without being parsed or
 * cached, so statements with fresh literals (pgbench -M simple, ORMs that
 * inline values) neither cost a parse nor evict the cache. False positives
 * only cost the parse. One pass over the text, a byte-class table (no
 * ctype calls), a keyword compared only when its first byte and length match.
 * `found`: what is already known (the answer is or-ed to it); once MM_TABLE
 * is known, words are no longer looked up as tables.
 */
static unsigned may_matter(struct orr *g, const struct orc *x, const char *user, const char *sql, unsigned found)
{
	const char *path = path_of(x);
	char bufs[2][NAMEDATALEN_OR], *prev = bufs[0], *word = bufs[1];
	bool prev_dot = false;
	const unsigned char *p = (const unsigned char *)sql;

	if (!cclass['a'])
		cclass_init();
	prev[0] = 0;
	while (*p) {
		size_t n = 0;
		unsigned k = cclass[*p];
		bool quoted = false;
		char *t;
		if (*p == '"') {
			const unsigned char *w = ++p;
			while (*p && *p != '"')
				p++;
			n = (size_t)(p - w);
			if (n < NAMEDATALEN_OR)
				memcpy(word, w, n);
			if (*p)
				p++;
			quoted = true;
		} else if (k & CC_START) {
			/* the word, lower-cased as it is read (as much of it as fits) */
			do {
				if (n < NAMEDATALEN_OR)
					word[n] = (char)(*p >= 'A' && *p <= 'Z' ? *p + ('a' - 'A') : *p);
				n++;
				p++;
			} while (cclass[*p] & CC_WORD);
		} else {
			if (*p == '.')
				prev_dot = prev[0] != 0;
			else if (!(k & CC_SPACE)) {
				prev[0] = 0;
				prev_dot = false;
			}
			p++;
			continue;
		}
		if (n == 0 || n >= NAMEDATALEN_OR) {
			prev[0] = 0;
			prev_dot = false;
			continue;
		}
		word[n] = 0;
		if (!quoted)	/* (word is lower-case, as the keywords) */
			found |= mm_keyword(word, n);
		if (!(found & MM_TABLE) &&
		    ((prev_dot && g->mc->table(prev, word)) || word_is_table(g, x, word, n, path, user)))
			found |= MM_TABLE;
		t = prev;	/* this word is the previous one of the next */
		prev = word;
		word = t;
		prev_dot = false;
	}
	return found;
}

static int or_query(lk_plugin *self, lk_event *ev)
{
	struct orr *g = G(self);
	lk_client *c = api->ev_client(ev);
	struct orc *x = api->client_ctx(self, c);

	if (!x || !g->cache || !g->mc)
		return LK_CONTINUE;
	plog_flush(g, x);
	if (api->query_type(ev) == 'Q') {
		x->batch_open = false;	/* a client sends a Query only between batches */
		x->batch_reparses = 0;
		x->hooked_p = x->hooked_b = 0;
		x->p_after_b = false;
	} else if (api->query_type(ev) == 'P') {
		x->p_after_b |= x->hooked_b > 0;
		x->hooked_p += x->hooked_p < 1000;
	} else {
		x->hooked_b += x->hooked_b < 1000;
	}
	x->hooked_any = true;
	x->last_ends_txn = false;	/* route_now sets it from the analysis */
	bool past_sync = LK_API_HAS(api, ev_past_sync) && api->ev_past_sync(ev) == 1;
	if (past_sync) {
		x->pipelines = true;	/* sent past an unanswered Sync: it pipelines */
		x->calm = 0;
	}
	if (!g->mc->ready()) {
		forget_var(ev, "lokadb.org");	/* not looked at: it may set them */
		forget_var(ev, "plan_cache_mode");
		if (!g->warned_not_ready)
			api->log(self, LK_LOG_WARNING, "the catalog is not loaded yet: statements pass unrouted");
		g->warned_not_ready = true;
		return LK_CONTINUE;
	}
	subscribe(g);
	/*
	 * Sent past the Sync of a batch that changed the session (SET
	 * search_path or lokadb.org, a temporary table) outside a block: an
	 * error in that batch makes PostgreSQL undo the change, and this
	 * message runs without it. It is decided once the batches before it
	 * are answered and TXN_END has said how their transaction ended.
	 * Likewise a Bind of a statement whose Parse (or Close) is unanswered
	 * in an earlier batch: PostgreSQL may yet skip or refuse it (42P05, a
	 * name in use) and bind the text it had, which the Bind is decided on.
	 */
	if (past_sync && LK_API_HAS(api, client_on_answered) &&
	    ((x->unsettled && !x->sent_block) ||
	     (LK_API_HAS(api, query_stmt_unsettled) && api->query_stmt_unsettled(ev) == 1)) &&
	    api->client_on_answered(self, c, batches_answered, x) == 0) {
		x->answer_ev = ev;
		g->n[N_HELD_ANSWERS]++;
		return LK_ASYNC;
	}
	return decide_message(g, ev, c, x);
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
	const char *db = api->client_database(c);
	struct orc *x;

	if (!db || strcmp(db, "lokadb") == 0 || strcmp(db, "pgbouncer") == 0)
		return LK_CONTINUE;
	if (g->databases && *g->databases && !in_list(g->databases, db))
		return LK_CONTINUE;
	x = calloc(1, sizeof(*x));
	if (!x)
		return api->fail(ev, "53200", "out of memory");
	startup_options(x, api->client_param(c, "options"));
	path_changed(x, c);
	x->c = c;
	x->g = g;
	api->client_set_ctx(self, c, x);
	api->client_watch_queries(c, 1);
	return LK_CONTINUE;
}

static int or_route(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct orc *x = api->client_ctx(self, c);

	if (x) {
		x->routed = true;
		x->sticky = false;
		if (!x->aff_txn)	/* no QUERY decided this transaction (e.g. a Describe came first) */
			give_affinity(G(self), c, x, predicted_org(x));
	}
	return LK_CONTINUE;
}

/*
 * Did this idle ReadyForQuery end the client's batch? The plugin does not
 * see Syncs, and a client may send past a Sync before its ReadyForQuery
 * (pipelining): then its next messages may already be on the server without
 * a Sync, and a prefix there would fail (the core refuses it with 0A000).
 * The batch is taken as over when what came since the last ReadyForQuery is
 * one statement (at most a Parse then a Bind), or ends with a COMMIT or
 * ROLLBACK; with several statements it may continue past the Sync, so it
 * stays open until a simple Query or such a ReadyForQuery. A core of ABI
 * 1.14 says when a message comes past an unanswered Sync (or_query); with
 * an older one, a ReadyForQuery with nothing since the last one is taken
 * for the answer to a Sync sent behind another: the client pipelines (so
 * is, wrongly, a batch of a Describe or an Execute alone).
 */
static void txn_end_batch(struct orc *x)
{
	bool one = x->hooked_p <= 1 && x->hooked_b <= 1 && !x->p_after_b;

	if (!x->hooked_any && !LK_API_HAS(api, ev_past_sync)) {
		x->pipelines = true;
		x->calm = 0;
	} else if (one || x->last_ends_txn) {
		x->batch_open = false;
		x->batch_reparses = 0;
		if (x->pipelines && one && ++x->calm >= 8)
			x->pipelines = false;
	}
	x->hooked_p = x->hooked_b = 0;
	x->p_after_b = false;
	x->hooked_any = false;
	x->last_ends_txn = false;
}

static int or_txn_end(lk_plugin *self, lk_event *ev)
{
	struct orc *x = api->client_ctx(self, api->ev_client(ev));
	bool failed;

	if (!x)
		return LK_CONTINUE;
	x->txns++;
	if (!x->routed && x->txns > 1)
		x->sticky = true;
	x->routed = false;
	if (!x->sticky || x->changed_in_block || x->local_org)
		x->cur_valid = false;
	x->changed_in_block = false;
	txn_end_batch(x);
	/* rolled back by an error: what the transaction SET is undone, as a ROLLBACK
	 * undoes it (a core before ABI 1.15 cannot hold what a client sends past
	 * the Sync of such a transaction: its TXN_END may be a later batch's) */
	if (LK_API_HAS(api, ev_marked_txn_failed))
		failed = api->ev_marked_txn_failed(ev) == 1;
	else
		failed = LK_API_HAS(api, ev_txn_failed) && api->ev_txn_failed(ev) == 1 && !x->pipelines;
	x->unsettled = false;
	x->sent_block = false;
	if (failed) {
		if (x->saved) {
			set_owned(&x->session_org, x->saved_org);
			set_owned(&x->search_path, x->saved_path);
		}
		x->cur_valid = false;
	}
	if (!x->sticky || x->pcm_in_block)
		x->pcm = PCM_NONE;
	x->pcm_in_block = false;
	x->block_lokadb = false;
	x->aff_txn = false;
	set_owned(&x->local_org, NULL);
	set_owned(&x->saved_org, NULL);
	set_owned(&x->saved_path, NULL);
	x->saved = false;
	if (temps_end(&x->temps, failed ? TEMPS_ROLLBACK : TEMPS_COMMIT) | (x->local_path != NULL) | failed) {
		set_owned(&x->local_path, NULL);
		path_changed(x, api->ev_client(ev));
	}
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
	pause_unlink(x);
	if (x->pause_timer)
		api->timer_cancel(x->pause_timer);
	x->answer_ev = NULL;		/* (the core drops its waiter) */
	plog_flush(g, x);
	while (x->pstmts) {
		struct or_pstmt *p = x->pstmts;
		x->pstmts = p->next;
		pstmt_free(p);
	}
	free(x->aff);
	free(x->last_org);
	free(x->session_org);
	free(x->local_org);
	free(x->saved_org);
	free(x->search_path);
	free(x->local_path);
	free(x->saved_path);
	temps_end(&x->temps, TEMPS_ALL);
	free(x->temps.v);
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
	    api->config_declare(self, "org_affinity", "8",
				"organizations each server connection serves preferably (pool affinity), 0..32; 0: off") ||
	    api->config_declare(self, "pause_timeout", "30s",
				"how long a statement of a paused organization waits before it fails with 55P03") ||
	    api->config_declare(self, "force_custom_plan", "auto",
				"set plan_cache_mode = force_custom_plan on the servers of routed clients: on, off, "
				"or auto (while some organization has partitions of its own)") ||
	    api->config_declare(self, "server_org", "auto",
				"the server's lokadb.org before a statement on LokaDB tables: statement (its "
				"organization), session (the client's own SET lokadb.org), or auto (the "
				"statement's where code in the database or the statement reads settings)") ||
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
	if (g->release)
		api->timer_cancel(g->release);
	or_cache_free(g->cache);
	free(g->words);
	or_shapes_free();
	free(fill_buf);
	fill_buf = NULL;
	fill_cap = 0;
	free(g->databases);
	free(g);
}

LK_PLUGIN("org_routing", "0.1", or_init, or_fini)
