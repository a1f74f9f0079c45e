/* SPDX-License-Identifier: ISC */
/*
 * t_hooks -- test plugin for the LokaDB plugin boundary (issue 3).
 *
 * Registers EVERY hook and steers what each one does with [plugin.t_hooks]
 * settings, so that test/integration/test_plugins.py can drive every hook
 * and every result code (CONTINUE, HANDLED, ASYNC + resume, ERROR):
 *
 *   mode              CONFIG_CHECK: must be "a" or "b" (else config_error)
 *   hold_ms, async_ms CONFIG_CHECK: must be a number 0..60000
 *   reject_user       CLIENT_STARTUP: ERROR 28000 for this user
 *   reject_app        CLIENT_STARTUP: ERROR 28000 for this application_name
 *   hold_user         CLIENT_STARTUP: ASYNC, resume(CONTINUE) after hold_ms
 *   hold_reject_user  CLIENT_STARTUP: ASYNC, resume_error(28000) after hold_ms
 *   redirect_user     CLIENT_STARTUP: client_set_database(redirect_db) and,
 *                     if redirect_to_user is set, client_set_user(it)
 *   watch             "all" or a user name: client_watch_queries(c, 1)
 *   auth_user, auth_secret  AUTH_LOOKUP: the secret of a user unknown to auth_file
 *   auth_async        "1": AUTH_LOOKUP answers from a timer (ASYNC)
 *   auth_deny_user    AUTH_LOOKUP: HANDLED with secret NULL (no such user)
 *   auth_fail_user    AUTH_LOOKUP: ERROR 57P03 (the auth backend is "down")
 *   answer            QUERY: a statement text answered by the plugin (HANDLED)
 *   fail_marker       QUERY: statements containing it get ERROR fail_state
 *   fail_param        QUERY (B): a Bind value equal to it gets ERROR fail_state
 *   fail_state        the SQLSTATE of those errors (default 42501)
 *   async_marker      QUERY: ASYNC, resume(CONTINUE) after async_ms
 *   async_fail_marker QUERY: ASYNC, resume_error(57014) after async_ms
 *   rewrite_from/_to  QUERY (Q, P): replace every occurrence in the text
 *   prefix_marker, prefix_sql  QUERY: query_prefix(prefix_sql)
 *   route_marker, route_db     QUERY: query_route(route_db)
 *   route_user, route_user_db  ROUTE: route_set(route_user_db) + HANDLED
 *   route_hold_user   ROUTE: ASYNC, resume(CONTINUE) after hold_ms
 *   route_fail_user   ROUTE: ERROR 53300
 *   set_param_from/_to  QUERY (B): text value equal to _from becomes _to
 *   pg_conninfo       for the console command T_HOOKS PG <sql>
 *
 * Console: SHOW T_HOOKS (counter, value int8), SHOW T_USERS (per user
 * counters), SHOW T_LAST (key, value: what the accessors returned last),
 * T_HOOKS RESET (admin only), T_HOOKS SLEEP <ms> and T_HOOKS PG <sql>
 * (both ASYNC, ended with result_done). Looks up t_service's table.
 */
#include <lokadb/plugin.h>

#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_service.h"

static const lk_api *api;
static lk_plugin *me;

enum {
	C_CHECK, C_APPLY, C_APPLY_RELOADING, C_STARTUP, C_AUTH, C_QUERY, C_Q, C_P, C_B, C_ROUTE,
	C_TXN_END, C_CLIENT_CLOSE, C_SERVER_CLOSE, C_RESUMES, C_CLIENT_CTX_LIVE,
	C_SERVER_CTX_LIVE, C_NCOUNT
};
static const char *const counter_names[C_NCOUNT] = {
	"config_check", "config_apply", "apply_reloading", "client_startup", "auth_lookup",
	"query", "query_q", "query_p", "query_b", "route", "txn_end", "client_close",
	"server_close", "resumes", "client_ctx_live", "server_ctx_live",
};
static long long counters[C_NCOUNT];

/* Per-user counters for SHOW T_USERS. */
#define MAX_USERS 32
struct user_stat {
	char user[64];
	long long startups, closes, queries, txns;
};
static struct user_stat users[MAX_USERS];
static int n_users;

