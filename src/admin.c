/* SPDX-License-Identifier: ISC */
/*
 * admin.c -- the console database `lokadb` (alias `pgbouncer`).
 *
 * admin_users may run every command; stats_users only SHOW. Commands come as
 * simple Query messages, one command per message (a trailing ';' is fine),
 * and are dispatched through two tables: show_views[] and commands[]. Result
 * sets are all text columns, with PgBouncer's column names.
 */
#include "core.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_ARGS 8

struct admin_ctx {
	struct client *c;
	struct pktbuf *pb;
	int nargs;
	char *args[MAX_ARGS];
};

bool admin_is_dbname(const char *name)
{
	return (name[0] == 'l' && strcmp(name, "lokadb") == 0) || (name[0] == 'p' && strcmp(name, "pgbouncer") == 0);
}

static const struct show_view *find_view(const char *name);
static bool is_command_word(const char *word);

/* Is `name` ("WORD" or "SHOW VIEW") one of the core's console commands? */
bool admin_is_core_command(const char *name)
{
	char first[64];
	const char *sp = strchr(name, ' ');
	size_t n = sp ? (size_t)(sp - name) : strlen(name);

	if (n >= sizeof(first))
		return false;
	memcpy(first, name, n);
	first[n] = 0;
	if (strcasecmp(first, "show") == 0)
		return !sp || find_view(sp + 1) != NULL;
	/* "ENABLE TABLE": a two-word plugin command is matched before the core's
	 * one-word commands, so only a one-word name can clash with them */
	return !sp && is_command_word(first);
}

/* ---- result helpers ---- */

static void row_header(struct admin_ctx *a, int n, const char *const *cols)
{
	pkt_row_description(a->pb, n, cols);
}

static void finish(struct admin_ctx *a, const char *tag)
{
	pkt_command_complete(a->pb, tag);
	pkt_ready(a->pb, 'I');
	pkt_send(a->pb, bufferevent_get_output(a->c->bev));
}

static void fail(struct admin_ctx *a, const char *sqlstate, const char *msg)
{
	pkt_error(a->pb, "ERROR", sqlstate, msg, NULL);
	pkt_ready(a->pb, 'I');
	pkt_send(a->pb, bufferevent_get_output(a->c->bev));
}

static char *fmt_u64(char *buf, uint64_t v)
{
	snprintf(buf, 24, "%" PRIu64, v);
	return buf;
}

static char *fmt_int(char *buf, long long v)
{
	snprintf(buf, 24, "%lld", v);
	return buf;
}

static void fmt_time(char *buf, size_t len, usec_t wall)
{
	time_t t = (time_t)(wall / USEC);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

/* ---- SHOW views ---- */

static void show_version(struct admin_ctx *a)
{
	static const char *const cols[] = { "version" };
	const char *v[] = { "lokadb " LOKADB_VERSION };
	row_header(a, 1, cols);
	pkt_data_row(a->pb, 1, v);
	finish(a, "SHOW");
}

static void show_state(struct admin_ctx *a)
{
	static const char *const cols[] = { "key", "value" };
	const char *r1[] = { "active", rt->paused ? "no" : "yes" };
	const char *r2[] = { "paused", rt->paused ? "yes" : "no" };
	const char *r3[] = { "suspended", rt->suspended ? "yes" : "no" };
	row_header(a, 2, cols);
	pkt_data_row(a->pb, 2, r1);
	pkt_data_row(a->pb, 2, r2);
	pkt_data_row(a->pb, 2, r3);
	finish(a, "SHOW");
}

static void show_config(struct admin_ctx *a)
{
	static const char *const cols[] = { "key", "value", "default", "changeable" };
	char val[512];

	row_header(a, 4, cols);
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		const char *v[4];
		config_format(rt->cf, s, val, sizeof(val));
		v[0] = s->name;
		v[1] = val;
		v[2] = s->def ? s->def : "";
		v[3] = s->reloadable ? "yes" : "no";
		pkt_data_row(a->pb, 4, v);
	}
	plugin_show_config(a->pb);
	finish(a, "SHOW");
}

static void show_plugins(struct admin_ctx *a)
{
	static const char *const cols[] = { "name", "version", "abi", "path", "hooks", "transports", "commands", "state" };
	row_header(a, 8, cols);
	plugin_show_plugins(a->pb);
	finish(a, "SHOW");
}

static const char *mode_name(int m)
{
	return m == POOL_SESSION ? "session" : m == POOL_TRANSACTION ? "transaction" : "statement";
}

static void show_pools(struct admin_ctx *a)
{
	static const char *const cols[] = {
		"database", "user", "cl_active", "cl_waiting", "cl_active_cancel_req", "cl_waiting_cancel_req",
		"sv_active", "sv_active_cancel", "sv_being_canceled", "sv_idle", "sv_used", "sv_tested",
		"sv_login", "maxwait", "maxwait_us", "pool_mode", "load_balance_hosts",
	};
	struct pool *p;
	usec_t now = now_mono();

	row_header(a, 17, cols);
	TAILQ_FOREACH(p, &rt->pools, entry) {
		char b[10][24];
		struct client *w = TAILQ_FIRST(&p->waiting_clients);
		usec_t maxwait = w ? now - w->wait_start : 0;
		const char *v[17] = {
			p->db->name, p->user, fmt_int(b[0], p->n_active_cl), fmt_int(b[1], p->n_waiting_cl + p->n_login_cl),
			"0", "0", fmt_int(b[2], p->n_active_sv), "0", "0", fmt_int(b[3], p->n_idle_sv), "0",
			fmt_int(b[4], p->n_tested_sv), fmt_int(b[5], p->n_login_sv), fmt_int(b[6], maxwait / USEC),
			fmt_int(b[7], maxwait % USEC), mode_name(pool_mode_of(p)), NULL,
		};
		pkt_data_row(a->pb, 17, v);
	}
	finish(a, "SHOW");
}

static const char *const sock_cols[] = {
	"type", "user", "database", "replication", "state", "addr", "port", "local_addr", "local_port",
	"connect_time", "request_time", "wait", "wait_us", "close_needed", "ptr", "link", "remote_pid",
	"tls", "application_name", "prepared_statements", "id",
	/* SHOW SOCKETS / ACTIVE_SOCKETS only */
	"recv_pos", "pkt_pos", "pkt_remain", "send_pos", "send_remain", "pkt_avail", "send_avail",
};
#define N_SOCK_COLS 21
#define N_SOCK_DEBUG_COLS 28

