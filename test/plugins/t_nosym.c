/* SPDX-License-Identifier: ISC */
/*
 * t_nosym -- refusal test: a shared object without an exported
 * lokadb_plugin symbol (the function exists but has hidden visibility, as
 * every symbol of a plugin built with -fvisibility=hidden that forgets
 * LK_EXPORT). lokadb must refuse: "plugin t_nosym: no lokadb_plugin()
 * symbol (not a LokaDB plugin)".
 */
#include <lokadb/plugin.h>

const struct lk_plugin_desc *lokadb_plugin(void);
const struct lk_plugin_desc *lokadb_plugin(void)
{
	return NULL;
}

/* Something exported, so the object is not empty. */
LK_EXPORT int t_nosym_marker(void);
LK_EXPORT int t_nosym_marker(void)
{
	return 1;
}
