/* SPDX-License-Identifier: ISC */
/*
 * lokadb/plugin.h -- the only header a LokaDB plugin includes.
 *
 * A plugin is a shared object (plugins/NAME/NAME.so) that exports one
 * function, lokadb_plugin(), returning a const descriptor: magic, ABI
 * major/minor, the descriptor's size, name, version, init and fini. Write it
 * with LK_PLUGIN(). The core loads the plugins named by `plugins =` in that
 * order at start with dlopen(RTLD_NOW | RTLD_LOCAL) and never unloads them.
 *
 * init(self, api) receives the core's function table. The table is
 * versioned and append-only: a field is never moved or removed, new fields
 * are added at the end and api->abi_minor grows. A plugin built against a
 * newer minor than the running core is refused; one built against an older
 * minor works, and may test LK_API_HAS(api, field) before using a field
 * that came later.
 *
 * A plugin never links against core symbols and never sees core structs:
 * clients, servers, hook calls and replies are opaque handles read and
 * changed through the table's functions.
 *
 * Everything runs on the core's single event loop. A hook must not block;
 * work that waits (a query to PostgreSQL, a connect) returns LK_ASYNC and
 * finishes from a callback of the same loop (timers, api->pg_*, the
 * plugin's own events on api->event_base()).
 *
 * doc/plugins.md describes every hook with its arguments, results and
 * timing, and walks through an annotated example.
 */
#ifndef LOKADB_PLUGIN_H
#define LOKADB_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LK_PLUGIN_MAGIC 0x4c4b504cu	/* "LKPL" */
#define LK_ABI_MAJOR 1
#define LK_ABI_MINOR 17
#define LK_PLUGIN_SYMBOL "lokadb_plugin"

/* Opaque handles. */
typedef struct lk_plugin lk_plugin;	/* the core's record of one loaded plugin ("self") */
typedef struct lk_client lk_client;	/* a client connection; valid until its CLIENT_CLOSE returns */
typedef struct lk_server lk_server;	/* a server connection; valid until its SERVER_CLOSE returns */
typedef struct lk_event lk_event;	/* the arguments of one hook call; valid during the call
					   (QUERY, ROUTE, CLIENT_STARTUP, AUTH_LOOKUP: until resumed) */
typedef struct lk_result lk_result;	/* a reply being built: a console command's or a query's */
typedef struct lk_timer lk_timer;
typedef struct lk_pg lk_pg;		/* a non-blocking libpq connection on the loop */
typedef struct lk_connect lk_connect;	/* one connection a transport is asked to open */
typedef struct lk_api lk_api;
typedef struct lk_metrics lk_metrics;	/* a /metrics answer being written; valid during the metric's callback */

/* ABI 1.12: a part of a rewritten text (api->query_text_spans) */
typedef struct lk_text_span {
	uint32_t at, len;		/* text sent: bytes [at, at + len) */
	uint32_t client_len;		/* ... stand for this many bytes of the client's text */
	const char *name;		/* a relation named there instead of client_name (NULL: none) */
	const char *client_name;
} lk_text_span;

/*
 * ABI 1.13: relations a plugin's text names where the client's names
 * another (api->tables_new): a partition and its table.
 */
typedef struct lk_table_oid {
	uint32_t oid;			/* the relation the text sent names (a partition) */
	uint32_t client_oid;		/* the one the client's text names (its partitioned table) */
	const char *attnums;		/* "3:4,4:5": its columns whose number differs in client_oid
					 * (a column dropped from the table before the partition
					 * was made), or NULL: the same numbers */
} lk_table_oid;
typedef struct lk_tables lk_tables;	/* the core's: counted references */

struct event_base;			/* libevent */
struct pg_conn;				/* libpq's PGconn */
struct pg_result;			/* libpq's PGresult */

/* Hook results. */
enum lk_rc {
	LK_ERROR = -1,		/* fail: the core sends the ErrorResponse set with api->fail() */
	LK_CONTINUE = 0,	/* next handler, then the core's default */
	LK_HANDLED = 1,		/* decided (or answered); the rest of the chain is skipped */
	LK_ASYNC = 2,		/* the client waits; the plugin calls api->resume() exactly once */
};

