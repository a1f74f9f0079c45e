/* SPDX-License-Identifier: ISC */
/*
 * move -- the LokaDB catalog administration commands (issue 4, first part of
 * the move plugin): INSTALL, ADD ORG, ENABLE TABLE, DISABLE TABLE,
 * ISOLATE ORG, SHOW TABLES, SHOW ORGS on the lokadb console; and sites
 * (doc/sites.md): CREATE SITE, DROP SITE, SHOW SITES, MOVE ORG ... OFFLINE,
 * ANALYZE SITES, and the ANALYZE schedule of foreign partitions
 * (analyze_interval).
 *
 * Every command is asynchronous: it opens its own connection to the cloud
 * database ([plugin.move] cloud) with api->pg_connect, runs a short chain of
 * queries there with api->pg_query, answers, and closes the connection. The
 * work itself (partitioning a table online, isolating an organization) is
 * done by PL/pgSQL procedures that INSTALL puts in the schema lokadb
 * (catalog.sql, then move.sql, both read from sql_dir); the procedures COMMIT
 * between their phases and retry lock timeouts, so nothing here ever blocks
 * the loop, and a long ISOLATE ORG holds only its own connection.
 *
 * MOVE ORG's job has a second connection, to the site database, opened
 * from the site's foreign server and user mapping (through this lokadb's
 * listener and the relay, the path postgres_fdw takes): it creates the
 * organization's tables there, and after a failure that left the
 * organization in the cloud, drops them again (when empty).
 *
 * This file owns: the settings, the SQL text INSTALL runs, the set of busy
 * tables (a command that touches a table another running command holds gets
 * 55006 at once; across lokadb processes the procedures' advisory locks do
 * the same), the job machinery (move.h) with the site connection, and the
 * ANALYZE timer (one run at a time, on a connection of its own). move_cmd.c
 * has the commands.
 *
 * Invariants: a job calls result_done exactly once (job_finish); a busy key
 * belongs to exactly one running job; CONFIG_CHECK changes nothing and
 * CONFIG_APPLY never fails (a missing SQL file makes INSTALL fail, not the
 * reload).
 */
#include "move.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

const lk_api *move_api;
#define api move_api

/* Prepended to the SQL files: quiet, and one INSTALL at a time per database. */
#define INSTALL_PREAMBLE \
	"SET LOCAL client_min_messages = warning;\nSELECT pg_advisory_xact_lock(19531, 0);\n"
/* Present once move.sql of this plugin's generation is installed. */
#define CATALOG_CHECK_SQL "SELECT to_regprocedure('lokadb.move_api_1()') IS NOT NULL"
#define SQL_FILES_N 2
static const char *const sql_files[SQL_FILES_N] = { "catalog.sql", "move.sql" };

struct move {
	lk_plugin *self;
	char *cloud;			/* libpq conninfo of the cloud database */
	char *org_column;		/* default organization column of ENABLE TABLE */
	int lock_timeout_ms;		/* lock_timeout of each locking step */
	int lock_retries;		/* attempts of a step that timed out */
	char *install_sql;		/* INSTALL_PREAMBLE + the SQL files */
	char *install_why;		/* why install_sql is NULL */
	struct move_job *jobs;		/* running commands */
	uint64_t analyze_usec;		/* analyze_interval (0: off) */
	lk_timer *analyze_timer;	/* the ANALYZE schedule of foreign partitions */
	lk_pg *analyze_pg;		/* its connection while one runs */
};

static struct move *M;	/* the plugin's state, also set with api->set_data */

/* ------------------------------------------------------------ settings -- */

static const struct {
	const char *key, *def, *doc;
} settings[] = {
	{ "cloud", "", "libpq conninfo of the cloud database (required)" },
	{ "org_column", "organization_id", "organization column of ENABLE TABLE without BY" },
	{ "sql_dir", "", "directory of catalog.sql and move.sql (empty: the directory of move.so)" },
	{ "lock_timeout", "100ms", "how long each locking step waits for its locks before retrying (ms or s)" },
	{ "lock_retries", "100", "retries of a locking step after its first attempt before the command fails with 55P03" },
	{ "analyze_interval", "1h", "ANALYZE the foreign partitions of moved organizations this often (0: never; also after each MOVE)" },
};

