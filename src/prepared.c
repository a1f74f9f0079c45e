/* SPDX-License-Identifier: ISC */
/*
 * prepared.c -- the reply queue of a server connection and protocol-level
 * prepared statements across transaction pooling (see prepared.h for the
 * model; PgBouncer 1.21's design, written anew).
 *
 * Owns: the global statement cache (rt->ps_cache), every client's statement
 * map (c->ps) and every server's LRU (s->ps), and the items of the reply
 * queues (s->rq).
 *
 * Invariants:
 *   - an entry lives while anything refers to it (refs > 0): a client name,
 *     a server's LRU, a queue item; at 0 it leaves the cache and is freed;
 *   - a server's LRU holds what the server will have prepared once what was
 *     sent has run; an ErrorResponse undoes what the server skipped
 *     (rq_discard_batch, srv_resettle), so the LRU never claims a statement
 *     the server lacks nor misses one it has (a Parse of a name the server
 *     already has would fail). test/fuzz/fuzz_prepared.c checks this
 *     against a model of the server;
 *   - a client's map changes when its message is sent (the pipeline order
 *     of later messages relies on it) and is undone the same way.
 *
 * Not here: deciding when the feature is on (c->ps_on, client.c) and moving
 * the bytes of the replies (server.c).
 *
 * Routines:
 *   rq_push rq_at rq_pop rq_remove rq_free   the queue as a data structure
 *   server_expect rq_flush_synth rq_discard_batch
 *   ps_parse ps_bind ps_describe ps_close ps_reparse
 *   ps_deallocate_candidate ps_deallocate_of ps_deallocate
 *   ps_statements_dropped ps_*_count ps_*_free
 */
#include "core.h"
#include "prepared.h"
#include "textmap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#define PS_NAME_MAX 32		/* "LOKADB_" + 20 digits + NUL */
#define PS_TABLE_MIN 16

/* ================= the reply queue ================= */

struct rq_item *rq_push(struct replyq *q, char type, int act)
{
	struct rq_item *it;

	if (q->count == q->cap) {
		uint32_t ncap = q->cap ? q->cap * 2 : 16;
		struct rq_item *n = malloc(sizeof(*n) * ncap);
		if (!n)
			return NULL;
		for (uint32_t i = 0; i < q->count; i++)
			n[i] = q->v[(q->head + i) % q->cap];
		free(q->v);
		q->v = n;
		q->cap = ncap;
		q->head = 0;
	}
	it = &q->v[(q->head + q->count) % q->cap];
	memset(it, 0, sizeof(*it));
	it->type = type;
	it->act = (uint8_t)act;
	q->count++;
	q->syncs += rq_owes_ready(type);
	return it;
}

struct rq_item *rq_at(const struct replyq *q, uint32_t i)
{
	return i < q->count ? &q->v[(q->head + i) % q->cap] : NULL;
}

static void entry_unref(struct ps_entry *e);

static void item_release(struct replyq *q, struct rq_item *it)
{
	q->syncs -= rq_owes_ready(it->type);
	q->marked_gone |= it->mark_txn;
	it->mark_txn = false;
	entry_unref(it->e);
	entry_unref(it->e_parsed);
	it->e_parsed = NULL;
	free(it->name);
	textmap_free(it->map);
	rt_tables_release(it->tables);
	plugin_stmt_drop(it->st_before);
	it->st_before = NULL;
	it->st_undo = false;
	rt_tables_release(it->rn_before);
	it->rn_before = NULL;
	it->rn_undo = false;
	it->tables = NULL;
	it->e = NULL;
	it->name = NULL;
	it->map = NULL;
	free(it->reply);
	it->reply = NULL;
	free(it->st_drops);
	it->st_drops = NULL;
}

void rq_pop(struct replyq *q)
{
	if (!q->count)
		return;
	item_release(q, &q->v[q->head]);
	q->head = (q->head + 1) % q->cap;
	q->count--;
}

/* Take out the i-th item (rare: a Sync PostgreSQL ignores during COPY IN). */
void rq_remove(struct replyq *q, uint32_t i)
{
	if (i >= q->count)
		return;
	item_release(q, rq_at(q, i));
	for (; i + 1 < q->count; i++)
		*rq_at(q, i) = *rq_at(q, i + 1);
	q->count--;
}

void rq_free(struct replyq *q)
{
	while (q->count)
		rq_pop(q);
	free(q->v);
	memset(q, 0, sizeof(*q));
}

/* ================= hash tables ================= */

/* A node of a chained hash table starts with this. */
struct ps_link {
	struct ps_link *next;
	uint64_t hash;
};

struct ps_table {
	struct ps_link **b;
	uint32_t nb, n;
};

struct ps_entry {
	struct ps_link link;
	uint64_t id;
	int refs;
	char name[PS_NAME_MAX];		/* on the server */
	uint32_t blen;			/* body: query text, NUL, int16 n, n int32 type OIDs */
	uint8_t body[];
};

struct ps_cache {
	struct ps_table tab;
	uint64_t next_id;
	uint64_t seed;
};

/* a client's statement name */
struct ps_cname {
	struct ps_link link;
	struct ps_entry *e;
	struct ps_entry *parsed;	/* a plugin's re-parse changed e: the client's Parse's (a reference), else NULL */
	char name[];
};

struct ps_cli {
	struct ps_table tab;
};

/* a statement a server connection has */
struct ps_sstmt {
	struct ps_link link;
	TAILQ_ENTRY(ps_sstmt) lru;
	struct ps_entry *e;
};

struct ps_srv {
	struct ps_table tab;
	TAILQ_HEAD(, ps_sstmt) lru;	/* least recently used first */
};

static struct ps_cache *cache(void)
{
	if (!rt->ps_cache) {
		rt->ps_cache = xcalloc(1, sizeof(*rt->ps_cache));
		random_bytes(&rt->ps_cache->seed, sizeof(rt->ps_cache->seed));
	}
	return rt->ps_cache;
}

/* FNV-1a, seeded per process so that clients cannot choose colliding texts in advance. */
static uint64_t hash_bytes(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 14695981039346656037ULL ^ cache()->seed;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h ^ (h >> 29);
}

