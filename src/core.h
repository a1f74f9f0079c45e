/* SPDX-License-Identifier: ISC */
/*
 * core.h -- the objects of the pooler and the one runtime object that owns
 * them (PgBouncer's object model; DESIGN.md section 4).
 *
 *   lk_runtime   the process: event base, config, lists of everything
 *   lk_db        one [databases] entry (or an autodb made from "*")
 *   pool         (database, client user): clients and server connections
 *   client       a connection from an application
 *   server       a connection to PostgreSQL, owned by exactly one pool
 *
 * A client and a server are linked while the server works for the client.
 * Every client is on exactly one list: rt->login_clients while it logs in,
 * rt->admin_clients for the console, or its pool's active/waiting list.
 * Every server is on exactly one of its pool's lists, by state.
 *
 * Do not free a client or server from inside its own bufferevent callback
 * chain without going through client_close()/server_close(): they defer the
 * free to the end of the loop turn (rt->justfree), as PgBouncer does.
 */
#ifndef LOKADB_CORE_H
#define LOKADB_CORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/event.h>
#include <event2/bufferevent.h>
#include <event2/buffer.h>
#include <event2/listener.h>

#include "config.h"
#include "lokadb/plugin.h"

#ifndef TAILQ_FOREACH_SAFE
#define TAILQ_FOREACH_SAFE(var, head, field, tvar) \
	for ((var) = TAILQ_FIRST(head); (var) && ((tvar) = TAILQ_NEXT(var, field), 1); (var) = (tvar))
#endif
#include "log.h"
#include "pktbuf.h"
#include "prepared.h"
#include "resulttables.h"

#define LOKADB_VERSION "0.1.0"
#define STARTUP_MAX_LEN 10000		/* like PostgreSQL's MAX_STARTUP_PACKET_LENGTH */
#define PROTO_CANCEL_CODE 80877102
#define PROTO_SSL_CODE 80877103
#define PROTO_GSSENC_CODE 80877104
#define PROTO_V3 196608
#define WRITE_HIGH_WATER (256 * 1024)	/* stop reading the peer above this much queued output */
#define WRITE_LOW_WATER (64 * 1024)
#define CLIENT_READ_HIGH (256 * 1024)	/* unread client input kept at most (waiting clients keep reading to see EOF) */
#define CONSOLE_QUERY_MAX (64 * 1024)
#define JANITOR_PERIOD_USEC 200000
#define CLIENT_STRS 128		/* bytes of a client's user, dbname and secret kept without malloc */
#define AFF_SLOTS 32			/* affinity keys a server remembers at most */

/* ParameterStatus values the pooler keeps equal between client and server. */
enum var_id { VAR_CLIENT_ENCODING, VAR_DATESTYLE, VAR_TIMEZONE, VAR_STD_STRINGS, VAR_APPNAME, VAR_INTERVALSTYLE, VAR_COUNT };

#define VAR_INLINE 32		/* values shorter than this live in struct varcache itself */

/*
 * v[id] points into inl[id], to a malloc'ed copy, or (bit id of `shared`) to
 * a string that outlives the varcache (varcache_set_shared()): never copy
 * the struct, never free v[] yourself.
 */
struct varcache {
	char *v[VAR_COUNT];
	uint64_t stamp;		/* changes with every change of v[]: unique over the process */
	unsigned shared;
	char inl[VAR_COUNT][VAR_INLINE];
};

enum client_state {
	CL_LOGIN,		/* startup packet and authentication */
	CL_WAITING_LOGIN,	/* authenticated, waiting for the pool's first server (welcome params) */
	CL_ACTIVE,		/* logged in; linked to a server or idle */
	CL_WAITING,		/* wants a server, queued in its pool */
	CL_ADMIN,		/* console session */
	CL_CLOSING,		/* flushing its last words: on rt->closing_clients */
	CL_JUSTFREE,		/* closed: on rt->justfree_clients until the loop turn ends */
};

enum server_state {
	SV_LOGIN,		/* resolving, connecting or authenticating */
	SV_IDLE,		/* ready, in the pool */
	SV_ACTIVE,		/* linked to a client */
	SV_TESTED,		/* running server_reset_query / check, no client */
	SV_JUSTFREE,		/* closed: on no list but rt->justfree_servers */
};

