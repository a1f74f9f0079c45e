/* SPDX-License-Identifier: ISC */
/*
 * config.h -- LokaDB's settings: one typed table drives ini parsing,
 * defaults, SHOW CONFIG, SET, RELOAD and doc/config.md.
 *
 * A configuration is loaded as a whole into a fresh `struct lk_config`
 * (check); only when that succeeds does the caller swap it in (apply). A
 * configuration object is immutable once in use except through config_set(),
 * which the console's SET calls on the live object.
 *
 * Ownership: config_load() returns a new object the caller frees with
 * config_free(); every string inside it is owned by it.
 */
#ifndef LOKADB_CONFIG_H
#define LOKADB_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int64_t usec_t;		/* microseconds */
#define USEC 1000000LL

enum cf_type {
	CF_INT,		/* int; plain integer */
	CF_BOOL,	/* int 0/1; accepts 0/1, on/off, true/false, yes/no */
	CF_STR,		/* char *; NULL when empty */
	CF_TIME,	/* usec_t; "15" (seconds), "1.5", "500ms", "30s", "2min", "1h" */
	CF_SIZE,	/* int64_t bytes; "256MB", "64kB", "1GB", plain bytes */
	CF_ENUM,	/* int; index into the row's enum names */
};

enum pool_mode { POOL_SESSION = 0, POOL_TRANSACTION = 1, POOL_STATEMENT = 2 };
/*
 * auth_type values, then methods only an auth_hba_file rule can pick
 * (AUTH_REJECT, AUTH_PEER: no auth_type name).
 */
enum auth_type { AUTH_ANY = 0, AUTH_TRUST, AUTH_PLAIN, AUTH_MD5, AUTH_SCRAM, AUTH_CERT, AUTH_HBA, AUTH_REJECT, AUTH_PEER };
enum sslmode { SSL_DISABLE = 0, SSL_ALLOW, SSL_PREFER, SSL_REQUIRE, SSL_VERIFY_CA, SSL_VERIFY_FULL };

struct cf_setting {
	const char *name;
	enum cf_type type;
	size_t offset;			/* offsetof(struct lk_config, field) */
	const char *def;		/* default, as text (NULL = empty string) */
	int64_t min, max;		/* range for CF_INT/CF_TIME/CF_SIZE (0,0 = none) */
	bool reloadable;		/* may RELOAD / SET change it */
	const char *const *enums;	/* CF_ENUM: NULL-terminated names */
	const char *doc;		/* one line for SHOW CONFIG / doc/config.md */
};

/* One [databases] entry. Unset numbers are -1 (meaning: the global default). */
struct db_conf {
	char *name;		/* client-side name; "*" for the fallback entry */
	char *host;		/* NULL or "/dir": unix socket (dir default /var/run/postgresql) */
	int port;		/* default 5432 */
	char *dbname;		/* server-side name; NULL = same as name */
	char *user;		/* forced server user, or NULL */
	char *password;		/* password for the forced user, or NULL */
	char *auth_user;
	char *auth_query;	/* NULL = the global auth_query */
	char *auth_dbname;	/* NULL = the global auth_dbname, else dbname */
	int pool_size;
	int min_pool_size;
	int reserve_pool_size;
	int pool_mode;		/* enum pool_mode or -1 */
	int max_db_connections;
	int max_db_client_connections;	/* -1 = the global setting */
	char *connect_query;
	char *client_encoding;
	char *datestyle;
	char *timezone;
	char *application_name;
	char *transport;	/* plugin transport name, or NULL for TCP/unix */
	char *site;		/* site= while loading (moved into host; only with transport=tunnel) */
	usec_t server_lifetime;		/* 0 = the global setting */
	usec_t query_wait_timeout;	/* -1 = the global setting; 0 = wait forever */
	int line;		/* line in the ini file */
};

/* One [users] entry. */
struct user_conf {
	char *name;
	int pool_mode;		/* -1 = default */
	int pool_size;		/* -1 = default */
	int max_user_connections;	/* 0 = unlimited */
	int max_user_client_connections;	/* -1 = the global setting */
	usec_t query_timeout;		/* these four: 0 = the global setting */
	usec_t idle_transaction_timeout;
	usec_t client_idle_timeout;
	usec_t transaction_timeout;
	int reserve_pool_size;		/* -1 = the database's, else the global setting */
	usec_t query_wait_timeout;	/* -1 = the database's, else the global setting; 0 = wait forever */
	int line;
};

/* One auth_file line: "user" "secret". */
struct auth_entry {
	char *user;
	char *secret;		/* plain password, "md5<32 hex>" or "SCRAM-SHA-256$..." */
};

/* One [peers] entry: another lokadb process cancel requests may be forwarded to. */
struct peer_conf {
	char *name;		/* the key as written */
	int id;			/* 1 .. PEER_ID_MAX */
	char *host;		/* NULL: unix socket in /tmp; "/dir": unix socket in dir */
	int port;		/* default 6432 */
	int pool_size;		/* -1 = default_pool_size: most cancel forwards in flight */
	int line;
};
#define PEER_ID_MAX 16383	/* 14 bits of the cancel key, as PgBouncer */

/* A key of a section the core does not own ([plugin.NAME]). */
struct cf_raw {
	char *section;
	char *key;
	char *value;
	int line;
};

struct hba;

struct lk_config {
	char *path;		/* the ini file */