static bool tab_grow(struct ps_table *t)
{
	uint32_t nb = t->nb ? t->nb * 2 : PS_TABLE_MIN;
	struct ps_link **b = calloc(nb, sizeof(*b));

	if (!b)
		return false;
	for (uint32_t i = 0; i < t->nb; i++) {
		struct ps_link *l, *next;
		for (l = t->b[i]; l; l = next) {
			next = l->next;
			l->next = b[l->hash & (nb - 1)];
			b[l->hash & (nb - 1)] = l;
		}
	}
	free(t->b);
	t->b = b;
	t->nb = nb;
	return true;
}

static bool tab_add(struct ps_table *t, struct ps_link *l)
{
	if (t->n >= t->nb && !tab_grow(t) && !t->nb)
		return false;
	l->next = t->b[l->hash & (t->nb - 1)];
	t->b[l->hash & (t->nb - 1)] = l;
	t->n++;
	return true;
}

static void tab_del(struct ps_table *t, struct ps_link *l)
{
	struct ps_link **pp;

	for (pp = &t->b[l->hash & (t->nb - 1)]; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			t->n--;
			return;
		}
	}
}

static struct ps_link *tab_first(const struct ps_table *t, uint64_t hash)
{
	return t->nb ? t->b[hash & (t->nb - 1)] : NULL;
}

/* ================= the global cache ================= */

/* The entry of a Parse body, made if new; the caller gets a reference (NULL: out of memory). */
/* The cache's entry of a Parse body (name excluded), or NULL */
static struct ps_entry *entry_find(const uint8_t *body, uint32_t blen, uint64_t h)
{
	for (struct ps_link *l = tab_first(&cache()->tab, h); l; l = l->next) {
		struct ps_entry *e = (struct ps_entry *)l;
		if (l->hash == h && e->blen == blen && memcmp(e->body, body, blen) == 0)
			return e;
	}
	return NULL;
}

static struct ps_entry *entry_get(const uint8_t *body, uint32_t blen)
{
	struct ps_cache *pc = cache();
	uint64_t h = hash_bytes(body, blen);
	struct ps_entry *e = entry_find(body, blen, h);

	if (e) {
		e->refs++;
		return e;
	}
	e = malloc(sizeof(*e) + blen);
	if (!e)
		return NULL;
	memset(e, 0, sizeof(*e));
	e->link.hash = h;
	e->id = ++pc->next_id;
	e->refs = 1;
	snprintf(e->name, sizeof(e->name), "LOKADB_%llu", (unsigned long long)e->id);
	e->blen = blen;
	memcpy(e->body, body, blen);
	if (!tab_add(&pc->tab, &e->link)) {
		free(e);
		return NULL;
	}
	return e;
}

static struct ps_entry *entry_ref(struct ps_entry *e)
{
	if (e)
		e->refs++;
	return e;
}

static void entry_unref(struct ps_entry *e)
{
	if (!e || --e->refs > 0)
		return;
	tab_del(&rt->ps_cache->tab, &e->link);
	free(e);
}

void ps_cache_free(void)
{
	if (!rt->ps_cache)
		return;
	free(rt->ps_cache->tab.b);	/* entries are freed with their last reference */
	free(rt->ps_cache);
	rt->ps_cache = NULL;
}

/* ================= a client's names ================= */

static struct ps_cname *cname_find(const struct client *c, const char *name, uint64_t *hp)
{
	size_t n = strlen(name);
	uint64_t h = hash_bytes(name, n);

	if (hp)
		*hp = h;
	if (!c->ps)
		return NULL;
	for (struct ps_link *l = tab_first(&c->ps->tab, h); l; l = l->next) {
		struct ps_cname *cn = (struct ps_cname *)l;
		if (l->hash == h && strcmp(cn->name, name) == 0)
			return cn;
	}
	return NULL;
}

/* name -> e (takes the caller's reference on e). false: out of memory (the reference is dropped). */
static bool cname_add(struct client *c, const char *name, struct ps_entry *e)
{
	size_t n = strlen(name);
	struct ps_cname *cn;

	if (!c->ps)
		c->ps = calloc(1, sizeof(*c->ps));
	cn = c->ps ? malloc(sizeof(*cn) + n + 1) : NULL;
	if (!cn) {
		entry_unref(e);
		return false;
	}
	cn->link.hash = hash_bytes(name, n);
	cn->e = e;
	cn->parsed = NULL;
	memcpy(cn->name, name, n + 1);
	if (!tab_add(&c->ps->tab, &cn->link)) {
		free(cn);
		entry_unref(e);
		return false;
	}
	return true;
}

static void cname_del(struct client *c, struct ps_cname *cn)
{
	tab_del(&c->ps->tab, &cn->link);
	entry_unref(cn->e);
	entry_unref(cn->parsed);
	free(cn);
}

static void cli_clear(struct client *c)
{
	if (!c->ps)
		return;
	for (uint32_t i = 0; i < c->ps->tab.nb; i++) {
		while (c->ps->tab.b[i])
			cname_del(c, (struct ps_cname *)c->ps->tab.b[i]);
	}
}

void ps_client_free(struct client *c)
{
	if (!c->ps)
		return;
	cli_clear(c);
	free(c->ps->tab.b);
	free(c->ps);
	c->ps = NULL;
}

unsigned ps_client_count(const struct client *c)
{
	return c->ps ? c->ps->tab.n : 0;
}

/* ================= a server's statements ================= */

static struct ps_sstmt *sstmt_find(const struct server *s, const struct ps_entry *e)
{
	uint64_t h = e->id * 0x9e3779b97f4a7c15ULL;

	if (!s->ps)
		return NULL;
	for (struct ps_link *l = tab_first(&s->ps->tab, h); l; l = l->next) {
		struct ps_sstmt *st = (struct ps_sstmt *)l;
		if (st->e == e)
			return st;
	}
	return NULL;
}

