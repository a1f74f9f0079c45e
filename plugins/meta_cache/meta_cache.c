/* SPDX-License-Identifier: ISC */
/*
 * meta_cache -- the LokaDB catalog of the cloud database, cached in the
 * proxy and published to other plugins as the service "meta_cache.v1"
 * (include/lokadb/meta_cache.h). README.md beside this file has the
 * settings, the console commands and exactly what is guaranteed about
 * freshness; this comment is the map of the code.
 *
 * One connection to the cloud database (api->pg_*, never blocking the
 * loop) carries LISTEN lokadb_meta and every catalog query. The queries
 * form a FIFO of operations (struct mc_op) of which at most one, the head,
 * is out at a time; so the moment an operation is sent is known, and an
 * operation sent after an event sees every commit made before that event:
 *
 *   LISTEN  first on every new connection, before the first LOAD.
 *   LOAD    MC_LOAD_SQL: the whole catalog in one statement (one snapshot).
 *   VERIFY  MC_VERIFY_SQL: the version only; a different one queues a LOAD.
 *
 * Sequence numbers say what a loaded catalog covers. Every announcement
 * of a change not yet loaded (a NOTIFY whose version is not in the
 * catalog, a VERIFY that found another version, META_CACHE RELOAD) bumps
 * notify_seq; a LOAD records notify_seq when it is sent (covers_seq) and
 * sets loaded_seq to it when its catalog is installed. "A reload is due"
 * is notify_seq > loaded_seq; a burst of notifications during a load
 * queues exactly one more LOAD, and none if the version the load returned
 * already covers them.
 *
 * Who waits, and for what (struct mc_waiter):
 *   - a login (CLIENT_STARTUP, LK_ASYNC) whose last verification is older
 *     than `verify`: on a LOAD or VERIFY not sent yet, or in flight and
 *     sent within `verify`; concurrent logins share it. A VERIFY that
 *     finds another version hands its waiters on to the LOAD it queues.
 *   - a statement of another plugin (service wait()): until loaded_seq
 *     reaches the notify_seq of the moment it asked (list seq_waiters).
 *   - META_CACHE RELOAD (console, LK_ASYNC) and service refresh(): likewise.
 * Every waiter is released exactly once: when satisfied, or when the
 * cloud database fails (connection lost, no answer within `timeout`, an
 * error), because nobody may wait for an unreachable database: the last
 * good catalog is then served and marked stale, logins pass at once, one
 * log line says so, and a new attempt is made every `retry` seconds.
 *
 * Invariants:
 *   - at most one operation is sent (the head of the FIFO), and
 *     op_timer runs exactly while it is;
 *   - a catalog (struct mc_cat) is immutable; a reload replaces it whole;
 *   - lists of waiters are detached before they are released: releasing
 *     resumes clients, and the core may call back into this plugin (a
 *     CLIENT_CLOSE, another plugin's wait()) from inside resume().
 * Do not run a catalog query on another connection: the ordering above is
 * what makes "sent after" mean "sees".
 */
#include "mc.h"

#include <lokadb/plugin.h>

#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MC_CHANNEL "lokadb_meta"
#define MC_ERRLEN 256
#define MC_USEC 1000000ull
#define MC_MAX_DURATION (86400ull * MC_USEC)	/* settings are at most one day */
#define MC_STARTUP_PRIORITY (-100)		/* before other plugins read the catalog at login */

static const lk_api *api;

enum mc_conn { MC_DOWN, MC_CONNECTING, MC_UP };
enum mc_op_kind { MC_OP_LISTEN, MC_OP_LOAD, MC_OP_VERIFY };
enum mc_wkind { MC_W_LOGIN, MC_W_FN, MC_W_RELOAD };

struct mc_list;

/* Someone waiting for the catalog: a held login, a service caller, a console command. */
struct mc_waiter {
	struct mc_waiter *prev, *next;
	struct mc_list *list;		/* the list it is on, NULL when on none */
	enum mc_wkind kind;
	lk_client *c;			/* MC_W_LOGIN */
	mc_change_fn fn;		/* MC_W_FN */
	void *arg;
	lk_result *res;			/* MC_W_RELOAD */
	uint64_t need_seq;		/* on seq_waiters: released when loaded_seq >= need_seq */
};

struct mc_list {
	struct mc_waiter *head, *tail;
};

/* One catalog query, queued or (at the head of the FIFO) sent. */
struct mc_op {
	struct mc_op *next;
	enum mc_op_kind kind;
	int forced;			/* LOAD: run even when no change is known */
	int sent;
	uint64_t sent_at;		/* api->now_usec() when sent */
	uint64_t covers_seq;		/* LOAD: notify_seq when sent */
	struct mc_list waiters;		/* logins and refresh() callers waiting for this check */
};

struct mc_sub {
	mc_change_fn fn;
	void *arg;
};

/* The plugin's state (api->set_data). */
struct mc {
	lk_plugin *self;
	lk_tables *rtables;		/* the partitions as their tables (svc_result_tables), built at first use */

	/* [plugin.meta_cache], applied */
	char *cloud;
	uint64_t verify_us, retry_us, timeout_us, heartbeat_us;

	/* the connection */
	lk_pg *pg;
	enum mc_conn conn;
	int stale;			/* the cloud database failed; the last good catalog is served */
	int failing;			/* the failure was logged; the recovery will be */
	lk_timer *connect_timer, *op_timer, *retry_timer, *heartbeat_timer;

	/* the FIFO of catalog queries; the head is out when head->sent */
	struct mc_op *head, *tail;

	/* the catalog and what it covers */
	struct mc_cat *cat;		/* NULL until the first load */
	uint64_t notify_seq, loaded_seq;
	uint64_t covered_lo, covered_hi;	/* NOTIFY payloads v with lo < v <= hi are loaded */
	int flight_seen, flight_nonnum;	/* notifications that came while a LOAD was out */
	uint64_t flight_min, flight_max;
	uint64_t verified_at;		/* now_usec() the catalog was last known current; 0 never */

