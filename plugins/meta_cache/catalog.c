/* SPDX-License-Identifier: ISC */
/*
 * catalog.c -- one loaded LokaDB catalog and the lookups on it.
 *
 * A catalog (struct mc_cat) is built in one go from the result of
 * MC_LOAD_SQL and never changed afterwards: a reload builds a new one and
 * frees the old one, so a lookup can never see half of a load. Every string
 * of a catalog lives in its chunk list (`strings`) and goes with it.
 *
 * Lookups are hash lookups (open addressing, linear probing, at most half
 * full), so they cost the same with 10 or 10,000 organizations. The
 * search_path walk parses the setting's text on every call; callers cache
 * what they resolved (org_routing caches per statement text).
 *
 * Invariants:
 *   - a struct mc_cat is immutable after mc_cat_build / mc_cat_empty;
 *   - pointers into it are valid until mc_cat_free of that catalog.
 */
#include "mc.h"

#include <errno.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MC_NAMEDATALEN 64	/* PostgreSQL's NAMEDATALEN: identifiers keep 63 bytes */
#define MC_CHUNK_SIZE 16384
#define MC_ORG_PARTS_SCAN 8	/* mc_cat_leaf compares up to this many partitions of an organization */

/* ------------------------------------------------------------- strings -- */

struct mc_chunk {
	struct mc_chunk *next;
	size_t used, size;
	char data[];
};

/* A copy of s (NULL stays NULL) in the catalog's chunks; NULL with *oom set when out of memory. */
static const char *cat_strdup(struct mc_cat *cat, const char *s, int *oom)
{
	struct mc_chunk *ch = cat->strings;
	size_t n;

	if (s == NULL)
		return NULL;
	n = strlen(s) + 1;
	if (ch == NULL || ch->size - ch->used < n) {
		size_t size = n > MC_CHUNK_SIZE ? n : MC_CHUNK_SIZE;

		ch = malloc(sizeof(*ch) + size);
		if (ch == NULL) {
			*oom = 1;
			return NULL;
		}
		ch->used = 0;
		ch->size = size;
		ch->next = cat->strings;
		cat->strings = ch;
	}
	memcpy(ch->data + ch->used, s, n);
	ch->used += n;
	return ch->data + ch->used - n;
}

/* ------------------------------------------------------------ hash map -- */

/* FNV-1a over the key parts, each followed by a separator byte. */
static uint64_t key_hash(const char *a, const char *b, const char *c)
{
	const char *parts[3] = { a, b, c };
	uint64_t h = 1469598103934665603ull;

	for (int i = 0; i < 3 && parts[i] != NULL; i++) {
		for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++)
			h = (h ^ *p) * 1099511628211ull;
		h = (h ^ 0xffu) * 1099511628211ull;
	}
	return h;
}

static int key_eq(const struct mc_slot *s, uint64_t h, const char *a, const char *b, const char *c)
{
	if (s->h != h || strcmp(s->k[0], a) != 0)
		return 0;
	if ((s->k[1] == NULL) != (b == NULL) || (b != NULL && strcmp(s->k[1], b) != 0))
		return 0;
	return (s->k[2] == NULL) == (c == NULL) && (c == NULL || strcmp(s->k[2], c) == 0);
}

/* Room for n keys at most half full. 0, or -1 when out of memory. */
static int map_init(struct mc_map *m, size_t n)
{
	size_t cap = 8;

	while (cap < 2 * n)
		cap *= 2;
	m->slots = calloc(cap, sizeof(*m->slots));
	if (m->slots == NULL)
		return -1;
	m->mask = cap - 1;
	return 0;
}

static void map_free(struct mc_map *m)
{
	free(m->slots);
	m->slots = NULL;
}

/* Insert a key (the strings must outlive the map); a duplicate key keeps the first value. */
static void map_put(struct mc_map *m, const char *a, const char *b, const char *c, const void *val)
{
	uint64_t h = key_hash(a, b, c);
	size_t i = (size_t)h & m->mask;

	while (m->slots[i].val != NULL) {
		if (key_eq(&m->slots[i], h, a, b, c))
			return;
		i = (i + 1) & m->mask;
	}
	m->slots[i].h = h;
	m->slots[i].k[0] = a;
	m->slots[i].k[1] = b;
	m->slots[i].k[2] = c;
	m->slots[i].val = val;
}

