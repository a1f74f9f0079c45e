/* SPDX-License-Identifier: ISC */
/*
 * t_mc_client -- test plugin: a client of the meta_cache service
 * (include/lokadb/meta_cache.h), so that test/integration/test_meta_cache.py
 * can check every service function through the console and a live session.
 * List it after meta_cache in `plugins =`.
 *
 * Console (not admin only):
 *   SHOW T_MC                     ready, stale, version, n_tables, reloading,
 *                                 changes (on_change calls), change_version, size
 *   SHOW T_MC TABLE schema.name   table(): schema, name, org_column, org_type,
 *                                 default_part (no row: NULL)
 *   SHOW T_MC SEARCH name | search_path | user
 *                                 table_search(); search_path "-" means NULL
 *                                 (the default), user "-" NULL
 *   SHOW T_MC ORG id              org(): id, name, state, site, profile,
 *                                 isolated, paused
 *   SHOW T_MC LEAF schema.name org_id   leaf()
 *   T_MC REFRESH                  refresh(), answers (version, waited) when called back
 *   T_MC WAIT                     wait(), likewise
 *
 * QUERY: for the clients of user `watch` ([plugin.t_mc_client]), the
 * statement SELECT 't_mc_version' is answered by the plugin with the
 * catalog version, after holding it with wait() while a reload is due --
 * the way org_routing holds a statement -- so a test can see what a live
 * session's next statement sees. Columns: version, held (bool).
 */
#include <lokadb/meta_cache.h>
#include <lokadb/plugin.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MC_VERSION_SQL "SELECT 't_mc_version'"

static const lk_api *api;
static lk_plugin *me;
static long long changes;
static uint64_t change_version;
static int subscribed;

/* A held statement of a watched client (its client slot). */
struct held {
	lk_client *c;
	lk_event *ev;
	int waiting;
};

/* An async console command waiting for the service. */
struct job {
	lk_result *res;
	int waited;
};

static const struct meta_cache_api *svc(void)
{
	const struct meta_cache_api *m = api->service_lookup(META_CACHE_SERVICE);

	if (m == NULL || m->size < offsetof(struct meta_cache_api, refresh) + sizeof(m->refresh))
		return NULL;
	return m;
}

static void on_change(void *arg, uint64_t version)
{
	(void)arg;
	changes++;
	change_version = version;
}

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	const struct meta_cache_api *m = svc();

	(void)self;
	(void)ev;
	if (m != NULL && !subscribed && m->on_change(on_change, NULL) == 0)
		subscribed = 1;
	return LK_CONTINUE;
}

/* ------------------------------------------------------ live session -- */

static void answer_version(lk_event *ev, int held)
{
	static const char *const names[] = { "version", "held" };
	static const uint32_t types[] = { LK_TYPE_INT8, LK_TYPE_BOOL };
	const struct meta_cache_api *m = svc();
	char v[24];
	const char *row[2] = { v, held ? "t" : "f" };
	lk_result *res = api->query_result(ev);

	snprintf(v, sizeof(v), "%" PRIu64, m != NULL ? m->version() : 0);
	api->result_columns(res, 2, names, types);
	api->result_row(res, row);
}

static void statement_go(void *arg, uint64_t version)
{
	struct held *h = arg;

	(void)version;
	h->waiting = 0;
	answer_version(h->ev, 1);
	api->resume(h->c, LK_HANDLED);
}

static int on_client_startup(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	const char *watch = api->setting(self, "watch");

	if (watch != NULL && *watch != '\0' && strcmp(api->client_user(c), watch) == 0)
		api->client_watch_queries(c, 1);
	return LK_CONTINUE;
}

static int on_query(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	const char *sql = api->query_sql(ev);
	const struct meta_cache_api *m = svc();
	struct held *h;

	if (api->query_type(ev) != 'Q' || sql == NULL || strcmp(sql, T_MC_VERSION_SQL) != 0 || m == NULL)
		return LK_CONTINUE;
	h = api->client_ctx(self, c);
	if (h == NULL) {
		h = calloc(1, sizeof(*h));
		if (h == NULL)
			return api->fail(ev, "53200", "out of memory");
		h->c = c;
		api->client_set_ctx(self, c, h);
	}
	h->ev = ev;
	if (m->wait(statement_go, h) == 0) {
		h->waiting = 1;
		return LK_ASYNC;
	}
	answer_version(ev, 0);
	return LK_HANDLED;
}

