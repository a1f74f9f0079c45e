/* SPDX-License-Identifier: ISC */
/*
 * plugin.c -- the plugin boundary (include/lokadb/plugin.h, DESIGN.md §5):
 * loading and refusing plugins, the API table handed to them, hook chains,
 * [plugin.NAME] settings, console commands, transports, services, timers and
 * the non-blocking libpq helper.
 *
 * Hook chains: one sorted array per hook in rt->hooks (priority, then
 * `plugins =` order). The core calls a chain only when it is not empty
 * (hook_on()), so a hook nobody registered costs one branch.
 *
 * Events: a hook call's arguments are an lk_event. Observer hooks use one on
 * the stack. Hooks that may answer LK_ASYNC (CLIENT_STARTUP, AUTH_LOOKUP,
 * QUERY, ROUTE) get a heap event owned by the client (c->lev, c->qev,
 * c->rev); api->resume() continues the chain after the handler that went
 * asynchronous and then hands the decision back to client.c.
 *
 * Handles: lk_client and lk_server are the core's struct client / struct
 * server; plugins see them only as opaque pointers.
 */
#include "core.h"
#include "textmap.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libpq-fe.h>

#ifndef LOKADB_PLUGIN_DIR
#define LOKADB_PLUGIN_DIR "/usr/local/lib/lokadb/plugins"
#endif

#define CL(h) ((struct client *)(h))
#define SV(h) ((struct server *)(h))

static const char *const hook_names[LK_HOOK_COUNT] = {
	"CONFIG_CHECK", "CONFIG_APPLY", "CLIENT_STARTUP", "AUTH_LOOKUP", "QUERY",
	"ROUTE", "TXN_END", "CLIENT_CLOSE", "SERVER_CLOSE", "SHUTDOWN",
};

struct lk_event {
	enum lk_hook hook;
	struct client *c;
	struct server *s;
	int pos;			/* chain index of the handler running or gone ASYNC */
	bool running;			/* inside a handler */
	bool async;			/* a handler answered LK_ASYNC, resume not yet called */
	bool decided;			/* chain finished; rc is the outcome */
	int early_rc;			/* resume() called from inside the handler */
	bool early;
	int rc;
	char sqlstate[6];
	char *errmsg;
	struct lk_plugin *failer;	/* plugin whose handler failed */
	/* CONFIG_* */
	struct lk_plugin *cfg_pl;
	bool reloading;
	const char *cfg_path;
	char *cfg_err;
	/* AUTH_LOOKUP */
	char *secret;
	bool secret_set;
	/* QUERY */
	char qtype;
	uint32_t blen;			/* of body (below) */
	char *sql, *stmt, *portal;	/* pointers into body, or owned (sql_owned) */
	const char *bound_sql;		/* B: the text of the statement it binds */
	char *new_sql;			/* query_rewrite: NULL, or sqlbuf */
	int nparams;
	uint32_t params_off;		/* P: first type OID; B: first value */
	uint32_t fmts_off;		/* B: format codes */
	int nfmts;
	uint32_t tail_off;		/* B: result format codes */
	char **new_params;		/* B: overrides (text) */
	bool *param_set;
	char **prefix;
	int n_prefix;
	char *reparse;			/* B: parse the bound statement again with this text first */
	struct textmap *map;		/* query_text_spans of new_sql (ABI 1.12), until the reply queue takes it */
	struct stmt_text *st_before;	/* a Parse: the name's entry it replaced (owned), until the reply queue takes it */
	uint64_t st_made;		/* ... and the entry it made (stmt_text.id) */
	bool mark_txn;			/* query_mark_txn: its reply item gets mark_txn */
	struct lk_tables *tables;	/* query_result_tables (ABI 1.13): a reference */
	/* a Parse: what its name's Describes were renamed with before it (a
	 * reference), until the reply queue takes it (the Parse may be refused) */
	struct lk_tables *rn_before;
	bool rn_saved;
	int n_vars;			/* query_set_var, in ->vars */
	struct { struct lk_plugin *pl; lk_vars_fn fn; void *arg; } on_vars[4];	/* query_on_vars */
	int n_on_vars;
	bool vars_inline;		/* Q: the values may go in front of the statement */
	size_t inline_len;		/* ... and do: "SET a = 'x'; " in ->inl (query_vars_inline) */
	int inline_n;			/* SET statements in it */
	char *route;
	struct lk_result *res;
	/* Kept when a freed event is used again (ev_spare): not cleared by hev_new. */
	uint8_t *body;			/* Q/P/B: copy of the message body */
	size_t body_cap;
	char *sqlbuf;			/* new_sql's storage */
	size_t sqlbuf_cap;
	char *inl;			/* inline_len bytes and a NUL */
	size_t inl_cap;
	struct ev_vars *vars;		/* allocated by the first query_set_var */
};

#define EV_KEPT offsetof(struct lk_event, body)
#define EV_VAR_NAME 64			/* query_set_var: a name of at most 63 bytes */
#define EV_VAR_VALUE 256		/* ... and a value of at most 255 */

/* The query_set_var values of a message (has[i] false: forget name[i]). */
struct ev_vars {
	char name[8][EV_VAR_NAME];
	char value[8][EV_VAR_VALUE];
	uint8_t nlen[8];
	uint16_t vlen[8];
	bool has[8];
};

struct lk_result {
	struct client *c;		/* NULL when its client went away */
	struct pktbuf pb;
	bool console;
	bool columns, complete, failed, async;
	int ncols, nrows;
};

struct transport {
	char *name;
	struct lk_plugin *pl;
	lk_transport_fn fn;
};

struct lk_connect {
	struct transport *t;
	struct server *s;		/* NULL for a cancel */
	struct lk_db *db;
	char *host, *dbname, *database;
	int port;
	uint8_t cancel[16];
	bool is_cancel;
	bool in_call;
	bool done;
	struct lk_connect *next;	/* on the pending-cancel list */
};

struct service {
	char *name;
	const void *table;
	struct lk_plugin *pl;
};

struct console_cmd {
	char *name;			/* one or two words, upper case */
	struct lk_plugin *pl;
	lk_console_fn fn;
	bool admin_only;
	char *doc;
};

struct lk_timer {
	LIST_ENTRY(lk_timer) entry;
	struct event *ev;
	struct lk_plugin *pl;
	lk_timer_fn fn;
	void *arg;
	bool repeat;
};

struct answer_wait {
	struct answer_wait *next;
	struct lk_plugin *pl;
	lk_answered_fn fn;
	void *arg;
};

struct pg_cb {
	struct pg_cb *next;
	char *sql;
	int nparams;
	char **params;
	lk_pg_result_fn fn;
	void *arg;
	bool sent;
};

struct lk_pg {
	LIST_ENTRY(lk_pg) entry;
	struct lk_plugin *pl;
	PGconn *conn;
	struct event *ev;
	bool connecting, writing, closed;
	lk_pg_state_fn state_fn;
	void *state_arg;
	lk_pg_notify_fn notify_fn;
	void *notify_arg;
	struct pg_cb *head, *tail;
	PGresult *last;
	int in_cb;			/* inside pg_io: pg_close() defers the free */
	bool free_me;
};

struct stmt_text {
	struct stmt_text *next;
	char *name, *sql;
	uint8_t *types;			/* the Parse's parameter type block: int16 n + n int32 OIDs */
	uint32_t types_len;
	uint32_t gen;			/* changes with each text noted (stmt_gen) */
	uint64_t id;			/* the entry's own, for the undo of the client's Parse that made it */
	bool resend;			/* a re-parse of `sql` did not reach the server: Parse it again before its next Bind */
};

static uint32_t stmt_gen;		/* the last stmt_text.gen given */

static uint32_t next_stmt_gen(void)
{
	if (++stmt_gen == 0)
		stmt_gen = 1;	/* (0: no re-parse, in rq_item.reparse_gen) */
	return stmt_gen;
}

static struct {
	char **startup_params;		/* startup parameters plugins accept */
	int n_startup_params;
	struct transport *transports;
	int n_transports;
	struct service *services;
	int n_services;
	struct console_cmd *cmds;
	int n_cmds;
	LIST_HEAD(, lk_timer) timers;
	LIST_HEAD(, lk_pg) pgs;
	struct lk_connect *cancels;	/* cancel connects in progress */
	struct plugin_dns *dns;		/* api->resolve() requests in flight */
	const char *dir;
} P;

/* One api->resolve() request: the core resolver's arg. */
struct plugin_dns {
	struct plugin_dns *next;
	lk_plugin *pl;
	lk_resolve_fn fn;
	void *arg;
};

static const struct lk_api api_table;
static void stmt_free(struct stmt_text *st);
static struct stmt_text *stmt_find(struct client *c, const char *name);
static bool client_answered(const struct client *c);

/* ================= small helpers ================= */

/* Append one zeroed element to a registry array: its address, or NULL (out of memory). */
static void *push_slot(void *arrp, int *n, size_t size)
{
	void **arr = arrp;
	char *v = realloc(*arr, size * (size_t)(*n + 1));

	if (!v)
		return NULL;
	*arr = v;
	v += size * (size_t)(*n)++;
	memset(v, 0, size);
	return v;
}

/* malloc, or the end (as xcalloc): for buffers filled at once. */
static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p) {
		log_fatal("out of memory");
		abort();
	}
	return p;
}

static void set_str(char **dst, const char *src)
{
	free(*dst);
	*dst = src ? xstrdup(src) : NULL;
}

static void vset_error(struct lk_event *ev, const char *sqlstate, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	snprintf(ev->sqlstate, sizeof(ev->sqlstate), "%s", sqlstate && strlen(sqlstate) == 5 ? sqlstate : "XX000");
	set_str(&ev->errmsg, msg);
}

/*
 * Freed events wait here for the next one, with their buffers: the QUERY
 * and ROUTE events of every statement cost no allocation. A freed event is
 * referenced by nobody (as with free()), so using it again is safe. Not
 * with AddressSanitizer, which then still catches a use after free.
 */
#if defined(__SANITIZE_ADDRESS__)
#define EV_SPARE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EV_SPARE 0
#endif
#endif
#ifndef EV_SPARE
#define EV_SPARE 4
#endif
#define EV_KEEP_BODY 16384		/* a larger body buffer is not kept */

#if EV_SPARE
static struct lk_event *ev_spare[EV_SPARE];
static int n_ev_spare;
#endif

static struct lk_event *hev_new(enum lk_hook hook, struct client *c, struct server *s)
{
	struct lk_event *ev;

#if EV_SPARE
	if (n_ev_spare) {
		ev = ev_spare[--n_ev_spare];
		memset(ev, 0, EV_KEPT);
	} else
#endif
		ev = xcalloc(1, sizeof(*ev));
	ev->hook = hook;
	ev->c = c;
	ev->s = s;
	return ev;
}

static void result_free(struct lk_result *res)
{
	if (!res)
		return;
	pkt_free(&res->pb);
	free(res);
}

void plugin_event_free(struct lk_event *ev)
{
	if (!ev)
		return;
	/* most are never set: free only what was */
	if (ev->errmsg)
		free(ev->errmsg);
	if (ev->cfg_err)
		free(ev->cfg_err);
	if (ev->secret)
		free(ev->secret);
	if (ev->new_params) {
		for (int i = 0; i < ev->nparams; i++)
			free(ev->new_params[i]);
		free(ev->new_params);
		free(ev->param_set);
	}
	if (ev->prefix) {
		for (int i = 0; i < ev->n_prefix; i++)
			free(ev->prefix[i]);
		free(ev->prefix);
	}
	if (ev->route)
		free(ev->route);
	if (ev->reparse)
		free(ev->reparse);
	if (ev->map)
		textmap_free(ev->map);
	if (ev->st_made) {
		plugin_stmt_drop(ev->st_before);
		ev->st_before = NULL;
		ev->st_made = 0;
	}
	if (ev->tables)
		rt_tables_release(ev->tables);
	if (ev->rn_saved) {
		rt_tables_release(ev->rn_before);
		ev->rn_before = NULL;
		ev->rn_saved = false;
	}
	if (ev->res)
		result_free(ev->res);
#if EV_SPARE
	if (n_ev_spare < EV_SPARE) {
		if (ev->body_cap > EV_KEEP_BODY) {
			free(ev->body);
			ev->body = NULL;
			ev->body_cap = 0;
		}
		if (ev->sqlbuf_cap > EV_KEEP_BODY) {
			free(ev->sqlbuf);
			ev->sqlbuf = NULL;
			ev->sqlbuf_cap = 0;
		}
		ev_spare[n_ev_spare++] = ev;
		return;
	}
#endif
	free(ev->body);
	free(ev->sqlbuf);
	free(ev->inl);
	free(ev->vars);
	free(ev);
}

/* Run the chain of ev->hook from `start`. Returns the first non-CONTINUE result. */
static int chain_run(struct lk_event *ev, int start)
{
	struct hook_chain *ch = &rt->hooks[ev->hook];

	for (int i = start; i < ch->n; i++) {
		int rc;
		ev->pos = i;
		ev->running = true;
		ev->early = false;
		rc = ch->v[i].fn(ch->v[i].pl, ev);
		ev->running = false;
		if (rc == LK_ASYNC && ev->early) {
			rc = ev->early_rc;
			ev->early = false;
		}
		if (rc == LK_ASYNC) {
			ev->async = true;
			return LK_ASYNC;
		}
		if (rc == LK_CONTINUE)
			continue;
		if (rc != LK_HANDLED)
			rc = LK_ERROR;
		if (rc == LK_ERROR) {
			ev->failer = ch->v[i].pl;
			if (!ev->errmsg) {
				snprintf(ev->sqlstate, sizeof(ev->sqlstate), "XX000");
				{
					char msg[256];
					snprintf(msg, sizeof(msg), "plugin %s failed the request", ch->v[i].pl->name);
					set_str(&ev->errmsg, msg);
				}
			}
		}
		return rc;
	}
	return LK_CONTINUE;
}

/* Observers: every handler runs, results ignored. */
static void chain_notify(enum lk_hook hook, struct client *c, struct server *s)
{
	struct lk_event ev;
	struct hook_chain *ch = &rt->hooks[hook];

	memset(&ev, 0, sizeof(ev));
	ev.hook = hook;
	ev.c = c;
	ev.s = s;
	for (int i = 0; i < ch->n; i++) {
		ev.pos = i;
		ev.running = true;
		ch->v[i].fn(ch->v[i].pl, &ev);
	}
	free(ev.errmsg);
}

bool plugin_event_decided(const struct lk_event *ev, int *rc)
{
	if (!ev->decided)
		return false;
	*rc = ev->rc;
	return true;
}

const char *plugin_event_route(const struct lk_event *ev)
{
	return ev->route;
}

void plugin_event_error(const struct lk_event *ev, const char **sqlstate, const char **msg)
{
	*sqlstate = ev->sqlstate[0] ? ev->sqlstate : "XX000";
	*msg = ev->errmsg ? ev->errmsg : "plugin failed the request";
}

/* ================= loading ================= */

static const char *plugin_dir(const struct lk_config *cf)
{
	static char buf[PATH_MAX + 16];
	char exe[PATH_MAX];
	struct stat st;
	ssize_t n;

	if (cf->plugin_dir && *cf->plugin_dir)
		return cf->plugin_dir;
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		char *slash;
		exe[n] = 0;
		slash = strrchr(exe, '/');
		if (slash) {
			*slash = 0;
			snprintf(buf, sizeof(buf), "%s/plugins", exe);
			if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode))
				return buf;
		}
	}
	return LOKADB_PLUGIN_DIR;
}

