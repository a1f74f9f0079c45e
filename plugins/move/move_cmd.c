/* SPDX-License-Identifier: ISC */
/*
 * move_cmd.c -- the console commands of the move plugin: how each one reads
 * its arguments, the queries it runs on the cloud database, and its reply.
 * The table move_cmds[] at the end is the whole list; move.c registers it
 * and runs each entry as a job (move.h).
 *
 *   INSTALL                         catalog.sql + move.sql; replies the schema version
 *   ADD ORG id ['name']             lokadb.add_org()
 *   ENABLE TABLE name [BY column]   CALL lokadb.enable_table()
 *   DISABLE TABLE name              CALL lokadb.disable_table()
 *   ISOLATE ORG id                  CALL lokadb.isolate_org() (lokadb.isolate_abort() after an error)
 *   SHOW TABLES, SHOW ORGS          lokadb.show_tables(), lokadb.show_orgs()
 *   CREATE SITE name DATABASE 'key' [HOST 'h'] [PORT n] [USER 'u'] [PASSWORD 'p']
 *                                   lokadb.create_site(): postgres_fdw server + user mapping
 *   DROP SITE name, SHOW SITES      lokadb.drop_site(), lokadb.show_sites()
 *   MOVE ORG id TO SITE name OFFLINE
 *                                   lokadb.move_prepare() (cloud), the tables' DDL
 *                                   (site, through lokadb's listener), CALL
 *                                   lokadb.move_org() (cloud); after an error
 *                                   lokadb.move_abort() and the site's empty tables dropped
 *   ANALYZE SITES                   lokadb.analyze_sites()
 *
 * A command that works on tables first marks them busy in the plugin's
 * in-process set (55006 if another running command holds one), by the name
 * PostgreSQL resolves them to.
 */
#include "move.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define api move_api

#define OID_TIMESTAMPTZ 1184

/* --------------------------------------------------------- arguments -- */

/* A 'string' starting at p (on the quote): its value, malloc'ed; *end after it. */
static char *quoted_string(const char *p, const char **end)
{
	size_t n = strlen(p);
	char *out = malloc(n + 1), *o = out;

	if (!out)
		return NULL;
	for (p++; *p; p++) {
		if (*p == '\'' && p[1] == '\'') {
			*o++ = '\'';
			p++;
		} else if (*p == '\'') {
			*o = 0;
			*end = p + 1;
			return out;
		} else {
			*o++ = *p;
		}
	}
	free(out);
	return NULL;	/* unterminated */
}

/* A word starting at p, with "double-quoted" parts kept as written. */
static char *word(const char *p, const char **end)
{
	const char *s = p;
	int inq = 0;

	for (; *p && (inq || !isspace((unsigned char)*p)); p++)
		if (*p == '"')
			inq = !inq;
	if (inq)
		return NULL;
	*end = p;
	return strndup(s, (size_t)(p - s));
}

int move_tokens(const char *args, char **tok, int *quoted, int max)
{
	int n = 0;
	const char *p = args, *end;

	for (;;) {
		while (isspace((unsigned char)*p))
			p++;
		if (!*p)
			return n;
		if (n == max)
			goto bad;
		quoted[n] = *p == '\'';
		tok[n] = quoted[n] ? quoted_string(p, &end) : word(p, &end);
		if (!tok[n])
			goto bad;
		n++;
		p = end;
	}
bad:
	while (n > 0)
		free(tok[--n]);
	return -1;
}

static int usage(struct move_job *j)
{
	api->result_error(j->res, "42601", "syntax error: usage: %s", j->cmd->usage);
	return -1;
}

/* Tokens into j->arg[] in order, within the command's min/max; 'strings' allowed. */
static int parse_plain(struct move_job *j, const char *args)
{
	char *tok[MOVE_MAX_ARGS + 1];
	int quoted[MOVE_MAX_ARGS + 1];
	int n = move_tokens(args, tok, quoted, MOVE_MAX_ARGS + 1);

	if (n < 0)
		return usage(j);
	if (n < j->cmd->nargs_min || n > j->cmd->nargs_max) {
		while (n > 0)
			free(tok[--n]);
		return usage(j);
	}
	for (int i = 0; i < n; i++)
		j->arg[i] = tok[i];
	return 0;
}