/* The server has e: newest (or oldest) in its LRU. false: out of memory. */
static bool sstmt_add(struct server *s, struct ps_entry *e, bool oldest)
{
	struct ps_sstmt *st;

	if (!s->ps) {
		s->ps = calloc(1, sizeof(*s->ps));
		if (!s->ps)
			return false;
		TAILQ_INIT(&s->ps->lru);
	}
	st = malloc(sizeof(*st));
	if (!st)
		return false;
	st->link.hash = e->id * 0x9e3779b97f4a7c15ULL;
	st->e = entry_ref(e);
	if (!tab_add(&s->ps->tab, &st->link)) {
		entry_unref(e);
		free(st);
		return false;
	}
	if (oldest)
		TAILQ_INSERT_HEAD(&s->ps->lru, st, lru);
	else
		TAILQ_INSERT_TAIL(&s->ps->lru, st, lru);
	return true;
}

static void sstmt_del(struct server *s, struct ps_sstmt *st)
{
	tab_del(&s->ps->tab, &st->link);
	TAILQ_REMOVE(&s->ps->lru, st, lru);
	entry_unref(st->e);
	free(st);
}

static void srv_clear(struct server *s)
{
	struct ps_sstmt *st;

	if (!s->ps)
		return;
	while ((st = TAILQ_FIRST(&s->ps->lru)))
		sstmt_del(s, st);
}

void ps_server_free(struct server *s)
{
	if (!s->ps)
		return;
	srv_clear(s);
	free(s->ps->tab.b);
	free(s->ps);
	s->ps = NULL;
}

unsigned ps_server_count(const struct server *s)
{
	return s->ps ? s->ps->tab.n : 0;
}

/* Does an item behind the head (sent after the message completing now) prepare e, or create name? */
static bool made_later(const struct server *s, const struct ps_entry *e, const char *name)
{
	for (uint32_t i = 1; i < s->rq.count; i++) {
		const struct rq_item *it = rq_at(&s->rq, i);
		if (it->e == e && (name ? it->name && (it->undo & RQ_UNDO_CL_PARSE) && strcmp(it->name, name) == 0
				      : (it->undo & RQ_UNDO_SRV_PARSE) != 0))
			return true;
	}
	return false;
}

void ps_statements_dropped(struct server *s, bool for_client)
{
	struct ps_sstmt *st, *next;
	struct client *c = s->link;

	if (s->rq.count <= 1) {
		srv_clear(s);
		if (for_client && c)
			cli_clear(c);
		return;
	}
	/* the Parses sent behind it (pipelined) run after it: theirs stay */
	if (s->ps)
		for (st = TAILQ_FIRST(&s->ps->lru); st; st = next) {
			next = TAILQ_NEXT(st, lru);
			if (!made_later(s, st->e, NULL))
				sstmt_del(s, st);
		}
	if (for_client && c && c->ps)
		for (uint32_t i = 0; i < c->ps->tab.nb; i++) {
			struct ps_link **pp = &c->ps->tab.b[i];
			while (*pp) {
				struct ps_cname *cn = (struct ps_cname *)*pp;
				if (made_later(s, cn->e, cn->name) || (cn->parsed && made_later(s, cn->parsed, cn->name)))
					pp = &(*pp)->next;
				else
					cname_del(c, cn);
			}
		}
}

/* ================= replies ================= */

struct rq_item *server_expect(struct server *s, char type, int act)
{
	struct rq_item *it = rq_push(&s->rq, type, act);

	if (!it) {
		server_close(s, "out of memory");
		return NULL;
	}
	if (act != RQ_SYNTH && type == 'S')
		s->ext_fails = false;
	else if (act != RQ_SYNTH && (type == 'P' || type == 'B' || type == 'D' || type == 'E'))
		s->ext_fails = true;
	if (s->ext_armed && rq_owes_ready(type)) {
		/* its ReadyForQuery says whether the values sent inside the batch stuck */
		it->vars_ext = true;
		s->ext_live++;
		it->ext_seq = s->ext_seq;
		s->ext_armed = false;
	}
	return it;
}

void rq_flush_synth(struct server *s)
{
	struct rq_item *it;

	while (!s->fwd_remaining && !s->skipping && (it = rq_head(&s->rq)) && it->act == RQ_SYNTH) {
		struct client *c = s->link;
		uint8_t msg[5] = { (uint8_t)it->type, 0, 0, 0, 4 };	/* ParseComplete '1' / CloseComplete '3' */
		uint8_t ready[6] = { 'Z', 0, 0, 0, 5, (uint8_t)s->txn_status };
		if (c && !c->closing && c->bev) {
			struct evbuffer *out = bufferevent_get_output(c->bev);
			if (it->type != 'r')
				evbuffer_add(out, msg, sizeof(msg));
			else
				evbuffer_add(out, it->reply, it->reply_len);
			if (it->type == 'r' && it->reply_ready)
				evbuffer_add(out, ready, sizeof(ready));
		}
		rq_pop(&s->rq);
	}
}

void rq_synth_reply(struct server *s, struct pktbuf *pb, bool ready)
{
	struct rq_item *it = pb->failed ? NULL : server_expect(s, 'r', RQ_SYNTH);

	if (it && pb->len && !(it->reply = malloc(pb->len)))
		server_close(s, "out of memory");
	else if (it) {
		if (pb->len)
			memcpy(it->reply, pb->data, pb->len);
		it->reply_len = (uint32_t)pb->len;
		it->reply_ready = ready;
		rq_flush_synth(s);
	}
	pkt_reset(pb);
}

#define RQ_UNDO_SRV (RQ_UNDO_SRV_PARSE | RQ_UNDO_SRV_CLOSE | RQ_UNDO_SRV_RECLOSE)
#define RQ_UNDO_CL (RQ_UNDO_CL_PARSE | RQ_UNDO_CL_CLOSE)

/* Did a message after the Sync at `sync` change the client name of skipped item `it` again? */
static bool name_changed_later(const struct server *s, uint32_t sync, const struct rq_item *it)
{
	for (uint32_t j = sync + 1; j < s->rq.count; j++) {
		const struct rq_item *o = rq_at(&s->rq, j);
		if ((o->undo & RQ_UNDO_CL) && o->name && strcmp(o->name, it->name) == 0)
			return true;
	}
	return false;
}

/*
 * The server skipped the message of `it`: its client name is what it was
 * before, unless a later message (after the Sync) changed it again, which
 * is then what it is now.
 */