static int load_fail(char *err, size_t errlen, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int load_fail(char *err, size_t errlen, const char *name, const char *fmt, ...)
{
	char why[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(err, errlen, "plugin %s: %s", name, why);
	return 0;
}

static bool load_one(const char *name, const char *dir, char *err, size_t errlen)
{
	char path[PATH_MAX + 300], alt[PATH_MAX + 300];
	const struct lk_plugin_desc *(*entry)(void);
	const struct lk_plugin_desc *d;
	struct lk_plugin *pl, **grown;
	struct stat st;
	void *dl;
	int rc;

	for (const char *p = name; *p; p++)
		if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
			return load_fail(err, errlen, name, "invalid plugin name");
	for (int i = 0; i < rt->n_plugins; i++)
		if (strcmp(rt->plugins[i]->name, name) == 0)
			return load_fail(err, errlen, name, "listed twice in plugins =");
	snprintf(path, sizeof(path), "%s/%s.so", dir, name);
	snprintf(alt, sizeof(alt), "%s/%s/%s.so", dir, name, name);
	if (stat(path, &st) != 0) {
		if (stat(alt, &st) != 0)
			return load_fail(err, errlen, name, "not found in %s (tried %s, %s)", dir, path, alt);
		memcpy(path, alt, sizeof(path));
	}
	dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dl)
		return load_fail(err, errlen, name, "cannot load %s: %s", path, dlerror());
	*(void **)(&entry) = dlsym(dl, LK_PLUGIN_SYMBOL);
	if (!entry) {
		dlclose(dl);
		return load_fail(err, errlen, name, "no %s() symbol in %s (not a LokaDB plugin)", LK_PLUGIN_SYMBOL, path);
	}
	/* a refused plugin is left mapped: lokadb exits, and the message quotes its descriptor */
	d = entry();
	if (!d || d->magic != LK_PLUGIN_MAGIC) {
		return load_fail(err, errlen, name, "bad magic 0x%08x in %s (not a LokaDB plugin)", d ? d->magic : 0, path);
	}
	if (d->abi_major != LK_ABI_MAJOR || d->abi_minor > LK_ABI_MINOR) {
		return load_fail(err, errlen, name, "built for plugin ABI %u.%u, this lokadb has ABI %d.%d",
				 d->abi_major, d->abi_minor, LK_ABI_MAJOR, LK_ABI_MINOR);
	}
	if (d->size < sizeof(struct lk_plugin_desc)) {
		return load_fail(err, errlen, name, "descriptor too small (%u bytes, expected %zu)", d->size,
				 sizeof(struct lk_plugin_desc));
	}
	if (!d->name || strcmp(d->name, name) != 0) {
		return load_fail(err, errlen, name, "descriptor names it \"%s\", not \"%s\"", d->name ? d->name : "", name);
	}
	if (!d->init) {
		return load_fail(err, errlen, name, "descriptor has no init function");
	}
	pl = xcalloc(1, sizeof(*pl));
	pl->name = xstrdup(name);
	pl->path = xstrdup(path);
	pl->dl = dl;
	pl->desc = d;
	pl->index = rt->n_plugins;
	grown = realloc(rt->plugins, sizeof(*grown) * (size_t)(rt->n_plugins + 1));
	if (!grown)
		abort();
	rt->plugins = grown;
	rt->plugins[rt->n_plugins++] = pl;
	pl->in_init = true;
	rc = d->init(pl, &api_table);
	pl->in_init = false;
	if (rc != 0)
		return load_fail(err, errlen, name, "init failed: %s", pl->init_err ? pl->init_err : "no reason given");
	log_info("plugin %s %s loaded from %s", name, d->version ? d->version : "", path);
	return true;
}

bool plugins_load(const struct lk_config *cf, char *err, size_t errlen)
{
	char *list, *save = NULL, *tok;
	bool ok = true;

	if (!cf->plugins || !*cf->plugins)
		return true;
	P.dir = plugin_dir(cf);
	list = xstrdup(cf->plugins);
	for (tok = strtok_r(list, " ,\t", &save); tok && ok; tok = strtok_r(NULL, " ,\t", &save))
		ok = load_one(tok, P.dir, err, errlen);
	free(list);
	return ok;
}

/* ================= settings ([plugin.NAME]) ================= */

static struct lk_plugin *plugin_by_name(const char *name)
{
	for (int i = 0; i < rt->n_plugins; i++)
		if (strcasecmp(rt->plugins[i]->name, name) == 0)
			return rt->plugins[i];
	return NULL;
}

static struct plugin_setting *setting_find(struct lk_plugin *pl, const char *key)
{
	for (int i = 0; i < pl->n_settings; i++)
		if (strcasecmp(pl->settings[i].key, key) == 0)
			return &pl->settings[i];
	return NULL;
}

static const char *setting_pending(const struct plugin_setting *st)
{
	return st->pending ? st->pending : st->def;
}

static void pending_clear(void)
{
	for (int i = 0; i < rt->n_plugins; i++)
		for (int j = 0; j < rt->plugins[i]->n_settings; j++) {
			struct plugin_setting *st = &rt->plugins[i]->settings[j];
			free(st->pending);
			st->pending = NULL;
			st->line = 0;
		}
}

/* CONFIG_CHECK of one plugin with its pending values; false + err on veto. */
static bool check_plugin(struct lk_plugin *pl, const char *path, bool reloading, char *err, size_t errlen)
{
	struct hook_chain *ch = &rt->hooks[LK_HOOK_CONFIG_CHECK];
	struct lk_event *ev;
	bool ok = true;

	for (int i = 0; i < ch->n && ok; i++) {
		int rc;
		if (ch->v[i].pl != pl)
			continue;
		ev = hev_new(LK_HOOK_CONFIG_CHECK, NULL, NULL);
		ev->cfg_pl = pl;
		ev->reloading = reloading;
		ev->cfg_path = path;
		ev->running = true;
		rc = ch->v[i].fn(pl, ev);
		if (rc == LK_ERROR || ev->cfg_err) {
			snprintf(err, errlen, "%s", ev->cfg_err ? ev->cfg_err :
				 ev->errmsg ? ev->errmsg : "configuration refused");
			if (!ev->cfg_err) {
				char tmp[1024];
				snprintf(tmp, sizeof(tmp), "%s%s[plugin.%s]: %s", path ? path : "", path ? ": " : "", pl->name, err);
				snprintf(err, errlen, "%s", tmp);
			}
			ok = false;
		}
		plugin_event_free(ev);
	}
	return ok;
}

bool plugins_check(struct lk_config *cf, bool reloading, char *err, size_t errlen)
{
	pending_clear();
	for (int i = 0; i < cf->n_raw; i++) {
		const struct cf_raw *r = &cf->raw[i];
		struct lk_plugin *pl;
		struct plugin_setting *st;
		if (strncasecmp(r->section, "plugin.", 7) != 0)
			continue;
		pl = plugin_by_name(r->section + 7);
		if (!pl) {
			snprintf(err, errlen, "%s:%d: [%s]: plugin %s is not in plugins =", cf->path, r->line,
				 r->section, r->section + 7);
			goto fail;
		}
		st = setting_find(pl, r->key);
		if (!st) {
			snprintf(err, errlen, "%s:%d: unknown setting \"%s\" in [plugin.%s]", cf->path, r->line, r->key,
				 pl->name);
			goto fail;
		}
		set_str(&st->pending, r->value);
		st->line = r->line;
	}
	for (int i = 0; i < cf->n_dbs; i++) {
		const struct db_conf *dc = &cf->dbs[i];
		if (dc->transport && !plugin_transport_exists(dc->transport)) {
			snprintf(err, errlen, "%s:%d: transport \"%s\" is not provided by any plugin", cf->path, dc->line,
				 dc->transport);
			goto fail;
		}
	}
	for (int i = 0; i < rt->n_plugins; i++)
		if (!check_plugin(rt->plugins[i], cf->path, reloading, err, errlen))
			goto fail;
	return true;
fail:
	pending_clear();
	return false;
}

static void apply_plugin(struct lk_plugin *pl, bool reloading)
{
	struct hook_chain *ch = &rt->hooks[LK_HOOK_CONFIG_APPLY];
	struct lk_event ev;

	for (int i = 0; i < ch->n; i++) {
		if (ch->v[i].pl != pl)
			continue;
		memset(&ev, 0, sizeof(ev));
		ev.hook = LK_HOOK_CONFIG_APPLY;
		ev.cfg_pl = pl;
		ev.reloading = reloading;
		ev.running = true;
		ch->v[i].fn(pl, &ev);
		free(ev.errmsg);
		free(ev.cfg_err);
	}
}

/* Make the pending values the ones in use, then CONFIG_APPLY. */
void plugins_apply(bool reloading)
{
	for (int i = 0; i < rt->n_plugins; i++) {
		struct lk_plugin *pl = rt->plugins[i];
		for (int j = 0; j < pl->n_settings; j++) {
			struct plugin_setting *st = &pl->settings[j];
			free(st->value);
			st->value = st->pending;	/* NULL: the default */
			st->pending = NULL;
		}
	}
	for (int i = 0; i < rt->n_plugins; i++)
		apply_plugin(rt->plugins[i], reloading);
}

/* Console SET plugin.NAME.KEY = value: check that one plugin, then apply it. */
bool plugin_set(const char *name, const char *value, char *err, size_t errlen)
{
	char buf[256], *dot;
	struct lk_plugin *pl;
	struct plugin_setting *st;

	snprintf(buf, sizeof(buf), "%s", name + 7);
	dot = strchr(buf, '.');
	if (!dot) {
		snprintf(err, errlen, "unknown setting \"%s\"", name);
		return false;
	}
	*dot = 0;
	pl = plugin_by_name(buf);
	st = pl ? setting_find(pl, dot + 1) : NULL;
	if (!st) {
		snprintf(err, errlen, "unknown setting \"%s\"", name);
		return false;
	}
	for (int j = 0; j < pl->n_settings; j++) {
		struct plugin_setting *o = &pl->settings[j];
		set_str(&o->pending, o->value);
		o->line = 0;
	}
	set_str(&st->pending, value);
	if (!check_plugin(pl, NULL, true, err, errlen)) {
		pending_clear();
		return false;
	}
	for (int j = 0; j < pl->n_settings; j++) {
		struct plugin_setting *o = &pl->settings[j];
		free(o->value);
		o->value = o->pending;
		o->pending = NULL;
	}
	apply_plugin(pl, true);
	return true;
}

void plugin_show_config(struct pktbuf *pb)
{
	for (int i = 0; i < rt->n_plugins; i++) {
		struct lk_plugin *pl = rt->plugins[i];
		for (int j = 0; j < pl->n_settings; j++) {
			struct plugin_setting *st = &pl->settings[j];
			char key[256];
			const char *v[4];
			snprintf(key, sizeof(key), "plugin.%s.%s", pl->name, st->key);
			v[0] = key;
			v[1] = st->value ? st->value : st->def ? st->def : "";
			v[2] = st->def ? st->def : "";
			v[3] = "yes";
			pkt_data_row(pb, 4, v);
		}
	}
}

/* ================= the plugin itself ================= */

static void api_log(lk_plugin *self, int level, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	switch (level) {
	case LK_LOG_ERROR: log_error("plugin %s: %s", self->name, msg); break;
	case LK_LOG_WARNING: log_warning("plugin %s: %s", self->name, msg); break;
	case LK_LOG_INFO: log_info("plugin %s: %s", self->name, msg); break;
	default: log_debug("plugin %s: %s", self->name, msg); break;
	}
}

static void api_init_error(lk_plugin *self, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	set_str(&self->init_err, msg);
}

static void api_set_data(lk_plugin *self, void *data)
{
	self->data = data;
}

static void *api_get_data(lk_plugin *self)
{
	return self->data;
}

static const char *api_plugin_name(lk_plugin *self)
{
	return self->name;
}

static int api_hook(lk_plugin *self, enum lk_hook hook, lk_hook_fn fn, int priority)
{
	struct hook_chain *ch;
	struct hook_entry *v;
	int at;

	if ((int)hook < 0 || hook >= LK_HOOK_COUNT || !fn || !self->in_init)
		return -1;
	ch = &rt->hooks[hook];
	v = realloc(ch->v, sizeof(*v) * (size_t)(ch->n + 1));
	if (!v)
		return -1;
	ch->v = v;
	/* stable: after every entry with priority <= this one */
	for (at = ch->n; at > 0 && v[at - 1].prio > priority; at--)
		v[at] = v[at - 1];
	v[at].pl = self;
	v[at].fn = fn;
	v[at].prio = priority;
	ch->n++;
	self->hooks |= 1u << hook;
	return 0;
}

static int api_config_declare(lk_plugin *self, const char *key, const char *def, const char *doc)
{
	struct plugin_setting *v;

	if (!self->in_init || !key || !*key || setting_find(self, key))
		return -1;
	v = push_slot(&self->settings, &self->n_settings, sizeof(*v));
	if (!v)
		return -1;
	v->key = xstrdup(key);
	v->def = def ? xstrdup(def) : NULL;
	v->doc = doc ? xstrdup(doc) : NULL;
	return 0;
}

static const char *api_config_get(lk_event *ev, const char *key)
{
	struct plugin_setting *st;
	if (!ev->cfg_pl || !(st = setting_find(ev->cfg_pl, key)))
		return NULL;
	if (ev->hook == LK_HOOK_CONFIG_CHECK)
		return setting_pending(st);
	return st->value ? st->value : st->def;
}

static int api_config_error(lk_event *ev, const char *key, const char *fmt, ...)
{
	char why[768], msg[1200];
	struct plugin_setting *st = ev->cfg_pl ? setting_find(ev->cfg_pl, key) : NULL;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (ev->hook != LK_HOOK_CONFIG_CHECK || !ev->cfg_pl)
		return LK_ERROR;
	if (!ev->cfg_path)	/* console SET */
		snprintf(msg, sizeof(msg), "[plugin.%s] %s: %s", ev->cfg_pl->name, key, why);
	else if (st && st->line > 0)
		snprintf(msg, sizeof(msg), "%s:%d: [plugin.%s] %s: %s", ev->cfg_path, st->line, ev->cfg_pl->name, key, why);
	else
		snprintf(msg, sizeof(msg), "%s: [plugin.%s] %s: %s", ev->cfg_path, ev->cfg_pl->name, key, why);
	if (!ev->cfg_err)
		set_str(&ev->cfg_err, msg);
	return LK_ERROR;
}

static int api_config_reloading(lk_event *ev)
{
	return ev->reloading ? 1 : 0;
}

static const char *api_setting(lk_plugin *self, const char *key)
{
	struct plugin_setting *st = setting_find(self, key);
	if (!st)
		return NULL;
	return st->value ? st->value : st->def;
}

static enum lk_hook api_ev_hook(lk_event *ev)
{
	return ev->hook;
}

static lk_client *api_ev_client(lk_event *ev)
{
	return (lk_client *)ev->c;
}

static lk_server *api_ev_server(lk_event *ev)
{
	return (lk_server *)ev->s;
}

static int api_ev_txn_failed(lk_event *ev)
{
	if (ev->hook != LK_HOOK_TXN_END || !ev->s)
		return -1;
	return ev->s->txn_failed ? 1 : 0;
}

static int api_ev_past_sync(lk_event *ev)
{
	if (ev->hook != LK_HOOK_QUERY)
		return -1;
	return client_answered(ev->c) ? 0 : 1;
}

/* (rq_client_unsettled: the client's message that made, or took off, the statement text arg) */
struct stmt_change {
	const char *name;
	uint64_t id;		/* the name's entry's, 0: none */
};

/* Is an entry of `name` in the chain an item keeps for an undo (st_before)? */
static bool stmt_in_chain(const struct stmt_text *st, const char *name)
{
	for (; st; st = st->next)
		if (strcmp(st->name, name) == 0)
			return true;
	return false;
}

static bool stmt_changed_by(const struct rq_item *it, const void *arg)
{
	const struct stmt_change *ch = arg;

	return it->st_undo && ((ch->id && it->st_made == ch->id) || stmt_in_chain(it->st_before, ch->name));
}

/*
 * A Bind past a Sync: the text it binds is noted from the client's Parse
 * (or its Close, or a Query for the unnamed statement took one off) that
 * is unanswered in an earlier batch, which an error may yet make
 * PostgreSQL skip or refuse: then the server binds another text, or none.
 */
static int api_query_stmt_unsettled(lk_event *ev)
{
	struct stmt_change ch;
	const struct stmt_text *st;

	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'B' || !ev->c || !ev->stmt)
		return -1;
	if (!ev->c->link || !ev->c->link->rq.syncs)
		return 0;
	st = stmt_find(ev->c, ev->stmt);
	ch.name = ev->stmt;
	ch.id = st ? st->id : 0;
	return rq_client_unsettled(&ev->c->link->rq, stmt_changed_by, &ch) ? 1 : 0;
}

