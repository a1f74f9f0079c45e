/* SPDX-License-Identifier: ISC */
/*
 * move.h -- what the two files of the move plugin share.
 *
 * move.c      the plugin: [plugin.move] settings, the SQL files INSTALL runs,
 *             the set of busy tables, and jobs: one console command, one
 *             connection to the cloud database, a chain of queries.
 * move_cmd.c  the console commands: argument parsing, the queries each one
 *             runs, and the replies.
 *
 * A job lives from the console callback until job_finish(): it owns its
 * lk_pg connection, its busy keys and its lk_result, and ends them all there
 * (result_done exactly once). Every query result reaches a job_step_fn only
 * when it succeeded; an error or a broken connection ends the job with the
 * error (after the command's cleanup query, if it has one).
 */
#ifndef LOKADB_MOVE_H
#define LOKADB_MOVE_H

#include <lokadb/plugin.h>

#include <libpq-fe.h>

#define MOVE_MAX_ARGS 6	/* CREATE SITE: name, database, host, port, user, password */
#define MOVE_MAX_BUSY 64	/* busy keys one job may hold (ISOLATE ORG: every LokaDB table) */

struct move_job;
struct move_cmd;

/* A successful query result of a job's chain. */
typedef void (*job_step_fn)(struct move_job *j, PGresult *r);

struct move_job {
	const struct move_cmd *cmd;
	lk_result *res;
	lk_pg *pg;
	char *arg[MOVE_MAX_ARGS];	/* parsed arguments (NULL when absent) */
	char *busy[MOVE_MAX_BUSY];	/* keys this job holds in the busy set */
	int nbusy;
	char *what;			/* "ENABLE TABLE documents": for messages and logs */
	char *err_state, *err_msg;	/* the error to end with after the cleanup query */
	/* MOVE ORG: the connection to the site database (through lokadb's
	 * listener, like postgres_fdw), and what undoes the site's part */
	lk_pg *site;
	int site_connecting;		/* 1 until the site connection is up */
	int site_made;			/* 1 once the site's tables were created */
	int site_broken;		/* 1: the site connection broke (the cloud one may be fine) */
	char *site_undo;		/* SQL that drops the site's (empty) tables */
	char *site_ddl;			/* SQL that creates them */
	job_step_fn site_next;		/* what to call once the site connection is up */
	struct move_job *next;		/* the plugin's list of running jobs */
};

/* One console command. */
struct move_cmd {
	const char *name;		/* "ENABLE TABLE" */
	int admin_only;
	const char *usage;		/* "ENABLE TABLE name [BY column]" */
	int nargs_min, nargs_max;
	int needs_catalog;		/* 1: refuse with 55000 until INSTALL ran */
	/* Parse `args` into j->arg[]; 0, or -1 after result_error(). */
	int (*parse)(struct move_job *j, const char *args);
	/* Connected (and the catalog checked): send the first query. */
	void (*run)(struct move_job *j);
	/* After an error: a query that cleans up (NULL: none), with arg[0] as $1. */
	const char *cleanup_sql;
	const char *doc;
};

extern const lk_api *move_api;
extern const struct move_cmd move_cmds[];
extern const int move_ncmds;

/* ---- move.c: for the commands ---- */

/* Queue `sql` with text parameters; `fn` gets its result if it succeeded. */
void job_query(struct move_job *j, const char *sql, int n, const char *const *params, job_step_fn fn);
/* End the job: reply sent (result_done), connection closed, busy keys freed. */
void job_finish(struct move_job *j);
/* End the job with an error (goes through the command's cleanup query). */
void job_fail(struct move_job *j, const char *sqlstate, const char *fmt, ...) LK_PRINTF(3, 4);
/* Mark `key` busy for this job; 0, or -1 after failing the job with 55006. */
int job_take(struct move_job *j, const char *key);
/* The settings in use. */
const char *move_org_column(void);
int move_lock_timeout_ms(void);
int move_lock_retries(void);
/* Open the job's connection to a site (MOVE ORG); 0, or -1 after failing the job. */
int job_site_connect(struct move_job *j, const char *conninfo, job_step_fn connected);
/* Queue `sql` on the site connection; `fn` gets its result if it succeeded
 * (an error fails the job with the site's message). */
void job_site_query(struct move_job *j, const char *sql, job_step_fn fn);
/* The text INSTALL runs (NULL if the SQL files could not be read; *why says why). */
const char *move_install_sql(const char **why);

/* ---- move_cmd.c: argument parsing shared by the commands ---- */

/* Split console arguments into tokens: words (kept as written, with any
 * "double-quoted" parts, for PostgreSQL's parse_ident) and 'strings' (quotes
 * removed, '' read as '). Returns the number of tokens (at most max), or -1
 * on an unterminated quote or too many tokens. Tokens are malloc'ed;
 * quoted[i] says whether token i was a 'string'. */
int move_tokens(const char *args, char **tok, int *quoted, int max);

#endif
