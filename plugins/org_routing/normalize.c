/* SPDX-License-Identifier: ISC */
/*
 * normalize.c -- statement texts with their literals replaced by
 * placeholders, so that `... WHERE organization_id = 17 AND id = 4`
 * and `... = 42 AND id = 9` share one analysis and one leaf rewrite.
 *
 * The tokens come from libpg_query's scanner (pg_query_scan: the lexer, no
 * parse; its protobuf result read by scan_tokens()). Integer constants and plain '...' strings become $1, $2, ... in
 * text order; everything else of the text is kept as written (so comments,
 * spacing and other constants are part of the key). Not normalized (the
 * caller uses the text itself): texts with $n parameters of their own,
 * strings with a prefix (E'', U&'', N''), a backslash or a continuation,
 * dollar quotes, integers after a + or - sign (PostgreSQL folds a negative
 * literal into the constant), texts with bytes 1 or 2 (the template marks).
 *
 * A rewrite made on the normalized text (deparsed, $k where the literals
 * were) becomes a template: its $k are found with the scanner again and
 * marked, and or_template_fill() puts the message's own literal texts back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pg_query.h>
#include <pg_query/pg_query.pb-c.h>

#include "org_routing.h"

#define TPL_MARK 0x01		/* \x01 k \x02 in a template: literal number k */
#define TPL_END 0x02

/* One token of pg_query_scan: the bytes [start, end) of the text. */
struct scan_tok {
	int64_t start, end, token;
};