static int api_query_stmt_declared(lk_event *ev)
{
	const struct stmt_text *st;

	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'B' || !ev->c || !ev->stmt || !ev->bound_sql ||
	    !(st = stmt_find(ev->c, ev->stmt)))
		return -1;
	return st->types_len >= 2 ? (int)pkt_get_u16(st->types) : 0;
}

static int api_fail(lk_event *ev, const char *sqlstate, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vset_error(ev, sqlstate, fmt, ap);
	va_end(ap);
	return LK_ERROR;
}

/* ================= clients ================= */

static uint64_t api_client_id(lk_client *h)
{
	return CL(h)->id;
}

static const char *api_client_user(lk_client *h)
{
	return CL(h)->user;
}

static const char *api_client_database(lk_client *h)
{
	return CL(h)->dbname;
}

static const char *api_client_param(lk_client *h, const char *name)
{
	struct client *c = CL(h);
	const char *p = c->startup, *end = c->startup + c->startup_len;

	while (p && p < end && *p) {
		const char *key = p, *val = p + strlen(p) + 1;
		if (val >= end)
			break;
		if (strcmp(key, name) == 0)
			return val;
		p = val + strlen(val) + 1;
	}
	return NULL;
}

static const char *api_client_addr(lk_client *h, char *buf, size_t len, int *port)
{
	struct client *c = CL(h);
	int pt = 0;
	if (c->addr.ss_family == AF_UNIX)
		snprintf(buf, len, "unix");
	else
		addr_to_str(&c->addr, buf, len, &pt);
	if (port)
		*port = pt;
	return buf;
}

static int api_client_set_database(lk_client *h, const char *dbname)
{
	struct client *c = CL(h);
	if (!c->lev || c->lev->hook != LK_HOOK_CLIENT_STARTUP || !dbname || !*dbname)
		return -1;
	client_set_string(c, &c->dbname, dbname);
	return 0;
}

static int api_client_set_user(lk_client *h, const char *user)
{
	struct client *c = CL(h);
	if (!c->lev || c->lev->hook != LK_HOOK_CLIENT_STARTUP || !user || !*user)
		return -1;
	client_set_string(c, &c->user, user);
	return 0;
}

static void api_client_watch_queries(lk_client *h, int on)
{
	CL(h)->watch = on != 0;
}

static const char *api_client_pool_database(lk_client *h)
{
	struct client *c = CL(h);
	return c->pool ? c->pool->db->name : NULL;
}

static int api_client_in_transaction(lk_client *h)
{
	struct client *c = CL(h);
	return c->link && c->link->txn_status != 'I';
}

static void **ctx_slot(void ***slots, struct lk_plugin *pl)
{
	if (!*slots)
		*slots = xcalloc((size_t)rt->n_plugins, sizeof(void *));
	return &(*slots)[pl->index];
}

static void *api_client_ctx(lk_plugin *self, lk_client *h)
{
	struct client *c = CL(h);
	return c->pctx ? c->pctx[self->index] : NULL;
}

static void api_client_set_ctx(lk_plugin *self, lk_client *h, void *data)
{
	*ctx_slot(&CL(h)->pctx, self) = data;
}


static void api_resume(lk_client *h, int rc)
{
	struct client *c = CL(h);
	struct lk_event *ev = NULL;

	if (c->lev && c->lev->async)
		ev = c->lev;
	else if (c->rev && c->rev->async)
		ev = c->rev;
	else if (c->qev && c->qev->async)
		ev = c->qev;
	if (!ev) {
		/* resume() from inside the handler, before it returned LK_ASYNC */
		struct lk_event *cand[3] = { c->lev, c->rev, c->qev };
		for (int i = 0; i < 3; i++)
			if (cand[i] && cand[i]->running) {
				cand[i]->early = true;
				cand[i]->early_rc = rc;
				return;
			}
		log_warning("plugin resumed client %llu which is not waiting for a plugin", (unsigned long long)c->id);
		return;
	}
	ev->async = false;
	if (rc == LK_CONTINUE)
		rc = chain_run(ev, ev->pos + 1);
	else if (rc != LK_HANDLED) {
		rc = LK_ERROR;
		if (!ev->errmsg) {
			snprintf(ev->sqlstate, sizeof(ev->sqlstate), "XX000");
			set_str(&ev->errmsg, "plugin failed the request");
		}
	}
	if (rc == LK_ASYNC)
		return;
	ev->rc = rc;
	ev->decided = true;
	client_hook_resumed(c, ev);
}

static void api_resume_error(lk_client *h, const char *sqlstate, const char *fmt, ...)
{
	struct client *c = CL(h);
	struct lk_event *ev = c->lev && (c->lev->async || c->lev->running) ? c->lev :
			      c->rev && (c->rev->async || c->rev->running) ? c->rev :
			      c->qev && (c->qev->async || c->qev->running) ? c->qev : NULL;
	va_list ap;

	if (ev) {
		va_start(ap, fmt);
		vset_error(ev, sqlstate, fmt, ap);
		va_end(ap);
	}
	api_resume(h, LK_ERROR);
}

static void api_client_close(lk_client *h, const char *sqlstate, const char *msg)
{
	struct client *c = CL(h);
	if (sqlstate)
		client_close(c, sqlstate, "%s", msg ? msg : "closed by a plugin");
	else
		client_close(c, NULL, "%s", msg ? msg : "closed by a plugin");
}

/* ================= servers ================= */

static uint64_t api_server_id(lk_server *h)
{
	return SV(h)->id;
}

static int api_server_retire(uint64_t id, const char *why)
{
	return pool_retire_server(id, why && *why ? why : "retired by a plugin");
}

static const char *api_server_database(lk_server *h)
{
	return SV(h)->pool->db->name;
}

static const char *api_server_user(lk_server *h)
{
	return SV(h)->pool->login_user;
}

static int api_server_backend_pid(lk_server *h)
{
	return SV(h)->backend_pid;
}

static void *api_server_ctx(lk_plugin *self, lk_server *h)
{
	struct server *s = SV(h);
	return s->pctx ? s->pctx[self->index] : NULL;
}

static void api_server_set_ctx(lk_plugin *self, lk_server *h, void *data)
{
	*ctx_slot(&SV(h)->pctx, self) = data;
}

/* ================= hooks run by the core ================= */

static int run_client_event(struct lk_event **slot, struct client *c, enum lk_hook hook)
{
	struct lk_event *ev = hev_new(hook, c, NULL);
	int rc;

	*slot = ev;
	rc = chain_run(ev, 0);
	if (rc == LK_ASYNC)
		return rc;
	ev->rc = rc;
	ev->decided = true;
	return rc;
}

/* CLIENT_STARTUP: LK_ASYNC leaves c->lev pending; else the caller reads c->lev and frees it. */
int plugin_client_startup(struct client *c)
{
	c->hooked = true;
	return run_client_event(&c->lev, c, LK_HOOK_CLIENT_STARTUP);
}

/* AUTH_LOOKUP: LK_ASYNC leaves c->lev pending; plugin_event_take_secret() reads the answer. */
int plugin_auth_lookup(struct client *c)
{
	return run_client_event(&c->lev, c, LK_HOOK_AUTH_LOOKUP);
}

char *plugin_event_take_secret(struct lk_event *ev)
{
	char *s = ev->secret;
	ev->secret = NULL;
	return s;
}

static const char *api_auth_user(lk_event *ev)
{
	return ev->c ? ev->c->user : NULL;
}

static void api_auth_set_secret(lk_event *ev, const char *secret)
{
	if (ev->hook != LK_HOOK_AUTH_LOOKUP)
		return;
	set_str(&ev->secret, secret);
	ev->secret_set = true;
}

void plugin_txn_end(struct client *c, struct server *s)
{
	chain_notify(LK_HOOK_TXN_END, c, s);
	s->marked_failed = false;
}

static void api_query_mark_txn(lk_event *ev)
{
	if (ev->hook == LK_HOOK_QUERY)
		ev->mark_txn = true;
}

static int api_ev_marked_txn_failed(lk_event *ev)
{
	if (ev->hook != LK_HOOK_TXN_END || !ev->s)
		return -1;
	return ev->s->marked_failed ? 1 : 0;
}

void plugin_client_close(struct client *c)
{
	if (!c->hooked)
		return;
	c->hooked = false;
	if (hook_on(LK_HOOK_CLIENT_CLOSE))
		chain_notify(LK_HOOK_CLIENT_CLOSE, c, NULL);
}

void plugin_server_close(struct server *s)
{
	if (s->conn_req) {
		s->conn_req->s = NULL;	/* the transport's late answer is dropped */
		s->conn_req = NULL;
	}
	if (hook_on(LK_HOOK_SERVER_CLOSE))
		chain_notify(LK_HOOK_SERVER_CLOSE, NULL, s);
}

void plugin_shutdown(void)
{
	if (hook_on(LK_HOOK_SHUTDOWN))
		chain_notify(LK_HOOK_SHUTDOWN, NULL, NULL);
}

/* ================= clients' answers (client_on_answered) ================= */

/*
 * Has the server answered every Sync and Query the client sent it? (the
 * messages it sent after the last may be unanswered: PostgreSQL answers
 * them at a Sync still to come)
 */
static bool client_answered(const struct client *c)
{
	const struct server *s = c ? c->link : NULL;

	if (s && s->copy_in)
		return true;	/* (COPY FROM STDIN: nothing more is answered before the client's data) */
	return !s || !rq_client_owes_ready(&s->rq);
}

static void answer_waits_free(struct answer_wait *w)
{
	while (w) {
		struct answer_wait *next = w->next;
		free(w);
		w = next;
	}
}

static void answered_cb(evutil_socket_t fd, short what, void *arg)
{
	struct client *c = arg;
	struct answer_wait *w;

	(void)fd;
	(void)what;
	rt->now = now_mono();
	if (c->closing || !client_answered(c))
		return;		/* a later answer tells again */
	/* one at a time: a waiter that resumes the client may send it on (c outlives
	 * this loop turn even if a waiter closes it: client_free_now) */
	while ((w = c->answer_waits) && !c->closing && client_answered(c)) {
		c->answer_waits = w->next;
		lk_answered_fn fn = w->fn;
		struct lk_plugin *pl = w->pl;
		void *a = w->arg;
		free(w);
		fn(pl, (lk_client *)c, a);
	}
}

/* A ReadyForQuery left nothing of the client's unanswered: its waiters are told from the loop. */
void plugin_client_answered(struct client *c)
{
	if (c->answer_waits && c->answer_ev && client_answered(c))
		event_active(c->answer_ev, 0, 0);
}

/* client_on_answered for plugin `pl`, or for the core (NULL) */
static int answer_wait_add(struct lk_plugin *pl, struct client *c, lk_answered_fn fn, void *arg)
{
	struct answer_wait *w;

	if (!c || !fn || c->closing)
		return -1;
	if (client_answered(c))
		return 1;
	if (!c->answer_ev && !(c->answer_ev = event_new(rt->base, -1, 0, answered_cb, c)))
		return -1;
	for (w = c->answer_waits; w && w->pl != pl; w = w->next)
		;
	if (!w) {
		w = xcalloc(1, sizeof(*w));
		w->pl = pl;
		w->next = c->answer_waits;
		c->answer_waits = w;
	}
	w->fn = fn;
	w->arg = arg;
	return 0;
}

/*
 * Is a Parse or Close that changed how a statement's Describes are renamed
 * unanswered (it may yet be skipped or refused, and the renames come
 * back)?
 */
bool plugin_renames_unsettled(const struct client *c)
{
	const struct server *s = c->link;

	for (uint32_t i = 0; s && s->rq.syncs && i < s->rq.count; i++)
		if (rq_at(&s->rq, i)->rn_undo)
			return true;
	return false;
}

static int api_client_on_answered(lk_plugin *self, lk_client *h, lk_answered_fn fn, void *arg)
{
	return self ? answer_wait_add(self, CL(h), fn, arg) : -1;
}

static void core_answered(lk_plugin *self, lk_client *h, void *arg)
{
	(void)self;
	(void)arg;
	client_resume(CL(h));
}

/*
 * The core waits, before the client's next message, until the server has
 * answered its batches (client_process goes on then). false: nothing to
 * wait for.
 */
bool plugin_client_await(struct client *c)
{
	return answer_wait_add(NULL, c, core_answered, NULL) == 0;
}

void plugin_client_free(struct client *c)
{
	struct stmt_text *st, *next;

	answer_waits_free(c->answer_waits);
	c->answer_waits = NULL;
	if (c->answer_ev) {
		event_free(c->answer_ev);
		c->answer_ev = NULL;
	}

	plugin_event_free(c->qev);
	plugin_event_free(c->rev);
	plugin_event_free(c->lev);
	c->qev = c->rev = c->lev = NULL;
	if (c->console_res) {
		c->console_res->c = NULL;	/* the plugin still ends it with result_done() */
		c->console_res = NULL;
	}
	for (st = c->stmts; st; st = next) {
		next = st->next;
		stmt_free(st);
	}
	c->stmts = NULL;
	free(c->pctx);
	c->pctx = NULL;
	free(c->startup);
	c->startup = NULL;
}

static void tvars_free(struct server *s);

void plugin_server_free(struct server *s)
{
	free(s->pctx);
	s->pctx = NULL;
	tvars_free(s);
}

/* ================= QUERY ================= */

static const char *lookup_stmt(struct client *c, const char *name)
{
	for (struct stmt_text *st = c->stmts; st; st = st->next)
		if (strcmp(st->name, name) == 0)
			return st->sql;
	return NULL;
}

/* A Parse went to the server: remember its text for the QUERY hook of Binds. */
static void stmt_set_types(struct stmt_text *st, const uint8_t *types, uint32_t len)
{
	free(st->types);
	st->types = NULL;
	st->types_len = 0;
	if (types && len) {
		st->types = malloc(len);
		if (st->types) {
			memcpy(st->types, types, len);
			st->types_len = len;
		}
	}
}

static void stmt_free(struct stmt_text *st)
{
	free(st->name);
	free(st->sql);
	free(st->types);
	free(st);
}

static struct stmt_text *stmt_find(struct client *c, const char *name)
{
	for (struct stmt_text *st = c->stmts; st; st = st->next)
		if (strcmp(st->name, name) == 0)
			return st;
	return NULL;
}

/* Take the entry of `name` off the client's list (NULL: none). */
static struct stmt_text *stmt_detach(struct client *c, const char *name)
{
	for (struct stmt_text **pp = &c->stmts; *pp; pp = &(*pp)->next) {
		struct stmt_text *st = *pp;
		if (strcmp(st->name, name) == 0) {
			*pp = st->next;
			st->next = NULL;
			return st;
		}
	}
	return NULL;
}

/* Free entries an item kept for an undo (a chain: a Query of `DEALLOCATE name` also drops the unnamed statement) */
void plugin_stmt_drop(struct stmt_text *st)
{
	while (st) {
		struct stmt_text *next = st->next;
		stmt_free(st);
		st = next;
	}
}

/*
 * The client's Parse: the name's entry before it is kept aside (ev, then
 * the Parse's reply item) so that the entry comes back if PostgreSQL skips
 * or refuses the Parse (plugin_stmt_undo); the Parse's text is noted in an
 * entry of its own.
 */
static void note_client_parse(struct client *c, struct lk_event *ev, const char *name, const char *sql,
			      const uint8_t *types, uint32_t len)
{
	static uint64_t ids;
	struct stmt_text *st;

	if (ev->st_made) {		/* (built twice) */
		plugin_note_parse_types(c, name, sql, types, len);
		return;
	}
	ev->st_before = stmt_detach(c, name);
	plugin_note_parse_types(c, name, sql, types, len);
	st = stmt_find(c, name);
	if (st) {
		st->id = ++ids;
		ev->st_made = st->id;
	} else {
		plugin_stmt_drop(ev->st_before);
		ev->st_before = NULL;
	}
}

