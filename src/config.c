/* SPDX-License-Identifier: ISC */
/*
 * config.c -- loading, checking, changing and documenting LokaDB's settings.
 *
 * One typed row per setting (config_settings[]) drives everything: the ini
 * loader, defaults, the console's SET and SHOW CONFIG, and doc/config.md.
 * Defaults live only in that table. The [databases] and [users] options have
 * their own small key tables (db_keys[], user_keys[]), and the PgBouncer
 * settings we refuse are listed in pgb_unsupported[].
 *
 * Owns: every `struct lk_config` it returns and every string inside one.
 * Nothing here has mutable global state; the tables are constant.
 *
 * Invariants callers rely on:
 *   - config_load() either returns a fully checked object or NULL with
 *     "FILE:LINE: reason" in err; it never returns a partly loaded object.
 *   - config_set() changes nothing when it fails (check, then apply).
 *   - config_format() output is always accepted back by config_set().
 *
 * The ini syntax is inih's, fed through our own reader (loader_read()), which
 *   - counts physical lines, so messages can name the line (Debian's inih is
 *     built without line numbers in the handler; inih calls the handler for a
 *     line right after reading it, so the reader's count is the handler's);
 *   - strips leading blanks, so an indented line is never taken for one of
 *     inih's multi-line continuations (PgBouncer has none);
 *   - passes lines longer than inih's buffer (200 bytes) by handing inih a
 *     short stand-in value and keeping the real one (see loader_long_line()).
 * inih stops a value at " ;" (inline comment), as PgBouncer's parser does not;
 * quote such values or avoid " ;" in them.
 *
 * To add a setting: its field in struct lk_config (config.h); a row here in
 * alphabetical order (SHOW CONFIG lists them in table order) whose default
 * text is exactly what config_format() prints for it; a real doc line; then
 * bump SETTINGS_IN_STRUCT in test/unit/test_config.c and regenerate
 * doc/config.md.
 *
 * INTERFACE ROUTINES
 *	config_load		read an ini file (and its auth_file)
 *	config_defaults		an object with every default
 *	config_free		release an object
 *	config_find		a setting's row by name or alias
 *	config_parse_value	check a value without storing it
 *	config_set		console SET
 *	config_format		a value as text (SHOW CONFIG)
 *	config_find_db/_user/_auth, config_list_has	lookups
 *	config_write_markdown	doc/config.md
 */
#include "config.h"
#include "hba.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OFF(field)	offsetof(struct lk_config, field)
#define COUNT_MAX	INT32_MAX
#define TIME_MAX	((int64_t)INT32_MAX * USEC)	/* about 68 years */
#define PORT_MAX	65535
#define MSG_MIN		1024			/* a startup packet must fit */
#define MSG_MAX		INT32_MAX		/* the protocol's length field */
#define PKT_BUF_MIN	1024
#define PKT_BUF_MAX	(64 * 1024 * 1024)
#define SOCKET_MODE_MAX	0777
#define DEFAULT_DB_PORT	5432
#define LONG_MARK	"\x1f"	/* stand-in value for an over-long line */
#define REASON_LEN	512
#define FRAC_DIGITS	6			/* microseconds of a second */

static const char *const pool_mode_names[] = { "session", "transaction", "statement", NULL };
static const char *const auth_type_names[] = { "any", "trust", "plain", "md5", "scram-sha-256", "cert", "hba", NULL };
static const char *const sslmode_names[] = { "disable", "allow", "prefer", "require", "verify-ca", "verify-full", NULL };

/* ---------------------------------------------------------------------------
 * The settings table, in alphabetical order
 * ------------------------------------------------------------------------- */

#define INT_ROW(n, def, lo, hi, rl, doc) { #n, CF_INT, OFF(n), def, lo, hi, rl, NULL, doc }
#define BOOL_ROW(n, def, rl, doc) { #n, CF_BOOL, OFF(n), def, 0, 0, rl, NULL, doc }
#define STR_ROW(n, def, rl, doc) { #n, CF_STR, OFF(n), def, 0, 0, rl, NULL, doc }
#define TIME_ROW(n, def, rl, doc) { #n, CF_TIME, OFF(n), def, 0, TIME_MAX, rl, NULL, doc }
#define ENUM_ROW(n, def, names, doc) { #n, CF_ENUM, OFF(n), def, 0, 0, true, names, doc }

