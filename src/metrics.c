/* SPDX-License-Identifier: ISC */
/*
 * metrics.c -- the Prometheus endpoint: `metrics_listen = host:port` serves
 * GET /metrics in the text exposition format 0.0.4, with libevent's evhttp
 * on the pooler's own event loop; every other path is 404.
 *
 * What it shows is what the console shows, read from the same objects at
 * the moment of the scrape: SHOW POOLS, STATS, DATABASES, LISTS and
 * PEER_POOLS, plus the metrics plugins register (api->metric_register,
 * ABI 1.4). Names follow one scheme (doc/usage.md, "Metrics"):
 *
 *	lokadb_<view>_<column>{<the view's key columns>}
 *
 * with PgBouncer's cl_/sv_ spelled out (client_/server_..._connections),
 * and the unit as a suffix where a column has one: _bytes, and _seconds
 * for times (the console's microseconds divided by 10^6). The totals of
 * SHOW STATS are counters; everything else is a gauge. A plugin's metric
 * is lokadb_<plugin>_<name>.
 *
 * A scrape is answered in one go from the loop: it walks the pools once per
 * family, which is cheap next to the network round trip. Slow or broken
 * HTTP clients cannot hold the pooler: evhttp reads and writes without
 * blocking, a connection idle for METRICS_TIMEOUT_SEC is closed, request
 * headers are limited to METRICS_MAX_HEADERS bytes and bodies to
 * METRICS_MAX_BODY, and only GET and HEAD are accepted.
 *
 * Owns: rt->metrics (the evhttp server and the plugins' registrations).
 * Registrations live until exit; the callbacks run only during a scrape.
 */
#include "core.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#define METRICS_PATH "/metrics"
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define METRICS_TIMEOUT_SEC 10
#define METRICS_MAX_HEADERS 8192
#define METRICS_MAX_BODY 1024
#define METRIC_NAME_MAX 200
#define EXACT_INT_MAX 9007199254740992.0	/* 2^53: doubles below are exact integers */

struct metric_reg {
	struct lk_plugin *pl;
	char *name;			/* full name: lokadb_<plugin>_<name> */
	char *help;
	int type;			/* enum lk_metric_type */
	lk_metric_fn fn;
	void *arg;
};

struct metrics {
	struct evhttp *http;
	struct metric_reg *regs;
	int n_regs;
};

/* A scrape being written: what api->metric_sample() appends to. */
struct lk_metrics {
	struct evbuffer *out;
	const struct metric_reg *reg;
};

static struct metrics *state(void)
{
	if (!rt->metrics)
		rt->metrics = xcalloc(1, sizeof(*rt->metrics));
	return rt->metrics;
}

/* ---- the text format ---- */

static bool valid_name(const char *s, bool colon_ok)
{
	if (!s || !*s || isdigit((unsigned char)*s))
		return false;
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '_' && !(colon_ok && *s == ':'))
			return false;
	return true;
}

/* HELP text escapes \ and newline; label values also escape ". */
static void put_escaped(struct evbuffer *out, const char *s, bool quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			evbuffer_add(out, "\\\\", 2);
		else if (*s == '\n')
			evbuffer_add(out, "\\n", 2);
		else if (quote && *s == '"')
			evbuffer_add(out, "\\\"", 2);
		else
			evbuffer_add(out, s, 1);
	}
}

static void family(struct evbuffer *out, const char *name, bool counter, const char *help)
{
	evbuffer_add_printf(out, "# HELP %s ", name);
	put_escaped(out, help, false);
	evbuffer_add_printf(out, "\n# TYPE %s %s\n", name, counter ? "counter" : "gauge");
}