/*
 * A message sent after the one being undone (the batch it skipped: past its
 * Sync; head: the failed Query at the head) that drops statement `name` (a
 * Close, a DEALLOCATE, a Query: the unnamed one), or NULL.
 */
static struct rq_item *stmt_dropped_later(struct client *c, const char *name, bool head)
{
	bool past = false;

	for (uint32_t i = 0; c->link && i < c->link->rq.count; i++) {
		struct rq_item *o = rq_at(&c->link->rq, i);
		past |= head ? i > 0 : o->type == 'S';
		if (past && ((o->st_drops && strcmp(o->st_drops, name) == 0) ||
			     (!name[0] && o->type == 'Q' && o->act == RQ_FWD)))
			return o;
	}
	return NULL;
}

/*
 * Back in the client's list: an entry an undone message had taken off
 * (named_only: a failed Query at the head; the unnamed statement stays
 * dropped), unless a later message noted another text of its name, or
 * drops it: then that message holds it for its own undo.
 */
static void stmt_reattach(struct client *c, struct rq_item *it, bool named_only)
{
	struct stmt_text **pp = &it->st_before, *st;
	struct rq_item *later;

	while ((st = *pp)) {
		if (named_only && !st->name[0]) {
			pp = &st->next;
			continue;
		}
		*pp = st->next;
		if (stmt_find(c, st->name)) {
			stmt_free(st);	/* a later message noted another text: it came last */
			continue;
		}
		if ((later = stmt_dropped_later(c, st->name, named_only))) {
			/* a later message drops it: its own undo gives it back if needed */
			if (stmt_in_chain(later->st_before, st->name)) {
				stmt_free(st);	/* (it dropped a newer text of the name) */
			} else {
				st->next = later->st_before;
				later->st_before = st;
				later->st_undo = true;
			}
			continue;
		}
		st->next = c->stmts;
		c->stmts = st;
		if (st->resend)
			c->stmt_resends = true;
	}
}

/*
 * The client's statement texts changed under the QUERY event of a Bind a
 * plugin holds (LK_ASYNC): it binds the text the server has now.
 */
static void stmt_rebind(struct client *c)
{
	struct lk_event *ev = c->qev;

	if (ev && ev->hook == LK_HOOK_QUERY && ev->qtype == 'B' && ev->stmt)
		ev->bound_sql = lookup_stmt(c, ev->stmt);
}

/*
 * The server skipped (or, `failed`, refused) the client's message of item
 * `it`: what it did to the statement texts is undone. A Parse's entry goes
 * and the one before it comes back (a Parse that fails keeps an existing
 * statement of its name, 42P05; only the unnamed statement is dropped
 * before PostgreSQL parses the new one). A Close or a Query (which drops
 * the unnamed statement) gives back the entry it took off.
 */
static void stmt_undo_one(struct client *c, struct rq_item *it, bool failed)
{
	if (it->st_made) {		/* a Parse's (or its synthesized ParseComplete's) */
		struct stmt_text *cur = c->stmts;
		while (cur && cur->id != it->st_made)
			cur = cur->next;
		if (!it->st_made || !cur)
			return;		/* a later message noted another text */
		if (it->rn_undo)	/* its Describes are renamed as before it */
			rt_names_set(&c->rnames, 'S', cur->name, it->rn_before);
		stmt_free(stmt_detach(c, cur->name));
		if (!(failed && it->st_before && !it->st_before->name[0]))
			stmt_reattach(c, it, false);
	} else {
		if (it->rn_undo && it->st_before)	/* a Close: its name's Describes renamed as before it */
			rt_names_set(&c->rnames, 'S', it->st_before->name, it->rn_before);
		stmt_reattach(c, it, false);
	}
	it->st_undo = false;
}

void plugin_stmt_undo(struct client *c, struct rq_item *it, bool failed)
{
	if (!c || !it->st_undo)
		return;
	stmt_undo_one(c, it, failed);
	stmt_rebind(c);
}

/* The client's Close of statement `name` (or a Query: "") went: its entry goes, into `it` for an undo. */
void plugin_stmt_closed(struct client *c, const char *name, struct rq_item *it)
{
	struct stmt_text *st = stmt_detach(c, name);

	if (it && !it->st_made && name[0] && !it->st_drops)
		it->st_drops = xstrdup(name);
	if (!st)
		return;
	if (!it || it->st_made) {
		stmt_free(st);
		return;
	}
	st->next = it->st_before;	/* (a DEALLOCATE Query: also the unnamed statement's) */
	it->st_before = st;
	it->st_undo = true;
}

/*
 * The client's Query of item `it` failed: a `DEALLOCATE name` in it did not
 * happen, and the name's entry comes back (the unnamed statement stays
 * dropped: PostgreSQL drops it before it runs the Query).
 */
void plugin_stmt_query_failed(struct client *c, struct rq_item *it)
{
	if (!c || !it->st_undo)
		return;
	stmt_reattach(c, it, true);
	stmt_rebind(c);
}

/*
 * The client's Bind went (item `it`; not with the core's prepared
 * statements, which follow it themselves: ps_deallocate): a statement whose
 * text is `DEALLOCATE name` drops that name's text when its Execute runs,
 * back if PostgreSQL skips the Bind.
 */
void plugin_stmt_bind_sent(struct client *c, struct lk_event *ev, struct rq_item *it)
{
	const char *sql = ev->bound_sql;	/* (a re-parse before the Bind rebinds it: stmt_rebind) */
	char *name;

	if (!c->stmts || ev->qtype != 'B' || !sql || !it || it->type != 'B')
		return;
	while (*sql == ' ' || *sql == '\t' || *sql == '\n' || *sql == '\r')
		sql++;
	if (strncasecmp(sql, "deallocate", 10) != 0 || !(name = ps_sql_deallocate_name(sql)))
		return;
	plugin_stmt_closed(c, name, it);
	free(name);
}

/* The client's Query went: PostgreSQL drops the unnamed statement (a DISCARD ALL in it: see below). */
void plugin_stmt_query_sent(struct client *c, struct rq_item *it)
{
	plugin_stmt_closed(c, "", it);
	if (it && it->type == 'Q')
		it->st_gen_at = stmt_gen ? stmt_gen : 1;
}

/*
 * DISCARD ALL or DEALLOCATE ALL of the client's: it has no statement left
 * but those of texts noted after the Query went (gen_at; 0: not known),
 * which PostgreSQL parses after it.
 */
void plugin_stmts_dropped(struct client *c, uint32_t gen_at)
{
	struct stmt_text **pp = &c->stmts, *st;

	while ((st = *pp)) {
		if (st->name[0] && (!gen_at || (int32_t)(st->gen - gen_at) <= 0)) {
			*pp = st->next;
			stmt_free(st);
		} else {
			pp = &st->next;
		}
	}
	stmt_rebind(c);
}

void plugin_note_parse(struct client *c, const char *name, const char *sql)
{
	plugin_note_parse_types(c, name, sql, NULL, 0);
}

void plugin_note_parse_types(struct client *c, const char *name, const char *sql, const uint8_t *types, uint32_t len)
{
	struct stmt_text *st, **pp;
	int n = 0;
	uint32_t gen = next_stmt_gen();

	for (pp = &c->stmts; (st = *pp); pp = &st->next, n++) {
		if (strcmp(st->name, name) == 0) {
			set_str(&st->sql, sql);
			if (types)
				stmt_set_types(st, types, len);
			st->gen = gen;
			st->resend = false;
			stmt_rebind(c);	/* (a re-parse at the held Bind: its text went) */
			return;
		}
	}
	if (n >= 256) {		/* keep it bounded: drop the oldest (the list's tail) */
		struct stmt_text **last = &c->stmts;
		while ((*last)->next)
			last = &(*last)->next;
		stmt_free(*last);
		*last = NULL;
	}
	st = xcalloc(1, sizeof(*st));
	st->name = xstrdup(name);
	st->sql = xstrdup(sql);
	stmt_set_types(st, types, len);
	st->gen = gen;
	st->next = c->stmts;
	c->stmts = st;
	stmt_rebind(c);
}

static bool cstr(const uint8_t *b, uint32_t len, uint32_t *off, char **out)
{
	const uint8_t *nul;
	if (*off >= len)
		return false;
	nul = memchr(b + *off, 0, len - *off);
	if (!nul)
		return false;
	*out = (char *)b + *off;
	*off = (uint32_t)(nul - b) + 1;
	return true;
}

/* Parse a Q/P/B body into ev; false when malformed. */
static bool parse_query(struct lk_event *ev, struct client *c)
{
	uint8_t *b = ev->body;
	uint32_t len = ev->blen, off = 0;

	switch (ev->qtype) {
	case 'Q':
		return cstr(b, len, &off, &ev->sql);
	case 'P':
		if (!cstr(b, len, &off, &ev->stmt) || !cstr(b, len, &off, &ev->sql) || off + 2 > len)
			return false;
		ev->nparams = pkt_get_u16(b + off);
		off += 2;
		ev->params_off = off;
		return off + 4u * (uint32_t)ev->nparams <= len;
	case 'B': {
		int n;
		if (!cstr(b, len, &off, &ev->portal) || !cstr(b, len, &off, &ev->stmt) || off + 2 > len)
			return false;
		ev->nfmts = pkt_get_u16(b + off);
		off += 2;
		ev->fmts_off = off;
		off += 2u * (uint32_t)ev->nfmts;
		if (off + 2 > len)
			return false;
		ev->nparams = pkt_get_u16(b + off);
		off += 2;
		ev->params_off = off;
		if (ev->nfmts > 1 && ev->nfmts != ev->nparams)
			return false;
		for (n = 0; n < ev->nparams; n++) {
			int32_t plen;
			if (off + 4 > len)
				return false;
			plen = (int32_t)pkt_get_u32(b + off);
			off += 4;
			if (plen > 0) {
				if ((uint32_t)plen > len - off)
					return false;
				off += (uint32_t)plen;
			} else if (plen < -1) {
				return false;
			}
		}
		ev->tail_off = off;
		if (off + 2 > len)
			return false;
		ev->bound_sql = lookup_stmt(c, ev->stmt);
		return true;
	}
	default:
		return false;
	}
}

/*
 * QUERY for one whole message (type byte, length, body). Returns LK_ASYNC
 * (c->qev pending), or the decision (c->qev decided). -2: malformed (the
 * client was closed).
 */
int plugin_query(struct client *c, const uint8_t *msg, uint32_t len)
{
	struct lk_event *ev = hev_new(LK_HOOK_QUERY, c, NULL);
	int rc;

	ev->qtype = (char)msg[0];
	ev->blen = len - 4;
	if (ev->body_cap < ev->blen || !ev->body) {
		size_t cap = ev->blen > 256 ? ev->blen : 256;
		free(ev->body);
		ev->body = malloc(cap);
		ev->body_cap = ev->body ? cap : 0;
	}
	if (!ev->body) {
		plugin_event_free(ev);
		client_close(c, "53200", "out of memory");
		return -2;
	}
	memcpy(ev->body, msg + 5, ev->blen);
	if (!parse_query(ev, c)) {
		plugin_event_free(ev);
		client_close(c, "08P01", "invalid %s message", msg[0] == 'Q' ? "Query" : msg[0] == 'P' ? "Parse" : "Bind");
		return -2;
	}
	c->qev = ev;
	rc = chain_run(ev, 0);
	if (rc == LK_ASYNC)
		return rc;
	ev->rc = rc;
	ev->decided = true;
	return rc;
}

static char api_query_type(lk_event *ev)
{
	return ev->hook == LK_HOOK_QUERY ? ev->qtype : 0;
}

static const char *api_query_sql(lk_event *ev)
{
	if (ev->hook != LK_HOOK_QUERY)
		return NULL;
	if (ev->new_sql)
		return ev->new_sql;
	return ev->qtype == 'B' ? ev->bound_sql : ev->sql;
}

static const char *api_query_statement(lk_event *ev)
{
	return ev->hook == LK_HOOK_QUERY ? ev->stmt : NULL;
}

static const char *api_query_portal(lk_event *ev)
{
	return ev->hook == LK_HOOK_QUERY ? ev->portal : NULL;
}

static int api_query_nparams(lk_event *ev)
{
	return ev->hook == LK_HOOK_QUERY ? ev->nparams : 0;
}

static const char *api_query_param(lk_event *ev, int i, int *len, int *format)
{
	uint32_t off;
	int32_t plen = -1;

	if (len)
		*len = -1;
	if (format)
		*format = 0;
	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'B' || i < 0 || i >= ev->nparams)
		return NULL;
	if (ev->param_set && ev->param_set[i]) {
		if (ev->new_params[i] && len)
			*len = (int)strlen(ev->new_params[i]);
		return ev->new_params[i];
	}
	if (format && ev->nfmts > 0)
		*format = pkt_get_u16(ev->body + ev->fmts_off + 2u * (uint32_t)(ev->nfmts == 1 ? 0 : i));
	off = ev->params_off;
	for (int n = 0; n <= i; n++) {
		plen = (int32_t)pkt_get_u32(ev->body + off);
		off += 4;
		if (n < i && plen > 0)
			off += (uint32_t)plen;
	}
	if (plen < 0)
		return NULL;
	if (len)
		*len = plen;
	return (const char *)ev->body + off;
}

static uint32_t api_query_param_type(lk_event *ev, int i)
{
	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'P' || i < 0 || i >= ev->nparams)
		return 0;
	return pkt_get_u32(ev->body + ev->params_off + 4u * (uint32_t)i);
}

static int api_query_rewrite(lk_event *ev, const char *sql)
{
	size_t n;

	if (ev->hook != LK_HOOK_QUERY || (ev->qtype != 'Q' && ev->qtype != 'P') || !sql)
		return -1;
	n = strlen(sql) + 1;	/* sql may be new_sql itself */
	if (ev->sqlbuf_cap < n) {
		size_t cap = n > 256 ? n : 256;
		char *buf = xmalloc(cap);
		memcpy(buf, sql, n);
		free(ev->sqlbuf);
		ev->sqlbuf = buf;
		ev->sqlbuf_cap = cap;
	} else {
		memmove(ev->sqlbuf, sql, n);
	}
	ev->new_sql = ev->sqlbuf;
	textmap_free(ev->map);	/* spans were of the text before */
	ev->map = NULL;
	return 0;
}

/* Does the client count its text's characters as UTF-8 (client_encoding)? */
static bool client_utf8(const struct client *c)
{
	const char *enc = c ? c->vars.v[VAR_CLIENT_ENCODING] : NULL;

	return !enc || ((enc[0] == 'U' || enc[0] == 'u') &&
			(strcasecmp(enc, "UTF8") == 0 || strcasecmp(enc, "UTF-8") == 0 || strcasecmp(enc, "UNICODE") == 0));
}

static int api_query_text_spans(lk_event *ev, const lk_text_span *spans, int n)
{
	if (ev->hook != LK_HOOK_QUERY || (ev->qtype != 'Q' && ev->qtype != 'P') || !ev->new_sql || !spans)
		return -1;
	textmap_free(ev->map);
	ev->map = textmap_build(ev->sql, ev->new_sql, spans, n, client_utf8(ev->c));
	return ev->map ? 0 : -1;
}

/* The reply queue's item of the decided Query or Parse just sent (type, RQ_FWD) takes its text map
 * (and a Query its result tables). */
void plugin_query_give_map(struct lk_event *ev, struct rq_item *it)
{
	/* (the core's prepared statements answer a Parse it need not send: ParseComplete) */
	bool synth_parse = it && it->act == RQ_SYNTH && it->type == '1' && ev->qtype == 'P';

	if (!it || (it->type != ev->qtype && !synth_parse) || it->act == RQ_HIDE)
		return;
	if (ev->mark_txn)
		it->mark_txn = true;
	if (ev->st_made && (it->type == 'P' || synth_parse) && !it->st_undo) {
		it->st_before = ev->st_before;
		it->st_made = ev->st_made;
		it->st_undo = true;
		ev->st_before = NULL;
		ev->st_made = 0;
		if (ev->rn_saved) {
			it->rn_before = ev->rn_before;
			it->rn_undo = true;
			ev->rn_before = NULL;
			ev->rn_saved = false;
		}
	}
	if (it->act != RQ_FWD)
		return;
	if (ev->map && !it->map) {
		it->map = ev->map;
		ev->map = NULL;
	}
	if (ev->tables && it->type == 'Q' && !it->tables)
		it->tables = rt_tables_ref(ev->tables);
}