static const void *map_get(const struct mc_map *m, const char *a, const char *b, const char *c)
{
	uint64_t h;
	size_t i;

	if (m->slots == NULL || a == NULL)
		return NULL;
	h = key_hash(a, b, c);
	for (i = (size_t)h & m->mask; m->slots[i].val != NULL; i = (i + 1) & m->mask)
		if (key_eq(&m->slots[i], h, a, b, c))
			return m->slots[i].val;
	return NULL;
}

/* ------------------------------------------------------------ building -- */

int mc_ident_parse(const char *version, const char *oid, const char *guards, const char *readers,
		   struct mc_ident *out)
{
	char *end;
	unsigned long long v = 0, o = 0;
	uint64_t h = 14695981039346656037ULL;	/* FNV-1a */

	for (const char *p = guards; p && *p; p++)
		h = (h ^ (uint8_t)*p) * 1099511628211ULL;
	out->guards = h;
	out->readers = !(readers && (strcmp(readers, "false") == 0 || strcmp(readers, "f") == 0));
	out->installed = 1;
	if (version != NULL && *version != '\0') {
		errno = 0;
		v = strtoull(version, &end, 10);
		if (errno != 0 || *end != '\0')
			return -1;
	}
	if (oid != NULL && *oid != '\0') {
		errno = 0;
		o = strtoull(oid, &end, 10);
		if (errno != 0 || *end != '\0' || o > UINT32_MAX)
			return -1;
	}
	out->version = v;
	out->meta_oid = (uint32_t)o;
	return 0;
}

struct mc_cat *mc_cat_empty(void)
{
	struct mc_cat *cat = calloc(1, sizeof(*cat));

	if (cat == NULL)
		return NULL;
	if (map_init(&cat->by_table, 0) != 0 || map_init(&cat->by_org, 0) != 0 ||
	    map_init(&cat->by_part, 0) != 0 || map_init(&cat->shadows, 0) != 0) {
		mc_cat_free(cat);
		return NULL;
	}
	return cat;
}

void mc_cat_free(struct mc_cat *cat)
{
	struct mc_chunk *ch, *next;

	if (cat == NULL)
		return;
	map_free(&cat->by_table);
	map_free(&cat->by_org);
	map_free(&cat->by_part);
	map_free(&cat->shadows);
	free(cat->tables);
	free(cat->orgs);
	free(cat->parts);
	free(cat->org_parts);
	free(cat->rels);
	for (ch = cat->strings; ch != NULL; ch = next) {
		next = ch->next;
		free(ch);
	}
	free(cat);
}

static const char *val(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

static int is_true(const char *s)
{
	return s != NULL && (strcmp(s, "true") == 0 || strcmp(s, "t") == 0);
}

/* A hash of row i (NULL and "" differ), summed into the fingerprint: order does not matter. */
static uint64_t row_hash(const PGresult *r, int i)
{
	uint64_t h = 0;

	for (int k = 0; k < PQnfields(r); k++)
		h = h * 31 + (PQgetisnull(r, i, k) ? 0x9e3779b97f4a7c15ull
				: key_hash(PQgetvalue(r, i, k), NULL, NULL));
	return h;
}

/* An OID's text, or 0. */
static uint32_t oid_of(const char *s)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	return *s && !*end && v <= UINT32_MAX ? (uint32_t)v : 0;
}

/* Copy row `i` (kind t, o, p, r or s) into the catalog. 0, or -1 when out of memory. */
static int add_row(struct mc_cat *cat, const PGresult *r, int i)
{
	const char *kind = PQgetvalue(r, i, 0);
	const char *f[7];
	int oom = 0;

	for (int k = 0; k < 7; k++)
		f[k] = cat_strdup(cat, val(r, i, k + 1), &oom);
	if (oom)
		return -1;
	cat->fingerprint += row_hash(r, i);
	/* The key columns are NOT NULL in the catalog; a row without them is skipped. */
	if (f[0] == NULL || (kind[0] != 'o' && f[1] == NULL))
		return 0;
	switch (kind[0]) {
	case 't': {
		struct mc_table *t = &cat->tables[cat->n_tables++];

		*t = (struct mc_table){ f[0], f[1], f[2], f[3], f[4], f[5] };
		map_put(&cat->by_table, t->schema, t->name, NULL, t);
		break;
	}
	case 'o': {
		struct mc_org *o = &cat->orgs[cat->n_orgs++];

		*o = (struct mc_org){ f[0], f[1], f[2], f[3], f[4], is_true(f[5]), is_true(f[6]) };
		map_put(&cat->by_org, o->id, NULL, NULL, o);
		break;
	}
	case 'p': {
		struct mc_part *p;

		if (f[2] == NULL)
			return 0;
		p = &cat->parts[cat->n_parts++];
		*p = (struct mc_part){ f[0], f[1], f[2], f[3], f[4], NULL };
		map_put(&cat->by_part, p->schema, p->name, p->org_id, p);
		break;
	}
	case 'r': {
		uint32_t oid = oid_of(f[0]), table_oid = oid_of(f[1]);
		if (oid && table_oid)
			cat->rels[cat->n_rels++] = (struct mc_rel){ oid, table_oid, f[2] };
		break;
	}
	case 's':
		cat->n_shadows++;
		map_put(&cat->shadows, f[0], f[1], NULL, f[1]);
		break;
	}
	return 0;
}