/* What the accessors returned last (SHOW T_LAST). */
#define LAST_KEYS 12
static const char *const last_names[LAST_KEYS] = {
	"startup_user", "startup_database", "startup_app", "startup_addr", "startup_port",
	"query_type", "query_sql", "query_statement", "bind_sql", "bind_param0",
	"pool_database", "in_transaction",
};
static char last[LAST_KEYS][256];

/* What a pending ASYNC is waiting for. */
enum pending { P_NONE, P_STARTUP, P_STARTUP_REJECT, P_AUTH, P_QUERY, P_QUERY_FAIL, P_ROUTE };

/* Per-client context: allocated in CLIENT_STARTUP, freed in CLIENT_CLOSE. */
struct cctx {
	struct user_stat *us;
	lk_timer *timer;
	enum pending pending;
	lk_event *ev;
	lk_client *c;
};

/* Per-server context: allocated at its first TXN_END, freed in SERVER_CLOSE. */
struct sctx {
	long long txns;
};

static const char *S(const char *key)
{
	const char *v = api->setting(me, key);
	return v ? v : "";
}

static int set_is(const char *key, const char *value)
{
	const char *v = S(key);
	return *v && value && strcmp(v, value) == 0;
}

static void remember(int i, const char *v)
{
	snprintf(last[i], sizeof(last[i]), "%s", v ? v : "(null)");
}

static struct user_stat *user_stat(const char *user)
{
	int i;

	if (!user)
		user = "(null)";
	for (i = 0; i < n_users; i++)
		if (strcmp(users[i].user, user) == 0)
			return &users[i];
	if (n_users == MAX_USERS)
		return &users[MAX_USERS - 1];
	snprintf(users[n_users].user, sizeof(users[n_users].user), "%s", user);
	return &users[n_users++];
}

static uint64_t ms_setting(const char *key)
{
	return (uint64_t)strtoul(S(key), NULL, 10) * 1000u;
}

/* ------------------------------------------------------------- config -- */

static int check_number(lk_event *ev, const char *key)
{
	const char *v = api->config_get(ev, key);
	char *end;
	long n;

	if (!v || !*v)
		return LK_CONTINUE;
	n = strtol(v, &end, 10);
	if (*end || n < 0 || n > 60000)
		return api->config_error(ev, key, "must be a number of milliseconds 0..60000, not \"%s\"", v);
	return LK_CONTINUE;
}

static int on_config_check(lk_plugin *self, lk_event *ev)
{
	const char *mode = api->config_get(ev, "mode");

	(void)self;
	counters[C_CHECK]++;
	if (!mode || (strcmp(mode, "a") != 0 && strcmp(mode, "b") != 0))
		return api->config_error(ev, "mode", "must be a or b, not \"%s\"", mode ? mode : "(null)");
	if (check_number(ev, "hold_ms") == LK_ERROR || check_number(ev, "async_ms") == LK_ERROR)
		return LK_ERROR;
	return LK_CONTINUE;
}

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	counters[C_APPLY]++;
	if (api->config_reloading(ev))
		counters[C_APPLY_RELOADING]++;
	api->log(self, LK_LOG_INFO, "t_hooks applied mode=%s watch=%s", api->config_get(ev, "mode"),
		 api->config_get(ev, "watch") ? api->config_get(ev, "watch") : "");
	return LK_CONTINUE;
}

/* ------------------------------------------------------------- timers -- */

static void pending_fire(lk_plugin *self, void *arg)
{
	struct cctx *x = arg;
	enum pending p = x->pending;
	lk_client *c = x->c;

	(void)self;
	x->timer = NULL;
	x->pending = P_NONE;
	counters[C_RESUMES]++;
	switch (p) {
	case P_STARTUP:
	case P_ROUTE:
	case P_QUERY:
		api->resume(c, LK_CONTINUE);
		break;
	case P_STARTUP_REJECT:
		api->resume_error(c, "28000", "t_hooks rejected %s after holding it", api->client_user(c));
		break;
	case P_QUERY_FAIL:
		api->resume_error(c, "57014", "t_hooks failed the statement asynchronously");
		break;
	case P_AUTH:
		api->auth_set_secret(x->ev, S("auth_secret"));
		api->resume(c, LK_HANDLED);
		break;
	case P_NONE:
		break;
	}
}

