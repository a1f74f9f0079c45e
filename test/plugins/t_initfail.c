/* SPDX-License-Identifier: ISC */
/*
 * t_initfail -- refusal test: init() reports a reason with api->init_error()
 * and returns -1. lokadb must refuse: "plugin t_initfail: init failed:
 * t_initfail says no (code 7)".
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	api->init_error(self, "t_initfail says no (code %d)", 7);
	return -1;
}

LK_PLUGIN("t_initfail", "1.0", t_init, NULL)