const struct cf_setting config_settings[] = {
	STR_ROW(admin_users, NULL, true,
		"Users allowed to run every admin console command (comma-separated; `*` = any user)."),
	BOOL_ROW(application_name_add_host, "0", true,
		 "Append the client's address and port to application_name when it logs in."),
	STR_ROW(auth_dbname, NULL, true,
		"Database auth_query runs in (empty: the database the client asked for); a [databases] entry's auth_dbname overrides it."),
	STR_ROW(auth_file, NULL, true,
		"File of `\"user\" \"secret\"` lines; a relative path is relative to the ini file's directory."),
	STR_ROW(auth_hba_file, NULL, true,
		"Host-based access rules used when auth_type = hba (PgBouncer's subset of pg_hba.conf; read at start and on RELOAD)."),
	STR_ROW(auth_query, "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END "
		"FROM pg_authid WHERE rolname=$1 AND rolcanlogin", true,
		"Query that returns (user, secret) for a user not in auth_file, run as auth_user; a [databases] entry's auth_query overrides it."),
	ENUM_ROW(auth_type, "md5", auth_type_names,
		 "How clients prove who they are: any, trust, plain, md5, scram-sha-256, cert (TLS client certificate "
		 "whose CN is the user name) or hba (per auth_hba_file rule)."),
	STR_ROW(auth_user, NULL, true,
		"User that runs auth_query (its password in auth_file); a [databases] entry's auth_user overrides it."),
	TIME_ROW(autodb_idle_timeout, "3600", true,
		 "Close the server connections of a database made from the `*` entry once no client has "
		 "used it for this long (min_pool_size does not refill it until a client comes back; 0 = never)."),
	TIME_ROW(cancel_wait_timeout, "10", true,
		 "Drop a cancel request that has not been passed on within this time: one waiting for a slot "
		 "towards a [peers] member, or whose connection to the server or peer has not finished (0 = no limit)."),
	TIME_ROW(client_idle_timeout, "0", true,
		 "Close client connections idle for longer than this (0 = never); [users] may override it."),
	TIME_ROW(client_login_timeout, "30", true,
		 "Close a client that has not finished logging in within this time (0 = never)."),
	STR_ROW(client_tls_ca_file, NULL, true,
		"CA certificates that client certificates are checked against (client_tls_sslmode verify-ca / verify-full)."),
	STR_ROW(client_tls_cert_file, NULL, true,
		"Certificate (chain) lokadb presents to clients; PEM."),
	STR_ROW(client_tls_ciphers, "default", true,
		"TLS 1.2 cipher list for clients (OpenSSL syntax; `default` = OpenSSL's)."),
	STR_ROW(client_tls_key_file, NULL, true,
		"Private key of client_tls_cert_file; PEM."),
	STR_ROW(client_tls_protocols, "secure", true,
		"TLS versions offered to clients: `secure` (= tlsv1.2,tlsv1.3), `all`, or a list of tlsv1.2, tlsv1.3."),
	ENUM_ROW(client_tls_sslmode, "disable", sslmode_names,
		 "TLS with clients: disable (SSLRequest answered N), allow/prefer (TLS when the client asks), "
		 "require (plain connections refused), verify-ca/verify-full (also a client certificate signed by client_tls_ca_file)."),
	INT_ROW(default_pool_size, "20", 0, COUNT_MAX, true,
		"Server connections per database and user pair, unless the database or user sets pool_size."),
	BOOL_ROW(disable_pqexec, "0", false,
		 "Refuse the simple query protocol, which can carry several statements in one message: "
		 "a client that sends a Query message is closed with `PQexec disallowed` (08P01). The console keeps it."),
	TIME_ROW(dns_max_ttl, "15", true,
		 "How long a successful DNS lookup is cached."),
	TIME_ROW(dns_nxdomain_ttl, "15", true,
		 "How long a failed (NXDOMAIN) DNS lookup is cached."),
	TIME_ROW(idle_transaction_timeout, "0", true,
		 "Close a client that stays idle inside a transaction for longer than this (0 = never); [users] may override it."),
	STR_ROW(ignore_startup_parameters, NULL, true,
		"Startup parameters accepted and dropped instead of refused (comma-separated)."),
	STR_ROW(listen_addr, NULL, false,
		"TCP addresses to listen on (comma-separated; `*` = all); empty = unix socket only."),
	INT_ROW(listen_backlog, "128", 1, COUNT_MAX, false,
		"Backlog of not yet accepted connections passed to listen(2)."),
	INT_ROW(listen_port, "6432", 1, PORT_MAX, false,
		"TCP port; also names the unix socket (`.s.PGSQL.PORT`)."),
	BOOL_ROW(log_connections, "1", true,
		 "Log every successful client login."),
	BOOL_ROW(log_disconnections, "1", true,
		 "Log every client disconnection with its reason."),
	BOOL_ROW(log_pooler_errors, "1", true,
		 "Log the errors the pooler itself sends to clients."),
	BOOL_ROW(log_stats, "1", true,
		 "Log aggregated traffic statistics every stats_period."),
	STR_ROW(logfile, NULL, true,
		"File to append the log to, besides standard error; empty = none."),
	INT_ROW(max_client_conn, "1000", 1, COUNT_MAX, true,
		"Most client connections accepted at once."),
	INT_ROW(max_db_client_connections, "0", 0, COUNT_MAX, true,
		"Most client connections per database over all its users (0 = unlimited); [databases] may override it."),
	INT_ROW(max_db_connections, "0", 0, COUNT_MAX, true,
		"Most server connections per database over all its pools (0 = unlimited)."),
	{ "max_message_bytes", CF_SIZE, OFF(max_message_bytes), "268435456", MSG_MIN, MSG_MAX, true, NULL,
	  "Largest protocol message accepted from a client (PgBouncer: max_packet_size)." },
	INT_ROW(max_prepared_statements, "200", 0, COUNT_MAX, true,
		"Protocol-level named prepared statements kept per server connection in transaction and statement "
		"pooling (0 = off: names pass through); a lower value applies as servers evict."),
	INT_ROW(max_user_client_connections, "0", 0, COUNT_MAX, true,
		"Most client connections per user over all its databases (0 = unlimited); [users] may override it."),
	INT_ROW(max_user_connections, "0", 0, COUNT_MAX, true,
		"Most server connections per user over all its pools (0 = unlimited)."),
	STR_ROW(metrics_listen, NULL, false,
		"`host:port` of a Prometheus text endpoint served at `/metrics` (e.g. `127.0.0.1:9127`); empty = off."),
	INT_ROW(min_pool_size, "0", 0, COUNT_MAX, true,
		"Keep at least this many server connections open in every pool."),
	INT_ROW(peer_id, "0", 0, PEER_ID_MAX, false,
		"This process's id in its `[peers]` group, encoded in the cancel keys it hands out (0 = peering off)."),
	STR_ROW(pidfile, NULL, false,
		"File to write the process id to; empty = none."),
	INT_ROW(pkt_buf, "4096", PKT_BUF_MIN, PKT_BUF_MAX, false,
		"Accepted for PgBouncer compatibility, no effect: lokadb reads up to 16 kB at a time and "
		"buffers whole messages only where it must (max_message_bytes bounds them)."),
	STR_ROW(plugin_dir, NULL, false,
		"Directory plugins are loaded from; empty = the compiled-in plugin directory."),
	STR_ROW(plugins, NULL, false,
		"Plugins to load at start-up, in order (names separated by spaces or commas)."),
	ENUM_ROW(pool_mode, "session", pool_mode_names,
		 "When a server connection goes back to the pool: after each session, transaction or statement."),
	TIME_ROW(query_timeout, "0", true,
		 "Close a client whose query runs for longer than this, with its server connection (0 = never); "
		 "[users] may override it."),
	TIME_ROW(query_wait_notify, "5", true,
		 "Send a client whose query has waited this long for a server connection a NOTICE, once per wait, "
		 "as PgBouncer: `No server connection available in postgres backend, client being queued` (0 = never)."),
	TIME_ROW(query_wait_timeout, "120", true,
		 "Close a client whose query waited this long for a server connection (0 = wait forever); "
		 "[databases] and [users] may override it."),
	INT_ROW(reserve_pool_size, "0", 0, COUNT_MAX, true,
		"Extra server connections a pool may open once a client has waited reserve_pool_timeout."),
	TIME_ROW(reserve_pool_timeout, "5", true,
		 "How long a client waits before the reserve pool may be used for it."),
	TIME_ROW(server_check_delay, "30", true,
		 "Run server_check_query on a pooled connection unused for longer than this before reuse."),
	STR_ROW(server_check_query, "select 1", true,
		"Query that checks an idle server connection still works before it is reused."),
	TIME_ROW(server_connect_timeout, "15", true,
		 "Give up connecting to and logging in to a server after this long."),
	BOOL_ROW(server_fast_close, "0", true,
		 "In session mode, close a server connection that RECONNECT or a RELOAD changing its database marked, "
		 "at the end of its current transaction instead of when its client leaves."),
	TIME_ROW(server_idle_timeout, "600", true,
		 "Close server connections idle in the pool for longer than this (0 = never)."),
	TIME_ROW(server_lifetime, "3600", true,
		 "Close a server connection older than this when it is next released (0 = never)."),
	TIME_ROW(server_login_retry, "15", true,
		 "Wait this long before trying a server again after a failed connect or login."),
	STR_ROW(server_reset_query, "DISCARD ALL", true,
		"Query run on a server connection when a session-mode client releases it."),
	BOOL_ROW(server_reset_query_always, "0", true,
		 "Run server_reset_query in every pool mode, not only in session mode."),
	STR_ROW(server_tls_ca_file, NULL, true,
		"CA certificates the server's certificate is checked against (server_tls_sslmode verify-ca / verify-full)."),
	STR_ROW(server_tls_cert_file, NULL, true,
		"Client certificate lokadb presents to PostgreSQL (optional); PEM."),
	STR_ROW(server_tls_ciphers, "default", true,
		"TLS 1.2 cipher list towards PostgreSQL (OpenSSL syntax; `default` = OpenSSL's)."),
	STR_ROW(server_tls_key_file, NULL, true,
		"Private key of server_tls_cert_file; PEM."),
	STR_ROW(server_tls_protocols, "secure", true,
		"TLS versions towards PostgreSQL: `secure` (= tlsv1.2,tlsv1.3), `all`, or a list of tlsv1.2, tlsv1.3."),
	ENUM_ROW(server_tls_sslmode, "prefer", sslmode_names,
		 "TLS to PostgreSQL over TCP, as libpq's sslmode: disable, allow/prefer (TLS when the server offers it), "
		 "require (no plaintext), verify-ca (and a certificate signed by server_tls_ca_file), verify-full (and the host name)."),
	BOOL_ROW(so_reuseport, "0", false,
		 "Set SO_REUSEPORT on TCP listening sockets so several processes share the port; each needs its own unix_socket_dir (or none)."),
	TIME_ROW(stats_period, "60", true,
		 "Interval over which statistics are averaged and logged."),
	STR_ROW(stats_users, NULL, true,
		"Users allowed to run the read-only SHOW commands of the admin console (comma-separated)."),
	TIME_ROW(suspend_timeout, "10", true,
		 "How long SUSPEND waits for a connection's queued output to be written before it closes "
		 "that connection (0 = wait for ever)."),
	BOOL_ROW(syslog, "0", false,
		 "Also send the log to syslog."),
	STR_ROW(syslog_facility, "daemon", false,
		"Syslog facility, such as daemon, user or local0."),
	STR_ROW(syslog_ident, "lokadb", false,
		"Program name that syslog messages carry."),
	BOOL_ROW(tcp_keepalive, "1", true,
		 "Turn on TCP keepalive for client and server sockets."),
	INT_ROW(tcp_keepcnt, "0", 0, COUNT_MAX, true,
		"TCP_KEEPCNT: unanswered keepalive probes before the connection is dropped (0 = OS default)."),
	INT_ROW(tcp_keepidle, "0", 0, COUNT_MAX, true,
		"TCP_KEEPIDLE: idle seconds before the first keepalive probe (0 = OS default)."),
	INT_ROW(tcp_keepintvl, "0", 0, COUNT_MAX, true,
		"TCP_KEEPINTVL: seconds between keepalive probes (0 = OS default)."),
	STR_ROW(track_extra_parameters, "IntervalStyle", false,
		"Parameters, besides the standard ones, tracked per client and restored on each server (comma-separated). "
		"lokadb always tracks client_encoding, DateStyle, TimeZone, standard_conforming_strings, application_name "
		"and IntervalStyle; another name is refused as not supported."),
	TIME_ROW(transaction_timeout, "0", true,
		 "Close a client whose transaction has been open for longer than this, with its server connection (0 = never); "
		 "[users] may override it."),
	STR_ROW(unix_socket_dir, "/tmp", false,
		"Directory of the unix socket; empty = no unix socket."),
	INT_ROW(unix_socket_mode, "0777", 0, SOCKET_MODE_MAX, false,
		"Permission bits of the unix socket (octal when written with a leading 0)."),
	INT_ROW(verbose, "0", 0, COUNT_MAX, true,
		"Log detail: 0 = normal, 1 = debug, 2 = noise."),
	{ NULL, CF_INT, 0, NULL, 0, 0, false, NULL, NULL }
};

/* Other names a setting answers to. */
static const struct cf_alias {
	const char *alias;
	const char *name;
} cf_aliases[] = {
	{ "max_packet_size", "max_message_bytes" },
	{ NULL, NULL }
};

/*
 * PgBouncer (1.24/1.25) settings this version does not implement. Setting one
 * is refused, except to an empty value or one of `accept` (its PgBouncer
 * default, or a value that means "off"), so a stock pgbouncer.ini loads.
 */
#define ACCEPT_MAX 4
static const struct pgb_setting {
	const char *name;
	const char *accept[ACCEPT_MAX];
} pgb_unsupported[] = {
	{ "auth_ident_file", { NULL } },
	{ "auth_ldap_options", { NULL } },
	{ "client_tls13_ciphers", { NULL } },
	{ "client_tls_dheparams", { "auto" } },
	{ "client_tls_ecdhcurve", { "auto" } },
	{ "conffile", { NULL } },
	{ "dns_zone_check_period", { "0" } },
	{ "job_name", { "pgbouncer" } },
	{ "resolv_conf", { NULL } },
	{ "sbuf_loopcnt", { "5" } },
	{ "scram_iterations", { "4096" } },
	{ "server_round_robin", { "0" } },
	{ "server_tls13_ciphers", { NULL } },
	{ "service_name", { "pgbouncer" } },
	{ "tcp_defer_accept", { "0", "1" } },
	{ "tcp_socket_buffer", { "0" } },
	{ "tcp_user_timeout", { "0" } },
	{ "unix_socket_group", { NULL } },
	{ "user", { NULL } },
	{ NULL, { NULL } }
};

