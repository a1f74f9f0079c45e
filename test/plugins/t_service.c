/* SPDX-License-Identifier: ISC */
/*
 * t_service -- test plugin: services between plugins, hook priorities and
 * registration refusals.
 *
 *   - publishes the table "t_service.v1" (t_service.h); t_hooks looks it up
 *     and shows service_answer = 42 in SHOW T_HOOKS;
 *   - publishes the same name a second time (must return -1);
 *   - tries to register a console command under a core name, "SHOW POOLS"
 *     (must return -1), and a hook with an unknown number (must return -1);
 *   - registers QUERY at priority -10: a statement equal to its `answer`
 *     setting is answered with one row "t_service" (so with t_hooks, which
 *     registers at priority 0 and is listed first in plugins =, the lower
 *     priority must still run first);
 *   - SHOW T_SERVICE: (key, value int8) with the return codes above.
 */
#include <lokadb/plugin.h>

#include <stdio.h>
#include <string.h>

#include "t_service.h"

static const lk_api *api;
static long bumps;
static long long dup_publish_rc = 99, core_name_rc = 99, bad_hook_rc = 99, queries_seen;

static long svc_answer(void)
{
	return 42;
}

static long svc_bump(void)
{
	return ++bumps;
}

static const struct t_service_v1 table = { 1, svc_answer, svc_bump };

static int on_query(lk_plugin *self, lk_event *ev)
{
	const char *sql = api->query_sql(ev);
	const char *answer = api->setting(self, "answer");

	queries_seen++;
	if (api->query_type(ev) == 'Q' && sql && answer && *answer && strcmp(sql, answer) == 0) {
		static const char *const names[] = { "answer" };
		static const char *const row[] = { "t_service" };
		lk_result *res = api->query_result(ev);

		api->result_columns(res, 1, names, NULL);
		api->result_row(res, row);
		api->result_complete(res, "SELECT 1");
		return LK_HANDLED;
	}
	return LK_CONTINUE;
}

static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "key", "value" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8 };
	const struct {
		const char *k;
		long long v;
	} rows[] = {
		{ "dup_publish_rc", dup_publish_rc },
		{ "core_name_register_rc", core_name_rc },
		{ "bad_hook_rc", bad_hook_rc },
		{ "lookup_self_ok", api->service_lookup(T_SERVICE_NAME) == &table },
		{ "lookup_missing_is_null", api->service_lookup("t_service.nope") == NULL },
		{ "queries_seen", queries_seen },
	};
	char buf[32];
	const char *row[2] = { NULL, buf };
	size_t i;

	(void)self;
	(void)args;
	api->result_columns(res, 2, names, types);
	for (i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		row[0] = rows[i].k;
		snprintf(buf, sizeof(buf), "%lld", rows[i].v);
		api->result_row(res, row);
	}
	return LK_HANDLED;
}

static int t_init(lk_plugin *self, const lk_api *a)
{
	api = a;
	if (a->service_publish(self, T_SERVICE_NAME, &table) != 0) {
		a->init_error(self, "service_publish(%s) failed", T_SERVICE_NAME);
		return -1;
	}
	dup_publish_rc = a->service_publish(self, T_SERVICE_NAME, &table);
	core_name_rc = a->console_register(self, "SHOW POOLS", 0, cmd_show, "must be refused");
	bad_hook_rc = a->hook(self, (enum lk_hook)LK_HOOK_COUNT, on_query, 0);
	if (a->config_declare(self, "answer", "", "QUERY answers this statement at priority -10") != 0 ||
	    a->hook(self, LK_HOOK_QUERY, on_query, -10) != 0 ||
	    a->console_register(self, "SHOW T_SERVICE", 0, cmd_show, "t_service return codes") != 0) {
		a->init_error(self, "registration failed");
		return -1;
	}
	return 0;
}

LK_PLUGIN("t_service", "0.9", t_init, NULL)
