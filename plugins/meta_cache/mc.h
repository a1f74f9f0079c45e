/* SPDX-License-Identifier: ISC */
/*
 * mc.h -- internal interface between the two files of the meta_cache plugin:
 *
 *   catalog.c     one loaded catalog (struct mc_cat): built from the result
 *                 of MC_LOAD_SQL, immutable afterwards, freed as a whole;
 *                 hash lookups and the search_path walk.
 *   meta_cache.c  the plugin: settings, the connection to the cloud
 *                 database, the queue of catalog queries, held logins and
 *                 statements, the console commands and the service table.
 *
 * Nothing here is visible outside the .so (-fvisibility=hidden).
 */
#ifndef LOKADB_MC_H
#define LOKADB_MC_H

#include <lokadb/meta_cache.h>

#include <stddef.h>
#include <stdint.h>

struct pg_result;

/*
 * The whole catalog in one statement (one snapshot, one round trip). Every
 * row is (kind, a, b, c, d, e, f, g), all text:
 *   v  version, oid of lokadb.meta             (exactly one row)
 *   t  schema, table, org_column, org_type, default_part
 *   o  id, name, state, site, profile, isolated, paused
 *   p  schema, table, org_id, container, leaf
 *   r  oid of a LokaDB table's leaf partition (under a container), oid of
 *      the table, attnums ("leaf:table,..." the column numbers that differ,
 *      or NULL; looked for only in a table with dropped columns, for a leaf
 *      with another relnatts: a leaf made after a DROP COLUMN numbers the
 *      columns after it one less)
 *   s  schema, name: any relation named like a LokaDB table (search_path shadows)
 * A missing schema or table fails it with 3F000 / 42P01: "not installed".
 */
/*
 * What a LokaDB table's parent has that a statement on its partitions would
 * bypass (mc_table.guard), for the lokadb.tables row `t`: catalog.sql's
 * lokadb.table_guard(), written out so that a catalog of an older INSTALL
 * still loads. MC_GUARD_BASE: row-level security, rules, statement-level
 * triggers ('r', 'i', 'u', 'd'), NULL for none; MC_GUARD_EXPR adds 'a' when
 * an organization's leaf has other privileges or another owner than the
 * parent (a GRANT or REVOKE on the parent after ISOLATE ORG does not reach
 * its partitions, and PostgreSQL checks a leaf's own).
 */
#define MC_GUARD_BASE                                                                            \
	"(SELECT nullif(CASE WHEN c.relrowsecurity"                                              \
	" THEN 'r' ELSE '' END || CASE WHEN bool_or(e.ev IN (4, 51)) THEN 'i' ELSE '' END"      \
	" || CASE WHEN bool_or(e.ev IN (16, 50)) THEN 'u' ELSE '' END"                          \
	" || CASE WHEN bool_or(e.ev IN (8, 52)) THEN 'd' ELSE '' END, '')"                      \
	" FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"   \
	" LEFT JOIN LATERAL (SELECT g.tgtype & b AS ev FROM pg_catalog.pg_trigger g,"            \
	" unnest(ARRAY[4, 8, 16]) b WHERE g.tgrelid = c.oid AND NOT g.tgisinternal"             \
	" AND (g.tgtype & 1) = 0 AND g.tgenabled <> 'D' UNION ALL SELECT ascii(r.ev_type)"       \
	" FROM pg_catalog.pg_rewrite r WHERE r.ev_class = c.oid AND r.ev_type IN ('2', '3', '4')" \
	" AND r.ev_enabled <> 'D') e ON true"                                                    \
	" WHERE n.nspname = t.schema_name AND c.relname = t.table_name"                          \
	" GROUP BY c.relrowsecurity)"

/* The privileges of the pg_class row `r` (a macro argument: an alias) as one
 * text: owner, table privileges whoever granted them, column privileges. */
#define MC_PRIVS(r)                                                                              \
	"(" r ".relowner::text || ';' || (SELECT coalesce(string_agg(DISTINCT x, ',' ORDER BY x), '') FROM"  \
	" (SELECT e.grantee::text || ':' || e.privilege_type || ':' || e.is_grantable::text AS x" \
	" FROM pg_catalog.aclexplode(coalesce(" r ".relacl,"                                       \
	" pg_catalog.acldefault('r'::\"char\", " r ".relowner))) e UNION ALL"                      \
	" SELECT a.attname::text || '/' || e.grantee::text || ':' || e.privilege_type || ':'"   \
	" || e.is_grantable::text FROM pg_catalog.pg_attribute a, pg_catalog.aclexplode(a.attacl) e" \
	" WHERE a.attrelid = " r ".oid AND a.attnum > 0 AND NOT a.attisdropped"                   \
	" AND a.attacl IS NOT NULL) s))"