/* ---------------------------------------------------------------------------
 * [databases] and [users] option tables
 * ------------------------------------------------------------------------- */

enum key_kind { KEY_STR, KEY_COUNT, KEY_PORT, KEY_POOL_MODE, KEY_TIME };

struct conn_key {
	const char *name;
	enum key_kind kind;
	size_t offset;		/* into struct db_conf or struct user_conf */
	const char *def;	/* for the docs */
	const char *doc;
};

#define DB(f) offsetof(struct db_conf, f)
static const struct conn_key db_keys[] = {
	{ "host", KEY_STR, DB(host), "unix socket",
	  "Server host name or address; a value starting with `/` is a unix socket directory." },
	{ "port", KEY_PORT, DB(port), "5432", "Server port." },
	{ "dbname", KEY_STR, DB(dbname), "the entry's name", "Database name on the server." },
	{ "user", KEY_STR, DB(user), "the client's user",
	  "Forced server user: every client of this entry uses this role on the server." },
	{ "password", KEY_STR, DB(password), "from auth_file", "Password of the forced user." },
	{ "auth_user", KEY_STR, DB(auth_user), "", "User that looks up client passwords on the server." },
	{ "auth_query", KEY_STR, DB(auth_query), "auth_query",
	  "auth_query for this database's clients (as PgBouncer 1.24)." },
	{ "auth_dbname", KEY_STR, DB(auth_dbname), "auth_dbname",
	  "Database on this entry's server that auth_query runs in for its clients "
	  "(unset here and globally: the entry's dbname)." },
	{ "pool_size", KEY_COUNT, DB(pool_size), "default_pool_size", "Server connections per user for this database." },
	{ "min_pool_size", KEY_COUNT, DB(min_pool_size), "min_pool_size", "Server connections kept open per pool." },
	{ "reserve_pool_size", KEY_COUNT, DB(reserve_pool_size), "reserve_pool_size",
	  "Extra connections allowed after reserve_pool_timeout; a [users] entry's reserve_pool_size wins over it (PgBouncer also spells it reserve_pool)." },
	{ "reserve_pool", KEY_COUNT, DB(reserve_pool_size), "reserve_pool_size", "Alias of reserve_pool_size." },
	{ "pool_mode", KEY_POOL_MODE, DB(pool_mode), "pool_mode", "Pool mode for this database." },
	{ "max_db_connections", KEY_COUNT, DB(max_db_connections), "max_db_connections",
	  "Most server connections for this database over all its pools (0 = unlimited)." },
	{ "max_db_client_connections", KEY_COUNT, DB(max_db_client_connections), "max_db_client_connections",
	  "Most client connections for this database over all its users (0 = unlimited)." },
	{ "connect_query", KEY_STR, DB(connect_query), "", "Query run on every new server connection." },
	{ "client_encoding", KEY_STR, DB(client_encoding), "", "client_encoding sent to the server at connect." },
	{ "datestyle", KEY_STR, DB(datestyle), "", "DateStyle sent to the server at connect." },
	{ "timezone", KEY_STR, DB(timezone), "", "TimeZone sent to the server at connect." },
	{ "application_name", KEY_STR, DB(application_name), "", "application_name sent to the server at connect." },
	{ "server_lifetime", KEY_TIME, DB(server_lifetime), "server_lifetime",
	  "server_lifetime for this database's server connections (0 = the global setting)." },
	{ "query_wait_timeout", KEY_TIME, DB(query_wait_timeout), "query_wait_timeout",
	  "query_wait_timeout for this database's clients (0 = wait forever); a [users] entry's value wins over it." },
	{ "transport", KEY_STR, DB(transport), "tcp/unix",
	  "Name of a plugin transport that opens this entry's server connections (see doc/plugins.md)." },
	{ "site", KEY_STR, DB(site), "",
	  "With transport=tunnel: the site whose agent carries this entry's connections (an alias of host); refused without it." },
	{ NULL, KEY_STR, 0, NULL, NULL }
};

#define USR(f) offsetof(struct user_conf, f)
static const struct conn_key user_keys[] = {
	{ "pool_mode", KEY_POOL_MODE, USR(pool_mode), "pool_mode", "Pool mode for this user's pools." },
	{ "pool_size", KEY_COUNT, USR(pool_size), "default_pool_size", "Server connections per database for this user." },
	{ "max_user_connections", KEY_COUNT, USR(max_user_connections), "max_user_connections",
	  "Most server connections for this user over all its pools (0 = unlimited)." },
	{ "max_user_client_connections", KEY_COUNT, USR(max_user_client_connections), "max_user_client_connections",
	  "Most client connections for this user over all its databases (0 = unlimited)." },
	{ "query_timeout", KEY_TIME, USR(query_timeout), "query_timeout",
	  "query_timeout for this user's clients (0 = the global setting)." },
	{ "idle_transaction_timeout", KEY_TIME, USR(idle_transaction_timeout), "idle_transaction_timeout",
	  "idle_transaction_timeout for this user's clients (0 = the global setting)." },
	{ "client_idle_timeout", KEY_TIME, USR(client_idle_timeout), "client_idle_timeout",
	  "client_idle_timeout for this user's clients (0 = the global setting)." },
	{ "transaction_timeout", KEY_TIME, USR(transaction_timeout), "transaction_timeout",
	  "transaction_timeout for this user's clients (0 = the global setting)." },
	{ "reserve_pool_size", KEY_COUNT, USR(reserve_pool_size), "the database's reserve_pool_size",
	  "Reserve pool of this user's pools; wins over the database's and the global reserve_pool_size (as PgBouncer 1.24)." },
	{ "query_wait_timeout", KEY_TIME, USR(query_wait_timeout), "the database's query_wait_timeout",
	  "query_wait_timeout for this user's clients (0 = wait forever); wins over the database's and the global value." },
	{ NULL, KEY_STR, 0, NULL, NULL }
};

#define PEER(f) offsetof(struct peer_conf, f)
static const struct conn_key peer_keys[] = {
	{ "host", KEY_STR, PEER(host), "unix socket in /tmp",
	  "The peer's host name or address; a value starting with `/` is the directory of its unix socket." },
	{ "port", KEY_PORT, PEER(port), "6432", "The peer's port (also names its unix socket)." },
	{ "pool_size", KEY_COUNT, PEER(pool_size), "default_pool_size",
	  "Most cancel requests forwarded to the peer at the same time; more wait their turn." },
	{ NULL, KEY_STR, 0, NULL, NULL }
};
#define DEFAULT_PEER_PORT 6432

/* Connection-string options PgBouncer knows that we do not implement (in [databases] or [users]). */
static const char *const pgb_conn_unsupported[] = {
	"client_idle_timeout", "idle_transaction_timeout",
	"load_balance_hosts", "query_timeout", "transaction_timeout", NULL
};

/* Database names taken by the admin console. */
static const char *const reserved_db_names[] = { "pgbouncer", "lokadb", NULL };

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))

/* Write a message into err (which may be NULL); always returns false. */
static bool cf_err(char *err, size_t errlen, const char *fmt, ...) PRINTF_LIKE(3, 4);
static bool cf_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return false;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return false;
}

static bool name_in(const char *const *list, const char *name)
{
	for (; *list; list++) {
		if (strcasecmp(*list, name) == 0)
			return true;
	}
	return false;
}

/*
 * Grow an array of n elements to n + 1, the new one zeroed. Returns the new
 * base, or NULL (the old array untouched) when out of memory.
 */
static void *array_grow(void *arr, int n, size_t elem)
{
	char *p = realloc(arr, (size_t)(n + 1) * elem);

	if (p)
		memset(p + (size_t)n * elem, 0, elem);
	return p;
}

/* ---------------------------------------------------------------------------
 * Value parsing and formatting, one pair per cf_type
 * ------------------------------------------------------------------------- */

union cf_value {
	int i;
	int64_t n;		/* CF_SIZE and CF_TIME (usec_t is int64_t) */
	char *s;
};

struct unit {
	const char *name;
	int64_t mult;
};

static const struct unit time_units[] = {
	{ "", USEC }, { "us", 1 }, { "ms", 1000 }, { "s", USEC }, { "min", 60 * USEC },
	{ "h", 3600 * USEC }, { "d", 86400 * USEC }, { NULL, 0 }
};

static const struct unit size_units[] = {
	{ "", 1 }, { "b", 1 }, { "k", 1LL << 10 }, { "kb", 1LL << 10 }, { "m", 1LL << 20 },
	{ "mb", 1LL << 20 }, { "g", 1LL << 30 }, { "gb", 1LL << 30 }, { "t", 1LL << 40 },
	{ "tb", 1LL << 40 }, { NULL, 0 }
};

static const struct {
	const char *name;
	int value;
} bool_words[] = {
	{ "1", 1 }, { "0", 0 }, { "on", 1 }, { "off", 0 }, { "true", 1 }, { "false", 0 },
	{ "yes", 1 }, { "no", 0 }, { NULL, 0 }
};

/* A CF_INT row whose default is written in octal ("0777") is read and shown in octal. */
static bool row_is_octal(const struct cf_setting *s)
{
	return s->type == CF_INT && s->def && s->def[0] == '0' && s->def[1];
}

static const struct unit *unit_find(const struct unit *units, const char *name)
{
	for (; units->name; units++) {
		if (strcasecmp(units->name, name) == 0)
			return units;
	}
	return NULL;
}