static int on_client_close(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct held *h = api->client_ctx(self, c);
	const struct meta_cache_api *m = svc();

	if (h == NULL)
		return LK_CONTINUE;
	if (h->waiting && m != NULL)
		m->wait_cancel(statement_go, h);
	free(h);
	api->client_set_ctx(self, c, NULL);
	return LK_CONTINUE;
}

/* ----------------------------------------------------------- console -- */

static int show_status(lk_result *res, const struct meta_cache_api *m)
{
	static const char *const names[] = { "ready", "stale", "version", "n_tables", "reloading",
					     "changes", "change_version", "size" };
	char b[5][24];
	const char *row[8];

	snprintf(b[0], sizeof(b[0]), "%" PRIu64, m->version());
	snprintf(b[1], sizeof(b[1]), "%d", m->n_tables());
	snprintf(b[2], sizeof(b[2]), "%lld", changes);
	snprintf(b[3], sizeof(b[3]), "%" PRIu64, change_version);
	snprintf(b[4], sizeof(b[4]), "%u", m->size);
	row[0] = m->ready() ? "1" : "0";
	row[1] = m->stale() ? "1" : "0";
	row[2] = b[0];
	row[3] = b[1];
	row[4] = m->reloading() ? "1" : "0";
	row[5] = b[2];
	row[6] = b[3];
	row[7] = b[4];
	api->result_columns(res, 8, names, NULL);
	api->result_row(res, row);
	return LK_HANDLED;
}

static int show_table(lk_result *res, const struct mc_table *t)
{
	static const char *const names[] = { "schema", "name", "org_column", "org_type", "default_part" };

	api->result_columns(res, 5, names, NULL);
	if (t != NULL) {
		const char *row[5] = { t->schema, t->name, t->org_column, t->org_type, t->default_part };

		api->result_row(res, row);
	}
	return LK_HANDLED;
}

/* "schema.name" in buf (changed in place) -> schema, name; -1 if there is no dot. */
static int split_qualified(char *buf, const char **schema, const char **name)
{
	char *dot = strchr(buf, '.');

	if (dot == NULL)
		return -1;
	*dot = '\0';
	*schema = buf;
	*name = dot + 1;
	return 0;
}

/* Trim blanks in place. */
static char *trim(char *s)
{
	char *e;

	while (*s == ' ')
		s++;
	e = s + strlen(s);
	while (e > s && e[-1] == ' ')
		*--e = '\0';
	return s;
}

static int show_search(lk_result *res, const struct meta_cache_api *m, const char *args)
{
	char buf[512];
	char *name, *path, *user, *bar;

	snprintf(buf, sizeof(buf), "%s", args);
	name = buf;
	bar = strchr(name, '|');
	if (bar == NULL)
		return api->result_error(res, "42601", "usage: SHOW T_MC SEARCH name | search_path | user");
	*bar = '\0';
	path = bar + 1;
	bar = strchr(path, '|');
	if (bar == NULL)
		return api->result_error(res, "42601", "usage: SHOW T_MC SEARCH name | search_path | user");
	*bar = '\0';
	user = trim(bar + 1);
	path = trim(path);
	name = trim(name);
	return show_table(res, m->table_search(name, strcmp(path, "-") == 0 ? NULL : path,
					       strcmp(user, "-") == 0 ? NULL : user));
}

static int show_org(lk_result *res, const struct mc_org *o)
{
	static const char *const names[] = { "id", "name", "state", "site", "profile", "isolated", "paused" };

	api->result_columns(res, 7, names, NULL);
	if (o != NULL) {
		const char *row[7] = { o->id, o->name, o->state, o->site, o->profile,
				       o->isolated ? "1" : "0", o->paused ? "1" : "0" };

		api->result_row(res, row);
	}
	return LK_HANDLED;
}