/* Bytes waiting in a connection's buffers: what it sent us that is not handled yet, and what we queued for it. */
static size_t bev_in(struct bufferevent *bev)
{
	return bev ? evbuffer_get_length(bufferevent_get_input(bev)) : 0;
}

static size_t bev_out(struct bufferevent *bev)
{
	return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

/* The buffer columns of SHOW SOCKETS, v[21..27], from the evbuffers' lengths. */
static void sock_debug_cols(const char **v, char b[][24], struct bufferevent *bev, uint32_t pkt_remain)
{
	size_t in = bev_in(bev), out = bev_out(bev);
	v[21] = fmt_u64(b[0], in);		/* recv_pos: received and not yet handled */
	v[22] = "0";				/* pkt_pos: what lokadb handles is drained at once */
	v[23] = fmt_u64(b[1], pkt_remain);	/* pkt_remain: rest of the message being forwarded */
	v[24] = "0";				/* send_pos: what was written is drained at once */
	v[25] = fmt_u64(b[2], out);		/* send_remain: queued for this socket, not yet written */
	v[26] = v[21];				/* pkt_avail */
	v[27] = v[25];				/* send_avail */
}

static void client_row(struct admin_ctx *a, struct client *c, const char *state, bool debug)
{
	char host[64], lhost[64], b[8][24], psb[24], ct[40], ptr[24], link[24], tlsbuf[128];
	int port, lport;
	usec_t wait = c->state == CL_WAITING ? now_mono() - c->wait_start : 0;
	const char *v[N_SOCK_DEBUG_COLS];

	addr_to_str(&c->addr, host, sizeof(host), &port);
	if (c->local.ss_family == 0 && c->bev && c->addr.ss_family != AF_UNIX) {
		socklen_t ll = sizeof(c->local);	/* looked up on first SHOW, not per connection */
		if (getsockname(bufferevent_getfd(c->bev), (struct sockaddr *)&c->local, &ll) < 0)
			memset(&c->local, 0, sizeof(c->local));
	}
	addr_to_str(&c->local, lhost, sizeof(lhost), &lport);
	fmt_time(ct, sizeof(ct), c->connect_time);
	snprintf(ptr, sizeof(ptr), "%p", (void *)c);
	snprintf(link, sizeof(link), "%p", (void *)c->link);
	v[0] = "C"; v[1] = c->user ? c->user : "(nouser)";
	v[2] = c->pool ? c->pool->db->name : c->dbname ? c->dbname : "(nodb)"; v[3] = "no"; v[4] = state; v[5] = host;
	v[6] = fmt_int(b[0], port); v[7] = lhost; v[8] = fmt_int(b[1], lport);
	v[9] = ct; v[10] = ct; v[11] = fmt_int(b[2], wait / USEC); v[12] = fmt_int(b[3], wait % USEC);
	v[13] = "0"; v[14] = ptr; v[15] = c->link ? link : ""; v[16] = "0";
	v[17] = c->tls && c->bev ? tls_describe(&c->io, tlsbuf, sizeof(tlsbuf)) : "";
	v[18] = c->vars.v[VAR_APPNAME] ? c->vars.v[VAR_APPNAME] : ""; v[19] = fmt_u64(psb, ps_client_count(c));
	v[20] = fmt_u64(b[4], c->id);
	if (debug)
		sock_debug_cols(v, b + 5, c->bev, c->fwd_remaining);
	pkt_data_row(a->pb, debug ? N_SOCK_DEBUG_COLS : N_SOCK_COLS, v);
}

static void show_clients(struct admin_ctx *a)
{
	struct pool *p;
	struct client *c;

	row_header(a, N_SOCK_COLS, sock_cols);
	TAILQ_FOREACH(p, &rt->pools, entry) {
		TAILQ_FOREACH(c, &p->active_clients, entry)
			client_row(a, c, c->link ? "active" : "idle", false);
		TAILQ_FOREACH(c, &p->waiting_clients, entry)
			client_row(a, c, "waiting", false);
		TAILQ_FOREACH(c, &p->login_clients, entry)
			client_row(a, c, "waiting", false);
	}
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		client_row(a, c, "active", false);
	finish(a, "SHOW");
}

static void server_row(struct admin_ctx *a, struct server *s, const char *state, bool debug)
{
	char tlsbuf[128];
	char host[64], b[8][24], ct[40], ptr[24], link[24];
	int port;
	const char *v[N_SOCK_DEBUG_COLS];

	addr_to_str(&s->addr, host, sizeof(host), &port);
	fmt_time(ct, sizeof(ct), s->connect_time);
	snprintf(ptr, sizeof(ptr), "%p", (void *)s);
	snprintf(link, sizeof(link), "%p", (void *)s->link);
	v[0] = "S"; v[1] = s->pool->login_user; v[2] = s->pool->db->name; v[3] = "no"; v[4] = state; v[5] = host;
	v[6] = fmt_int(b[0], port); v[7] = ""; v[8] = "0"; v[9] = ct; v[10] = ct; v[11] = "0"; v[12] = "0";
	v[13] = s->close_needed ? "1" : "0"; v[14] = ptr; v[15] = s->link ? link : "";
	v[16] = fmt_int(b[1], s->backend_pid);
	v[17] = s->io.tls && s->bev ? tls_describe(&s->io, tlsbuf, sizeof(tlsbuf)) : "";
	v[18] = s->vars.v[VAR_APPNAME] ? s->vars.v[VAR_APPNAME] : "";
	v[19] = fmt_u64(b[6], ps_server_count(s)); v[20] = fmt_u64(b[2], s->id);
	if (debug)
		sock_debug_cols(v, b + 3, s->bev, s->fwd_remaining);
	pkt_data_row(a->pb, debug ? N_SOCK_DEBUG_COLS : N_SOCK_COLS, v);
}

static void show_servers(struct admin_ctx *a)
{
	struct pool *p;
	struct server *s;

	row_header(a, N_SOCK_COLS, sock_cols);
	TAILQ_FOREACH(p, &rt->pools, entry) {
		TAILQ_FOREACH(s, &p->active_servers, entry)
			server_row(a, s, "active", false);
		TAILQ_FOREACH(s, &p->idle_servers, entry)
			server_row(a, s, "idle", false);
		TAILQ_FOREACH(s, &p->tested_servers, entry)
			server_row(a, s, "tested", false);
		TAILQ_FOREACH(s, &p->login_servers, entry)
			server_row(a, s, "new", false);
	}
	finish(a, "SHOW");
}

/* ACTIVE_SOCKETS lists only the connections with something in their buffers. */
static bool client_busy(const struct client *c)
{
	return c->fwd_remaining || bev_in(c->bev) || bev_out(c->bev);
}

static bool server_busy(const struct server *s)
{
	return s->fwd_remaining || bev_in(s->bev) || bev_out(s->bev);
}

#define SOCK_CLIENTS(list, state) \
	TAILQ_FOREACH(c, (list), entry) \
		if (!only_busy || client_busy(c)) \
			client_row(a, c, (state), true)
#define SOCK_SERVERS(list, state) \
	TAILQ_FOREACH(s, (list), entry) \
		if (!only_busy || server_busy(s)) \
			server_row(a, s, (state), true)

/* SHOW SOCKETS / ACTIVE_SOCKETS: SHOW CLIENTS and SERVERS in one, with PgBouncer's states and buffer columns. */
static void show_sockets_of(struct admin_ctx *a, bool only_busy)
{
	struct pool *p;
	struct client *c;
	struct server *s;

	row_header(a, N_SOCK_DEBUG_COLS, sock_cols);
	TAILQ_FOREACH(p, &rt->pools, entry) {
		SOCK_CLIENTS(&p->active_clients, "cl_active");
		SOCK_CLIENTS(&p->waiting_clients, "cl_waiting");
		SOCK_CLIENTS(&p->login_clients, "cl_waiting");
		SOCK_SERVERS(&p->active_servers, "sv_active");
		SOCK_SERVERS(&p->idle_servers, "sv_idle");
		SOCK_SERVERS(&p->tested_servers, "sv_tested");
		SOCK_SERVERS(&p->login_servers, "sv_login");
	}
	SOCK_CLIENTS(&rt->admin_clients, "cl_active");
	SOCK_CLIENTS(&rt->login_clients, "cl_login");
	finish(a, "SHOW");
}

static void show_sockets(struct admin_ctx *a)
{
	show_sockets_of(a, false);
}

static void show_active_sockets(struct admin_ctx *a)
{
	show_sockets_of(a, true);
}

/*
 * The counters of one database (NULL: of every database), summed over its
 * pools. Totals and per-second rates add up; the average times of several
 * pools are weighted by their pools' rates (an unweighted mean of the
 * non-zero ones when every rate rounds to 0).
 */
struct wavg {
	double sum, weight, plain;
	int n;
};

static void wavg_add(struct wavg *w, uint64_t avg, uint64_t rate)
{
	if (!avg)
		return;
	w->sum += (double)avg * (double)rate;
	w->weight += (double)rate;
	w->plain += (double)avg;
	w->n++;
}

static uint64_t wavg_get(const struct wavg *w)
{
	if (w->weight > 0)
		return (uint64_t)(w->sum / w->weight);
	return w->n ? (uint64_t)(w->plain / w->n) : 0;
}

void admin_stats_sum(struct lk_db *db, struct lk_stats *tot, struct lk_stats *avg)
{
	struct wavg wx = { 0 }, wq = { 0 }, ww = { 0 };
	struct pool *p;

	memset(tot, 0, sizeof(*tot));
	memset(avg, 0, sizeof(*avg));
	TAILQ_FOREACH(p, &rt->pools, entry) {
		const struct lk_stats *s = &p->stats, *g = &p->avg;
		if (db && p->db != db)
			continue;
		tot->xact_count += s->xact_count;
		tot->query_count += s->query_count;
		tot->server_assignment_count += s->server_assignment_count;
		tot->client_login_count += s->client_login_count;
		tot->bytes_received += s->bytes_received;
		tot->bytes_sent += s->bytes_sent;
		tot->xact_time += s->xact_time;
		tot->query_time += s->query_time;
		tot->wait_time += s->wait_time;
		avg->xact_count += g->xact_count;
		avg->query_count += g->query_count;
		avg->server_assignment_count += g->server_assignment_count;
		avg->client_login_count += g->client_login_count;
		tot->client_parse_count += s->client_parse_count;
		tot->server_parse_count += s->server_parse_count;
		tot->bind_count += s->bind_count;
		avg->client_parse_count += g->client_parse_count;
		avg->server_parse_count += g->server_parse_count;
		avg->bind_count += g->bind_count;
		avg->bytes_received += g->bytes_received;
		avg->bytes_sent += g->bytes_sent;
		wavg_add(&wx, g->xact_time, g->xact_count);
		wavg_add(&wq, g->query_time, g->query_count);
		wavg_add(&ww, g->wait_time, g->server_assignment_count);
	}
	avg->xact_time = wavg_get(&wx);
	avg->query_time = wavg_get(&wq);
	avg->wait_time = wavg_get(&ww);
}

/*
 * The counters, in PgBouncer's column order (the last three: prepared
 * statements): 11 values into v[].
 */
static void stats_values(const struct lk_stats *t, char b[][24], const char **v)
{
	v[0] = fmt_u64(b[0], t->server_assignment_count);
	v[1] = fmt_u64(b[1], t->xact_count);
	v[2] = fmt_u64(b[2], t->query_count);
	v[3] = fmt_u64(b[3], t->bytes_received);
	v[4] = fmt_u64(b[4], t->bytes_sent);
	v[5] = fmt_u64(b[5], t->xact_time);
	v[6] = fmt_u64(b[6], t->query_time);
	v[7] = fmt_u64(b[7], t->wait_time);
	v[8] = fmt_u64(b[8], t->client_parse_count);
	v[9] = fmt_u64(b[9], t->server_parse_count);
	v[10] = fmt_u64(b[10], t->bind_count);
}
#define N_STATS_VALUES 11

static void show_stats(struct admin_ctx *a)
{
	static const char *const cols[] = {
		"database", "total_server_assignment_count", "total_xact_count", "total_query_count",
		"total_received", "total_sent", "total_xact_time", "total_query_time", "total_wait_time",
		"total_client_parse_count", "total_server_parse_count", "total_bind_count",
		"avg_server_assignment_count", "avg_xact_count", "avg_query_count", "avg_recv", "avg_sent",
		"avg_xact_time", "avg_query_time", "avg_wait_time", "avg_client_parse_count",
		"avg_server_parse_count", "avg_bind_count",
	};
	struct lk_db *db;

	row_header(a, 23, cols);
	TAILQ_FOREACH(db, &rt->dbs, entry) {
		struct lk_stats t, g;
		char b[2 * N_STATS_VALUES][24];
		const char *v[1 + 2 * N_STATS_VALUES];
		admin_stats_sum(db, &t, &g);
		v[0] = db->name;
		stats_values(&t, b, v + 1);
		stats_values(&g, b + N_STATS_VALUES, v + 1 + N_STATS_VALUES);
		pkt_data_row(a->pb, 23, v);
	}
	finish(a, "SHOW");
}

/* SHOW STATS_TOTALS / STATS_AVERAGES: the two halves of SHOW STATS, as PgBouncer names them. */
static void show_stats_half(struct admin_ctx *a, bool averages)
{
	static const char *const tot_cols[] = {
		"database", "server_assignment_count", "xact_count", "query_count", "bytes_received",
		"bytes_sent", "xact_time", "query_time", "wait_time", "client_parse_count",
		"server_parse_count", "bind_count",
	};
	/* sic: PgBouncer's STATS_AVERAGES keeps the avg_ prefix on its last three columns */
	static const char *const avg_cols[] = {
		"database", "server_assignment_count", "xact_count", "query_count", "bytes_received",
		"bytes_sent", "xact_time", "query_time", "wait_time", "avg_client_parse_count",
		"avg_server_parse_count", "avg_bind_count",
	};
	struct lk_db *db;

	row_header(a, 1 + N_STATS_VALUES, averages ? avg_cols : tot_cols);
	TAILQ_FOREACH(db, &rt->dbs, entry) {
		struct lk_stats t, g;
		char b[N_STATS_VALUES][24];
		const char *v[1 + N_STATS_VALUES];
		admin_stats_sum(db, &t, &g);
		v[0] = db->name;
		stats_values(averages ? &g : &t, b, v + 1);
		pkt_data_row(a->pb, 1 + N_STATS_VALUES, v);
	}
	finish(a, "SHOW");
}

static void show_stats_totals(struct admin_ctx *a)
{
	show_stats_half(a, false);
}

static void show_stats_averages(struct admin_ctx *a)
{
	show_stats_half(a, true);
}

/* SHOW TOTALS: SHOW STATS summed over every database, one (name, value) row per counter. */
static void show_totals(struct admin_ctx *a)
{
	static const char *const cols[] = { "name", "value" };
	/* PgBouncer's row names: "total_"/"avg_" + the name of its own counter field */
	static const char *const names[N_STATS_VALUES] = {
		"server_assignment_count", "xact_count", "query_count", "client_bytes", "server_bytes",
		"xact_time", "query_time", "wait_time", "ps_client_parse_count", "ps_server_parse_count",
		"ps_bind_count",
	};
	struct lk_stats t, g;
	char b[2 * N_STATS_VALUES][24];
	const char *v[2 * N_STATS_VALUES];

	admin_stats_sum(NULL, &t, &g);
	stats_values(&t, b, v);
	stats_values(&g, b + N_STATS_VALUES, v + N_STATS_VALUES);
	row_header(a, 2, cols);
	for (int i = 0; i < 2 * N_STATS_VALUES; i++) {
		char name[64];
		const char *row[2] = { name, v[i] };
		snprintf(name, sizeof(name), "%s_%s", i < N_STATS_VALUES ? "total" : "avg", names[i % N_STATS_VALUES]);
		pkt_data_row(a->pb, 2, row);
	}
	finish(a, "SHOW");
}

static void show_databases(struct admin_ctx *a)
{
	static const char *const cols[] = {
		"name", "host", "port", "database", "force_user", "pool_size", "min_pool_size", "reserve_pool_size",
		"server_lifetime", "pool_mode", "load_balance_hosts", "max_connections", "current_connections",
		"max_client_connections", "current_client_connections", "paused", "disabled",
	};
	struct lk_db *db;

	row_header(a, 17, cols);
	TAILQ_FOREACH(db, &rt->dbs, entry) {
		const struct db_conf *dc = &db->conf;
		char b[10][24];
		int ncl = 0;
		struct pool *p;
		if (db->removed)
			continue;
		TAILQ_FOREACH(p, &rt->pools, entry)
			if (p->db == db)
				ncl += p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
		const char *v[17] = {
			db->name, dc->host, fmt_int(b[0], dc->port > 0 ? dc->port : 5432), dc->dbname ? dc->dbname : db->name,
			dc->user, fmt_int(b[1], dc->pool_size >= 0 ? dc->pool_size : rt->cf->default_pool_size),
			fmt_int(b[2], dc->min_pool_size >= 0 ? dc->min_pool_size : rt->cf->min_pool_size),
			fmt_int(b[3], dc->reserve_pool_size >= 0 ? dc->reserve_pool_size : rt->cf->reserve_pool_size),
			fmt_int(b[4], (dc->server_lifetime > 0 ? dc->server_lifetime : rt->cf->server_lifetime) / USEC), dc->pool_mode >= 0 ? mode_name(dc->pool_mode) : NULL,
			NULL, fmt_int(b[5], dc->max_db_connections > 0 ? dc->max_db_connections : rt->cf->max_db_connections),
			fmt_int(b[6], db->server_count), fmt_int(b[8], pool_db_client_limit(db)), fmt_int(b[7], ncl),
			db->paused ? "1" : "0",
			admin_db_disabled(db) ? "1" : "0",
		};
		pkt_data_row(a->pb, 17, v);
	}
	finish(a, "SHOW");
}

static void show_users(struct admin_ctx *a)
{
	static const char *const cols[] = {
		"name", "pool_size", "reserve_pool_size", "pool_mode", "max_user_connections", "current_connections",
		"max_user_client_connections", "current_client_connections",
	};
	row_header(a, 8, cols);
	for (int i = 0; i < rt->cf->n_users; i++) {
		const struct user_conf *u = &rt->cf->users[i];
		char b[6][24];
		int nsv = 0, ncl = 0;
		struct pool *p;
		TAILQ_FOREACH(p, &rt->pools, entry) {
			if (strcmp(p->user, u->name) != 0)
				continue;
			nsv += p->n_active_sv + p->n_idle_sv + p->n_tested_sv + p->n_login_sv;
			ncl += p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
		}
		const char *v[8] = {
			u->name, u->pool_size >= 0 ? fmt_int(b[0], u->pool_size) : "",
			u->reserve_pool_size >= 0 ? fmt_int(b[5], u->reserve_pool_size) : "",
			u->pool_mode >= 0 ? mode_name(u->pool_mode) : "",
			fmt_int(b[1], u->max_user_connections > 0 ? u->max_user_connections : rt->cf->max_user_connections),
			fmt_int(b[2], nsv), fmt_int(b[4], pool_user_client_limit(u->name)), fmt_int(b[3], ncl),
		};
		pkt_data_row(a->pb, 8, v);
	}
	finish(a, "SHOW");
}

static void count_dns_name(void *arg, const char *host, const struct sockaddr *sa, socklen_t len, usec_t expires)
{
	(void)host;
	(void)sa;
	(void)len;
	(void)expires;
	(*(int *)arg)++;
}

/* The rows of SHOW LISTS, one call of fn per list (also the metrics endpoint's). */
void admin_lists(admin_list_fn fn, void *arg)
{
	int n_db = 0, n_pools = 0, n_users = rt->cf->n_users, cl_used = 0, cl_wait = 0, cl_act = 0, sv_used = 0,
	    sv_idle = 0, sv_login = 0, cl_login = 0, cl_admin = 0, n_dns = 0;
	struct lk_db *db;
	struct pool *p;
	struct client *c;

	TAILQ_FOREACH(db, &rt->dbs, entry)
		n_db++;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		n_pools++;
		cl_act += p->n_active_cl + p->n_login_cl;
		cl_wait += p->n_waiting_cl;
		sv_used += p->n_active_sv + p->n_tested_sv;
		sv_idle += p->n_idle_sv;
		sv_login += p->n_login_sv;
	}
	TAILQ_FOREACH(c, &rt->login_clients, entry)
		cl_login++;
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		cl_admin++;
	cl_used = cl_act + cl_wait + cl_login + cl_admin;
	dns_walk(rt->dns, count_dns_name, &n_dns);
	struct { const char *name; int n; } rows[] = {
		{ "databases", n_db }, { "users", n_users }, { "pools", n_pools }, { "free_clients", 0 },
		{ "used_clients", cl_used }, { "login_clients", cl_login }, { "free_servers", 0 },
		{ "used_servers", sv_used + sv_idle + sv_login }, { "dns_names", n_dns }, { "dns_zones", 0 },
		{ "dns_queries", 0 }, { "dns_pending", 0 },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		fn(arg, rows[i].name, rows[i].n);
}

static void list_row(void *arg, const char *name, int n)
{
	char b[24];
	const char *v[2] = { name, fmt_int(b, n) };
	pkt_data_row(arg, 2, v);
}

static void show_lists(struct admin_ctx *a)
{
	static const char *const cols[] = { "list", "items" };
	row_header(a, 2, cols);
	admin_lists(list_row, a->pb);
	finish(a, "SHOW");
}

/*
 * SHOW MEM: PgBouncer lists its slab caches. lokadb allocates each object on
 * its own (no slabs, nothing kept free), so each row counts the live objects
 * of one kind from the lists that hold them: size is sizeof the struct, free
 * is 0 and memtotal is size * used. Buffers are not included.
 */
static void show_mem(struct admin_ctx *a)
{
	static const char *const cols[] = { "name", "size", "used", "free", "memtotal" };
	int n_db = 0, n_pool = 0, n_cl = 0, n_sv = 0;
	struct lk_db *db;
	struct pool *p;
	struct client *c;
	struct server *s;

	TAILQ_FOREACH(db, &rt->dbs, entry)
		n_db++;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		n_pool++;
		n_cl += p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
		n_sv += p->n_active_sv + p->n_idle_sv + p->n_tested_sv + p->n_login_sv;
	}
	TAILQ_FOREACH(c, &rt->login_clients, entry)
		n_cl++;
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		n_cl++;
	TAILQ_FOREACH(c, &rt->closing_clients, entry)
		n_cl++;
	TAILQ_FOREACH(c, &rt->justfree_clients, entry)
		n_cl++;
	TAILQ_FOREACH(s, &rt->justfree_servers, entry)
		n_sv++;
	struct { const char *name; size_t size; int used, free; } rows[] = {
		{ "user_cache", sizeof(struct user_conf), rt->cf->n_users, 0 },
		{ "db_cache", sizeof(struct lk_db), n_db, 0 },
		{ "pool_cache", sizeof(struct pool), n_pool, 0 },
		{ "server_cache", sizeof(struct server), n_sv, 0 },
		{ "client_cache", sizeof(struct client), n_cl, rt->n_client_cache },
	};
	row_header(a, 5, cols);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		char b[4][24];
		const char *v[5] = {
			rows[i].name, fmt_u64(b[0], rows[i].size), fmt_int(b[1], rows[i].used), fmt_int(b[3], rows[i].free),
			fmt_u64(b[2], (uint64_t)rows[i].size * (uint64_t)(rows[i].used + rows[i].free)),
		};
		pkt_data_row(a->pb, 5, v);
	}
	finish(a, "SHOW");
}