struct lk_stats {
	uint64_t xact_count, query_count, server_assignment_count, client_login_count;
	uint64_t bytes_received, bytes_sent;
	uint64_t xact_time, query_time, wait_time;	/* usec */
	uint64_t client_parse_count, server_parse_count, bind_count;	/* prepared statements */
	uint64_t server_evict_count;	/* statements a server connection closed to make room */
};

/* Write-through state of a connection's output (util.c). */
struct conn_io {
	TAILQ_ENTRY(conn_io) entry;	/* on rt->flush_list while queued */
	struct bufferevent *bev;
	struct event *rd;		/* our own read event on the bufferevent's socket */
	size_t rd_high;			/* stop reading with this much unread input (0: no limit) */
	bool queued;
	bool rd_want;			/* the owner wants input */
	bool rd_on;			/* rd is added */
	bool spare_ok;			/* its bufferevent may be kept as a spare when freed */
	bool tls;			/* ssl is set: reads and writes go through OpenSSL */
	bool console;			/* a console session: keeps reading while SUSPENDed */
	bool hs_done;			/* TLS handshake finished */
	bool wr_on;			/* wr is added */
	bool rd_on_wr;			/* TLS: a read waits for the socket to be writable */
	struct ssl_st *ssl;		/* TLS on the bufferevent's socket (util.c, tls.c) */
	struct event *wr;		/* TLS: our write event while the kernel is full */
	unsigned long ssl_err;		/* TLS: the OpenSSL error that ended the connection */
	struct evbuffer_cb_entry *out_cb;	/* conn_write_through()'s callback on the output */
};

#define CONN_SPARES_MAX 64
struct conn_spare {
	struct bufferevent *bev;
	struct event *rd;
	struct evbuffer_cb_entry *out_cb;	/* disabled, its argument `owner` */
	struct conn_io *owner;
};
TAILQ_HEAD(conn_io_list, conn_io);

struct lk_db;
struct pool;
struct server;
struct cancel_req;
struct stmt_text;

/* ---- plugins (plugin.c) ---- */
struct plugin_setting {
	char *key, *def, *doc;
	char *value;			/* in use (NULL = default) */
	char *pending;			/* checked, not yet applied */
	int line;			/* ini line of the pending value (0 = defaulted) */
};

struct lk_plugin {
	char *name, *path;
	void *dl;
	const struct lk_plugin_desc *desc;
	int index;			/* context slot */
	void *data;
	char *init_err;
	bool in_init;
	unsigned hooks;			/* bit per enum lk_hook */
	struct plugin_setting *settings;
	int n_settings;
};

struct hook_entry {
	struct lk_plugin *pl;
	lk_hook_fn fn;
	int prio;
};

struct hook_chain {
	struct hook_entry *v;
	int n;
};