	struct mc_list seq_waiters;
	struct mc_sub *subs;
	size_t n_subs;

	/* SHOW META_CACHE */
	struct timespec last_load, last_verify;	/* wall clock; tv_sec 0 = never */
	char last_error[MC_ERRLEN];
	uint64_t loads, verifications, notifications, waiting;
};

/* The service functions take no context argument: they reach the state through this. */
static struct mc *mc_state;

static void mc_kick(struct mc *st);
static void mc_connect(struct mc *st);

/* ========================================================== utilities == */

/* "1s", "500ms", "250us", "2min", "1h", "1.5" (seconds): 0, or -1 if invalid. */
static int parse_duration(const char *s, uint64_t *usec)
{
	static const struct {
		const char *unit;
		double mult;
	} units[] = { { "", 1e6 }, { "s", 1e6 }, { "sec", 1e6 }, { "ms", 1e3 }, { "us", 1 },
		      { "min", 60e6 }, { "h", 3600e6 } };
	char *end;
	double v;
	size_t i, n;

	if (s == NULL)
		return -1;
	while (*s == ' ' || *s == '\t')
		s++;
	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno != 0 || !(v >= 0) || (*s < '0' || *s > '9'))
		return -1;
	while (*end == ' ' || *end == '\t')
		end++;
	n = strlen(end);
	while (n > 0 && (end[n - 1] == ' ' || end[n - 1] == '\t'))
		n--;
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strlen(units[i].unit) == n && strncmp(end, units[i].unit, n) == 0) {
			double us = v * units[i].mult;

			if (us > (double)MC_MAX_DURATION)
				return -1;
			*usec = (uint64_t)(us + 0.5);
			return 0;
		}
	}
	return -1;
}

static double secs(uint64_t usec)
{
	return (double)usec / (double)MC_USEC;
}

static void wall_now(struct timespec *ts)
{
	clock_gettime(CLOCK_REALTIME, ts);
}

/* "2025-11-30 04:52:01.123 UTC", or NULL for never. */
static const char *wall_text(const struct timespec *ts, char *buf, size_t len)
{
	struct tm tm;
	char tmp[24];

	if (ts->tv_sec == 0 || gmtime_r(&ts->tv_sec, &tm) == NULL)
		return NULL;
	strftime(tmp, sizeof(tmp), "%Y-%m-%d %H:%M:%S", &tm);
	snprintf(buf, len, "%.19s.%03d UTC", tmp, (int)(ts->tv_nsec / 1000000L) % 1000);
	return buf;
}

static int is_console_db(const char *db)
{
	return db != NULL && (strcmp(db, "lokadb") == 0 || strcmp(db, "pgbouncer") == 0);
}

static void set_timer(struct mc *st, lk_timer **slot, uint64_t usec, lk_timer_fn fn)
{
	if (*slot != NULL)
		api->timer_cancel(*slot);
	*slot = api->timer_add(st->self, usec, 0, fn, st);
}

static void cancel_timer(lk_timer **slot)
{
	if (*slot != NULL)
		api->timer_cancel(*slot);
	*slot = NULL;
}

/* ============================================================ waiters == */

static void list_push(struct mc_list *l, struct mc_waiter *w)
{
	w->list = l;
	w->next = NULL;
	w->prev = l->tail;
	if (l->tail != NULL)
		l->tail->next = w;
	else
		l->head = w;
	l->tail = w;
}

static void list_unlink(struct mc_waiter *w)
{
	struct mc_list *l = w->list;

	if (l == NULL)
		return;
	if (w->prev != NULL)
		w->prev->next = w->next;
	else
		l->head = w->next;
	if (w->next != NULL)
		w->next->prev = w->prev;
	else
		l->tail = w->prev;
	w->prev = w->next = NULL;
	w->list = NULL;
}

static struct mc_waiter *list_pop(struct mc_list *l)
{
	struct mc_waiter *w = l->head;

	if (w != NULL)
		list_unlink(w);
	return w;
}

/* Move every waiter of src to the end of dst. */
static void list_take(struct mc_list *dst, struct mc_list *src)
{
	struct mc_waiter *w;

	while ((w = list_pop(src)) != NULL)
		list_push(dst, w);
}

static struct mc_waiter *waiter_new(struct mc *st, enum mc_wkind kind)
{
	struct mc_waiter *w = calloc(1, sizeof(*w));

	if (w == NULL)
		return NULL;
	w->kind = kind;
	st->waiting++;
	return w;
}

static void waiter_free(struct mc *st, struct mc_waiter *w)
{
	list_unlink(w);
	st->waiting--;
	free(w);
}

/* META_CACHE RELOAD's answer. */
static void reload_answer(struct mc *st, lk_result *res, int ok)
{
	static const char *const names[] = { "version", "tables", "orgs", "partitions" };
	static const uint32_t types[] = { LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8 };
	char b[4][24];
	const char *row[4] = { b[0], b[1], b[2], b[3] };

	if (!ok || st->cat == NULL) {
		api->result_error(res, st->conn == MC_DOWN ? "08006" : "55000",
				  "the catalog could not be reloaded: %s",
				  st->last_error[0] ? st->last_error : "no catalog loaded");
	} else {
		snprintf(b[0], sizeof(b[0]), "%" PRIu64, st->cat->id.version);
		snprintf(b[1], sizeof(b[1]), "%zu", st->cat->n_tables);
		snprintf(b[2], sizeof(b[2]), "%zu", st->cat->n_orgs);
		snprintf(b[3], sizeof(b[3]), "%zu", st->cat->n_parts);
		api->result_columns(res, 4, names, types);
		api->result_row(res, row);
		api->result_complete(res, "META_CACHE RELOAD");
	}
	api->result_done(res);
}