struct dns_rows {
	struct admin_ctx *a;
	usec_t now;
};

static void dns_host_row(void *arg, const char *host, const struct sockaddr *sa, socklen_t len, usec_t expires)
{
	struct dns_rows *d = arg;
	char addr[INET6_ADDRSTRLEN] = "", ttl[24];
	const char *v[3] = { host, ttl, addr };

	(void)len;
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, addr, sizeof(addr));
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, addr, sizeof(addr));
	fmt_u64(ttl, expires > d->now ? (expires - d->now) / USEC : 0);
	pkt_data_row(d->a->pb, 3, v);
}

/* SHOW DNS_HOSTS: dns.c's cache, one row per host name. */
static void show_dns_hosts(struct admin_ctx *a)
{
	static const char *const cols[] = { "hostname", "ttl", "addrs" };
	struct dns_rows d = { a, now_mono() };

	row_header(a, 3, cols);
	dns_walk(rt->dns, dns_host_row, &d);
	finish(a, "SHOW");
}

/* SHOW DNS_ZONES: lokadb does not follow zones' SOA serials (no dns_zone_check_period): no rows. */
static void show_dns_zones(struct admin_ctx *a)
{
	static const char *const cols[] = { "zonename", "serial", "count" };
	row_header(a, 3, cols);
	finish(a, "SHOW");
}