struct client {
	TAILQ_ENTRY(client) entry;
	uint64_t id;
	enum client_state state;
	struct bufferevent *bev;
	struct conn_io io;
	struct pool *pool;
	struct lk_db *db;
	struct server *link;
	struct sockaddr_storage addr, local;
	char *user;			/* user, dbname, secret: client_strdup() copies, */
	char *dbname;
	struct varcache vars;
	char strs[CLIENT_STRS];		/* ... kept here while they fit (client_str_free()) */
	uint32_t strs_used;
	uint8_t cancel_key[8];
	usec_t connect_time;		/* wall clock */
	usec_t login_start;		/* monotonic, for client_login_timeout */
	usec_t request_time;		/* monotonic, last message */
	usec_t wait_start;		/* monotonic, when it began waiting */
	bool wait_notified;		/* query_wait_notify's NOTICE sent for this wait */
	uint32_t fwd_remaining;		/* bytes of the current message still to forward */
	bool fwd_drop;			/* ... or to drop (a refused message) */
	bool admin_full;		/* console: admin (not only stats) */
	bool pause_wait;		/* console: PAUSE not answered yet */
	bool suspend_wait;		/* ... the wait is SUSPEND's (for the buffers to drain) */
	struct lk_db *pause_db;		/* ... for this database (NULL: all) */
	bool closing;
	bool throttled;			/* reading paused because the server's output is full */
	/* authentication */
	int auth_step;			/* 0 none, 1 cleartext/md5 sent, 2 SASL started, 3 SASL continue */
	int auth_type;			/* enum auth_type this client logs in with (auth_type, or its hba rule's) */
	bool own_user;			/* console user "pgbouncer" of lokadb's own OS user on the unix socket */
	uint8_t md5_salt[4];
	struct scram_server *scram;
	char *secret;			/* copy of its auth_file secret (reloads free the config) */
	uint8_t scram_keys[64];		/* ClientKey + ServerKey from its SCRAM login */
	bool has_scram_keys;
	bool secret_missing;		/* a plugin's AUTH_LOOKUP said: no such user */
	struct authq_req *authq;	/* auth_query lookup in progress */
	bool tls;			/* the connection runs TLS */
	char *peer_ident;
	/* plugins */
	void **pctx;			/* per-plugin context slots (NULL until used) */
	bool watch;			/* QUERY hook wanted for Q/P/B */
	bool hooked;			/* ran CLIENT_STARTUP: owes a CLIENT_CLOSE */
	bool skip_to_sync;		/* a P/B failed: drop messages up to Sync */
	bool route_done;		/* ROUTE decided for the next server acquisition */
	struct lk_event *qev;		/* QUERY event of the message at the head of the input */
	struct lk_event *rev;		/* ROUTE event */
	struct lk_event *lev;		/* CLIENT_STARTUP / AUTH_LOOKUP event while ASYNC */
	struct lk_result *console_res;	/* console command answered later (LK_ASYNC) */
	char *startup;			/* startup packet parameters (name\0value\0...) */
	uint32_t startup_len;
	struct stmt_text *stmts;	/* watched clients: statement name -> text */
	bool stmt_resends;		/* a re-parse was lost once: look for texts to send again */
	struct ps_cli *ps;		/* its prepared statements (prepared.c), NULL until one */
	bool ps_on;			/* max_prepared_statements applies (not session mode) */
	struct answer_wait *answer_waits;	/* plugins waiting for its messages' answers (client_on_answered) */
	struct event *answer_ev;	/* ... told from the loop */
	struct rt_names rnames;		/* statements and portals whose RowDescriptions a plugin's
					 * tables rename (api->query_result_tables) */
	uint64_t affinity;		/* a plugin's affinity key for server choice (0: none) */
	int aff_max;			/* ... keys a server keeps at most */
	int aff_passed;			/* times a waiting client was passed over for another's affinity */
	int aff_home;			/* its affinity key's home index when it last asked for a server (pool.c) */
};

struct server {
	TAILQ_ENTRY(server) entry;
	uint64_t id;
	enum server_state state;
	int home;			/* its index in the pool (0, 1, ...): affinity keys assigned to it are at home on it;
					 * next to entry: idle_server_for reads one cache line per idle server */
	struct bufferevent *bev;
	struct conn_io io;
	struct pool *pool;
	struct client *link;
	struct sockaddr_storage addr;
	socklen_t addrlen;
	struct varcache vars;
	uint64_t vars_from, vars_at;	/* sync_vars(): the client varcache stamp last applied, and ours after it */
	uint8_t cancel_key[8];
	int backend_pid;
	struct replyq rq;		/* the replies it owes, in order (prepared.h) */
	struct ps_srv *ps;		/* the statements it has prepared (prepared.c) */
	char txn_status;		/* last ReadyForQuery status */
	bool ready;			/* nothing owed, idle in no transaction */
	bool copy_in;
	bool ext_open;			/* extended-protocol messages sent since the last Sync */
	bool ext_fails;			/* and a Parse, Bind, Describe or Execute went to the server
					 * (each fails in a failed block: PostgreSQL then skips to the Sync) */
	bool ext_armed;			/* values went inside a batch: mark the next item owing a ReadyForQuery */
	bool ext_err;			/* an ErrorResponse (or a ROLLBACK) since the last ReadyForQuery */
	bool rfq_err;			/* an ErrorResponse to a client's message since the last ReadyForQuery */
	/* it skips the client's messages to a Sync not sent yet (an error), and
	 * the client goes on (a plugin held its next message): replies the core
	 * would make up for them wait, and go with the skipped at that Sync, as
	 * a Query sent meanwhile does (no ReadyForQuery of its own comes) */
	bool skipping;
	bool txn_failed;		/* the last idle ReadyForQuery ended a transaction an error rolled back */
	bool txn_marked;		/* a marked message was answered, its transaction not ended yet */
	bool marked_failed;		/* a transaction of a marked message ended rolled back (since TXN_END) */
	uint32_t ext_live;		/* reply items owing a ReadyForQuery that answers values sent inside a batch */
	uint32_t ext_seq;		/* tvars.esent of the last values sent inside a batch */
	uint8_t tls_step;		/* 0 plain, 1 SSLRequest sent, 2 TLS handshake, 3 TLS up */
	bool close_needed;		/* RECONNECT / config change: close when released */
	bool checked;			/* ran a query of the pooler since its last client */
	bool closing;
	bool connected;
	int login_step;
	struct scram_client *scram;
	usec_t connect_time;		/* wall clock */
	usec_t created;			/* monotonic */
	usec_t linked_at;		/* monotonic, when its current client got it (pool_link) */
	usec_t last_used;		/* monotonic: last release or activity */
	usec_t query_start, xact_start;
	bool in_query, in_xact;		/* the client's query / transaction is running (stats) */
	uint32_t fwd_remaining;
	bool fwd_hidden;		/* the message being forwarded is dropped */
	uint32_t batch;			/* whole messages at the head of the input, decided, not yet moved */
	bool batch_hidden;		/* ... and dropped rather than forwarded */
	bool throttled;
	void **pctx;			/* per-plugin context slots */
	struct lk_connect *conn_req;	/* plugin transport connect in progress */
	uint64_t aff[AFF_SLOTS];	/* affinity keys it served last, the newest last */
	uint8_t n_aff;
	struct tvars *tvars;		/* session values plugins asked for (query_set_var), plugin.c */
};