/* Release one waiter (already off every list): resume, call back or answer. */
static void waiter_finish(struct mc *st, struct mc_waiter *w, int ok)
{
	lk_client *c = w->c;
	mc_change_fn fn = w->fn;
	void *arg = w->arg;
	lk_result *res = w->res;
	enum mc_wkind kind = w->kind;

	waiter_free(st, w);
	switch (kind) {
	case MC_W_LOGIN:
		api->client_set_ctx(st->self, c, NULL);
		api->resume(c, LK_CONTINUE);	/* a stale catalog never keeps anyone out */
		break;
	case MC_W_FN:
		fn(arg, st->cat != NULL ? st->cat->id.version : 0);
		break;
	case MC_W_RELOAD:
		reload_answer(st, res, ok);
		break;
	}
}

/* Release every waiter of l. The list is detached first: see the invariants above. */
static void release_list(struct mc *st, struct mc_list *l, int ok)
{
	struct mc_list tmp = { NULL, NULL };
	struct mc_waiter *w;

	list_take(&tmp, l);
	while ((w = list_pop(&tmp)) != NULL)
		waiter_finish(st, w, ok);
}

/* Release the seq_waiters whose change is loaded now. */
static void release_loaded(struct mc *st)
{
	struct mc_list tmp = { NULL, NULL };
	struct mc_waiter *w, *next;

	for (w = st->seq_waiters.head; w != NULL; w = next) {
		next = w->next;
		if (w->need_seq <= st->loaded_seq) {
			list_unlink(w);
			list_push(&tmp, w);
		}
	}
	release_list(st, &tmp, 1);
}

/* ================================================================ ops == */

static struct mc_op *op_push(struct mc *st, enum mc_op_kind kind)
{
	struct mc_op *op = calloc(1, sizeof(*op));

	if (op == NULL)
		return NULL;
	op->kind = kind;
	if (st->tail != NULL)
		st->tail->next = op;
	else
		st->head = op;
	st->tail = op;
	return op;
}

static struct mc_op *op_pop(struct mc *st)
{
	struct mc_op *op = st->head;

	if (op != NULL) {
		st->head = op->next;
		if (st->head == NULL)
			st->tail = NULL;
		op->next = NULL;
	}
	return op;
}

/* A LOAD that will be sent from now on: the one queued and not sent yet, or a new one. */
static struct mc_op *want_load(struct mc *st)
{
	struct mc_op *op;

	for (op = st->head; op != NULL; op = op->next)
		if (op->kind == MC_OP_LOAD && !op->sent)
			return op;
	return op_push(st, MC_OP_LOAD);
}

/* A check a login arriving now may share: a LOAD or VERIFY not sent yet, or
 * one out that was sent less than `verify` ago. NULL if there is none. */
static struct mc_op *joinable(struct mc *st, uint64_t now)
{
	struct mc_op *op;

	for (op = st->head; op != NULL; op = op->next) {
		if (op->kind == MC_OP_LISTEN)
			continue;
		if (!op->sent || (st->verify_us > 0 && now - op->sent_at < st->verify_us))
			return op;
	}
	return NULL;
}

/* Drop every operation; their waiters go to dst. */
static void drop_ops(struct mc *st, struct mc_list *dst)
{
	struct mc_op *op;

	while ((op = op_pop(st)) != NULL) {
		list_take(dst, &op->waiters);
		free(op);
	}
}

/* ======================================================== failures == */

/* Keep err as last_error, on one line (libpq's messages have newlines and tabs). */
static void set_error(struct mc *st, const char *err)
{
	char *p, *q;

	snprintf(st->last_error, sizeof(st->last_error), "%s", err != NULL && *err ? err : "unknown error");
	for (p = q = st->last_error; *p != '\0'; p++) {
		char ch = (*p == '\n' || *p == '\t' || *p == '\r') ? ' ' : *p;

		if (ch != ' ' || (q > st->last_error && q[-1] != ' '))
			*q++ = ch;
	}
	while (q > st->last_error && q[-1] == ' ')
		q--;
	*q = '\0';
}

/* Remember the error; log it only if it starts a failure (one line, not one per login or retry). */
static void note_failure(struct mc *st, const char *err)
{
	set_error(st, err);
	st->stale = 1;
	if (st->failing) {
		api->log(st->self, LK_LOG_DEBUG, "cloud database still failing: %s", st->last_error);
		return;
	}
	st->failing = 1;
	if (st->cat != NULL)
		api->log(st->self, LK_LOG_WARNING,
			 "cloud database unavailable: %s; serving the last catalog (version %" PRIu64
			 ") as stale, retrying every %gs", st->last_error, st->cat->id.version,
			 secs(st->retry_us));
	else
		api->log(st->self, LK_LOG_WARNING,
			 "cloud database unavailable: %s; no catalog loaded yet, retrying every %gs",
			 st->last_error, secs(st->retry_us));
}

static void on_retry(lk_plugin *self, void *arg);

/*
 * The connection is gone (broken, no answer within `timeout`, LISTEN
 * refused): close it, mark the catalog stale, release everyone, retry
 * in `retry` seconds. May be called from inside any callback.
 */
static void mc_down(struct mc *st, const char *err)
{
	struct mc_list tmp = { NULL, NULL };

	if (st->pg != NULL)
		api->pg_close(st->pg);
	st->pg = NULL;
	st->conn = MC_DOWN;
	cancel_timer(&st->connect_timer);
	cancel_timer(&st->op_timer);
	note_failure(st, err);
	drop_ops(st, &tmp);
	list_take(&tmp, &st->seq_waiters);
	set_timer(st, &st->retry_timer, st->retry_us, on_retry);
	release_list(st, &tmp, 0);
}

/* A catalog query failed on a working connection: keep the catalog, stale, load again later. */
static void mc_soft_fail(struct mc *st, const char *err)
{
	note_failure(st, err);
	if (st->retry_timer == NULL)
		set_timer(st, &st->retry_timer, st->retry_us, on_retry);
	release_list(st, &st->seq_waiters, 0);
}

static void on_retry(lk_plugin *self, void *arg)
{
	struct mc *st = arg;
	struct mc_op *op;

	(void)self;
	st->retry_timer = NULL;
	if (st->conn == MC_DOWN) {
		mc_connect(st);
		return;
	}
	if (!st->stale)
		return;
	st->notify_seq++;
	op = want_load(st);
	if (op != NULL)
		op->forced = 1;
	mc_kick(st);
}