/* SHOW PEERS / PEER_POOLS: the [peers] group (peers.c), with PgBouncer's columns. */
static void show_peers(struct admin_ctx *a)
{
	static const char *const cols[] = { "peer_id", "host", "port", "pool_size" };
	row_header(a, 4, cols);
	peers_show(a->pb);
	finish(a, "SHOW");
}

static void show_peer_pools(struct admin_ctx *a)
{
	static const char *const cols[] = {
		"peer_id", "cl_active_cancel_req", "cl_waiting_cancel_req", "sv_active_cancel", "sv_login",
	};
	row_header(a, 5, cols);
	peers_show_pools(a->pb);
	finish(a, "SHOW");
}

static void show_help(struct admin_ctx *a);

static const struct show_view {
	const char *name;
	void (*fn)(struct admin_ctx *a);
} show_views[] = {
	{ "help", show_help },
	{ "version", show_version },
	{ "state", show_state },
	{ "config", show_config },
	{ "pools", show_pools },
	{ "clients", show_clients },
	{ "servers", show_servers },
	{ "stats", show_stats },
	{ "databases", show_databases },
	{ "users", show_users },
	{ "lists", show_lists },
	{ "plugins", show_plugins },
	{ "stats_totals", show_stats_totals },
	{ "stats_averages", show_stats_averages },
	{ "totals", show_totals },
	{ "sockets", show_sockets },
	{ "active_sockets", show_active_sockets },
	{ "mem", show_mem },
	{ "dns_hosts", show_dns_hosts },
	{ "dns_zones", show_dns_zones },
	{ "peers", show_peers },
	{ "peer_pools", show_peer_pools },
	{ NULL, NULL },
};