static int go_async(struct cctx *x, enum pending p, lk_event *ev, uint64_t usec)
{
	x->pending = p;
	x->ev = ev;
	x->timer = api->timer_add(me, usec, 0, pending_fire, x);
	if (!x->timer) {
		x->pending = P_NONE;
		return api->fail(ev, "XX000", "t_hooks: timer_add failed");
	}
	return LK_ASYNC;
}

/* -------------------------------------------------------------- hooks -- */

static int on_client_startup(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	const char *user = api->client_user(c);
	const char *app = api->client_param(c, "application_name");
	const char *watch = S("watch");
	const char *db;
	struct cctx *x;
	char addr[128], portbuf[16];
	int port = -1;

	counters[C_STARTUP]++;
	db = api->client_database(c);
	if (!db || (strcmp(db, "lokadb") != 0 && strcmp(db, "pgbouncer") != 0)) {
		/* not the console's logins: the tests read SHOW T_LAST through one */
		remember(0, user);
		remember(1, db);
		remember(2, app);
		remember(3, api->client_addr(c, addr, sizeof(addr), &port));
		snprintf(portbuf, sizeof(portbuf), "%d", port);
		remember(4, portbuf);
	}

	if (api->client_ctx(self, c) != NULL)
		return api->fail(ev, "XX000", "t_hooks: client ctx set before CLIENT_STARTUP");
	x = calloc(1, sizeof(*x));
	if (!x)
		return api->fail(ev, "53200", "t_hooks: out of memory");
	x->c = c;
	x->us = user_stat(user);
	x->us->startups++;
	api->client_set_ctx(self, c, x);
	counters[C_CLIENT_CTX_LIVE]++;

	if (strcmp(watch, "all") == 0 || set_is("watch", user))
		api->client_watch_queries(c, 1);
	if (set_is("reject_user", user))
		return api->fail(ev, "28000", "t_hooks rejects user %s", user);
	if (set_is("reject_app", app))
		return api->fail(ev, "28000", "t_hooks rejects application %s", app);
	if (set_is("redirect_user", user)) {
		if (api->client_set_database(c, S("redirect_db")) != 0)
			return api->fail(ev, "3D000", "t_hooks: client_set_database(%s) refused", S("redirect_db"));
		if (*S("redirect_to_user") && api->client_set_user(c, S("redirect_to_user")) != 0)
			return api->fail(ev, "28000", "t_hooks: client_set_user refused");
	}
	if (*S("affinity_max") && app && *app)	/* server affinity keyed by application_name */
		api->client_set_affinity(c, app, atoi(S("affinity_max")));
	if (set_is("hold_user", user))
		return go_async(x, P_STARTUP, ev, ms_setting("hold_ms"));
	if (set_is("hold_reject_user", user))
		return go_async(x, P_STARTUP_REJECT, ev, ms_setting("hold_ms"));
	return LK_CONTINUE;
}

static int on_auth_lookup(lk_plugin *self, lk_event *ev)
{
	const char *user = api->auth_user(ev);
	lk_client *c = api->ev_client(ev);
	struct cctx *x = c ? api->client_ctx(self, c) : NULL;

	counters[C_AUTH]++;
	if (set_is("auth_fail_user", user))
		return api->fail(ev, "57P03", "t_hooks cannot look up %s now", user);
	if (set_is("auth_deny_user", user)) {
		api->auth_set_secret(ev, NULL);
		return LK_HANDLED;
	}
	if (!set_is("auth_user", user))
		return LK_CONTINUE;
	if (strcmp(S("auth_async"), "1") == 0 && x)
		return go_async(x, P_AUTH, ev, 100 * 1000);
	api->auth_set_secret(ev, S("auth_secret"));
	return LK_HANDLED;
}