/* A failed result's text: "SQLSTATE: message". */
static void result_error_text(const PGresult *r, char *buf, size_t len)
{
	const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
	const char *msg = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

	snprintf(buf, len, "%s: %s", code != NULL ? code : "?????",
		 msg != NULL ? msg : PQresStatus(PQresultStatus(r)));
}

/* Did the query fail because the catalog is not installed (no schema lokadb, or a table of it missing)? */
static int not_installed(const PGresult *r)
{
	const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);

	return PQresultStatus(r) == PGRES_FATAL_ERROR && code != NULL &&
	       (strcmp(code, "42P01") == 0 || strcmp(code, "3F000") == 0);
}

/* ========================================================= catalog == */

static int ident_eq(const struct mc_ident *a, const struct mc_ident *b)
{
	if (a->installed != b->installed)
		return 0;
	return !a->installed || (a->version == b->version && a->meta_oid == b->meta_oid && a->guards == b->guards &&
				 a->readers == b->readers);
}

/* Replace the catalog with the one `op` loaded, and account for what it covers. */
static void install_catalog(struct mc *st, struct mc_cat *cat, const struct mc_op *op)
{
	int same_id = st->cat != NULL && ident_eq(&st->cat->id, &cat->id);
	int changed = !same_id || st->cat->fingerprint != cat->fingerprint;
	uint64_t lo = 0;

	if (st->cat != NULL && st->cat->id.installed && cat->id.installed &&
	    st->cat->id.meta_oid == cat->id.meta_oid && st->cat->id.version <= cat->id.version)
		lo = same_id ? st->covered_lo : st->cat->id.version;
	mc_cat_free(st->cat);
	st->cat = cat;
	if (st->rtables) {	/* of the catalog before */
		api->tables_release(st->rtables);
		st->rtables = NULL;
	}
	st->covered_lo = lo;
	st->covered_hi = cat->id.version;
	st->loaded_seq = op->covers_seq;
	if (st->flight_seen && !st->flight_nonnum && st->flight_min > lo && st->flight_max <= cat->id.version)
		st->loaded_seq = st->notify_seq;	/* what came during the load is in it */
	st->flight_seen = 0;
	st->verified_at = op->sent_at;
	st->loads++;
	wall_now(&st->last_load);
	st->last_verify = st->last_load;
	if (st->stale || st->failing)
		api->log(st->self, LK_LOG_INFO, "cloud database available again: catalog version %" PRIu64
			 " loaded", cat->id.version);
	st->stale = 0;
	st->failing = 0;
	st->last_error[0] = '\0';
	cancel_timer(&st->retry_timer);
	if (changed) {
		api->log(st->self, LK_LOG_DEBUG, "catalog version %" PRIu64 " loaded: %zu tables, %zu "
			 "organizations, %zu partitions", cat->id.version, cat->n_tables, cat->n_orgs,
			 cat->n_parts);
		for (size_t i = 0; i < st->n_subs; i++)
			st->subs[i].fn(st->subs[i].arg, cat->id.version);
	}
}

static void load_done(struct mc *st, struct mc_op *op, const PGresult *r)
{
	struct mc_list tmp = { NULL, NULL };
	struct mc_cat *cat = NULL;
	char err[MC_ERRLEN - 32];

	list_take(&tmp, &op->waiters);
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		cat = mc_cat_build(r, err, sizeof(err));
	} else if (not_installed(r)) {
		cat = mc_cat_empty();
		snprintf(err, sizeof(err), "out of memory");
	} else {
		result_error_text(r, err, sizeof(err));
	}
	if (cat == NULL) {
		char msg[MC_ERRLEN];

		snprintf(msg, sizeof(msg), "catalog query failed: %s", err);
		mc_soft_fail(st, msg);
		free(op);
		release_list(st, &tmp, 0);
		return;
	}
	install_catalog(st, cat, op);
	free(op);
	if (st->notify_seq > st->loaded_seq)
		want_load(st);
	release_list(st, &tmp, 1);
	release_loaded(st);
}

static void verify_done(struct mc *st, struct mc_op *op, const PGresult *r)
{
	struct mc_list tmp = { NULL, NULL };
	struct mc_ident id = { 0, 0, 0, 0, 0 };
	struct mc_op *load;
	char err[MC_ERRLEN];

	list_take(&tmp, &op->waiters);
	st->verifications++;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) == 4) {
		if (mc_ident_parse(PQgetisnull(r, 0, 0) ? NULL : PQgetvalue(r, 0, 0),
				   PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3), &id) != 0) {
			snprintf(err, sizeof(err), "lokadb.meta version \"%s\" is not a number",
				 PQgetvalue(r, 0, 0));
			goto fail;
		}
	} else if (!not_installed(r)) {
		char e[MC_ERRLEN - 32];

		result_error_text(r, e, sizeof(e));
		snprintf(err, sizeof(err), "version check failed: %s", e);
		goto fail;
	}
	if (st->cat != NULL && ident_eq(&id, &st->cat->id)) {
		st->verified_at = op->sent_at;
		wall_now(&st->last_verify);
		free(op);
		release_list(st, &tmp, 1);
		return;
	}
	st->notify_seq++;	/* another version: the catalog must be loaded again */
	load = want_load(st);
	if (load != NULL) {
		free(op);
		list_take(&load->waiters, &tmp);
		return;
	}
	snprintf(err, sizeof(err), "out of memory");
fail:
	free(op);
	mc_soft_fail(st, err);
	release_list(st, &tmp, 0);
}

/* ====================================================== connection == */

static void on_op_timeout(lk_plugin *self, void *arg)
{
	struct mc *st = arg;
	char err[96];

	(void)self;
	st->op_timer = NULL;
	snprintf(err, sizeof(err), "no answer from the cloud database within %gs", secs(st->timeout_us));
	mc_down(st, err);
}