/* name [BY column] (ENABLE TABLE) or name (DISABLE TABLE): arg[0] the table,
 * arg[1] the column of ENABLE TABLE (default: the org_column setting). */
static int parse_table_by(struct move_job *j, const char *args)
{
	char *tok[4] = { 0 };
	int quoted[4] = { 0 };
	int n = move_tokens(args, tok, quoted, 4);
	int enable = j->cmd->nargs_max == 2;
	int by = enable && n == 3 && strcasecmp(tok[1], "BY") == 0 && !quoted[1] && !quoted[2];

	if (n < 0)
		return usage(j);
	if (quoted[0] || !(n == 1 || by)) {
		while (n > 0)
			free(tok[--n]);
		return usage(j);
	}
	j->arg[0] = tok[0];
	if (by) {
		free(tok[1]);
		j->arg[1] = tok[2];
	} else if (enable && !(j->arg[1] = strdup(move_org_column()))) {
		api->result_error(j->res, "53200", "out of memory");
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------ replies -- */

/* The rows of `r` as the reply, with these column types (NULL: all text). */
static void reply_rows(struct move_job *j, PGresult *r, const uint32_t *types, const char *tag)
{
	int nf = PQnfields(r), nt = PQntuples(r);
	const char *names[16], *row[16];

	if (nf > 16)
		nf = 16;
	for (int i = 0; i < nf; i++)
		names[i] = PQfname(r, i);
	api->result_columns(j->res, nf, names, types);
	for (int k = 0; k < nt; k++) {
		for (int i = 0; i < nf; i++)
			row[i] = PQgetisnull(r, k, i) ? NULL : PQgetvalue(r, k, i);
		api->result_row(j->res, row);
	}
	api->result_complete(j->res, tag);
	job_finish(j);
}

static void lock_params(char *timeout, char *retries, size_t len)
{
	snprintf(timeout, len, "%d", move_lock_timeout_ms());
	snprintf(retries, len, "%d", move_lock_retries());
}

/* ------------------------------------------------------------ INSTALL -- */

static void install_version(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_INT4, LK_TYPE_INT8 };

	reply_rows(j, r, types, "INSTALL");
}

static void install_done(struct move_job *j, PGresult *r)
{
	(void)r;
	job_query(j, "SELECT (SELECT value FROM lokadb.meta WHERE key = 'schema_version')::int4 AS schema_version, "
		  "(SELECT value FROM lokadb.meta WHERE key = 'version')::int8 AS catalog_version",
		  0, NULL, install_version);
}

static void run_install(struct move_job *j)
{
	const char *why;
	const char *sql = move_install_sql(&why);

	if (!sql) {
		job_fail(j, "58P01", "INSTALL: %s", why);
		return;
	}
	if (job_take(j, "the catalog") != 0)
		return;
	job_query(j, sql, 0, NULL, install_done);
}

/* ------------------------------------------------------------ ADD ORG -- */

static void add_org_done(struct move_job *j, PGresult *r)
{
	reply_rows(j, r, NULL, "ADD ORG");
}

static void run_add_org(struct move_job *j)
{
	const char *params[2] = { j->arg[0], j->arg[1] };

	job_query(j, "SELECT * FROM lokadb.add_org($1, $2)", 2, params, add_org_done);
}

/* --------------------------------------------------- ENABLE / DISABLE -- */

static void enable_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT,
					  LK_TYPE_INT4 };

	reply_rows(j, r, types, "ENABLE TABLE");
}

static void disable_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT4 };

	reply_rows(j, r, types, "DISABLE TABLE");
}

/* The table resolved: hold it, then CALL the procedure. */
static void table_resolved(struct move_job *j, PGresult *r)
{
	char timeout[16], retries[16];
	int enable = j->cmd->nargs_max == 2;

	if (PQntuples(r) != 1 || job_take(j, PQgetvalue(r, 0, 0)) != 0) {
		if (PQntuples(r) != 1)
			job_fail(j, "XX000", "%s: could not resolve the table", j->what);
		return;
	}
	lock_params(timeout, retries, sizeof(timeout));
	if (enable) {
		const char *params[4] = { j->arg[0], j->arg[1], timeout, retries };
		job_query(j, "CALL lokadb.enable_table($1, $2, $3::int4, $4::int4)", 4, params, enable_done);
	} else {
		const char *params[3] = { j->arg[0], timeout, retries };
		job_query(j, "CALL lokadb.disable_table($1, $2::int4, $3::int4)", 3, params, disable_done);
	}
}