/* Replace every occurrence of `from` in `sql` with `to`; malloc'ed. */
static char *replace_all(const char *sql, const char *from, const char *to)
{
	size_t nf = strlen(from), nt = strlen(to), n = 0;
	const char *p;
	char *out, *o;

	for (p = sql; (p = strstr(p, from)); p += nf)
		n++;
	out = malloc(strlen(sql) + n * nt + 1);
	if (!out)
		return NULL;
	for (o = out, p = sql;;) {
		const char *h = strstr(p, from);

		if (!h) {
			strcpy(o, p);
			break;
		}
		memcpy(o, p, (size_t)(h - p));
		o += h - p;
		memcpy(o, to, nt);
		o += nt;
		p = h + nf;
	}
	return out;
}

static int has(const char *sql, const char *key)
{
	const char *m = S(key);

	return sql && *m && strstr(sql, m) != NULL;
}

static int on_query(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct cctx *x = api->client_ctx(self, c);
	char t = api->query_type(ev);
	const char *sql = api->query_sql(ev);
	char tb[2] = { t, 0 };
	int i, n;

	counters[C_QUERY]++;
	counters[t == 'Q' ? C_Q : t == 'P' ? C_P : C_B]++;
	if (x)
		x->us->queries++;
	remember(5, tb);
	remember(6, sql);
	remember(10, api->client_pool_database(c));
	remember(11, api->client_in_transaction(c) ? "1" : "0");
	if (t == 'P' || t == 'B')
		remember(7, api->query_statement(ev));
	if (*S("affinity_from_sql") && sql && strncmp(sql, "/*aff=", 6) == 0) {
		char key[64];
		size_t k = strcspn(sql + 6, "*");
		if (k > 0 && k < sizeof(key)) {
			memcpy(key, sql + 6, k);
			key[k] = 0;
			api->client_set_affinity(c, key, *S("affinity_max") ? atoi(S("affinity_max")) : 8);
		}
	}

	if (t == 'B') {
		remember(8, sql);
		n = api->query_nparams(ev);
		for (i = 0; i < n; i++) {
			int len = -1, fmt = -1;
			const char *v = api->query_param(ev, i, &len, &fmt);

			if (i == 0)
				remember(9, v);
			if (!v || fmt != 0)
				continue;
			if (*S("fail_param") && (size_t)len == strlen(S("fail_param")) &&
			    memcmp(v, S("fail_param"), (size_t)len) == 0)
				return api->fail(ev, *S("fail_state") ? S("fail_state") : "42501",
						 "t_hooks refused bind value %d", i + 1);
			if (*S("set_param_from") && (size_t)len == strlen(S("set_param_from")) &&
			    memcmp(v, S("set_param_from"), (size_t)len) == 0 &&
			    api->query_set_param(ev, i, S("set_param_to")) != 0)
				return api->fail(ev, "XX000", "t_hooks: query_set_param failed");
		}
	}
	if (!sql)
		return LK_CONTINUE;

	if (has(sql, "fail_marker"))
		return api->fail(ev, *S("fail_state") ? S("fail_state") : "42501",
				 "t_hooks refused this statement (%c)", t);
	if (t == 'Q' && set_is("answer", sql)) {
		static const char *const names[] = { "answer", "n" };
		static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8 };
		static const char *const row[] = { "answered by t_hooks", "1" };
		lk_result *res = api->query_result(ev);

		if (!res)
			return api->fail(ev, "XX000", "t_hooks: query_result returned NULL");
		api->result_columns(res, 2, names, types);
		api->result_row(res, row);
		return LK_HANDLED;
	}
	if (x && has(sql, "async_fail_marker"))
		return go_async(x, P_QUERY_FAIL, ev, ms_setting("async_ms"));
	if (x && has(sql, "async_marker"))
		return go_async(x, P_QUERY, ev, ms_setting("async_ms"));
	if (t == 'B' && *S("reparse_from") && strstr(sql, S("reparse_from"))) {
		char *nsql = replace_all(sql, S("reparse_from"), S("reparse_to"));
		int rc = nsql ? api->query_reparse(ev, nsql) : -1;
		free(nsql);
		if (rc != 0)
			return api->fail(ev, "XX000", "t_hooks: query_reparse failed");
	}
	if ((t == 'Q' || t == 'P') && has(sql, "rewrite_from")) {
		char *nsql = replace_all(sql, S("rewrite_from"), S("rewrite_to"));
		int rc = nsql ? api->query_rewrite(ev, nsql) : -1;

		free(nsql);
		if (rc != 0)
			return api->fail(ev, "XX000", "t_hooks: query_rewrite failed");
	}
	if (has(sql, "prefix_marker") && api->query_prefix(ev, S("prefix_sql")) != 0)
		return api->fail(ev, "XX000", "t_hooks: query_prefix failed");
	if (has(sql, "route_marker") && api->query_route(ev, S("route_db")) != 0)
		return api->fail(ev, "3D000", "t_hooks: cannot route to %s", S("route_db"));
	return LK_CONTINUE;
}