static lk_tables *api_tables_new(const lk_table_oid *t, int n)
{
	return rt_tables_new(t, n);
}

static void api_tables_release(lk_tables *t)
{
	rt_tables_release(t);
}

static int api_query_result_tables(lk_event *ev, lk_tables *t)
{
	if (ev->hook != LK_HOOK_QUERY || !strchr("QPB", ev->qtype) || !t)
		return -1;
	rt_tables_release(ev->tables);
	ev->tables = rt_tables_ref(t);
	return 0;
}

void plugin_query_note_tables(struct client *c, struct lk_event *ev)
{
	struct lk_tables *t = ev->tables;

	if (!t && !c->rnames.n)
		return;		/* (the usual case: nothing to forget either) */
	if (ev->qtype == 'P') {
		if (!ev->rn_saved) {	/* given back if PostgreSQL refuses or skips the Parse */
			ev->rn_before = rt_tables_ref(rt_names_get(&c->rnames, 'S', ev->stmt));
			ev->rn_saved = true;
		}
		rt_names_set(&c->rnames, 'S', ev->stmt, t);
	} else if (ev->qtype == 'B') {
		if (!t)
			t = rt_names_get(&c->rnames, 'S', ev->stmt);
		else if (ev->reparse)	/* the statement's text is the one the Bind gave it */
			rt_names_set(&c->rnames, 'S', ev->stmt, t);
		rt_names_set(&c->rnames, 'P', ev->portal, t);
	}
}

static int api_query_set_param(lk_event *ev, int i, const char *value)
{
	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'B' || i < 0 || i >= ev->nparams)
		return -1;
	if (!ev->new_params) {
		ev->new_params = xcalloc((size_t)ev->nparams, sizeof(char *));
		ev->param_set = xcalloc((size_t)ev->nparams, sizeof(bool));
	}
	set_str(&ev->new_params[i], value);
	ev->param_set[i] = true;
	return 0;
}

static int api_query_prefix(lk_event *ev, const char *sql)
{
	char **v;
	if (ev->hook != LK_HOOK_QUERY || !sql)
		return -1;
	v = realloc(ev->prefix, sizeof(*v) * (size_t)(ev->n_prefix + 1));
	if (!v)
		return -1;
	ev->prefix = v;
	v[ev->n_prefix++] = xstrdup(sql);
	return 0;
}

/* ---- server session values (query_set_var) ---- */

#define TV_MAX 8			/* values per server and per event */
#define TV_PEND 4			/* set_config prefixes in flight per server */

/*
 * A name and its value, in a buffer of EV_VAR_NAME + EV_VAR_VALUE bytes the
 * slot keeps once it has one (freed with the tvars): values move between
 * slots by swapping them, so a statement allocates nothing here.
 */
struct tv_val {
	char *name, *value;		/* value = name + EV_VAR_NAME; NULL: no buffer yet */
	size_t nlen, vlen;
};

/* How a prefix went: a hidden Query, in front of the client's Query, or
 * inside the client's batch (server_send_hidden_ext). */
enum { TV_HIDDEN, TV_INLINE, TV_EXT };

/* What the pooler's own set_config prefixes gave a server's session. */
struct tvars {
	uint32_t sent, done;		/* hidden queries sent to / answered by the server */
	uint32_t isent, idone;		/* client Queries with values in front, sent / answered */
	uint32_t esent;			/* values sent inside batches (answered by server.ext_seq) */
	bool err;			/* the hidden query being answered failed */
	bool ours;			/* server_send_hidden is sending our prefix */
	int n;
	struct tv_val v[TV_MAX];	/* known: ran outside a block, without error */
	int np;
	struct tv_pend {
		uint32_t seq;		/* the hidden query's number (tvars.sent after it), the
					   client Query's (tvars.isent), the batch's (tvars.esent) */
		uint8_t kind;		/* TV_HIDDEN, TV_INLINE, TV_EXT */
		int n;
		struct tv_val v[TV_MAX];
	} p[TV_PEND];			/* sent, not answered yet, oldest first */
};

static void tv_swap(struct tv_val *a, struct tv_val *b)
{
	struct tv_val x = *a;
	*a = *b;
	*b = x;
}

static void tv_fill(struct tv_val *v, const char *name, size_t nlen, const char *value, size_t vlen)
{
	if (!v->name) {
		v->name = xmalloc(EV_VAR_NAME + EV_VAR_VALUE);
		v->value = v->name + EV_VAR_NAME;
	}
	memcpy(v->name, name, nlen + 1);
	memcpy(v->value, value, vlen + 1);
	v->nlen = nlen;
	v->vlen = vlen;
}

/* The oldest prefix in flight goes; its entry (and buffers) moves to the end. */
static void tv_pop(struct tvars *t)
{
	struct tv_pend first = t->p[0];

	t->np--;
	memmove(t->p, t->p + 1, sizeof(t->p[0]) * (size_t)t->np);
	first.n = 0;
	t->p[t->np] = first;
}

static void tv_clear(struct tvars *t)
{
	t->n = 0;
	while (t->np)
		tv_pop(t);
}

static void tvars_free(struct server *s)
{
	struct tvars *t = s->tvars;

	if (!t)
		return;
	for (int i = 0; i < TV_MAX; i++) {
		free(t->v[i].name);
		for (int j = 0; j < TV_PEND; j++)
			free(t->p[j].v[i].name);
	}
	free(t);
	s->tvars = NULL;
}

static int tv_find(const struct tv_val *v, int n, const char *name, size_t nlen)
{
	for (int i = 0; i < n; i++)
		if (v[i].nlen == nlen && memcmp(v[i].name, name, nlen) == 0)
			return i;
	return -1;
}

static void tv_remove(struct tv_val *v, int *n, const char *name, size_t nlen)
{
	int i = tv_find(v, *n, name, nlen);

	if (i >= 0)
		tv_swap(&v[i], &v[--*n]);
}

/* Any other query of the pooler may change anything: forget all. */
void plugin_tvars_hidden_sent(struct server *s)
{
	struct tvars *t = s->tvars;

	if (!t)
		return;
	t->sent++;
	if (!t->ours) {
		tv_clear(t);
		s->ext_armed = false;
	}
}

void plugin_tvars_hidden_error(struct server *s)
{
	if (s->tvars)
		s->tvars->err = true;
}

static void tv_answered(struct tvars *t, int kind, uint32_t seq, bool ok);

/* The ReadyForQuery of a hidden query: a prefix of ours that ran outside a
 * block (status I) without error is known from now on. */
void plugin_tvars_hidden_rfq(struct server *s, char status)
{
	struct tvars *t = s->tvars;

	if (!t)
		return;
	t->done++;
	tv_answered(t, TV_HIDDEN, t->done, status == 'I' && !t->err);
	t->err = false;
}

/* The ReadyForQuery of a client Query that carried values in front of it. */
void plugin_tvars_inline_rfq(struct server *s, char status, bool failed)
{
	struct tvars *t = s->tvars;

	if (!t)
		return;
	t->idone++;
	tv_answered(t, TV_INLINE, t->idone, status == 'I' && !failed);
}

/* The first ReadyForQuery after values sent inside a batch, up to the seq-th
 * such send: they stuck if the transaction ended there (I) without error. */
void plugin_tvars_ext_rfq(struct server *s, uint32_t seq, bool ok)
{
	if (s->tvars)
		tv_answered(s->tvars, TV_EXT, seq, ok);
}

/* The query numbered seq (of its kind) was answered: its values are known if
 * ok. Values sent inside a batch are all answered by one ReadyForQuery. */
static void tv_answered(struct tvars *t, int kind, uint32_t seq, bool ok)
{
	while (t->np && t->p[0].kind == kind && t->p[0].seq < seq && kind != TV_EXT)
		tv_pop(t);	/* an answer was lost (cannot happen): never trust it */
	while (t->np && t->p[0].kind == kind && t->p[0].seq <= seq) {
		for (int i = 0; ok && i < t->p[0].n; i++) {
			struct tv_val *pv = &t->p[0].v[i];
			int k = tv_find(t->v, t->n, pv->name, pv->nlen);
			if (k < 0 && t->n < TV_MAX)
				k = t->n++;
			if (k >= 0)
				tv_swap(&t->v[k], pv);	/* pv goes with the entry (tv_pop) */
		}
		tv_pop(t);
	}
}

/* Characters that end tv_text_len's scan: the NUL, the others refused. */
static const bool tv_stop[256] = {
	[0x00] = 1, [0x01] = 1, [0x02] = 1, [0x03] = 1, [0x04] = 1, [0x05] = 1, [0x06] = 1, [0x07] = 1,
	[0x08] = 1, [0x09] = 1, [0x0a] = 1, [0x0b] = 1, [0x0c] = 1, [0x0d] = 1, [0x0e] = 1, [0x0f] = 1,
	[0x10] = 1, [0x11] = 1, [0x12] = 1, [0x13] = 1, [0x14] = 1, [0x15] = 1, [0x16] = 1, [0x17] = 1,
	[0x18] = 1, [0x19] = 1, [0x1a] = 1, [0x1b] = 1, [0x1c] = 1, [0x1d] = 1, [0x1e] = 1, [0x1f] = 1,
	['\\'] = 1,
};

/* The length of v, or -1 when it is longer than max or has a control character or a backslash. */
static int tv_text_len(const char *v, size_t max)
{
	const unsigned char *p = (const unsigned char *)v;

	while (!tv_stop[*p])
		p++;
	if (*p || (size_t)(p - (const unsigned char *)v) > max)
		return -1;
	return (int)(p - (const unsigned char *)v);
}

static int api_query_set_var(lk_event *ev, const char *name, const char *value)
{
	struct ev_vars *x = ev->vars;
	int i, nlen, vlen = 0;

	if (ev->hook != LK_HOOK_QUERY || !name || !*name || (nlen = tv_text_len(name, EV_VAR_NAME - 1)) < 0 ||
	    (value && (vlen = tv_text_len(value, EV_VAR_VALUE - 1)) < 0))
		return -1;
	for (i = 0; i < ev->n_vars && (x->nlen[i] != nlen || memcmp(x->name[i], name, (size_t)nlen) != 0); i++)
		;
	if (i == TV_MAX)
		return -1;
	if (i == ev->n_vars) {
		if (!x)
			x = ev->vars = xmalloc(sizeof(*x));
		memcpy(x->name[i], name, (size_t)nlen + 1);
		x->nlen[i] = (uint8_t)nlen;
		ev->n_vars++;
	}
	x->has[i] = value != NULL;
	if (value) {
		memcpy(x->value[i], value, (size_t)vlen + 1);
		x->vlen[i] = (uint16_t)vlen;
	}
	return i;
}

static int api_query_on_vars(lk_plugin *self, lk_event *ev, lk_vars_fn fn, void *arg)
{
	int i;

	if (ev->hook != LK_HOOK_QUERY || !fn)
		return -1;
	for (i = 0; i < ev->n_on_vars && ev->on_vars[i].pl != self; i++)
		;
	if (i == (int)(sizeof(ev->on_vars) / sizeof(ev->on_vars[0])))
		return -1;
	ev->on_vars[i].pl = self;
	ev->on_vars[i].fn = fn;
	ev->on_vars[i].arg = arg;
	if (i == ev->n_on_vars)
		ev->n_on_vars++;
	return 0;
}

/* Append n bytes at buf + *o (the caller sized buf: see TV_SQL_ONE). */
static inline void put_bytes(char *buf, size_t *o, const char *s, size_t n)
{
	memcpy(buf + *o, s, n);
	*o += n;
}

#define PUT_STR(buf, o, lit) put_bytes(buf, o, lit, sizeof(lit) - 1)

/* 'text' with quotes doubled (the text has no backslash, see tv_text_len). */
static void put_literal(char *buf, size_t *o, const char *text, size_t len)
{
	const char *q;

	buf[(*o)++] = '\'';
	while ((q = memchr(text, '\'', len))) {
		size_t k = (size_t)(q - text) + 1;
		put_bytes(buf, o, text, k);
		buf[(*o)++] = '\'';
		text += k;
		len -= k;
	}
	put_bytes(buf, o, text, len);
	buf[(*o)++] = '\'';
}

static int api_query_vars_inline(lk_event *ev)
{
	if (ev->hook != LK_HOOK_QUERY || (ev->qtype != 'Q' && ev->qtype != 'P' && ev->qtype != 'B'))
		return -1;
	ev->vars_inline = true;
	return 0;
}

/* A GUC name SET takes as written: identifier, or two joined by a dot. */
static bool tv_set_name(const char *n)
{
	int parts = 0;

	for (;;) {
		if (!(islower((unsigned char)*n) || *n == '_'))
			return false;
		while (islower((unsigned char)*n) || isdigit((unsigned char)*n) || *n == '_')
			n++;
		if (++parts > 2)
			return false;
		if (!*n)
			return true;
		if (*n++ != '.')
			return false;
	}
}

static bool tv_ascii(const char *v)
{
	for (; *v; v++)
		if ((unsigned char)*v > 0x7e)
			return false;
	return true;
}

/* A value sent again: what was known or in flight for it no longer holds. */
static void tv_superseded(struct tvars *t, const char *name, size_t nlen)
{
	int k = 0;

	tv_remove(t->v, &t->n, name, nlen);
	for (int j = 0; j < t->np; j++) {
		tv_remove(t->p[j].v, &t->p[j].n, name, nlen);
		if (t->p[j].n) {	/* an entry left with nothing to record goes (after np) */
			if (k != j) {
				struct tv_pend x = t->p[k];
				t->p[k] = t->p[j];
				t->p[j] = x;
			}
			k++;
		}
	}
	t->np = k;
}

/*
 * The most one value takes in the statement plugin_query_send_vars builds:
 * `, set_config('name', 'value', false)` with every character of the name
 * (63) and of the value (255) a quote, doubled; `; SET name = 'value'; ` is
 * shorter.
 */
#define TV_SQL_ONE (2 + 11 + (2 * (EV_VAR_NAME - 1) + 2) + 2 + (2 * (EV_VAR_VALUE - 1) + 2) + 8)

/*
 * The client has its server now: send the query_set_var values that server
 * is not known to have, in one hidden Query (`SET a = 'x'; SET b = 'y'`, or
 * set_config() for names SET cannot take as written) or, for a Query whose
 * plugin allowed it (query_vars_inline), in front of the message itself
 * (ev->inl, see plugin_query_build); where no simple Query may go (inside
 * the client's extended-protocol batch, before a Bind of the unnamed
 * statement) and, for a Parse or Bind whose plugin allowed it
 * (query_vars_inline), also at the start of a batch (cheaper for PostgreSQL
 * than a Query of its own), in hidden extended-protocol messages
 * (server_send_hidden_ext):
 * one `SET` each (a utility statement: PostgreSQL plans nothing, so it
 * costs less than `SELECT set_config`, doc/plugins.md), or one
 * `SELECT set_config(...)` when a name cannot go in a SET as written; and
 * tell the plugins what was done.
 */
