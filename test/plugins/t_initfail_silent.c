/* SPDX-License-Identifier: ISC */
/*
 * t_initfail_silent -- refusal test: init() returns -1 without calling
 * api->init_error(). lokadb must refuse: "plugin t_initfail_silent: init
 * failed: no reason given".
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	(void)self;
	(void)api;
	return -1;
}

LK_PLUGIN("t_initfail_silent", "1.0", t_init, NULL)