static void name_undo(struct server *s, uint32_t sync, const struct rq_item *it)
{
	struct client *c = s->link;
	struct ps_cname *cn;

	if (!c || !it->name || !(it->undo & RQ_UNDO_CL) || name_changed_later(s, sync, it))
		return;
	cn = cname_find(c, it->name, NULL);
	if ((it->undo & RQ_UNDO_CL_PARSE) && cn && (cn->e == it->e || cn->parsed == it->e))
		cname_del(c, cn);	/* (also after a plugin's re-parse of it) */
	if ((it->undo & RQ_UNDO_CL_CLOSE) && !cn && it->e && cname_add(c, it->name, entry_ref(it->e)) &&
	    it->e_parsed)	/* as it was: also the client's Parse a plugin's re-parse replaced */
		cname_find(c, it->name, NULL)->parsed = entry_ref(it->e_parsed);
}

/*
 * The server skipped items 0..sync-1, among them item i, the first to
 * prepare or close its statement e: e is on the server as it was before
 * (absent before a Parse, present before a Close), changed by the messages
 * after the Sync. Those were sent believing otherwise: a Parse of a
 * statement the server still has fails (42P05) and must then not drop it, a
 * Close of one it does not have must not bring it back when skipped.
 */
static void srv_resettle(struct server *s, uint32_t sync, uint32_t i)
{
	struct rq_item *it = rq_at(&s->rq, i);
	struct ps_sstmt *st;
	bool have;

	if (!it->e || !(it->undo & RQ_UNDO_SRV))
		return;
	for (uint32_t k = 0; k < i; k++)
		if (rq_at(&s->rq, k)->e == it->e && (rq_at(&s->rq, k)->undo & RQ_UNDO_SRV))
			return;		/* settled with an earlier item */
	have = (it->undo & RQ_UNDO_SRV_CLOSE) != 0;
	for (uint32_t j = sync + 1; j < s->rq.count; j++) {
		struct rq_item *o = rq_at(&s->rq, j);
		if (o->e != it->e || !(o->undo & RQ_UNDO_SRV))
			continue;
		if (o->undo & RQ_UNDO_SRV_RECLOSE) {
			o->undo = (uint8_t)(have ? o->undo | RQ_UNDO_SRV_CLOSE : o->undo & ~RQ_UNDO_SRV_CLOSE);
			have = false;
		} else if (o->undo & RQ_UNDO_SRV_PARSE) {
			if (have)
				o->undo &= (uint8_t)~RQ_UNDO_SRV_PARSE;
			have = true;
		} else {
			if (!have)
				o->undo &= (uint8_t)~RQ_UNDO_SRV_CLOSE;
			have = false;
		}
	}
	st = sstmt_find(s, it->e);
	if (st && !have)
		sstmt_del(s, st);
	else if (!st && have && !sstmt_add(s, it->e, true))
		s->close_needed = true;		/* cannot track it: do not reuse this connection */
}

bool rq_discard_batch(struct server *s, bool head_failed)
{
	uint32_t n = 0;
	struct rq_item *it;

	while ((it = rq_at(&s->rq, n)) && it->type != 'S')
		n++;
	for (uint32_t i = n; i-- > 0;) {	/* names newest first: a Close after a Parse of the same name */
		name_undo(s, n, rq_at(&s->rq, i));
		if (rq_at(&s->rq, i)->reparse_gen)	/* (the first failed, the others were skipped) */
			plugin_reparse_lost(s->link, rq_at(&s->rq, i));
		if (rq_at(&s->rq, i)->st_undo)
			plugin_stmt_undo(s->link, rq_at(&s->rq, i), head_failed && i == 0);
	}
	for (uint32_t i = 0; i < n; i++)
		srv_resettle(s, n, i);
	while (n--)
		rq_pop(&s->rq);
	return s->rq.count > 0;
}

/* ================= the client's messages ================= */

static bool cstring(const uint8_t *b, uint32_t len, uint32_t *off, const char **out)
{
	const uint8_t *nul;

	if (*off >= len)
		return false;
	nul = memchr(b + *off, 0, len - *off);
	if (!nul)
		return false;
	*out = (const char *)b + *off;
	*off = (uint32_t)(nul - b) + 1;
	return true;
}

/* Append s to pb as the body of an E'' literal. */
static void put_escaped(struct pktbuf *pb, const char *s)
{
	for (; *s; s++) {
		if (*s == '\'' || *s == '\\')
			pkt_put_byte(pb, (uint8_t)*s);
		pkt_put_byte(pb, (uint8_t)*s);
	}
}

/*
 * The client's message must fail as PostgreSQL would fail it. The server
 * itself raises the error (an unnamed DO statement): it then aborts the
 * transaction and skips the client's messages up to the Sync exactly as it
 * would have for its own error, and the error reaches the client in
 * pipeline order. The client's unnamed statement and portal are used.
 */
static int ps_fail(struct client *c, const char *sqlstate, const char *fmt, const char *name, char missing)
{
	struct server *s = c->link;
	static const char head[] = "DO $lokadb$BEGIN RAISE EXCEPTION USING ERRCODE = '";
	static const char mid[] = "', MESSAGE = E'";
	struct pktbuf *pb = &rt->pb;
	char msg[256];

	if (strstr(name, "$lokadb$"))
		name = "?";	/* it would end the DO block's quoting */
	snprintf(msg, sizeof(msg), fmt, name);
	if (missing && strncasecmp(name, "lokadb", 6) != 0) {
		/*
		 * A name the client does not have: the same message for it, which
		 * the server has no statement of (its are LOKADB_<n>), raises
		 * PostgreSQL's own 26000, also in a failed transaction block
		 * (where a DO would get 25P02), and leaves the client's unnamed
		 * statement and portal alone.
		 */
		if (missing == 'B')
			pkt_bind(pb, "", name);
		else {
			pkt_begin(pb, 'D');
			pkt_put_byte(pb, 'S');
			pkt_put_string(pb, name);
			pkt_end(pb);
		}
		if (!server_expect(s, missing, RQ_FWD)) {
			pkt_reset(pb);
			return PS_FAIL;
		}
		pkt_send(pb, bufferevent_get_output(s->bev));
		return PS_FAIL;
	}
	pkt_begin(pb, 'P');
	pkt_put_string(pb, "");
	pkt_put_bytes(pb, head, sizeof(head) - 1);
	pkt_put_bytes(pb, sqlstate, strlen(sqlstate));
	pkt_put_bytes(pb, mid, sizeof(mid) - 1);
	put_escaped(pb, msg);
	pkt_put_string(pb, "'; END$lokadb$");
	pkt_put_int16(pb, 0);
	pkt_end(pb);
	pkt_bind(pb, "", "");
	pkt_execute(pb, "");
	if (!server_expect(s, 'P', RQ_HIDE) || !server_expect(s, 'B', RQ_HIDE) || !server_expect(s, 'E', RQ_FWD)) {
		pkt_reset(pb);
		return PS_FAIL;
	}
	pkt_send(pb, bufferevent_get_output(s->bev));
	return PS_FAIL;
}