/* name{l1="v1",...} value; labels NULL or name/value pairs up to NULL. False: a bad label name, nothing written. */
static bool sample(struct evbuffer *out, const char *name, const char *const *labels, double value)
{
	for (const char *const *l = labels; l && l[0]; l += 2)
		if (!valid_name(l[0], false) || !l[1])
			return false;
	evbuffer_add_printf(out, "%s", name);
	for (const char *const *l = labels; l && l[0]; l += 2) {
		evbuffer_add_printf(out, "%s%s=\"", l == labels ? "{" : ",", l[0]);
		put_escaped(out, l[1], true);
		evbuffer_add(out, "\"", 1);
	}
	if (labels && labels[0])
		evbuffer_add(out, "}", 1);
	if (isnan(value))
		evbuffer_add_printf(out, " NaN\n");
	else if (isinf(value))
		evbuffer_add_printf(out, " %sInf\n", value > 0 ? "+" : "-");
	else if (fabs(value) < EXACT_INT_MAX && value == floor(value))
		evbuffer_add_printf(out, " %" PRId64 "\n", (int64_t)value);
	else
		evbuffer_add_printf(out, " %.12g\n", value);
	return true;
}

/* ---- SHOW POOLS ---- */

static double pool_maxwait(const struct pool *p)
{
	const struct client *w = TAILQ_FIRST(&p->waiting_clients);
	return w ? (double)(now_mono() - w->wait_start) / USEC : 0;
}

static const struct pool_metric {
	const char *name, *help;
	size_t off;			/* an int field of struct pool, or 0 for maxwait */
	size_t off2;			/* a second int field added to it, or 0 */
} pool_metrics[] = {
	{ "lokadb_pools_client_active_connections", "Clients linked to a server or idle (SHOW POOLS cl_active).",
	  offsetof(struct pool, n_active_cl), 0 },
	{ "lokadb_pools_client_waiting_connections", "Clients waiting for a server (SHOW POOLS cl_waiting).",
	  offsetof(struct pool, n_waiting_cl), offsetof(struct pool, n_login_cl) },
	{ "lokadb_pools_server_active_connections", "Server connections linked to a client (SHOW POOLS sv_active).",
	  offsetof(struct pool, n_active_sv), 0 },
	{ "lokadb_pools_server_idle_connections", "Server connections idle in the pool (SHOW POOLS sv_idle).",
	  offsetof(struct pool, n_idle_sv), 0 },
	{ "lokadb_pools_server_tested_connections", "Server connections being reset or checked (SHOW POOLS sv_tested).",
	  offsetof(struct pool, n_tested_sv), 0 },
	{ "lokadb_pools_server_login_connections", "Server connections logging in (SHOW POOLS sv_login).",
	  offsetof(struct pool, n_login_sv), 0 },
	{ "lokadb_pools_maxwait_seconds", "How long the oldest waiting client has waited (SHOW POOLS maxwait).", 0, 0 },
};

static int pool_int(const struct pool *p, size_t off)
{
	return off ? *(const int *)((const char *)p + off) : 0;
}

static const struct pool_size_metric {
	const char *name, *help;
	int (*size)(const struct lk_config *cf, const struct db_conf *dc, const char *user);
} pool_size_metrics[] = {
	{ "lokadb_pools_pool_size", "Server connections of the pool: the [users] pool_size, else the database's.",
	  config_pool_size },
	{ "lokadb_pools_reserve_pool_size",
	  "Extra connections of the pool after reserve_pool_timeout: the [users] reserve_pool_size, else the database's.",
	  config_reserve_pool_size },
};