/* "250", "250ms", "2s" -> milliseconds, or -1. */
static long parse_ms(const char *v)
{
	char *end;
	long n;

	if (!v || !*v)
		return -1;
	errno = 0;
	n = strtol(v, &end, 10);
	if (errno || end == v || n < 0)
		return -1;
	if (*end == 0 || strcmp(end, "ms") == 0)
		return n;
	if (strcmp(end, "s") == 0 && n <= LONG_MAX / 1000)
		return n * 1000;
	return -1;
}

/* "0", "30s", "15min", "1h", "500ms" -> microseconds, or -1. */
static long long parse_interval(const char *v)
{
	static const struct {
		const char *unit;
		long long usec;
	} units[] = { { "", 1000000LL }, { "s", 1000000LL }, { "ms", 1000LL }, { "min", 60000000LL },
		      { "h", 3600000000LL } };
	char *end;
	long long n;

	if (!v || !*v)
		return -1;
	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || end == v || n < 0 || n > 1000000000LL)
		return -1;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (strcmp(end, units[i].unit) == 0)
			return n * units[i].usec;
	return -1;
}

static long parse_count(const char *v)
{
	char *end;
	long n;

	if (!v || !*v)
		return -1;
	errno = 0;
	n = strtol(v, &end, 10);
	return (errno || *end || n < 0) ? -1 : n;
}

/* The directory move.so was loaded from ("." if unknown). malloc'ed. */
static char *so_dir(void)
{
	Dl_info info;
	const char *slash;

	if (!dladdr((void *)&so_dir, &info) || !info.dli_fname || !(slash = strrchr(info.dli_fname, '/')))
		return strdup(".");
	return strndup(info.dli_fname, (size_t)(slash - info.dli_fname));
}

static char *sql_dir_of(const char *setting)
{
	return (setting && *setting) ? strdup(setting) : so_dir();
}

/* Read a whole file; malloc'ed text or NULL (errno set). */
static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)n + 1)) != NULL) {
		if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		} else {
			buf[n] = 0;
		}
	}
	fclose(f);
	return buf;
}

/* INSTALL_PREAMBLE + every SQL file of `dir`; NULL and *why on failure. */
static char *load_install_sql(const char *dir, char *why, size_t whylen)
{
	char *text[SQL_FILES_N] = { 0 }, *all = NULL, path[PATH_MAX];
	size_t len = strlen(INSTALL_PREAMBLE) + 1;
	int i;

	for (i = 0; i < SQL_FILES_N; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, sql_files[i]);
		if (!(text[i] = read_file(path))) {
			snprintf(why, whylen, "could not read %s: %s (set [plugin.move] sql_dir to the directory "
				 "of catalog.sql and move.sql)", path, strerror(errno));
			goto out;
		}
		len += strlen(text[i]) + 2;
	}
	if (!(all = malloc(len)))
		goto out;
	strcpy(all, INSTALL_PREAMBLE);
	for (i = 0; i < SQL_FILES_N; i++) {
		strcat(all, text[i]);
		strcat(all, "\n;");
	}
out:
	for (i = 0; i < SQL_FILES_N; i++)
		free(text[i]);
	return all;
}

/* An explicit sql_dir must hold the SQL files; the default (the directory of
 * move.so) may lack them (sanitizer builds, make install): then only INSTALL
 * fails, with a message naming the setting. */
static int check_sql_dir(lk_event *ev)
{
	const char *dir = api->config_get(ev, "sql_dir");
	char path[PATH_MAX];

	if (!dir || !*dir)
		return LK_CONTINUE;
	for (int i = 0; i < SQL_FILES_N; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, sql_files[i]);
		if (access(path, R_OK) != 0)
			return api->config_error(ev, "sql_dir", "cannot read %s: %s", path, strerror(errno));
	}
	return LK_CONTINUE;
}

static int on_config_check(lk_plugin *self, lk_event *ev)
{
	const char *cloud = api->config_get(ev, "cloud");
	const char *col = api->config_get(ev, "org_column");
	long ms = parse_ms(api->config_get(ev, "lock_timeout"));
	long n = parse_count(api->config_get(ev, "lock_retries"));
	char *err = NULL;
	PQconninfoOption *opts;

	(void)self;
	if (!cloud || !*cloud)
		return api->config_error(ev, "cloud", "must be set: the libpq conninfo of the cloud database");
	if (!(opts = PQconninfoParse(cloud, &err))) {
		int rc = api->config_error(ev, "cloud", "not a libpq conninfo: %s", err ? err : "out of memory");
		PQfreemem(err);
		return rc;
	}
	PQconninfoFree(opts);
	if (!col || !*col || strlen(col) > 63)
		return api->config_error(ev, "org_column", "must be a column name of 1 to 63 bytes");
	if (ms < 1 || ms > 60000)
		return api->config_error(ev, "lock_timeout", "must be 1ms to 60s, not \"%s\"",
					 api->config_get(ev, "lock_timeout"));
	if (n < 0 || n > 100000)
		return api->config_error(ev, "lock_retries", "must be 0 to 100000, not \"%s\"",
					 api->config_get(ev, "lock_retries"));
	{
		long long iv = parse_interval(api->config_get(ev, "analyze_interval"));
		if (iv < 0 || (iv > 0 && iv < 100000))
			return api->config_error(ev, "analyze_interval", "must be 0 (off) or 100ms to a few "
						 "years (ms, s, min, h), not \"%s\"", api->config_get(ev, "analyze_interval"));
	}
	return check_sql_dir(ev);
}