/* Strict integer: the whole text, no blanks; saturates on overflow (strtoll). */
static bool scan_int(const char *text, int base, int64_t *out)
{
	char *end;
	long long v;

	if (!*text || isspace((unsigned char)*text))
		return false;
	v = strtoll(text, &end, base);
	if (*end)
		return false;
	*out = v;
	return true;
}

/* Digits at *pp into *out (saturating at INT64_MAX); returns how many. */
static int scan_digits(const char **pp, int64_t *out, int max_keep)
{
	const char *p = *pp;
	int n = 0;

	*out = 0;
	for (; isdigit((unsigned char)*p); p++, n++) {
		if (n >= max_keep)
			continue;
		if (*out > (INT64_MAX - 9) / 10)
			*out = INT64_MAX;
		else
			*out = *out * 10 + (*p - '0');
	}
	*pp = p;
	return n;
}

/*
 * "NUMBER[.FRACTION] [UNIT]" scaled by the unit's multiplier (the first entry
 * of `units` is the multiplier for no unit). Keeps six fraction digits, so
 * times are exact to the microsecond. Saturates instead of overflowing, so
 * the range check reports huge values.
 */
static bool scan_scaled(const char *text, const struct unit *units, bool allow_frac, int64_t *out)
{
	const char *p = text;
	const struct unit *u;
	int64_t ip, frac = 0, scale = 1;
	int nd = 0, nf = 0;

	nd = scan_digits(&p, &ip, INT_MAX);
	if (allow_frac && *p == '.') {
		p++;
		nf = scan_digits(&p, &frac, FRAC_DIGITS);
		for (int i = 0; i < nf && i < FRAC_DIGITS; i++)
			scale *= 10;
	}
	if (nd + nf == 0)
		return false;
	while (*p == ' ' || *p == '\t')
		p++;
	u = unit_find(units, p);
	if (!u)
		return false;
	if (ip > (INT64_MAX - u->mult) / u->mult) {
		*out = INT64_MAX;
		return true;
	}
	*out = ip * u->mult + frac * u->mult / scale;
	return true;
}

static bool bad_value(const struct cf_setting *s, const char *text, const char *expected, char *err, size_t errlen)
{
	return cf_err(err, errlen, "invalid value \"%s\" for %s: expected %s", text, s->name, expected);
}

static void format_value(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len);

static bool check_range(const struct cf_setting *s, int64_t v, int64_t lo, int64_t hi,
			const char *text, char *err, size_t errlen)
{
	char slo[32], shi[32];
	union cf_value b;

	if (v >= lo && v <= hi)
		return true;
	if (s->type == CF_INT) {
		b.i = (int)lo;
		format_value(s, &b, slo, sizeof(slo));
		b.i = (int)hi;
		format_value(s, &b, shi, sizeof(shi));
	} else {
		b.n = lo;
		format_value(s, &b, slo, sizeof(slo));
		b.n = hi;
		format_value(s, &b, shi, sizeof(shi));
	}
	return cf_err(err, errlen, "value \"%s\" for %s is out of range (%s .. %s)", text, s->name, slo, shi);
}

static bool has_range(const struct cf_setting *s)
{
	return s->min != 0 || s->max != 0;
}

static bool parse_int(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	int64_t n;
	int base = row_is_octal(s) && text[0] == '0' ? 8 : 10;
	int64_t lo = has_range(s) ? s->min : INT_MIN;
	int64_t hi = has_range(s) ? s->max : INT_MAX;

	if (!scan_int(text, base, &n))
		return bad_value(s, text, base == 8 ? "an octal integer" : "an integer", err, errlen);
	if (!check_range(s, n, lo, hi, text, err, errlen))
		return false;
	v->i = (int)n;
	return true;
}

static bool parse_bool(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	for (int i = 0; bool_words[i].name; i++) {
		if (strcasecmp(bool_words[i].name, text) == 0) {
			v->i = bool_words[i].value;
			return true;
		}
	}
	return bad_value(s, text, "a boolean (0/1, on/off, true/false, yes/no)", err, errlen);
}

/*
 * The ParameterStatus values lokadb keeps per client and restores on each
 * server (util.c var_names): track_extra_parameters may name only these, so
 * that no name is silently ignored.
 */
static const char *const tracked_params[] = {
	"client_encoding", "DateStyle", "TimeZone", "standard_conforming_strings", "application_name",
	"IntervalStyle", NULL
};

static bool check_tracked(const char *text, char *err, size_t errlen)
{
	const char *p = text;

	while (*p) {
		size_t n = strcspn(p, ", \t");
		bool known = n == 0;
		for (int i = 0; !known && tracked_params[i]; i++)
			known = strlen(tracked_params[i]) == n && strncasecmp(tracked_params[i], p, n) == 0;
		if (!known)
			return cf_err(err, errlen, "track_extra_parameters: \"%.*s\" is not supported by this version of "
				      "lokadb (it tracks client_encoding, DateStyle, TimeZone, standard_conforming_strings, "
				      "application_name and IntervalStyle)", (int)n, p);
		p += n;
		p += strspn(p, ", \t");
	}
	return true;
}

static bool parse_str(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	v->s = NULL;
	if (s->offset == OFF(track_extra_parameters) && !check_tracked(text, err, errlen))
		return false;
	if (!*text)
		return true;
	v->s = strdup(text);
	return v->s ? true : cf_err(err, errlen, "out of memory");
}

static bool parse_time(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	if (!scan_scaled(text, time_units, true, &v->n))
		return bad_value(s, text, "a time such as 15, 1.5, 500ms, 30s, 2min or 1h", err, errlen);
	return check_range(s, v->n, s->min, has_range(s) ? s->max : INT64_MAX, text, err, errlen);
}

static bool parse_size(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	if (!scan_scaled(text, size_units, false, &v->n))
		return bad_value(s, text, "a size such as 4096, 64kB, 256MB or 1GB", err, errlen);
	return check_range(s, v->n, s->min, has_range(s) ? s->max : INT64_MAX, text, err, errlen);
}

static bool parse_enum(const struct cf_setting *s, const char *text, union cf_value *v, char *err, size_t errlen)
{
	char expected[REASON_LEN] = "one of ";

	for (int i = 0; s->enums[i]; i++) {
		if (strcasecmp(s->enums[i], text) == 0) {
			v->i = i;
			return true;
		}
	}
	for (int i = 0; s->enums[i]; i++) {
		strncat(expected, i ? ", " : "", sizeof(expected) - strlen(expected) - 1);
		strncat(expected, s->enums[i], sizeof(expected) - strlen(expected) - 1);
	}
	return bad_value(s, text, expected, err, errlen);
}

static void format_int(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	snprintf(buf, len, row_is_octal(s) ? "%#o" : "%d", v->i);
}

static void format_bool(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	(void)s;
	snprintf(buf, len, "%d", v->i ? 1 : 0);
}

static void format_str(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	(void)s;
	snprintf(buf, len, "%s", v->s ? v->s : "");
}

/* Seconds, as PgBouncer shows times; a fraction only when there is one ("0.5"). */
static void format_time(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	long long sec = v->n / USEC, us = v->n % USEC;
	int digits = 6;

	(void)s;
	if (us == 0) {
		snprintf(buf, len, "%lld", sec);
		return;
	}
	while (us % 10 == 0) {
		us /= 10;
		digits--;
	}
	snprintf(buf, len, "%lld.%0*lld", sec, digits, us);
}

static void format_size(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	(void)s;
	snprintf(buf, len, "%lld", (long long)v->n);
}

static void format_enum(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	int n = 0;

	while (s->enums[n])
		n++;
	snprintf(buf, len, "%s", v->i >= 0 && v->i < n ? s->enums[v->i] : "");
}

typedef bool (*cf_parse_fn)(const struct cf_setting *, const char *, union cf_value *, char *, size_t);
typedef void (*cf_format_fn)(const struct cf_setting *, const union cf_value *, char *, size_t);

static const struct cf_type_info {
	const char *name;	/* for the docs */
	size_t size;		/* of the struct field */
	cf_parse_fn parse;
	cf_format_fn format;
} cf_types[] = {
	[CF_INT] = { "integer", sizeof(int), parse_int, format_int },
	[CF_BOOL] = { "boolean", sizeof(int), parse_bool, format_bool },
	[CF_STR] = { "string", sizeof(char *), parse_str, format_str },
	[CF_TIME] = { "time", sizeof(usec_t), parse_time, format_time },
	[CF_SIZE] = { "size", sizeof(int64_t), parse_size, format_size },
	[CF_ENUM] = { "enum", sizeof(int), parse_enum, format_enum },
};

static void format_value(const struct cf_setting *s, const union cf_value *v, char *buf, size_t len)
{
	cf_types[s->type].format(s, v, buf, len);
}

static void *field_of(const struct lk_config *cf, const struct cf_setting *s)
{
	return (char *)cf + s->offset;
}

/* Apply a parsed value; never fails. Takes ownership of v->s for CF_STR. */
static void setting_apply(struct lk_config *cf, const struct cf_setting *s, const union cf_value *v)
{
	void *field = field_of(cf, s);

	if (s->type == CF_STR)
		free(*(char **)field);
	memcpy(field, v, cf_types[s->type].size);
}

/* Check then apply: on error nothing changes. */
static bool setting_store(struct lk_config *cf, const struct cf_setting *s, const char *text, char *err, size_t errlen)
{
	union cf_value v;

	memset(&v, 0, sizeof(v));
	if (!cf_types[s->type].parse(s, text, &v, err, errlen))
		return false;
	setting_apply(cf, s, &v);
	return true;
}