static void on_connect_timeout(lk_plugin *self, void *arg)
{
	struct mc *st = arg;
	char err[96];

	(void)self;
	st->connect_timer = NULL;
	snprintf(err, sizeof(err), "could not connect to the cloud database within %gs",
		 secs(st->timeout_us));
	mc_down(st, err);
}

static void on_result(lk_plugin *self, lk_pg *pg, struct pg_result *res, void *arg)
{
	struct mc *st = api->get_data(self);
	struct mc_op *op = arg;
	const PGresult *r = (const PGresult *)res;

	if (r == NULL || pg != st->pg || op != st->head)
		return;		/* the connection broke: on_state() follows */
	cancel_timer(&st->op_timer);
	op_pop(st);
	switch (op->kind) {
	case MC_OP_LISTEN:
		free(op);
		if (PQresultStatus(r) != PGRES_COMMAND_OK) {
			char e[MC_ERRLEN - 40], err[MC_ERRLEN];

			result_error_text(r, e, sizeof(e));
			snprintf(err, sizeof(err), "LISTEN " MC_CHANNEL " failed: %s", e);
			mc_down(st, err);
			return;
		}
		break;
	case MC_OP_LOAD:
		load_done(st, op, r);
		break;
	case MC_OP_VERIFY:
		verify_done(st, op, r);
		break;
	}
	mc_kick(st);
}

/* Send the head of the FIFO if nothing is out. */
static void mc_kick(struct mc *st)
{
	struct mc_op *op;
	const char *sql;

	while (st->conn == MC_UP && (op = st->head) != NULL && !op->sent) {
		if (op->kind == MC_OP_LOAD && !op->forced && st->notify_seq <= st->loaded_seq) {
			if (op->waiters.head == NULL) {
				free(op_pop(st));	/* covered by the load before it */
				continue;
			}
			op->kind = MC_OP_VERIFY;	/* its logins still want a check */
		}
		/* (JIT off: the load's estimates grow with the partitions, and compiling
		 * it cost 1 s at 5,000 of them where running it costs 0.1) */
		sql = op->kind == MC_OP_LISTEN ? "SET jit = off; LISTEN " MC_CHANNEL
		      : op->kind == MC_OP_LOAD ? MC_LOAD_SQL : MC_VERIFY_SQL;
		if (api->pg_query(st->pg, sql, 0, NULL, on_result, op) != 0) {
			mc_down(st, "could not send a query to the cloud database");
			return;
		}
		op->sent = 1;
		op->sent_at = api->now_usec();
		if (op->kind == MC_OP_LOAD) {
			op->covers_seq = st->notify_seq;
			st->flight_seen = 0;
		}
		set_timer(st, &st->op_timer, st->timeout_us, on_op_timeout);
		return;
	}
}

static void on_notify(lk_plugin *self, lk_pg *pg, const char *channel, const char *payload, void *arg)
{
	struct mc *st = arg;
	char *end;
	unsigned long long v;
	int numeric;

	(void)self;
	if (pg != st->pg || strcmp(channel, MC_CHANNEL) != 0)
		return;
	st->notifications++;
	errno = 0;
	v = strtoull(payload != NULL ? payload : "", &end, 10);
	numeric = payload != NULL && *payload != '\0' && *end == '\0' && errno == 0;
	if (numeric && st->cat != NULL && v > st->covered_lo && v <= st->covered_hi)
		return;		/* that version is loaded already */
	if (st->head != NULL && st->head->sent && st->head->kind == MC_OP_LOAD) {
		if (!st->flight_seen || v < st->flight_min)
			st->flight_min = v;
		if (!st->flight_seen || v > st->flight_max)
			st->flight_max = v;
		st->flight_nonnum |= !numeric;
		st->flight_seen = 1;
	}
	st->notify_seq++;
	want_load(st);
	mc_kick(st);
}

static void on_state(lk_plugin *self, lk_pg *pg, int ok, const char *err, void *arg)
{
	struct mc *st = arg;

	(void)self;
	if (pg != st->pg)
		return;
	if (!ok) {
		mc_down(st, err != NULL ? err : "the connection to the cloud database failed");
		return;
	}
	cancel_timer(&st->connect_timer);
	st->conn = MC_UP;
	api->pg_on_notify(pg, on_notify, st);
	mc_kick(st);
}

/* The cloud session's notices and its FATAL on shutdown: to the log, not to stderr. */
static void on_pg_notice(void *arg, const char *msg)
{
	struct mc *st = arg;
	char line[MC_ERRLEN];
	size_t n;

	snprintf(line, sizeof(line), "%s", msg);
	n = strlen(line);
	while (n > 0 && line[n - 1] == '\n')
		line[--n] = '\0';
	api->log(st->self, LK_LOG_DEBUG, "cloud database: %s", line);
}

/* Open the connection; LISTEN and a full LOAD go first. */
static void mc_connect(struct mc *st)
{
	struct mc_op *listen_op, *load_op;
	struct mc_list tmp = { NULL, NULL };

	drop_ops(st, &tmp);	/* nothing is queued while down; keep it that way */
	release_list(st, &tmp, 0);
	st->pg = api->pg_connect(st->self, st->cloud, on_state, st);
	if (st->pg == NULL) {
		mc_down(st, "could not start a connection to the cloud database");
		return;
	}
	if (api->pg_conn(st->pg) != NULL)
		PQsetNoticeProcessor(api->pg_conn(st->pg), on_pg_notice, st);
	st->conn = MC_CONNECTING;
	set_timer(st, &st->connect_timer, st->timeout_us, on_connect_timeout);
	st->notify_seq++;	/* changes may have been missed while not listening */
	listen_op = op_push(st, MC_OP_LISTEN);
	load_op = op_push(st, MC_OP_LOAD);
	if (listen_op == NULL || load_op == NULL) {
		mc_down(st, "out of memory");
		return;
	}
	load_op->forced = 1;
}