TAILQ_HEAD(client_list, client);
TAILQ_HEAD(server_list, server);

struct lk_db {
	TAILQ_ENTRY(lk_db) entry;
	char *name;
	struct db_conf conf;		/* own copy of strings */
	bool autodb;
	bool paused;
	bool removed;
	int server_count;
	usec_t last_used;
};

struct param {
	char *name;
	char *value;
	int var;			/* enum var_id, or -1 */
};

struct pool {
	TAILQ_ENTRY(pool) entry;
	struct lk_db *db;
	char *user;			/* client user (pool key) */
	char *login_user;		/* server login user */
	char *login_password;		/* plain password or md5 secret, or NULL */
	struct client_list active_clients, waiting_clients, login_clients;
	struct server_list active_servers, idle_servers, tested_servers, login_servers;
	int n_active_cl, n_waiting_cl, n_login_cl;
	int n_active_sv, n_idle_sv, n_tested_sv, n_login_sv;
	struct param *welcome;		/* ParameterStatus of the first server */
	int n_welcome;
	bool welcome_ready;
	uint8_t *welcome_wire;		/* client_welcome(): welcome[] as ParameterStatus messages, */
	uint32_t *welcome_off;		/* welcome[i] at welcome_off[i] (n_welcome + 1 offsets) */
	int welcome_wire_n;		/* n_welcome they were built for */
	usec_t last_connect_fail;	/* monotonic */
	char *last_error;
	struct lk_stats stats, prev_stats, avg;
	usec_t evict_warned_at;		/* the last "max_prepared_statements is short" line (pool.c) */
	usec_t last_used;
	int mode;			/* cached pool_mode_of(); refreshed on reload and SET */
	uint8_t scram_keys[64];		/* a client's ClientKey + ServerKey for login_password */
	bool has_scram_keys;
	struct aff_map *aff;		/* affinity keys -> home index (pool.c); NULL until a key comes */
	uint64_t aff_home_count, aff_known_count, aff_away_count;	/* clients with a key given their home server,
								 * another that served the key lately, another */
};

TAILQ_HEAD(db_list, lk_db);
TAILQ_HEAD(pool_list, pool);

struct listener {
	struct evconnlistener *l;
	int fd;
	char name[128];
	bool is_unix;
	char *unix_path;
	unsigned long long unix_ino;	/* inode of the socket file we bound: only that one is unlinked */
};

enum shutdown_mode { SHUT_NONE, SHUT_WAIT_CLIENTS, SHUT_WAIT_SERVERS, SHUT_NOW };