/* A relation's column ACLs as stored, by name (catalog.sql's
 * lokadb.column_acls(), written out: a proxy newer than its catalog). */
#define MC_COLACLS(r)                                                                            \
	"(SELECT pg_catalog.string_agg(pg_catalog.format('%I=%s', a.attname, a.attacl), ','"     \
	" ORDER BY a.attname) FROM pg_catalog.pg_attribute a WHERE a.attrelid = " r ".oid"        \
	" AND a.attnum > 0 AND NOT a.attisdropped AND a.attacl IS NOT NULL)"

/* (one hashed pass over every partition for the whole load: correlated to
 * each table, the name lookups cost 10 us per partition; a leaf's column
 * privileges are compared when its parent has some: ISOLATE ORG and the
 * event trigger give a leaf only its parent's; MC_PRIVS only where owner,
 * ACL or column ACLs differ as stored, in a CASE, which the planner does
 * not reorder) */
#define MC_GUARD_PRIVS                                                                           \
	"(SELECT 'a' WHERE (t.schema_name, t.table_name) IN (SELECT p.schema_name, p.table_name" \
	" FROM lokadb.partitions p JOIN pg_catalog.pg_namespace n ON n.nspname = p.schema_name"  \
	" JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = p.table_name"     \
	" JOIN pg_catalog.pg_class l ON l.relnamespace = n.oid AND l.relname = p.leaf"           \
	" WHERE CASE WHEN l.relowner <> c.relowner OR l.relacl IS DISTINCT FROM c.relacl OR c.oid IN" \
	" (SELECT a.attrelid FROM lokadb.tables t2 JOIN pg_catalog.pg_namespace n2"              \
	" ON n2.nspname = t2.schema_name JOIN pg_catalog.pg_class c2 ON c2.relnamespace = n2.oid" \
	" AND c2.relname = t2.table_name JOIN pg_catalog.pg_attribute a ON a.attrelid = c2.oid"  \
	" AND a.attnum > 0 WHERE a.attacl IS NOT NULL) AND " MC_COLACLS("l") " IS DISTINCT FROM "  \
	MC_COLACLS("c") " THEN " MC_PRIVS("l") " <> " MC_PRIVS("c")                                  \
	" ELSE false END))"

#define MC_GUARD_EXPR "nullif(coalesce(" MC_GUARD_BASE ", '') || coalesce(" MC_GUARD_PRIVS ", ''), '')"

/*
 * Every table's guard in one text, "schema.table:letters:privileges,...":
 * part of what the freshness check compares, since DDL sends no NOTIFY
 * where INSTALL could not create the event trigger lokadb_guards (not a
 * superuser). The parents' privileges are in it (a GRANT on a parent then
 * reloads the catalog, whose LOAD compares the leaves'), not the leaves':
 * the check stays one row per table.
 */
#define MC_GUARDS_SQL                                                                            \
	"(SELECT coalesce(string_agg(pg_catalog.format('%I.%I:%s:%s', t.schema_name, t.table_name," \
	" x.g, x.p), ',' ORDER BY t.schema_name, t.table_name), '') FROM lokadb.tables t,"       \
	" LATERAL (SELECT " MC_GUARD_BASE " AS g, (SELECT " MC_PRIVS("c")                          \
	" FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"   \
	" WHERE n.nspname = t.schema_name AND c.relname = t.table_name) AS p) x)"

/*
 * Does code in the cloud database read settings, so that the server's
 * lokadb.org may be read there ("t" or "f")? Any function (but those of
 * schema lokadb and of the C and internal languages) whose text names
 * current_setting, pg_settings, SHOW or lokadb.org; any view, rule, policy or
 * trigger condition, and any column default or CHECK constraint of a LokaDB
 * table or of a domain, that calls current_setting() or pg_show_all_settings()
 * or reads pg_settings. Objects of initdb's (OID below 16384) are not looked
 * at, nor the defaults and constraints of partitions (copies of their
 * table's): with thousands of partitions this stays a few index scans.
 * org_routing's server_org = auto sets each statement's organization on its
 * server only when there is such code (catalog.sql's lokadb.setting_readers(),
 * written out: a proxy newer than its catalog).
 */
