/* SPDX-License-Identifier: ISC */
/*
 * hello -- the annotated example plugin of doc/plugins.md.
 *
 *   - CLIENT_STARTUP: refuses the users listed in `deny_users`, and flags the
 *     clients whose application_name is `watch_app` for the QUERY hook;
 *   - QUERY: for flagged clients, answers the query `SELECT 'hello'` itself
 *     with `greeting`, without using a server connection; every other
 *     message goes on to PostgreSQL as usual;
 *   - CLIENT_CLOSE: frees the per-client counter and logs it;
 *   - CONFIG_CHECK / CONFIG_APPLY: checks and takes over [plugin.hello];
 *   - console: SHOW HELLO.
 *
 * Build (in the source tree; with an installed lokadb use -I/usr/local/include):
 *
 *   cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden \
 *      -Iinclude -o plugins/hello/hello.so doc/examples/hello.c
 */
#define _POSIX_C_SOURCE 200809L	/* strdup() under -std=c11 */

#include <lokadb/plugin.h>	/* the only LokaDB header a plugin needs */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * The core's function table. It is the same for every call and stays valid
 * until the process exits, so keeping it in a static is fine.
 */
static const lk_api *api;

/* The plugin's state, kept with api->set_data(). */
struct hello {
	char *greeting;		/* [plugin.hello] greeting */
	char *deny_users;	/* [plugin.hello] deny_users */
	char *watch_app;	/* [plugin.hello] watch_app */
	uint64_t answered;	/* queries answered by the plugin */
	uint64_t refused;	/* logins refused */
	uint64_t watched;	/* clients flagged for QUERY */
};

/* Per-client state, kept in this plugin's slot of the client. */
struct hello_client {
	uint64_t answered;
};

/* Is `name` in the comma/space separated `list`? */
static int in_list(const char *list, const char *name)
{
	size_t n = strlen(name);

	while (list != NULL && *list != '\0') {
		list += strspn(list, ", \t");
		size_t len = strcspn(list, ", \t");
		if (len == n && len > 0 && memcmp(list, name, n) == 0)
			return 1;
		list += len;
	}
	return 0;
}

/* Is `sql` the query SELECT 'hello' (any case, blanks and a final ';' allowed)? */
static int is_select_hello(const char *sql)
{
	static const char want[] = "select 'hello'";
	size_t i;

	if (sql == NULL)
		return 0;
	sql += strspn(sql, " \t\r\n");
	for (i = 0; want[i] != '\0'; i++) {
		char ch = sql[i];
		if (ch >= 'A' && ch <= 'Z')
			ch = (char)(ch - 'A' + 'a');
		if (ch != want[i])
			return 0;
	}
	sql += i;
	sql += strspn(sql, " \t\r\n");
	if (*sql == ';')
		sql++;
	sql += strspn(sql, " \t\r\n");
	return *sql == '\0';
}

/*
 * CONFIG_CHECK: the values of [plugin.hello] about to be used, at start and
 * on every RELOAD or SET. Nothing is applied yet; returning LK_ERROR (what
 * config_error() returns) refuses the whole configuration, and the core
 * reports the file, line, key and our reason.
 */
static int hello_config_check(lk_plugin *self, lk_event *ev)
{
	const char *g = api->config_get(ev, "greeting");

	(void)self;
	if (g == NULL || g[0] == '\0')
		return api->config_error(ev, "greeting", "must not be empty");
	if (strlen(g) > 200)
		return api->config_error(ev, "greeting", "is longer than 200 characters");
	return LK_CONTINUE;
}

static int replace(char **dst, const char *src)
{
	char *copy = strdup(src != NULL ? src : "");

	if (copy == NULL)
		return -1;
	free(*dst);
	*dst = copy;
	return 0;
}

/*
 * CONFIG_APPLY: every plugin's CONFIG_CHECK has accepted the values and they
 * are now in use. An observer: it cannot refuse any more. It runs once at
 * start, before the first client, and after each successful RELOAD or SET.
 */
static int hello_config_apply(lk_plugin *self, lk_event *ev)
{
	struct hello *h = api->get_data(self);

	if (replace(&h->greeting, api->config_get(ev, "greeting")) != 0 ||
	    replace(&h->deny_users, api->config_get(ev, "deny_users")) != 0 ||
	    replace(&h->watch_app, api->config_get(ev, "watch_app")) != 0)
		api->log(self, LK_LOG_ERROR, "out of memory; some settings keep their old value");
	if (api->config_reloading(ev))
		api->log(self, LK_LOG_INFO, "settings changed: greeting \"%s\"", h->greeting);
	return LK_CONTINUE;
}

/*
 * CLIENT_STARTUP: the startup packet has been read; the client is not
 * authenticated yet. A decision hook: LK_ERROR refuses the login with a
 * FATAL error, LK_CONTINUE lets the next plugin and then the core go on.
 */
