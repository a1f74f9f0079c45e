/* SPDX-License-Identifier: ISC */
/*
 * pool.c -- databases, pools and the herding of clients and servers between
 * their lists; the janitor that enforces every timeout; stats averages.
 *
 * A pool is (database, client user). Its server connections log in as the
 * database's forced user or as the client user. Clients that want a server
 * and find none idle wait in the pool's FIFO; servers that become idle go
 * first to the oldest waiting client (pool_activate()).
 *
 * Idle servers are kept LIFO (the most recently used first), so that unused
 * ones age out through server_idle_timeout.
 */
#include "core.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

/* ---- databases ---- */

static void db_conf_copy(struct db_conf *dst, const struct db_conf *src)
{
	*dst = *src;
	dst->name = xstrdup(src->name);
	dst->host = xstrdup(src->host);
	dst->dbname = xstrdup(src->dbname);
	dst->user = xstrdup(src->user);
	dst->password = xstrdup(src->password);
	dst->auth_user = xstrdup(src->auth_user);
	dst->auth_query = xstrdup(src->auth_query);
	dst->auth_dbname = xstrdup(src->auth_dbname);
	dst->connect_query = xstrdup(src->connect_query);
	dst->client_encoding = xstrdup(src->client_encoding);
	dst->datestyle = xstrdup(src->datestyle);
	dst->timezone = xstrdup(src->timezone);
	dst->application_name = xstrdup(src->application_name);
	dst->transport = xstrdup(src->transport);
}

static void db_conf_release(struct db_conf *dc)
{
	free(dc->name);
	free(dc->host);
	free(dc->dbname);
	free(dc->user);
	free(dc->password);
	free(dc->auth_user);
	free(dc->auth_query);
	free(dc->auth_dbname);
	free(dc->connect_query);
	free(dc->client_encoding);
	free(dc->datestyle);
	free(dc->timezone);
	free(dc->application_name);
	free(dc->transport);
	memset(dc, 0, sizeof(*dc));
}

static bool str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool db_conf_same_target(const struct db_conf *a, const struct db_conf *b)
{
	return str_eq(a->host, b->host) && a->port == b->port && str_eq(a->dbname, b->dbname) &&
	       str_eq(a->user, b->user) && str_eq(a->password, b->password) && str_eq(a->transport, b->transport);
}

static struct lk_db *db_create(const char *name, const struct db_conf *conf, bool autodb)
{
	struct lk_db *db = xcalloc(1, sizeof(*db));
	db->name = xstrdup(name);
	db_conf_copy(&db->conf, conf);
	db->autodb = autodb;
	if (autodb && !db->conf.dbname)
		db->conf.dbname = xstrdup(name);
	db->last_used = now_mono();
	TAILQ_INSERT_TAIL(&rt->dbs, db, entry);
	return db;
}

struct lk_db *db_lookup(const char *name, bool create_auto)
{
	struct lk_db *db;
	const struct db_conf *star;

	TAILQ_FOREACH(db, &rt->dbs, entry)
		if (!db->removed && strcmp(db->name, name) == 0)
			return db;
	if (!create_auto || admin_is_dbname(name))
		return NULL;
	star = config_find_db(rt->cf, "*");
	return star ? db_create(name, star, true) : NULL;
}

/* ---- pools ---- */

static int pool_mode_lookup(const struct pool *p);

/*
 * The password a pool logs in with: the [databases] entry's password; for a
 * forced user without one, that user's auth_file secret (as PgBouncer does);
 * else the client user's auth_file secret.
 */
static const char *pool_password(const struct lk_db *db, const char *secret)
{
	const struct auth_entry *ae;

	if (db->conf.password)
		return db->conf.password;
	if (db->conf.user) {
		ae = config_find_auth(rt->cf, db->conf.user);
		return ae ? ae->secret : NULL;
	}
	return secret;
}

struct pool *pool_get(struct lk_db *db, const char *user, const char *secret)
{
	struct pool *p;

	if (db->conf.user)
		user = db->conf.user;	/* a forced user: every client shares one pool */
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (p->db == db && strcmp(p->user, user) == 0)
			return p;
	p = xcalloc(1, sizeof(*p));
	p->db = db;
	p->user = xstrdup(user);
	p->login_user = xstrdup(db->conf.user ? db->conf.user : user);
	p->login_password = xstrdup(pool_password(db, secret));
	TAILQ_INIT(&p->active_clients);
	TAILQ_INIT(&p->waiting_clients);
	TAILQ_INIT(&p->login_clients);
	TAILQ_INIT(&p->active_servers);
	TAILQ_INIT(&p->idle_servers);
	TAILQ_INIT(&p->tested_servers);
	TAILQ_INIT(&p->login_servers);
	p->last_used = now_mono();
	p->mode = pool_mode_lookup(p);
	TAILQ_INSERT_TAIL(&rt->pools, p, entry);
	return p;
}

int pool_mode_of(const struct pool *p)
{
	return p->mode;
}

static int pool_mode_lookup(const struct pool *p)
{
	const struct user_conf *uc = config_find_user(rt->cf, p->user);
	if (uc && uc->pool_mode >= 0)
		return uc->pool_mode;
	if (p->db->conf.pool_mode >= 0)
		return p->db->conf.pool_mode;
	return rt->cf->pool_mode;
}

int pool_size_of(const struct pool *p)
{
	const struct user_conf *uc = config_find_user(rt->cf, p->user);
	if (uc && uc->pool_size >= 0)
		return uc->pool_size;
	if (p->db->conf.pool_size >= 0)
		return p->db->conf.pool_size;
	return rt->cf->default_pool_size;
}

/* The reserve pool: the user's [users] reserve_pool_size, else the database's, else the global one (PgBouncer 1.24). */
static int reserve_size_of(const struct pool *p)
{
	const struct user_conf *uc = config_find_user(rt->cf, p->user);
	if (uc && uc->reserve_pool_size >= 0)
		return uc->reserve_pool_size;
	return p->db->conf.reserve_pool_size >= 0 ? p->db->conf.reserve_pool_size : rt->cf->reserve_pool_size;
}

/* query_wait_timeout: the user's [users] value, else the database's, else the global one (PgBouncer's order). */
static usec_t query_wait_timeout_of(const struct pool *p)
{
	const struct user_conf *uc = config_find_user(rt->cf, p->user);
	if (uc && uc->query_wait_timeout >= 0)
		return uc->query_wait_timeout;
	return p->db->conf.query_wait_timeout >= 0 ? p->db->conf.query_wait_timeout : rt->cf->query_wait_timeout;
}

/* server_lifetime: the database's, else the global one (0 = never). */
static usec_t pool_server_lifetime(const struct lk_db *db)
{
	return db->conf.server_lifetime > 0 ? db->conf.server_lifetime : rt->cf->server_lifetime;
}