static void show_help(struct admin_ctx *a)
{
	char msg[2048] = "SHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION|PLUGINS; "
			 "SHOW SOCKETS|ACTIVE_SOCKETS|LISTS|MEM|STATE; SHOW DNS_HOSTS|DNS_ZONES; SHOW PEERS|PEER_POOLS; "
			 "SHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS; "
			 "SET key = arg; RELOAD; PAUSE [db]; RESUME [db]; DISABLE db; ENABLE db; RECONNECT [db]; "
			 "KILL [db]; KILL_CLIENT id; SHUTDOWN [WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS]; WAIT_CLOSE [db]";
	plugin_console_help(msg, sizeof(msg));
	pkt_notice(a->pb, "00000", msg);
	finish(a, "SHOW");
}

/* ---- control commands ---- */

static struct lk_db *arg_db(struct admin_ctx *a, int i, bool *bad)
{
	struct lk_db *db;
	*bad = false;
	if (a->nargs <= i)
		return NULL;
	db = db_lookup(a->args[i], false);
	if (!db) {
		char msg[256];
		snprintf(msg, sizeof(msg), "no such database: %s", a->args[i]);
		fail(a, "3D000", msg);
		*bad = true;
	}
	return db;
}

static const struct show_view *find_view(const char *name)
{
	for (const struct show_view *v = show_views; v->name; v++)
		if (strcasecmp(v->name, name) == 0)
			return v;
	return NULL;
}