/* Hook points. Append only. */
enum lk_hook {
	LK_HOOK_CONFIG_CHECK = 0,	/* [plugin.NAME] values about to be used: veto with LK_ERROR */
	LK_HOOK_CONFIG_APPLY,		/* they are in use now (start and RELOAD); observer */
	LK_HOOK_CLIENT_STARTUP,		/* startup packet read, before authentication; decision */
	LK_HOOK_AUTH_LOOKUP,		/* the secret for a client's user; provider */
	LK_HOOK_QUERY,			/* Query / Parse / Bind of a client flagged with watch_queries */
	LK_HOOK_ROUTE,			/* a client needs a server: pick the pool; decision */
	LK_HOOK_TXN_END,		/* a client's transaction ended (server idle again); observer */
	LK_HOOK_CLIENT_CLOSE,		/* observer */
	LK_HOOK_SERVER_CLOSE,		/* observer */
	LK_HOOK_SHUTDOWN,		/* ABI 1.6: a shutdown begins (signal or console); observer, once */
	LK_HOOK_COUNT
};

/* Log levels for api->log. */
enum lk_log_level { LK_LOG_ERROR = 0, LK_LOG_WARNING, LK_LOG_INFO, LK_LOG_DEBUG };

/* Column types for api->result_columns (PostgreSQL type OIDs). */
#define LK_TYPE_TEXT 25
#define LK_TYPE_INT8 20
#define LK_TYPE_INT4 23
#define LK_TYPE_BOOL 16

typedef int (*lk_hook_fn)(lk_plugin *self, lk_event *ev);
/* A console command: `args` is the text after the command's name, trimmed. */
typedef int (*lk_console_fn)(lk_plugin *self, lk_result *res, const char *args);
/* A transport opens the connection described by `req` (see api->connect_*). */
typedef int (*lk_transport_fn)(lk_plugin *self, lk_connect *req);
typedef void (*lk_timer_fn)(lk_plugin *self, void *arg);
typedef void (*lk_answered_fn)(lk_plugin *self, lk_client *c, void *arg);	/* ABI 1.15 */
/* ok = 1: connected; ok = 0: the connect failed or the connection broke (err says why). */
typedef void (*lk_pg_state_fn)(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg);
/* One call per query with its last result (NULL when the connection broke); freed after the call. */
typedef void (*lk_pg_result_fn)(lk_plugin *self, lk_pg *pg, struct pg_result *res, void *arg);
typedef void (*lk_pg_notify_fn)(lk_plugin *self, lk_pg *pg, const char *channel, const char *payload, void *arg);
/* Write the samples of one registered metric with api->metric_sample (none is fine). */
typedef void (*lk_metric_fn)(lk_plugin *self, lk_metrics *m, void *arg);

/* Metric types for api->metric_register (Prometheus text format 0.0.4). */
enum lk_metric_type {
	LK_METRIC_COUNTER = 0,	/* only grows (resets when lokadb restarts) */
	LK_METRIC_GAUGE = 1,	/* goes up and down */
};

/* What the core did with a message's query_set_var values once it had its
 * server: outcome LK_VARS_KNOWN, LK_VARS_SENT or LK_VARS_SKIPPED; `sent`: bit
 * i set when the i-th query_set_var call of the event went in the prefix. */
typedef void (*lk_vars_fn)(lk_plugin *self, lk_client *c, int outcome, unsigned sent, void *arg);
struct sockaddr;
/* An answer of api->resolve: sa (port set) and its length, or sa NULL and error. */
typedef void (*lk_resolve_fn)(lk_plugin *self, void *arg, const struct sockaddr *sa, int len, const char *error);
enum lk_vars_outcome {
	LK_VARS_SKIPPED = -1,	/* a value differed but nothing could go (cores before ABI 1.8, see query_set_var) */
	LK_VARS_KNOWN = 0,	/* the server already had every value: nothing sent */
	LK_VARS_SENT = 1,	/* a set_config prefix went before the message */
};

/* The descriptor lokadb_plugin() returns. */
struct lk_plugin_desc {
	uint32_t magic;			/* LK_PLUGIN_MAGIC */
	uint16_t abi_major;		/* LK_ABI_MAJOR the plugin was built with */
	uint16_t abi_minor;		/* LK_ABI_MINOR the plugin was built with */
	uint32_t size;			/* sizeof(struct lk_plugin_desc) */
	const char *name;		/* must equal the name in `plugins =` */
	const char *version;		/* shown by SHOW PLUGINS */
	/* Register hooks, settings, commands, services. 0 = ok; otherwise the
	 * core refuses to start, quoting api->init_error()'s text. */
	int (*init)(lk_plugin *self, const lk_api *api);
	void (*fini)(lk_plugin *self);	/* at exit; may be NULL */
};

#if defined(__GNUC__)
#define LK_EXPORT __attribute__((visibility("default")))
#else
#define LK_EXPORT
#endif