static int hello_client_startup(lk_plugin *self, lk_event *ev)
{
	struct hello *h = api->get_data(self);
	lk_client *c = api->ev_client(ev);
	const char *db = api->client_database(c);
	const char *user = api->client_user(c);
	const char *app = api->client_param(c, "application_name");

	/* Console sessions come here too; this plugin leaves them alone. */
	if (strcmp(db, "lokadb") == 0 || strcmp(db, "pgbouncer") == 0)
		return LK_CONTINUE;
	if (in_list(h->deny_users, user)) {
		h->refused++;
		return api->fail(ev, "28000", "user \"%s\" is not allowed here", user);
	}
	/* Only flagged clients pay for the QUERY hook; the others never call us again. */
	if (h->watch_app[0] != '\0' && app != NULL && strcmp(app, h->watch_app) == 0) {
		api->client_watch_queries(c, 1);
		h->watched++;
	}
	return LK_CONTINUE;
}

/*
 * QUERY: a Query ('Q'), Parse ('P') or Bind ('B') message of a flagged
 * client, read whole, not yet sent anywhere.
 */
static int hello_query(lk_plugin *self, lk_event *ev)
{
	static const char *const names[] = { "hello" };
	static const uint32_t types[] = { LK_TYPE_TEXT };
	struct hello *h = api->get_data(self);
	lk_client *c = api->ev_client(ev);
	struct hello_client *hc;
	lk_result *res;

	if (api->query_type(ev) != 'Q' || !is_select_hello(api->query_sql(ev)))
		return LK_CONTINUE;	/* not ours: it goes to PostgreSQL unchanged */

	/* The client's slot is NULL until we set it; CLIENT_CLOSE frees it. */
	hc = api->client_ctx(self, c);
	if (hc == NULL) {
		hc = calloc(1, sizeof *hc);
		if (hc == NULL)
			return api->fail(ev, "53200", "out of memory");
		api->client_set_ctx(self, c, hc);
	}

	/* Answer it: a RowDescription and one DataRow. We leave out
	 * result_complete(), so the core ends with CommandComplete "SELECT 1"
	 * and ReadyForQuery. */
	res = api->query_result(ev);
	api->result_columns(res, 1, names, types);
	api->result_row(res, (const char *const[]){ h->greeting });
	hc->answered++;
	h->answered++;
	return LK_HANDLED;
}

/* CLIENT_CLOSE: an observer; the last moment the client handle is valid. */
static int hello_client_close(lk_plugin *self, lk_event *ev)
{
	lk_client *c = api->ev_client(ev);
	struct hello_client *hc = api->client_ctx(self, c);

	if (hc != NULL) {
		api->log(self, LK_LOG_DEBUG, "client %" PRIu64 ": answered %" PRIu64 " queries",
			 api->client_id(c), hc->answered);
		free(hc);
		api->client_set_ctx(self, c, NULL);
	}
	return LK_CONTINUE;
}

/* The console command SHOW HELLO; `args` is what follows it ("" here). */
static int hello_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "greeting", "answered", "refused", "watched_clients" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8 };
	struct hello *h = api->get_data(self);
	char answered[24], refused[24], watched[24];

	if (args[0] != '\0')
		return api->result_error(res, "42601", "SHOW HELLO takes no arguments");
	snprintf(answered, sizeof answered, "%" PRIu64, h->answered);
	snprintf(refused, sizeof refused, "%" PRIu64, h->refused);
	snprintf(watched, sizeof watched, "%" PRIu64, h->watched);
	api->result_columns(res, 4, names, types);
	api->result_row(res, (const char *const[]){ h->greeting, answered, refused, watched });
	return LK_HANDLED;	/* the core adds CommandComplete "SHOW" */
}

/*
 * init: called once, at start, before the configuration's [plugin.hello]
 * section is checked. Declare the settings, register hooks and commands.
 * Returning non-zero stops lokadb with the text given to init_error().
 */
static int hello_init(lk_plugin *self, const lk_api *core)
{
	struct hello *h;

	api = core;
	h = calloc(1, sizeof *h);
	if (h == NULL) {
		api->init_error(self, "out of memory");
		return -1;
	}
	api->set_data(self, h);

	if (api->config_declare(self, "greeting", "hello, world",
				"text that SELECT 'hello' returns") != 0 ||
	    api->config_declare(self, "deny_users", NULL,
				"users refused at login (comma or space separated)") != 0 ||
	    api->config_declare(self, "watch_app", "psql",
				"application_name of the clients whose queries are looked at") != 0 ||
	    api->hook(self, LK_HOOK_CONFIG_CHECK, hello_config_check, 0) != 0 ||
	    api->hook(self, LK_HOOK_CONFIG_APPLY, hello_config_apply, 0) != 0 ||
	    api->hook(self, LK_HOOK_CLIENT_STARTUP, hello_client_startup, 0) != 0 ||
	    api->hook(self, LK_HOOK_QUERY, hello_query, 0) != 0 ||
	    api->hook(self, LK_HOOK_CLIENT_CLOSE, hello_client_close, 0) != 0 ||
	    api->console_register(self, "SHOW HELLO", 0, hello_show,
				  "the hello plugin's greeting and counters") != 0) {
		api->init_error(self, "could not register settings, hooks or SHOW HELLO");
		return -1;
	}
	return 0;
}

/* fini: at exit. Clients are gone; free what init and the hooks allocated. */
static void hello_fini(lk_plugin *self)
{
	struct hello *h = api->get_data(self);

	if (h != NULL) {
		free(h->greeting);
		free(h->deny_users);
		free(h->watch_app);
		free(h);
	}
}

/* The one exported symbol: lokadb_plugin(), returning the descriptor. No ';' after it. */
LK_PLUGIN("hello", "1.0", hello_init, hello_fini)