/*
 * Parse `value` for setting `s` into *out: an int for CF_INT, CF_BOOL and
 * CF_ENUM, an int64_t/usec_t for CF_SIZE and CF_TIME, and a char * for
 * CF_STR (a new copy the caller frees, or NULL for an empty value).
 */
bool config_parse_value(const struct cf_setting *s, const char *value, void *out, char *err, size_t errlen)
{
	union cf_value v;

	memset(&v, 0, sizeof(v));
	if (!s || !value || !out)
		return cf_err(err, errlen, "missing setting or value");
	if (!cf_types[s->type].parse(s, value, &v, err, errlen))
		return false;
	memcpy(out, &v, cf_types[s->type].size);
	return true;
}

void config_format(const struct lk_config *cf, const struct cf_setting *s, char *buf, size_t len)
{
	union cf_value v;

	if (!len)
		return;
	memset(&v, 0, sizeof(v));
	memcpy(&v, field_of(cf, s), cf_types[s->type].size);
	format_value(s, &v, buf, len);
}

const struct cf_setting *config_find(const char *name)
{
	const struct cf_setting *s;

	if (!name)
		return NULL;
	for (s = config_settings; s->name; s++) {
		if (strcasecmp(s->name, name) == 0)
			return s;
	}
	for (const struct cf_alias *a = cf_aliases; a->alias; a++) {
		if (strcasecmp(a->alias, name) == 0)
			return config_find(a->name);
	}
	return NULL;
}

static const struct pgb_setting *pgb_find(const char *name)
{
	for (const struct pgb_setting *p = pgb_unsupported; p->name; p++) {
		if (strcasecmp(p->name, name) == 0)
			return p;
	}
	return NULL;
}

static bool pgb_accepts(const struct pgb_setting *p, const char *value)
{
	if (!*value)
		return true;
	for (int i = 0; i < ACCEPT_MAX && p->accept[i]; i++) {
		if (strcasecmp(p->accept[i], value) == 0)
			return true;
	}
	return false;
}

/* The reason a name is not a settable setting. */
static bool not_a_setting(const char *name, char *err, size_t errlen)
{
	if (pgb_find(name))
		return cf_err(err, errlen, "setting \"%s\" is not supported by this version of lokadb", name);
	return cf_err(err, errlen, "unknown setting \"%s\"", name);
}

/*
 * What SET must refuse beyond the value itself: a new auth_hba_file (only the
 * loader reads the file; a SET would change the name, not the rules), and
 * auth_type = hba without loaded rules would refuse every login, the
 * console's included.
 */
static bool set_allowed(const struct lk_config *cf, const struct cf_setting *s, const char *value,
			char *err, size_t errlen)
{
	if (s->offset == OFF(auth_hba_file) && strcmp(value, cf->auth_hba_file ? cf->auth_hba_file : "") != 0)
		return cf_err(err, errlen, "setting \"auth_hba_file\" is read with the ini file: change it there and RELOAD");
	if (s->offset == OFF(auth_type) && strcasecmp(value, "hba") == 0 && !cf->hba)
		return cf_err(err, errlen, "auth_type hba needs auth_hba_file: set it in the ini file and RELOAD");
	return true;
}

bool config_set(struct lk_config *cf, const char *name, const char *value, char *err, size_t errlen)
{
	const struct cf_setting *s = config_find(name);

	if (!cf || !name || !value)
		return cf_err(err, errlen, "missing setting or value");
	if (!s)
		return not_a_setting(name, err, errlen);
	if (!s->reloadable)
		return cf_err(err, errlen, "setting \"%s\" cannot be changed at run time; restart lokadb", s->name);
	if (!set_allowed(cf, s, value, err, errlen))
		return false;
	return setting_store(cf, s, value, err, errlen);
}

/* ---------------------------------------------------------------------------
 * Object lifetime
 * ------------------------------------------------------------------------- */

static void conn_obj_clear(const struct conn_key *keys, void *obj)
{
	for (; keys->name; keys++) {
		char **field = (char **)((char *)obj + keys->offset);

		if (keys->kind == KEY_STR) {
			free(*field);
			*field = NULL;	/* an alias names the same field */
		}
	}
}

static void db_conf_clear(struct db_conf *d)
{
	conn_obj_clear(db_keys, d);
	free(d->name);
}

static void peer_conf_clear(struct peer_conf *pc)
{
	conn_obj_clear(peer_keys, pc);
	free(pc->name);
}

void config_free(struct lk_config *cf)
{
	if (!cf)
		return;
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		if (s->type == CF_STR)
			free(*(char **)field_of(cf, s));
	}
	for (int i = 0; i < cf->n_dbs; i++)
		db_conf_clear(&cf->dbs[i]);
	for (int i = 0; i < cf->n_users; i++)
		free(cf->users[i].name);
	for (int i = 0; i < cf->n_auth; i++) {
		free(cf->auth[i].user);
		free(cf->auth[i].secret);
	}
	for (int i = 0; i < cf->n_peers; i++)
		peer_conf_clear(&cf->peers[i]);
	free(cf->peers);
	for (int i = 0; i < cf->n_raw; i++) {
		free(cf->raw[i].section);
		free(cf->raw[i].key);
		free(cf->raw[i].value);
	}
	free(cf->dbs);
	free(cf->users);
	free(cf->auth);
	free(cf->raw);
	hba_free(cf->hba);
	free(cf->path);
	free(cf);
}

struct lk_config *config_defaults(void)
{
	struct lk_config *cf = calloc(1, sizeof(*cf));

	if (!cf)
		return NULL;
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		if (!setting_store(cf, s, s->def ? s->def : "", NULL, 0)) {
			config_free(cf);
			return NULL;
		}
	}
	return cf;
}

/* ---------------------------------------------------------------------------
 * Lookups
 * ------------------------------------------------------------------------- */

const struct db_conf *config_find_db(const struct lk_config *cf, const char *name)
{
	for (int i = 0; cf && name && i < cf->n_dbs; i++) {
		if (strcmp(cf->dbs[i].name, name) == 0)
			return &cf->dbs[i];
	}
	return NULL;
}

const struct user_conf *config_find_user(const struct lk_config *cf, const char *name)
{
	for (int i = 0; cf && name && i < cf->n_users; i++) {
		if (strcmp(cf->users[i].name, name) == 0)
			return &cf->users[i];
	}
	return NULL;
}

/* A pool's sizes as pool.c applies them: the user's [users] value, else the entry's, else the global one. */
int config_pool_size(const struct lk_config *cf, const struct db_conf *dc, const char *user)
{
	const struct user_conf *uc = config_find_user(cf, user);
	if (uc && uc->pool_size >= 0)
		return uc->pool_size;
	return dc->pool_size >= 0 ? dc->pool_size : cf->default_pool_size;
}

int config_reserve_pool_size(const struct lk_config *cf, const struct db_conf *dc, const char *user)
{
	const struct user_conf *uc = config_find_user(cf, user);
	if (uc && uc->reserve_pool_size >= 0)
		return uc->reserve_pool_size;
	return dc->reserve_pool_size >= 0 ? dc->reserve_pool_size : cf->reserve_pool_size;
}

const struct auth_entry *config_find_auth(const struct lk_config *cf, const char *user)
{
	for (int i = 0; cf && user && i < cf->n_auth; i++) {
		if (strcmp(cf->auth[i].user, user) == 0)
			return &cf->auth[i];
	}
	return NULL;
}

bool config_list_has(const char *list, const char *name)
{
	static const char seps[] = ", \t";
	size_t nlen = name ? strlen(name) : 0;
	const char *p = list;

	if (!list || !name)
		return false;
	while (*(p += strspn(p, seps))) {
		size_t len = strcspn(p, seps);
		if ((len == 1 && *p == '*') || (len == nlen && strncmp(p, name, len) == 0))
			return true;
		p += len;
	}
	return false;
}

/* ---------------------------------------------------------------------------
 * The loader: inih reader and handler
 * ------------------------------------------------------------------------- */

struct loader {
	struct lk_config *cf;
	const char *path;	/* file being read, for messages */
	FILE *f;
	char *line;		/* current physical line (getline buffer) */
	size_t cap;
	char *long_value;	/* real value of an over-long line */
	int lineno;
	int err_line;		/* 0 = no error yet */
	char *err;
	size_t errlen;
};

/* Record "PATH:LINE: reason" for the current line; returns false. */
static bool loader_fail(struct loader *ld, const char *fmt, ...) PRINTF_LIKE(2, 3);
static bool loader_fail(struct loader *ld, const char *fmt, ...)
{
	char reason[REASON_LEN];
	va_list ap;

	if (ld->err_line)
		return false;
	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	ld->err_line = ld->lineno;
	return cf_err(ld->err, ld->errlen, "%s:%d: %s", ld->path, ld->lineno, reason);
}

/* Remove inih's inline comment (";" after a blank) and surrounding blanks, in place. */
static char *trim_value(char *v)
{
	char *end;

	while (isspace((unsigned char)*v))
		v++;
	for (char *p = v; *p; p++) {
		if (*p == ';' && p > v && isspace((unsigned char)p[-1])) {
			*p = '\0';
			break;
		}
	}
	end = v + strlen(v);
	while (end > v && isspace((unsigned char)end[-1]))
		*--end = '\0';
	return v;
}

/*
 * A line that does not fit inih's buffer: give inih "name=<LONG_MARK>" and
 * keep the real value in ld->long_value for loader_handle() to use. Returns
 * the buffer for inih, or NULL (with the error recorded) to stop.
 */
