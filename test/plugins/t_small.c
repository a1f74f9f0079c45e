/* SPDX-License-Identifier: ISC */
/*
 * t_small -- refusal test: the descriptor's size field says 12 bytes (just
 * magic, ABI and size). lokadb must refuse: "plugin t_small: descriptor too
 * small (12 bytes)".
 */
#include <lokadb/plugin.h>

LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void);
LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void)
{
	static const struct lk_plugin_desc desc = {
		LK_PLUGIN_MAGIC, LK_ABI_MAJOR, LK_ABI_MINOR, 12, "t_small", "1.0", NULL, NULL
	};
	return &desc;
}
