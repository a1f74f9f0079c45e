/* SPDX-License-Identifier: ISC */
/*
 * cache.c -- the parse cache: statement text -> or_analysis.
 *
 * A statement seen before costs one hash of its text and one comparison:
 * libpg_query runs only on a miss. The key is (text, sp_key), sp_key being
 * a hash of what name resolution depends on (search_path and user), so two
 * sessions with different search paths never share an analysis. An entry
 * also remembers the catalog version it was made with; a lookup under
 * another version analyzes the text again in place (the catalog changed:
 * a table was enabled, an organization isolated).
 *
 * Bounded: `capacity` entries in one array, chained hash buckets of entry
 * indexes, clock (second chance) eviction. Statements that touch no LokaDB
 * table are cached too: that is what makes them cheap to pass through.
 */
#include <stdlib.h>
#include <string.h>

#include "org_routing.h"

#define OR_CACHE_MIN 16

struct entry {
	char *sql;
	size_t len;
	uint64_t hash, sp_key, version;
	struct or_analysis a;
	struct or_rewrite_memo memo;
	uint64_t gen;			/* which text this slot holds (or_cache_ref): unique in the process */
	int next;			/* next entry in its bucket, -1 */
	bool live, ref;
};

struct or_cache {
	struct entry *e;
	int *bucket;
	size_t capacity, nbuckets, used, hand;
	struct or_cache_stats st;
};

uint64_t or_hash(const char *s, size_t n, uint64_t seed)
{
	const uint64_t k = 0x9e3779b97f4a7c15ull;
	uint64_t h = seed ^ (n * k);

	while (n >= 8) {
		uint64_t w;
		memcpy(&w, s, 8);
		h = (h ^ w) * k;
		h ^= h >> 29;
		s += 8;
		n -= 8;
	}
	if (n) {
		uint64_t w = 0;
		memcpy(&w, s, n);
		h = (h ^ w) * k;
	}
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ull;
	h ^= h >> 32;
	return h;
}

struct or_cache *or_cache_new(size_t capacity)
{
	struct or_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	if (capacity < OR_CACHE_MIN)
		capacity = OR_CACHE_MIN;
	c->capacity = capacity;
	c->nbuckets = 1;
	while (c->nbuckets < capacity)
		c->nbuckets <<= 1;
	c->e = calloc(capacity, sizeof(*c->e));
	c->bucket = malloc(c->nbuckets * sizeof(*c->bucket));
	if (!c->e || !c->bucket) {
		or_cache_free(c);
		return NULL;
	}
	for (size_t i = 0; i < c->nbuckets; i++)
		c->bucket[i] = -1;
	return c;
}

static void memo_clear(struct or_rewrite_memo *m)
{
	for (int i = 0; i < OR_MEMO_SLOTS; i++) {
		free(m->slot[i].org);
		free(m->slot[i].sql);
		or_template_free(m->slot[i].tpl);
	}
	memset(m, 0, sizeof(*m));
}

int or_memo_find(const struct or_rewrite_memo *m, const char *org, uint64_t version)
{
	for (int i = 0; i < OR_MEMO_SLOTS; i++)
		if (m->slot[i].org && m->slot[i].version == version && strcmp(m->slot[i].org, org) == 0)
			return i;
	return -1;
}

bool or_memo_get(const struct or_rewrite_memo *m, const char *org, uint64_t version, const char **sql)
{
	int i = or_memo_find(m, org, version);

	if (i < 0)
		return false;
	*sql = m->slot[i].sql;
	return true;
}

bool or_memo_put(struct or_rewrite_memo *m, const char *org, uint64_t version, char *sql)
{
	unsigned i = m->next;
	char *o = strdup(org);

	if (!o) {
		free(sql);
		return false;
	}
	for (unsigned k = 0; k < OR_MEMO_SLOTS; k++)	/* the same org with an older version first */
		if (m->slot[k].org && strcmp(m->slot[k].org, org) == 0)
			i = k;
	if (i == m->next)
		m->next = (m->next + 1) % OR_MEMO_SLOTS;
	free(m->slot[i].org);
	free(m->slot[i].sql);
	or_template_free(m->slot[i].tpl);
	m->slot[i].tpl = NULL;
	m->slot[i].org = o;
	m->slot[i].sql = sql;
	m->slot[i].version = version;
	return true;
}

static void entry_clear(struct entry *e)
{
	free(e->sql);
	or_analysis_free(&e->a);
	memo_clear(&e->memo);
	e->sql = NULL;
	e->live = false;
}