static char *loader_long_line(struct loader *ld, char *p, char *str, int num)
{
	size_t name_len = strcspn(p, "=:");

	if (*p == ';' || *p == '#') {
		snprintf(str, (size_t)num, ";\n");
		return str;
	}
	if (!p[name_len] || name_len + sizeof(LONG_MARK) + 2 > (size_t)num) {
		loader_fail(ld, "line is too long");
		return NULL;
	}
	ld->long_value = strdup(trim_value(p + name_len + 1));
	if (!ld->long_value) {
		loader_fail(ld, "out of memory");
		return NULL;
	}
	snprintf(str, (size_t)num, "%.*s=%s\n", (int)name_len, p, LONG_MARK);
	return str;
}

/* inih's reader: one physical line per call, counted. */
static char *loader_read(char *str, int num, void *stream)
{
	struct loader *ld = stream;
	char *p;
	size_t len;

	free(ld->long_value);
	ld->long_value = NULL;
	if (ld->err_line || getline(&ld->line, &ld->cap, ld->f) < 0)
		return NULL;
	ld->lineno++;
	p = ld->line + strspn(ld->line, " \t");
	if (strncmp(p, "%include", 8) == 0) {
		loader_fail(ld, "%%include is not supported");
		return NULL;
	}
	len = strlen(p);
	if (len < (size_t)num) {
		memcpy(str, p, len + 1);
		return str;
	}
	return loader_long_line(ld, p, str, num);
}

/*
 * Copy an ini key that may be double-quoted ("my db", with "" for a quote)
 * into a new string the caller frees. NULL on a malformed key (reason
 * recorded) or out of memory (not recorded).
 */
static char *unquote_key(struct loader *ld, const char *key)
{
	size_t len = strlen(key);
	char *out, *o;

	if (key[0] != '"')
		return strdup(key);
	if (len < 2 || key[len - 1] != '"') {
		loader_fail(ld, "unterminated quoted name %s", key);
		return NULL;
	}
	out = o = malloc(len);
	if (!out)
		return NULL;
	for (const char *p = key + 1; p < key + len - 1; p++) {
		if (*p == '"' && p[1] == '"')
			p++;
		*o++ = *p;
	}
	*o = '\0';
	return out;
}

/*
 * Next `key=value` pair of a connection string, in place (as PgBouncer's
 * cstr_get_pair): values may be 'quoted' with '' for a quote. Sets *key to
 * NULL at the end. Returns false with a reason in why.
 */
static bool connstr_next(char **pp, char **key, char **val, char *why, size_t whylen)
{
	char *p = *pp + strspn(*pp, " \t"), *o;

	*key = NULL;
	if (!*p)
		return true;
	*key = p;
	p += strcspn(p, "= \t");
	o = p;
	p += strspn(p, " \t");
	if (o == *key)
		return cf_err(why, whylen, "missing option name before \"=\"");
	if (*p != '=')
		return cf_err(why, whylen, "expected \"=\" after \"%.*s\"", (int)(o - *key), *key);
	*o = '\0';
	p += 1 + strspn(p + 1, " \t");
	*val = o = p;
	if (*p != '\'') {
		p += strcspn(p, " \t");
		if (p == *val)
			return cf_err(why, whylen, "missing value for \"%s\"", *key);
		if (*p)
			*p++ = '\0';
		*pp = p;
		return true;
	}
	for (p++; *p && !(p[0] == '\'' && p[1] != '\''); p++) {
		if (*p == '\'')
			p++;
		*o++ = *p;
	}
	if (!*p)
		return cf_err(why, whylen, "unterminated quoted value for \"%s\"", *key);
	*o = '\0';
	p++;
	if (*p && *p != ' ' && *p != '\t')
		return cf_err(why, whylen, "expected a space after the quoted value of \"%s\"", *key);
	*pp = p;
	return true;
}

static const struct conn_key *conn_key_find(const struct conn_key *keys, const char *name)
{
	for (; keys->name; keys++) {
		if (strcasecmp(keys->name, name) == 0)
			return keys;
	}
	return NULL;
}

/* Store one option into a db_conf/user_conf; false with a reason. */
static bool conn_key_set(const struct conn_key *k, void *obj, const char *val, char *why, size_t whylen)
{
	char *field = (char *)obj + k->offset;
	int64_t n;
	int mode;

	switch (k->kind) {
	case KEY_STR:
		free(*(char **)field);
		*(char **)field = strdup(val);
		return *(char **)field ? true : cf_err(why, whylen, "out of memory");
	case KEY_POOL_MODE:
		for (mode = 0; pool_mode_names[mode]; mode++) {
			if (strcasecmp(pool_mode_names[mode], val) == 0)
				break;
		}
		if (!pool_mode_names[mode])
			return cf_err(why, whylen, "invalid pool_mode \"%s\": expected one of session, transaction, statement", val);
		*(int *)field = mode;
		return true;
	case KEY_PORT:
		if (!scan_int(val, 10, &n) || n < 1 || n > PORT_MAX)
			return cf_err(why, whylen, "invalid port \"%s\": expected 1 .. %d", val, PORT_MAX);
		*(int *)field = (int)n;
		return true;
	case KEY_TIME:
		if (!scan_scaled(val, time_units, true, &n) || n < 0 || n > TIME_MAX)
			return cf_err(why, whylen, "invalid %s \"%s\": expected a time such as 15, 1.5, 500ms or 2min",
				      k->name, val);
		*(usec_t *)field = n;
		return true;
	case KEY_COUNT:
		if (!scan_int(val, 10, &n) || n < 0 || n > COUNT_MAX)
			return cf_err(why, whylen, "invalid %s \"%s\": expected a non-negative integer", k->name, val);
		*(int *)field = (int)n;
		return true;
	}
	return cf_err(why, whylen, "internal error: bad key kind");
}

/*
 * Parse a whole connection string into obj using `keys`. `what` names the
 * entry in messages ("database \"app\"").
 */
static bool conn_parse(struct loader *ld, const struct conn_key *keys, void *obj, const char *what, const char *value)
{
	char why[REASON_LEN];
	char *copy = strdup(value), *p = copy, *key, *val = NULL;
	const struct conn_key *k;
	bool ok = false;

	if (!copy)
		return loader_fail(ld, "out of memory");
	for (;;) {
		if (!connstr_next(&p, &key, &val, why, sizeof(why))) {
			loader_fail(ld, "%s: %s", what, why);
			goto end;
		}
		if (!key)
			break;
		k = conn_key_find(keys, key);
		if (!k) {
			loader_fail(ld, name_in(pgb_conn_unsupported, key) ?
				    "%s: option \"%s\" is not supported by this version of lokadb" :
				    "%s: unknown option \"%s\"", what, key);
			goto end;
		}
		if (!conn_key_set(k, obj, val, why, sizeof(why))) {
			loader_fail(ld, "%s: %s", what, why);
			goto end;
		}
	}
	ok = true;
end:
	free(copy);
	return ok;
}

/* Find an entry by name in an array of structs that start with `char *name`. */
static int entry_index(const void *arr, int n, size_t elem, const char *name)
{
	for (int i = 0; i < n; i++) {
		const char *const *np = (const void *)((const char *)arr + (size_t)i * elem);
		if (strcmp(*np, name) == 0)
			return i;
	}
	return -1;
}

static bool load_database(struct loader *ld, const char *section, const char *key, const char *value)
{
	struct lk_config *cf = ld->cf;
	struct db_conf d = { .port = DEFAULT_DB_PORT, .pool_size = -1, .min_pool_size = -1,
			     .reserve_pool_size = -1, .pool_mode = -1, .max_db_connections = -1,
			     .max_db_client_connections = -1, .query_wait_timeout = -1 };
	char what[REASON_LEN];
	struct db_conf *grown;
	int i;

	(void)section;
	d.line = ld->lineno;
	d.name = unquote_key(ld, key);
	if (!d.name)
		return loader_fail(ld, "out of memory");
	snprintf(what, sizeof(what), "database \"%s\"", d.name);
	if (!*d.name) {
		loader_fail(ld, "empty database name");
		goto fail;
	}
	if (name_in(reserved_db_names, d.name)) {
		loader_fail(ld, "database name \"%s\" is reserved", d.name);
		goto fail;
	}
	if (!conn_parse(ld, db_keys, &d, what, value))
		goto fail;
	if (d.site) {
		/* without the tunnel transport, the site name would be taken as a server host name */
		if (!d.transport || strcmp(d.transport, "tunnel") != 0) {
			loader_fail(ld, "%s: site= needs transport=tunnel", what);
			goto fail;
		}
		free(d.host);
		d.host = d.site;
		d.site = NULL;
	}
	i = entry_index(cf->dbs, cf->n_dbs, sizeof(*cf->dbs), d.name);
	if (i < 0) {
		grown = array_grow(cf->dbs, cf->n_dbs, sizeof(*cf->dbs));
		if (!grown) {
			loader_fail(ld, "out of memory");
			goto fail;
		}
		cf->dbs = grown;
		i = cf->n_dbs++;
	}
	db_conf_clear(&cf->dbs[i]);
	cf->dbs[i] = d;
	return true;
fail:
	db_conf_clear(&d);
	return false;
}