static void set_str(char **dst, const char *v)
{
	free(*dst);
	*dst = strdup(v ? v : "");
}

static void analyze_tick(lk_plugin *self, void *arg);

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	uint64_t iv = (uint64_t)parse_interval(api->config_get(ev, "analyze_interval"));

	char *dir = sql_dir_of(api->config_get(ev, "sql_dir")), why[PATH_MAX + 128] = "out of memory";

	set_str(&M->cloud, api->config_get(ev, "cloud"));
	set_str(&M->org_column, api->config_get(ev, "org_column"));
	M->lock_timeout_ms = (int)parse_ms(api->config_get(ev, "lock_timeout"));
	M->lock_retries = (int)parse_count(api->config_get(ev, "lock_retries"));
	free(M->install_sql);
	M->install_sql = dir ? load_install_sql(dir, why, sizeof(why)) : NULL;
	set_str(&M->install_why, M->install_sql ? "" : why);
	if (!M->install_sql)
		api->log(self, LK_LOG_WARNING, "INSTALL will fail: %s", why);
	free(dir);
	if (iv != M->analyze_usec || (iv && !M->analyze_timer)) {
		api->timer_cancel(M->analyze_timer);
		M->analyze_timer = NULL;
		M->analyze_usec = iv;
		if (iv && !(M->analyze_timer = api->timer_add(self, iv, 1, analyze_tick, NULL)))
			api->log(self, LK_LOG_WARNING, "could not schedule the ANALYZE of foreign partitions");
	}
	return LK_CONTINUE;
}

/* ------------------------------------------------ scheduled ANALYZE -- */

static void analyze_end(void)
{
	if (M->analyze_pg)
		api->pg_close(M->analyze_pg);
	M->analyze_pg = NULL;
}

static void analyze_done(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	(void)pg;
	(void)arg;
	if (r && PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		api->log(self, LK_LOG_INFO, "analyze_interval: analyzed %s foreign partitions", PQgetvalue(r, 0, 0));
	else
		api->log(self, LK_LOG_WARNING, "analyze_interval: ANALYZE of foreign partitions failed: %s",
			 r ? PQresultErrorMessage(r) : "the connection to the cloud database broke");
	analyze_end();
}

static void analyze_checked(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	(void)arg;
	if (!r || PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), "t") != 0 ||
	    api->pg_query(pg, "SELECT lokadb.analyze_sites()", 0, NULL, analyze_done, NULL) != 0) {
		if (r && PQresultStatus(r) != PGRES_TUPLES_OK)
			api->log(self, LK_LOG_WARNING, "analyze_interval: %s", PQresultErrorMessage(r));
		analyze_end();
	}
}

/* WARNINGs of lokadb.analyze_sites() (a site that cannot be reached) go to the log. */
static void analyze_notice(void *arg, const PGresult *r)
{
	const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

	(void)arg;
	if (msg)
		api->log(M->self, LK_LOG_WARNING, "analyze_interval: %s", msg);
}

static void analyze_connected(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	(void)arg;
	if (!ok) {
		api->log(self, LK_LOG_WARNING, "analyze_interval: could not connect to the cloud database: %s",
			 err ? err : "unknown error");
		analyze_end();
		return;
	}
	PQsetNoticeReceiver(api->pg_conn(pg), analyze_notice, NULL);
	if (api->pg_query(pg, "SELECT to_regprocedure('lokadb.analyze_sites(text)') IS NOT NULL", 0, NULL,
			  analyze_checked, NULL) != 0)
		analyze_end();
}

