/* SPDX-License-Identifier: ISC */
/*
 * t_badmagic -- refusal test: a descriptor written by hand with a wrong
 * magic number. lokadb must refuse to start: "plugin t_badmagic: bad magic
 * 0x... (not a LokaDB plugin)". init must never run.
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	api->init_error(self, "init of a plugin with a bad magic ran");
	return -1;
}

LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void);
LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void)
{
	static const struct lk_plugin_desc desc = {
		0x12345678u, LK_ABI_MAJOR, LK_ABI_MINOR, (uint32_t)sizeof(struct lk_plugin_desc),
		"t_badmagic", "1.0", t_init, NULL
	};
	return &desc;
}