static int on_route(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	const char *user = api->client_user(c);
	struct cctx *x = api->client_ctx(self, c);

	counters[C_ROUTE]++;
	if (set_is("route_fail_user", user))
		return api->fail(ev, "53300", "t_hooks has no server for %s", user);
	if (x && set_is("route_hold_user", user))
		return go_async(x, P_ROUTE, ev, ms_setting("hold_ms"));
	if (set_is("route_user", user)) {
		if (api->route_set(ev, S("route_user_db")) != 0)
			return api->fail(ev, "3D000", "t_hooks: route_set(%s) refused", S("route_user_db"));
		return LK_HANDLED;
	}
	return LK_CONTINUE;
}

static int on_txn_end(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	lk_server *s = api->ev_server(ev);
	struct cctx *x = c ? api->client_ctx(self, c) : NULL;
	struct sctx *sx;

	counters[C_TXN_END]++;
	if (x)
		x->us->txns++;
	if (s) {
		sx = api->server_ctx(self, s);
		if (!sx) {
			sx = calloc(1, sizeof(*sx));
			if (!sx)
				return LK_CONTINUE;
			api->server_set_ctx(self, s, sx);
			counters[C_SERVER_CTX_LIVE]++;
		}
		sx->txns++;
	}
	return LK_CONTINUE;
}

static int on_client_close(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct cctx *x = api->client_ctx(self, c);

	counters[C_CLIENT_CLOSE]++;
	if (x) {
		if (x->timer)
			api->timer_cancel(x->timer);
		x->us->closes++;
		free(x);
		api->client_set_ctx(self, c, NULL);
		counters[C_CLIENT_CTX_LIVE]--;
	}
	return LK_CONTINUE;
}

static int on_server_close(lk_plugin *self, lk_event *ev)
{
	lk_server *s = api->ev_server(ev);
	struct sctx *sx = s ? api->server_ctx(self, s) : NULL;

	counters[C_SERVER_CLOSE]++;
	if (sx) {
		free(sx);
		api->server_set_ctx(self, s, NULL);
		counters[C_SERVER_CTX_LIVE]--;
	}
	return LK_CONTINUE;
}

static int on_shutdown(lk_plugin *self, lk_event *ev)
{
	(void)ev;
	api->log(self, LK_LOG_INFO, "t_hooks: SHUTDOWN hook");
	return LK_CONTINUE;
}

/* ------------------------------------------------------------ console -- */

static long service_answer(void)
{
	const struct t_service_v1 *t = api->service_lookup(T_SERVICE_NAME);

	if (!t || t->version != 1)
		return -1;
	return t->answer();
}

static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "counter", "value" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8 };
	char buf[32];
	const char *row[2] = { NULL, buf };
	int i;

	(void)self;
	if (*args)
		return api->result_error(res, "42601", "SHOW T_HOOKS takes no arguments (got \"%s\")", args);
	api->result_columns(res, 2, names, types);
	for (i = 0; i < C_NCOUNT; i++) {
		row[0] = counter_names[i];
		snprintf(buf, sizeof(buf), "%lld", counters[i]);
		api->result_row(res, row);
	}
	row[0] = "service_answer";
	snprintf(buf, sizeof(buf), "%ld", service_answer());
	api->result_row(res, row);
	return LK_HANDLED;
}