static void write_pools(struct evbuffer *out)
{
	for (size_t i = 0; i < sizeof(pool_size_metrics) / sizeof(pool_size_metrics[0]); i++) {
		const struct pool_size_metric *m = &pool_size_metrics[i];
		struct pool *p;
		family(out, m->name, false, m->help);
		TAILQ_FOREACH(p, &rt->pools, entry) {
			const char *labels[] = { "database", p->db->name, "user", p->user, NULL };
			sample(out, m->name, labels, m->size(rt->cf, &p->db->conf, p->user));
		}
	}
	for (size_t i = 0; i < sizeof(pool_metrics) / sizeof(pool_metrics[0]); i++) {
		const struct pool_metric *m = &pool_metrics[i];
		struct pool *p;
		family(out, m->name, false, m->help);
		TAILQ_FOREACH(p, &rt->pools, entry) {
			const char *labels[] = { "database", p->db->name, "user", p->user, NULL };
			double v = m->off ? pool_int(p, m->off) + pool_int(p, m->off2) : pool_maxwait(p);
			sample(out, m->name, labels, v);
		}
	}
	family(out, "lokadb_pools_affinity_assignments_total", true,
	       "Servers given to clients with an affinity key (a plugin's, e.g. org_routing's organization): "
	       "placement=\"home\" the key's home server, \"known\" another one that served the key lately (one of its last max_per_server keys), "
	       "\"away\" another one that had not.");
	for (struct pool *p = TAILQ_FIRST(&rt->pools); p; p = TAILQ_NEXT(p, entry)) {
		const char *home[] = { "database", p->db->name, "user", p->user, "placement", "home", NULL };
		const char *known[] = { "database", p->db->name, "user", p->user, "placement", "known", NULL };
		const char *away[] = { "database", p->db->name, "user", p->user, "placement", "away", NULL };
		sample(out, "lokadb_pools_affinity_assignments_total", home, (double)p->aff_home_count);
		sample(out, "lokadb_pools_affinity_assignments_total", known, (double)p->aff_known_count);
		sample(out, "lokadb_pools_affinity_assignments_total", away, (double)p->aff_away_count);
	}
	family(out, "lokadb_pools_server_statements_closed_total", true,
	       "Prepared statements closed on the pool's server connections to make room for another "
	       "(max_prepared_statements): each is parsed again when it comes back.");
	for (struct pool *p = TAILQ_FIRST(&rt->pools); p; p = TAILQ_NEXT(p, entry)) {
		const char *labels[] = { "database", p->db->name, "user", p->user, NULL };
		sample(out, "lokadb_pools_server_statements_closed_total", labels, (double)p->stats.server_evict_count);
	}
}

/* ---- SHOW STATS ---- */

enum stat_unit { UNIT_COUNT, UNIT_BYTES, UNIT_USEC };

static const struct stat_metric {
	const char *suffix, *help;	/* name: lokadb_stats_{total,avg}_<suffix> */
	size_t off;			/* uint64_t field of struct lk_stats */
	enum stat_unit unit;
} stat_metrics[] = {
	{ "server_assignment_count", "server connections assigned to clients", offsetof(struct lk_stats, server_assignment_count), UNIT_COUNT },
	{ "xact_count", "transactions", offsetof(struct lk_stats, xact_count), UNIT_COUNT },
	{ "query_count", "queries", offsetof(struct lk_stats, query_count), UNIT_COUNT },
	{ "received_bytes", "bytes received from clients", offsetof(struct lk_stats, bytes_received), UNIT_BYTES },
	{ "sent_bytes", "bytes sent to clients", offsetof(struct lk_stats, bytes_sent), UNIT_BYTES },
	{ "xact_time_seconds", "time in transactions", offsetof(struct lk_stats, xact_time), UNIT_USEC },
	{ "query_time_seconds", "time in queries", offsetof(struct lk_stats, query_time), UNIT_USEC },
	{ "wait_time_seconds", "time clients waited for a server", offsetof(struct lk_stats, wait_time), UNIT_USEC },
};

static double stat_value(const struct lk_stats *s, const struct stat_metric *m)
{
	uint64_t v = *(const uint64_t *)((const char *)s + m->off);
	return m->unit == UNIT_USEC ? (double)v / USEC : (double)v;
}

