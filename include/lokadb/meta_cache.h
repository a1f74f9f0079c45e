/* SPDX-License-Identifier: ISC */
/*
 * lokadb/meta_cache.h -- the service the meta_cache plugin publishes
 * (api->service_publish(self, META_CACHE_SERVICE, &table)) and other plugins
 * (org_routing, fdw_direct, move) look up with api->service_lookup().
 *
 * It is a read-only view of the LokaDB catalog of the cloud database
 * (schema lokadb, plugins/move/catalog.sql), kept current by LISTEN
 * lokadb_meta. Everything returned points into the cache and stays valid
 * until the next return to the event loop (a reload of the catalog replaces
 * it); copy what must live longer. All lookups are O(1) or O(log n) and
 * never block.
 *
 * Versioning: append-only like the core's API table; test
 * `svc->size >= offsetof(struct meta_cache_api, field) + sizeof(svc->field)`
 * before using a field added after version 1.
 */
#ifndef LOKADB_META_CACHE_H
#define LOKADB_META_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define META_CACHE_SERVICE "meta_cache.v1"

struct mc_table {
	const char *schema;		/* e.g. "public" */
	const char *name;		/* e.g. "documents" */
	const char *org_column;		/* e.g. "organization_id" */
	const char *org_type;		/* format_type() of that column, e.g. "bigint" */
	const char *default_part;	/* the DEFAULT partition's name (same schema) */
	/* appended: read only with a publisher whose size covers table_guard */
	const char *guard;		/* what its parent has that a partition's statement bypasses:
					 * 'r' row-level security (every statement); 'i', 'u', 'd'
					 * a rule or statement-level trigger for INSERT, UPDATE,
					 * DELETE; NULL nothing (lokadb.table_guard()) */
};

struct mc_org {
	const char *id;			/* as text, e.g. "42" */
	const char *name;
	const char *state;		/* "cloud", "isolating", "moving", "moved" */
	const char *site;		/* NULL while in the cloud */
	const char *profile;		/* "fdw" or "fdw+direct" */
	int isolated;			/* 1: has its own container in every LokaDB table */
	int paused;			/* 1: its writes are held at the proxy */
};

typedef void (*mc_change_fn)(void *arg, uint64_t version);

struct meta_cache_api {
	uint32_t size;			/* sizeof(struct meta_cache_api) of the publisher */

	/* 1 once a catalog has been loaded (possibly stale, see stale()). */
	int (*ready)(void);
	/* 1 while the cloud database is unreachable and the last good catalog is served. */
	int (*stale)(void);
	/* The catalog version loaded (lokadb.meta 'version'). */
	uint64_t (*version)(void);

	/* A LokaDB table by schema and name (exact, case-sensitive as stored), or NULL. */
	const struct mc_table *(*table)(const char *schema, const char *name);
	/* An unqualified name resolved along a search_path value as PostgreSQL
	 * would ("$user" expands to `user`; pg_catalog and pg_temp are skipped),
	 * or NULL when no LokaDB table of that name comes first on the path. */
	const struct mc_table *(*table_search)(const char *name, const char *search_path, const char *user);
	/* An organization by id (text form), or NULL. */
	const struct mc_org *(*org)(const char *id);
	/* The leaf partition (same schema as the table) holding `org_id`'s rows
	 * of table schema.name when the organization is isolated, else NULL. */
	const char *(*leaf)(const char *schema, const char *name, const char *org_id);
	/* Number of LokaDB tables (0: routing has nothing to do). */
	int (*n_tables)(void);

	/* Call fn after every catalog change is loaded: a load whose content
	 * differs, also when version() stays the same (rows edited with the
	 * triggers off, or a relation created that hides a LokaDB table on a
	 * search_path). Key caches on this, not on version(). Returns 0 or -1. */
	int (*on_change)(mc_change_fn fn, void *arg);

	/* ---- appended after version 1: test svc->size before use ----
	 *
	 * How fresh the cache is (plugins/meta_cache/README.md, "Freshness"):
	 * a change committed in the cloud database reaches this proxy as a
	 * NOTIFY, typically within a millisecond. From the moment it has
	 * arrived, reloading() is 1 until the reload is done, and a plugin
	 * that holds its statements with wait() runs none of them with the
	 * catalog it knows to be old. */

	/* 1 while a change announced to this proxy (NOTIFY lokadb_meta, a
	 * freshness check that found another version, META_CACHE RELOAD) is
	 * not loaded yet. 0 while stale(): the last good catalog is all there is. */
	int (*reloading)(void);
	/* Hold until no reload is due. Returns 1 when none is (fn is not
	 * called), 0 when fn(arg, version) will be called later from the loop,
	 * once the reload is done or has failed (check stale()), -1 when out of
	 * memory. A QUERY hook holds a statement with
	 *     if (mc->wait(resume_fn, client) == 0) return LK_ASYNC;
	 * and calls wait_cancel(resume_fn, client) in CLIENT_CLOSE. */
	int (*wait)(mc_change_fn fn, void *arg);
	/* Forget every wait() or refresh() of (fn, arg) not called back yet. */
	void (*wait_cancel)(mc_change_fn fn, void *arg);
	/* Check the version in the cloud database now (one round trip), reload
	 * if it differs, then call fn(arg, version) from the loop: whatever was
	 * committed before the call is in the catalog when fn runs (unless
	 * stale()). For a plugin that changes the catalog itself (move), so that
	 * its command answers only once this proxy serves the change.
	 * Returns 0 when fn will be called, 1 when the cloud database is
	 * unavailable now (fn is not called; stale() is 1), -1 when out of memory. */
	int (*refresh)(mc_change_fn fn, void *arg);

	/* ---- appended later: test svc->size before use ---- */
	/* Partitions of isolated organizations in the catalog (rows of
	 * lokadb.partitions: one per organization and LokaDB table); 0 before
	 * a catalog is loaded. */
	int (*n_partitions)(void);
	/* ---- appended later: test svc->size before use ---- */
	/* mc_table.guard of t: letters of "riud", or NULL (see there). */
	const char *(*table_guard)(const struct mc_table *t);
	/* ---- appended later: test svc->size before use ---- */
	/* Every isolated organization's leaf partition as its LokaDB table
	 * (their OIDs, and column numbers where they differ), for the core's
	 * api->query_result_tables (ABI 1.13): a statement addressed to a leaf
	 * describes its result columns as the table's. NULL: none, or a core
	 * without it. Valid until the next return to the loop. */
	struct lk_tables *(*result_tables)(void);
	/* ---- appended later: test svc->size before use ---- */
	/* 1 when code in the cloud database may read settings (functions,
	 * views, rules, policies, defaults, constraints or trigger conditions
	 * that call current_setting() or read pg_settings or SHOW, or name
	 * lokadb.org: plugins/meta_cache/README.md, "Setting readers"), and
	 * before a catalog is loaded; 0 when none does. */
	int (*setting_readers)(void);
};

#endif