/* Every analyze_interval: one connection, ANALYZE of every foreign partition, closed. */
static void analyze_tick(lk_plugin *self, void *arg)
{
	(void)arg;
	if (M->analyze_pg || !M->cloud || !*M->cloud)
		return;		/* the previous one is still running */
	M->analyze_pg = api->pg_connect(self, M->cloud, analyze_connected, NULL);
}

const char *move_org_column(void)
{
	return M->org_column;
}

int move_lock_timeout_ms(void)
{
	return M->lock_timeout_ms;
}

int move_lock_retries(void)
{
	return M->lock_retries;
}

const char *move_install_sql(const char **why)
{
	*why = M->install_why;
	return M->install_sql;
}

/* ---------------------------------------------------------- busy set -- */

/* The running job holding `key`, or NULL. */
static struct move_job *busy_owner(const char *key)
{
	for (struct move_job *j = M->jobs; j; j = j->next)
		for (int i = 0; i < j->nbusy; i++)
			if (strcmp(j->busy[i], key) == 0)
				return j;
	return NULL;
}

int job_take(struct move_job *j, const char *key)
{
	struct move_job *o = busy_owner(key);

	if (o == j)
		return 0;
	if (o) {
		job_fail(j, "55006", "%s is busy: %s is running on it", key, o->what);
		return -1;
	}
	if (j->nbusy == MOVE_MAX_BUSY || !(j->busy[j->nbusy] = strdup(key))) {
		job_fail(j, "54000", "%s: too many tables for one command", j->what);
		return -1;
	}
	j->nbusy++;
	return 0;
}

/* ------------------------------------------------------------- jobs -- */

static void job_free(struct move_job *j)
{
	for (int i = 0; i < MOVE_MAX_ARGS; i++)
		free(j->arg[i]);
	for (int i = 0; i < j->nbusy; i++)
		free(j->busy[i]);
	free(j->what);
	free(j->err_state);
	free(j->err_msg);
	free(j->site_undo);
	free(j->site_ddl);
	free(j);
}

void job_finish(struct move_job *j)
{
	struct move_job **p;

	for (p = &M->jobs; *p; p = &(*p)->next)
		if (*p == j) {
			*p = j->next;
			break;
		}
	if (j->pg)
		api->pg_close(j->pg);
	if (j->site)
		api->pg_close(j->site);
	api->result_done(j->res);
	job_free(j);
}

/* Send the remembered error and end. */
static void job_end_with_error(struct move_job *j)
{
	api->log(M->self, LK_LOG_INFO, "%s failed: %s %s", j->what, j->err_state, j->err_msg);
	api->result_error(j->res, j->err_state, "%s", j->err_msg);
	job_finish(j);
}

static void site_undo_done(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	struct move_job *j = arg;

	(void)self;
	(void)pg;
	if (!r || PQresultStatus(r) != PGRES_COMMAND_OK)
		api->log(M->self, LK_LOG_WARNING, "%s: could not drop the site's tables: %s", j->what,
			 r ? PQresultErrorMessage(r) : "the connection broke");
	job_end_with_error(j);
}

static void cleanup_done(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	struct move_job *j = arg;
	ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;

	(void)self;
	(void)pg;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		api->log(M->self, LK_LOG_WARNING, "%s: cleanup failed: %s", j->what,
			 r ? PQresultErrorMessage(r) : "the connection broke");
	} else if (st == PGRES_TUPLES_OK && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0 &&
		   j->site && j->site_made && j->site_undo &&
		   api->pg_query(j->site, j->site_undo, 0, NULL, site_undo_done, j) == 0) {
		return;		/* still in the cloud: the site's tables go */
	}
	job_end_with_error(j);
}

void job_fail(struct move_job *j, const char *sqlstate, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	const char *params[1] = { j->arg[0] };

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	j->err_state = strdup(sqlstate);
	j->err_msg = strdup(msg);
	if (!j->err_state || !j->err_msg) {
		api->result_error(j->res, "53200", "out of memory");
		job_finish(j);
		return;
	}
	/* 08006 of the cloud connection: no cleanup query can run there */
	if (j->cmd->cleanup_sql && j->pg && (strcmp(sqlstate, "08006") != 0 || j->site_broken) &&
	    api->pg_query(j->pg, j->cmd->cleanup_sql, 1, params, cleanup_done, j) == 0)
		return;
	job_end_with_error(j);
}