/* Declare the plugin (a function definition: no semicolon after it):
 *     LK_PLUGIN("name", "1.0", my_init, my_fini)
 */
#define LK_PLUGIN(NAME, VERSION, INIT, FINI)                                              \
	LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void);                       \
	LK_EXPORT const struct lk_plugin_desc *lokadb_plugin(void)                        \
	{                                                                                 \
		static const struct lk_plugin_desc desc = {                               \
			LK_PLUGIN_MAGIC, LK_ABI_MAJOR, LK_ABI_MINOR,                      \
			(uint32_t)sizeof(struct lk_plugin_desc), NAME, VERSION, INIT, FINI \
		};                                                                        \
		return &desc;                                                             \
	}

/* Does this core's table have `field`? (for fields newer than LK_ABI_MINOR 0) */
#define LK_API_HAS(api, field) \
	((api)->size >= offsetof(struct lk_api, field) + sizeof((api)->field) && (api)->field != NULL)

#if defined(__GNUC__)
#define LK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LK_PRINTF(a, b)
#endif

/*
 * The core's function table. Append only: ABI minor 0 ends at the last
 * field below; later minors add fields after it.
 */
struct lk_api {
	uint32_t size;			/* sizeof(struct lk_api) of the running core */
	uint16_t abi_major, abi_minor;
	const char *core_version;	/* e.g. "0.1.0" */

	/* ---- the plugin itself ---- */
	void (*log)(lk_plugin *self, int level, const char *fmt, ...) LK_PRINTF(3, 4);
	/* The reason init() failed (shown when the core refuses to start). */
	void (*init_error)(lk_plugin *self, const char *fmt, ...) LK_PRINTF(2, 3);
	void (*set_data)(lk_plugin *self, void *data);
	void *(*get_data)(lk_plugin *self);
	const char *(*plugin_name)(lk_plugin *self);

	/* ---- hooks (only in init) ----
	 * Lower priority runs first; equal priorities run in `plugins =` order.
	 * Returns 0, or -1 for an unknown hook. */
	int (*hook)(lk_plugin *self, enum lk_hook hook, lk_hook_fn fn, int priority);

	/* ---- settings of [plugin.NAME] ----
	 * config_declare (only in init): a key the section may hold, its default
	 * (NULL = empty) and a line of documentation for SHOW CONFIG. Keys not
	 * declared are refused with the file and line. */
	int (*config_declare)(lk_plugin *self, const char *key, const char *def, const char *doc);
	/* In CONFIG_CHECK / CONFIG_APPLY: the value about to be used (or the default). */
	const char *(*config_get)(lk_event *ev, const char *key);
	/* In CONFIG_CHECK: refuse `key`'s value; the core reports FILE:LINE and the reason. Returns LK_ERROR. */
	int (*config_error)(lk_event *ev, const char *key, const char *fmt, ...) LK_PRINTF(3, 4);
	/* In CONFIG_CHECK / CONFIG_APPLY: 1 when called for RELOAD or SET, 0 at start. */
	int (*config_reloading)(lk_event *ev);
	/* Anywhere: the value in use (or the default); NULL for an undeclared key. */
	const char *(*setting)(lk_plugin *self, const char *key);

	/* ---- hook arguments ---- */
	enum lk_hook (*ev_hook)(lk_event *ev);
	lk_client *(*ev_client)(lk_event *ev);	/* NULL in CONFIG_* and SERVER_CLOSE */
	lk_server *(*ev_server)(lk_event *ev);	/* TXN_END, SERVER_CLOSE; else NULL */
	/* Set the error LK_ERROR will send (SQLSTATE, message). Returns LK_ERROR. */
	int (*fail)(lk_event *ev, const char *sqlstate, const char *fmt, ...) LK_PRINTF(3, 4);