struct lk_runtime {
	struct event_base *base;
	struct lk_config *cf;
	const char *config_path;
	struct db_list dbs;
	struct pool_list pools;
	struct client_list login_clients, admin_clients, closing_clients, justfree_clients;
	struct server_list justfree_servers;
	LIST_HEAD(cancel_list, cancel_req) cancel_reqs;	/* CancelRequests on their way to servers */
	struct listener *listeners;
	int n_listeners;
	struct event *janitor, *stats_timer, *justfree_ev, *flush_ev;
	struct event *tcp_close_ev;	/* shutdown: closes the TCP listeners after a short grace */
	bool tcp_closing;		/* ... which is running: do not exit yet */
	struct conn_io_list flush_list;		/* outputs to write at the end of this loop turn */
	bool in_read_ev;			/* in conn_read_ev(): it flushes flush_list when the read is handled */
	struct event *sig_hup, *sig_term, *sig_int, *sig_quit, *sig_usr1, *sig_usr2;
	struct dns_ctx *dns;
	int n_clients;			/* all client connections, for max_client_conn */
	bool paused;			/* global PAUSE */
	bool suspended;			/* SUSPEND: no reading from any connection but the console's, no accepting */
	usec_t suspend_start;		/* monotonic: when SUSPEND began */
	bool accept_paused;		/* accept() ran out of descriptors: listeners off until the next janitor run */
	usec_t accept_fail_logged;	/* monotonic: when that was last logged (repeats are suppressed) */
	enum shutdown_mode shutdown;
	uint64_t next_id;
	usec_t start_time;
	usec_t now;			/* monotonic, refreshed as each socket is read (hot-path clock) */
	bool quiet, daemon;
	int verbose;
	struct pktbuf pb;		/* scratch for building replies; emptied after each use */
	char readbuf[16384];		/* socket reads land here before their evbuffer */
	struct conn_spare spares[CONN_SPARES_MAX];	/* closed clients' bufferevents for reuse */
	int n_spares;
	struct client *client_cache[CONN_SPARES_MAX];	/* freed client objects for reuse */
	int n_client_cache;
	struct lk_plugin **plugins;	/* in `plugins =` order */
	int n_plugins;
	struct hook_chain hooks[LK_HOOK_COUNT];
	struct peer_group *peers;	/* peers.c: the [peers] group (NULL until first used) */
	struct metrics *metrics;	/* metrics.c: the Prometheus endpoint and what plugins registered */
	struct ps_cache *ps_cache;	/* prepared statements of every pool (prepared.c) */
	uint8_t rand_pool[4096];	/* random_bytes(): unread CSPRNG output */
	size_t rand_pos;		/* bytes of rand_pool already handed out */
};

extern struct lk_runtime *rt;

/* util */
usec_t now_mono(void);
usec_t now_wall(void);
char *xstrdup(const char *s);
void random_bytes(void *buf, size_t n);
void tcp_tune(int fd);
void tcp_tune_listener(int fd);
void *xcalloc(size_t n, size_t size);
const char *addr_to_str(const struct sockaddr_storage *ss, char *buf, size_t len, int *port);
void varcache_free(struct varcache *vc);
void varcache_set(struct varcache *vc, enum var_id id, const char *value);
void varcache_set_shared(struct varcache *vc, enum var_id id, const char *value);
int varcache_lookup(const char *name);
const char *varcache_name(enum var_id id);

/* write-through output (util.c) */
void conn_write_through(struct conn_io *wt, struct bufferevent *bev);
bool conn_io_start(struct conn_io *io, size_t rd_high);
void conn_want_read(struct conn_io *io, bool on);
void conn_read_check(struct conn_io *io);
void conn_read_now(struct conn_io *io);
void conn_write_idle(struct bufferevent *bev);
void conn_free(struct conn_io *wt, struct bufferevent *bev);
void conn_flush_all(void);
void conn_send_now(struct conn_io *wt);
size_t conn_send_from(struct conn_io *wt, struct evbuffer *src, size_t n);
struct bufferevent *conn_bev_for(struct conn_io *io, int fd);
struct ssl_st;
bool conn_start_tls(struct conn_io *io, struct ssl_st *ssl, bool accepting);
void conn_flush_close(struct conn_io *io);
void conn_set_rd_high(struct conn_io *io, size_t high);
void conn_spares_free(void);