static int cmd_users(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "user", "startups", "closes", "queries", "txns" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8,
					  LK_TYPE_INT8 };
	char b[4][32];
	const char *row[5] = { NULL, b[0], b[1], b[2], b[3] };
	int i;

	(void)self;
	(void)args;
	api->result_columns(res, 5, names, types);
	for (i = 0; i < n_users; i++) {
		row[0] = users[i].user;
		snprintf(b[0], sizeof(b[0]), "%lld", users[i].startups);
		snprintf(b[1], sizeof(b[1]), "%lld", users[i].closes);
		snprintf(b[2], sizeof(b[2]), "%lld", users[i].queries);
		snprintf(b[3], sizeof(b[3]), "%lld", users[i].txns);
		api->result_row(res, row);
	}
	return LK_HANDLED;
}

static int cmd_last(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "key", "value" };
	const char *row[2];
	int i;

	(void)args;
	api->result_columns(res, 2, names, NULL);
	for (i = 0; i < LAST_KEYS; i++) {
		row[0] = last_names[i];
		row[1] = last[i];
		api->result_row(res, row);
	}
	row[0] = "setting_mode";
	row[1] = api->setting(self, "mode");
	api->result_row(res, row);
	row[0] = "plugin_name";
	row[1] = api->plugin_name(self);
	api->result_row(res, row);
	row[0] = "undeclared_setting_is_null";
	row[1] = api->setting(self, "no_such_key") == NULL ? "yes" : "no";
	api->result_row(res, row);
	row[0] = "core_version";
	row[1] = api->core_version;
	api->result_row(res, row);
	return LK_HANDLED;
}

/* T_HOOKS RESET: admin only. */
static int cmd_reset(lk_plugin *self, lk_result *res, const char *args)
{
	int i;

	(void)self;
	if (*args)
		return api->result_error(res, "42601", "T_HOOKS RESET takes no arguments");
	for (i = 0; i < C_NCOUNT; i++)
		if (i != C_CLIENT_CTX_LIVE && i != C_SERVER_CTX_LIVE)
			counters[i] = 0;
	for (i = 0; i < n_users; i++)
		users[i].startups = users[i].closes = users[i].queries = users[i].txns = 0;
	api->result_complete(res, "T_HOOKS RESET");
	return LK_HANDLED;
}

/* T_HOOKS SLEEP <ms>: ASYNC, answers one row after ms. */
struct sleep_job {
	lk_result *res;
	uint64_t start;
};

static void sleep_done(lk_plugin *self, void *arg)
{
	struct sleep_job *j = arg;
	static const char *const names[] = { "slept_ms" };
	static const uint32_t types[] = { LK_TYPE_INT8 };
	char buf[32];
	const char *row[1] = { buf };

	(void)self;
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)((api->now_usec() - j->start) / 1000u));
	api->result_columns(j->res, 1, names, types);
	api->result_row(j->res, row);
	api->result_complete(j->res, "T_HOOKS SLEEP");
	api->result_done(j->res);
	free(j);
}

static int cmd_sleep(lk_plugin *self, lk_result *res, const char *args)
{
	struct sleep_job *j;
	char *end;
	long ms = strtol(args, &end, 10);

	if (!*args || *end || ms < 0 || ms > 10000)
		return api->result_error(res, "42601", "usage: T_HOOKS SLEEP <ms>");
	j = calloc(1, sizeof(*j));
	if (!j)
		return api->result_error(res, "53200", "out of memory");
	j->res = res;
	j->start = api->now_usec();
	if (!api->timer_add(self, (uint64_t)ms * 1000u, 0, sleep_done, j)) {
		free(j);
		return api->result_error(res, "XX000", "timer_add failed");
	}
	return LK_ASYNC;
}

/* T_HOOKS PG <sql>: ASYNC, runs sql over api->pg_* on pg_conninfo. */
struct pg_job {
	lk_result *res;
	char *sql;
	int done;
};

static void pg_job_finish(lk_pg *pg, struct pg_job *j)
{
	api->result_done(j->res);
	j->done = 1;
	if (pg)
		api->pg_close(pg);
	free(j->sql);
	free(j);
}