	/* ---- clients ---- */
	uint64_t (*client_id)(lk_client *c);
	const char *(*client_user)(lk_client *c);
	const char *(*client_database)(lk_client *c);	/* as the client asked for it */
	/* A startup parameter as the client sent it (application_name, options, ...), or NULL. */
	const char *(*client_param)(lk_client *c, const char *name);
	/* The peer's address as text ("127.0.0.1", "unix") and port (0 for unix). */
	const char *(*client_addr)(lk_client *c, char *buf, size_t len, int *port);
	/* CLIENT_STARTUP only: log the client in as another database / user. 0 or -1. */
	int (*client_set_database)(lk_client *c, const char *dbname);
	int (*client_set_user)(lk_client *c, const char *user);
	/* Call the QUERY hook for this client's Query/Parse/Bind messages (on = 1) or not. */
	void (*client_watch_queries)(lk_client *c, int on);
	/* The database of the pool it uses now (after ROUTE / query_route), or NULL before login. */
	const char *(*client_pool_database)(lk_client *c);
	/* 1 while its server is inside a transaction block. */
	int (*client_in_transaction)(lk_client *c);
	/* Per-client slot of this plugin; NULL until set. Free it in CLIENT_CLOSE. */
	void *(*client_ctx)(lk_plugin *self, lk_client *c);
	void (*client_set_ctx)(lk_plugin *self, lk_client *c, void *data);
	/* End an LK_ASYNC hook call: rc is LK_CONTINUE, LK_HANDLED or LK_ERROR. Exactly once. */
	void (*resume)(lk_client *c, int rc);
	/* Same as resume(c, LK_ERROR) with this error. */
	void (*resume_error)(lk_client *c, const char *sqlstate, const char *fmt, ...) LK_PRINTF(3, 4);
	/* Close the client with a FATAL error (sqlstate NULL: no message). */
	void (*client_close)(lk_client *c, const char *sqlstate, const char *msg);

	/* ---- servers ---- */
	uint64_t (*server_id)(lk_server *s);
	const char *(*server_database)(lk_server *s);	/* its pool's database name */
	const char *(*server_user)(lk_server *s);	/* the login user */
	int (*server_backend_pid)(lk_server *s);
	void *(*server_ctx)(lk_plugin *self, lk_server *s);
	void (*server_set_ctx)(lk_plugin *self, lk_server *s, void *data);

	/* ---- AUTH_LOOKUP ---- */
	const char *(*auth_user)(lk_event *ev);
	/* Provide the user's secret (plain, "md5..." or "SCRAM-SHA-256$...") and return LK_HANDLED
	 * (or call it before resume(c, LK_HANDLED)). NULL: no such user. */
	void (*auth_set_secret)(lk_event *ev, const char *secret);

	/* ---- QUERY ----
	 * query_type: 'Q' (simple Query), 'P' (Parse) or 'B' (Bind).
	 * query_sql: the statement text; for Bind, the text of the statement
	 * it binds when that statement was parsed on this connection, else NULL. */
	char (*query_type)(lk_event *ev);
	const char *(*query_sql)(lk_event *ev);
	const char *(*query_statement)(lk_event *ev);	/* P, B: prepared statement name ("" = unnamed) */
	const char *(*query_portal)(lk_event *ev);	/* B: portal name */
	int (*query_nparams)(lk_event *ev);		/* P: declared types; B: values */
	/* B: value i (NULL = SQL NULL), its length and format (0 text, 1 binary). */
	const char *(*query_param)(lk_event *ev, int i, int *len, int *format);
	uint32_t (*query_param_type)(lk_event *ev, int i);	/* P: declared type OID (0 = unspecified) */
	/* Q, P: replace the statement text. 0 or -1. */
	int (*query_rewrite)(lk_event *ev, const char *sql);
	/* B: replace value i with text (NULL = SQL NULL). 0 or -1. */
	int (*query_set_param)(lk_event *ev, int i, const char *value);
	/* Run `sql` (simple Query, result not shown to the client) on the same
	 * server, pipelined right before this message. May be called several
	 * times; the statements run in order. A failing prefix is logged
	 * ("query of the pooler failed"); the message still runs. A simple
	 * Query would end an extended-protocol batch and drop the unnamed
	 * statement, so when the client's server has extended messages without
	 * a Sync outstanding, or the message is a Bind of the unnamed
	 * statement, the core refuses the message (0A000) instead of sending
	 * the prefix: ask for a prefix at a Sync boundary (a Query, or the
	 * Parse that starts a batch). */
	int (*query_prefix)(lk_event *ev, const char *sql);
	/* Run this message (and its transaction) on the pool of `dbname` with
	 * the same user. -1 if there is no such database or the client is in a
	 * transaction on another pool. */
	int (*query_route)(lk_event *ev, const char *dbname);
	/* Answer the message yourself: build rows on the result and return
	 * LK_HANDLED. Q: the core ends with CommandComplete (if not given) and
	 * ReadyForQuery; P/B: the core sends ParseComplete/BindComplete. */
	lk_result *(*query_result)(lk_event *ev);

	/* ---- ROUTE ---- */
	/* The database whose pool will serve the client's next transaction. 0 or -1. */
	int (*route_set)(lk_event *ev, const char *dbname);

