/* SPDX-License-Identifier: ISC */
/*
 * t_noop -- a test plugin that does nothing, for the "plugin overhead"
 * benchmark (bench/run.py) and for tests that need a plugin to be loaded.
 *
 * It registers only connection-level hooks, CLIENT_STARTUP and CLIENT_CLOSE,
 * and both return LK_CONTINUE. It registers no per-statement or
 * per-transaction hook (QUERY, ROUTE, TXN_END) and flags no client for
 * QUERY, so once a client is logged in the core never calls into it: the
 * benchmark compares lokadb with this plugin loaded against lokadb with
 * `plugins =` empty to show that this costs nothing measurable.
 */
#include <lokadb/plugin.h>

static int noop_client_startup(lk_plugin *self, lk_event *ev)
{
	(void)self;
	(void)ev;
	return LK_CONTINUE;
}

static int noop_client_close(lk_plugin *self, lk_event *ev)
{
	(void)self;
	(void)ev;
	return LK_CONTINUE;
}

static int noop_init(lk_plugin *self, const lk_api *api)
{
	if (api->hook(self, LK_HOOK_CLIENT_STARTUP, noop_client_startup, 0) != 0 ||
	    api->hook(self, LK_HOOK_CLIENT_CLOSE, noop_client_close, 0) != 0) {
		api->init_error(self, "could not register hooks");
		return -1;
	}
	return 0;
}

LK_PLUGIN("t_noop", "1.0", noop_init, NULL)