static int min_size_of(const struct pool *p)
{
	return p->db->conf.min_pool_size >= 0 ? p->db->conf.min_pool_size : rt->cf->min_pool_size;
}

static int pool_server_total(const struct pool *p)
{
	return p->n_active_sv + p->n_idle_sv + p->n_tested_sv + p->n_login_sv;
}

bool pool_is_paused(const struct pool *p)
{
	return rt->paused || p->db->paused || rt->shutdown == SHUT_WAIT_SERVERS;
}

/* ---- list herding ---- */

static void client_list_move(struct client *c, enum client_state st)
{
	struct pool *p = c->pool;

	switch (c->state) {
	case CL_WAITING_LOGIN: TAILQ_REMOVE(&p->login_clients, c, entry); p->n_login_cl--; break;
	case CL_ACTIVE: TAILQ_REMOVE(&p->active_clients, c, entry); p->n_active_cl--; break;
	case CL_WAITING: TAILQ_REMOVE(&p->waiting_clients, c, entry); p->n_waiting_cl--; break;
	default: break;
	}
	switch (st) {
	case CL_WAITING_LOGIN: TAILQ_INSERT_TAIL(&p->login_clients, c, entry); p->n_login_cl++; break;
	case CL_ACTIVE: TAILQ_INSERT_TAIL(&p->active_clients, c, entry); p->n_active_cl++; break;
	case CL_WAITING: TAILQ_INSERT_TAIL(&p->waiting_clients, c, entry); p->n_waiting_cl++; break;
	default: break;
	}
	c->state = st;
}

void pool_set_client_state(struct client *c, enum client_state st)
{
	if (c->pool)
		client_list_move(c, st);
	else
		c->state = st;
}

void pool_set_server_state(struct server *s, enum server_state st)
{
	struct pool *p = s->pool;

	switch (s->state) {
	case SV_LOGIN: TAILQ_REMOVE(&p->login_servers, s, entry); p->n_login_sv--; break;
	case SV_IDLE: TAILQ_REMOVE(&p->idle_servers, s, entry); p->n_idle_sv--; break;
	case SV_ACTIVE: TAILQ_REMOVE(&p->active_servers, s, entry); p->n_active_sv--; break;
	case SV_TESTED: TAILQ_REMOVE(&p->tested_servers, s, entry); p->n_tested_sv--; break;
	default: break;
	}
	switch (st) {
	case SV_LOGIN: TAILQ_INSERT_TAIL(&p->login_servers, s, entry); p->n_login_sv++; break;
	case SV_IDLE: TAILQ_INSERT_HEAD(&p->idle_servers, s, entry); p->n_idle_sv++; break;
	case SV_ACTIVE: TAILQ_INSERT_TAIL(&p->active_servers, s, entry); p->n_active_sv++; break;
	case SV_TESTED: TAILQ_INSERT_TAIL(&p->tested_servers, s, entry); p->n_tested_sv++; break;
	default: break;
	}
	s->state = st;
}

/* ---- linking ---- */

static void append_set(char *buf, size_t len, const char *name, const char *value)
{
	size_t n = strlen(buf);
	if (n + strlen(name) + 2 * strlen(value) + 16 >= len)
		return;
	n += (size_t)snprintf(buf + n, len - n, "SET %s='", name);
	for (const char *p = value; *p && n + 4 < len; p++) {
		if (*p == '\'')
			buf[n++] = '\'';
		buf[n++] = *p;
	}
	snprintf(buf + n, len - n, "';");
}

/* Send the SETs that make the server's tracked parameters equal to the client's. */
static __attribute__((noinline)) void sync_vars_send(struct client *c, struct server *s)
{
	char sql[2048];

	sql[0] = 0;
	for (int i = 0; i < VAR_COUNT; i++) {
		const char *want = c->vars.v[i];
		if (!want || (s->vars.v[i] && strcmp(want, s->vars.v[i]) == 0))
			continue;
		append_set(sql, sizeof(sql), varcache_name((enum var_id)i), want);
		varcache_set(&s->vars, (enum var_id)i, want);
	}
	if (sql[0])
		server_send_hidden(s, sql);
	s->vars_from = c->vars.stamp;
	s->vars_at = s->vars.stamp;
}

/* Make the server's tracked parameters equal to the client's. */
static void sync_vars(struct client *c, struct server *s)
{
	/* the server still has what this client's variables were when they were last applied to it */
	if (s->vars_from == c->vars.stamp && s->vars_at == s->vars.stamp)
		return;
	sync_vars_send(c, s);
}

static void server_note_key(struct server *s, uint64_t key, int max);
static bool server_has_key(const struct server *s, uint64_t key);
static int key_home(struct pool *p, uint64_t key, int size);

static void pool_link(struct client *c, struct server *s)
{
	usec_t now = rt->now;

	pool_set_server_state(s, SV_ACTIVE);
	s->link = c;
	c->link = s;
	s->checked = false;
	s->last_used = s->linked_at = now;
	c->pool->stats.server_assignment_count++;
	if (c->affinity) {
		if (c->aff_home == s->home)	/* idle_server_for set it */
			c->pool->aff_home_count++;
		else if (server_has_key(s, c->affinity))
			c->pool->aff_known_count++;
		else
			c->pool->aff_away_count++;
		server_note_key(s, c->affinity, c->aff_max);
	}
	if (c->state == CL_WAITING) {
		c->pool->stats.wait_time += (uint64_t)(now - c->wait_start);
		pool_set_client_state(c, CL_ACTIVE);
	}
	sync_vars(c, s);
}

/* Server connections logged in as `user`, over every pool. */
static int user_server_count(const char *user)
{
	struct pool *p;
	int n = 0;
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (strcmp(p->login_user, user) == 0)
			n += pool_server_total(p);
	return n;
}

/*
 * When max_db_connections or max_user_connections is reached, an idle
 * server of another pool of the same database or user makes room.
 */
static bool make_room(struct pool *p, bool by_db)
{
	struct pool *o;
	struct server *s;

	TAILQ_FOREACH(o, &rt->pools, entry) {
		if (o == p || (by_db ? o->db != p->db : strcmp(o->login_user, p->login_user) != 0))
			continue;
		s = TAILQ_LAST(&o->idle_servers, server_list);
		if (s) {
			server_close(s, by_db ? "making room for another pool (max_db_connections)"
					      : "making room for another pool (max_user_connections)");
			return true;
		}
	}
	return false;
}