	/* ---- replies (console commands and answered queries) ----
	 * types may be NULL (all text). Values are text; NULL = SQL NULL. */
	int (*result_columns)(lk_result *res, int n, const char *const *names, const uint32_t *types);
	int (*result_row)(lk_result *res, const char *const *values);
	int (*result_notice)(lk_result *res, const char *msg);
	/* CommandComplete tag; NULL = "SHOW" on the console, "SELECT n" for queries. */
	int (*result_complete)(lk_result *res, const char *tag);
	/* Fail the command instead (nothing else is sent). Returns LK_ERROR. */
	int (*result_error)(lk_result *res, const char *sqlstate, const char *fmt, ...) LK_PRINTF(3, 4);
	/* End a console command that returned LK_ASYNC. */
	void (*result_done)(lk_result *res);

	/* ---- console ----
	 * `name` is one or two words ("SHOW AGENTS", "MOVE"), matched
	 * case-insensitively at the start of a console command. admin_only: 1
	 * for admin_users only, 0 to allow stats_users. The callback returns
	 * LK_HANDLED, LK_ERROR (result_error) or LK_ASYNC (result_done later). */
	int (*console_register)(lk_plugin *self, const char *name, int admin_only, lk_console_fn fn,
				const char *doc);

	/* ---- transports ----
	 * A [databases] entry with transport=NAME has its server connections
	 * opened by the plugin that registered NAME. The callback returns
	 * LK_HANDLED after connect_ready(), LK_ASYNC when it calls connect_ready()
	 * or connect_failed() later, or LK_ERROR after connect_failed(). */
	int (*transport_register)(lk_plugin *self, const char *name, lk_transport_fn fn);
	const char *(*connect_host)(lk_connect *req);	/* [databases] host (may be NULL) */
	int (*connect_port)(lk_connect *req);
	const char *(*connect_dbname)(lk_connect *req);	/* the server-side database name */
	const char *(*connect_database)(lk_connect *req);	/* the [databases] entry's name */
	int (*connect_is_cancel)(lk_connect *req);	/* 1: for a CancelRequest, not a login */
	lk_server *(*connect_server)(lk_connect *req);	/* NULL for a cancel */
	/* Answer a request exactly once: hand over a connected stream socket
	 * (the core owns it from now on; if the server went away meanwhile the
	 * core closes it), or fail it. The request is freed by the answer. */
	void (*connect_ready)(lk_connect *req, int fd);
	void (*connect_failed)(lk_connect *req, const char *msg);

	/* ---- services between plugins ---- */
	int (*service_publish)(lk_plugin *self, const char *name, const void *table);
	const void *(*service_lookup)(const char *name);

	/* ---- the loop ---- */
	struct event_base *(*event_base)(void);
	uint64_t (*now_usec)(void);		/* monotonic clock */
	lk_timer *(*timer_add)(lk_plugin *self, uint64_t usec, int repeat, lk_timer_fn fn, void *arg);
	void (*timer_cancel)(lk_timer *t);

	/* ---- non-blocking libpq on the loop ---- */
	lk_pg *(*pg_connect)(lk_plugin *self, const char *conninfo, lk_pg_state_fn fn, void *arg);
	/* Queue a query (parameters as text, may be 0/NULL); results come in order. 0 or -1. */
	int (*pg_query)(lk_pg *pg, const char *sql, int nparams, const char *const *params,
			lk_pg_result_fn fn, void *arg);
	void (*pg_on_notify)(lk_pg *pg, lk_pg_notify_fn fn, void *arg);
	struct pg_conn *(*pg_conn)(lk_pg *pg);	/* for reading with libpq; do not free it */
	void (*pg_close)(lk_pg *pg);		/* pending callbacks are not called */

	/* ---- ABI 1.1 ---- */
	/* Server affinity: when the client next needs a server, the pool prefers
	 * the home server of `key` (e.g. an organization id: the pool assigns
	 * each new key to the server index with the fewest keys, for good), else
	 * an idle server that served `key` lately, else an idle one. While
	 * other clients wait, it waits for its home server instead, until more
	 * than half of the waiting clients want the same home (an uneven load),
	 * its home server has served one client for 10 ms, or 50 ms have
	 * passed; a server that comes free goes to a waiting client of its home
	 * first, then to one whose key it served lately (doc/plugins.md). "Lately":
	 * the key is one of the last max_per_server distinct keys (1..32) the
	 * server served. key NULL: no preference. */
	void (*client_set_affinity)(lk_client *c, const char *key, int max_per_server);

