/* SPDX-License-Identifier: ISC */
/*
 * resulttables.h -- the relations a RowDescription names, as the client's
 * text would have named them (plugin ABI 1.13, api->tables_new and
 * api->query_result_tables).
 *
 * A plugin that addresses a statement to a table's partition makes
 * PostgreSQL describe its result columns as the partition's (table OID and
 * column number, the fields JDBC's getBaseTableName, Npgsql's
 * GetColumnSchema and editable result grids read). The plugin gives the
 * core a set of (partition, table) pairs; the core keeps a reference with
 * the statement (a Query's reply-queue item, a client's statement or
 * portal name for its later Describes) and rewrites each RowDescription in
 * place: same length, only those fields.
 */
#ifndef LOKADB_RESULTTABLES_H
#define LOKADB_RESULTTABLES_H

#include <stdbool.h>
#include <stdint.h>

#include <lokadb/plugin.h>

/* NULL: out of memory, or an attnums text that is not "n:m,..." pairs. */
struct lk_tables *rt_tables_new(const lk_table_oid *t, int n);
struct lk_tables *rt_tables_ref(struct lk_tables *t);	/* accepts NULL */
void rt_tables_release(struct lk_tables *t);		/* accepts NULL */

/* A RowDescription's body (len bytes) in place. false: malformed (cut short). */
bool rt_fix_row_description(const struct lk_tables *t, uint8_t *body, uint32_t len);

/*
 * A client's statement ('S') and portal ('P') names that have tables: the
 * most recent RT_NAMES_MAX (a name Parsed again or Closed is forgotten; a
 * driver that drops its statements with SQL DEALLOCATE, as psycopg does,
 * sends no Close, so the oldest go first).
 */
#define RT_NAMES_MAX 64
struct rt_names {
	struct rt_name {
		char kind;
		char *name;
		struct lk_tables *t;
	} *v;
	uint32_t n, cap;
};

/* name's tables become t (a reference is taken; NULL: none). false: out of memory (none). */
bool rt_names_set(struct rt_names *r, char kind, const char *name, struct lk_tables *t);
struct lk_tables *rt_names_get(const struct rt_names *r, char kind, const char *name);
void rt_names_free(struct rt_names *r);

#endif