/* `cloud` changed (or RELOAD at start): drop the connection and everything waiting on it. */
static void mc_reset(struct mc *st)
{
	struct mc_list tmp = { NULL, NULL };

	if (st->pg != NULL)
		api->pg_close(st->pg);
	st->pg = NULL;
	st->conn = MC_DOWN;
	cancel_timer(&st->connect_timer);
	cancel_timer(&st->op_timer);
	cancel_timer(&st->retry_timer);
	st->stale = 0;
	st->failing = 0;
	st->verified_at = 0;
	drop_ops(st, &tmp);
	list_take(&tmp, &st->seq_waiters);
	release_list(st, &tmp, 0);
	mc_connect(st);
}

static void on_heartbeat(lk_plugin *self, void *arg)
{
	struct mc *st = arg;

	(void)self;
	if (st->conn != MC_UP || st->head != NULL || st->stale)
		return;
	if (st->verified_at != 0 && api->now_usec() - st->verified_at < st->heartbeat_us)
		return;
	if (op_push(st, MC_OP_VERIFY) != NULL)
		mc_kick(st);
}

/* ========================================================== settings == */

static const struct {
	const char *key, *def, *doc;
} mc_settings[] = {
	{ "cloud", NULL, "libpq conninfo of the cloud database holding the catalog (required)" },
	{ "verify", "1s", "a new connection checks the catalog version unless checked this recently (0 = always)" },
	{ "retry", "2s", "seconds between attempts while the cloud database is unavailable" },
	{ "timeout", "5s", "bound on connecting and on each catalog query; logins are held at most this long" },
	{ "heartbeat", "10s", "check the version after this much quiet, to find a dead connection (0 = never)" },
};

static int check_duration(lk_event *ev, const char *key, int zero_ok)
{
	const char *v = api->config_get(ev, key);
	uint64_t us;

	if (parse_duration(v, &us) != 0)
		return api->config_error(ev, key, "must be a duration such as 1s, 500ms or 2 (seconds), "
					 "at most one day, not \"%s\"", v != NULL ? v : "");
	if (!zero_ok && us == 0)
		return api->config_error(ev, key, "must be more than 0");
	return LK_CONTINUE;
}

static int on_config_check(lk_plugin *self, lk_event *ev)
{
	const char *cloud = api->config_get(ev, "cloud");
	char *err = NULL;
	PQconninfoOption *opts;

	(void)self;
	if (cloud == NULL || *cloud == '\0')
		return api->config_error(ev, "cloud", "must be set: the conninfo of the cloud database "
					 "(e.g. host=10.0.0.5 dbname=app user=lokadb)");
	opts = PQconninfoParse(cloud, &err);
	if (opts == NULL) {
		int rc = api->config_error(ev, "cloud", "is not a valid conninfo: %s",
					   err != NULL ? err : "out of memory");

		PQfreemem(err);
		return rc;
	}
	PQconninfoFree(opts);
	if (check_duration(ev, "verify", 1) == LK_ERROR || check_duration(ev, "retry", 0) == LK_ERROR ||
	    check_duration(ev, "timeout", 0) == LK_ERROR || check_duration(ev, "heartbeat", 1) == LK_ERROR)
		return LK_ERROR;
	return LK_CONTINUE;
}

static uint64_t duration_of(lk_event *ev, const char *key)
{
	uint64_t us = 0;

	parse_duration(api->config_get(ev, key), &us);	/* checked in CONFIG_CHECK */
	return us;
}

static int on_config_apply(lk_plugin *self, lk_event *ev)
{
	struct mc *st = api->get_data(self);
	const char *cloud = api->config_get(ev, "cloud");
	uint64_t heartbeat = duration_of(ev, "heartbeat");
	int cloud_changed = st->cloud == NULL || strcmp(st->cloud, cloud) != 0;

	st->verify_us = duration_of(ev, "verify");
	st->retry_us = duration_of(ev, "retry");
	st->timeout_us = duration_of(ev, "timeout");
	if (heartbeat != st->heartbeat_us || st->heartbeat_timer == NULL) {
		if (st->heartbeat_timer != NULL)
			api->timer_cancel(st->heartbeat_timer);
		st->heartbeat_timer = heartbeat > 0 ? api->timer_add(self, heartbeat, 1, on_heartbeat, st)
						    : NULL;
	}
	st->heartbeat_us = heartbeat;
	if (cloud_changed) {
		char *copy = strdup(cloud);

		if (copy == NULL) {
			api->log(self, LK_LOG_ERROR, "out of memory: keeping the previous cloud setting");
			return LK_CONTINUE;
		}
		free(st->cloud);
		st->cloud = copy;
		if (api->config_reloading(ev))
			api->log(self, LK_LOG_INFO, "cloud changed: reconnecting and loading the catalog");
		mc_reset(st);
	}
	return LK_CONTINUE;
}

/* ============================================================ hooks == */

/*
 * A new client: hold its login (LK_ASYNC) until the catalog is known to be
 * current, unless it was checked less than `verify` ago or the cloud
 * database is unavailable (then nobody waits).
 */
static int on_client_startup(lk_plugin *self, lk_event *ev)
{
	struct mc *st = api->get_data(self);
	lk_client *c = api->ev_client(ev);
	uint64_t now = api->now_usec();
	struct mc_waiter *w;
	struct mc_op *op;

	if (is_console_db(api->client_database(c)) || st->cloud == NULL || st->stale ||
	    st->conn == MC_DOWN)
		return LK_CONTINUE;
	if (st->verified_at != 0 && now - st->verified_at < st->verify_us)
		return LK_CONTINUE;
	op = joinable(st, now);
	if (op == NULL)
		op = op_push(st, MC_OP_VERIFY);
	w = waiter_new(st, MC_W_LOGIN);
	if (op == NULL || w == NULL) {
		free(w);
		return LK_CONTINUE;	/* out of memory: do not keep the client out for it */
	}
	w->c = c;
	list_push(&op->waiters, w);
	api->client_set_ctx(self, c, w);
	mc_kick(st);
	return LK_ASYNC;
}

static int on_client_close(lk_plugin *self, lk_event *ev)
{
	struct mc *st = api->get_data(self);
	lk_client *c = api->ev_client(ev);
	struct mc_waiter *w = api->client_ctx(self, c);

	if (w != NULL) {
		waiter_free(st, w);
		api->client_set_ctx(self, c, NULL);
	}
	return LK_CONTINUE;
}