#define MC_READERS_SQL                                                                           \
	"(SELECT EXISTS (SELECT FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n"        \
	" ON n.oid = p.pronamespace WHERE p.oid >= 16384 AND n.nspname <> 'lokadb'"              \
	" AND p.prolang NOT IN (12, 13) AND (p.prosrc ~* '(current_setting|_settings|lokadb[.]org|\\mshow\\M)'" \
	" OR p.prosqlbody::text ~ x.r) UNION ALL SELECT FROM pg_catalog.pg_rewrite"              \
	" WHERE oid >= 16384 AND (ev_action::text ~ x.r OR ev_qual::text ~ x.r)"                 \
	" UNION ALL SELECT FROM pg_catalog.pg_policy WHERE polqual::text ~ x.r"                  \
	" OR polwithcheck::text ~ x.r UNION ALL SELECT FROM pg_catalog.pg_trigger"                \
	" WHERE tgparentid = 0 AND tgqual::text ~ x.r UNION ALL SELECT FROM pg_catalog.pg_attrdef" \
	" WHERE adrelid = ANY (x.t) AND adbin::text ~ x.r UNION ALL SELECT FROM"                   \
	" pg_catalog.pg_constraint WHERE (conrelid = ANY (x.t) OR (conrelid = 0 AND oid >= 16384))" \
	" AND conbin::text ~ x.r)::text FROM (SELECT ':funcid (2077|3294|2084) |:relid '"         \
	" || 'pg_catalog.pg_settings'::regclass::oid || ' ' AS r, ARRAY(SELECT"                   \
	" pg_catalog.to_regclass(pg_catalog.format('%I.%I', schema_name, table_name))::oid"      \
	" FROM lokadb.tables) AS t) x)"

#define MC_LOAD_SQL                                                                              \
	"SELECT 'v'::text, (SELECT value FROM lokadb.meta WHERE key = 'version'),"               \
	" 'lokadb.meta'::regclass::oid::text, " MC_GUARDS_SQL ", " MC_READERS_SQL ", NULL::text,"  \
	" NULL::text, NULL::text"                                                                \
	" UNION ALL SELECT 't', t.schema_name::text, t.table_name::text, t.org_column::text,"    \
	" t.org_type::text, t.default_part::text, " MC_GUARD_EXPR ", NULL FROM lokadb.tables t" \
	" UNION ALL SELECT 'o', id::text, name::text, state::text, site::text, profile::text,"   \
	" isolated::text, paused::text FROM lokadb.orgs"                                         \
	" UNION ALL SELECT 'p', schema_name::text, table_name::text, org_id::text,"              \
	" container::text, leaf::text, NULL, NULL FROM lokadb.partitions"                        \
	" UNION ALL SELECT 'r', i2.inhrelid::text, c.oid::text, CASE WHEN c.dropped AND"         \
	" (SELECT l.relnatts FROM pg_catalog.pg_class l WHERE l.oid = i2.inhrelid) <> c.relnatts THEN" \
	" (SELECT string_agg(la.attnum || ':' || pa.attnum, ',' ORDER BY la.attnum)"            \
	" FROM pg_catalog.pg_attribute la JOIN pg_catalog.pg_attribute pa ON pa.attrelid = c.oid" \
	" AND pa.attname = la.attname WHERE la.attrelid = i2.inhrelid AND la.attnum > 0"         \
	" AND NOT la.attisdropped AND la.attnum <> pa.attnum) END, NULL, NULL, NULL, NULL"       \
	" FROM (SELECT c.oid, c.relnatts, EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid =" \
	" c.oid AND a.attnum > 0 AND a.attisdropped) AS dropped FROM lokadb.tables t"            \
	" JOIN pg_catalog.pg_namespace n ON n.nspname = t.schema_name JOIN pg_catalog.pg_class c" \
	" ON c.relnamespace = n.oid AND c.relname = t.table_name OFFSET 0) c"                    \
	" JOIN pg_catalog.pg_inherits i1 ON i1.inhparent = c.oid"                                 \
	" JOIN pg_catalog.pg_inherits i2 ON i2.inhparent = i1.inhrelid"                           \
	" UNION ALL SELECT 's', n.nspname::text, c.relname::text, NULL, NULL, NULL, NULL, NULL"  \
	" FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"   \
	" WHERE c.relname IN (SELECT table_name FROM lokadb.tables)"                             \
	" AND n.nspname !~ '^pg_(toast|temp)'"