static void cmd_show(struct admin_ctx *a)
{
	const struct show_view *v;

	if (a->nargs < 2) {
		fail(a, "42601", "SHOW needs an argument; try SHOW HELP");
		return;
	}
	v = find_view(a->args[1]);
	if (v)
		v->fn(a);
	else
		fail(a, "42601", "unknown SHOW view; try SHOW HELP");
}

static void cmd_pause(struct admin_ctx *a)
{
	bool bad;
	struct lk_db *db = arg_db(a, 1, &bad);
	if (bad)
		return;
	if (db)
		db->paused = true;
	else
		rt->paused = true;
	pool_reconnect(db);	/* as PgBouncer: servers are closed once released */
	if (pool_active_servers(db) == 0) {
		finish(a, "PAUSE");
		return;
	}
	/* answered by admin_janitor() once every server is released */
	a->c->pause_wait = true;
	a->c->pause_db = db;
}

/*
 * WAIT_CLOSE sessions that are not answered yet. A console session waits
 * with c->pause_wait, like PAUSE; this list tells the janitor which of them
 * wait for WAIT_CLOSE (and for which database) instead.
 */
struct close_wait {
	struct close_wait *next;
	uint64_t client_id;
	struct lk_db *db;		/* NULL: every database */
};
static struct close_wait *close_waits;

/* Server connections of db (NULL: of all) that RECONNECT, a reload or a failed reset marked to be closed. */
static int count_close_needed(struct lk_db *db)
{
	struct pool *p;
	struct server *s;
	int n = 0;

	TAILQ_FOREACH(p, &rt->pools, entry) {
		if (db && p->db != db)
			continue;
		TAILQ_FOREACH(s, &p->active_servers, entry)
			n += s->close_needed;
		TAILQ_FOREACH(s, &p->idle_servers, entry)
			n += s->close_needed;
		TAILQ_FOREACH(s, &p->tested_servers, entry)
			n += s->close_needed;
		TAILQ_FOREACH(s, &p->login_servers, entry)
			n += s->close_needed;
	}
	return n;
}

static struct close_wait **find_close_wait(uint64_t client_id)
{
	for (struct close_wait **wp = &close_waits; *wp; wp = &(*wp)->next)
		if ((*wp)->client_id == client_id)
			return wp;
	return NULL;
}

static void drop_close_wait(struct close_wait **wp)
{
	struct close_wait *w = *wp;
	*wp = w->next;
	free(w);
}

/* PAUSE answers when the last server of its database is released; WAIT_CLOSE when the last close_needed one is gone. */
void admin_janitor(void)
{
	struct client *c, *tmp;

	TAILQ_FOREACH_SAFE(c, &rt->admin_clients, entry, tmp) {
		struct close_wait **wp;
		const char *tag;
		if (!c->pause_wait)
			continue;
		wp = close_waits ? find_close_wait(c->id) : NULL;
		if (c->suspend_wait) {
			/* (a RESUME from another console meanwhile answers it too) */
			if (rt->suspended && lokadb_unflushed() > 0) {
				if (rt->cf->suspend_timeout <= 0 || now_mono() - rt->suspend_start <= rt->cf->suspend_timeout)
					continue;
				lokadb_suspend_drop();
			}
			c->suspend_wait = false;
			tag = "SUSPEND";
		} else if (wp) {
			if (count_close_needed((*wp)->db) > 0)
				continue;
			drop_close_wait(wp);
			tag = "WAIT_CLOSE";
		} else {
			if (pool_active_servers(c->pause_db) > 0)
				continue;
			tag = "PAUSE";
		}
		c->pause_wait = false;
		pkt_command_complete(&rt->pb, tag);
		pkt_ready(&rt->pb, 'I');
		pkt_send(&rt->pb, bufferevent_get_output(c->bev));
		client_process(c);
	}
	/* forget the waits of sessions that closed before their answer */
	for (struct close_wait **wp = &close_waits; *wp;) {
		bool waiting = false;
		TAILQ_FOREACH(c, &rt->admin_clients, entry)
			if (c->id == (*wp)->client_id && c->pause_wait)
				waiting = true;
		if (waiting)
			wp = &(*wp)->next;
		else
			drop_close_wait(wp);
	}
}