/* Close the server's least recently used statements until one more fits. */
static bool srv_make_room(struct server *s)
{
	int max = rt->cf->max_prepared_statements > 0 ? rt->cf->max_prepared_statements : 1;
	struct ps_sstmt *st;

	while (s->ps && (int)s->ps->tab.n >= max && (st = TAILQ_FIRST(&s->ps->lru))) {
		struct rq_item *it = server_expect(s, 'C', RQ_HIDE);
		if (!it)
			return false;
		it->undo = RQ_UNDO_SRV_CLOSE;
		it->e = entry_ref(st->e);
		pkt_close(&rt->pb, 'S', st->e->name);
		pkt_send(&rt->pb, bufferevent_get_output(s->bev));
		sstmt_del(s, st);
		s->pool->stats.server_evict_count++;
	}
	return true;
}

static void send_parse(struct server *s, const struct ps_entry *e)
{
	pkt_begin(&rt->pb, 'P');
	pkt_put_string(&rt->pb, e->name);
	pkt_put_bytes(&rt->pb, e->body, e->blen);
	pkt_end(&rt->pb);
	pkt_send(&rt->pb, bufferevent_get_output(s->bev));
	s->pool->stats.server_parse_count++;
}

static bool unsettled_in(const struct replyq *q, bool (*match)(const struct rq_item *it, const void *arg),
			 const void *arg, bool clients)
{
	bool sent = false, unsettled = false;

	for (uint32_t i = 0; q->syncs && i < q->count; i++) {
		const struct rq_item *it = rq_at(q, i);
		if (rq_owes_ready(it->type) && (!clients || it->act != RQ_HIDE)) {
			unsettled = sent;
		} else if (match(it, arg)) {
			sent = true;
			unsettled = false;
		}
	}
	return unsettled;
}

bool rq_unsettled(const struct replyq *q, bool (*match)(const struct rq_item *it, const void *arg), const void *arg)
{
	return unsettled_in(q, match, arg, false);
}

bool rq_client_owes_ready(const struct replyq *q)
{
	for (uint32_t i = 0; q->syncs && i < q->count; i++) {
		const struct rq_item *it = rq_at(q, i);
		if (rq_owes_ready(it->type) && it->act != RQ_HIDE)
			return true;
	}
	return false;
}

bool rq_client_unsettled(const struct replyq *q, bool (*match)(const struct rq_item *it, const void *arg),
			 const void *arg)
{
	return unsettled_in(q, match, arg, true);
}

/* (rq_client_unsettled: the client's Parse or Close of its statement arg) */
static bool cl_changes(const struct rq_item *it, const void *arg)
{
	return (it->undo & (RQ_UNDO_CL_PARSE | RQ_UNDO_CL_CLOSE)) && it->name && strcmp(it->name, arg) == 0;
}

bool ps_name_unsettled(const struct client *c, const char *name)
{
	return c->link && c->link->rq.syncs && name[0] && rq_client_unsettled(&c->link->rq, cl_changes, name);
}

bool ps_msg_name_unsettled(const struct client *c, const uint8_t *msg, uint32_t have)
{
	uint32_t off = 5;
	const char *name;

	if (!c->link || have < 6 || !rq_client_owes_ready(&c->link->rq))
		return false;	/* (nothing of the client's unanswered: nothing to wait for) */
	if (msg[0] == 'B' && !cstring(msg, have, &off, &name))
		return false;	/* (its portal) */
	if (msg[0] == 'D' || msg[0] == 'C') {
		if (msg[5] != 'S')
			return false;	/* (a portal) */
		off = 6;
	}
	if (!cstring(msg, have, &off, &name) || !name[0])
		return false;
	for (uint32_t i = 0; i < c->link->rq.count; i++) {
		const struct rq_item *it = rq_at(&c->link->rq, i);
		if (it->drops_all && it->act != RQ_HIDE)
			return true;	/* the statements before it go, those after it stay */
	}
	if (ps_name_unsettled(c, name))
		return true;
	if (msg[0] == 'P' && cname_find(c, name, NULL))
		return true;	/* (42P05: ps_parse raises it as the block the batches before leave allows) */
	if (msg[0] == 'P') {
		/*
		 * A Parse of a text the server has, which ps_parse answers itself
		 * (ParseComplete), waits for the batches before it: they may leave
		 * a failed transaction block, where PostgreSQL refuses it (25P02).
		 * Once per statement and client. The whole message is needed.
		 */
		uint32_t body_off = off;
		const char *query;
		struct ps_entry *e;
		if (!cstring(msg, have, &off, &query) || have - off < 2 || have - off != 2 + 4u * pkt_get_u16(msg + off))
			return false;
		e = entry_find(msg + body_off, have - body_off, hash_bytes(msg + body_off, have - body_off));
		return e && sstmt_find(c->link, e);
	}
	return false;
}

/* (rq_unsettled: a Parse or Close of the entry arg on the server) */
static bool srv_changes(const struct rq_item *it, const void *arg)
{
	return it->e == arg && (it->undo & RQ_UNDO_SRV);
}

/*
 * Send the Parse of e under its server name; act RQ_FWD for the client's own
 * Parse. When an earlier batch's Parse or Close of e is unanswered, a Close
 * goes first: the server has e after them whatever that batch did (closing
 * a statement it lacks is no error), where a Parse alone would fail (42P05)
 * if that batch's Close was skipped; srv_resettle corrects the Close's undo
 * once that batch is known. NULL: the server is closed.
 */