static bool can_launch(struct pool *p, bool reserve)
{
	const struct user_conf *uc = config_find_user(rt->cf, p->login_user);
	int umax = uc && uc->max_user_connections > 0 ? uc->max_user_connections : rt->cf->max_user_connections;
	int limit = pool_size_of(p) + (reserve ? reserve_size_of(p) : 0);
	int dbmax = p->db->conf.max_db_connections > 0 ? p->db->conf.max_db_connections : rt->cf->max_db_connections;

	if (pool_server_total(p) >= limit)
		return false;
	/* A transport pool with no server at all asks the transport again for a
	 * waiting client: its failure is immediate and fails that client
	 * (pool_transport_failed) instead of leaving it to query_wait_timeout. */
	if (p->last_connect_fail && now_mono() - p->last_connect_fail < rt->cf->server_login_retry && p->n_login_cl == 0 &&
	    !(p->db->conf.transport && pool_server_total(p) == 0 && p->n_waiting_cl > 0))
		return false;
	if (dbmax > 0 && p->db->server_count >= dbmax && !make_room(p, true))
		return false;
	if (umax > 0 && user_server_count(p->login_user) >= umax && !make_room(p, false))
		return false;
	return true;
}

/*
 * SCRAM pass-through: a client that proved the very SCRAM secret the pool
 * logs in with leaves its ClientKey, so servers can log in without a password.
 */
void pool_take_scram_keys(struct pool *p, struct client *c)
{
	if (!c->has_scram_keys)
		return;		/* nothing to wipe either: sasl_step() wipes what a failed scram_server_keys() left */
	if (c->secret && p->login_password && strcmp(c->secret, p->login_password) == 0) {
		memcpy(p->scram_keys, c->scram_keys, sizeof(p->scram_keys));
		p->has_scram_keys = true;
	}
	OPENSSL_cleanse(c->scram_keys, sizeof(c->scram_keys));
	c->has_scram_keys = false;
}

void pool_launch_first(struct pool *p)
{
	if (p->n_login_sv == 0 && p->n_idle_sv + p->n_active_sv == 0 && !pool_is_paused(p) && can_launch(p, false))
		server_launch(p);
}

/*
 * An idle server to hand out. One unused for longer than server_check_delay
 * (0: always) first runs server_check_query; it comes back through
 * pool_server_ready() and is handed out then.
 */
static struct server *idle_server(struct pool *p)
{
	const struct lk_config *cf = rt->cf;
	struct server *s;

	while ((s = TAILQ_FIRST(&p->idle_servers))) {
		if (!cf->server_check_query || s->checked || rt->now - s->last_used < cf->server_check_delay)
			return s;
		pool_set_server_state(s, SV_TESTED);
		server_send_hidden(s, cf->server_check_query);
	}
	return NULL;
}

static bool server_usable(const struct server *s)
{
	const struct lk_config *cf = rt->cf;
	return !cf->server_check_query || s->checked || rt->now - s->last_used < cf->server_check_delay;
}

static uint64_t aff_mix(uint64_t k);

/* The slot of key in an open-addressing table of keys (0 = free), or the free slot it would take. */
static uint32_t key_slot(const uint64_t *keys, uint32_t cap, uint64_t key)
{
	uint32_t i = (uint32_t)aff_mix(key) & (cap - 1);

	while (keys[i] && keys[i] != key)
		i = (i + 1) & (cap - 1);
	return i;
}

/*
 * Has s served key lately: is it among the last max_per_server keys s
 * took up (aff[], server_note_key)? Only those count as its own besides its home's: a server
 * that took every key it ever served as its own took more and more keys
 * away from their homes, until each backend worked on the partitions of
 * most organizations (doc/benchmarks.md, "A server's own organizations").
 */
static int server_key_index(const struct server *s, uint64_t key)
{
	int i = s->n_aff - 1;

	while (i >= 0 && s->aff[i] != key)	/* newest first: the likelier */
		i--;
	return i;
}

static bool server_has_key(const struct server *s, uint64_t key)
{
	return server_key_index(s, key) >= 0;
}

/*
 * Organization affinity. Each server connection of a pool has a home index
 * (0, 1, ... as they are opened, a closed one's index reused). The first
 * time the pool sees an affinity key it assigns the key to the index with
 * the fewest keys, and the key keeps going to that index's server whatever
 * the number of keys: with 10,000 organizations and a pool of 8 each backend
 * touches about an eighth of their partitions, where remembering the last
 * few keys per server (aff[]) let every backend touch all of them in turn
 * (PostgreSQL's per-backend relation caches: research/partitions.md). With
 * no more keys than servers, each key has a server of its own.
 */
#define AFF_MAP_MAX (1u << 18)		/* keys remembered per pool; more are spread by hash */

struct aff_map {
	uint64_t *keys;			/* open addressing, 0 = free */
	int32_t *home;
	uint32_t cap, n;
	uint32_t *load;			/* keys per home index */
	int nload;
	struct event *hold_ev;		/* ends a wait for a home server (leave_home_at) */
};

static uint64_t aff_mix(uint64_t k)	/* spreads the bits (MurmurHash3's finalizer) */
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ULL;
	return k ^ (k >> 33);
}

static void aff_map_free(struct aff_map *m)
{
	if (!m)
		return;
	if (m->hold_ev)
		event_free(m->hold_ev);
	free(m->keys);
	free(m->home);
	free(m->load);
	free(m);
}

/* The slot of key in m (its own, or the free one it would take). */
static uint32_t aff_slot(const struct aff_map *m, uint64_t key)
{
	return key_slot(m->keys, m->cap, key);
}

static bool aff_grow(struct aff_map *m)
{
	struct aff_map old = *m;
	uint32_t cap = m->cap ? 2 * m->cap : 64;

	m->keys = calloc(cap, sizeof(*m->keys));
	m->home = calloc(cap, sizeof(*m->home));
	if (!m->keys || !m->home) {
		free(m->keys);
		free(m->home);
		m->keys = old.keys;
		m->home = old.home;
		return false;
	}
	m->cap = cap;
	for (uint32_t i = 0; i < old.cap; i++)
		if (old.keys[i]) {
			uint32_t j = aff_slot(m, old.keys[i]);
			m->keys[j] = old.keys[i];
			m->home[j] = old.home[i];
		}
	free(old.keys);
	free(old.home);
	return true;
}