	/* ---- ABI 1.2 ---- */
	/* Accept a startup parameter the core does not know, as a key of the
	 * startup packet or as `-c NAME=VALUE` in `options` (e.g. "lokadb.org"),
	 * as if it were listed in ignore_startup_parameters: the login is not
	 * refused, the value is not sent to the server, and the plugin reads it
	 * with client_param() (the key, or "options"). Any time; 0 or -1. */
	int (*startup_parameter)(lk_plugin *self, const char *name);

	/* ---- ABI 1.3 ---- */
	/* B only, when query_sql() is known: parse the statement this Bind
	 * binds again with `sql` (same name, same declared parameter types)
	 * right before the Bind, pipelined, its replies hidden; the statement
	 * keeps the new text. For decisions that need the parameter values,
	 * such as addressing a statement to the partition of the organization
	 * given as $1. With the core's prepared statements (transaction
	 * pooling, max_prepared_statements) the name then stands for a cached
	 * statement of the new text. A re-parse that PostgreSQL skips (an
	 * error earlier in its batch) is sent again before the statement's
	 * next Bind, so query_sql() is what the server runs. 0 or -1. */
	int (*query_reparse)(lk_event *ev, const char *sql);

	/* ---- ABI 1.4 ---- */
	/* Add a metric to the Prometheus endpoint (metrics_listen). It appears
	 * as `lokadb_<plugin name>_<name>` with `help` and `type` (enum
	 * lk_metric_type); each scrape calls fn, which writes the metric's
	 * samples with metric_sample(). `name` is letters, digits and `_`,
	 * not starting with a digit. Any time, also when metrics_listen is
	 * off (then fn is never called). 0, or -1 (bad name, taken, out of
	 * memory). */
	int (*metric_register)(lk_plugin *self, const char *name, int type, const char *help,
			       lk_metric_fn fn, void *arg);
	/* One sample of the metric being written: `labels` is NULL or a
	 * NULL-terminated list of name, value pairs ({"org", "42", NULL});
	 * the core escapes the values. A sample with an invalid label name
	 * is left out. Only inside the metric's fn. */
	void (*metric_sample)(lk_metrics *m, const char *const *labels, double value);

	/* ---- ABI 1.5 ---- */
	/* Q, P, B: the server session this message runs on must have the
	 * setting `name` (a custom or PostgreSQL GUC, e.g. "lokadb.org") =
	 * `value` when the message runs. The core tracks, per server
	 * connection, the values such prefixes gave it, and once it has picked
	 * the server it sends `SET name = 'value'; ...` (one hidden simple
	 * Query for all the event's values, as query_prefix; `SELECT
	 * set_config(name, value, false), ...` for a name SET cannot take as
	 * written) only for the values that server is not known to have; a
	 * plugin that called query_vars_inline gets them in front of its Query
	 * instead. A value is known only after it was set outside a
	 * transaction block without
	 * error (inside a block it may be rolled back); a server forgets every
	 * value when the pooler sends it any other query of its own
	 * (server_reset_query, connect_query, a check, a parameter SET, a
	 * query_prefix) and a new server knows none. Where a simple Query may
	 * not go (extended-protocol messages without a Sync outstanding, a Bind
	 * of the unnamed statement), a core of ABI 1.8 or later
	 * (api->abi_minor >= 8) sends them as hidden extended-protocol
	 * messages of its own (statement and portal "lokadb_hidden_ext":
	 * Close, Parse, Bind, Execute, Close, Close; one `SET` each, or the
	 * SELECT) right before the message, LK_VARS_SENT; they are known once
	 * the client's batch gets a ReadyForQuery I with no error (and no
	 * ROLLBACK, which may undo them) since. An
	 * older core sent nothing there and the message ran as is
	 * (LK_VARS_SKIPPED). query_prefix refuses such a message instead.
	 * ABI 1.9: for a Parse or Bind, only when a plugin called
	 * query_vars_inline for it (else LK_VARS_SKIPPED there: VACUUM and
	 * the like fail behind another Execute of a batch), and then also
	 * before one that starts a batch.
	 * value NULL: this message itself changes `name` (SET, RESET, DISCARD
	 * ALL ...): the server's value is forgotten. At most 8 names per event;
	 * name at most 63 bytes, value at most 255, neither with a backslash or
	 * a control character. Returns the value's bit number in the `sent`
	 * of query_on_vars (0..7; a name given again keeps its number), or -1. */
	int (*query_set_var)(lk_event *ev, const char *name, const char *value);
	/* Q, P, B: fn(self, client, outcome, sent, arg) is called once the core
	 * has decided the event's query_set_var values (right before the
	 * message goes to the server, on the loop); not called when the
	 * message never reaches a server (refused, client gone). One per
	 * plugin and event. 0 or -1. */
	int (*query_on_vars)(lk_plugin *self, lk_event *ev, lk_vars_fn fn, void *arg);