static struct rq_item *srv_prepare(struct server *s, struct ps_entry *e, int act)
{
	struct rq_item *it;

	if (rq_unsettled(&s->rq, srv_changes, e)) {
		struct ps_sstmt *st = sstmt_find(s, e);
		if (!(it = server_expect(s, 'C', RQ_HIDE)))
			return NULL;
		it->undo = RQ_UNDO_SRV_RECLOSE | (st ? RQ_UNDO_SRV_CLOSE : 0);
		it->e = entry_ref(e);
		pkt_close(&rt->pb, 'S', e->name);
		pkt_send(&rt->pb, bufferevent_get_output(s->bev));
		if (st)
			sstmt_del(s, st);
	}
	if (!srv_make_room(s))
		return NULL;
	it = server_expect(s, 'P', act);
	if (!it)
		return NULL;
	if (!sstmt_add(s, e, false)) {
		server_close(s, "out of memory");
		return NULL;
	}
	it->undo = RQ_UNDO_SRV_PARSE;
	it->e = entry_ref(e);
	send_parse(s, e);
	return it;
}

/* The server is to use e next: bump it, or prepare it first (hidden). false: the server is closed. */
static bool srv_ensure(struct server *s, struct ps_entry *e)
{
	struct ps_sstmt *st = sstmt_find(s, e);

	if (st && rq_unsettled(&s->rq, srv_changes, e))
		return srv_prepare(s, e, RQ_HIDE) != NULL;	/* it may not be there: closed and prepared */
	if (st) {
		TAILQ_REMOVE(&s->ps->lru, st, lru);
		TAILQ_INSERT_TAIL(&s->ps->lru, st, lru);
		return true;
	}
	return srv_prepare(s, e, RQ_HIDE) != NULL;
}

/* A reply the pooler gives itself in pipeline order, undone like the message it answers. */
static int synth(struct client *c, char reply, int undo, struct ps_entry *e, struct ps_entry *parsed,
		 const char *name)
{
	struct server *s = c->link;
	struct rq_item *it = server_expect(s, reply, RQ_SYNTH);

	if (!it)
		return PS_DONE;
	it->undo = (uint8_t)undo;
	it->e = entry_ref(e);
	it->e_parsed = entry_ref(parsed);
	it->name = xstrdup(name);
	rq_flush_synth(s);
	return PS_DONE;
}

bool ps_parse_name_in_use(const struct client *c, const uint8_t *msg, uint32_t have)
{
	uint32_t off = 5;
	const char *name;

	return c->ps && cstring(msg, have, &off, &name) && name[0] && cname_find(c, name, NULL);
}

/*
 * Since its last ReadyForQuery, has the server been sent a message that may
 * end a transaction block (an Execute: of a ROLLBACK, say), or the client's
 * Sync or Query?
 */
static bool batch_may_end_block(const struct server *s)
{
	for (uint32_t i = 0; i < s->rq.count; i++) {
		const struct rq_item *it = rq_at(&s->rq, i);
		if (it->type == 'E' || (rq_owes_ready(it->type) && it->act != RQ_HIDE))
			return true;
	}
	return false;
}

bool server_block_failed(const struct server *s)
{
	return s->txn_status == 'E' && !batch_may_end_block(s);
}

int ps_parse(struct client *c, const uint8_t *msg, uint32_t mlen)
{
	struct server *s = c->link;
	const char *name, *query;
	uint32_t off = 5, body_off;
	struct ps_entry *e;
	struct rq_item *it;

	c->pool->stats.client_parse_count++;
	if (!cstring(msg, mlen, &off, &name) || !name[0])
		return PS_PASS;		/* unnamed (or malformed: the server says so) */
	body_off = off;
	if (!cstring(msg, mlen, &off, &query) || mlen - off < 2 || mlen - off != 2 + 4u * pkt_get_u16(msg + off))
		return PS_PASS;
	if (cname_find(c, name, NULL)) {
		/*
		 * PostgreSQL analyzes the text before it looks at the name: the
		 * text goes first as the unnamed statement (hidden), so that its
		 * error comes first (the batch fails either way, and with it the
		 * unnamed statement's use)
		 */
		pkt_begin(&rt->pb, 'P');
		pkt_put_string(&rt->pb, "");
		pkt_put_bytes(&rt->pb, msg + body_off, mlen - body_off);
		pkt_end(&rt->pb);
		if (!server_expect(s, 'P', RQ_HIDE)) {
			pkt_reset(&rt->pb);
			return PS_DONE;
		}
		pkt_send(&rt->pb, bufferevent_get_output(s->bev));
		if (server_block_failed(s)) {
			/* the block is aborted already, and a DO would get 25P02: the
			 * error goes from here, after the text's Parse (which PostgreSQL
			 * refuses in the block unless it ends the block; then its 25P02
			 * comes, and this one goes with the batch it skips) */
			char text[256];
			snprintf(text, sizeof(text), "prepared statement \"%s\" already exists", name);
			pkt_error(&rt->pb, "ERROR", "42P05", text, NULL);
			rq_synth_reply(s, &rt->pb, false);
			return PS_FAIL;
		}
		return ps_fail(c, "42P05", "prepared statement \"%s\" already exists", name, 0);
	}
	e = entry_get(msg + body_off, mlen - body_off);
	if (!e || !cname_add(c, name, e)) {
		client_close(c, "53200", "out of memory");
		return PS_DONE;
	}
	if (sstmt_find(s, e) && server_block_failed(s)) {
		/* in a failed transaction PostgreSQL refuses every Parse (25P02): let
		 * it, so that the name is not created; the server keeps its statement */
		it = server_expect(s, 'P', RQ_FWD);
		if (it) {
			it->undo = RQ_UNDO_CL_PARSE;
			it->e = entry_ref(e);
			it->name = xstrdup(name);
			send_parse(s, e);
		}
		return PS_DONE;
	}
	if (sstmt_find(s, e)) {
		srv_ensure(s, e);
		return synth(c, '1', RQ_UNDO_CL_PARSE, e, NULL, name);
	}
	it = srv_prepare(s, e, RQ_FWD);
	if (it) {
		it->undo |= RQ_UNDO_CL_PARSE;
		it->name = xstrdup(name);
	}
	return PS_DONE;
}