/* The home index of key in a pool of `size` servers; -1: none. */
static int key_home(struct pool *p, uint64_t key, int size)
{
	struct aff_map *m = p->aff;
	uint32_t i;
	int best = 0;

	if (size <= 0)
		return -1;
	if (!m && !(m = p->aff = calloc(1, sizeof(*m))))
		return (int)(aff_mix(key) % (uint64_t)size);
	if (m->cap) {
		i = aff_slot(m, key);
		if (m->keys[i] && m->home[i] < size)
			return m->home[i];
	}
	if (m->nload < size) {
		uint32_t *l = realloc(m->load, sizeof(*l) * (size_t)size);
		if (!l)
			return (int)(aff_mix(key) % (uint64_t)size);
		memset(l + m->nload, 0, sizeof(*l) * (size_t)(size - m->nload));
		m->load = l;
		m->nload = size;
	}
	for (int h = 1; h < size; h++)
		if (m->load[h] < m->load[best])
			best = h;
	if (m->cap && m->keys[i = aff_slot(m, key)]) {	/* its index is gone (a smaller pool) */
		if (m->home[i] < m->nload && m->load[m->home[i]] > 0)
			m->load[m->home[i]]--;
	} else {
		if (m->n >= AFF_MAP_MAX || ((m->n + 1) * 2 > m->cap && !aff_grow(m)))
			return (int)(aff_mix(key) % (uint64_t)size);
		i = aff_slot(m, key);
		m->keys[i] = key;
		m->n++;
	}
	m->home[i] = best;
	m->load[best]++;
	return best;
}

/* The lowest home index no server of the pool has. */
int pool_free_home(const struct pool *p)
{
	const struct server_list *lists[] = { &p->active_servers, &p->idle_servers, &p->tested_servers,
					      &p->login_servers };

	for (int home = 0;; home++) {
		bool used = false;
		for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]) && !used; i++) {
			const struct server *s;
			TAILQ_FOREACH(s, lists[i], entry)
				if (s->home == home) {
					used = true;
					break;
				}
		}
		if (!used)
			return home;
	}
}

/*
 * Affinity: how many waiting clients an idle server looks at, how many times
 * one may be passed over, and how long a client waits for its home server
 * while a server of another home is idle. A statement that goes to another
 * home's server makes that backend open the organization's partitions too,
 * and PostgreSQL 15 pays for every (backend, partition) pair once, more the
 * more it already has (research/partitions.md; doc/benchmarks.md, "Routing
 * cost"): with 10,000 organizations a leak of one statement in seven kept
 * PostgreSQL busy in SearchCatCacheList for minutes.
 */
#define AFF_SCAN 32
#define AFF_PASS_MAX 64
#define AFF_HOLD_USEC 10000		/* a home server that long with one client is not waited for */
#define AFF_WAIT_MAX_USEC 50000		/* nobody waits longer for a home while a server is idle */

/* Is a server with this home index open (pool_free_home gives out the lowest free index)? */
static bool home_open(const struct pool *p, int home)
{
	return home >= 0 && home < p->n_active_sv + p->n_idle_sv + p->n_tested_sv + p->n_login_sv;
}

/* When the oldest waiting client may stop waiting for its home server. */
static usec_t leave_home_at(const struct pool *p, const struct client *head)
{
	usec_t at = head->wait_start + AFF_WAIT_MAX_USEC;
	const struct server *s;

	TAILQ_FOREACH(s, &p->active_servers, entry)
		if (s->home == head->aff_home) {
			if (s->linked_at + AFF_HOLD_USEC < at)
				at = s->linked_at + AFF_HOLD_USEC;
			break;
		}
	return at;
}

/*
 * The oldest waiting client may take a server of another home: its home
 * server has served one client for AFF_HOLD_USEC (a long transaction, not a
 * queue that moves) or it waited AFF_WAIT_MAX_USEC (leave_home_at), or it
 * was passed over AFF_PASS_MAX times, or its home is not open, or its home
 * is crowded: more than half of the waiting clients looked at want it (one
 * busy organization, or a single waiting client: an uneven load spreads).
 */
static bool may_leave_home(struct pool *p, const struct client *head, int crowd, int looked)
{
	return head->aff_passed >= AFF_PASS_MAX || !home_open(p, head->aff_home) || 2 * crowd > looked ||
	       rt->now >= leave_home_at(p, head);
}

/*
 * A client alone in its pool (no other client logged in, waiting or
 * logging in) stays on the idle server used last, as without affinity: no
 * other client's statements share the backends, so spreading its keys
 * over them bounds nothing that matters, while moving to another backend at
 * nearly every statement cost one client up to half its throughput
 * (doc/benchmarks.md). Its backend then opens what it would have opened
 * without affinity.
 */
static bool alone_in_pool(const struct pool *p, const struct client *c)
{
	return c->state == CL_ACTIVE && p->n_active_cl == 1 && p->n_waiting_cl == 0 && p->n_login_cl == 0;
}

/*
 * An idle server for a client that does not wait yet. With an affinity key
 * (a plugin's, e.g. the organization): the idle server used last if it is
 * the key's home or served the key lately (server_has_key: its backend has
 * the key's partitions open, and the backend used last is the warmest) or
 * the client is alone in its pool (alone_in_pool),
 * else the key's home server, else one that served the key lately; if the
 * home server is open but busy, NULL and *hold: the client waits for it
 * (may_leave_home, pool_activate). Sets c->aff_home (-1 without a key) for
 * pool_link and the wait. The home server is looked for by its index alone
 * (one cache line of each idle server): with one client and many keys it
 * is idle nearly always.
 */
static struct server *idle_server_for(struct pool *p, struct client *c, bool *hold)
{
	struct server *s;
	bool any = false;
	int home;

	if (!c->affinity) {
		c->aff_home = -1;
		return idle_server(p);
	}
	c->aff_home = home = key_home(p, c->affinity, pool_size_of(p));
	s = TAILQ_FIRST(&p->idle_servers);	/* the one used last: its backend is warm */
	if (s && server_usable(s) &&
	    (s->home == home || server_has_key(s, c->affinity) || alone_in_pool(p, c)))
		return s;
	TAILQ_FOREACH(s, &p->idle_servers, entry)
		if (s->home == home && server_usable(s))
			return s;
	TAILQ_FOREACH(s, &p->idle_servers, entry) {
		if (!server_usable(s))
			continue;
		if (server_has_key(s, c->affinity))
			return s;
		any = true;
	}
	if (any && home_open(p, home) && p->n_waiting_cl > 0) {
		*hold = true;	/* others wait too: the idle servers are kept for their homes */
		return NULL;
	}
	return idle_server(p);
}

/*
 * The waiting client an idle server s takes: the first of the AFF_SCAN
 * oldest whose key is at home on s or who has no key, else the first whose
 * key s served lately (server_has_key), else the oldest if it may leave its
 * home (may_leave_home), else nobody: s stays idle for a client of its own.
 */
static struct client *waiting_for(struct pool *p, struct server *s)
{
	struct client *head = TAILQ_FIRST(&p->waiting_clients), *c, *served = NULL;
	int n = 0, crowd = 0;

