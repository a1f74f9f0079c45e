/* SPDX-License-Identifier: ISC */
/*
 * t_wrongname -- refusal test: loaded as t_wrongname, but the descriptor
 * calls itself "t_other". lokadb must refuse: "plugin t_wrongname:
 * descriptor names it "t_other", not "t_wrongname"".
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	api->init_error(self, "init of a misnamed plugin ran");
	return -1;
}

LK_PLUGIN("t_other", "1.0", t_init, NULL)