void plugin_query_send_vars(struct client *c, struct lk_event *ev)
{
	struct server *s = c->link;
	struct ev_vars *x = ev->vars;
	struct tvars *t;
	unsigned want = 0;
	int outcome = LK_VARS_KNOWN;
	bool ext = false;

	if (!ev->n_vars && !ev->n_on_vars)
		return;
	if (!s->tvars)
		s->tvars = xcalloc(1, sizeof(*s->tvars));
	t = s->tvars;
	for (int i = 0; i < ev->n_vars; i++) {
		int k;
		if (!x->has[i]) {	/* the message changes it: forget, also in flight */
			tv_superseded(t, x->name[i], x->nlen[i]);
			continue;
		}
		k = tv_find(t->v, t->n, x->name[i], x->nlen[i]);
		if (k < 0 || t->v[k].vlen != x->vlen[i] || memcmp(t->v[k].value, x->value[i], x->vlen[i]) != 0)
			want |= 1u << i;
	}
	if (want && ev->qtype != 'Q' && server_block_failed(s)) {
		/* PostgreSQL refuses the message in the failed block (25P02) unless
		 * it ends the block (which needs no values), and its own error
		 * (08P01, a syntax error) comes first: the values would fail first */
		want = 0;
		outcome = LK_VARS_SKIPPED;
	} else if (want && ev->qtype == 'Q' && ev->vars_inline) {
		/* in front of the Query itself: fine also after an open batch (the Query ends it) */
	} else if (want && ev->qtype != 'Q' && ev->vars_inline && !ev->n_prefix) {
		/* a Parse or Bind whose statement may share its transaction
		 * (query_vars_inline, ABI 1.9): extended messages, also where a
		 * Query could go (the start of a batch), as they cost PostgreSQL
		 * less than a Query of its own (no transaction and no ReadyForQuery
		 * of their own, doc/benchmarks.md). Not before a prefix: after an
		 * error in them PostgreSQL would skip its Query. */
		ext = true;
	} else if (want && (s->ext_open || plugin_query_binds_unnamed(ev))) {
		/* a simple Query would end the batch (or drop the unnamed statement) */
		if (ev->qtype == 'P' || ev->qtype == 'B') {
			/* and extended messages may make PostgreSQL refuse the statement
			 * (VACUUM, CREATE DATABASE ... "cannot be executed within a
			 * pipeline" behind another Execute): nothing goes */
			want = 0;
			outcome = LK_VARS_SKIPPED;
		} else if (ev->qtype != 'Q' || s->ext_fails) {
			ext = true;
		}
		/* else a Query behind messages the core answered itself (a Close):
		 * the server has no batch open, and extended messages that failed
		 * (25P02 in a failed block) would make PostgreSQL skip the Query,
		 * which without them runs; a hidden Query fails alone */
	}
	if (want) {
		char sql[TV_MAX * TV_SQL_ONE + 16];
		bool set_form = true, inl = !ext && ev->qtype == 'Q' && ev->vars_inline;
		size_t o = 0;
		int np, nwant = 0;
		for (int i = 0; i < ev->n_vars; i++) {
			if (!(want & (1u << i)))
				continue;
			if (!tv_set_name(x->name[i]))
				set_form = inl = false;
			if (!tv_ascii(x->value[i]))
				inl = false;
		}
		if (!set_form)
			PUT_STR(sql, &o, "SELECT ");
		for (int i = 0; i < ev->n_vars; i++) {
			if (!(want & (1u << i)))
				continue;
			if (set_form) {
				if (ext)
					o = 0;		/* one SET per group of extended messages */
				else if (o && !inl)
					PUT_STR(sql, &o, "; ");
				PUT_STR(sql, &o, "SET ");
				put_bytes(sql, &o, x->name[i], x->nlen[i]);
				PUT_STR(sql, &o, " = ");
				put_literal(sql, &o, x->value[i], x->vlen[i]);
				if (inl)
					PUT_STR(sql, &o, "; ");
				if (ext) {
					sql[o] = 0;
					server_send_hidden_ext(s, sql);
				}
			} else {
				if (o > 7)
					PUT_STR(sql, &o, ", ");
				PUT_STR(sql, &o, "set_config(");
				put_literal(sql, &o, x->name[i], x->nlen[i]);
				PUT_STR(sql, &o, ", ");
				put_literal(sql, &o, x->value[i], x->vlen[i]);
				PUT_STR(sql, &o, ", false)");
			}
			tv_superseded(t, x->name[i], x->nlen[i]);
			nwant++;
		}
		sql[o] = 0;
		np = t->np < TV_PEND ? t->np : -1;
		if (ext) {
			if (!set_form)
				server_send_hidden_ext(s, sql);	/* one SELECT set_config(...), ... */
			/* no ReadyForQuery of their own: the first one the client's batch
			 * gets says whether they stuck (server_expect marks its item) */
			s->ext_seq = ++t->esent;
			s->ext_armed = true;
		} else if (inl) {
			if (ev->inl_cap < o + 1) {
				free(ev->inl);
				ev->inl_cap = o + 1 > 256 ? o + 1 : 256;
				ev->inl = xmalloc(ev->inl_cap);
			}
			memcpy(ev->inl, sql, o + 1);
			ev->inline_len = o;
			ev->inline_n = nwant;
			t->isent++;
		} else {
			t->ours = true;
			server_send_hidden(s, sql);
			t->ours = false;
		}
		if (np >= 0) {		/* remembered when it is answered (else: not tracked) */
			struct tv_pend *pe = &t->p[np];
			pe->seq = ext ? t->esent : inl ? t->isent : t->sent;
			pe->kind = ext ? TV_EXT : inl ? TV_INLINE : TV_HIDDEN;
			pe->n = 0;
			for (int i = 0; i < ev->n_vars; i++) {
				if (!(want & (1u << i)))
					continue;
				tv_fill(&pe->v[pe->n++], x->name[i], x->nlen[i], x->value[i], x->vlen[i]);
			}
			t->np++;
		}
		outcome = LK_VARS_SENT;
	}
	for (int i = 0; i < ev->n_on_vars; i++)
		ev->on_vars[i].fn(ev->on_vars[i].pl, (lk_client *)c, outcome, want, ev->on_vars[i].arg);
}

static int api_query_reparse(lk_event *ev, const char *sql)
{
	if (ev->hook != LK_HOOK_QUERY || ev->qtype != 'B' || !sql || !*sql || !ev->bound_sql)
		return -1;
	set_str(&ev->reparse, sql);
	return 0;
}

/*
 * Close (a named statement) and Parse `name` with `sql` and the client's
 * parameter types, into pb, and note the text. hidden_acks: the replies
 * to hide. Returns the text's generation (stmt_text.gen).
 */
static uint32_t stmt_parse_msgs(struct client *c, const char *name, const char *sql, struct pktbuf *pb,
				int *hidden_acks)
{
	struct stmt_text *st = stmt_find(c, name);

	*hidden_acks = 0;
	if (name[0]) {
		pkt_close(pb, 'S', name);
		(*hidden_acks)++;
	}
	pkt_begin(pb, 'P');
	pkt_put_string(pb, name);
	pkt_put_string(pb, sql);
	if (st && st->types_len >= 2)
		pkt_put_bytes(pb, st->types, st->types_len);
	else
		pkt_put_int16(pb, 0);
	pkt_end(pb);
	(*hidden_acks)++;
	if (st && st->sql == sql) {	/* sent again */
		st->gen = next_stmt_gen();
		st->resend = false;
	} else {
		plugin_note_parse(c, name, sql);
		st = stmt_find(c, name);
	}
	return st ? st->gen : 0;
}

/*
 * A decided Bind with a re-parse: the Close (named statements) and Parse to
 * send before it, into pb. Returns the text's generation, 0 when there is
 * none.
 */
uint32_t plugin_query_reparse_msgs(struct client *c, struct lk_event *ev, struct pktbuf *pb, int *hidden_acks)
{
	*hidden_acks = 0;
	if (!ev->reparse || ev->qtype != 'B')
		return 0;
	return stmt_parse_msgs(c, ev->stmt, ev->reparse, pb, hidden_acks);
}

/* (rq_unsettled: a re-parse of the client's statement arg) */
static bool reparse_of(const struct rq_item *it, const void *arg)
{
	return it->reparse_gen && strcmp(it->name, arg) == 0;
}

/*
 * A Bind of `name` with no re-parse (statements not cached by the core):
 * does the server's text of it need sending again first? When a re-parse
 * did not reach it (stmt_text.resend: skipped after an error of its batch,
 * or failed), and when the last one is still unanswered in an earlier batch
 * (the client sends past a Sync): it may yet be skipped. Then the Close and
 * Parse of the text the plugin was told, into pb. Returns the generation,
 * 0 when nothing is needed.
 */
uint32_t plugin_stmt_resend_msgs(struct client *c, struct server *s, const char *name, struct pktbuf *pb,
				 int *hidden_acks)
{
	bool unsure = rq_unsettled(&s->rq, reparse_of, name);
	struct stmt_text *st;

	*hidden_acks = 0;
	if (!unsure && !c->stmt_resends)
		return 0;
	st = stmt_find(c, name);
	if (!st || (!st->resend && !unsure))
		return 0;
	return stmt_parse_msgs(c, name, st->sql, pb, hidden_acks);
}

/*
 * The server does not have text generation `gen` noted for the client's
 * statement `name` (a re-parse not sent, skipped or refused), unless a
 * later message noted another (its own Parse goes to the server): it is
 * sent again before the next Bind.
 */
void plugin_reparse_unsent(struct client *c, const char *name, uint32_t gen)
{
	struct stmt_text *st = c && name ? stmt_find(c, name) : NULL;

	if (st && st->gen == gen) {
		st->resend = true;
		c->stmt_resends = true;
	}
}

/* The server skipped or refused item `it`, a re-parse's Parse. */
void plugin_reparse_lost(struct client *c, const struct rq_item *it)
{
	plugin_reparse_unsent(c, it->name, it->reparse_gen);
}

static int set_route(lk_event *ev, const char *dbname)
{
	struct client *c = ev->c;
	struct lk_db *db;

	if (!c || !dbname || admin_is_dbname(dbname))
		return -1;
	db = db_lookup(dbname, true);
	if (!db || db->removed)
		return -1;
	if (c->link && c->link->pool->db != db)
		return -1;	/* it holds a server of another pool (a transaction, or session mode) */
	set_str(&ev->route, dbname);
	return 0;
}

static int api_query_route(lk_event *ev, const char *dbname)
{
	if (ev->hook != LK_HOOK_QUERY)
		return -1;
	return set_route(ev, dbname);
}

static int api_route_set(lk_event *ev, const char *dbname)
{
	if (ev->hook != LK_HOOK_ROUTE)
		return -1;
	return set_route(ev, dbname);
}

static struct lk_result *result_new(struct client *c, bool console)
{
	struct lk_result *res = xcalloc(1, sizeof(*res));
	res->c = c;
	res->console = console;
	pkt_init(&res->pb);
	return res;
}

static lk_result *api_query_result(lk_event *ev)
{
	if (ev->hook != LK_HOOK_QUERY)
		return NULL;
	if (!ev->res)
		ev->res = result_new(ev->c, false);
	return ev->res;
}

char **plugin_query_prefixes(struct lk_event *ev, int *n)
{
	*n = ev->n_prefix;
	return ev->prefix;
}

enum lk_hook plugin_event_hook(const struct lk_event *ev)
{
	return ev->hook;
}

bool plugin_query_wants_reparse(const struct lk_event *ev)
{
	return ev->reparse != NULL;
}

const char *plugin_event_stmt(const struct lk_event *ev)
{
	return ev->stmt;
}

const char *plugin_event_reparse(const struct lk_event *ev)
{
	return ev->reparse;
}

bool plugin_query_binds_unnamed(const struct lk_event *ev)
{
	return ev->qtype == 'B' && ev->stmt && !ev->stmt[0];
}

/* The message to send for a decided QUERY with LK_CONTINUE: rebuilt in pb when it changed (true). */
/* A decided Parse as it will go to the server, into pb (nothing noted) */
void plugin_query_parse_msg(struct lk_event *ev, struct pktbuf *pb)
{
	pkt_begin(pb, 'P');
	pkt_put_string(pb, ev->stmt);
	pkt_put_string(pb, ev->new_sql ? ev->new_sql : ev->sql);
	pkt_put_bytes(pb, ev->body + ev->params_off - 2, 2 + 4u * (uint32_t)ev->nparams);
	pkt_end(pb);
}

bool plugin_query_build(struct client *c, struct lk_event *ev, struct pktbuf *pb)
{
	bool changed = false;
	switch (ev->qtype) {
	case 'Q':
		if (ev->inline_len) {
			/* the values in front (plugin_query_send_vars); the reply queue's
			 * item of this Query (note_sent_to_server) hides their replies */
			struct server *s = c->link;
			struct rq_item *it = s && s->rq.count ? rq_at(&s->rq, s->rq.count - 1) : NULL;
			const char *text = ev->new_sql ? ev->new_sql : ev->sql;
			size_t n = ev->inline_len;
			pkt_begin(pb, 'Q');
			pkt_put_bytes(pb, ev->inl, n);
			pkt_put_string(pb, text);
			pkt_end(pb);
			if (it && it->type == 'Q') {
				it->hide_cc = (uint8_t)ev->inline_n;
				it->vars = true;
				it->shift = (uint32_t)n;	/* ASCII: characters = bytes */
			}
			changed = true;
		} else if (ev->new_sql) {
			pkt_query(pb, ev->new_sql);
			changed = true;
		}
		break;
	case 'P':
		if (ev->new_sql) {
			plugin_query_parse_msg(ev, pb);
			changed = true;
		}
		note_client_parse(c, ev, ev->stmt, ev->new_sql ? ev->new_sql : ev->sql,
				  ev->body + ev->params_off - 2, 2 + 4u * (uint32_t)ev->nparams);
		break;
	case 'B':
		if (ev->param_set) {
			pkt_begin(pb, 'B');
			pkt_put_string(pb, ev->portal);
			pkt_put_string(pb, ev->stmt);
			pkt_put_int16(pb, (int16_t)ev->nparams);
			for (int i = 0; i < ev->nparams; i++) {
				int fmt = 0;
				if (!ev->param_set[i] && ev->nfmts > 0)
					fmt = pkt_get_u16(ev->body + ev->fmts_off + 2u * (uint32_t)(ev->nfmts == 1 ? 0 : i));
				pkt_put_int16(pb, (int16_t)fmt);
			}
			pkt_put_int16(pb, (int16_t)ev->nparams);
			for (int i = 0; i < ev->nparams; i++) {
				int plen;
				const char *v = api_query_param(ev, i, &plen, NULL);
				pkt_put_int32(pb, v ? plen : -1);
				if (v && plen > 0)
					pkt_put_bytes(pb, v, (size_t)plen);
			}
			pkt_put_bytes(pb, ev->body + ev->tail_off, ev->blen - ev->tail_off);
			pkt_end(pb);
			changed = true;
		}
		break;
	default:
		break;
	}
	return changed;
}

/* LK_HANDLED: the plugin's answer, then what the protocol needs after it
 * but the ReadyForQuery of a Query, into pb. */
void plugin_query_answer(struct lk_event *ev, struct pktbuf *pb)
{
	struct lk_result *res = ev->res;

	if (ev->qtype == 'Q') {
		if (res) {
			if (!res->complete && !res->failed) {
				char tag[32];
				snprintf(tag, sizeof(tag), "SELECT %d", res->nrows);
				pkt_command_complete(&res->pb, tag);
			}
			if (!res->pb.failed)
				pkt_put_bytes(pb, res->pb.data, res->pb.len);
		} else {
			pkt_begin(pb, 'I');	/* EmptyQueryResponse */
			pkt_end(pb);
		}
	} else {
		pkt_begin(pb, ev->qtype == 'P' ? '1' : '2');
		pkt_end(pb);
	}
}

/* ================= ROUTE ================= */

/* Returns LK_ASYNC (c->rev pending) or the decision (c->rev decided). */
int plugin_route(struct client *c)
{
	return run_client_event(&c->rev, c, LK_HOOK_ROUTE);
}

/* ================= replies ================= */

static int api_result_columns(lk_result *res, int n, const char *const *names, const uint32_t *types)
{
	if (res->columns || res->failed || n <= 0 || n > 1600)
		return -1;
	pkt_begin(&res->pb, 'T');
	pkt_put_int16(&res->pb, (int16_t)n);
	for (int i = 0; i < n; i++) {
		uint32_t t = types ? types[i] : LK_TYPE_TEXT;
		int16_t size = t == LK_TYPE_INT8 ? 8 : t == LK_TYPE_INT4 ? 4 : t == LK_TYPE_BOOL ? 1 : -1;
		pkt_put_string(&res->pb, names[i] ? names[i] : "?column?");
		pkt_put_int32(&res->pb, 0);
		pkt_put_int16(&res->pb, 0);
		pkt_put_int32(&res->pb, (int32_t)t);
		pkt_put_int16(&res->pb, size);
		pkt_put_int32(&res->pb, -1);
		pkt_put_int16(&res->pb, 0);
	}
	pkt_end(&res->pb);
	res->columns = true;
	res->ncols = n;
	return 0;
}