	for (c = head; c && n < AFF_SCAN; c = TAILQ_NEXT(c, entry), n++) {
		if (!c->affinity || c->aff_home == s->home)
			break;
		if (!served && server_has_key(s, c->affinity))
			served = c;
		crowd += c->aff_home == head->aff_home;
	}
	if (!c || n == AFF_SCAN)
		c = served ? served : may_leave_home(p, head, crowd, n) ? head : NULL;
	if (c)
		for (struct client *o = head; o != c; o = TAILQ_NEXT(o, entry))
			o->aff_passed++;
	return c;
}

static void pool_activate(struct pool *p);

static void aff_hold_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	rt->now = now_mono();
	pool_activate(arg);
}

/* Wake the pool when its oldest waiting client may leave its home (an idle server is kept). */
static void aff_hold_arm(struct pool *p)
{
	struct client *head = TAILQ_FIRST(&p->waiting_clients);
	struct aff_map *m = p->aff;
	usec_t at, left;
	struct timeval tv;

	if (!head || !m)
		return;
	if (!m->hold_ev && !(m->hold_ev = evtimer_new(rt->base, aff_hold_cb, p)))
		return;
	at = leave_home_at(p, head);
	left = at > rt->now ? at - rt->now : 1;
	tv.tv_sec = (time_t)(left / USEC);
	tv.tv_usec = (suseconds_t)(left % USEC);
	evtimer_add(m->hold_ev, &tv);
}

/* Drop s->aff[i], keeping the order of the others. */
static void server_drop_key(struct server *s, int i)
{
	memmove(s->aff + i, s->aff + i + 1, sizeof(s->aff[0]) * (size_t)(s->n_aff - i - 1));
	s->n_aff--;
}

/* Remember the key on the server as the one it served last: a key served
 * again moves to the newest place, and a full set forgets the key it served
 * longest ago, so aff[] holds the last max distinct keys it served. */
static void server_note_key(struct server *s, uint64_t key, int max)
{
	int i = server_key_index(s, key);

	if (max < 1 || max > AFF_SLOTS)
		max = AFF_SLOTS;
	if (i == s->n_aff - 1 && i >= 0 && s->n_aff <= max)
		return;			/* the newest already: the common case */
	if (i >= 0)
		server_drop_key(s, i);
	while (s->n_aff >= max)
		server_drop_key(s, 0);
	s->aff[s->n_aff++] = key;
}

/* Put a logged-in client without a server on the pool of `db` (same user). */
bool pool_move_client(struct client *c, struct lk_db *db)
{
	struct pool *np;

	if (!db || db->removed || c->link)
		return false;
	np = pool_get(db, c->user, c->secret);
	if (!np)
		return false;
	if (np == c->pool)
		return true;
	pool_set_client_state(c, CL_LOGIN);	/* off the old pool's lists */
	c->pool = np;
	c->db = db;
	pool_take_scram_keys(np, c);
	pool_set_client_state(c, CL_ACTIVE);
	return true;
}

bool pool_acquire(struct client *c)
{
	struct pool *p = c->pool;
	bool hold = false;
	struct server *s = idle_server_for(p, c, &hold);

	if (s && !pool_is_paused(p)) {
		pool_link(c, s);
		return true;
	}
	c->wait_start = rt->now = now_mono();
	c->aff_passed = 0;		/* c->aff_home: idle_server_for */
	c->wait_notified = false;
	pool_set_client_state(c, CL_WAITING);
	if (pool_is_paused(p))
		return false;
	if (hold)
		aff_hold_arm(p);
	else if (p->n_login_sv == 0 && can_launch(p, false))
		server_launch(p);
	return false;
}

/* Give idle servers to waiting clients, oldest client first (affinity: see waiting_for). */
static void pool_activate(struct pool *p)
{
	struct client *c;
	struct server *s;

	while (!pool_is_paused(p) && (c = TAILQ_FIRST(&p->waiting_clients))) {
		if (c->affinity) {
			/* which waiting client each idle server serves (waiting_for) */
			c = NULL;
			TAILQ_FOREACH(s, &p->idle_servers, entry)
				if (server_usable(s) && (c = waiting_for(p, s)))
					break;
			if (!c) {
				if (p->n_idle_sv > 0 && !idle_server(p))
					break;	/* the idle ones were due a server_check_query */
				if (p->n_idle_sv > 0)
					aff_hold_arm(p);
				break;
			}
		} else if (!(s = idle_server(p))) {
			break;
		}
		pool_link(c, s);
		client_resume(c);
	}
	if (!pool_is_paused(p) && p->n_waiting_cl > p->n_login_sv && can_launch(p, false))
		server_launch(p);
}

static bool server_expired(const struct server *s)
{
	usec_t life = pool_server_lifetime(s->pool->db);
	return s->close_needed || s->pool->db->removed || (life > 0 && rt->now - s->created > life);
}

void pool_release(struct server *s)
{
	struct client *c = s->link;
	struct pool *p = s->pool;

	if (c) {
		c->link = NULL;
		c->route_done = false;	/* the next transaction is routed anew */
	}
	s->link = NULL;
	if (server_expired(s))
		server_close(s, s->close_needed ? "close_needed" : "server lifetime over");
	else
		pool_set_server_state(s, SV_IDLE);
	pool_activate(p);
	if (c && !c->closing && c->state == CL_ACTIVE && evbuffer_get_length(bufferevent_get_input(c->bev)))
		client_process(c);
}

void pool_server_ready(struct server *s)
{
	struct pool *p = s->pool;
	struct client *c;

	s->last_used = now_mono();
	if (server_expired(s)) {
		server_close(s, "close_needed");
		pool_activate(p);
		return;
	}
	pool_set_server_state(s, SV_IDLE);
	if (!p->welcome_ready) {
		p->welcome_ready = true;
		p->last_connect_fail = 0;
	}
	while ((c = TAILQ_FIRST(&p->login_clients))) {
		pool_set_client_state(c, CL_ACTIVE);
		client_welcome(c);
		client_resume(c);
	}
	pool_activate(p);
}

void pool_server_login_failed(struct pool *p, const char *sqlstate, const char *msg)
{
	struct client *c;

	p->last_connect_fail = now_mono();
	free(p->last_error);
	p->last_error = xstrdup(msg);
	while ((c = TAILQ_FIRST(&p->login_clients)))
		client_close(c, sqlstate, "%s", msg);
	/*
	 * A pool served through a plugin transport (a site behind the tunnel)
	 * with no other server that could serve them (the failing one is still
	 * counted): its waiting clients get the error now, rather than wait for
	 * query_wait_timeout while every retry fails the same way -- the site's
	 * agent is gone, or its database is down or refuses logins. A plain pool
	 * keeps PgBouncer's behaviour: its clients wait, and it retries every
	 * server_login_retry.
	 */
	if (p->db->conf.transport && pool_server_total(p) <= 1)
		while ((c = TAILQ_FIRST(&p->waiting_clients)))
			client_close(c, sqlstate, "%s", msg);
}