/* ========================================================== service == */

static int svc_ready(void)
{
	return mc_state != NULL && mc_state->cat != NULL;
}

static int svc_stale(void)
{
	return mc_state != NULL && mc_state->stale;
}

static uint64_t svc_version(void)
{
	return svc_ready() ? mc_state->cat->id.version : 0;
}

static const struct mc_table *svc_table(const char *schema, const char *name)
{
	return mc_state != NULL ? mc_cat_table(mc_state->cat, schema, name) : NULL;
}

static const struct mc_table *svc_table_search(const char *name, const char *search_path, const char *user)
{
	return mc_state != NULL ? mc_cat_search(mc_state->cat, name, search_path, user) : NULL;
}

static const struct mc_org *svc_org(const char *id)
{
	return mc_state != NULL ? mc_cat_org(mc_state->cat, id) : NULL;
}

static const char *svc_leaf(const char *schema, const char *name, const char *org_id)
{
	return mc_state != NULL ? mc_cat_leaf(mc_state->cat, schema, name, org_id) : NULL;
}

static int svc_n_tables(void)
{
	return svc_ready() ? (int)mc_state->cat->n_tables : 0;
}

static const char *svc_table_guard(const struct mc_table *t)
{
	return t ? t->guard : NULL;
}

static int svc_n_partitions(void)
{
	return svc_ready() ? (int)mc_state->cat->n_parts : 0;
}

static int svc_setting_readers(void)
{
	return svc_ready() ? mc_state->cat->id.readers : 1;
}

/* Every isolated organization's leaf as its LokaDB table, for the core (ABI 1.13), or NULL. */
static lk_tables *svc_result_tables(void)
{
	struct mc *st = mc_state;
	lk_table_oid *v;
	int n = 0;

	if (!svc_ready() || !LK_API_HAS(api, tables_new))
		return NULL;
	if (st->rtables || st->cat->n_rels == 0)
		return st->rtables;
	if (!(v = malloc(sizeof(*v) * st->cat->n_rels)))
		return NULL;
	for (size_t i = 0; i < st->cat->n_rels; i++) {
		const struct mc_rel *r = &st->cat->rels[i];
		v[n++] = (lk_table_oid){ r->oid, r->table_oid, r->attnums };
	}
	st->rtables = api->tables_new(v, n);
	free(v);
	return st->rtables;
}

static int svc_on_change(mc_change_fn fn, void *arg)
{
	struct mc_sub *subs;

	if (mc_state == NULL || fn == NULL)
		return -1;
	subs = realloc(mc_state->subs, (mc_state->n_subs + 1) * sizeof(*subs));
	if (subs == NULL)
		return -1;
	subs[mc_state->n_subs++] = (struct mc_sub){ fn, arg };
	mc_state->subs = subs;
	return 0;
}

static int svc_reloading(void)
{
	struct mc *st = mc_state;

	return st != NULL && st->conn != MC_DOWN && !st->stale && st->notify_seq > st->loaded_seq;
}

static int svc_wait(mc_change_fn fn, void *arg)
{
	struct mc_waiter *w;

	if (!svc_reloading())
		return 1;
	if (fn == NULL || (w = waiter_new(mc_state, MC_W_FN)) == NULL)
		return -1;
	w->fn = fn;
	w->arg = arg;
	w->need_seq = mc_state->notify_seq;
	list_push(&mc_state->seq_waiters, w);
	return 0;
}

static void cancel_in(struct mc_list *l, mc_change_fn fn, void *arg)
{
	struct mc_waiter *w, *next;

	for (w = l->head; w != NULL; w = next) {
		next = w->next;
		if (w->kind == MC_W_FN && w->fn == fn && w->arg == arg)
			waiter_free(mc_state, w);
	}
}

static void svc_wait_cancel(mc_change_fn fn, void *arg)
{
	if (mc_state == NULL)
		return;
	cancel_in(&mc_state->seq_waiters, fn, arg);
	for (struct mc_op *op = mc_state->head; op != NULL; op = op->next)
		cancel_in(&op->waiters, fn, arg);
}

static int svc_refresh(mc_change_fn fn, void *arg)
{
	struct mc *st = mc_state;
	struct mc_waiter *w;
	struct mc_op *op;

	if (st == NULL || fn == NULL)
		return -1;
	if (st->conn == MC_DOWN || st->stale)
		return 1;	/* unavailable: the stale catalog is what there is */
	for (op = st->head; op != NULL; op = op->next)
		if (op->kind != MC_OP_LISTEN && !op->sent)
			break;
	if (op == NULL)
		op = op_push(st, MC_OP_VERIFY);
	w = waiter_new(st, MC_W_FN);
	if (op == NULL || w == NULL) {
		free(w);
		return -1;
	}
	w->fn = fn;
	w->arg = arg;
	list_push(&op->waiters, w);
	mc_kick(st);
	return 0;
}

static const struct meta_cache_api mc_service = {
	.size = (uint32_t)sizeof(struct meta_cache_api),
	.ready = svc_ready,
	.stale = svc_stale,
	.version = svc_version,
	.table = svc_table,
	.table_search = svc_table_search,
	.org = svc_org,
	.leaf = svc_leaf,
	.n_tables = svc_n_tables,
	.on_change = svc_on_change,
	.reloading = svc_reloading,
	.wait = svc_wait,
	.wait_cancel = svc_wait_cancel,
	.refresh = svc_refresh,
	.n_partitions = svc_n_partitions,
	.table_guard = svc_table_guard,
	.result_tables = svc_result_tables,
	.setting_readers = svc_setting_readers,
};

/* ========================================================== console == */

static const char *state_name(const struct mc *st)
{
	if (st->cat == NULL)
		return st->stale ? "unavailable" : "loading";
	if (st->stale)
		return "stale";
	return st->cat->id.installed ? "ready" : "not installed";
}