static void pg_result(lk_plugin *self, lk_pg *pg, struct pg_result *r, void *arg)
{
	struct pg_job *j = arg;
	int nf, nt, i, k;

	(void)self;
	if (!r) {
		api->result_error(j->res, "08006", "T_HOOKS PG: the connection broke");
	} else if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		const char *names[16];
		const char *row[16];

		nf = PQnfields(r);
		if (nf > 16)
			nf = 16;
		for (i = 0; i < nf; i++)
			names[i] = PQfname(r, i);
		api->result_columns(j->res, nf, names, NULL);
		nt = PQntuples(r);
		for (k = 0; k < nt; k++) {
			for (i = 0; i < nf; i++)
				row[i] = PQgetisnull(r, k, i) ? NULL : PQgetvalue(r, k, i);
			api->result_row(j->res, row);
		}
		api->result_complete(j->res, PQcmdStatus(r));
	} else if (PQresultStatus(r) == PGRES_COMMAND_OK) {
		api->result_complete(j->res, PQcmdStatus(r));
	} else {
		const char *st = PQresultErrorField(r, PG_DIAG_SQLSTATE);
		const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

		api->result_error(j->res, st ? st : "XX000", "T_HOOKS PG: %s", msg ? msg : "failed");
	}
	pg_job_finish(pg, j);
}

static void pg_state(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	struct pg_job *j = arg;

	(void)self;
	if (ok) {
		if (api->pg_query(pg, j->sql, 0, NULL, pg_result, j) != 0) {
			api->result_error(j->res, "XX000", "T_HOOKS PG: pg_query failed");
			pg_job_finish(pg, j);
		}
		return;
	}
	api->result_error(j->res, "08006", "T_HOOKS PG: %s", err ? err : "connect failed");
	pg_job_finish(pg, j);
}

static int cmd_pg(lk_plugin *self, lk_result *res, const char *args)
{
	struct pg_job *j;

	if (!*args)
		return api->result_error(res, "42601", "usage: T_HOOKS PG <sql>");
	if (!*S("pg_conninfo"))
		return api->result_error(res, "55000", "T_HOOKS PG: pg_conninfo is not set");
	j = calloc(1, sizeof(*j));
	if (!j)
		return api->result_error(res, "53200", "out of memory");
	j->res = res;
	j->sql = strdup(args);
	if (!j->sql || !api->pg_connect(self, S("pg_conninfo"), pg_state, j)) {
		free(j->sql);
		free(j);
		return api->result_error(res, "XX000", "T_HOOKS PG: pg_connect failed");
	}
	return LK_ASYNC;
}

/* --------------------------------------------------------------- init -- */

static const struct {
	const char *key, *def, *doc;
} settings[] = {
	{ "mode", "a", "a or b (CONFIG_CHECK refuses anything else)" },
	{ "affinity_max", "", "set: each client's application_name is its server affinity key, this many keys per server" },
	{ "affinity_from_sql", "", "on: a query starting /*aff=KEY*/ sets the client's affinity key to KEY (watch = all)" },
	{ "watch", "", "all, or a user whose queries go to the QUERY hook" },
	{ "reject_user", "", "CLIENT_STARTUP fails this user with 28000" },
	{ "reject_app", "", "CLIENT_STARTUP fails this application_name with 28000" },
	{ "hold_user", "", "CLIENT_STARTUP holds this user hold_ms (ASYNC)" },
	{ "hold_reject_user", "", "CLIENT_STARTUP holds, then rejects this user" },
	{ "hold_ms", "300", "hold time of hold_user / route_hold_user" },
	{ "redirect_user", "", "CLIENT_STARTUP sends this user to redirect_db" },
	{ "redirect_db", "", "database for redirect_user" },
	{ "redirect_to_user", "", "user name given to redirect_user" },
	{ "auth_user", "", "AUTH_LOOKUP provides auth_secret for this user" },
	{ "auth_secret", "", "the secret of auth_user" },
	{ "auth_async", "0", "1: AUTH_LOOKUP answers from a timer" },
	{ "auth_deny_user", "", "AUTH_LOOKUP says this user does not exist" },
	{ "auth_fail_user", "", "AUTH_LOOKUP fails this user with 57P03" },
	{ "answer", "", "QUERY answers this exact statement itself" },
	{ "fail_marker", "", "QUERY fails statements containing this" },
	{ "fail_param", "", "QUERY fails Binds with this value" },
	{ "fail_state", "42501", "SQLSTATE of those failures" },
	{ "async_marker", "", "QUERY holds statements containing this async_ms" },
	{ "async_fail_marker", "", "QUERY holds, then fails statements containing this" },
	{ "async_ms", "200", "hold time of async_marker" },
	{ "rewrite_from", "", "QUERY replaces this text ..." },
	{ "rewrite_to", "", "... with this" },
	{ "prefix_marker", "", "QUERY prefixes statements containing this ..." },
	{ "prefix_sql", "", "... with this statement" },
	{ "route_marker", "", "QUERY routes statements containing this ..." },
	{ "route_db", "", "... to this database" },
	{ "route_user", "", "ROUTE sends this user ..." },
	{ "route_user_db", "", "... to this database" },
	{ "route_hold_user", "", "ROUTE holds this user hold_ms" },
	{ "route_fail_user", "", "ROUTE fails this user with 53300" },
	{ "set_param_from", "", "QUERY replaces Bind values equal to this ..." },
	{ "reparse_from", "", "QUERY (B): the bound statement is parsed again with this text replaced ..." },
	{ "reparse_to", "", "... by this" },
	{ "set_param_to", "", "... with this" },
	{ "pg_conninfo", "", "conninfo for T_HOOKS PG" },
};