void or_cache_free(struct or_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; c->e && i < c->capacity; i++)
		entry_clear(&c->e[i]);
	free(c->e);
	free(c->bucket);
	free(c);
}

static void unlink_entry(struct or_cache *c, int idx)
{
	int *p = &c->bucket[c->e[idx].hash & (c->nbuckets - 1)];

	while (*p != -1 && *p != idx)
		p = &c->e[*p].next;
	if (*p == idx)
		*p = c->e[idx].next;
}

/* A free slot: the next one without its second chance, clock-wise. */
static int victim(struct or_cache *c)
{
	for (;;) {
		struct entry *e = &c->e[c->hand];
		int idx = (int)c->hand;

		c->hand = (c->hand + 1) % c->capacity;
		if (!e->live)
			return idx;
		if (e->ref) {
			e->ref = false;
			continue;
		}
		unlink_entry(c, idx);
		entry_clear(e);
		c->used--;
		c->st.evictions++;
		return idx;
	}
}

static int lookup(const struct or_cache *c, const char *sql, size_t len, uint64_t h, uint64_t sp_key)
{
	for (int i = c->bucket[h & (c->nbuckets - 1)]; i != -1; i = c->e[i].next) {
		const struct entry *e = &c->e[i];
		if (e->hash == h && e->sp_key == sp_key && e->len == len && memcmp(e->sql, sql, len) == 0)
			return i;
	}
	return -1;
}

/* The gens of entries, over every cache the process makes (a rebuilt cache
 * gives no old reference a new meaning). */
static uint64_t entry_gen;

const struct or_analysis *or_cache_get(struct or_cache *c, const char *sql, uint64_t sp_key,
				       uint64_t version, const struct or_names *names)
{
	return or_cache_get_ref(c, sql, sp_key, version, names, NULL);
}

const struct or_analysis *or_cache_at(struct or_cache *c, const struct or_cache_ref *ref, uint64_t sp_key,
				      uint64_t version)
{
	struct entry *e;

	if (!ref->gen || ref->idx >= c->capacity)
		return NULL;
	e = &c->e[ref->idx];
	if (!e->live || e->gen != ref->gen || e->sp_key != sp_key || e->version != version)
		return NULL;
	e->ref = true;
	c->st.hits++;
	return &e->a;
}

const struct or_analysis *or_cache_get_ref(struct or_cache *c, const char *sql, uint64_t sp_key,
					   uint64_t version, const struct or_names *names, struct or_cache_ref *ref)
{
	size_t len = strlen(sql);
	uint64_t h = or_hash(sql, len, sp_key);
	int i = lookup(c, sql, len, h, sp_key);
	struct entry *e;

	if (ref)
		ref->gen = 0;
	if (i >= 0) {
		e = &c->e[i];
		e->ref = true;
		if (ref) {
			ref->idx = (size_t)i;
			ref->gen = e->gen;
		}
		if (e->version == version) {
			c->st.hits++;
			return &e->a;
		}
		c->st.invalidations++;
		or_analysis_free(&e->a);
		memo_clear(&e->memo);
		e->version = version;
		if (!or_analyze(sql, names, &e->a)) {
			unlink_entry(c, i);
			entry_clear(e);
			c->used--;
			if (ref)
				ref->gen = 0;
			return NULL;
		}
		return &e->a;
	}
	c->st.misses++;
	i = victim(c);
	e = &c->e[i];
	e->sql = malloc(len + 1);
	if (!e->sql)
		return NULL;
	memcpy(e->sql, sql, len + 1);
	if (!or_analyze(sql, names, &e->a)) {
		free(e->sql);
		e->sql = NULL;
		return NULL;
	}
	e->len = len;
	e->hash = h;
	e->sp_key = sp_key;
	e->version = version;
	e->gen = ++entry_gen;
	e->ref = false;
	e->live = true;
	if (ref) {
		ref->idx = (size_t)i;
		ref->gen = e->gen;
	}
	e->next = c->bucket[h & (c->nbuckets - 1)];
	c->bucket[h & (c->nbuckets - 1)] = i;
	c->used++;
	return &e->a;
}

struct or_rewrite_memo *or_cache_memo(struct or_cache *c, const struct or_analysis *a)
{
	struct entry *e = (struct entry *)((char *)a - offsetof(struct entry, a));

	(void)c;
	return &e->memo;
}

void or_cache_stats(const struct or_cache *c, struct or_cache_stats *st)
{
	*st = c->st;
	st->entries = c->used;
	st->capacity = c->capacity;
}
