/* SPDX-License-Identifier: ISC */
/*
 * t_vars -- query_set_var / query_on_vars / query_vars_inline from a
 * statement's leading comment, for test_plugin_vars.py.
 *
 * A Query, Parse or Bind whose text starts with `/\*vars ITEM|ITEM|...*\/`
 * asks for each ITEM:
 *   inline        query_vars_inline()
 *   name          query_set_var(name, NULL): the statement changes it
 *   name=value    query_set_var(name, value); value `@qN` is N quotes,
 *                 `@aN` N letters a, `@u` a non-ASCII "\xc3\xa9"
 * and query_on_vars(). A refused query_set_var fails the message (22023,
 * "t_vars: query_set_var refused <name>"). SHOW T_VARS: the last outcome
 * and `sent` given to query_on_vars, and how many calls.
 */
#include <lokadb/plugin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const lk_api *api;
static int last_outcome = -9;
static unsigned last_sent;
static long calls;

static int on_startup(lk_plugin *self, lk_event *ev)
{
	(void)self;
	api->client_watch_queries(api->ev_client(ev), 1);
	return LK_CONTINUE;
}

static void on_vars(lk_plugin *self, lk_client *c, int outcome, unsigned sent, void *arg)
{
	(void)self;
	(void)c;
	(void)arg;
	last_outcome = outcome;
	last_sent = sent;
	calls++;
}

/* One ITEM (item[0..n)); LK_CONTINUE or LK_ERROR. */
static int one_item(lk_plugin *self, lk_event *ev, const char *item, size_t n)
{
	char name[128], value[1024];
	const char *eq = memchr(item, '=', n);
	size_t nl = eq ? (size_t)(eq - item) : n;
	int rc;

	if (n == 6 && memcmp(item, "inline", 6) == 0)
		return api->query_vars_inline(ev) == 0 ? LK_CONTINUE :
		       api->fail(ev, "22023", "t_vars: query_vars_inline refused");
	if (nl >= sizeof(name))
		nl = sizeof(name) - 1;
	memcpy(name, item, nl);
	name[nl] = 0;
	if (eq) {
		const char *v = eq + 1;
		size_t vl = n - nl - 1;
		if (vl >= 2 && v[0] == '@' && (v[1] == 'q' || v[1] == 'a')) {
			int k = atoi(v + 2);
			if (k < 0 || k >= (int)sizeof(value))
				k = 0;
			memset(value, v[1] == 'q' ? '\'' : 'a', (size_t)k);
			value[k] = 0;
		} else if (vl == 2 && v[0] == '@' && v[1] == 'u') {
			strcpy(value, "\xc3\xa9");
		} else {
			if (vl >= sizeof(value))
				vl = sizeof(value) - 1;
			memcpy(value, v, vl);
			value[vl] = 0;
		}
		rc = api->query_set_var(ev, name, value);
	} else {
		rc = api->query_set_var(ev, name, NULL);
	}
	if (rc < 0)
		return api->fail(ev, "22023", "t_vars: query_set_var refused %s", name);
	return api->query_on_vars(self, ev, on_vars, NULL) == 0 ? LK_CONTINUE :
	       api->fail(ev, "22023", "t_vars: query_on_vars refused");
}

static int on_query(lk_plugin *self, lk_event *ev)
{
	const char *sql = api->query_sql(ev), *end, *p;

	if (!sql || strncmp(sql, "/*vars ", 7) != 0 || !(end = strstr(sql, "*/")))
		return LK_CONTINUE;
	for (p = sql + 7; p < end;) {
		const char *bar = memchr(p, '|', (size_t)(end - p));
		const char *stop = bar ? bar : end;
		size_t n = (size_t)(stop - p);
		while (n && p[n - 1] == ' ')
			n--;
		if (n && one_item(self, ev, p, n) != LK_CONTINUE)
			return LK_ERROR;
		p = stop + 1;
	}
	return LK_CONTINUE;
}

static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "outcome", "sent", "calls" };
	static const uint32_t types[] = { LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8 };
	char a[32], b[32], c[32];
	const char *row[3] = { a, b, c };

	(void)self;
	(void)args;
	snprintf(a, sizeof(a), "%d", last_outcome);
	snprintf(b, sizeof(b), "%u", last_sent);
	snprintf(c, sizeof(c), "%ld", calls);
	api->result_columns(res, 3, names, types);
	api->result_row(res, row);
	return LK_HANDLED;
}

static int t_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	if (!LK_API_HAS(a, query_vars_inline)) {
		a->init_error(self, "needs ABI 1.7");
		return -1;
	}
	if (a->hook(self, LK_HOOK_CLIENT_STARTUP, on_startup, 0) != 0 ||
	    a->hook(self, LK_HOOK_QUERY, on_query, 0) != 0 ||
	    a->console_register(self, "SHOW T_VARS", 0, cmd_show, "t_vars: the last query_on_vars") != 0) {
		a->init_error(self, "could not register");
		return -1;
	}
	return 0;
}

LK_PLUGIN("t_vars", "1.0", t_init, NULL)