static int api_result_row(lk_result *res, const char *const *values)
{
	if (!res->columns || res->failed || res->complete)
		return -1;
	pkt_data_row(&res->pb, res->ncols, values);
	res->nrows++;
	return 0;
}

static int api_result_notice(lk_result *res, const char *msg)
{
	if (res->failed)
		return -1;
	pkt_notice(&res->pb, "00000", msg);
	return 0;
}

static int api_result_complete(lk_result *res, const char *tag)
{
	char buf[32];
	if (res->failed || res->complete)
		return -1;
	if (!tag) {
		if (res->console) {
			tag = "SHOW";
		} else {
			snprintf(buf, sizeof(buf), "SELECT %d", res->nrows);
			tag = buf;
		}
	}
	pkt_command_complete(&res->pb, tag);
	res->complete = true;
	return 0;
}

static int api_result_error(lk_result *res, const char *sqlstate, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pkt_reset(&res->pb);
	pkt_error(&res->pb, "ERROR", sqlstate && strlen(sqlstate) == 5 ? sqlstate : "XX000", msg, NULL);
	res->failed = true;
	return LK_ERROR;
}

/* Send a console result and ReadyForQuery; free it. */
static void console_finish(struct lk_result *res)
{
	struct client *c = res->c;

	if (c && !c->closing && c->bev) {
		if (!res->failed && !res->complete)
			api_result_complete(res, NULL);
		pkt_ready(&res->pb, 'I');
		pkt_send(&res->pb, bufferevent_get_output(c->bev));
		if (c->console_res == res) {
			/* answered later: the console reads its next command now */
			c->console_res = NULL;
			result_free(res);
			client_resume(c);
			return;
		}
	}
	result_free(res);
}

static void api_result_done(lk_result *res)
{
	if (!res || !res->console || !res->async)
		return;
	res->async = false;
	console_finish(res);
}

/* ================= console ================= */

static const char *word_end(const char *p)
{
	while (*p && !isspace((unsigned char)*p) && *p != ';')
		p++;
	return p;
}

static const char *skip_space(const char *p)
{
	while (*p && isspace((unsigned char)*p))
		p++;
	return p;
}

/* Does `query` start with the words of `name`? Returns the rest or NULL. */
static const char *match_words(const char *query, const char *name)
{
	const char *q = skip_space(query), *n = name;

	while (*n) {
		const char *qe = word_end(q), *ne = n;
		while (*ne && *ne != ' ')
			ne++;
		if ((size_t)(qe - q) != (size_t)(ne - n) || strncasecmp(q, n, (size_t)(ne - n)) != 0)
			return NULL;
		q = skip_space(qe);
		n = *ne ? ne + 1 : ne;
	}
	return q;
}

bool plugin_console_name_taken(const char *name)
{
	for (int i = 0; i < P.n_cmds; i++)
		if (strcasecmp(P.cmds[i].name, name) == 0)
			return true;
	return false;
}

static int api_console_register(lk_plugin *self, const char *name, int admin_only, lk_console_fn fn, const char *doc)
{
	struct console_cmd *v;
	char norm[128];
	size_t n = 0;
	int words = 0;
	const char *p = skip_space(name ? name : "");

	if (!fn)
		return -1;
	while (*p && n < sizeof(norm) - 2) {
		const char *e = word_end(p);
		if (e == p)
			return -1;
		if (n)
			norm[n++] = ' ';
		for (; p < e && n < sizeof(norm) - 1; p++)
			norm[n++] = (char)toupper((unsigned char)*p);
		p = skip_space(p);
		words++;
	}
	norm[n] = 0;
	if (words < 1 || words > 2 || plugin_console_name_taken(norm) || admin_is_core_command(norm))
		return -1;
	v = push_slot(&P.cmds, &P.n_cmds, sizeof(*v));
	if (!v)
		return -1;
	v->name = xstrdup(norm);
	v->pl = self;
	v->fn = fn;
	v->admin_only = admin_only != 0;
	v->doc = doc ? xstrdup(doc) : NULL;
	return 0;
}

bool plugin_console(struct client *c, const char *query)
{
	const struct console_cmd *best = NULL;
	const char *args = NULL;
	size_t best_len = 0;

	for (int i = 0; i < P.n_cmds; i++) {
		const char *rest = match_words(query, P.cmds[i].name);
		if (rest && strlen(P.cmds[i].name) > best_len) {
			best = &P.cmds[i];
			best_len = strlen(best->name);
			args = rest;
		}
	}
	if (!best)
		return false;
	{
		char *a = xstrdup(args);
		size_t n = strlen(a);
		struct lk_result *res = result_new(c, true);
		int rc;
		while (n > 0 && (isspace((unsigned char)a[n - 1]) || a[n - 1] == ';'))
			a[--n] = 0;
		if (best->admin_only && !c->admin_full) {
			api_result_error(res, "42501", "admin access needed");
			console_finish(res);
			free(a);
			return true;
		}
		rc = best->fn(best->pl, res, a);
		free(a);
		if (rc == LK_ASYNC && !res->failed) {
			res->async = true;
			c->console_res = res;
			return true;
		}
		if (rc == LK_ERROR && !res->failed)
			api_result_error(res, "XX000", "plugin %s failed the command", best->pl->name);
		console_finish(res);
	}
	return true;
}

void plugin_console_help(char *buf, size_t len)
{
	for (int i = 0; i < P.n_cmds; i++) {
		size_t n = strlen(buf);
		snprintf(buf + n, len - n, "; %s", P.cmds[i].name);
	}
}

void plugin_show_plugins(struct pktbuf *pb)
{
	for (int i = 0; i < rt->n_plugins; i++) {
		struct lk_plugin *pl = rt->plugins[i];
		char abi[32], hooks[256] = "", transports[256] = "", cmds[512] = "";
		const char *v[8];
		snprintf(abi, sizeof(abi), "%u.%u", pl->desc->abi_major, pl->desc->abi_minor);
		for (int h = 0; h < LK_HOOK_COUNT; h++)
			if (pl->hooks & (1u << h)) {
				size_t n = strlen(hooks);
				snprintf(hooks + n, sizeof(hooks) - n, "%s%s", n ? "," : "", hook_names[h]);
			}
		for (int t = 0; t < P.n_transports; t++)
			if (P.transports[t].pl == pl) {
				size_t n = strlen(transports);
				snprintf(transports + n, sizeof(transports) - n, "%s%s", n ? "," : "", P.transports[t].name);
			}
		for (int k = 0; k < P.n_cmds; k++)
			if (P.cmds[k].pl == pl) {
				size_t n = strlen(cmds);
				snprintf(cmds + n, sizeof(cmds) - n, "%s%s", n ? "," : "", P.cmds[k].name);
			}
		v[0] = pl->name;
		v[1] = pl->desc->version ? pl->desc->version : "";
		v[2] = abi;
		v[3] = pl->path;
		v[4] = hooks;
		v[5] = transports;
		v[6] = cmds;
		v[7] = "loaded";
		pkt_data_row(pb, 8, v);
	}
}

/* ================= transports ================= */

static struct transport *transport_find(const char *name)
{
	for (int i = 0; i < P.n_transports; i++)
		if (strcmp(P.transports[i].name, name) == 0)
			return &P.transports[i];
	return NULL;
}

bool plugin_transport_exists(const char *name)
{
	return transport_find(name) != NULL;
}

static int api_transport_register(lk_plugin *self, const char *name, lk_transport_fn fn)
{
	struct transport *v;
	if (!name || !*name || !fn || transport_find(name) || strcmp(name, "tcp") == 0)
		return -1;
	v = push_slot(&P.transports, &P.n_transports, sizeof(*v));
	if (!v)
		return -1;
	v->name = xstrdup(name);
	v->pl = self;
	v->fn = fn;
	return 0;
}

static void connect_free(struct lk_connect *req)
{
	if (req->is_cancel) {
		struct lk_connect **pp;
		for (pp = &P.cancels; *pp; pp = &(*pp)->next)
			if (*pp == req) {
				*pp = req->next;
				break;
			}
	}
	free(req->host);
	free(req->dbname);
	free(req->database);
	free(req);
}

static struct lk_connect *connect_new(struct transport *t, struct lk_db *db)
{
	struct lk_connect *req = xcalloc(1, sizeof(*req));
	req->t = t;
	req->db = db;
	req->host = db->conf.host ? xstrdup(db->conf.host) : NULL;
	req->port = db->conf.port > 0 ? db->conf.port : 5432;
	req->dbname = xstrdup(db->conf.dbname ? db->conf.dbname : db->name);
	req->database = xstrdup(db->name);
	return req;
}

/* Call the transport; the request may be answered (and freed) inside. */
static void connect_call(struct lk_connect *req)
{
	int rc;
	req->in_call = true;
	rc = req->t->fn(req->t->pl, req);
	req->in_call = false;
	if (req->done) {
		connect_free(req);
		return;
	}
	if (rc == LK_ASYNC)
		return;
	/* LK_ERROR without connect_failed(), or LK_HANDLED without connect_ready() */
	if (req->s) {
		struct server *s = req->s;
		s->conn_req = NULL;
		server_transport_failed(s, rc == LK_ERROR ? "the transport failed" : "the transport gave no connection");
	}
	connect_free(req);
}

/* A server of a pool whose database has transport=NAME: ask the plugin. */
bool plugin_transport_connect(struct server *s)
{
	struct transport *t = transport_find(s->pool->db->conf.transport);
	struct lk_connect *req;

	if (!t) {
		server_transport_failed(s, "no plugin provides this transport");
		return false;
	}
	req = connect_new(t, s->pool->db);
	req->s = s;
	s->conn_req = req;
	connect_call(req);
	return true;
}

bool plugin_transport_cancel(struct server *s, const uint8_t *pkt16)
{
	struct transport *t = transport_find(s->pool->db->conf.transport);
	struct lk_connect *req;

	if (!t)
		return false;
	req = connect_new(t, s->pool->db);
	req->is_cancel = true;
	memcpy(req->cancel, pkt16, 16);
	req->next = P.cancels;
	P.cancels = req;
	connect_call(req);
	return true;
}

static const char *api_connect_host(lk_connect *req)
{
	return req->host;
}

static int api_connect_port(lk_connect *req)
{
	return req->port;
}

static const char *api_connect_dbname(lk_connect *req)
{
	return req->dbname;
}

static const char *api_connect_database(lk_connect *req)
{
	return req->database;
}

static int api_connect_is_cancel(lk_connect *req)
{
	return req->is_cancel;
}

static lk_server *api_connect_server(lk_connect *req)
{
	return (lk_server *)req->s;
}

static void connect_answered(struct lk_connect *req)
{
	req->done = true;
	if (!req->in_call)
		connect_free(req);
}

static void api_connect_ready(lk_connect *req, int fd)
{
	if (!req || req->done)
		return;
	if (req->is_cancel) {
		server_cancel_fd(req->cancel, fd);
	} else if (req->s) {
		struct server *s = req->s;
		s->conn_req = NULL;
		req->s = NULL;
		server_transport_ready(s, fd);
	} else {
		close(fd);	/* its server is gone */
	}
	connect_answered(req);
}

static void api_connect_failed(lk_connect *req, const char *msg)
{
	if (!req || req->done)
		return;
	if (req->s) {
		struct server *s = req->s;
		s->conn_req = NULL;
		req->s = NULL;
		server_transport_failed(s, msg ? msg : "the transport could not connect");
	}
	connect_answered(req);
}

/* ================= services ================= */

static int api_service_publish(lk_plugin *self, const char *name, const void *table)
{
	struct service *v;
	if (!name || !*name || !table)
		return -1;
	for (int i = 0; i < P.n_services; i++)
		if (strcmp(P.services[i].name, name) == 0)
			return -1;
	v = push_slot(&P.services, &P.n_services, sizeof(*v));
	if (!v)
		return -1;
	v->name = xstrdup(name);
	v->table = table;
	v->pl = self;
	return 0;
}

static const void *api_service_lookup(const char *name)
{
	for (int i = 0; name && i < P.n_services; i++)
		if (strcmp(P.services[i].name, name) == 0)
			return P.services[i].table;
	return NULL;
}

/* ================= the loop ================= */

static struct event_base *api_event_base(void)
{
	return rt->base;
}

static uint64_t api_now_usec(void)
{
	return (uint64_t)now_mono();
}

static void timer_free(struct lk_timer *t)
{
	LIST_REMOVE(t, entry);
	event_free(t->ev);
	free(t);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct lk_timer *t = arg;
	(void)fd;
	(void)what;
	rt->now = now_mono();
	if (t->repeat) {
		t->fn(t->pl, t->arg);
	} else {
		lk_timer_fn fn = t->fn;
		struct lk_plugin *pl = t->pl;
		void *a = t->arg;
		timer_free(t);
		fn(pl, a);
	}
}

static lk_timer *api_timer_add(lk_plugin *self, uint64_t usec, int repeat, lk_timer_fn fn, void *arg)
{
	struct lk_timer *t;
	struct timeval tv = { (time_t)(usec / 1000000), (suseconds_t)(usec % 1000000) };

	if (!fn || !rt->base)
		return NULL;
	t = xcalloc(1, sizeof(*t));
	t->ev = event_new(rt->base, -1, repeat ? EV_PERSIST : 0, timer_cb, t);
	if (!t->ev) {
		free(t);
		return NULL;
	}
	t->pl = self;
	t->fn = fn;
	t->arg = arg;
	t->repeat = repeat != 0;
	LIST_INSERT_HEAD(&P.timers, t, entry);
	event_add(t->ev, &tv);
	return t;
}

static void api_timer_cancel(lk_timer *t)
{
	if (t)
		timer_free(t);
}

/* ================= libpq on the loop ================= */

static void pg_arm(struct lk_pg *pg, short what);

static void pg_cb_free(struct pg_cb *q)
{
	for (int i = 0; i < q->nparams; i++)
		free(q->params[i]);
	free(q->params);
	free(q->sql);
	free(q);
}

/* The connection broke: fail every pending query, then tell the owner (inside pg_io only). */
static void pg_broken(struct lk_pg *pg, const char *why)
{
	char msg[512];
	struct pg_cb *q;

	snprintf(msg, sizeof(msg), "%s", why ? why : (pg->conn ? PQerrorMessage(pg->conn) : "connection failed"));
	for (size_t n = strlen(msg); n > 0 && msg[n - 1] == '\n'; n--)
		msg[n - 1] = 0;
	pg->closed = true;
	if (pg->ev) {
		event_free(pg->ev);
		pg->ev = NULL;
	}
	if (pg->last) {
		PQclear(pg->last);
		pg->last = NULL;
	}
	while ((q = pg->head)) {
		pg->head = q->next;
		if (!pg->head)
			pg->tail = NULL;
		if (q->fn)
			q->fn(pg->pl, pg, NULL, q->arg);
		pg_cb_free(q);
		if (pg->free_me)
			return;	/* closed from the callback */
	}
	if (pg->state_fn)
		pg->state_fn(pg->pl, pg, 0, msg, pg->state_arg);
}

static bool pg_send_next(struct lk_pg *pg)
{
	struct pg_cb *q = pg->head;
	int rc;

	if (!q || q->sent || pg->connecting || pg->closed)
		return true;
	if (q->nparams > 0)
		rc = PQsendQueryParams(pg->conn, q->sql, q->nparams, NULL, (const char *const *)q->params, NULL, NULL, 0);
	else
		rc = PQsendQuery(pg->conn, q->sql);
	if (!rc)
		return false;
	q->sent = true;
	return true;
}

static void pg_free(struct lk_pg *pg)
{
	free(pg);
}