static void run_table_cmd(struct move_job *j)
{
	const char *params[1] = { j->arg[0] };

	job_query(j, "SELECT lokadb.table_key($1)", 1, params, table_resolved);
}

/* -------------------------------------------------------- ISOLATE ORG -- */

static void isolate_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT4, LK_TYPE_INT8 };

	reply_rows(j, r, types, "ISOLATE ORG");
}

/* Every LokaDB table is held (the command works on each), and the organization. */
static void isolate_tables(struct move_job *j, PGresult *r)
{
	char key[512], timeout[16], retries[16];
	const char *params[3] = { j->arg[0], timeout, retries };

	snprintf(key, sizeof(key), "organization \"%s\"", j->arg[0]);
	if (job_take(j, key) != 0)
		return;
	for (int k = 0; k < PQntuples(r); k++)
		if (job_take(j, PQgetvalue(r, k, 0)) != 0)
			return;
	lock_params(timeout, retries, sizeof(timeout));
	job_query(j, "CALL lokadb.isolate_org($1, $2::int4, $3::int4)", 3, params, isolate_done);
}

static void run_isolate(struct move_job *j)
{
	job_query(j, "SELECT format('%I.%I', schema_name, table_name) FROM lokadb.tables ORDER BY 1", 0, NULL,
		  isolate_tables);
}

/* --------------------------------------------------------------- SHOW -- */

static void show_tables_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT,
					  LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_TEXT };

	reply_rows(j, r, types, "SHOW");
}

static void show_orgs_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT,
					  LK_TYPE_INT8, LK_TYPE_INT8, OID_TIMESTAMPTZ };

	reply_rows(j, r, types, "SHOW");
}

static void run_show_tables(struct move_job *j)
{
	job_query(j, "SELECT * FROM lokadb.show_tables()", 0, NULL, show_tables_done);
}

static void run_show_orgs(struct move_job *j)
{
	job_query(j, "SELECT * FROM lokadb.show_orgs()", 0, NULL, show_orgs_done);
}

/* -------------------------------------------------------------- sites -- */

/* name DATABASE 'key' [HOST 'h'] [PORT n] [USER 'u'] [PASSWORD 'p'], in any
 * order after the name: arg[0..5] = name, database, host, port, user, password. */
static int parse_create_site(struct move_job *j, const char *args)
{
	static const char *const keys[] = { "DATABASE", "HOST", "PORT", "USER", "PASSWORD" };
	char *tok[12];
	int quoted[12];
	int n = move_tokens(args, tok, quoted, 12), rc = 0;

	if (n < 0)
		return usage(j);
	if (n < 1 || n % 2 == 0 || quoted[0]) {
		rc = usage(j);
		goto out;
	}
	for (int i = 1; i < n && rc == 0; i += 2) {
		int k = -1;

		for (int m = 0; m < 5; m++)
			if (!quoted[i] && strcasecmp(tok[i], keys[m]) == 0)
				k = m;
		if (k < 0 || j->arg[k + 1]) {
			rc = k < 0 ? usage(j) : api->result_error(j->res, "42601", "syntax error: %s given twice", keys[k]);
			break;
		}
		j->arg[k + 1] = tok[i + 1];
		tok[i + 1] = NULL;
	}
	if (rc == 0 && !j->arg[1])
		rc = api->result_error(j->res, "42601", "syntax error: CREATE SITE needs DATABASE 'key' (the lokadb "
				       "[databases] entry that reaches the site through the relay)");
	if (rc == 0 && ((!j->arg[2] && !(j->arg[2] = strdup("127.0.0.1"))) ||
			(!j->arg[3] && !(j->arg[3] = strdup("6432")))))
		rc = api->result_error(j->res, "53200", "out of memory");
	if (rc == 0) {
		j->arg[0] = tok[0];
		tok[0] = NULL;
	}
out:
	while (n > 0)
		free(tok[--n]);
	return rc == 0 ? 0 : -1;
}

