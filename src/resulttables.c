/* SPDX-License-Identifier: ISC */
/*
 * resulttables.c -- RowDescriptions told about the client's relations (see
 * resulttables.h).
 */
#include "resulttables.h"
#include "pktbuf.h"

#include <stdlib.h>
#include <string.h>

struct rt_entry {
	uint32_t oid, client_oid;	/* oid 0: an empty slot */
	uint32_t at, n;			/* its column pairs: nums[2 * at ...], n pairs */
};

struct lk_tables {
	uint32_t refs;
	uint32_t mask;			/* slots - 1 */
	struct rt_entry *slots;
	int16_t *nums;			/* (number in oid, number in client_oid) pairs */
};

static uint32_t slot_of(uint32_t oid, uint32_t mask)
{
	return (oid * 2654435761u) & mask;
}

static const struct rt_entry *find(const struct lk_tables *t, uint32_t oid)
{
	for (uint32_t i = slot_of(oid, t->mask);; i = (i + 1) & t->mask) {
		const struct rt_entry *e = &t->slots[i];
		if (e->oid == oid)
			return e;
		if (!e->oid)
			return NULL;
	}
}

/* "3:4,5:6" into pairs at out (NULL: count only). -1: not such a text. */
static int parse_nums(const char *s, int16_t *out)
{
	int n = 0;

	while (*s) {
		char *end;
		long a = strtol(s, &end, 10), b;
		if (end == s || *end != ':' || a <= 0 || a > 32767)
			return -1;
		s = end + 1;
		b = strtol(s, &end, 10);
		if (end == s || b <= 0 || b > 32767 || (*end && *end != ','))
			return -1;
		if (out) {
			out[2 * n] = (int16_t)a;
			out[2 * n + 1] = (int16_t)b;
		}
		n++;
		s = *end ? end + 1 : end;
	}
	return n;
}

struct lk_tables *rt_tables_new(const lk_table_oid *t, int n)
{
	struct lk_tables *r;
	uint32_t cap = 4, npairs = 0;

	if (n < 0 || (n && !t))
		return NULL;
	for (int i = 0; i < n; i++) {
		int k = t[i].attnums ? parse_nums(t[i].attnums, NULL) : 0;
		if (k < 0 || !t[i].oid || !t[i].client_oid)
			return NULL;
		npairs += (uint32_t)k;
	}
	while (cap < 2 * (uint32_t)n)
		cap *= 2;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->refs = 1;
	r->mask = cap - 1;
	r->slots = calloc(cap, sizeof(*r->slots));
	r->nums = malloc(sizeof(int16_t) * 2 * (npairs ? npairs : 1));
	if (!r->slots || !r->nums) {
		rt_tables_release(r);
		return NULL;
	}
	npairs = 0;
	for (int i = 0; i < n; i++) {
		uint32_t j = slot_of(t[i].oid, r->mask);
		while (r->slots[j].oid && r->slots[j].oid != t[i].oid)
			j = (j + 1) & r->mask;
		r->slots[j].oid = t[i].oid;
		r->slots[j].client_oid = t[i].client_oid;
		r->slots[j].at = npairs;
		r->slots[j].n = t[i].attnums ? (uint32_t)parse_nums(t[i].attnums, r->nums + 2 * npairs) : 0;
		npairs += r->slots[j].n;
	}
	return r;
}

struct lk_tables *rt_tables_ref(struct lk_tables *t)
{
	if (t)
		t->refs++;
	return t;
}

void rt_tables_release(struct lk_tables *t)
{
	if (!t || --t->refs)
		return;
	free(t->slots);
	free(t->nums);
	free(t);
}

/* The offset of the NUL ending the string at body[off], or len: eight bytes at a time (names are short). */
static uint32_t name_end(const uint8_t *body, uint32_t off, uint32_t len)
{
#ifdef PKT_WORD_SCAN
	for (; len - off >= 8; off += 8) {
		uint64_t v, z;
		memcpy(&v, body + off, 8);
		if ((z = pkt_zero_bytes(v)))
			return off + pkt_flag_byte(z);
	}
#endif
	while (off < len && body[off])
		off++;
	return off;
}

/* RowDescription: Int16 count, then per column a name, Int32 table OID,
 * Int16 column number, Int32 type, Int16 size, Int32 modifier, Int16 format.
 * One pass (a RowDescription cut short, which PostgreSQL does not send,
 * may be left changed up to where it ends). */
bool rt_fix_row_description(const struct lk_tables *t, uint8_t *body, uint32_t len)
{
	uint32_t off = 2, nf;

	if (len < 2)
		return false;
	nf = pkt_get_u16(body);
	for (uint32_t i = 0; i < nf; i++) {
		const struct rt_entry *e;
		uint8_t *f;
		uint32_t oid;
		off = name_end(body, off, len);
		if (len - off < 19)
			return false;
		f = body + off + 1;
		off += 19;
		oid = pkt_get_u32(f);
		if (!oid || !(e = find(t, oid)))
			continue;
		pkt_set_u32(f, e->client_oid);
		for (uint32_t k = 0; k < e->n; k++) {
			if (t->nums[2 * (e->at + k)] == (int16_t)pkt_get_u16(f + 4)) {
				pkt_set_u16(f + 4, (uint16_t)t->nums[2 * (e->at + k) + 1]);
				break;
			}
		}
	}
	return true;
}

/* (newest first: the unnamed portal and statement of each Bind are looked for most) */
static struct rt_name *name_find(const struct rt_names *r, char kind, const char *name)
{
	for (uint32_t i = r->n; i-- > 0;)
		if (r->v[i].kind == kind && strcmp(r->v[i].name, name) == 0)
			return &r->v[i];
	return NULL;
}

static void name_drop(struct rt_names *r, uint32_t i)
{
	rt_tables_release(r->v[i].t);
	free(r->v[i].name);
	memmove(&r->v[i], &r->v[i + 1], sizeof(r->v[0]) * (r->n - i - 1));
	r->n--;
}

bool rt_names_set(struct rt_names *r, char kind, const char *name, struct lk_tables *t)
{
	struct rt_name *e = name_find(r, kind, name ? name : "");

	if (e && t) {
		rt_tables_ref(t);
		rt_tables_release(e->t);
		e->t = t;
		return true;
	}
	if (e) {		/* none now */
		name_drop(r, (uint32_t)(e - r->v));
		return true;
	}
	if (!t)
		return true;
	if (r->n == RT_NAMES_MAX)
		name_drop(r, 0);	/* the oldest */
	if (r->n == r->cap) {
		uint32_t cap = r->cap ? r->cap * 2 : 4;
		struct rt_name *v = realloc(r->v, sizeof(*v) * cap);
		if (!v)
			return false;
		r->v = v;
		r->cap = cap;
	}
	e = &r->v[r->n];
	if (!(e->name = strdup(name ? name : "")))
		return false;
	e->kind = kind;
	e->t = rt_tables_ref(t);
	r->n++;
	return true;
}

struct lk_tables *rt_names_get(const struct rt_names *r, char kind, const char *name)
{
	const struct rt_name *e = r->n ? name_find(r, kind, name ? name : "") : NULL;

	return e ? e->t : NULL;
}

void rt_names_free(struct rt_names *r)
{
	for (uint32_t i = 0; i < r->n; i++) {
		rt_tables_release(r->v[i].t);
		free(r->v[i].name);
	}
	free(r->v);
	memset(r, 0, sizeof(*r));
}