static void write_stats_family(struct evbuffer *out, const struct stat_metric *m, bool total)
{
	char name[METRIC_NAME_MAX], help[256];
	struct lk_db *db;

	snprintf(name, sizeof(name), "lokadb_stats_%s_%s", total ? "total" : "avg", m->suffix);
	if (total)
		snprintf(help, sizeof(help), "Total %s (SHOW STATS).", m->help);
	else if (m->unit == UNIT_USEC)
		snprintf(help, sizeof(help), "Average %s per %s over the last stats_period (SHOW STATS).", m->help,
			 m->off == offsetof(struct lk_stats, wait_time) ? "assignment" :
			 m->off == offsetof(struct lk_stats, xact_time) ? "transaction" : "query");
	else
		snprintf(help, sizeof(help), "Average %s per second over the last stats_period (SHOW STATS).", m->help);
	family(out, name, total, help);
	TAILQ_FOREACH(db, &rt->dbs, entry) {
		struct lk_stats t, g;
		const char *labels[] = { "database", db->name, NULL };
		admin_stats_sum(db, &t, &g);
		sample(out, name, labels, stat_value(total ? &t : &g, m));
	}
}

static void write_stats(struct evbuffer *out)
{
	for (int total = 1; total >= 0; total--)
		for (size_t i = 0; i < sizeof(stat_metrics) / sizeof(stat_metrics[0]); i++)
			write_stats_family(out, &stat_metrics[i], total);
}

/* ---- SHOW DATABASES ---- */

static int db_clients(const struct lk_db *db)
{
	struct pool *p;
	int n = 0;
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (p->db == db)
			n += p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
	return n;
}

static int or_global(int v, int global)
{
	return v >= 0 ? v : global;
}

enum db_col { DB_POOL_SIZE, DB_MIN_POOL, DB_RESERVE, DB_MAX_CONN, DB_CUR_CONN, DB_CUR_CLIENTS, DB_PAUSED, DB_DISABLED };

static const struct db_metric {
	const char *name, *help;
	enum db_col col;
} db_metrics[] = {
	{ "lokadb_databases_pool_size", "Server connections per pool (SHOW DATABASES pool_size).", DB_POOL_SIZE },
	{ "lokadb_databases_min_pool_size", "Server connections kept open per pool (SHOW DATABASES min_pool_size).", DB_MIN_POOL },
	{ "lokadb_databases_reserve_pool_size", "Extra connections after reserve_pool_timeout (SHOW DATABASES reserve_pool_size).", DB_RESERVE },
	{ "lokadb_databases_max_connections", "Most server connections of the database, 0 = unlimited (SHOW DATABASES max_connections).", DB_MAX_CONN },
	{ "lokadb_databases_current_connections", "Server connections of the database (SHOW DATABASES current_connections).", DB_CUR_CONN },
	{ "lokadb_databases_current_client_connections", "Client connections of the database (SHOW DATABASES current_client_connections).", DB_CUR_CLIENTS },
	{ "lokadb_databases_paused", "1 while the database is paused (SHOW DATABASES paused).", DB_PAUSED },
	{ "lokadb_databases_disabled", "1 while the database is disabled (SHOW DATABASES disabled).", DB_DISABLED },
};

static int db_value(const struct lk_db *db, enum db_col col)
{
	const struct db_conf *dc = &db->conf;
	const struct lk_config *cf = rt->cf;

	switch (col) {
	case DB_POOL_SIZE: return or_global(dc->pool_size, cf->default_pool_size);
	case DB_MIN_POOL: return or_global(dc->min_pool_size, cf->min_pool_size);
	case DB_RESERVE: return or_global(dc->reserve_pool_size, cf->reserve_pool_size);
	case DB_MAX_CONN: return dc->max_db_connections > 0 ? dc->max_db_connections : cf->max_db_connections;
	case DB_CUR_CONN: return db->server_count;
	case DB_CUR_CLIENTS: return db_clients(db);
	case DB_PAUSED: return db->paused;
	case DB_DISABLED: return admin_db_disabled(db);
	}
	return 0;
}

static void write_databases(struct evbuffer *out)
{
	for (size_t i = 0; i < sizeof(db_metrics) / sizeof(db_metrics[0]); i++) {
		struct lk_db *db;
		family(out, db_metrics[i].name, false, db_metrics[i].help);
		TAILQ_FOREACH(db, &rt->dbs, entry) {
			const char *labels[] = { "database", db->name, NULL };
			if (!db->removed)
				sample(out, db_metrics[i].name, labels, db_value(db, db_metrics[i].col));
		}
	}
}