	/* ---- ABI 1.6 ---- */
	/* Resolve `host` (a name or a numeric address) to one address with
	 * the core's resolver: c-ares on the loop, the dns_* settings and the
	 * cache SHOW DNS_HOSTS lists. fn(self, arg, sa, len, error) is called
	 * exactly once, on the loop, maybe before resolve() returns (numeric
	 * or cached); sa carries `port`. 0, or -1 (bad arguments: fn is not
	 * called). */
	int (*resolve)(lk_plugin *self, const char *host, int port, lk_resolve_fn fn, void *arg);
	/* Drop the answers still pending for arg: their fn is not called. */
	void (*resolve_cancel)(lk_plugin *self, void *arg);

	/* ---- ABI 1.7 ---- */
	/* Q (P and B: ABI 1.9, see below): the message is one statement
	 * that may run in an implicit transaction block (a SELECT, INSERT,
	 * UPDATE or DELETE; not VACUUM,
	 * CREATE DATABASE, COMMIT ...). The query_set_var values its server
	 * lacks then go in the same Query, in front of the statement
	 * (`SET name = 'value'; ` ... then the client's text): one statement
	 * less for PostgreSQL and one reply less for the pooler. The core hides
	 * their CommandCompletes and moves the position of an error or a
	 * notice back by the prefix's length, so the client sees what it would
	 * without them; if the
	 * statement fails, the values are rolled back with it (the core then
	 * does not take them as known). Names must be SQL identifiers
	 * (`lokadb.org`) and values printable ASCII, else the values go in a
	 * separate hidden Query as without this call. 0 or -1. */
	int (*query_vars_inline)(lk_event *ev);

	/* ---- ABI 1.8: no new field. query_set_var values also go where no
	 * simple Query may (hidden extended-protocol messages, see
	 * query_set_var): test api->abi_minor >= 8. ---- */

	/* ---- ABI 1.9: no new field. query_vars_inline also takes a Parse or
	 * Bind (before 1.9 it returned -1 for them): the statement may share
	 * its transaction with the values and run behind other messages of a
	 * batch. The core then sends them as hidden extended-protocol messages
	 * in front of it wherever it is (see query_set_var), also at the start
	 * of a batch instead of a hidden Query of their own, which costs
	 * PostgreSQL a transaction and a ReadyForQuery more. If the statement
	 * fails they are rolled back with it (not taken as known). Not when
	 * the event also has a query_prefix. Without the call, a Parse or Bind
	 * inside a batch gets no values (LK_VARS_SKIPPED). ---- */

	/* ---- ABI 1.10 ---- */
	/* Do not hand the server connection `server_id` (api->server_id) to a
	 * client again: idle in its pool it closes now; linked to a client,
	 * logging in or running a reset, it is marked close_needed as RECONNECT
	 * marks it (SHOW SERVERS) and closes when released. For a transport
	 * whose carrier is going away (a tunnel agent's GOAWAY): the pool opens
	 * new connections instead of reusing the old ones. `why` is the close
	 * reason logged. 1 (closed now), 0 (marked), or -1 when no open server
	 * connection has that id. */
	int (*server_retire)(uint64_t server_id, const char *why);

	/* ---- ABI 1.11 ---- */
	/* TXN_END only: 1 when the transaction that ended was rolled back by
	 * an error: the last batch (the messages answered by the
	 * ReadyForQuery that made the server idle) had an ErrorResponse, or it
	 * ended a failed transaction block (COMMIT or ROLLBACK after an
	 * error). So what it SET was undone by PostgreSQL. 0 when it ended
	 * without, -1 for other events. A client that pipelines several
	 * Sync-terminated batches gets one TXN_END for the last of them. */
	int (*ev_txn_failed)(lk_event *ev);