/* Each organization's partitions in a list of their own (mc_cat_leaf), in
 * the catalog's order (the first of a repeated key wins, as in by_part). */
static void link_org_parts(struct mc_cat *cat)
{
	for (size_t k = cat->n_parts; k-- > 0;) {
		struct mc_part *p = &cat->parts[k];
		const struct mc_org *o = map_get(&cat->by_org, p->org_id, NULL, NULL);
		struct mc_org_parts *op;

		if (o == NULL)
			continue;	/* (mc_cat_leaf asks for the organization first) */
		op = &cat->org_parts[o - cat->orgs];
		p->next_of_org = op->first;
		op->first = p;
		op->n++;
	}
}

struct mc_cat *mc_cat_build(const struct pg_result *res, char *err, size_t errlen)
{
	const PGresult *r = (const PGresult *)res;
	size_t counts[5] = { 0, 0, 0, 0, 0 };	/* t, o, p, s, r */
	struct mc_cat *cat;
	int n, i, have_v = 0;

	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQnfields(r) != 8) {
		snprintf(err, errlen, "unexpected result of the catalog query");
		return NULL;
	}
	n = PQntuples(r);
	for (i = 0; i < n; i++) {
		const char *k = PQgetvalue(r, i, 0);
		const char *at = strchr("topsr", k[0]);

		if (k[0] != '\0' && at != NULL)
			counts[at - "topsr"]++;
	}
	cat = calloc(1, sizeof(*cat));
	if (cat == NULL)
		goto oom;
	cat->tables = calloc(counts[0] + 1, sizeof(*cat->tables));
	cat->orgs = calloc(counts[1] + 1, sizeof(*cat->orgs));
	cat->parts = calloc(counts[2] + 1, sizeof(*cat->parts));
	cat->org_parts = calloc(counts[1] + 1, sizeof(*cat->org_parts));
	cat->rels = calloc(counts[4] + 1, sizeof(*cat->rels));
	if (cat->tables == NULL || cat->orgs == NULL || cat->parts == NULL || cat->org_parts == NULL ||
	    cat->rels == NULL ||
	    map_init(&cat->by_table, counts[0]) != 0 || map_init(&cat->by_org, counts[1]) != 0 ||
	    map_init(&cat->by_part, counts[2]) != 0 || map_init(&cat->shadows, counts[3]) != 0)
		goto oom;
	for (i = 0; i < n; i++) {
		if (PQgetvalue(r, i, 0)[0] == 'v') {
			if (mc_ident_parse(val(r, i, 1), val(r, i, 2), val(r, i, 3), val(r, i, 4), &cat->id) != 0) {
				snprintf(err, errlen, "lokadb.meta version \"%s\" is not a number",
					 val(r, i, 1) ? val(r, i, 1) : "");
				mc_cat_free(cat);
				return NULL;
			}
			have_v = 1;
		} else if (add_row(cat, r, i) != 0) {
			goto oom;
		}
	}
	if (!have_v) {
		snprintf(err, errlen, "the catalog query returned no version row");
		mc_cat_free(cat);
		return NULL;
	}
	link_org_parts(cat);
	return cat;
oom:
	snprintf(err, errlen, "out of memory loading the catalog");
	mc_cat_free(cat);
	return NULL;
}

/* ------------------------------------------------------------- lookups -- */