	/* [lokadb] / [pgbouncer] settings; see config_settings[] */
	char *logfile;
	char *pidfile;
	char *listen_addr;	/* comma list; "*" = all; NULL = unix socket only */
	int listen_port;
	char *unix_socket_dir;	/* NULL = no unix socket */
	int unix_socket_mode;
	int listen_backlog;
	int auth_type;		/* enum auth_type */
	char *auth_file;
	char *auth_hba_file;
	char *auth_user;	/* runs auth_query */
	char *auth_query;
	char *auth_dbname;
	char *admin_users;	/* comma list */
	char *stats_users;	/* comma list */
	int pool_mode;		/* enum pool_mode */
	int max_client_conn;
	int default_pool_size;
	int min_pool_size;
	int reserve_pool_size;
	usec_t reserve_pool_timeout;
	int max_db_connections;
	int max_user_connections;
	int max_db_client_connections;
	int max_user_client_connections;
	int max_prepared_statements;	/* per server connection; 0 = off */
	char *server_reset_query;
	int server_reset_query_always;
	char *server_check_query;
	usec_t server_check_delay;
	usec_t server_lifetime;
	usec_t server_idle_timeout;
	usec_t server_connect_timeout;
	usec_t server_login_retry;
	int server_fast_close;
	usec_t query_timeout;
	usec_t query_wait_timeout;
	usec_t query_wait_notify;
	usec_t cancel_wait_timeout;
	usec_t client_idle_timeout;
	usec_t client_login_timeout;
	int client_tls_sslmode;		/* enum sslmode */
	char *client_tls_key_file;
	char *client_tls_cert_file;
	char *client_tls_ca_file;
	char *client_tls_protocols;
	char *client_tls_ciphers;
	int server_tls_sslmode;		/* enum sslmode */
	char *server_tls_ca_file;
	char *server_tls_cert_file;
	char *server_tls_key_file;
	char *server_tls_protocols;
	char *server_tls_ciphers;
	usec_t idle_transaction_timeout;
	usec_t transaction_timeout;
	usec_t suspend_timeout;
	int64_t max_message_bytes;
	int pkt_buf;
	char *ignore_startup_parameters;	/* comma list */
	char *track_extra_parameters;	/* comma list */
	int application_name_add_host;
	int log_connections;
	int log_disconnections;
	int log_pooler_errors;
	int log_stats;
	usec_t stats_period;
	int verbose;
	int syslog;
	char *syslog_ident;
	char *syslog_facility;
	usec_t dns_max_ttl;
	usec_t dns_nxdomain_ttl;
	int tcp_keepalive;
	int tcp_keepidle;
	int tcp_keepintvl;
	int tcp_keepcnt;
	int so_reuseport;
	int disable_pqexec;
	usec_t autodb_idle_timeout;
	char *plugins;		/* space/comma list of plugin names */
	char *plugin_dir;
	int peer_id;		/* 0 = peering off */
	char *metrics_listen;	/* "host:port" of the Prometheus endpoint, NULL = off */

	struct db_conf *dbs;
	int n_dbs;
	struct user_conf *users;
	int n_users;
	struct auth_entry *auth;	/* from auth_file */
	int n_auth;
	struct hba *hba;		/* from auth_hba_file (NULL when unset) */
	struct cf_raw *raw;		/* [plugin.*] keys, in file order */
	int n_raw;
	struct peer_conf *peers;	/* [peers] */
	int n_peers;
};

/* The settings table, terminated by a row with name == NULL. */
extern const struct cf_setting config_settings[];

/*
 * Load `path` into a new object. On error returns NULL and writes
 * "FILE:LINE: reason" (or "FILE: reason") into err. Also reads auth_file.
 */
struct lk_config *config_load(const char *path, char *err, size_t errlen);

/* A config with every default (no databases); for tests and -V. */
struct lk_config *config_defaults(void);

void config_free(struct lk_config *cf);	/* accepts NULL */

/* Look up a setting by name (case-insensitive), or NULL. */
const struct cf_setting *config_find(const char *name);

/*
 * Set one setting from text (console SET). Refuses unknown names, bad values
 * and non-reloadable settings, with a reason in err. Changes nothing on error.
 */
bool config_set(struct lk_config *cf, const char *name, const char *value, char *err, size_t errlen);

/* The current value of a setting as text (SHOW CONFIG's "value" column). */
void config_format(const struct lk_config *cf, const struct cf_setting *s, char *buf, size_t len);

/* Parse one value for a setting into *out without storing it; for checks. */
bool config_parse_value(const struct cf_setting *s, const char *value, void *out, char *err, size_t errlen);

const struct db_conf *config_find_db(const struct lk_config *cf, const char *name);	/* exact name */
const struct user_conf *config_find_user(const struct lk_config *cf, const char *name);
const struct auth_entry *config_find_auth(const struct lk_config *cf, const char *user);
/* A pool's pool_size and reserve_pool_size: the user's [users] value, else dc's, else the global one (user may be NULL). */
int config_pool_size(const struct lk_config *cf, const struct db_conf *dc, const char *user);
int config_reserve_pool_size(const struct lk_config *cf, const struct db_conf *dc, const char *user);
const struct peer_conf *config_find_peer(const struct lk_config *cf, int id);

/* A file setting as a path (relative to the ini file's directory); malloc'ed, NULL on OOM. */
char *config_file_path(const struct lk_config *cf, const char *file);
/* Is `name` in the comma/space separated list? (admin_users etc.) */
bool config_list_has(const char *list, const char *name);

/* Write doc/config.md: every setting with type, default, reload and doc. */
void config_write_markdown(FILE *f);

#endif