/* Every libpq callback of a plugin runs from here. */
static void pg_io(evutil_socket_t fd, short what, void *arg)
{
	struct lk_pg *pg = arg;
	(void)fd;

	rt->now = now_mono();
	pg->in_cb++;
	if (pg->connecting) {
		PostgresPollingStatusType st;
		if (!pg->conn || PQstatus(pg->conn) == CONNECTION_BAD) {
			pg_broken(pg, pg->conn ? NULL : "out of memory");
			goto out;
		}
		st = PQconnectPoll(pg->conn);
		if (st == PGRES_POLLING_FAILED) {
			pg_broken(pg, NULL);
			goto out;
		}
		if (st == PGRES_POLLING_OK) {
			pg->connecting = false;
			PQsetnonblocking(pg->conn, 1);
			if (pg->state_fn)
				pg->state_fn(pg->pl, pg, 1, NULL, pg->state_arg);
			if (!pg->free_me && !pg->closed)
				pg_arm(pg, pg->head ? EV_READ | EV_WRITE : EV_READ);
			goto out;
		}
		pg_arm(pg, st == PGRES_POLLING_READING ? EV_READ : EV_WRITE);
		goto out;
	}
	if (pg->closed)
		goto out;
	if (what & EV_WRITE) {
		int f;
		if (!pg_send_next(pg)) {
			pg_broken(pg, NULL);
			goto out;
		}
		f = PQflush(pg->conn);
		if (f < 0) {
			pg_broken(pg, NULL);
			goto out;
		}
		pg_arm(pg, f ? EV_READ | EV_WRITE : EV_READ);
	}
	if (what & EV_READ) {
		PGnotify *n;
		if (!PQconsumeInput(pg->conn)) {
			pg_broken(pg, NULL);
			goto out;
		}
		while (pg->head && pg->head->sent && !PQisBusy(pg->conn)) {
			PGresult *r = PQgetResult(pg->conn);
			struct pg_cb *q;
			PGresult *last;
			if (r) {
				if (pg->last)
					PQclear(pg->last);
				pg->last = r;
				continue;
			}
			q = pg->head;
			last = pg->last;
			pg->last = NULL;
			pg->head = q->next;
			if (!pg->head)
				pg->tail = NULL;
			if (q->fn)
				q->fn(pg->pl, pg, last, q->arg);
			if (last)
				PQclear(last);
			pg_cb_free(q);
			if (pg->free_me || pg->closed)
				goto out;
			if (pg->head) {
				pg_arm(pg, EV_READ | EV_WRITE);	/* the next query goes out from the write side */
				break;
			}
		}
		while (!pg->free_me && !pg->closed && (n = PQnotifies(pg->conn))) {
			if (pg->notify_fn)
				pg->notify_fn(pg->pl, pg, n->relname, n->extra, pg->notify_arg);
			PQfreemem(n);
		}
		if (!pg->free_me && !pg->closed && PQstatus(pg->conn) == CONNECTION_BAD)
			pg_broken(pg, NULL);
	}
out:
	pg->in_cb--;
	if (pg->free_me && pg->in_cb == 0)
		pg_free(pg);
}

static void pg_arm(struct lk_pg *pg, short what)
{
	int fd = PQsocket(pg->conn);

	if (pg->ev) {
		event_free(pg->ev);
		pg->ev = NULL;
	}
	if (fd < 0)
		return;
	pg->ev = event_new(rt->base, fd, what | EV_PERSIST, pg_io, pg);
	if (pg->ev)
		event_add(pg->ev, NULL);
}

/* Notices and warnings of a plugin's connection go to the log, not to stderr. */
static void pg_notice(void *arg, const char *message)
{
	struct lk_pg *pg = arg;
	size_t n = strlen(message);
	while (n > 0 && message[n - 1] == '\n')
		n--;
	log_debug("plugin %s: PostgreSQL says: %.*s", pg->pl->name, (int)n, message);
}

static lk_pg *api_pg_connect(lk_plugin *self, const char *conninfo, lk_pg_state_fn fn, void *arg)
{
	struct lk_pg *pg;

	if (!conninfo || !rt->base)
		return NULL;
	pg = xcalloc(1, sizeof(*pg));
	pg->pl = self;
	pg->state_fn = fn;
	pg->state_arg = arg;
	pg->conn = PQconnectStart(conninfo);
	if (pg->conn)
		PQsetNoticeProcessor(pg->conn, pg_notice, pg);
	LIST_INSERT_HEAD(&P.pgs, pg, entry);
	if (!pg->conn || PQstatus(pg->conn) == CONNECTION_BAD) {
		/* reported from the loop, not from inside the caller */
		struct timeval zero = { 0, 0 };
		pg->connecting = true;
		pg->ev = event_new(rt->base, -1, 0, pg_io, pg);
		if (pg->ev)
			event_add(pg->ev, &zero);
		return pg;
	}
	pg->connecting = true;
	pg_arm(pg, EV_WRITE);
	return pg;
}

static int api_pg_query(lk_pg *pg, const char *sql, int nparams, const char *const *params, lk_pg_result_fn fn, void *arg)
{
	struct pg_cb *q;

	if (!pg || !sql || pg->closed || nparams < 0)
		return -1;
	q = xcalloc(1, sizeof(*q));
	q->sql = xstrdup(sql);
	q->nparams = nparams;
	if (nparams > 0) {
		q->params = xcalloc((size_t)nparams, sizeof(char *));
		for (int i = 0; i < nparams; i++)
			q->params[i] = params && params[i] ? xstrdup(params[i]) : NULL;
	}
	q->fn = fn;
	q->arg = arg;
	if (pg->tail)
		pg->tail->next = q;
	else
		pg->head = q;
	pg->tail = q;
	if (pg->head == q && !pg->connecting)
		pg_arm(pg, EV_READ | EV_WRITE);	/* sent from pg_io, where callbacks may run */
	return 0;
}

static void api_pg_on_notify(lk_pg *pg, lk_pg_notify_fn fn, void *arg)
{
	if (!pg)
		return;
	pg->notify_fn = fn;
	pg->notify_arg = arg;
}

static struct pg_conn *api_pg_conn(lk_pg *pg)
{
	return pg ? pg->conn : NULL;
}

static void api_pg_close(lk_pg *pg)
{
	struct pg_cb *q;

	if (!pg)
		return;
	LIST_REMOVE(pg, entry);
	if (pg->ev)
		event_free(pg->ev);
	while ((q = pg->head)) {
		pg->head = q->next;
		pg_cb_free(q);
	}
	if (pg->last)
		PQclear(pg->last);
	pg->head = pg->tail = NULL;
	pg->last = NULL;
	pg->ev = NULL;
	if (pg->conn)
		PQfinish(pg->conn);
	pg->conn = NULL;
	pg->closed = true;
	if (pg->in_cb)
		pg->free_me = true;
	else
		pg_free(pg);
}

/* ================= startup parameters ================= */

static int api_startup_parameter(lk_plugin *self, const char *name)
{
	char **v;
	(void)self;
	if (!name || !*name)
		return -1;
	if (plugin_startup_param_ok(name))
		return 0;
	v = push_slot(&P.startup_params, &P.n_startup_params, sizeof(*v));
	if (!v)
		return -1;
	*v = xstrdup(name);
	return 0;
}

bool plugin_startup_param_ok(const char *name)
{
	for (int i = 0; i < P.n_startup_params; i++)
		if (strcasecmp(P.startup_params[i], name) == 0)
			return true;
	return false;
}

/* ================= affinity ================= */

static void api_client_set_affinity(lk_client *h, const char *key, int max_per_server)
{
	struct client *c = CL(h);
	uint64_t hash = 14695981039346656037ULL;	/* FNV-1a */

	if (!key) {
		c->affinity = 0;
		return;
	}
	for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
		hash ^= *p;
		hash *= 1099511628211ULL;
	}
	c->affinity = hash ? hash : 1;
	c->aff_max = max_per_server;
}

/* ================= the core's own use of the libpq helper ================= */

static struct lk_plugin core_owner = { .name = (char *)"core" };

struct lk_pg *core_pg_connect(const char *conninfo, lk_pg_state_fn fn, void *arg)
{
	return api_pg_connect(&core_owner, conninfo, fn, arg);
}

int core_pg_query(struct lk_pg *pg, const char *sql, int nparams, const char *const *params, lk_pg_result_fn fn,
		  void *arg)
{
	return api_pg_query(pg, sql, nparams, params, fn, arg);
}

void core_pg_close(struct lk_pg *pg)
{
	api_pg_close(pg);
}

struct pg_conn *core_pg_conn(struct lk_pg *pg)
{
	return api_pg_conn(pg);
}

/* ================= DNS (ABI 1.6) ================= */

static void plugin_dns_unlink(struct plugin_dns *q)
{
	for (struct plugin_dns **pp = &P.dns; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			return;
		}
}

static void plugin_dns_cb(void *arg, const struct sockaddr *sa, socklen_t len, const char *error)
{
	struct plugin_dns *q = arg;

	plugin_dns_unlink(q);
	q->fn(q->pl, q->arg, sa, (int)len, sa ? NULL : (error ? error : "no address"));
	free(q);
}

static int api_resolve(lk_plugin *self, const char *host, int port, lk_resolve_fn fn, void *arg)
{
	struct plugin_dns *q;

	if (!self || !host || !*host || !fn || port < 0 || port > 65535 || !rt->dns)
		return -1;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -1;
	q->pl = self;
	q->fn = fn;
	q->arg = arg;
	q->next = P.dns;
	P.dns = q;
	dns_resolve(rt->dns, host, port, plugin_dns_cb, q);	/* may answer at once */
	return 0;
}

static void api_resolve_cancel(lk_plugin *self, void *arg)
{
	struct plugin_dns **pp = &P.dns;

	while (*pp) {
		struct plugin_dns *q = *pp;

		if (q->pl == self && q->arg == arg) {
			*pp = q->next;
			dns_cancel_arg(rt->dns, q);
			free(q);
		} else {
			pp = &q->next;
		}
	}
}

/* ================= teardown ================= */

void plugins_fini(void)
{
	for (int i = rt->n_plugins - 1; i >= 0; i--)
		if (rt->plugins[i]->desc->fini)
			rt->plugins[i]->desc->fini(rt->plugins[i]);
	while (P.dns) {
		struct plugin_dns *q = P.dns;

		P.dns = q->next;
		dns_cancel_arg(rt->dns, q);
		free(q);
	}
	while (!LIST_EMPTY(&P.timers))
		timer_free(LIST_FIRST(&P.timers));
	while (!LIST_EMPTY(&P.pgs))
		api_pg_close(LIST_FIRST(&P.pgs));
	while (P.cancels)
		connect_free(P.cancels);
	for (int h = 0; h < LK_HOOK_COUNT; h++) {
		free(rt->hooks[h].v);
		rt->hooks[h].v = NULL;
		rt->hooks[h].n = 0;
	}
	for (int i = 0; i < P.n_transports; i++)
		free(P.transports[i].name);
	free(P.transports);
	for (int i = 0; i < P.n_services; i++)
		free(P.services[i].name);
	free(P.services);
	for (int i = 0; i < P.n_startup_params; i++)
		free(P.startup_params[i]);
	free(P.startup_params);
	for (int i = 0; i < P.n_cmds; i++) {
		free(P.cmds[i].name);
		free(P.cmds[i].doc);
	}
	free(P.cmds);
	memset(&P, 0, sizeof(P));
	for (int i = 0; i < rt->n_plugins; i++) {
		struct lk_plugin *pl = rt->plugins[i];
		for (int j = 0; j < pl->n_settings; j++) {
			free(pl->settings[j].key);
			free(pl->settings[j].def);
			free(pl->settings[j].doc);
			free(pl->settings[j].value);
			free(pl->settings[j].pending);
		}
		free(pl->settings);
		free(pl->name);
		free(pl->path);
		free(pl->init_err);
		free(pl);	/* the shared object stays loaded: plugins are never unloaded */
	}
	free(rt->plugins);
	rt->plugins = NULL;
	rt->n_plugins = 0;
}

/* ================= the table ================= */

static const struct lk_api api_table = {
	.size = sizeof(struct lk_api),
	.abi_major = LK_ABI_MAJOR,
	.abi_minor = LK_ABI_MINOR,
	.core_version = LOKADB_VERSION,
	.log = api_log,
	.init_error = api_init_error,
	.set_data = api_set_data,
	.get_data = api_get_data,
	.plugin_name = api_plugin_name,
	.hook = api_hook,
	.config_declare = api_config_declare,
	.config_get = api_config_get,
	.config_error = api_config_error,
	.config_reloading = api_config_reloading,
	.setting = api_setting,
	.ev_hook = api_ev_hook,
	.ev_client = api_ev_client,
	.ev_server = api_ev_server,
	.fail = api_fail,
	.client_id = api_client_id,
	.client_user = api_client_user,
	.client_database = api_client_database,
	.client_param = api_client_param,
	.client_addr = api_client_addr,
	.client_set_database = api_client_set_database,
	.client_set_user = api_client_set_user,
	.client_watch_queries = api_client_watch_queries,
	.client_pool_database = api_client_pool_database,
	.client_in_transaction = api_client_in_transaction,
	.client_ctx = api_client_ctx,
	.client_set_ctx = api_client_set_ctx,
	.resume = api_resume,
	.resume_error = api_resume_error,
	.client_close = api_client_close,
	.server_id = api_server_id,
	.server_database = api_server_database,
	.server_user = api_server_user,
	.server_backend_pid = api_server_backend_pid,
	.server_ctx = api_server_ctx,
	.server_set_ctx = api_server_set_ctx,
	.auth_user = api_auth_user,
	.auth_set_secret = api_auth_set_secret,
	.query_type = api_query_type,
	.query_sql = api_query_sql,
	.query_statement = api_query_statement,
	.query_portal = api_query_portal,
	.query_nparams = api_query_nparams,
	.query_param = api_query_param,
	.query_param_type = api_query_param_type,
	.query_rewrite = api_query_rewrite,
	.query_set_param = api_query_set_param,
	.query_prefix = api_query_prefix,
	.query_route = api_query_route,
	.query_result = api_query_result,
	.route_set = api_route_set,
	.result_columns = api_result_columns,
	.result_row = api_result_row,
	.result_notice = api_result_notice,
	.result_complete = api_result_complete,
	.result_error = api_result_error,
	.result_done = api_result_done,
	.console_register = api_console_register,
	.transport_register = api_transport_register,
	.connect_host = api_connect_host,
	.connect_port = api_connect_port,
	.connect_dbname = api_connect_dbname,
	.connect_database = api_connect_database,
	.connect_is_cancel = api_connect_is_cancel,
	.connect_server = api_connect_server,
	.connect_ready = api_connect_ready,
	.connect_failed = api_connect_failed,
	.service_publish = api_service_publish,
	.service_lookup = api_service_lookup,
	.event_base = api_event_base,
	.now_usec = api_now_usec,
	.timer_add = api_timer_add,
	.timer_cancel = api_timer_cancel,
	.pg_connect = api_pg_connect,
	.pg_query = api_pg_query,
	.pg_on_notify = api_pg_on_notify,
	.pg_conn = api_pg_conn,
	.pg_close = api_pg_close,
	.client_set_affinity = api_client_set_affinity,
	.startup_parameter = api_startup_parameter,
	.query_reparse = api_query_reparse,
	.metric_register = metrics_plugin_register,
	.metric_sample = metrics_plugin_sample,
	.query_set_var = api_query_set_var,
	.query_on_vars = api_query_on_vars,
	.resolve = api_resolve,
	.resolve_cancel = api_resolve_cancel,
	.query_vars_inline = api_query_vars_inline,
	.server_retire = api_server_retire,
	.ev_txn_failed = api_ev_txn_failed,
	.query_text_spans = api_query_text_spans,
	.tables_new = api_tables_new,
	.tables_release = api_tables_release,
	.query_result_tables = api_query_result_tables,
	.ev_past_sync = api_ev_past_sync,
	.client_on_answered = api_client_on_answered,
	.query_mark_txn = api_query_mark_txn,
	.ev_marked_txn_failed = api_ev_marked_txn_failed,
	.query_stmt_unsettled = api_query_stmt_unsettled,
	.query_stmt_declared = api_query_stmt_declared,
};