static void create_site_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT4, LK_TYPE_TEXT,
					  LK_TYPE_TEXT };

	reply_rows(j, r, types, "CREATE SITE");
}

static void run_create_site(struct move_job *j)
{
	char key[512];
	const char *params[6] = { j->arg[0], j->arg[1], j->arg[2], j->arg[3], j->arg[4], j->arg[5] };

	snprintf(key, sizeof(key), "site \"%s\"", j->arg[0]);
	if (job_take(j, key) != 0)
		return;
	job_query(j, "SELECT * FROM lokadb.create_site($1, $2, $3, $4, $5, $6)", 6, params, create_site_done);
}

static void drop_site_done(struct move_job *j, PGresult *r)
{
	reply_rows(j, r, NULL, "DROP SITE");
}

static void run_drop_site(struct move_job *j)
{
	char key[512];
	const char *params[1] = { j->arg[0] };

	snprintf(key, sizeof(key), "site \"%s\"", j->arg[0]);
	if (job_take(j, key) != 0)
		return;
	job_query(j, "SELECT * FROM lokadb.drop_site($1)", 1, params, drop_site_done);
}

static void show_sites_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT4, LK_TYPE_TEXT,
					  LK_TYPE_TEXT, LK_TYPE_TEXT, OID_TIMESTAMPTZ };

	reply_rows(j, r, types, "SHOW");
}

static void run_show_sites(struct move_job *j)
{
	job_query(j, "SELECT * FROM lokadb.show_sites()", 0, NULL, show_sites_done);
}

static void analyze_sites_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_INT4 };

	reply_rows(j, r, types, "ANALYZE SITES");
}

static void run_analyze_sites(struct move_job *j)
{
	job_query(j, "SELECT lokadb.analyze_sites() AS foreign_partitions", 0, NULL, analyze_sites_done);
}

/* ----------------------------------------------------------- MOVE ORG -- */

/* id TO SITE name OFFLINE: arg[0] the organization, arg[1] the site. */
static int parse_move(struct move_job *j, const char *args)
{
	char *tok[6];
	int quoted[6];
	int n = move_tokens(args, tok, quoted, 6), rc = 0;

	if (n < 0)
		return usage(j);
	if (n < 4 || n > 5 || quoted[1] || quoted[2] || quoted[3] || strcasecmp(tok[1], "TO") != 0 ||
	    strcasecmp(tok[2], "SITE") != 0)
		rc = usage(j);
	else if (n == 4)
		rc = api->result_error(j->res, "0A000", "only offline moves are implemented: MOVE ORG %s TO SITE %s "
				       "OFFLINE (the organization's writes wait while its rows are copied)", tok[0], tok[3]);
	else if (quoted[4] || strcasecmp(tok[4], "OFFLINE") != 0)
		rc = usage(j);
	if (rc == 0) {
		j->arg[0] = tok[0];
		j->arg[1] = tok[3];
		tok[0] = tok[3] = NULL;
	}
	while (n > 0)
		free(tok[--n]);
	return rc == 0 ? 0 : -1;
}

static void move_done(struct move_job *j, PGresult *r)
{
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_INT4, LK_TYPE_INT8 };

	/* not "MOVE ...": libpq reads a tag starting "MOVE " as a cursor MOVE and wants a row count after it */
	reply_rows(j, r, types, "ORG MOVED");
}

/* The site's tables exist: the switch in the cloud. */
static void move_site_ready(struct move_job *j, PGresult *r)
{
	char timeout[16], retries[16];
	const char *params[4] = { j->arg[0], j->arg[1], timeout, retries };

	(void)r;
	j->site_made = 1;
	lock_params(timeout, retries, sizeof(timeout));
	job_query(j, "CALL lokadb.move_org($1, $2, $3::int4, $4::int4)", 4, params, move_done);
}

static void move_site_connected(struct move_job *j, PGresult *r)
{
	(void)r;
	job_site_query(j, j->site_ddl, move_site_ready);
}