/* End the job with PostgreSQL's error (primary message, then detail and hint). */
static void job_fail_pg(struct move_job *j, PGresult *r)
{
	const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	const char *prim = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	const char *det = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL) : NULL;
	const char *hint = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_HINT) : NULL;

	if (!r) {
		job_fail(j, "08006", "%s: the connection to the cloud database broke", j->what);
		return;
	}
	job_fail(j, st ? st : "XX000", "%s%s%s%s%s", prim ? prim : PQresultErrorMessage(r),
		 det ? "\nDETAIL:  " : "", det ? det : "", hint ? "\nHINT:  " : "", hint ? hint : "");
}

/* ------------------------------------------------- the site connection -- */

static void job_notice(void *arg, const PGresult *r);

struct job_site_ctx {
	struct move_job *j;
	job_step_fn fn;
};

static void site_result(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	struct job_site_ctx q = *(struct job_site_ctx *)arg;
	struct move_job *j = q.j;
	ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
	const char *prim, *sqlstate;

	(void)self;
	(void)pg;
	free(arg);
	if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
		q.fn(j, r);
		return;
	}
	if (!r) {
		j->site_broken = 1;
		job_fail(j, "08006", "%s: the connection to the site broke", j->what);
		return;
	}
	prim = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
	sqlstate = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	job_fail(j, sqlstate ? sqlstate : "XX000", "%s: at the site: %s", j->what,
		 prim ? prim : PQresultErrorMessage(r));
}

void job_site_query(struct move_job *j, const char *sql, job_step_fn fn)
{
	struct job_site_ctx *q = malloc(sizeof(*q));

	if (!q) {
		job_fail(j, "53200", "out of memory");
		return;
	}
	q->j = j;
	q->fn = fn;
	if (api->pg_query(j->site, sql, 0, NULL, site_result, q) != 0) {
		free(q);
		j->site_broken = 1;
		job_fail(j, "08006", "%s: the connection to the site broke", j->what);
	}
}