/*
 * The entry of the client's statement `name`, made present on its server.
 * NULL: failed (*rc: PS_FAIL with the error queued, or the server is gone).
 */
static struct ps_entry *bound_entry(struct client *c, const char *name, int *rc, char type)
{
	struct ps_cname *cn = cname_find(c, name, NULL);

	if (!cn) {
		*rc = ps_fail(c, "26000", "prepared statement \"%s\" does not exist", name, type);
		return NULL;
	}
	if (!srv_ensure(c->link, cn->e)) {
		*rc = PS_DONE;
		return NULL;
	}
	return cn->e;
}

int ps_bind(struct client *c, const uint8_t *msg, uint32_t have, uint32_t mlen, uint32_t *used)
{
	const char *portal, *name;
	uint32_t off = 5, name_off;
	struct ps_entry *e;
	int rc = PS_DONE;
	size_t nl;

	if (!cstring(msg, have, &off, &portal))
		return have < mlen ? PS_MORE : PS_PASS;
	name_off = off;
	if (!cstring(msg, have, &off, &name))
		return have < mlen ? PS_MORE : PS_PASS;
	c->pool->stats.bind_count++;
	if (!name[0])
		return PS_PASS;
	e = bound_entry(c, name, &rc, 'B');
	if (!e)
		return rc;
	nl = strlen(e->name) + 1;
	pkt_begin(&rt->pb, 'B');
	pkt_put_bytes(&rt->pb, msg + 5, name_off - 5);
	pkt_put_string(&rt->pb, e->name);
	pkt_end(&rt->pb);
	/* the length covers the rest of the message too, which the caller sends */
	{
		uint32_t total = mlen - 1 - (off - name_off) + (uint32_t)nl;
		uint8_t *lp = rt->pb.data + rt->pb.len - (5 + (name_off - 5) + nl) + 1;
		pkt_set_u32(lp, total);
	}
	if (!server_expect(c->link, 'B', RQ_FWD)) {
		pkt_reset(&rt->pb);
		return PS_DONE;
	}
	pkt_send(&rt->pb, bufferevent_get_output(c->link->bev));
	*used = off;
	return PS_DONE;
}

int ps_describe(struct client *c, const uint8_t *msg, uint32_t mlen)
{
	const char *name;
	uint32_t off = 6;
	struct ps_entry *e;
	int rc = PS_DONE;

	if (mlen < 7 || msg[5] != 'S' || !cstring(msg, mlen, &off, &name) || !name[0])
		return PS_PASS;
	e = bound_entry(c, name, &rc, 'D');
	if (!e)
		return rc;
	if (!server_expect(c->link, 'D', RQ_FWD))
		return PS_DONE;
	pkt_begin(&rt->pb, 'D');
	pkt_put_byte(&rt->pb, 'S');
	pkt_put_string(&rt->pb, e->name);
	pkt_end(&rt->pb);
	pkt_send(&rt->pb, bufferevent_get_output(c->link->bev));
	return PS_DONE;
}

int ps_close(struct client *c, const uint8_t *msg, uint32_t mlen)
{
	const char *name;
	uint32_t off = 6;
	struct ps_cname *cn;
	struct ps_entry *e, *parsed;
	int rc;

	if (mlen < 7 || msg[5] != 'S' || !cstring(msg, mlen, &off, &name) || !name[0])
		return PS_PASS;
	cn = cname_find(c, name, NULL);
	if (!cn)	/* PostgreSQL: closing what does not exist is no error */
		return synth(c, '3', 0, NULL, NULL, name);
	e = entry_ref(cn->e);
	parsed = entry_ref(cn->parsed);
	cname_del(c, cn);
	rc = synth(c, '3', RQ_UNDO_CL_CLOSE, e, parsed, name);
	entry_unref(parsed);
	entry_unref(e);
	return rc;
}

bool ps_reparse(struct client *c, const char *name, const char *sql)
{
	struct ps_cname *cn = cname_find(c, name, NULL);
	const uint8_t *types;
	uint32_t tlen, qlen = (uint32_t)strlen(sql) + 1;
	uint8_t *body;
	struct ps_entry *e;

	if (!cn)
		return false;	/* the Bind fails: no such statement */
	types = cn->e->body + strlen((const char *)cn->e->body) + 1;
	tlen = cn->e->blen - (uint32_t)(types - cn->e->body);
	body = malloc(qlen + tlen);
	if (!body)
		return false;
	memcpy(body, sql, qlen);
	memcpy(body + qlen, types, tlen);
	e = entry_get(body, qlen + tlen);
	free(body);
	if (!e)
		return false;
	/* in place: a skipped Parse of the name still finds it (name_undo) */
	if (!cn->parsed)
		cn->parsed = cn->e;
	else
		entry_unref(cn->e);
	cn->e = e;
	return true;
}

/* ================= SQL DEALLOCATE of a protocol-level name ================= */

/*
 * The statement the server runs in place of the client's DEALLOCATE: the
 * server does not have the client's name (its statement is LOKADB_<id>,
 * maybe shared), yet the client must get what PostgreSQL would give it:
 * the tag DEALLOCATE, or in a failed transaction the error 25P02, with the
 * transaction's state kept. So the server prepares and deallocates a
 * statement of the pooler's own.
 */
#define DEALLOC_STMT "lokadb_deallocate"

bool ps_deallocate_candidate(const uint8_t *msg, uint32_t have)
{
	uint32_t off = 5;

	if (msg[0] == 'P') {
		if (have < 6 || msg[5] != 0)
			return false;	/* a named Parse: the statement is not run by it */
		off = 6;
	}
	while (off < have && (msg[off] == ' ' || msg[off] == '\t' || msg[off] == '\n' || msg[off] == '\r'))
		off++;
	return have - off >= 10 && strncasecmp((const char *)msg + off, "deallocate", 10) == 0;
}