static bool load_user(struct loader *ld, const char *section, const char *key, const char *value)
{
	struct lk_config *cf = ld->cf;
	struct user_conf u = { .pool_mode = -1, .pool_size = -1, .max_user_connections = -1,
			       .max_user_client_connections = -1, .reserve_pool_size = -1,
			       .query_wait_timeout = -1 };
	char what[REASON_LEN];
	struct user_conf *grown;
	int i;

	(void)section;
	u.line = ld->lineno;
	u.name = unquote_key(ld, key);
	if (!u.name)
		return loader_fail(ld, "out of memory");
	snprintf(what, sizeof(what), "user \"%s\"", u.name);
	if (!*u.name) {
		loader_fail(ld, "empty user name");
		goto fail;
	}
	if (!conn_parse(ld, user_keys, &u, what, value))
		goto fail;
	i = entry_index(cf->users, cf->n_users, sizeof(*cf->users), u.name);
	if (i < 0) {
		grown = array_grow(cf->users, cf->n_users, sizeof(*cf->users));
		if (!grown) {
			loader_fail(ld, "out of memory");
			goto fail;
		}
		cf->users = grown;
		i = cf->n_users++;
	}
	free(cf->users[i].name);
	cf->users[i] = u;
	return true;
fail:
	free(u.name);
	return false;
}

/* [peers]: `ID = host=... port=... pool_size=...`, ID 1 .. PEER_ID_MAX; a later line for an ID replaces it. */
static bool load_peer(struct loader *ld, const char *section, const char *key, const char *value)
{
	struct lk_config *cf = ld->cf;
	struct peer_conf pc = { .port = DEFAULT_PEER_PORT, .pool_size = -1 };
	char what[REASON_LEN];
	struct peer_conf *grown;
	int64_t id;
	int i;

	(void)section;
	pc.line = ld->lineno;
	if (!scan_int(key, 10, &id) || id < 1 || id > PEER_ID_MAX)
		return loader_fail(ld, "invalid peer id \"%s\": expected 1 .. %d", key, PEER_ID_MAX);
	pc.id = (int)id;
	pc.name = strdup(key);
	if (!pc.name)
		return loader_fail(ld, "out of memory");
	snprintf(what, sizeof(what), "peer %d", pc.id);
	if (!conn_parse(ld, peer_keys, &pc, what, value))
		goto fail;
	for (i = 0; i < cf->n_peers && cf->peers[i].id != pc.id; i++)
		;
	if (i == cf->n_peers) {
		grown = array_grow(cf->peers, cf->n_peers, sizeof(*cf->peers));
		if (!grown) {
			loader_fail(ld, "out of memory");
			goto fail;
		}
		cf->peers = grown;
		cf->n_peers++;
	}
	peer_conf_clear(&cf->peers[i]);
	cf->peers[i] = pc;
	return true;
fail:
	peer_conf_clear(&pc);
	return false;
}

const struct peer_conf *config_find_peer(const struct lk_config *cf, int id)
{
	for (int i = 0; i < cf->n_peers; i++)
		if (cf->peers[i].id == id)
			return &cf->peers[i];
	return NULL;
}

static bool load_setting(struct loader *ld, const char *section, const char *key, const char *value)
{
	const struct cf_setting *s = config_find(key);
	const struct pgb_setting *p;
	char why[REASON_LEN];

	(void)section;
	if (s) {
		if (!setting_store(ld->cf, s, value, why, sizeof(why)))
			return loader_fail(ld, "%s", why);
		return true;
	}
	p = pgb_find(key);
	if (p && pgb_accepts(p, value))
		return true;
	not_a_setting(key, why, sizeof(why));
	return loader_fail(ld, "%s", why);
}

static bool load_raw(struct loader *ld, const char *section, const char *key, const char *value)
{
	struct lk_config *cf = ld->cf;
	struct cf_raw *r = array_grow(cf->raw, cf->n_raw, sizeof(*cf->raw));

	if (!r)
		return loader_fail(ld, "out of memory");
	cf->raw = r;
	r = &cf->raw[cf->n_raw++];
	r->line = ld->lineno;
	r->section = strdup(section);
	r->key = strdup(key);
	r->value = strdup(value);
	if (!r->section || !r->key || !r->value)
		return loader_fail(ld, "out of memory");
	return true;
}

typedef bool (*section_fn)(struct loader *, const char *section, const char *key, const char *value);

static const struct section_kind {
	const char *name;
	bool prefix;		/* [name...]: a name must follow */
	section_fn load;
} section_kinds[] = {
	{ "lokadb", false, load_setting },
	{ "pgbouncer", false, load_setting },
	{ "databases", false, load_database },
	{ "users", false, load_user },
	{ "peers", false, load_peer },
	{ "plugin.", true, load_raw },
	{ NULL, false, NULL }
};

static const struct section_kind *section_find(const char *section)
{
	for (const struct section_kind *k = section_kinds; k->name; k++) {
		size_t len = strlen(k->name);
		if (k->prefix && strncasecmp(section, k->name, len) == 0 && section[len])
			return k;
		if (!k->prefix && strcasecmp(section, k->name) == 0)
			return k;
	}
	return NULL;
}

/* inih's handler: dispatch by section. Returns 0 to make inih note the error. */
static int loader_handle(void *user, const char *section, const char *name, const char *value)
{
	struct loader *ld = user;
	const struct section_kind *k;

	if (ld->err_line)
		return 0;
	if (ld->long_value && strcmp(value, LONG_MARK) == 0)
		value = ld->long_value;
	if (!*name)
		return loader_fail(ld, "missing name before \"=\"");
	if (!*section)
		return loader_fail(ld, "\"%s\" is outside of any section", name);
	k = section_find(section);
	if (!k)
		return loader_fail(ld, "unknown section [%s]", section);
	return k->load(ld, section, name, value);
}

/* ---------------------------------------------------------------------------
 * auth_file
 * ------------------------------------------------------------------------- */

/* Read one "..." field at *pp in place ("" is a quote); NULL if malformed. */
static char *auth_field(char **pp)
{
	char *p = *pp + strspn(*pp, " \t"), *start, *o;

	if (*p != '"')
		return NULL;
	start = o = ++p;
	for (; *p && !(p[0] == '"' && p[1] != '"'); p++) {
		if (*p == '"')
			p++;
		*o++ = *p;
	}
	if (*p != '"')
		return NULL;
	*o = '\0';
	*pp = p + 1;
	return start;
}

static bool auth_add(struct lk_config *cf, const char *user, const char *secret)
{
	int i = entry_index(cf->auth, cf->n_auth, sizeof(*cf->auth), user);
	char *u = strdup(user), *s = strdup(secret);
	struct auth_entry *e;

	if (!u || !s)
		goto oom;
	if (i < 0) {
		e = array_grow(cf->auth, cf->n_auth, sizeof(*cf->auth));
		if (!e)
			goto oom;
		cf->auth = e;
		i = cf->n_auth++;
	}
	e = &cf->auth[i];
	free(e->user);
	free(e->secret);
	e->user = u;
	e->secret = s;
	return true;
oom:
	free(u);
	free(s);
	return false;
}

/* One auth_file line: `"user" "secret"`, anything after is ignored. */
static bool auth_line(struct loader *ld)
{
	char *p = ld->line + strspn(ld->line, " \t\r\n"), *user, *secret;

	if (!*p || *p == ';' || *p == '#')
		return true;
	user = auth_field(&p);
	if (!user)
		return loader_fail(ld, "expected \"user\" \"secret\" with both in double quotes");
	secret = auth_field(&p);
	if (!secret)
		return loader_fail(ld, "expected a double-quoted secret after user \"%s\"", user);
	if (!*user)
		return loader_fail(ld, "empty user name");
	if (!auth_add(ld->cf, user, secret))
		return loader_fail(ld, "out of memory");
	return true;
}

static bool auth_needs_file(int auth_type)
{
	return auth_type == AUTH_PLAIN || auth_type == AUTH_MD5 || auth_type == AUTH_SCRAM;
}

/* A file setting as a path: relative names are relative to the ini file's directory. */
char *config_file_path(const struct lk_config *cf, const char *file)
{
	const char *slash = cf->path ? strrchr(cf->path, '/') : NULL;
	size_t dir = slash ? (size_t)(slash - cf->path) + 1 : 0;
	char *out;

	if (file[0] == '/' || !dir)
		return strdup(file);
	out = malloc(dir + strlen(file) + 1);
	if (out) {
		memcpy(out, cf->path, dir);
		strcpy(out + dir, file);
	}
	return out;
}

static char *auth_path(const struct lk_config *cf)
{
	return config_file_path(cf, cf->auth_file);
}

/* Read cf->auth_file into cf->auth; the loader's line buffer is reused. */
static bool auth_load(struct loader *ld)
{
	struct lk_config *cf = ld->cf;
	char *path;
	bool ok = true;

	if (!cf->auth_file)
		return true;
	path = auth_path(cf);
	if (!path)
		return cf_err(ld->err, ld->errlen, "%s: out of memory", cf->path);
	ld->f = fopen(path, "r");
	if (!ld->f) {
		if (auth_needs_file(cf->auth_type))
			ok = cf_err(ld->err, ld->errlen, "%s: could not open auth_file \"%s\": %s",
				    cf->path, path, strerror(errno));
		free(path);
		return ok;
	}
	ld->path = path;
	ld->lineno = 0;
	while (ok && getline(&ld->line, &ld->cap, ld->f) >= 0) {
		ld->lineno++;
		ok = auth_line(ld);
	}
	if (ok && ferror(ld->f))
		ok = cf_err(ld->err, ld->errlen, "%s: could not read: %s", path, strerror(errno));
	fclose(ld->f);
	ld->f = NULL;
	ld->path = cf->path;
	free(path);
	return ok;
}