static void site_state(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	struct move_job *j = arg;
	job_step_fn fn;

	(void)self;
	(void)pg;
	if (!j->site_connecting)
		return;		/* a break later: the pending query's callback reports it */
	j->site_connecting = 0;
	if (!ok) {
		char msg[512];

		snprintf(msg, sizeof(msg), "%s", err ? err : "unknown error");
		for (size_t n = strlen(msg); n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '); n--)
			msg[n - 1] = 0;
		job_fail(j, "08001", "%s: could not connect to the site database: %s", j->what, msg);
		return;
	}
	PQsetNoticeReceiver(api->pg_conn(pg), job_notice, j);
	fn = j->site_next;
	j->site_next = NULL;
	fn(j, NULL);
}

int job_site_connect(struct move_job *j, const char *conninfo, job_step_fn connected)
{
	j->site_connecting = 1;
	j->site_next = connected;
	j->site = api->pg_connect(M->self, conninfo, site_state, j);
	if (!j->site) {
		j->site_connecting = 0;
		job_fail(j, "08001", "%s: could not start a connection to the site database", j->what);
		return -1;
	}
	return 0;
}

struct job_query_ctx {
	struct move_job *j;
	job_step_fn fn;
};

static void job_result(lk_plugin *self, lk_pg *pg, PGresult *r, void *arg)
{
	struct job_query_ctx q = *(struct job_query_ctx *)arg;
	ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;

	(void)self;
	(void)pg;
	free(arg);
	if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
		q.fn(q.j, r);
	else
		job_fail_pg(q.j, r);
}

void job_query(struct move_job *j, const char *sql, int n, const char *const *params, job_step_fn fn)
{
	struct job_query_ctx *q = malloc(sizeof(*q));

	if (!q) {
		job_fail(j, "53200", "out of memory");
		return;
	}
	q->j = j;
	q->fn = fn;
	if (api->pg_query(j->pg, sql, n, params, job_result, q) != 0) {
		free(q);
		job_fail(j, "08006", "%s: the connection to the cloud database broke", j->what);
	}
}

/* NOTICEs and WARNINGs of the procedures (retries, progress) reach the console and the log. */
static void job_notice(void *arg, const PGresult *r)
{
	struct move_job *j = arg;
	const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

	if (!msg)
		return;
	api->result_notice(j->res, msg);
	api->log(M->self, LK_LOG_INFO, "%s: %s", j->what, msg);
}

static void catalog_checked(struct move_job *j, PGresult *r)
{
	if (PQntuples(r) != 1 || strcmp(PQgetvalue(r, 0, 0), "t") != 0) {
		job_fail(j, "55000", "the LokaDB catalog is not installed in the cloud database (or is older than "
			 "this plugin)\nHINT:  Run INSTALL on the lokadb console.");
		return;
	}
	j->cmd->run(j);
}

static void job_connected(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	struct move_job *j = arg;

	(void)self;
	if (!ok) {
		job_fail(j, "08006", "%s: could not connect to the cloud database: %s", j->what,
			 err ? err : "unknown error");
		return;
	}
	PQsetNoticeReceiver(api->pg_conn(pg), job_notice, j);
	if (j->cmd->needs_catalog)
		job_query(j, CATALOG_CHECK_SQL, 0, NULL, catalog_checked);
	else
		j->cmd->run(j);
}

/* "ENABLE TABLE documents BY org" (for messages): name + arguments. */
static char *job_what(const struct move_cmd *c, const char *args)
{
	size_t n = strlen(c->name) + strlen(args) + 2;
	char *s = malloc(n);

	if (s)
		snprintf(s, n, "%s%s%s", c->name, *args ? " " : "", args);
	return s;
}

/* The console callback of every command. */
static int job_start(const struct move_cmd *c, lk_result *res, const char *args)
{
	struct move_job *j = calloc(1, sizeof(*j));

	if (!j || !(j->what = job_what(c, args))) {
		free(j);
		return api->result_error(res, "53200", "out of memory");
	}
	j->cmd = c;
	j->res = res;
	if (c->parse(j, args) != 0) {
		job_free(j);
		return LK_ERROR;
	}
	j->pg = api->pg_connect(M->self, M->cloud, job_connected, j);
	if (!j->pg) {
		job_free(j);
		return api->result_error(res, "08006", "%s: could not start a connection to the cloud database",
					 c->name);
	}
	j->next = M->jobs;
	M->jobs = j;
	return LK_ASYNC;
}

/* One console callback per command (the callback gets no user pointer). */
#define CMD_ENTRY(i) \
	static int cmd_entry_##i(lk_plugin *self, lk_result *res, const char *args) \
	{ (void)self; return job_start(&move_cmds[i], res, args); }
CMD_ENTRY(0)
CMD_ENTRY(1)
CMD_ENTRY(2)
CMD_ENTRY(3)
CMD_ENTRY(4)
CMD_ENTRY(5)
CMD_ENTRY(6)
CMD_ENTRY(7)
CMD_ENTRY(8)
CMD_ENTRY(9)
CMD_ENTRY(10)
CMD_ENTRY(11)
CMD_ENTRY(12)
static const lk_console_fn cmd_entries[] = {
	cmd_entry_0, cmd_entry_1, cmd_entry_2, cmd_entry_3, cmd_entry_4, cmd_entry_5, cmd_entry_6,
	cmd_entry_7, cmd_entry_8, cmd_entry_9, cmd_entry_10, cmd_entry_11, cmd_entry_12,
};

/* ------------------------------------------------------------- init -- */

static int move_init(lk_plugin *self, const lk_api *a)
{
	size_t i;

	api = a;
	if (move_ncmds > (int)(sizeof(cmd_entries) / sizeof(cmd_entries[0]))) {
		a->init_error(self, "more commands than console entries");
		return -1;
	}
	if (!(M = calloc(1, sizeof(*M)))) {
		a->init_error(self, "out of memory");
		return -1;
	}
	M->self = self;
	a->set_data(self, M);
	for (i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		if (a->config_declare(self, settings[i].key, settings[i].def, settings[i].doc) != 0) {
			a->init_error(self, "cannot declare setting %s", settings[i].key);
			return -1;
		}
	for (int k = 0; k < move_ncmds; k++)
		if (a->console_register(self, move_cmds[k].name, move_cmds[k].admin_only, cmd_entries[k],
					move_cmds[k].doc) != 0) {
			a->init_error(self, "console command %s is already taken", move_cmds[k].name);
			return -1;
		}
	if (a->hook(self, LK_HOOK_CONFIG_CHECK, on_config_check, 0) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0) {
		a->init_error(self, "cannot register hooks");
		return -1;
	}
	return 0;
}

/* At exit: the loop does not run any more; connections are freed by the core. */
static void move_fini(lk_plugin *self)
{
	(void)self;
	while (M && M->jobs) {
		struct move_job *j = M->jobs;
		M->jobs = j->next;
		job_free(j);
	}
	if (M) {
		/* the core frees the timers and connections at exit */
		free(M->cloud);
		free(M->org_column);
		free(M->install_sql);
		free(M->install_why);
		free(M);
		M = NULL;
	}
}

LK_PLUGIN("move", "0.1", move_init, move_fini)