/* client.c */
void client_accept(int fd, const struct sockaddr *sa, int salen, bool is_unix);
void client_process(struct client *c);
void client_close(struct client *c, const char *sqlstate, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void client_welcome(struct client *c);
void client_strings_free(struct client *c);
void client_set_string(struct client *c, char **slot, const char *s);
void client_release(struct client *c);
void client_cache_free(void);
void client_resume(struct client *c);
const char *client_ident(const struct client *c, char *buf, size_t len);
void client_free_now(struct client *c);

/* server.c */
struct server *server_launch(struct pool *p);
void server_transport_ready(struct server *s, int fd);
void server_transport_failed(struct server *s, const char *msg);
void server_cancel_fd(const uint8_t *pkt16, int fd);
void server_close(struct server *s, const char *reason, ...) __attribute__((format(printf, 2, 3)));
void server_process(struct server *s);
void server_send_hidden(struct server *s, const char *sql);
void server_send_hidden_ext(struct server *s, const char *sql);
const char *server_ident(const struct server *s, char *buf, size_t len);
void server_free_now(struct server *s);
void server_cancel(struct server *s);
void server_cancel_free_all(void);

/* pool.c */
struct lk_db *db_lookup(const char *name, bool create_auto);
struct pool *pool_get(struct lk_db *db, const char *user, const char *secret);
int pool_mode_of(const struct pool *p);
int pool_size_of(const struct pool *p);
int pool_free_home(const struct pool *p);
void pool_launch_first(struct pool *p);
void pool_take_scram_keys(struct pool *p, struct client *c);	/* a server for a pool without one yet */
bool pool_acquire(struct client *c);		/* links a server, or queues c: false */
void pool_release(struct server *s);		/* server done with its client */
void pool_server_ready(struct server *s);	/* login or reset finished: give it work */
void pool_server_login_failed(struct pool *p, const char *sqlstate, const char *msg);
void pool_transport_failed(struct pool *p, const char *msg);	/* also its waiting clients, if nothing serves them */
void pool_client_gone(struct client *c);
bool pool_move_client(struct client *c, struct lk_db *db);	/* another pool, same user */
void pool_set_client_state(struct client *c, enum client_state st);
void pool_set_server_state(struct server *s, enum server_state st);
void pool_janitor(void);
void pool_stats_tick(void);
void pool_apply_config(struct lk_config *old);
void pool_reconnect(struct lk_db *db);
void pool_kill(struct lk_db *db);
int pool_retire_server(uint64_t id, const char *why);
void pool_resume(struct lk_db *db);
bool pool_is_paused(const struct pool *p);
int pool_active_servers(struct lk_db *db);
int pool_db_client_limit(const struct lk_db *db);	/* max_db_client_connections in force (0: none) */
int pool_user_client_limit(const char *user);		/* max_user_client_connections in force (0: none) */
void pool_client_counts(const struct lk_db *db, const char *user, int *n_db, int *n_user);
void pool_free_all(void);

/* admin.c */
void admin_handle(struct client *c, const char *sql);
void admin_janitor(void);
bool admin_is_dbname(const char *name);
bool admin_is_core_command(const char *name);
bool admin_db_disabled(const struct lk_db *db);	/* console DISABLE db */
void admin_stats_sum(struct lk_db *db, struct lk_stats *tot, struct lk_stats *avg);	/* SHOW STATS of db (NULL: all) */
typedef void (*admin_list_fn)(void *arg, const char *name, int n);
void admin_lists(admin_list_fn fn, void *arg);	/* SHOW LISTS rows */

/* runtime.c */
void runtime_init(void);
bool runtime_open_listeners(void);
void runtime_apply_log_settings(void);
void runtime_raise_nofile(void);
bool runtime_setup_events(void);
void runtime_stop_background_events(void);
void runtime_teardown(void);
bool lokadb_reload(char *err, size_t errlen);
void lokadb_shutdown(enum shutdown_mode mode);
void lokadb_check_shutdown(void);
void lokadb_suspend(bool on);
size_t lokadb_unflushed(void);
void lokadb_suspend_drop(void);

/* plugin.c */
bool plugins_load(const struct lk_config *cf, char *err, size_t errlen);
bool plugins_check(struct lk_config *cf, bool reloading, char *err, size_t errlen);
void plugins_apply(bool reloading);
void plugins_fini(void);
bool plugin_set(const char *name, const char *value, char *err, size_t errlen);	/* SET plugin.N.K */
void plugin_show_config(struct pktbuf *pb);
void plugin_show_plugins(struct pktbuf *pb);
bool plugin_console(struct client *c, const char *query);	/* true: a plugin command ran */
void plugin_console_help(char *buf, size_t len);
bool plugin_console_name_taken(const char *name);
/* hooks run from the core; see plugin.c for each one's contract */
int plugin_client_startup(struct client *c);
int plugin_auth_lookup(struct client *c);
char *plugin_event_take_secret(struct lk_event *ev);
int plugin_query(struct client *c, const uint8_t *msg, uint32_t len);
int plugin_route(struct client *c);
void plugin_txn_end(struct client *c, struct server *s);
void plugin_client_close(struct client *c);
void plugin_server_close(struct server *s);
void plugin_shutdown(void);		/* LK_HOOK_SHUTDOWN, once per process */
void plugin_client_free(struct client *c);
void plugin_client_answered(struct client *c);
bool plugin_client_await(struct client *c);
bool plugin_renames_unsettled(const struct client *c);
void plugin_query_parse_msg(struct lk_event *ev, struct pktbuf *pb);
/* The statement texts plugins see (stmt_text) follow the client's Parse, Close and Query, with their undo. */
struct rq_item;
void plugin_stmt_drop(struct stmt_text *st);
void plugin_stmt_query_failed(struct client *c, struct rq_item *it);
void plugin_stmt_undo(struct client *c, struct rq_item *it, bool failed);
void plugin_stmt_closed(struct client *c, const char *name, struct rq_item *it);
void plugin_stmts_dropped(struct client *c, uint32_t gen_at);
void plugin_stmt_query_sent(struct client *c, struct rq_item *it);
void plugin_server_free(struct server *s);
bool plugin_transport_connect(struct server *s);
bool plugin_transport_cancel(struct server *s, const uint8_t *pkt16);
bool plugin_transport_exists(const char *name);
/* the QUERY/ROUTE decision of the message at the head of a client's input */
bool plugin_event_decided(const struct lk_event *ev, int *rc);
void plugin_event_free(struct lk_event *ev);
const char *plugin_event_route(const struct lk_event *ev);
void plugin_event_error(const struct lk_event *ev, const char **sqlstate, const char **msg);
bool plugin_query_build(struct client *c, struct lk_event *ev, struct pktbuf *pb);
/* The reply queue's item of the decided Query or Parse just sent takes the event's text map (ABI 1.12). */
struct rq_item;
void plugin_query_give_map(struct lk_event *ev, struct rq_item *it);
/* The decided Parse or Bind of ev: its statement's or portal's result tables (api->query_result_tables). */
void plugin_query_note_tables(struct client *c, struct lk_event *ev);
char **plugin_query_prefixes(struct lk_event *ev, int *n);
/* query_set_var: send the values the server lacks (hidden), call query_on_vars. */
void plugin_query_send_vars(struct client *c, struct lk_event *ev);
/* server.c tells plugin.c of the server's hidden queries (the tracked values) */
void plugin_tvars_hidden_sent(struct server *s);
void plugin_tvars_hidden_error(struct server *s);
void plugin_tvars_hidden_rfq(struct server *s, char status);
void plugin_tvars_inline_rfq(struct server *s, char status, bool failed);
void plugin_tvars_ext_rfq(struct server *s, uint32_t seq, bool ok);
enum lk_hook plugin_event_hook(const struct lk_event *ev);
void plugin_query_answer(struct lk_event *ev, struct pktbuf *pb);
void plugin_note_parse(struct client *c, const char *name, const char *sql);
bool plugin_query_binds_unnamed(const struct lk_event *ev);
bool plugin_query_wants_reparse(const struct lk_event *ev);
const char *plugin_event_stmt(const struct lk_event *ev);	/* P/B: the client's statement name */
const char *plugin_event_reparse(const struct lk_event *ev);	/* B: the re-parse text, or NULL */
void plugin_note_parse_types(struct client *c, const char *name, const char *sql, const uint8_t *types, uint32_t len);
uint32_t plugin_query_reparse_msgs(struct client *c, struct lk_event *ev, struct pktbuf *pb, int *hidden_acks);
uint32_t plugin_stmt_resend_msgs(struct client *c, struct server *s, const char *name, struct pktbuf *pb,
				 int *hidden_acks);
void plugin_reparse_lost(struct client *c, const struct rq_item *it);
void plugin_stmt_bind_sent(struct client *c, struct lk_event *ev, struct rq_item *it);
void plugin_reparse_unsent(struct client *c, const char *name, uint32_t gen);
bool plugin_startup_param_ok(const char *name);
void client_hook_resumed(struct client *c, struct lk_event *ev);
static inline bool hook_on(enum lk_hook h)
{
	return rt->hooks[h].n != 0;
}

/* the libpq helper of plugin.c, for the core's own queries (auth_query) */
struct lk_pg *core_pg_connect(const char *conninfo, lk_pg_state_fn fn, void *arg);
int core_pg_query(struct lk_pg *pg, const char *sql, int nparams, const char *const *params, lk_pg_result_fn fn,
		  void *arg);
void core_pg_close(struct lk_pg *pg);
struct pg_conn *core_pg_conn(struct lk_pg *pg);

/* authq.c */
struct authq_req;
bool authq_start(struct client *c);
void authq_cancel(struct client *c);
void client_authq_done(struct client *c, const char *secret, const char *error);

/* peers.c: cancel requests across a peer group (peer_id, [peers]) */
struct peer_pool_counts {
	int peer_id;
	int cl_active_cancel_req, cl_waiting_cancel_req, sv_active_cancel, sv_login;
};
typedef void (*peers_walk_fn)(void *arg, const struct peer_pool_counts *n);
void peers_new_cancel_key(uint8_t key[8]);
bool peers_cancel_local(const uint8_t *key, uint8_t *local);	/* false: another peer's key, forwarded or dropped */
void peers_apply(void);
void peers_janitor(usec_t now);			/* cancel_wait_timeout for queued forwards */
void peers_show(struct pktbuf *pb);		/* SHOW PEERS rows */
void peers_show_pools(struct pktbuf *pb);	/* SHOW PEER_POOLS rows */
void peers_walk(peers_walk_fn fn, void *arg);
void peers_counters(uint64_t *forwarded, uint64_t *dropped);
void peers_free_all(void);

/* metrics.c: the Prometheus endpoint (metrics_listen) and plugins' metrics */
bool metrics_start(char *err, size_t errlen);	/* at start, after the event base exists */
void metrics_free_all(void);
int metrics_plugin_register(struct lk_plugin *pl, const char *name, int type, const char *help, lk_metric_fn fn,
			    void *arg);
void metrics_plugin_sample(struct lk_metrics *m, const char *const *labels, double value);

/* tls.c */
bool tls_client_check(const struct lk_config *cf, void **ctx, char *err, size_t errlen);
void tls_client_apply(void *ctx);
void tls_client_discard(void *ctx);
bool tls_client_enabled(void);
struct ssl_st *tls_client_new(void);
const char *tls_describe(const struct conn_io *io, char *buf, size_t len);
const char *tls_error(const struct conn_io *io, char *buf, size_t len);
bool tls_handshake_done(const struct conn_io *io);
bool tls_peer_cn(const struct conn_io *io, char *buf, size_t len);	/* CN of a verified client certificate */
void tls_free_all(void);
bool tls_server_check(const struct lk_config *cf, void **ctx, char *err, size_t errlen);
void tls_server_apply(void *ctx);
struct ssl_st *tls_server_new(const char *host);

/* dns.c */
typedef void (*dns_cb)(void *arg, const struct sockaddr *sa, socklen_t len, const char *error);
struct dns_ctx *dns_new(struct event_base *base);
void dns_free(struct dns_ctx *d);
void dns_resolve(struct dns_ctx *d, const char *host, int port, dns_cb cb, void *arg);
void dns_cancel_arg(struct dns_ctx *d, void *arg);
/* The resolver cache, one call per host name (SHOW DNS_HOSTS): sa NULL for a cached failure; expires monotonic. */
typedef void (*dns_walk_fn)(void *arg, const char *host, const struct sockaddr *sa, socklen_t len, usec_t expires);
void dns_walk(struct dns_ctx *d, dns_walk_fn fn, void *arg);

#endif