/* The freshness check: (version, oid of lokadb.meta, the guards, the readers), one row. */
#define MC_VERIFY_SQL \
	"SELECT (SELECT value FROM lokadb.meta WHERE key = 'version'), 'lokadb.meta'::regclass::oid::text, " \
	MC_GUARDS_SQL ", " MC_READERS_SQL

/* What identifies a catalog state: compared by the freshness check. */
struct mc_ident {
	int installed;		/* 0: schema lokadb (or one of its tables) is missing */
	uint64_t version;	/* lokadb.meta 'version' (0 if absent) */
	uint32_t meta_oid;	/* changes when the catalog is dropped and installed again */
	uint64_t guards;	/* a hash of MC_GUARDS_SQL's text */
	int readers;		/* MC_READERS_SQL: 1 when code may read settings */
};

/* One key -> value slot of an open-addressing hash table. */
struct mc_slot {
	uint64_t h;
	const char *k[3];	/* k[2] may be NULL (two-part keys) */
	const void *val;	/* NULL: empty slot */
};

struct mc_map {
	struct mc_slot *slots;
	size_t mask;		/* capacity - 1 (a power of two) */
};

/* One isolated organization's partition of one LokaDB table. */
struct mc_part {
	const char *schema, *name, *org_id, *container, *leaf;
	const struct mc_part *next_of_org;	/* the organization's next partition (mc_org_parts) */
};

/* An organization's partitions, one per LokaDB table (cat->org_parts[i] is cat->orgs[i]'s). */
struct mc_org_parts {
	const struct mc_part *first;	/* a list through next_of_org */
	size_t n;
};

/* A leaf partition of a LokaDB table (row `r`): what RowDescription names. */
struct mc_rel {
	uint32_t oid, table_oid;
	const char *attnums;		/* lk_table_oid's, or NULL */
};

struct mc_chunk;

/* A loaded catalog. Immutable once built (but for last_org, a memo of
 * mc_cat_org's last answer); freed with mc_cat_free(). */
struct mc_cat {
	struct mc_ident id;
	size_t n_tables, n_orgs, n_parts, n_shadows, n_rels;
	uint64_t fingerprint;		/* of every row, in any order: did anything change? */
	struct mc_table *tables;
	struct mc_org *orgs;
	struct mc_part *parts;
	struct mc_org_parts *org_parts;	/* per organization (n_orgs), or NULL when there are none */
	struct mc_rel *rels;
	struct mc_map by_table;		/* (schema, name) -> struct mc_table */
	struct mc_map by_org;		/* (id) -> struct mc_org */
	struct mc_map by_part;		/* (schema, name, org_id) -> struct mc_part */
	struct mc_map shadows;		/* (schema, name) -> any relation of that name */
	struct mc_chunk *strings;	/* every string above lives here */
	const struct mc_org *last_org;	/* the organization mc_cat_org() found last (a message asks for
					   its organization several times: affinity, pause, leaves) */
};

/* The catalog of MC_LOAD_SQL's result, or NULL (out of memory or a malformed
 * result; `err` says which). The result stays the caller's. */
struct mc_cat *mc_cat_build(const struct pg_result *res, char *err, size_t errlen);
/* An empty catalog: `installed` = 0, everything else empty. NULL if out of memory. */
struct mc_cat *mc_cat_empty(void);
/* Accepts NULL. */
void mc_cat_free(struct mc_cat *cat);

const struct mc_table *mc_cat_table(const struct mc_cat *cat, const char *schema, const char *name);
const struct mc_org *mc_cat_org(const struct mc_cat *cat, const char *id);
/* The leaf of an isolated organization, else NULL. */
const char *mc_cat_leaf(const struct mc_cat *cat, const char *schema, const char *name,
			const char *org_id);
/* An unqualified name resolved along a search_path value (see meta_cache.h).
 * search_path NULL means PostgreSQL's default, "$user", public. */
const struct mc_table *mc_cat_search(const struct mc_cat *cat, const char *name,
				     const char *search_path, const char *user);

/* The identity from the text of lokadb.meta's version and oid (NULL or
 * "" = 0), the guards and the readers ("f": none): `installed` = 1. 0, or
 * -1 when version or oid is not a number. */
int mc_ident_parse(const char *version, const char *oid, const char *guards, const char *readers,
		   struct mc_ident *out);

#endif