/* The lower-case ASCII word w at p, in any case (p may end first: its NUL differs). */
static bool word_at(const char *p, const char *w)
{
	for (; *w; p++, w++)
		if ((*p | 0x20) != *w)
			return false;
	return true;
}

/*
 * Whether sql names DISCARD or DEALLOCATE anywhere, in any case: the words
 * that may drop every prepared statement. Every Query of a client with the
 * core's prepared statements is looked at, so the text goes eight bytes at
 * a time, and only at a 'd' or 'D' is a word compared (by hand): two
 * strcasestr calls took a quarter of lokadb's instructions for a short
 * statement (doc/benchmarks.md, "The core's look for DISCARD and DEALLOCATE").
 */
bool ps_sql_names_drop_all(const char *sql, size_t n)
{
	size_t i = 0;

#ifdef PKT_WORD_SCAN
	for (; n - i >= 8; i += 8) {
		uint64_t v, z;
		memcpy(&v, sql + i, 8);
		/* 0 where 'd' or 'D' (and a flag maybe above one) */
		z = pkt_zero_bytes((v | 0x2020202020202020ull) ^ 0x6464646464646464ull);
		for (; z; z &= z - 1) {
			const char *p = sql + i + pkt_flag_byte(z);
			if ((*p | 0x20) == 'd' && (word_at(p + 1, "iscard") || word_at(p + 1, "eallocate")))
				return true;
		}
	}
#endif
	for (; i < n; i++)
		if ((sql[i] | 0x20) == 'd' && (word_at(sql + i + 1, "iscard") || word_at(sql + i + 1, "eallocate")))
			return true;
	return false;
}

/* The name of `DEALLOCATE [PREPARE] name` when that is all of sql (malloc'd), else NULL. */
char *ps_sql_deallocate_name(const char *sql)
{
	PgQueryProtobufParseResult pr = pg_query_parse_protobuf(sql);
	PgQuery__ParseResult *tree = NULL;
	char *name = NULL;

	if (!pr.error)
		tree = pg_query__parse_result__unpack(NULL, pr.parse_tree.len, (const uint8_t *)pr.parse_tree.data);
	if (tree && tree->n_stmts == 1 && tree->stmts[0]->stmt &&
	    tree->stmts[0]->stmt->node_case == PG_QUERY__NODE__NODE_DEALLOCATE_STMT &&
	    tree->stmts[0]->stmt->deallocate_stmt->name && tree->stmts[0]->stmt->deallocate_stmt->name[0])
		name = xstrdup(tree->stmts[0]->stmt->deallocate_stmt->name);
	if (tree)
		pg_query__parse_result__free_unpacked(tree, NULL);
	pg_query_free_protobuf_parse_result(pr);
	return name;
}

char *ps_deallocate_name_of(const uint8_t *msg, uint32_t mlen)
{
	const char *sql, *pname = "";
	uint32_t off = 5;

	if (msg[0] == 'P' && (!cstring(msg, mlen, &off, &pname) || pname[0]))
		return NULL;
	if (!cstring(msg, mlen, &off, &sql))
		return NULL;
	if (msg[0] == 'P' && (mlen - off != 2 || pkt_get_u16(msg + off) != 0))
		return NULL;		/* with parameter types: PostgreSQL says what is wrong */
	if (msg[0] == 'Q' && off != mlen)
		return NULL;
	return ps_sql_deallocate_name(sql);
}

char *ps_deallocate_of(struct client *c, const uint8_t *msg, uint32_t mlen)
{
	char *name = ps_deallocate_name_of(msg, mlen);

	if (name && !cname_find(c, name, NULL) && !ps_name_unsettled(c, name)) {
		free(name);
		return NULL;		/* not the client's protocol-level statement: the server's business */
	}
	return name;		/* (one whose Close is unanswered too: the caller waits, then asks again) */
}

bool ps_client_has(const struct client *c, const char *name)
{
	return cname_find(c, name, NULL) != NULL;
}

struct rq_item *ps_deallocate(struct client *c, char type, char *name)
{
	struct server *s = c->link;
	struct ps_cname *cn = cname_find(c, name, NULL);
	struct ps_entry *e, *parsed;
	struct rq_item *it;

	if (!cn) {		/* ps_deallocate_of() said it was there */
		free(name);
		return NULL;
	}
	e = entry_ref(cn->e);
	parsed = entry_ref(cn->parsed);
	cname_del(c, cn);
	c->pool->stats.client_parse_count += type == 'P';
	s->pool->stats.server_parse_count += 2;
	/* a Close first: a batch that never ran its Execute leaves the statement */
	pkt_close(&rt->pb, 'S', DEALLOC_STMT);
	pkt_parse(&rt->pb, DEALLOC_STMT, "SELECT");
	pkt_parse(&rt->pb, "", "DEALLOCATE " DEALLOC_STMT);
	it = server_expect(s, 'C', RQ_HIDE) && server_expect(s, 'P', RQ_HIDE) ?
	     server_expect(s, 'P', type == 'P' ? RQ_FWD : RQ_HIDE) : NULL;
	if (it && type == 'Q') {
		/* the Query as a batch of its own: the client gets the Execute's
		 * CommandComplete and the Sync's ReadyForQuery, a Query's replies
		 * (a Query drops the unnamed statement and portal too) */
		pkt_bind(&rt->pb, "", "");
		pkt_execute(&rt->pb, "");
		pkt_sync(&rt->pb);
		if (!server_expect(s, 'B', RQ_HIDE) || !server_expect(s, 'E', RQ_FWD) || !server_expect(s, 'S', RQ_FWD))
			it = NULL;
		else
			it = rq_at(&s->rq, s->rq.count - 4);	/* the unnamed Parse */
	}
	if (it) {
		/* an error before the Execute skips it: the name comes back (rq_discard_batch) */
		it->undo = RQ_UNDO_CL_CLOSE;
		it->e = entry_ref(e);
		it->e_parsed = entry_ref(parsed);
		it->name = name;
		name = NULL;
		pkt_send(&rt->pb, bufferevent_get_output(s->bev));
	} else {
		pkt_reset(&rt->pb);
	}
	free(name);
	entry_unref(parsed);
	entry_unref(e);
	return it;
}