static int show_leaf(lk_result *res, const struct meta_cache_api *m, const char *args)
{
	static const char *const names[] = { "leaf" };
	char buf[256], org[128];
	const char *schema, *name, *row[1];
	char *sp;

	snprintf(buf, sizeof(buf), "%s", args);
	sp = strchr(buf, ' ');
	if (sp == NULL)
		return api->result_error(res, "42601", "usage: SHOW T_MC LEAF schema.name org_id");
	*sp = '\0';
	snprintf(org, sizeof(org), "%s", trim(sp + 1));
	if (split_qualified(buf, &schema, &name) != 0)
		return api->result_error(res, "42601", "usage: SHOW T_MC LEAF schema.name org_id");
	row[0] = m->leaf(schema, name, org);
	api->result_columns(res, 1, names, NULL);
	api->result_row(res, row);
	return LK_HANDLED;
}

static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	const struct meta_cache_api *m = svc();
	char buf[256];
	const char *schema, *name;

	(void)self;
	if (m == NULL)
		return api->result_error(res, "55000", "service %s not found", META_CACHE_SERVICE);
	if (*args == '\0')
		return show_status(res, m);
	if (strncmp(args, "TABLE ", 6) == 0) {
		snprintf(buf, sizeof(buf), "%s", args + 6);
		if (split_qualified(trim(buf), &schema, &name) != 0)
			return api->result_error(res, "42601", "usage: SHOW T_MC TABLE schema.name");
		return show_table(res, m->table(schema, name));
	}
	if (strncmp(args, "SEARCH ", 7) == 0)
		return show_search(res, m, args + 7);
	if (strncmp(args, "ORG ", 4) == 0) {
		snprintf(buf, sizeof(buf), "%s", args + 4);
		return show_org(res, m->org(trim(buf)));
	}
	if (strncmp(args, "LEAF ", 5) == 0)
		return show_leaf(res, m, args + 5);
	return api->result_error(res, "42601", "unknown SHOW T_MC argument: %s", args);
}

static void job_done(void *arg, uint64_t version)
{
	static const char *const names[] = { "version", "waited" };
	struct job *j = arg;
	char v[24];
	const char *row[2] = { v, j->waited ? "1" : "0" };

	snprintf(v, sizeof(v), "%" PRIu64, version);
	api->result_columns(j->res, 2, names, NULL);
	api->result_row(j->res, row);
	api->result_done(j->res);
	free(j);
}

static int run_job(lk_result *res, int refresh)
{
	const struct meta_cache_api *m = svc();
	struct job *j;
	int rc;

	if (m == NULL)
		return api->result_error(res, "55000", "service %s not found", META_CACHE_SERVICE);
	j = calloc(1, sizeof(*j));
	if (j == NULL)
		return api->result_error(res, "53200", "out of memory");
	j->res = res;
	j->waited = 1;
	rc = refresh ? m->refresh(job_done, j) : m->wait(job_done, j);
	if (rc == 0)
		return LK_ASYNC;
	free(j);
	if (rc < 0)
		return api->result_error(res, "53200", "the service refused");
	{
		static const char *const names[] = { "version", "waited" };
		char v[24];
		const char *row[2] = { v, "0" };

		snprintf(v, sizeof(v), "%" PRIu64, m->version());
		api->result_columns(res, 2, names, NULL);
		api->result_row(res, row);
	}
	return LK_HANDLED;
}

static int cmd_refresh(lk_plugin *self, lk_result *res, const char *args)
{
	(void)self;
	(void)args;
	return run_job(res, 1);
}

static int cmd_wait(lk_plugin *self, lk_result *res, const char *args)
{
	(void)self;
	(void)args;
	return run_job(res, 0);
}

static int t_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	me = self;
	if (a->config_declare(self, "watch", "", "user whose SELECT 't_mc_version' is answered") != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0 ||
	    a->hook(self, LK_HOOK_CLIENT_STARTUP, on_client_startup, 0) != 0 ||
	    a->hook(self, LK_HOOK_QUERY, on_query, 0) != 0 ||
	    a->hook(self, LK_HOOK_CLIENT_CLOSE, on_client_close, 0) != 0 ||
	    a->console_register(self, "SHOW T_MC", 0, cmd_show, "look up the meta_cache service") != 0 ||
	    a->console_register(self, "T_MC REFRESH", 0, cmd_refresh, "meta_cache refresh()") != 0 ||
	    a->console_register(self, "T_MC WAIT", 0, cmd_wait, "meta_cache wait()") != 0) {
		a->init_error(self, "registration failed");
		return -1;
	}
	return 0;
}

LK_PLUGIN("t_mc_client", "0.1", t_init, NULL)