/* ---- SHOW LISTS, PEER_POOLS, the process ---- */

static void list_sample(void *arg, const char *name, int n)
{
	const char *labels[] = { "list", name, NULL };
	sample(arg, "lokadb_lists_items", labels, n);
}

static const char *const peer_pool_names[] = {
	"lokadb_peer_pools_client_active_cancel_requests", "lokadb_peer_pools_client_waiting_cancel_requests",
	"lokadb_peer_pools_server_active_cancel_connections", "lokadb_peer_pools_server_login_connections",
};
static const char *const peer_pool_helps[] = {
	"Cancel requests being forwarded to the peer (SHOW PEER_POOLS cl_active_cancel_req).",
	"Cancel requests waiting for a slot to the peer (SHOW PEER_POOLS cl_waiting_cancel_req).",
	"Connections to the peer that sent their cancel request (SHOW PEER_POOLS sv_active_cancel).",
	"Connections to the peer being opened (SHOW PEER_POOLS sv_login).",
};
#define N_PEER_POOL_COLS 4

struct peer_col {
	struct evbuffer *out;
	int col;
};

static void peer_pool_sample(void *arg, const struct peer_pool_counts *n)
{
	const struct peer_col *w = arg;
	char id[16];
	const char *labels[] = { "peer_id", id, NULL };
	const int v[N_PEER_POOL_COLS] = { n->cl_active_cancel_req, n->cl_waiting_cancel_req, n->sv_active_cancel, n->sv_login };

	snprintf(id, sizeof(id), "%d", n->peer_id);
	sample(w->out, peer_pool_names[w->col], labels, v[w->col]);
}

static void write_lists_and_peers(struct evbuffer *out)
{
	struct peer_col w = { out, 0 };
	uint64_t forwarded, dropped;

	family(out, "lokadb_lists_items", false, "Objects of each kind (SHOW LISTS).");
	admin_lists(list_sample, out);
	for (w.col = 0; w.col < N_PEER_POOL_COLS; w.col++) {
		family(out, peer_pool_names[w.col], false, peer_pool_helps[w.col]);
		peers_walk(peer_pool_sample, &w);
	}
	peers_counters(&forwarded, &dropped);
	family(out, "lokadb_peers_cancel_forwarded", true, "Cancel requests forwarded to another peer.");
	sample(out, "lokadb_peers_cancel_forwarded", NULL, (double)forwarded);
	family(out, "lokadb_peers_cancel_dropped", true,
	       "Cancel requests for another peer that were not forwarded (unknown peer, already forwarded, failed).");
	sample(out, "lokadb_peers_cancel_dropped", NULL, (double)dropped);
}

static void write_process(struct evbuffer *out)
{
	char id[16];
	const char *labels[] = { "version", LOKADB_VERSION, "peer_id", id, NULL };

	snprintf(id, sizeof(id), "%d", rt->cf->peer_id);
	family(out, "lokadb_info", false, "Always 1; the labels describe this lokadb process.");
	sample(out, "lokadb_info", labels, 1);
	family(out, "lokadb_uptime_seconds", false, "Seconds since this lokadb process started.");
	sample(out, "lokadb_uptime_seconds", NULL, (double)(now_mono() - rt->start_time) / USEC);
}

/* ---- plugins' metrics ---- */

int metrics_plugin_register(struct lk_plugin *pl, const char *name, int type, const char *help, lk_metric_fn fn,
			    void *arg)
{
	struct metrics *m = state();
	struct metric_reg *r;
	char full[METRIC_NAME_MAX];
	int n;

	if (!pl || !fn || !valid_name(name, false) || (type != LK_METRIC_COUNTER && type != LK_METRIC_GAUGE))
		return -1;
	n = snprintf(full, sizeof(full), "lokadb_%s_%s", pl->name, name);
	if (n < 0 || (size_t)n >= sizeof(full) || !valid_name(full, true))
		return -1;
	for (int i = 0; i < m->n_regs; i++)
		if (strcmp(m->regs[i].name, full) == 0)
			return -1;
	r = realloc(m->regs, sizeof(*r) * (size_t)(m->n_regs + 1));
	if (!r)
		return -1;
	m->regs = r;
	r = &m->regs[m->n_regs++];
	r->pl = pl;
	r->name = xstrdup(full);
	r->help = xstrdup(help ? help : "");
	r->type = type;
	r->fn = fn;
	r->arg = arg;
	return 0;
}