/* A plugin transport could not open a server connection (e.g. no tunnel agent of the site is connected). */
void pool_transport_failed(struct pool *p, const char *msg)
{
	pool_server_login_failed(p, "08001", msg);
}

/* The client is going away: settle its server and take it off the pool. */
void pool_client_gone(struct client *c)
{
	struct server *s = c->link;
	struct pool *p = c->pool;

	if (!p || c->state == CL_LOGIN || c->state == CL_ADMIN || c->state == CL_CLOSING || c->state == CL_JUSTFREE)
		return;
	c->link = NULL;
	pool_set_client_state(c, CL_JUSTFREE);
	if (s) {
		s->link = NULL;
		if (!s->ready || c->fwd_remaining) {
			server_close(s, "client disconnected before its transaction ended");
		} else if (rt->cf->server_reset_query && *rt->cf->server_reset_query &&
			   (pool_mode_of(p) == POOL_SESSION || rt->cf->server_reset_query_always)) {
			pool_set_server_state(s, SV_TESTED);
			server_send_hidden(s, rt->cf->server_reset_query);
		} else if (server_expired(s)) {
			server_close(s, "server lifetime over");
		} else {
			pool_set_server_state(s, SV_IDLE);
		}
	}
	pool_activate(p);
	lokadb_check_shutdown();
}

/* ---- console actions ---- */

static void close_servers(struct server_list *l, const char *why)
{
	struct server *s;
	while ((s = TAILQ_FIRST(l)))
		server_close(s, "%s", why);
}

void pool_reconnect(struct lk_db *db)
{
	struct pool *p;
	struct server *s;

	TAILQ_FOREACH(p, &rt->pools, entry) {
		if (db && p->db != db)
			continue;
		TAILQ_FOREACH(s, &p->active_servers, entry)
			s->close_needed = true;
		TAILQ_FOREACH(s, &p->tested_servers, entry)
			s->close_needed = true;
		TAILQ_FOREACH(s, &p->login_servers, entry)
			s->close_needed = true;
		close_servers(&p->idle_servers, "RECONNECT");
	}
}

/*
 * A plugin's transport says the server connection `id` should not be used
 * again (api->server_retire: a tunnel agent going away). Idle in its pool it
 * closes now; linked to a client, logging in or running a reset it is
 * marked close_needed, as RECONNECT marks it, and closes when released.
 * 1 (closed), 0 (marked), or -1 if no open server connection has that id.
 * O(servers).
 */
int pool_retire_server(uint64_t id, const char *why)
{
	struct pool *p;
	struct server *s;

	TAILQ_FOREACH(p, &rt->pools, entry) {
		TAILQ_FOREACH(s, &p->idle_servers, entry)
			if (s->id == id) {
				server_close(s, "%s", why);
				pool_activate(p);
				return 1;
			}
		struct server_list *busy[] = { &p->active_servers, &p->tested_servers, &p->login_servers };
		for (size_t i = 0; i < sizeof(busy) / sizeof(busy[0]); i++)
			TAILQ_FOREACH(s, busy[i], entry)
				if (s->id == id) {
					s->close_needed = true;
					return 0;
				}
	}
	return -1;
}

void pool_kill(struct lk_db *db)
{
	struct pool *p;
	struct client *c;

	db->paused = true;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		if (p->db != db)
			continue;
		while ((c = TAILQ_FIRST(&p->active_clients)))
			client_close(c, "57P01", "database \"%s\" was killed by the administrator", db->name);
		while ((c = TAILQ_FIRST(&p->waiting_clients)))
			client_close(c, "57P01", "database \"%s\" was killed by the administrator", db->name);
		while ((c = TAILQ_FIRST(&p->login_clients)))
			client_close(c, "57P01", "database \"%s\" was killed by the administrator", db->name);
		close_servers(&p->idle_servers, "KILL");
		close_servers(&p->tested_servers, "KILL");
		close_servers(&p->login_servers, "KILL");
		close_servers(&p->active_servers, "KILL");
	}
}

void pool_resume(struct lk_db *db)
{
	struct pool *p;

	struct lk_db *d;

	if (db) {
		db->paused = false;
	} else {
		rt->paused = false;
		TAILQ_FOREACH(d, &rt->dbs, entry)
			d->paused = false;
	}
	TAILQ_FOREACH(p, &rt->pools, entry)
		pool_activate(p);
}

int pool_active_servers(struct lk_db *db)
{
	struct pool *p;
	int n = 0;
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (!db || p->db == db)
			n += p->n_active_sv + p->n_tested_sv;
	return n;
}

/* ---- client connection limits (max_db/user_client_connections) ---- */

int pool_db_client_limit(const struct lk_db *db)
{
	int n = db ? db->conf.max_db_client_connections : -1;
	return n >= 0 ? n : rt->cf->max_db_client_connections;
}

int pool_user_client_limit(const char *user)
{
	const struct user_conf *u = config_find_user(rt->cf, user);
	return u && u->max_user_client_connections >= 0 ? u->max_user_client_connections :
	       rt->cf->max_user_client_connections;
}

/* Logged-in clients of database `db` (any user) and of `user` (any database). */
void pool_client_counts(const struct lk_db *db, const char *user, int *n_db, int *n_user)
{
	struct pool *p;

	*n_db = *n_user = 0;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		int n = p->n_active_cl + p->n_waiting_cl + p->n_login_cl;
		if (p->db == db)
			*n_db += n;
		if (user && strcmp(p->user, user) == 0)
			*n_user += n;
	}
}

/* ---- reload ---- */

void pool_apply_config(struct lk_config *old)
{
	struct lk_db *db;
	struct pool *p;
	(void)old;

	TAILQ_FOREACH(db, &rt->dbs, entry) {
		const struct db_conf *nc = config_find_db(rt->cf, db->autodb ? "*" : db->name);
		if (!nc) {
			db->removed = true;
			pool_reconnect(db);
			continue;
		}
		db->removed = false;
		if (!db_conf_same_target(&db->conf, nc) && !(db->autodb && str_eq(nc->host, db->conf.host) && nc->port == db->conf.port))
			pool_reconnect(db);
		{
			char *autoname = db->autodb ? xstrdup(db->name) : NULL;
			db_conf_release(&db->conf);
			db_conf_copy(&db->conf, nc);
			if (autoname && !db->conf.dbname)
				db->conf.dbname = autoname;
			else
				free(autoname);
		}
	}
	for (int i = 0; i < rt->cf->n_dbs; i++) {
		const struct db_conf *dc = &rt->cf->dbs[i];
		if (strcmp(dc->name, "*") == 0)
			continue;
		db = db_lookup(dc->name, false);
		if (!db)
			db = db_create(dc->name, dc, false);
		if (db->conf.user)
			pool_get(db, db->conf.user, NULL);	/* so min_pool_size can fill it */
	}
	TAILQ_FOREACH(p, &rt->pools, entry) {
		const struct auth_entry *ae = config_find_auth(rt->cf, p->user);
		const char *pw = pool_password(p->db, ae ? ae->secret : NULL);
		if (!ae && !p->db->conf.password && !p->db->conf.user)
			continue;	/* its secret came from a plugin's AUTH_LOOKUP, not auth_file */
		if (!str_eq(pw, p->login_password)) {
			free(p->login_password);
			p->login_password = xstrdup(pw);
			p->has_scram_keys = false;	/* they were for the old secret */
		}
		if (!p->db->conf.user || strcmp(p->login_user, p->db->conf.user) != 0) {
			const char *lu = p->db->conf.user ? p->db->conf.user : p->user;
			if (strcmp(lu, p->login_user) != 0) {
				free(p->login_user);
				p->login_user = xstrdup(lu);
			}
		}
		p->mode = pool_mode_lookup(p);
		pool_activate(p);
	}
}