/* WAIT_CLOSE [db]: answers once no server connection of db (or of any) is marked close_needed. */
static void cmd_wait_close(struct admin_ctx *a)
{
	bool bad;
	struct lk_db *db;
	struct close_wait *w;

	if (a->nargs > 2) {
		fail(a, "42601", "syntax: WAIT_CLOSE [db]");
		return;
	}
	db = arg_db(a, 1, &bad);
	if (bad)
		return;
	if (count_close_needed(db) == 0) {
		finish(a, "WAIT_CLOSE");
		return;
	}
	w = xcalloc(1, sizeof(*w));
	w->client_id = a->c->id;
	w->db = db;
	w->next = close_waits;
	close_waits = w;
	a->c->pause_wait = true;	/* answered by admin_janitor() */
	a->c->pause_db = db;
}

/* KILL_CLIENT id: closes one client, by the id that SHOW CLIENTS shows. */
static void cmd_kill_client(struct admin_ctx *a)
{
	struct client *c, *found = NULL;
	struct pool *p;
	char *end;
	unsigned long long id;

	if (a->nargs != 2) {
		fail(a, "42601", "syntax: KILL_CLIENT id");
		return;
	}
	errno = 0;
	id = strtoull(a->args[1], &end, 10);
	if (errno || end == a->args[1] || *end || a->args[1][0] == '-') {
		fail(a, "22023", "invalid client pointer supplied");
		return;
	}
	TAILQ_FOREACH(p, &rt->pools, entry) {
		TAILQ_FOREACH(c, &p->active_clients, entry)
			if (c->id == id)
				found = c;
		TAILQ_FOREACH(c, &p->waiting_clients, entry)
			if (c->id == id)
				found = c;
		TAILQ_FOREACH(c, &p->login_clients, entry)
			if (c->id == id)
				found = c;
	}
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		if (c->id == id)
			found = c;
	if (!found) {
		fail(a, "42704", "client not found");
		return;
	}
	client_close(found, "57P01", "admin forced disconnect");
	if (found != a->c)	/* a session that killed itself gets no answer */
		finish(a, "KILL_CLIENT");
}

/*
 * SUSPEND: stop reading every connection but the consoles' and stop
 * accepting; answered once every buffer toward clients and servers is
 * written (admin_janitor()), or once suspend_timeout has closed those that
 * would not drain. RESUME undoes it.
 */
static void cmd_suspend(struct admin_ctx *a)
{
	if (a->nargs > 1) {
		fail(a, "42601", "syntax: SUSPEND");
		return;
	}
	if (rt->suspended) {
		fail(a, "55000", "already suspended");
		return;
	}
	lokadb_suspend(true);
	if (lokadb_unflushed() == 0) {
		finish(a, "SUSPEND");
		return;
	}
	a->c->pause_wait = true;	/* answered by admin_janitor() */
	a->c->suspend_wait = true;
}

/* DISABLE db / ENABLE db: the databases whose new client logins are refused. */
static struct lk_db **disabled_dbs;
static int n_disabled;

bool admin_db_disabled(const struct lk_db *db)
{
	for (int i = 0; i < n_disabled; i++)
		if (disabled_dbs[i] == db)
			return true;
	return false;
}

static struct lk_db *arg_db_required(struct admin_ctx *a, const char *cmd)
{
	bool bad;
	struct lk_db *db;

	if (a->nargs < 2) {
		fail(a, "42601", "a database is required");
		return NULL;
	}
	if (a->nargs > 2) {
		char msg[64];
		snprintf(msg, sizeof(msg), "syntax: %s db", cmd);
		fail(a, "42601", msg);
		return NULL;
	}
	db = arg_db(a, 1, &bad);
	return bad ? NULL : db;
}

static void cmd_disable(struct admin_ctx *a)
{
	struct lk_db *db = arg_db_required(a, "DISABLE");

	if (!db)
		return;
	if (!admin_db_disabled(db)) {
		struct lk_db **v = realloc(disabled_dbs, (size_t)(n_disabled + 1) * sizeof(*v));
		if (!v) {
			fail(a, "53200", "out of memory");
			return;
		}
		disabled_dbs = v;
		disabled_dbs[n_disabled++] = db;
	}
	log_info("DISABLE %s: new clients of the database are refused", db->name);
	finish(a, "DISABLE");
}

static void cmd_enable(struct admin_ctx *a)
{
	struct lk_db *db = arg_db_required(a, "ENABLE");

	if (!db)
		return;
	for (int i = 0; i < n_disabled; i++) {
		if (disabled_dbs[i] == db) {
			disabled_dbs[i] = disabled_dbs[--n_disabled];
			break;
		}
	}
	if (n_disabled == 0) {
		free(disabled_dbs);
		disabled_dbs = NULL;
	}
	log_info("ENABLE %s", db->name);
	finish(a, "ENABLE");
}

static void cmd_resume(struct admin_ctx *a)
{
	bool bad;
	struct lk_db *db = arg_db(a, 1, &bad);
	if (bad)
		return;
	lokadb_suspend(false);
	pool_resume(db);
	finish(a, "RESUME");
}

static void cmd_reconnect(struct admin_ctx *a)
{
	bool bad;
	struct lk_db *db = arg_db(a, 1, &bad);
	if (bad)
		return;
	pool_reconnect(db);
	finish(a, "RECONNECT");
}

static void cmd_kill(struct admin_ctx *a)
{
	bool bad;
	struct lk_db *db = arg_db(a, 1, &bad);
	if (bad)
		return;
	if (!db) {
		struct lk_db *d;
		TAILQ_FOREACH(d, &rt->dbs, entry)
			pool_kill(d);
	} else {
		pool_kill(db);
	}
	finish(a, "KILL");
}

