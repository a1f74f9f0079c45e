/* SPDX-License-Identifier: ISC */
/*
 * t_abi_minor -- refusal test: built for a newer minor of the plugin ABI
 * (LK_ABI_MINOR + 1) than the core has. lokadb must refuse: "plugin
 * t_abi_minor: built for plugin ABI 1.1, this lokadb has ABI 1.0".
 */
#include <lokadb/plugin.h>

static int t_init(lk_plugin *self, const lk_api *api)
{
	api->init_error(self, "init of a newer-minor plugin ran");
	return -1;
}

LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void);
LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void)
{
	static const struct lk_plugin_desc desc = {
		LK_PLUGIN_MAGIC, LK_ABI_MAJOR, LK_ABI_MINOR + 1, (uint32_t)sizeof(struct lk_plugin_desc),
		"t_abi_minor", "1.0", t_init, NULL
	};
	return &desc;
}