void metrics_plugin_sample(struct lk_metrics *lm, const char *const *labels, double value)
{
	if (!lm || !lm->reg)
		return;
	if (!sample(lm->out, lm->reg->name, labels, value))
		log_debug("metrics: a sample of %s has an invalid label name; left out", lm->reg->name);
}

static void write_plugins(struct evbuffer *out)
{
	struct metrics *m = rt->metrics;

	for (int i = 0; m && i < m->n_regs; i++) {
		struct lk_metrics lm = { out, &m->regs[i] };
		family(out, m->regs[i].name, m->regs[i].type == LK_METRIC_COUNTER, m->regs[i].help);
		m->regs[i].fn(m->regs[i].pl, &lm, m->regs[i].arg);
	}
}

/* ---- HTTP ---- */

static void http_cb(struct evhttp_request *req, void *arg)
{
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	struct evbuffer *body;

	(void)arg;
	if (!path || strcmp(path, METRICS_PATH) != 0) {
		evhttp_send_error(req, HTTP_NOTFOUND, NULL);
		return;
	}
	body = evbuffer_new();
	if (!body) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	write_process(body);
	write_pools(body);
	write_stats(body);
	write_databases(body);
	write_lists_and_peers(body);
	write_plugins(body);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", METRICS_CONTENT_TYPE);
	evhttp_send_reply(req, HTTP_OK, "OK", body);
	evbuffer_free(body);
}

/* "host:port", "[v6]:port" or "*:port" into host and port; false when malformed. */
static bool split_listen(const char *text, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(text, ':');
	const char *h = text, *he = colon;
	char *end;
	long p;

	if (!colon || colon == text)
		return false;
	if (*h == '[') {
		if (he[-1] != ']')
			return false;
		h++;
		he--;
	}
	if (he <= h || (size_t)(he - h) >= hostlen)
		return false;
	p = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || p < 1 || p > 65535)
		return false;
	snprintf(host, hostlen, "%.*s", (int)(he - h), h);
	if (strcmp(host, "*") == 0)
		snprintf(host, hostlen, "0.0.0.0");
	*port = (int)p;
	return true;
}

bool metrics_start(char *err, size_t errlen)
{
	const char *listen = rt->cf->metrics_listen;
	struct metrics *m;
	char host[256];
	int port;

	if (!listen || !*listen)
		return true;
	if (!split_listen(listen, host, sizeof(host), &port)) {
		snprintf(err, errlen, "metrics_listen \"%s\": expected host:port (e.g. 127.0.0.1:9127)", listen);
		return false;
	}
	m = state();
	m->http = evhttp_new(rt->base);
	if (!m->http || !evhttp_bind_socket_with_handle(m->http, host, (ev_uint16_t)port)) {
		snprintf(err, errlen, "could not listen for metrics on %s", listen);
		return false;
	}
	evhttp_set_timeout(m->http, METRICS_TIMEOUT_SEC);
	evhttp_set_max_headers_size(m->http, METRICS_MAX_HEADERS);
	evhttp_set_max_body_size(m->http, METRICS_MAX_BODY);
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_gencb(m->http, http_cb, NULL);
	log_info("serving metrics on http://%s%s", listen, METRICS_PATH);
	return true;
}

void metrics_free_all(void)
{
	struct metrics *m = rt->metrics;

	if (!m)
		return;
	if (m->http)
		evhttp_free(m->http);
	for (int i = 0; i < m->n_regs; i++) {
		free(m->regs[i].name);
		free(m->regs[i].help);
	}
	free(m->regs);
	free(m);
	rt->metrics = NULL;
}