static void cmd_reload(struct admin_ctx *a)
{
	char err[512];
	if (!lokadb_reload(err, sizeof(err))) {
		fail(a, "F0000", err);
		return;
	}
	finish(a, "RELOAD");
}

static void cmd_shutdown(struct admin_ctx *a)
{
	enum shutdown_mode mode = SHUT_NOW;

	if (a->nargs > 2) {
		fail(a, "42601", "syntax: SHUTDOWN [WAIT_FOR_SERVERS | WAIT_FOR_CLIENTS]");
		return;
	}
	if (a->nargs == 2 && strcasecmp(a->args[1], "WAIT_FOR_SERVERS") == 0) {
		mode = SHUT_WAIT_SERVERS;
	} else if (a->nargs == 2 && strcasecmp(a->args[1], "WAIT_FOR_CLIENTS") == 0) {
		mode = SHUT_WAIT_CLIENTS;
	} else if (a->nargs == 2) {
		fail(a, "42601", "syntax: SHUTDOWN [WAIT_FOR_SERVERS | WAIT_FOR_CLIENTS]");
		return;
	}
	finish(a, "SHUTDOWN");
	lokadb_shutdown(mode);
}

static void cmd_set(struct admin_ctx *a)
{
	char err[512];
	/* args: SET key = value  (value may be quoted) */
	if (a->nargs != 4 || strcmp(a->args[2], "=") != 0) {
		fail(a, "42601", "syntax: SET key = value");
		return;
	}
	if (strncasecmp(a->args[1], "plugin.", 7) == 0) {
		if (!plugin_set(a->args[1], a->args[3], err, sizeof(err)))
			fail(a, "22023", err);
		else
			finish(a, "SET");
		return;
	}
	if (strncasecmp(a->args[1], "client_tls_", 11) == 0 || strncasecmp(a->args[1], "server_tls_", 11) == 0) {
		bool server_side = strncasecmp(a->args[1], "server_tls_", 11) == 0;
		/* check the new TLS context before keeping the value */
		const struct cf_setting *st = config_find(a->args[1]);
		char old[512];
		void *ctx;
		if (st)
			config_format(rt->cf, st, old, sizeof(old));
		if (!config_set(rt->cf, a->args[1], a->args[3], err, sizeof(err))) {
			fail(a, "22023", err);
			return;
		}
		if (!(server_side ? tls_server_check : tls_client_check)(rt->cf, &ctx, err, sizeof(err))) {
			char ignore[64];
			config_set(rt->cf, a->args[1], old, ignore, sizeof(ignore));
			fail(a, "22023", err);
			return;
		}
		(server_side ? tls_server_apply : tls_client_apply)(ctx);
		finish(a, "SET");
		return;
	}
	if (!config_set(rt->cf, a->args[1], a->args[3], err, sizeof(err))) {
		fail(a, "22023", err);
		return;
	}
	pool_apply_config(NULL);
	finish(a, "SET");
}

static const struct admin_cmd {
	const char *name;
	bool needs_admin;
	void (*fn)(struct admin_ctx *a);
} commands[] = {
	{ "show", false, cmd_show },
	{ "pause", true, cmd_pause },
	{ "resume", true, cmd_resume },
	{ "reconnect", true, cmd_reconnect },
	{ "kill", true, cmd_kill },
	{ "reload", true, cmd_reload },
	{ "shutdown", true, cmd_shutdown },
	{ "set", true, cmd_set },
	{ "kill_client", true, cmd_kill_client },
	{ "wait_close", true, cmd_wait_close },
	{ "suspend", true, cmd_suspend },
	{ "disable", true, cmd_disable },
	{ "enable", true, cmd_enable },
	{ NULL, false, NULL },
};

static bool is_command_word(const char *word)
{
	for (const struct admin_cmd *cmd = commands; cmd->name; cmd++)
		if (strcasecmp(cmd->name, word) == 0)
			return true;
	return false;
}

/*
 * Split into words: identifiers, '=' and quoted strings ('..' with '' and
 * ".." kept verbatim). Modifies `sql`. Returns false on bad quoting.
 */
static bool tokenize(struct admin_ctx *a, char *sql)
{
	char *p = sql;

	a->nargs = 0;
	while (*p) {
		char *start;
		while (isspace((unsigned char)*p) || *p == ';')
			p++;
		if (!*p)
			break;
		if (a->nargs == MAX_ARGS)
			return false;
		if (*p == '\'' || *p == '"') {
			char q = *p++, *w = p;
			start = p;
			for (;;) {
				if (!*p)
					return false;
				if (*p == q && p[1] == q) {
					*w++ = q;
					p += 2;
				} else if (*p == q) {
					p++;
					break;
				} else {
					*w++ = *p++;
				}
			}
			*w = 0;
		} else if (*p == '=') {
			start = p;
			p++;
			if (*p) {
				memmove(p + 1, p, strlen(p) + 1);
				*p++ = 0;
			}
		} else {
			start = p;
			while (*p && !isspace((unsigned char)*p) && *p != '=' && *p != ';')
				p++;
			if (*p == '=') {
				memmove(p + 1, p, strlen(p) + 1);
				*p++ = 0;
				a->args[a->nargs++] = start;
				continue;
			}
			if (*p)
				*p++ = 0;
		}
		a->args[a->nargs++] = start;
	}
	return true;
}

void admin_handle(struct client *c, const char *query)
{
	struct admin_ctx a = { .c = c, .pb = &rt->pb };
	size_t qlen = strlen(query);
	char *sql = xcalloc(1, 2 * qlen + 2);	/* the tokenizer may insert a NUL per '=' */

	memcpy(sql, query, qlen);

	c->request_time = now_mono();
	if (rt->n_plugins > 0 && plugin_console(c, query))
		goto out;
	if (!tokenize(&a, sql)) {
		fail(&a, "42601", "syntax error in console command");
		goto out;
	}
	if (a.nargs == 0) {
		pkt_begin(a.pb, 'I');
		pkt_end(a.pb);
		pkt_ready(a.pb, 'I');
		pkt_send(a.pb, bufferevent_get_output(c->bev));
		goto out;
	}
	for (const struct admin_cmd *cmd = commands; cmd->name; cmd++) {
		if (strcasecmp(cmd->name, a.args[0]) != 0)
			continue;
		if (cmd->needs_admin && !c->admin_full)
			fail(&a, "42501", "admin access needed");
		else
			cmd->fn(&a);
		goto out;
	}
	fail(&a, "42601", "unknown console command; try SHOW HELP");
out:
	free(sql);
}