const struct mc_table *mc_cat_table(const struct mc_cat *cat, const char *schema, const char *name)
{
	if (cat == NULL || schema == NULL || name == NULL)
		return NULL;
	return map_get(&cat->by_table, schema, name, NULL);
}

const struct mc_org *mc_cat_org(const struct mc_cat *cat, const char *id)
{
	const struct mc_org *o;

	if (cat == NULL || id == NULL)
		return NULL;
	if (cat->last_org != NULL && strcmp(cat->last_org->id, id) == 0)
		return cat->last_org;
	o = map_get(&cat->by_org, id, NULL, NULL);
	if (o != NULL)
		((struct mc_cat *)cat)->last_org = o;	/* the memo: lives and dies with the catalog */
	return o;
}

const char *mc_cat_leaf(const struct mc_cat *cat, const char *schema, const char *name,
			const char *org_id)
{
	const struct mc_part *p;
	const struct mc_org *o = mc_cat_org(cat, org_id);
	const struct mc_org_parts *op;

	if (o == NULL || !o->isolated || schema == NULL || name == NULL)
		return NULL;
	/* The organization's own few partitions (one per LokaDB table) are
	 * compared by name, cheaper than hashing three strings into a table of
	 * every organization's; the table when there are many. */
	op = cat->org_parts != NULL ? &cat->org_parts[o - cat->orgs] : NULL;
	if (op == NULL || op->n > MC_ORG_PARTS_SCAN) {
		p = map_get(&cat->by_part, schema, name, org_id);
		return p != NULL ? p->leaf : NULL;
	}
	for (p = op->first; p != NULL; p = p->next_of_org)
		if (strcmp(p->name, name) == 0 && strcmp(p->schema, schema) == 0)
			return p->leaf;
	return NULL;
}

/* ---------------------------------------------------------- search_path -- */

static int is_space(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

/*
 * The next element of a search_path value, as PostgreSQL's
 * SplitIdentifierString reads it: "quoted" (with "" for a quote) kept as is,
 * unquoted downcased (ASCII) and ended by a comma or blank; both truncated to
 * 63 bytes. *pp advances past the element and its comma.
 * Returns 1 with the element in out, 0 at the end, -1 when the text is not
 * a valid list (PostgreSQL would not have accepted it).
 */
static int next_schema(const char **pp, char out[MC_NAMEDATALEN])
{
	const char *p = *pp;
	size_t n = 0;

	while (is_space(*p))
		p++;
	if (*p == '\0')
		return 0;
	if (*p == '"') {
		for (p++;; p++) {
			if (*p == '\0')
				return -1;
			if (*p == '"') {
				if (p[1] != '"')
					break;
				p++;
			}
			if (n < MC_NAMEDATALEN - 1)
				out[n++] = *p;
		}
		p++;
		if (n == 0)
			return -1;
	} else {
		for (; *p != '\0' && *p != ',' && !is_space(*p); p++) {
			char ch = *p;

			if (ch >= 'A' && ch <= 'Z')
				ch = (char)(ch - 'A' + 'a');
			if (n < MC_NAMEDATALEN - 1)
				out[n++] = ch;
		}
		if (n == 0)
			return -1;
	}
	out[n] = '\0';
	while (is_space(*p))
		p++;
	if (*p == ',') {
		p++;
		while (is_space(*p))
			p++;
		if (*p == '\0')
			return -1;	/* a trailing comma */
	} else if (*p != '\0') {
		return -1;
	}
	*pp = p;
	return 1;
}

const struct mc_table *mc_cat_search(const struct mc_cat *cat, const char *name,
				     const char *search_path, const char *user)
{
	char schema[MC_NAMEDATALEN];
	const char *p = search_path != NULL ? search_path : "\"$user\", public";
	int rc;

	if (cat == NULL || name == NULL || cat->n_tables == 0)
		return NULL;
	while ((rc = next_schema(&p, schema)) == 1) {
		const char *s = schema;
		const struct mc_table *t;

		if (strcmp(s, "$user") == 0) {
			if (user == NULL || *user == '\0')
				continue;
			s = user;
		}
		if (strcmp(s, "pg_catalog") == 0 || strcmp(s, "pg_temp") == 0)
			continue;
		t = map_get(&cat->by_table, s, name, NULL);
		if (t != NULL)
			return t;
		if (map_get(&cat->shadows, s, name, NULL) != NULL)
			return NULL;	/* another relation of that name comes first */
	}
	return NULL;
}