	/* ---- ABI 1.12 ---- */
	/* Q, P, after query_rewrite: where the text sent differs from the
	 * client's, `n` spans in text order (at most 64), so that an error or
	 * a notice PostgreSQL reports on the text sent reaches the client
	 * about its own text. Each span is text-sent[at, at + len), which
	 * stands for `client_len` bytes of the client's text; every byte
	 * outside the spans is the client's, in order (the core checks it,
	 * and keeps no spans when it is not so). An error's position (P) in
	 * a span moves to the start of the client's bytes, after one moves
	 * by the spans before it. `name`, when not NULL, is a relation the
	 * text sent names in that span instead of the client's `client_name`:
	 * in an error of class 42 (the statement's analysis, an unknown
	 * column ..., or a privilege), the word `name` (quoted or not) in the
	 * message, detail or hint and a table field (t) equal to it become
	 * the client's. 0 or
	 * -1 (another event, no rewrite, bad spans). */
	int (*query_text_spans)(lk_event *ev, const lk_text_span *spans, int n);

	/* ---- ABI 1.13 ---- */
	/* A set of relations to report as others (lk_table_oid: at most one
	 * entry per oid; the attnums are copied), with one reference; NULL
	 * when out of memory or bad (an attnums text that is not pairs of
	 * numbers). Built once, passed to many statements. */
	lk_tables *(*tables_new)(const lk_table_oid *t, int n);
	void (*tables_release)(lk_tables *t);	/* accepts NULL */
	/* Q, P, B (decided): the RowDescriptions of this statement (a Query's,
	 * a Describe's of the statement Parsed, or of the portal Bound) name
	 * t's client_oid and its column numbers where PostgreSQL names t's oid,
	 * as they would have for the client's text. A Parse's holds for the
	 * statement's later Describes (until the name is Parsed again or
	 * Closed), a Bind's for its portal's; a Bind without it has its
	 * statement's. The core takes its own reference. 0 or -1. */
	int (*query_result_tables)(lk_event *ev, lk_tables *t);

	/* ---- ABI 1.14 ---- */
	/* QUERY (Q, P, B): 1 when the client sent this message past a Sync or
	 * a Query of its own that its server has not answered yet (it
	 * pipelines: what its earlier batches do is not known yet), 0 when
	 * not, -1 for other events. */
	int (*ev_past_sync)(lk_event *ev);

	/* ---- ABI 1.15 ---- */
	/* Call fn(self, c, arg) once every Sync and Query client `c` has sent
	 * to its server so far is answered, and with them every message
	 * before them (what a QUERY hook holds with LK_ASYNC is not sent; the
	 * messages sent after the last Sync may be unanswered: PostgreSQL
	 * answers them at a Sync still to come): from the event loop, never
	 * inside this call, after the TXN_END of the last of them if it ended
	 * a transaction (a server in COPY FROM STDIN, which waits for the
	 * client's data, counts as having answered). 1: nothing is unanswered
	 * now (ev_past_sync is 0) and
	 * fn is not called; 0: fn will be, unless the client closes first
	 * (CLIENT_CLOSE instead); -1: bad arguments. One waiter per plugin and
	 * client: a second call replaces the first. (ABI 1.15 cores answered
	 * -1 when the client had sent messages since its last Sync.) */
	int (*client_on_answered)(lk_plugin *self, lk_client *c, lk_answered_fn fn, void *arg);
	/* QUERY (Q, P, B): tell at TXN_END whether this message's transaction
	 * was rolled back (ev_marked_txn_failed), whatever batches the client
	 * sent behind it. */
	void (*query_mark_txn)(lk_event *ev);
	/* TXN_END: 1 when the transaction of a message marked with
	 * query_mark_txn ended rolled back by an error (as ev_txn_failed says
	 * for the last batch) since the previous TXN_END, 0 when not, -1 for
	 * other events. */
	int (*ev_marked_txn_failed)(lk_event *ev);

	/* ---- ABI 1.16 ---- */
	/* QUERY (B): 1 when the statement text query_sql gives comes from (or
	 * was taken off by) a Parse, Close or Query of the client's that its
	 * server has not answered and that lies in an earlier batch than this
	 * Bind: an error there may yet make PostgreSQL skip or refuse it, and
	 * bind another text or none (client_on_answered tells when the answer
	 * came; query_sql then gives the server's). 0 when not, -1 for other
	 * events. */
	int (*query_stmt_unsettled)(lk_event *ev);

	/* ---- ABI 1.17 ---- */
	/* QUERY (B): how many parameter types the Parse of the statement it
	 * binds declared (0: none), -1 when query_sql() is NULL and for other
	 * events. PostgreSQL counts the statement's parameters as the larger
	 * of this and the highest $n of its text, and refuses a Bind with
	 * another number of values (08P01) before anything else. */
	int (*query_stmt_declared)(lk_event *ev);
};

#ifdef __cplusplus
}
#endif

#endif