static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; *p < end && shift < 64; shift += 7) {
		uint8_t b = *(*p)++;
		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

/* Skip a field of wire type wt; false on a type protobuf does not have here. */
static bool skip_field(const uint8_t **p, const uint8_t *end, unsigned wt)
{
	uint64_t v;

	switch (wt) {
	case 0:
		return get_varint(p, end, &v);
	case 1:
	case 5:
		v = wt == 1 ? 8 : 4;
		break;
	case 2:
		if (!get_varint(p, end, &v))
			return false;
		break;
	default:
		return false;
	}
	if (v > (uint64_t)(end - *p))
		return false;
	*p += v;
	return true;
}

/*
 * The tokens of `sql` (*n of them, caller frees), from pg_query_scan's
 * result, a ScanResult message (pg_query.proto: field 2, repeated ScanToken
 * {1 start, 2 end, 4 token, 5 keyword_kind}). Its three integer fields per
 * token are read straight from the protobuf encoding: protobuf-c's
 * generic unpack allocates a message per token and then frees them, which
 * cost more than the scan itself (measured: 24,000 of the 78,000
 * instructions per statement of or_normalize). NULL: a scan error, or an
 * encoding not as above.
 */
static struct scan_tok *scan_tokens(const char *sql, size_t *n)
{
	PgQueryScanResult sr = pg_query_scan(sql);
	const uint8_t *p = (const uint8_t *)sr.pbuf.data, *end = p + sr.pbuf.len;
	struct scan_tok *v = NULL;
	size_t cap = 0;
	bool ok = !sr.error;

	*n = 0;
	while (ok && p < end) {
		uint64_t tag, len;
		const uint8_t *mend;
		struct scan_tok t = { -1, -1, -1 };
		ok = get_varint(&p, end, &tag);
		if (!ok || tag != ((2u << 3) | 2u)) {	/* not a token: skipped */
			ok = ok && skip_field(&p, end, (unsigned)(tag & 7));
			continue;
		}
		if (!(ok = get_varint(&p, end, &len) && len <= (uint64_t)(end - p)))
			break;
		mend = p + len;
		t.start = t.end = 0;
		t.token = 0;
		while (ok && p < mend) {
			uint64_t ftag, val;
			ok = get_varint(&p, mend, &ftag);
			if (ok && (ftag & 7) == 0 && ((ftag >> 3) == 1 || (ftag >> 3) == 2 || (ftag >> 3) == 4)) {
				ok = get_varint(&p, mend, &val);
				if ((ftag >> 3) == 1)
					t.start = (int64_t)(int32_t)val;
				else if ((ftag >> 3) == 2)
					t.end = (int64_t)(int32_t)val;
				else
					t.token = (int64_t)(int32_t)val;
			} else if (ok) {
				ok = skip_field(&p, mend, (unsigned)(ftag & 7));
			}
		}
		if (!ok)
			break;
		if (*n == cap) {
			struct scan_tok *nv = realloc(v, sizeof(*v) * (cap = cap ? cap * 2 : 32));
			if (!(ok = nv != NULL))
				break;
			v = nv;
		}
		v[(*n)++] = t;
	}
	pg_query_free_scan_result(sr);
	if (!ok || !v) {
		free(v);
		*n = 0;
		return ok ? calloc(1, sizeof(*v)) : NULL;	/* no token at all: an empty array */
	}
	return v;
}

void or_norm_free(struct or_norm *n)
{
	for (int i = 0; i < n->n; i++) {
		free(n->vals[i]);
		free(n->toks[i]);
	}
	free(n->vals);
	free(n->toks);
	free(n->text);
	memset(n, 0, sizeof(*n));
}

/* The value of a plain '...' string token (quotes undoubled); NULL if it is not one. */
static char *string_value(const char *t, size_t len)
{
	char *v;
	size_t o = 0;

	if (len < 2 || t[0] != '\'' || t[len - 1] != '\'')
		return NULL;
	v = malloc(len);
	if (!v)
		return NULL;
	for (size_t i = 1; i + 1 < len; i++) {
		if (t[i] == '\\') {
			free(v);
			return NULL;
		}
		if (t[i] == '\'') {
			if (i + 2 >= len || t[i + 1] != '\'') {	/* 'a' 'b' continuation */
				free(v);
				return NULL;
			}
			i++;
		}
		v[o++] = t[i];
	}
	v[o] = 0;
	return v;
}

/* An integer token's value as the parser prints it (const_text: "%d"). */
static char *integer_value(const char *t, size_t len)
{
	char buf[32], *end, *v;
	long long x;

	if (len == 0 || len >= sizeof(buf))
		return NULL;
	memcpy(buf, t, len);
	buf[len] = 0;
	x = strtoll(buf, &end, 10);
	if (*end || x > 2147483647LL)
		return NULL;	/* hex/octal/binary or underscores (PostgreSQL 16), or an int8 */
	v = malloc(24);
	if (v)
		snprintf(v, 24, "%lld", x);
	return v;
}

static bool push_lit(struct or_norm *n, char *val, const char *tok, size_t len)
{
	char **v = realloc(n->vals, sizeof(*v) * (size_t)(n->n + 1)), **t;

	if (!v)
		return false;
	n->vals = v;
	t = realloc(n->toks, sizeof(*t) * (size_t)(n->n + 1));
	if (!t)
		return false;
	n->toks = t;
	if (!(t[n->n] = strndup(tok, len)))
		return false;
	v[n->n++] = val;
	return true;
}

bool or_normalize(const char *sql, struct or_norm *out)
{
	struct scan_tok *tokens;
	size_t len = strlen(sql), cap, o = 0, from = 0, ntokens;
	bool ok = true;

	memset(out, 0, sizeof(*out));
	if (strchr(sql, TPL_MARK) || strchr(sql, TPL_END) || (!strchr(sql, '\'') && !strpbrk(sql, "0123456789")))
		return false;
	if (!(tokens = scan_tokens(sql, &ntokens)))
		return false;
	cap = len + 16;
	out->text = malloc(cap);
	if (!out->text)
		ok = false;
	for (size_t i = 0; ok && i < ntokens; i++) {
		const struct scan_tok *t = &tokens[i];
		size_t s = (size_t)t->start, e = (size_t)t->end;
		char *val = NULL, ph[16];
		int64_t tok = t->token;

		if (tok == PG_QUERY__TOKEN__PARAM) {
			ok = false;	/* parameters of its own: the placeholders would mix */
			break;
		}
		if (t->start < 0 || t->end < 0 || e > len || s > e || s < from)
			ok = false;
		else if (tok == PG_QUERY__TOKEN__ICONST &&
			 !(i > 0 && (tokens[i - 1].token == PG_QUERY__TOKEN__ASCII_45 ||
				     tokens[i - 1].token == PG_QUERY__TOKEN__ASCII_43)))
			val = integer_value(sql + s, e - s);
		else if (tok == PG_QUERY__TOKEN__SCONST)
			val = string_value(sql + s, e - s);
		if (!ok || !val)
			continue;
		if (!push_lit(out, val, sql + s, e - s)) {
			free(val);
			ok = false;
			break;
		}
		snprintf(ph, sizeof(ph), "$%d", out->n);
		if (o + (s - from) + strlen(ph) + 1 > cap) {
			char *nt;
			cap = (o + (s - from) + strlen(ph) + 1) * 2;
			if (!(nt = realloc(out->text, cap))) {
				ok = false;
				break;
			}
			out->text = nt;
		}
		memcpy(out->text + o, sql + from, s - from);
		o += s - from;
		memcpy(out->text + o, ph, strlen(ph));
		o += strlen(ph);
		from = e;
	}
	free(tokens);
	if (ok && out->n > 0) {
		char *nt = realloc(out->text, o + (len - from) + 1);
		if (nt) {
			out->text = nt;
			memcpy(out->text + o, sql + from, len - from);
			out->text[o + (len - from)] = 0;
			return true;
		}
	}
	or_norm_free(out);
	return false;
}

char *or_template_encode(const char *sql, int nlits)
{
	struct scan_tok *tokens;
	size_t len = strlen(sql), o = 0, from = 0, ntokens;
	char *out = NULL, *seen = NULL;
	bool ok = true;

	if (strchr(sql, TPL_MARK) || strchr(sql, TPL_END))
		return NULL;
	if (!(tokens = scan_tokens(sql, &ntokens)))
		return NULL;
	out = malloc(len + 1 + 8 * (size_t)nlits);	/* "$k" becomes \x01 k \x02: 1 byte more each */
	seen = calloc((size_t)nlits + 1, 1);
	if (!out || !seen)
		ok = false;
	for (size_t i = 0; ok && i < ntokens; i++) {
		const struct scan_tok *t = &tokens[i];
		size_t s = (size_t)t->start, e = (size_t)t->end;
		long k;
		char *end;

		if (t->token != PG_QUERY__TOKEN__PARAM)
			continue;
		if (t->start < 0 || t->end < 0 || e > len || s < from || s > e || e - s < 2 || sql[s] != '$') {
			ok = false;
			break;
		}
		k = strtol(sql + s + 1, &end, 10);
		if (end != sql + e || k < 1 || k > nlits || seen[k]) {
			ok = false;	/* each placeholder exactly once */
			break;
		}
		seen[k] = 1;
		memcpy(out + o, sql + from, s - from);
		o += s - from;
		o += (size_t)sprintf(out + o, "%c%ld%c", TPL_MARK, k, TPL_END);
		from = e;
	}
	free(tokens);
	for (int k = 1; ok && k <= nlits; k++)
		if (!seen[k])
			ok = false;
	free(seen);
	if (!ok) {
		free(out);
		return NULL;
	}
	memcpy(out + o, sql + from, len - from);
	out[o + (len - from)] = 0;
	return out;
}

char *or_template_fill(const char *tpl, const struct or_norm *n)
{
	size_t cap = strlen(tpl) + 1, o = 0;
	char *out;

	for (int i = 0; i < n->n; i++)
		cap += strlen(n->toks[i]);
	if (!(out = malloc(cap)))
		return NULL;
	for (const char *p = tpl; *p;) {
		if (*p == TPL_MARK) {
			char *end;
			long k = strtol(p + 1, &end, 10);
			if (*end != TPL_END || k < 1 || k > n->n) {
				free(out);
				return NULL;
			}
			size_t l = strlen(n->toks[k - 1]);
			memcpy(out + o, n->toks[k - 1], l);
			o += l;
			p = end + 1;
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = 0;
	return out;
}