static int t_init(lk_plugin *self, const lk_api *a)
{
	static const lk_hook_fn fns[LK_HOOK_COUNT] = {
		[LK_HOOK_CONFIG_CHECK] = on_config_check,
		[LK_HOOK_CONFIG_APPLY] = on_config_apply,
		[LK_HOOK_CLIENT_STARTUP] = on_client_startup,
		[LK_HOOK_AUTH_LOOKUP] = on_auth_lookup,
		[LK_HOOK_QUERY] = on_query,
		[LK_HOOK_ROUTE] = on_route,
		[LK_HOOK_TXN_END] = on_txn_end,
		[LK_HOOK_CLIENT_CLOSE] = on_client_close,
		[LK_HOOK_SERVER_CLOSE] = on_server_close,
		[LK_HOOK_SHUTDOWN] = on_shutdown,
	};
	size_t i;
	int h;

	api = a;
	me = self;
	if (a->abi_major != LK_ABI_MAJOR) {
		a->init_error(self, "unexpected api->abi_major %u", a->abi_major);
		return -1;
	}
	if (strcmp(a->plugin_name(self), "t_hooks") != 0) {
		a->init_error(self, "plugin_name() is %s", a->plugin_name(self));
		return -1;
	}
	for (i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		if (a->config_declare(self, settings[i].key, settings[i].def, settings[i].doc) != 0) {
			a->init_error(self, "config_declare(%s) failed", settings[i].key);
			return -1;
		}
	for (h = 0; h < LK_HOOK_COUNT; h++)
		if (a->hook(self, (enum lk_hook)h, fns[h], 0) != 0) {
			a->init_error(self, "hook(%d) failed", h);
			return -1;
		}
	if (a->console_register(self, "SHOW T_HOOKS", 0, cmd_show, "t_hooks counters") != 0 ||
	    a->console_register(self, "SHOW T_USERS", 0, cmd_users, "t_hooks per-user counters") != 0 ||
	    a->console_register(self, "SHOW T_LAST", 0, cmd_last, "what t_hooks saw last") != 0 ||
	    a->console_register(self, "T_HOOKS RESET", 1, cmd_reset, "zero the t_hooks counters") != 0 ||
	    a->console_register(self, "T_HOOKS SLEEP", 0, cmd_sleep, "answer after <ms>") != 0 ||
	    a->console_register(self, "T_HOOKS PG", 1, cmd_pg, "run <sql> on pg_conninfo") != 0) {
		a->init_error(self, "console_register failed");
		return -1;
	}
	return 0;
}

static void t_fini(lk_plugin *self)
{
	api->log(self, LK_LOG_INFO, "t_hooks fini: %lld clients still with ctx",
		 counters[C_CLIENT_CTX_LIVE]);
}

LK_PLUGIN("t_hooks", "1.2.3", t_init, t_fini)