/* Read auth_hba_file (needed by auth_type = hba) into cf->hba. */
static bool hba_file_load(struct lk_config *cf, char *err, size_t errlen)
{
	char *path;

	if (!cf->auth_hba_file) {
		if (cf->auth_type == AUTH_HBA)
			return cf_err(err, errlen, "%s: auth_type hba needs auth_hba_file", cf->path);
		return true;
	}
	path = config_file_path(cf, cf->auth_hba_file);
	if (!path)
		return cf_err(err, errlen, "%s: out of memory", cf->path);
	cf->hba = hba_load(path, err, errlen);
	free(path);
	return cf->hba != NULL;
}

/* ---------------------------------------------------------------------------
 * config_load
 * ------------------------------------------------------------------------- */

/* Run inih over the open file; on error the message is in ld->err. */
static bool loader_parse(struct loader *ld)
{
	int rc = ini_parse_stream(loader_read, ld, loader_handle, ld);

	if (rc < 0 && !ld->err_line)
		return cf_err(ld->err, ld->errlen, "%s: out of memory", ld->path);
	if (rc > 0 && (!ld->err_line || rc < ld->err_line))
		return cf_err(ld->err, ld->errlen, "%s:%d: syntax error: expected \"[section]\" or \"name = value\"",
			      ld->path, rc);
	if (ld->err_line)
		return false;
	if (ferror(ld->f))
		return cf_err(ld->err, ld->errlen, "%s: could not read: %s", ld->path, strerror(errno));
	return true;
}

struct lk_config *config_load(const char *path, char *err, size_t errlen)
{
	struct loader ld = { .path = path, .err = err, .errlen = errlen };
	bool ok;

	ld.cf = config_defaults();
	if (!ld.cf || !(ld.cf->path = strdup(path))) {
		config_free(ld.cf);
		cf_err(err, errlen, "%s: out of memory", path);
		return NULL;
	}
	ld.f = fopen(path, "r");
	if (!ld.f) {
		cf_err(err, errlen, "%s: could not open: %s", path, strerror(errno));
		config_free(ld.cf);
		return NULL;
	}
	ok = loader_parse(&ld);
	fclose(ld.f);
	ld.f = NULL;
	free(ld.long_value);
	ok = ok && auth_load(&ld) && hba_file_load(ld.cf, err, errlen);
	free(ld.line);
	if (ok)
		return ld.cf;
	config_free(ld.cf);
	return NULL;
}

/* ---------------------------------------------------------------------------
 * doc/config.md
 * ------------------------------------------------------------------------- */

static void md_type(FILE *f, const struct cf_setting *s)
{
	if (s->type != CF_ENUM) {
		fputs(cf_types[s->type].name, f);
		return;
	}
	for (int i = 0; s->enums[i]; i++)
		fprintf(f, "%s`%s`", i ? ", " : "one of ", s->enums[i]);
}

static void md_settings(FILE *f)
{
	fputs("## [lokadb] settings\n\n"
	      "The section may also be called `[pgbouncer]`. Names are case-insensitive. "
	      "\"Reload\" says whether RELOAD and the console's SET may change the setting; "
	      "the others need a restart.\n\n"
	      "| Setting | Type | Default | Reload | Description |\n"
	      "|---|---|---|---|---|\n", f);
	for (const struct cf_setting *s = config_settings; s->name; s++) {
		fprintf(f, "| `%s` | ", s->name);
		md_type(f, s);
		if (s->def && *s->def)
			fprintf(f, " | `%s` | %s | %s |\n", s->def, s->reloadable ? "yes" : "no", s->doc);
		else
			fprintf(f, " | (empty) | %s | %s |\n", s->reloadable ? "yes" : "no", s->doc);
	}
	fputs("\nAliases:", f);
	for (const struct cf_alias *a = cf_aliases; a->alias; a++)
		fprintf(f, " `%s` = `%s`.", a->alias, a->name);
	fputs("\n\n", f);
}

static void md_unsupported(FILE *f)
{
	fputs("## PgBouncer settings LokaDB does not support\n\n"
	      "These PgBouncer settings are refused with `setting \"NAME\" is not supported by "
	      "this version of lokadb`, unless the value is empty or one of the accepted values "
	      "(PgBouncer's default, or a value that turns the feature off), so that a stock "
	      "`pgbouncer.ini` loads unchanged.\n\n"
	      "| Setting | Accepted values |\n|---|---|\n", f);
	for (const struct pgb_setting *p = pgb_unsupported; p->name; p++) {
		fprintf(f, "| `%s` | (empty)", p->name);
		for (int i = 0; i < ACCEPT_MAX && p->accept[i]; i++)
			fprintf(f, ", `%s`", p->accept[i]);
		fputs(" |\n", f);
	}
	fputs("\n", f);
}

static const char *const key_kind_names[] = {
	[KEY_STR] = "string", [KEY_COUNT] = "integer", [KEY_PORT] = "port",
	[KEY_POOL_MODE] = "`session`, `transaction` or `statement`",
	[KEY_TIME] = "time",
};

static void md_conn_keys(FILE *f, const struct conn_key *keys)
{
	fputs("| Option | Type | Default | Description |\n|---|---|---|---|\n", f);
	for (; keys->name; keys++) {
		fprintf(f, "| `%s` | %s | %s | %s |\n", keys->name, key_kind_names[keys->kind],
			*keys->def ? keys->def : "(none)", keys->doc);
	}
	fputs("\n", f);
}

static void md_sections(FILE *f)
{
	fputs("## [databases]\n\n"
	      "Each line maps a name clients connect to onto a server database:\n\n"
	      "    [databases]\n"
	      "    app = host=10.0.0.5 port=5432 dbname=app_prod pool_size=30\n"
	      "    \"odd name\" = host=/var/run/postgresql user=report password='it''s secret'\n"
	      "    * = host=10.0.0.5\n\n"
	      "A value is a list of `option=value` pairs separated by spaces; a value with spaces "
	      "goes in single quotes, with `''` for a quote. A name that is not plain letters, "
	      "digits and `_` goes in double quotes. The `*` entry is the fallback for any other "
	      "database name. `pgbouncer` and `lokadb` are reserved for the admin console. "
	      "Numbers left out mean \"use the global setting\"; a default below that names a "
	      "setting means that setting's global value.\n\n", f);
	md_conn_keys(f, db_keys);
	fputs("## [users]\n\n"
	      "Per-user overrides, in the same `option=value` form:\n\n"
	      "    [users]\n"
	      "    batch = pool_mode=transaction pool_size=5 max_user_connections=10\n\n", f);
	md_conn_keys(f, user_keys);
	fputs("## [peers]\n\n"
	      "The other lokadb processes of a group that share a port (`so_reuseport`) or a TCP load "
	      "balancer, as PgBouncer 1.19+: a cancel request that reaches a process which did not hand "
	      "out its key is forwarded, once, to the peer whose `peer_id` the key encodes. Each line is "
	      "`PEER_ID = option=value ...`; an entry for the process's own `peer_id` is ignored, so every "
	      "process of the group can use the same section. Address each peer so that it reaches that "
	      "one process: its own unix socket directory, or a host and port no other process of the "
	      "group listens on.\n\n"
	      "    [peers]\n"
	      "    1 = host=/var/run/lokadb-1\n"
	      "    2 = host=/var/run/lokadb-2\n"
	      "    3 = host=10.0.0.7 port=6432 pool_size=4\n\n", f);
	md_conn_keys(f, peer_keys);
	fputs("## [plugin.NAME]\n\n"
	      "Keys of every `[plugin.NAME]` section are kept as written, with their line numbers, "
	      "and checked by plugin NAME when it starts.\n\n", f);
}

static void md_auth_file(FILE *f)
{
	fputs("## auth_file\n\n"
	      "The PgBouncer userlist format: one user per line, the name and the secret each in "
	      "double quotes, with `\"\"` for a quote inside. The secret is a plain password, "
	      "`md5` followed by 32 hex digits, or a `SCRAM-SHA-256$...` verifier. Blank lines and "
	      "lines starting with `;` or `#` are ignored, as is anything after the secret. A later "
	      "line for the same user replaces an earlier one.\n\n"
	      "    \"alice\" \"md5ee52c6f2a2d4e1f3c3b6b3a1e7bc1c3b\"\n"
	      "    \"bob \"\"the builder\"\"\" \"plain password\"\n\n"
	      "A missing file is an error only when `auth_type` is `plain`, `md5` or "
	      "`scram-sha-256`.\n", f);
}

void config_write_markdown(FILE *f)
{
	fputs("# LokaDB configuration\n\n"
	      "<!-- Generated by config_write_markdown() from the tables in src/config.c; "
	      "do not edit by hand. -->\n\n"
	      "LokaDB reads one ini file in PgBouncer's format, so an existing `pgbouncer.ini` "
	      "works as it is. Lines starting with `;` or `#` are comments; `;` after a blank also "
	      "starts a comment. The sections are `[lokadb]` (or `[pgbouncer]`), `[databases]`, "
	      "`[users]`, `[peers]` and `[plugin.NAME]`. Any error stops the load with "
	      "\"FILE:LINE: reason\".\n\n"
	      "Values: a **time** is a number of seconds (`15`, `1.5`) or a number with a unit "
	      "(`250us`, `500ms`, `30s`, `2min`, `1h`, `1d`); LokaDB shows times in seconds. "
	      "A **size** is a number of bytes or a number with a 1024-based unit "
	      "(`64kB`, `256MB`, `1GB`; case does not matter). A **boolean** is `0`/`1`, "
	      "`on`/`off`, `true`/`false` or `yes`/`no`. An empty string setting means \"not set\".\n\n",
	      f);
	md_settings(f);
	md_unsupported(f);
	md_sections(f);
	md_auth_file(f);
}
