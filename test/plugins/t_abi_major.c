/* SPDX-License-Identifier: ISC */
/*
 * t_abi_major -- refusal test: built for plugin ABI 2.0 (another major).
 * lokadb must refuse: "plugin t_abi_major: built for plugin ABI 2.0, this
 * lokadb has ABI 1.0". init must never run.
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	api->init_error(self, "init of an ABI 2 plugin ran");
	return -1;
}

LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void);
LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void)
{
	static const struct lk_plugin_desc desc = {
		LK_PLUGIN_MAGIC, LK_ABI_MAJOR + 1, 0, (uint32_t)sizeof(struct lk_plugin_desc),
		"t_abi_major", "1.0", t_init, NULL
	};
	return &desc;
}