/* ---- janitor ---- */

/*
 * Close a client and the server it is linked to, both for `reason`, as
 * PgBouncer's disconnect_server() does: each logs "closing because: REASON"
 * and the client gets it as a FATAL error.
 */
static void close_pair(struct client *c, const char *sqlstate, const char *reason)
{
	struct server *s = c->link;

	if (s) {
		c->link = NULL;
		s->link = NULL;
		server_close(s, "%s", reason);
	}
	client_close(c, sqlstate, "%s", reason);
}

/* The client timeouts of a pool: its user's [users] values where set (> 0), else the global ones. */
struct client_timeouts {
	usec_t query, idle_xact, client_idle, xact;
};

static usec_t user_or_global(usec_t user, usec_t global)
{
	return user > 0 ? user : global;
}

static void pool_timeouts(const struct pool *p, struct client_timeouts *t)
{
	const struct lk_config *cf = rt->cf;
	const struct user_conf *u = config_find_user(cf, p->user);

	t->query = user_or_global(u ? u->query_timeout : 0, cf->query_timeout);
	t->idle_xact = user_or_global(u ? u->idle_transaction_timeout : 0, cf->idle_transaction_timeout);
	t->client_idle = user_or_global(u ? u->client_idle_timeout : 0, cf->client_idle_timeout);
	t->xact = user_or_global(u ? u->transaction_timeout : 0, cf->transaction_timeout);
}

/* transaction_timeout: the client's transaction (or lone statement) has been open too long. */
static bool xact_too_long(const struct server *s, usec_t now, usec_t limit)
{
	return limit > 0 && s->in_xact && now - s->xact_start > limit;
}

/* PgBouncer's text for query_wait_notify (NOTICE, SQLSTATE 00000). */
#define QUERY_WAIT_NOTICE "No server connection available in postgres backend, client being queued"

/* query_wait_notify: tell a client that has waited that long, once per wait. */
static void notify_waiting(struct client *c, usec_t now)
{
	usec_t limit = rt->cf->query_wait_notify;

	if (limit <= 0 || c->wait_notified || now - c->wait_start < limit || c->closing || !c->bev)
		return;
	c->wait_notified = true;
	pkt_notice(&rt->pb, "00000", QUERY_WAIT_NOTICE);
	if (!pkt_send(&rt->pb, bufferevent_get_output(c->bev)))
		log_warning("could not queue the query_wait_notify notice");
}

static void janitor_clients(struct pool *p, usec_t now)
{
	struct client *c, *tmp;
	const struct lk_config *cf = rt->cf;
	struct client_timeouts to;
	usec_t wait_limit = query_wait_timeout_of(p);

	pool_timeouts(p, &to);

	TAILQ_FOREACH_SAFE(c, &p->login_clients, entry, tmp)
		if (cf->client_login_timeout > 0 && now - c->login_start > cf->client_login_timeout)
			client_close(c, "57014", "client_login_timeout (server down)");
	TAILQ_FOREACH_SAFE(c, &p->waiting_clients, entry, tmp)
		if (wait_limit > 0 && now - c->wait_start > wait_limit)
			client_close(c, "57014", "query_wait_timeout");
		else
			notify_waiting(c, now);
	TAILQ_FOREACH_SAFE(c, &p->active_clients, entry, tmp) {
		struct server *s = c->link;
		usec_t idle = now - c->request_time;
		if (s && s->rq.count) {
			if (to.query > 0 && now - s->query_start > to.query)
				close_pair(c, "57014", "query timeout");
			else if (xact_too_long(s, now, to.xact))
				close_pair(c, "25P04", "transaction timeout");
			continue;	/* a query is running */
		}
		if (s && s->txn_status != 'I' && to.idle_xact > 0 && idle > to.idle_xact)
			close_pair(c, "25P03", "idle transaction timeout");
		else if (s && xact_too_long(s, now, to.xact))
			close_pair(c, "25P04", "transaction timeout");
		else if (to.client_idle > 0 && idle > to.client_idle && (!s || s->ready))
			client_close(c, "57P05", "client_idle_timeout");
	}
}

static void janitor_servers(struct pool *p, usec_t now)
{
	struct server *s, *tmp;
	const struct lk_config *cf = rt->cf;

	/*
	 * server_fast_close: a session-mode server marked by RECONNECT or a
	 * RELOAD goes at the end of its transaction, and its client with it
	 * (so the client notices that its session was cut), as in PgBouncer.
	 */
	TAILQ_FOREACH_SAFE(s, &p->active_servers, entry, tmp) {
		if (cf->server_fast_close && pool_mode_of(p) == POOL_SESSION && s->close_needed && s->ready &&
		    s->link && !s->link->fwd_remaining)
			close_pair(s->link, "57P01", "database configuration changed");
	}

	TAILQ_FOREACH_SAFE(s, &p->idle_servers, entry, tmp) {
		if (server_expired(s))
			server_close(s, s->close_needed ? "close_needed" : "server lifetime over");
		else if (cf->server_idle_timeout > 0 && now - s->last_used > cf->server_idle_timeout &&
			 pool_server_total(p) > min_size_of(p))
			server_close(s, "server idle timeout");
	}
	TAILQ_FOREACH_SAFE(s, &p->login_servers, entry, tmp) {
		if (cf->server_connect_timeout > 0 && now - s->created > cf->server_connect_timeout) {
			pool_server_login_failed(p, "08001", "server_connect_timeout");
			server_close(s, "server_connect_timeout");
		}
	}
}