/* SHOW META_CACHE: one row. */
static int cmd_show(lk_plugin *self, lk_result *res, const char *args)
{
	static const char *const names[] = { "state", "version", "tables", "orgs", "partitions",
					     "last_load", "last_verify", "last_error", "loads",
					     "verifications", "notifications", "reloading", "waiting",
					     "setting_readers" };
	static const uint32_t types[] = { LK_TYPE_TEXT, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8,
					  LK_TYPE_INT8, LK_TYPE_TEXT, LK_TYPE_TEXT, LK_TYPE_TEXT,
					  LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_INT8, LK_TYPE_BOOL,
					  LK_TYPE_INT8, LK_TYPE_BOOL };
	struct mc *st = api->get_data(self);
	const struct mc_cat *cat = st->cat;
	char n[8][24], t1[48], t2[48];
	const char *row[14];

	if (*args != '\0')
		return api->result_error(res, "42601", "SHOW META_CACHE takes no arguments");
	snprintf(n[0], sizeof(n[0]), "%" PRIu64, cat != NULL ? cat->id.version : 0);
	snprintf(n[1], sizeof(n[1]), "%zu", cat != NULL ? cat->n_tables : 0);
	snprintf(n[2], sizeof(n[2]), "%zu", cat != NULL ? cat->n_orgs : 0);
	snprintf(n[3], sizeof(n[3]), "%zu", cat != NULL ? cat->n_parts : 0);
	snprintf(n[4], sizeof(n[4]), "%" PRIu64, st->loads);
	snprintf(n[5], sizeof(n[5]), "%" PRIu64, st->verifications);
	snprintf(n[6], sizeof(n[6]), "%" PRIu64, st->notifications);
	snprintf(n[7], sizeof(n[7]), "%" PRIu64, st->waiting);
	row[0] = state_name(st);
	row[1] = cat != NULL ? n[0] : NULL;
	row[2] = n[1];
	row[3] = n[2];
	row[4] = n[3];
	row[5] = wall_text(&st->last_load, t1, sizeof(t1));
	row[6] = wall_text(&st->last_verify, t2, sizeof(t2));
	row[7] = st->last_error[0] != '\0' ? st->last_error : NULL;
	row[8] = n[4];
	row[9] = n[5];
	row[10] = n[6];
	row[11] = svc_reloading() ? "t" : "f";
	row[12] = n[7];
	row[13] = cat != NULL && cat->id.installed ? (cat->id.readers ? "t" : "f") : NULL;
	api->result_columns(res, 14, names, types);
	api->result_row(res, row);
	return LK_HANDLED;
}

/* META_CACHE RELOAD: load the whole catalog now; answers when it is loaded. */
static int cmd_reload(lk_plugin *self, lk_result *res, const char *args)
{
	struct mc *st = api->get_data(self);
	struct mc_waiter *w;
	struct mc_op *op;

	if (*args != '\0')
		return api->result_error(res, "42601", "META_CACHE RELOAD takes no arguments");
	if (st->conn == MC_DOWN)
		return api->result_error(res, "08006", "the cloud database is unavailable: %s",
					 st->last_error);
	w = waiter_new(st, MC_W_RELOAD);
	op = w != NULL ? want_load(st) : NULL;
	if (op == NULL) {
		if (w != NULL)
			waiter_free(st, w);
		return api->result_error(res, "53200", "out of memory");
	}
	op->forced = 1;
	w->res = res;
	w->need_seq = ++st->notify_seq;
	list_push(&st->seq_waiters, w);
	mc_kick(st);
	return LK_ASYNC;
}

/* ============================================================ init == */

static int mc_init(lk_plugin *self, const lk_api *a)
{
	struct mc *st;
	size_t i;

	api = a;
	st = calloc(1, sizeof(*st));
	if (st == NULL) {
		a->init_error(self, "out of memory");
		return -1;
	}
	st->self = self;
	st->conn = MC_DOWN;
	a->set_data(self, st);
	mc_state = st;
	for (i = 0; i < sizeof(mc_settings) / sizeof(mc_settings[0]); i++)
		if (a->config_declare(self, mc_settings[i].key, mc_settings[i].def, mc_settings[i].doc) != 0) {
			a->init_error(self, "cannot declare setting %s", mc_settings[i].key);
			return -1;
		}
	if (a->hook(self, LK_HOOK_CONFIG_CHECK, on_config_check, 0) != 0 ||
	    a->hook(self, LK_HOOK_CONFIG_APPLY, on_config_apply, 0) != 0 ||
	    a->hook(self, LK_HOOK_CLIENT_STARTUP, on_client_startup, MC_STARTUP_PRIORITY) != 0 ||
	    a->hook(self, LK_HOOK_CLIENT_CLOSE, on_client_close, 0) != 0) {
		a->init_error(self, "cannot register hooks");
		return -1;
	}
	if (a->console_register(self, "SHOW META_CACHE", 0, cmd_show,
				"the catalog cache: state, version, counters") != 0 ||
	    a->console_register(self, "META_CACHE RELOAD", 1, cmd_reload,
				"load the catalog from the cloud database now") != 0) {
		a->init_error(self, "cannot register console commands");
		return -1;
	}
	if (a->service_publish(self, META_CACHE_SERVICE, &mc_service) != 0) {
		a->init_error(self, "service %s is already published", META_CACHE_SERVICE);
		return -1;
	}
	return 0;
}

static void mc_fini(lk_plugin *self)
{
	struct mc *st = api->get_data(self);
	struct mc_list tmp = { NULL, NULL };
	struct mc_waiter *w;

	if (st == NULL)
		return;
	drop_ops(st, &tmp);
	list_take(&tmp, &st->seq_waiters);
	while ((w = list_pop(&tmp)) != NULL)
		free(w);	/* every client is gone; nobody to resume */
	mc_cat_free(st->cat);
	if (st->rtables)
		api->tables_release(st->rtables);
	free(st->subs);
	free(st->cloud);
	mc_state = NULL;
	free(st);
}

LK_PLUGIN("meta_cache", "0.1.0", mc_init, mc_fini)