static void move_prepared(struct move_job *j, PGresult *r)
{
	if (PQntuples(r) != 1) {
		job_fail(j, "XX000", "%s: lokadb.move_prepare() returned %d rows", j->what, PQntuples(r));
		return;
	}
	free(j->site_undo);
	free(j->site_ddl);
	if (!(j->site_undo = strdup(PQgetvalue(r, 0, 2))) || !(j->site_ddl = strdup(PQgetvalue(r, 0, 1)))) {
		job_fail(j, "53200", "out of memory");
		return;
	}
	job_site_connect(j, PQgetvalue(r, 0, 0), move_site_connected);
}

/* Every LokaDB table is held, the organization and the site. */
static void move_tables(struct move_job *j, PGresult *r)
{
	char key[512];
	const char *params[2] = { j->arg[0], j->arg[1] };

	snprintf(key, sizeof(key), "organization \"%s\"", j->arg[0]);
	if (job_take(j, key) != 0)
		return;
	snprintf(key, sizeof(key), "site \"%s\"", j->arg[1]);
	if (job_take(j, key) != 0)
		return;
	for (int k = 0; k < PQntuples(r); k++)
		if (job_take(j, PQgetvalue(r, k, 0)) != 0)
			return;
	job_query(j, "SELECT * FROM lokadb.move_prepare($1, $2)", 2, params, move_prepared);
}

static void run_move(struct move_job *j)
{
	job_query(j, "SELECT format('%I.%I', schema_name, table_name) FROM lokadb.tables ORDER BY 1", 0, NULL,
		  move_tables);
}

/* ------------------------------------------------------------- table -- */

const struct move_cmd move_cmds[] = {
	{ "INSTALL", 1, "INSTALL", 0, 0, 0, parse_plain, run_install, NULL,
	  "create or upgrade the LokaDB catalog (schema lokadb) in the cloud database" },
	{ "ADD ORG", 1, "ADD ORG id ['name']", 1, 2, 1, parse_plain, run_add_org, NULL,
	  "register an organization in lokadb.orgs" },
	{ "ENABLE TABLE", 1, "ENABLE TABLE name [BY column]", 1, 2, 1, parse_table_by, run_table_cmd, NULL,
	  "make a table a LokaDB table (LIST-partitioned by organization, DEFAULT partition), online" },
	{ "DISABLE TABLE", 1, "DISABLE TABLE name", 1, 1, 1, parse_table_by, run_table_cmd, NULL,
	  "make a LokaDB table a plain table again (no organization may have its own partition)" },
	{ "ISOLATE ORG", 1, "ISOLATE ORG id", 1, 1, 1, parse_plain, run_isolate, "CALL lokadb.isolate_abort($1)",
	  "give an organization its own partition in every LokaDB table, online" },
	{ "SHOW TABLES", 0, "SHOW TABLES", 0, 0, 1, parse_plain, run_show_tables, NULL,
	  "the LokaDB tables" },
	{ "SHOW ORGS", 0, "SHOW ORGS", 0, 0, 1, parse_plain, run_show_orgs, NULL,
	  "the organizations: state, site, partitions, rows estimate, last analyze" },
	{ "CREATE SITE", 1, "CREATE SITE name DATABASE 'key' [HOST 'host'] [PORT port] [USER 'user'] [PASSWORD 'pw']",
	  1, 6, 1, parse_create_site, run_create_site, NULL,
	  "register a site: a postgres_fdw server (and user mapping) reaching it through lokadb and the relay" },
	{ "DROP SITE", 1, "DROP SITE name", 1, 1, 1, parse_plain, run_drop_site, NULL,
	  "remove a site no organization lives at" },
	{ "SHOW SITES", 0, "SHOW SITES", 0, 0, 1, parse_plain, run_show_sites, NULL,
	  "the sites: database key, fdw server, organizations" },
	{ "MOVE ORG", 1, "MOVE ORG id TO SITE name OFFLINE", 2, 2, 1, parse_move, run_move,
	  "SELECT in_cloud FROM lokadb.move_abort($1)",
	  "move an isolated organization's rows to a site (its writes wait meanwhile) and serve them through postgres_fdw" },
	{ "ANALYZE SITES", 1, "ANALYZE SITES", 0, 0, 1, parse_plain, run_analyze_sites, NULL,
	  "ANALYZE the foreign partitions of the moved organizations now" },
};
const int move_ncmds = (int)(sizeof(move_cmds) / sizeof(move_cmds[0]));