static void janitor_launch(struct pool *p, usec_t now)
{
	struct client *c = TAILQ_FIRST(&p->waiting_clients);

	if (pool_is_paused(p) || p->db->removed)
		return;
	if (p->n_login_cl > 0 && !p->welcome_ready) {
		pool_launch_first(p);
		return;
	}
	if (c && p->n_login_sv == 0 && can_launch(p, false)) {
		server_launch(p);
		return;
	}
	if (c && now - c->wait_start > rt->cf->reserve_pool_timeout && p->n_login_sv == 0 && can_launch(p, true)) {
		log_info("pool %s/%s: taking a connection from the reserve pool", p->db->name, p->user);
		server_launch(p);
		return;
	}
	if (pool_server_total(p) < min_size_of(p) && can_launch(p, false) && p->n_login_sv == 0)
		server_launch(p);
}

/*
 * autodb_idle_timeout: a database made from the `*` entry that no client
 * has used for that long keeps no server connections (and min_pool_size
 * does not refill it) until a client comes back.
 */
static bool janitor_autodb_idle(struct pool *p, usec_t now)
{
	struct server *s, *tmp;

	if (!p->db->autodb || rt->cf->autodb_idle_timeout <= 0 || now - p->db->last_used <= rt->cf->autodb_idle_timeout)
		return false;
	TAILQ_FOREACH_SAFE(s, &p->idle_servers, entry, tmp)
		server_close(s, "autodb_idle_timeout");
	return true;
}

void pool_janitor(void)
{
	struct pool *p;
	struct client *c, *tmp;
	usec_t now = rt->now = now_mono();

	if (rt->suspended) {		/* SUSPEND: connections stand still, their timers too */
		admin_janitor();
		return;
	}
	TAILQ_FOREACH_SAFE(c, &rt->login_clients, entry, tmp)
		if (rt->cf->client_login_timeout > 0 && now - c->login_start > rt->cf->client_login_timeout)
			client_close(c, "57014", "client_login_timeout");
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (p->n_active_cl + p->n_waiting_cl + p->n_login_cl > 0)
			p->db->last_used = now;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		janitor_clients(p, now);
		janitor_servers(p, now);
		if (!janitor_autodb_idle(p, now))
			janitor_launch(p, now);
	}
	peers_janitor(now);
	admin_janitor();
	lokadb_check_shutdown();
}

/* ---- stats ---- */

#define EVICT_WARN_SHARE	10		/* percent of the Binds of a stats_period */
#define EVICT_WARN_MIN_BINDS	100
#define EVICT_WARN_EVERY	(600 * USEC)

/*
 * A pool whose server connections closed statements to make room for at
 * least one Bind in ten of the last stats_period parses them again and again:
 * say so in the log (at most every 10 minutes per pool), with the setting
 * that cures it. With org_routing and isolated organizations one statement
 * of the application is one per organization on the server.
 */
static void warn_evictions(struct pool *p, const struct lk_stats *cur, const struct lk_stats *prev, usec_t now)
{
	uint64_t de = cur->server_evict_count - prev->server_evict_count, db = cur->bind_count - prev->bind_count;

	if (db < EVICT_WARN_MIN_BINDS || de * 100 < db * EVICT_WARN_SHARE ||
	    (p->evict_warned_at && now - p->evict_warned_at < EVICT_WARN_EVERY))
		return;
	p->evict_warned_at = now;
	log_warning("pool %s/%s: %llu prepared statements closed on server connections to make room, for %llu Binds "
		    "in the last stats_period: max_prepared_statements = %d is short, and they are parsed again when "
		    "they come back; raise it (a statement on an isolated organization's leaves counts once per "
		    "organization)",
		    p->db->name, p->user, (unsigned long long)de, (unsigned long long)db, rt->cf->max_prepared_statements);
}

void pool_stats_tick(void)
{
	struct pool *p;
	double secs = (double)rt->cf->stats_period / USEC;
	usec_t now = now_mono();

	if (secs <= 0)
		secs = 1;
	TAILQ_FOREACH(p, &rt->pools, entry) {
		struct lk_stats *cur = &p->stats, *prev = &p->prev_stats, *avg = &p->avg;
		uint64_t dx = cur->xact_count - prev->xact_count, dq = cur->query_count - prev->query_count;
		avg->xact_count = (uint64_t)(dx / secs);
		avg->query_count = (uint64_t)(dq / secs);
		avg->bytes_received = (uint64_t)((cur->bytes_received - prev->bytes_received) / secs);
		avg->bytes_sent = (uint64_t)((cur->bytes_sent - prev->bytes_sent) / secs);
		avg->xact_time = dx ? (cur->xact_time - prev->xact_time) / dx : 0;
		avg->query_time = dq ? (cur->query_time - prev->query_time) / dq : 0;
		{
			uint64_t da = cur->server_assignment_count - prev->server_assignment_count;
			avg->wait_time = da ? (cur->wait_time - prev->wait_time) / da : 0;	/* per assignment */
		}
		avg->server_assignment_count = (uint64_t)((cur->server_assignment_count - prev->server_assignment_count) / secs);
		avg->client_login_count = (uint64_t)((cur->client_login_count - prev->client_login_count) / secs);
		avg->client_parse_count = (uint64_t)((cur->client_parse_count - prev->client_parse_count) / secs);
		avg->server_parse_count = (uint64_t)((cur->server_parse_count - prev->server_parse_count) / secs);
		avg->bind_count = (uint64_t)((cur->bind_count - prev->bind_count) / secs);
		warn_evictions(p, cur, prev, now);
		if (rt->cf->log_stats && (dx || dq))
			log_info("stats: %s/%s %llu xacts/s, %llu queries/s, in %llu B/s, out %llu B/s, xact %llu us, query %llu us, wait %llu us",
				 p->db->name, p->user, (unsigned long long)avg->xact_count, (unsigned long long)avg->query_count,
				 (unsigned long long)avg->bytes_received, (unsigned long long)avg->bytes_sent,
				 (unsigned long long)avg->xact_time, (unsigned long long)avg->query_time,
				 (unsigned long long)avg->wait_time);
		*prev = *cur;
	}
}

/* ---- teardown ---- */

void pool_free_all(void)
{
	struct pool *p;
	struct lk_db *db;

	while ((p = TAILQ_FIRST(&rt->pools))) {
		TAILQ_REMOVE(&rt->pools, p, entry);
		for (int i = 0; i < p->n_welcome; i++) {
			free(p->welcome[i].name);
			free(p->welcome[i].value);
		}
		free(p->welcome);
		free(p->welcome_wire);
		free(p->welcome_off);
		free(p->user);
		free(p->login_user);
		free(p->login_password);
		free(p->last_error);
		aff_map_free(p->aff);
		free(p);
	}
	while ((db = TAILQ_FIRST(&rt->dbs))) {
		TAILQ_REMOVE(&rt->dbs, db, entry);
		db_conf_release(&db->conf);
		free(db->name);
		free(db);
	}
}
