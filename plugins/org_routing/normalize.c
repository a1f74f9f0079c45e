/* SPDX-License-Identifier: ISC */
/*
 * normalize.c -- statement texts with their literals replaced by
 * placeholders, so that `... WHERE organization_id = 17 AND id = 4`
 * and `... = 42 AND id = 9` share one analysis and one leaf rewrite.
 *
 * The tokens come from libpg_query's scanner (pg_query_scan: the lexer, no
 * parse; its protobuf result read by or_scan_tokens()). Integer constants
 * and plain '...' strings become $1, $2, ... in text order; everything
 * else of the text is kept as written (so comments, spacing and other
 * constants are part of the key). Not normalized (the
 * caller uses the text itself): texts with $n parameters of their own,
 * strings with a prefix (E'', U&'', N''), a backslash or a continuation,
 * dollar quotes, integers after a + or - sign (PostgreSQL folds a negative
 * literal into the constant), texts with bytes 1 or 2 (the template marks).
 *
 * A rewrite made on the normalized text ($k where the literals were)
 * becomes a template: its $k are found with the scanner again and
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
struct or_tok *or_scan_tokens(const char *sql, size_t *n)
{
	PgQueryScanResult sr = pg_query_scan(sql);
	const uint8_t *p = (const uint8_t *)sr.pbuf.data, *end = p + sr.pbuf.len;
	struct or_tok *v = NULL;
	size_t cap = 0;
	bool ok = !sr.error;

	*n = 0;
	while (ok && p < end) {
		uint64_t tag, len;
		const uint8_t *mend;
		struct or_tok t = { -1, -1, -1 };
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
			struct or_tok *nv = realloc(v, sizeof(*v) * (cap = cap ? cap * 2 : 32));
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

#define IS_DIGIT(c) ((unsigned)((unsigned char)(c) - '0') < 10u)

/*
 * One allocation is kept from message to message (route_now normalizes one
 * text at a time): norm_alloc() lends it while it is free and large enough
 * for the text (grown up to NORM_KEEP_MAX), or_norm_free() gives it back.
 * Not with AddressSanitizer, which then still catches a use after free.
 */
#if defined(__SANITIZE_ADDRESS__)
#define NORM_KEEP_MAX 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NORM_KEEP_MAX 0
#endif
#endif
#ifndef NORM_KEEP_MAX
#define NORM_KEEP_MAX 65536
#endif
static const size_t norm_keep_max = NORM_KEEP_MAX;
static char *keep_mem;
static size_t keep_cap;
static bool keep_lent;

void or_norm_free(struct or_norm *n)
{
	if (n->mem && n->mem == keep_mem)
		keep_lent = false;
	else
		free(n->mem);
	memset(n, 0, sizeof(*n));
}

/*
 * One allocation for a normalized text: room for `cap` literals taken from
 * a text of `len` bytes (their texts and values, NUL-terminated: a value is
 * never longer than its text) and a normalized text of `textcap` bytes.
 */
static bool norm_alloc(struct or_norm *n, int cap, size_t len, size_t textcap)
{
	size_t ptrs = 2 * (size_t)cap * sizeof(char *), lens = (size_t)cap * sizeof(uint32_t);
	size_t room = 2 * (len + (size_t)cap);
	char *m;

	size_t need = ptrs + lens + textcap + room;

	memset(n, 0, sizeof(*n));
	if (!keep_lent && need <= norm_keep_max && need > keep_cap) {
		free(keep_mem);
		keep_cap = need < 1024 ? 1024 : need;
		if (!(keep_mem = malloc(keep_cap)))
			keep_cap = 0;
	}
	if (!keep_lent && need <= keep_cap) {
		m = keep_mem;
		keep_lent = true;
	} else if (!(m = malloc(need))) {
		return false;
	}
	n->mem = m;
	n->vals = (char **)(void *)m;
	n->toks = n->vals + cap;
	n->lens = (uint32_t *)(void *)(m + ptrs);
	n->text = m + ptrs + lens;
	n->arena = n->text + textcap;
	n->room = room;
	n->cap = cap;
	return true;
}

/* An integer token's value as the parser prints it (const_text: "%d"). */
size_t or_format_int(long long x, char *out)
{
	char tmp[24];
	unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
	size_t n = 0, o = 0;

	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (x < 0)
		out[o++] = '-';
	while (n)
		out[o++] = tmp[--n];
	out[o] = 0;
	return o;
}

/* The number of digits of k > 0 (the length of "$k" less one). */
static size_t ndigits(unsigned k)
{
	size_t d = 1;

	while (k >= 10) {
		k /= 10;
		d++;
	}
	return d;
}

/*
 * The literal `tok` (len bytes) as the next placeholder, its text and its
 * value written into the arena: an integer ('i': digits only, below 2^31,
 * printed as the parser prints it) or a plain '...' string ('s': quotes
 * undoubled). false: not one that is replaced (hex/octal/binary or
 * underscores (PostgreSQL 16), an int8, a backslash, a 'a' 'b'
 * continuation), or no room (never with norm_alloc's sizes).
 */
#define LIT_DIGITS 1u	/* push_lit: the caller saw an integer of digits only */
#define LIT_PLAIN 2u	/* ... a string with no quote or backslash between its quotes */

static bool push_lit(struct or_norm *n, char kind, const char *tok, size_t len, unsigned known)
{
	char *t = n->arena + n->used, *v = t + len + 1;
	size_t o = 0;

	if (n->n >= n->cap || n->used + 2 * (len + 1) > n->room)
		return false;
	if (kind == 'i' && (known & LIT_DIGITS) && len >= 1 && len <= 9 && tok[0] != '0') {
		memcpy(v, tok, len);	/* below 10^9: an int4 printed as written */
		v[len] = 0;
		o = len;
	} else if (kind == 's' && (known & LIT_PLAIN) && len >= 2) {
		o = len - 2;
		memcpy(v, tok + 1, o);
		v[o] = 0;
	} else if (kind == 'i') {
		uint64_t x = 0;
		if (len == 0 || len >= 32)
			return false;
		for (size_t i = 0; i < len; i++) {
			if (!IS_DIGIT(tok[i]))
				return false;
			x = x * 10 + (uint64_t)(tok[i] - '0');
			if (x > 2147483647u)
				return false;
		}
		if (tok[0] != '0' || len == 1) {	/* printed as written */
			memcpy(v, tok, len);
			v[len] = 0;
			o = len;
		} else {
			o = or_format_int((long long)x, v);
		}
	} else {
		if (len < 2 || tok[0] != '\'' || tok[len - 1] != '\'')
			return false;
		if (!memchr(tok + 1, '\'', len - 2) && !memchr(tok + 1, '\\', len - 2)) {
			o = len - 2;		/* nothing to undouble: the contents as they are */
			memcpy(v, tok + 1, o);
		} else {
			for (size_t i = 1; i + 1 < len; i++) {
				if (tok[i] == '\\')
					return false;
				if (tok[i] == '\'') {
					if (i + 2 >= len || tok[i + 1] != '\'')	/* 'a' 'b' continuation */
						return false;
					i++;
				}
				v[o++] = tok[i];
			}
		}
		v[o] = 0;
	}
	if (kind == 's' && memchr(tok, '"', len))
		n->lit_dq = true;
	memcpy(t, tok, len);
	t[len] = 0;
	n->toks[n->n] = t;
	n->vals[n->n] = v;
	n->lens[n->n] = (uint32_t)len;
	n->n++;
	n->used += len + 1 + o + 1;
	return true;
}

/*
 * Shapes: the scanner (pg_query_scan, some 45,000 instructions for the
 * benchmark's read statement, more than all the rest of a routed message)
 * is run once per shape of text, not once per message. A shape is a
 * normalized text as the scanner made it, with where its placeholders are
 * and what each one replaced (an integer or a '...' string). A later text
 * of the same shape is the normalized text with other literals of the same
 * kinds in those places: every byte outside them equal, an integer where an
 * integer was (a maximal run of digits, below 2^31), a plain string where a
 * string was (no backslash, quotes doubled). The lexer then reads it exactly
 * as it read the first: it is in the same state at each literal (same
 * bytes before it), reads a literal of the same kind, and what follows the
 * literal is the same bytes as before, which decided where the literal
 * ended (a digit run followed by the same character, a string closed by a
 * quote followed by the same characters, so neither a decimal point nor a
 * continuation). Anything else, and any text not seen in a shape, is
 * scanned. Shapes are found by a hash of the text with digit runs and
 * string contents left out (equal for texts of one shape; a collision is
 * only a shape that does not match, then a scan).
 */
#define SHAPES 1024

struct shape {
	uint64_t key;			/* skeleton() of the texts */
	char *norm;			/* the normalized text; NULL: free */
	size_t norm_len;
	int n;
	uint32_t *off;			/* where "$k" (k = i + 1) starts in norm */
	char *kind;			/* 'i': an integer, 's': a string */
	bool mm_ok;			/* the prefilter's answer decomposes (below) */
	bool mm_set;			/* mm is known for (mm_sp, mm_cat) */
	unsigned mm;
	uint64_t mm_sp, mm_cat;
	uint64_t ce_key;		/* ce is the parse-cache entry of norm for this key */
	struct or_cache_ref ce;		/* gen 0: none */
};

static struct shape *shapes;
static unsigned last_shape;		/* 1 + the slot of the last shape matched; 0: none (below) */

void or_shapes_free(void)
{
	for (int i = 0; shapes && i < SHAPES; i++) {
		free(shapes[i].norm);
		free(shapes[i].off);
		free(shapes[i].kind);
	}
	free(shapes);
	shapes = NULL;
	last_shape = 0;
	if (!keep_lent) {
		free(keep_mem);
		keep_mem = NULL;
		keep_cap = 0;
	}
}

/*
 * The hash of the text with digit runs and string contents left out, in
 * the same pass its length (*len) and *flags: SK_MARK a template byte (1
 * or 2), SK_LIT a quote or a digit (something to normalize, perhaps).
 */
#define SK_MARK 1u
#define SK_LIT 2u

static uint64_t run_hash(uint64_t h, const unsigned char *p, size_t n)
{
	const uint64_t k = 0x9e3779b97f4a7c15ull;
	uint64_t w;

	for (; n >= 8; p += 8, n -= 8) {
		memcpy(&w, p, 8);
		h = (h ^ w) * k;
		h ^= h >> 29;
	}
	w = (uint64_t)n << 56;
	for (size_t i = 0; i < n; i++)
		w |= (uint64_t)p[i] << (8 * i);
	h = (h ^ w) * k;
	return h ^ (h >> 29);
}

static uint64_t skeleton(const char *str, unsigned *flags, size_t *len)
{
	static unsigned char special[256];	/* the bytes that are not simply hashed: NUL, 1, 2, ' and digits */
	const unsigned char *s = (const unsigned char *)str;
	const uint64_t prime = 1099511628211ull;
	uint64_t h = 1469598103934665603ull;
	unsigned fl = 0;

	if (!special['0']) {
		special[0] = special[TPL_MARK] = special[TPL_END] = special['\''] = 1;
		for (int c = '0'; c <= '9'; c++)
			special[c] = 1;
	}
	for (;;) {
		const unsigned char *run = s;
		unsigned char c;
		while (!special[*s])
			s++;
		if (s > run)		/* a run of plain bytes: hashed 8 at a time */
			h = run_hash(h, run, (size_t)(s - run));
		if (!(c = *s))
			break;
		if (c <= TPL_END) {
			fl |= SK_MARK;
			h = (h ^ c) * prime;
			s++;
			continue;
		}
		fl |= SK_LIT;
		if (c != '\'') {	/* a digit run */
			while (IS_DIGIT(*s))
				s++;
			h = (h ^ '#') * prime;
			continue;
		}
		h = (h ^ '\'') * prime;		/* a string: its contents left out */
		for (s++; *s; s++) {
			if (*s <= TPL_END)
				fl |= SK_MARK;
			if (*s == '\'') {
				if (s[1] != '\'')
					break;
				s++;	/* a doubled quote: string content */
			}
		}
		if (!*s)
			break;
		h = (h ^ '\'') * prime;
		s++;
	}
	*flags = fl;
	*len = (size_t)(s - (const unsigned char *)str);
	return h;
}

/* A text of shape sh (len bytes): *out as or_normalize() would make it.
 * The text is matched first (where its literals are), then the allocation
 * made and the literals pushed: a shape that does not match costs no
 * allocation. */
#define MATCH_LITS 64
#define NOT_PLAIN 0x80000000u	/* in lens[]: the string has a doubled quote */

static bool shape_match(const struct shape *sh, const char *sql, size_t len, struct or_norm *out)
{
	const char *p = sql, *end = sql + len;
	const char *at0[MATCH_LITS], **at = at0;
	uint32_t lens0[MATCH_LITS], *lens = lens0;
	size_t prev = 0;
	bool ok = false, plain = true;

	memset(out, 0, sizeof(*out));
	if (sh->n > MATCH_LITS) {	/* a long VALUES list, say */
		at = malloc(sizeof(*at) * (size_t)sh->n);
		lens = malloc(sizeof(*lens) * (size_t)sh->n);
		if (!at || !lens)
			goto out;
	}
	for (int i = 0; i < sh->n; i++) {
		size_t seg = sh->off[i] - prev;
		const char *s;
		if (seg > (size_t)(end - p) || memcmp(p, sh->norm + prev, seg) != 0)
			goto out;
		p += seg;
		s = p;
		if (sh->kind[i] == 'i') {
			while (IS_DIGIT(*p))
				p++;
			if (p == s)
				goto out;
		} else {
			plain = true;
			if (*p++ != '\'')
				goto out;
			for (;;) {
				if (!*p || *p == '\\' || *p == TPL_MARK || *p == TPL_END)
					goto out;
				if (*p++ != '\'')
					continue;
				if (*p != '\'')
					break;
				p++;	/* '' */
				plain = false;
			}
		}
		if ((size_t)(p - s) >= NOT_PLAIN)
			goto out;
		at[i] = s;
		lens[i] = (uint32_t)(p - s) | (plain ? 0 : NOT_PLAIN);
		/* past "$k" (not up to the next non-digit: a literal left as written may follow) */
		prev = sh->off[i] + 1 + ndigits((unsigned)i + 1);
	}
	if ((size_t)(end - p) != sh->norm_len - prev || memcmp(p, sh->norm + prev, sh->norm_len - prev) != 0)
		goto out;
	if (!norm_alloc(out, sh->n, len, sh->norm_len + 1))
		goto out;
	for (int i = 0; i < sh->n; i++)
		if (!push_lit(out, sh->kind[i], at[i], lens[i] & ~NOT_PLAIN,
			      sh->kind[i] == 'i' ? LIT_DIGITS : lens[i] & NOT_PLAIN ? 0 : LIT_PLAIN))
			goto out;
	memcpy(out->text, sh->norm, sh->norm_len + 1);
	out->shape = (unsigned)(sh - shapes) + 1;
	out->shape_key = sh->key;
	ok = true;
out:
	if (at != at0) {
		free(at);
		free(lens);
	}
	return ok;
}

/*
 * The prefilter and shapes. The prefilter (org_routing.c, may_matter) reads
 * the words of a text, inside literals too (set_config('lokadb.org', ...)),
 * and remembers the previous word across blanks and dots; a double quote
 * starts a quoted word that runs to the next one. For texts of one shape
 * its answer is the answer for the normalized text or-ed with the answers
 * for each string literal as written, when:
 *   - no placeholder follows a byte that continues a word (N'x' is N$1:
 *     the word "n$1" is not the word "n"), and none lies between two double
 *     quotes of the normalized text (a quoted word would swallow it);
 *   - no string literal holds a double quote (checked per text).
 * Then a literal is read the same way in the text as on its own: its first
 * byte (a quote or a digit) ends the previous word, its last byte ends its
 * own words, and "$k" in the normalized text ends a word the same way ($ and
 * digits do not start one). Integer literals hold no word.
 */
static bool word_byte(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
	       c >= 0x80;
}

static bool mm_decomposes(const struct shape *sh)
{
	const char *q = sh->norm;
	int i = 0;

	for (int k = 0; k < sh->n; k++)
		if (sh->off[k] > 0 && word_byte((unsigned char)sh->norm[sh->off[k] - 1]))
			return false;
	while ((q = strchr(q, '"')) != NULL) {
		const char *e = strchr(q + 1, '"');
		size_t a = (size_t)(q - sh->norm), b = e ? (size_t)(e - sh->norm) : sh->norm_len;
		while (i < sh->n && sh->off[i] < a)
			i++;
		if (i < sh->n && sh->off[i] < b)
			return false;
		if (!e)
			break;
		q = e + 1;
	}
	return true;
}

/* Remember the shape of a text the scanner normalized. */
static void shape_put(uint64_t key, struct or_norm *n, size_t norm_len, const uint32_t *off, const char *kind)
{
	struct shape *sh;

	if (!shapes && !(shapes = calloc(SHAPES, sizeof(*shapes))))
		return;
	sh = &shapes[key % SHAPES];
	free(sh->norm);
	free(sh->off);
	free(sh->kind);
	memset(sh, 0, sizeof(*sh));
	sh->off = malloc(sizeof(*off) * (size_t)n->n);
	sh->kind = malloc((size_t)n->n);
	sh->norm = malloc(norm_len + 1);
	if (!sh->off || !sh->kind || !sh->norm) {
		free(sh->norm);
		free(sh->off);
		free(sh->kind);
		memset(sh, 0, sizeof(*sh));
		return;
	}
	memcpy(sh->norm, n->text, norm_len + 1);
	memcpy(sh->off, off, sizeof(*off) * (size_t)n->n);
	memcpy(sh->kind, kind, (size_t)n->n);
	sh->norm_len = norm_len;
	sh->n = n->n;
	sh->key = key;
	sh->mm_ok = mm_decomposes(sh);
	n->shape = (unsigned)(sh - shapes) + 1;
	n->shape_key = key;
}

/*
 * The shape a text last matched is tried first, without the skeleton's
 * hash: shape_match() checks every byte of the text against the shape (the
 * bytes outside its literals equal the normalized text's, which holds no
 * template byte; literals of the same kinds, strings without one), so a
 * text it accepts has that shape's skeleton too (the same bytes, digit runs
 * and string contents aside). The same statement sent again and again (an
 * application's INSERT) costs no hash of its text.
 */
bool or_normalize_known(const char *sql, struct or_norm *out)
{
	uint64_t key;
	size_t len;
	unsigned fl, slot;

	memset(out, 0, sizeof(*out));
	if (!shapes)
		return false;
	if (last_shape && shapes[last_shape - 1].norm) {
		if (shape_match(&shapes[last_shape - 1], sql, strlen(sql), out))
			return true;
		or_norm_free(out);
	}
	key = skeleton(sql, &fl, &len);
	slot = (unsigned)(key % SHAPES);
	if ((fl & SK_MARK) || !(fl & SK_LIT) || !shapes[slot].norm || shapes[slot].key != key ||
	    slot + 1 == last_shape)
		return false;
	if (shape_match(&shapes[slot], sql, len, out)) {
		last_shape = slot + 1;
		return true;
	}
	or_norm_free(out);
	return false;
}

static struct shape *shape_of(const struct or_norm *n)
{
	struct shape *sh = n->shape && shapes ? &shapes[n->shape - 1] : NULL;

	return sh && sh->norm && sh->key == n->shape_key ? sh : NULL;
}

bool or_shape_mm_usable(const struct or_norm *n)
{
	const struct shape *sh = shape_of(n);

	return sh && sh->mm_ok && !n->lit_dq;
}

bool or_shape_mm_get(const struct or_norm *n, uint64_t sp_key, uint64_t cat, unsigned *mm)
{
	const struct shape *sh = shape_of(n);

	if (!sh || !sh->mm_set || sh->mm_sp != sp_key || sh->mm_cat != cat)
		return false;
	*mm = sh->mm;
	return true;
}

void or_shape_mm_put(const struct or_norm *n, uint64_t sp_key, uint64_t cat, unsigned mm)
{
	struct shape *sh = shape_of(n);

	if (!sh)
		return;
	sh->mm_set = true;
	sh->mm = mm;
	sh->mm_sp = sp_key;
	sh->mm_cat = cat;
}

bool or_shape_entry_get(const struct or_norm *n, uint64_t key, struct or_cache_ref *ref)
{
	const struct shape *sh = shape_of(n);

	if (!sh || !sh->ce.gen || sh->ce_key != key)
		return false;
	*ref = sh->ce;
	return true;
}

void or_shape_entry_put(const struct or_norm *n, uint64_t key, const struct or_cache_ref *ref)
{
	struct shape *sh = shape_of(n);

	if (!sh)
		return;
	sh->ce_key = key;
	sh->ce = *ref;
}

bool or_normalize(const char *sql, struct or_norm *out)
{
	uint64_t key;
	uint32_t *off = NULL;
	char *kind;
	struct or_tok *tokens;
	size_t len, o = 0, from = 0, ntokens;
	unsigned fl;
	bool ok = true;

	memset(out, 0, sizeof(*out));
	key = skeleton(sql, &fl, &len);
	if ((fl & SK_MARK) || !(fl & SK_LIT))
		return false;
	if (shapes && shapes[key % SHAPES].norm && shapes[key % SHAPES].key == key) {
		if (shape_match(&shapes[key % SHAPES], sql, len, out))
			return true;
		or_norm_free(out);
	}
	if (!(tokens = or_scan_tokens(sql, &ntokens)))
		return false;
	/* each literal (1 byte at least) becomes "$k", k <= ntokens: at most 11 bytes */
	if (!norm_alloc(out, (int)ntokens, len, len + 11 * ntokens + 1) ||
	    !(off = malloc((sizeof(*off) + 1) * (ntokens ? ntokens : 1)))) {
		free(tokens);
		or_norm_free(out);
		return false;
	}
	kind = (char *)(off + ntokens);
	for (size_t i = 0; ok && i < ntokens; i++) {
		const struct or_tok *t = &tokens[i];
		size_t s = (size_t)t->start, e = (size_t)t->end;
		int64_t tok = t->token;
		char k;

		if (tok == PG_QUERY__TOKEN__PARAM) {
			ok = false;	/* parameters of its own: the placeholders would mix */
			break;
		}
		if (t->start < 0 || t->end < 0 || e > len || s > e || s < from) {
			ok = false;
			continue;
		}
		if (tok == PG_QUERY__TOKEN__ICONST &&
		    !(i > 0 && (tokens[i - 1].token == PG_QUERY__TOKEN__ASCII_45 ||
				tokens[i - 1].token == PG_QUERY__TOKEN__ASCII_43)))
			k = 'i';
		else if (tok == PG_QUERY__TOKEN__SCONST)
			k = 's';
		else
			continue;
		if (!push_lit(out, k, sql + s, e - s, 0))
			continue;
		off[out->n - 1] = (uint32_t)(o + (s - from));
		kind[out->n - 1] = k;
		memcpy(out->text + o, sql + from, s - from);
		o += s - from;
		out->text[o++] = '$';
		o += or_format_int(out->n, out->text + o);
		from = e;
	}
	free(tokens);
	if (ok && out->n > 0) {
		memcpy(out->text + o, sql + from, len - from);
		out->text[o + (len - from)] = 0;
		shape_put(key, out, o + (len - from), off, kind);
		free(off);
		return true;
	}
	free(off);
	or_norm_free(out);
	return false;
}

char *or_template_encode(const char *sql, int nlits)
{
	struct or_tok *tokens;
	size_t len = strlen(sql), o = 0, from = 0, ntokens;
	char *out = NULL, *seen = NULL;
	bool ok = true;

	if (strchr(sql, TPL_MARK) || strchr(sql, TPL_END))
		return NULL;
	if (!(tokens = or_scan_tokens(sql, &ntokens)))
		return NULL;
	out = malloc(len + 1 + 8 * (size_t)nlits);	/* "$k" becomes \x01 k \x02: 1 byte more each */
	seen = calloc((size_t)nlits + 1, 1);
	if (!out || !seen)
		ok = false;
	for (size_t i = 0; ok && i < ntokens; i++) {
		const struct or_tok *t = &tokens[i];
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

/* `name` as PostgreSQL's quote_identifier() writes it, for names that
 * cannot be keywords: bare if [a-z_][a-z0-9_]* with a digit, else quoted. */
static size_t put_ident(char *out, const char *name)
{
	static unsigned char cls[256];	/* 1: [a-z0-9_], 2: a digit */
	bool bare = (*name >= 'a' && *name <= 'z') || *name == '_', digit = false;
	size_t o = 0;

	if (!cls['_']) {
		for (int c = 'a'; c <= 'z'; c++)
			cls[c] = 1;
		for (int c = '0'; c <= '9'; c++)
			cls[c] = 3;
		cls['_'] = 1;
	}
	/* copied as it is checked (one pass for the usual bare leaf name) */
	for (const unsigned char *p = (const unsigned char *)name; *p && bare; p++) {
		bare = cls[*p] & 1;
		digit |= cls[*p] >> 1;
		out[o++] = (char)*p;
	}
	if (bare && digit)
		return o;
	o = 0;
	out[o++] = '"';
	for (const char *p = name; *p; p++) {
		if (*p == '"')
			out[o++] = '"';
		out[o++] = *p;
	}
	out[o++] = '"';
	return o;
}

/* The numbers of a leaf marker: where the client's text changed around it (org_routing.h). */
struct mark_span {
	bool has;
	uint32_t pre, post, client;
};

/* At p: "\x03schema\x05table[\x06pre.post.client]\x04" (a leaf marker,
 * quoted): schema and table into the buffers, the numbers into *ms, the
 * end into *end. false: not one. */
static bool leaf_marker(const char *p, char *schema, char *table, struct mark_span *ms, const char **end)
{
	char *bufs[2] = { schema, table };
	int stops[2] = { OR_LEAF_SEP, OR_LEAF_END };

	if (p[0] != '"' || p[1] != OR_LEAF_MARK)
		return false;
	p += 2;
	ms->has = false;
	for (int i = 0; i < 2; i++) {
		size_t n = 0;
		while (*p && *p != stops[i] && (i == 0 || *p != OR_LEAF_SPAN) && n < NAMEDATALEN_OR - 1)
			bufs[i][n++] = *p++;
		bufs[i][n] = 0;
		if (i == 1 && *p == OR_LEAF_SPAN) {
			uint32_t *v[3] = { &ms->pre, &ms->post, &ms->client };
			p++;
			for (int k = 0; k < 3; k++) {
				unsigned long x = 0;
				const char *d = p;
				while (IS_DIGIT(*p) && x < 100000000ul)
					x = x * 10 + (unsigned long)(*p++ - '0');
				if (p == d || (k < 2 && *p++ != '.'))
					return false;
				*v[k] = (uint32_t)x;
			}
			ms->has = true;
		}
		if (*p != stops[i])
			return false;
		p++;
	}
	if (*p != '"')
		return false;
	*end = p + 1;
	return true;
}

/* A leaf put in at output offset o (name_len bytes, for table): its span into sp. */
static void span_add(struct or_spans *sp, const struct mark_span *ms, size_t o, size_t name_len, const char *leaf,
		     const char *table)
{
	lk_text_span *x;

	if (!sp || sp->bad)
		return;
	if (!ms->has || sp->n >= OR_SPANS_MAX || o < ms->pre) {
		sp->bad = true;
		return;
	}
	x = &sp->s[sp->n++];
	x->at = (uint32_t)(o - ms->pre);
	x->len = (uint32_t)(ms->pre + name_len + ms->post);
	x->client_len = ms->client;
	x->name = leaf;
	x->client_name = table;
}

/* Room for `need` bytes in *buf. */
static bool fill_room(char **buf, size_t *cap, size_t need)
{
	size_t c = *cap ? *cap : 256;
	char *nb;

	if (need <= *cap)
		return true;
	while (c < need)
		c *= 2;
	if (!(nb = realloc(*buf, c)))
		return false;
	*buf = nb;
	*cap = c;
	return true;
}

bool or_template_fill_buf(const char *tpl, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf,
			  char **buf, size_t *cap)
{
	char schema[NAMEDATALEN_OR], table[NAMEDATALEN_OR];
	static const char stops[] = { TPL_MARK, '"', 0 };
	struct mark_span ms;
	size_t o = 0;

	*no_leaf = false;
	for (const char *p = tpl;;) {
		size_t l = strcspn(p, stops);
		const char *end;
		if (!fill_room(buf, cap, o + l + 1))
			return false;
		memcpy(*buf + o, p, l);
		o += l;
		p += l;
		if (!*p)
			break;
		if (*p == TPL_MARK) {
			unsigned k = 0;
			for (end = p + 1; IS_DIGIT(*end) && k < 100000000u; end++)
				k = k * 10 + (unsigned)(*end - '0');
			if (!n || end == p + 1 || *end != TPL_END || k < 1 || k > (unsigned)n->n)
				return false;
			if (!fill_room(buf, cap, o + n->lens[k - 1] + 1))
				return false;
			memcpy(*buf + o, n->toks[k - 1], n->lens[k - 1]);
			o += n->lens[k - 1];
			p = end + 1;
		} else if (p[1] == OR_LEAF_MARK) {
			const char *name;
			if (!leaf || !leaf_marker(p, schema, table, &ms, &end))
				return false;
			if (!(name = leaf(arg, schema, table)) || strlen(name) >= NAMEDATALEN_OR) {
				*no_leaf = true;
				return false;
			}
			/* a quoted leaf name with its quotes doubled */
			if (!fill_room(buf, cap, o + 2 * NAMEDATALEN_OR + 3))
				return false;
			o += put_ident(*buf + o, name);
			p = end;
		} else {
			if (!fill_room(buf, cap, o + 2))
				return false;
			(*buf)[o++] = *p++;
		}
	}
	(*buf)[o] = 0;
	return true;
}

/*
 * A template compiled: the walk of or_template_fill_buf() made once (where
 * the plain runs end, which literal or which leaf follows each), so a
 * message's fill copies runs and looks up leaves, no more. The memo of a
 * parse-cache entry keeps it with its template (or_rewrite_memo). Same
 * output and same failures as or_template_fill_buf() (test_normalize
 * compares them).
 */
enum { TOP_END, TOP_LIT, TOP_LEAF, TOP_FAIL };

struct tpl_op {
	uint32_t from, len;		/* the plain bytes copied first: text[from, from + len) */
	uint32_t what;			/* TOP_* after them */
	uint32_t k;			/* TOP_LIT: literal number k (1-based) */
	const char *schema, *table;	/* TOP_LEAF */
	struct mark_span ms;		/* ... its numbers */
};

struct or_tpl {
	const char *text;		/* a copy of the template */
	struct tpl_op op[];		/* up to TOP_END or TOP_FAIL */
};

struct or_tpl *or_template_compile(const char *tpl)
{
	size_t len = strlen(tpl), nops = 2, o = 0, from = 0;
	static const char stops[] = { TPL_MARK, '"', 0 };
	struct or_tpl *t;
	char *text, *names;
	const char *p;

	for (p = tpl; *p; p++)
		nops += *p == TPL_MARK || *p == '"';
	if (len >= UINT32_MAX || !(t = malloc(sizeof(*t) + nops * sizeof(t->op[0]) + 2 * (len + 1))))
		return NULL;
	text = (char *)&t->op[nops];
	names = text + len + 1;
	memcpy(text, tpl, len + 1);
	t->text = text;
	for (p = tpl;;) {
		struct tpl_op *op = &t->op[o++];
		const char *end;
		p += strcspn(p, stops);
		op->from = (uint32_t)from;
		op->len = (uint32_t)((size_t)(p - tpl) - from);
		if (!*p) {
			op->what = TOP_END;
			break;
		}
		if (*p == TPL_MARK) {
			unsigned k = 0;
			for (end = p + 1; IS_DIGIT(*end) && k < 100000000u; end++)
				k = k * 10 + (unsigned)(*end - '0');
			if (end == p + 1 || *end != TPL_END || k < 1) {
				op->what = TOP_FAIL;
				break;
			}
			op->what = TOP_LIT;
			op->k = k;
			p = end + 1;
		} else if (p[1] == OR_LEAF_MARK) {
			char schema[NAMEDATALEN_OR], table[NAMEDATALEN_OR];
			size_t ls, lt;
			if (!leaf_marker(p, schema, table, &op->ms, &end)) {
				op->what = TOP_FAIL;
				break;
			}
			/* the names are shorter than their marker: they fit in names[] */
			ls = strlen(schema) + 1;
			lt = strlen(table) + 1;
			memcpy(names, schema, ls);
			memcpy(names + ls, table, lt);
			op->what = TOP_LEAF;
			op->schema = names;
			op->table = names + ls;
			names += ls + lt;
			p = end;
		} else {	/* a double quote of its own: a plain byte */
			p++;
			o--;	/* the same run goes on */
			continue;
		}
		from = (size_t)(p - tpl);
	}
	return t;
}

void or_template_free(struct or_tpl *t)
{
	free(t);
}

bool or_template_run(const struct or_tpl *t, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf,
		     char **buf, size_t *cap, struct or_spans *sp)
{
	size_t o = 0, k;

	*no_leaf = false;
	if (sp) {
		sp->n = 0;
		sp->bad = false;
	}
	for (const struct tpl_op *op = t->op;; op++) {
		const char *name;
		if (!fill_room(buf, cap, o + op->len + 1))
			return false;
		memcpy(*buf + o, t->text + op->from, op->len);
		o += op->len;
		switch (op->what) {
		case TOP_END:
			(*buf)[o] = 0;
			return true;
		case TOP_LIT:
			if (!n || op->k > (unsigned)n->n)
				return false;
			if (!fill_room(buf, cap, o + n->lens[op->k - 1] + 1))
				return false;
			memcpy(*buf + o, n->toks[op->k - 1], n->lens[op->k - 1]);
			o += n->lens[op->k - 1];
			break;
		case TOP_LEAF:
			if (!leaf)
				return false;
			if (!(name = leaf(arg, op->schema, op->table)) || strlen(name) >= NAMEDATALEN_OR) {
				*no_leaf = true;
				return false;
			}
			if (!fill_room(buf, cap, o + 2 * NAMEDATALEN_OR + 3))
				return false;
			k = put_ident(*buf + o, name);
			span_add(sp, &op->ms, o, k, name, op->table);
			o += k;
			break;
		default:
			return false;
		}
	}
}

char *or_template_fill(const char *tpl, const struct or_norm *n, or_leaf_fn leaf, void *arg, bool *no_leaf)
{
	struct or_tpl *t = or_template_compile(tpl);
	char *buf = NULL;
	size_t cap = 0;

	*no_leaf = false;
	if (!t || !or_template_run(t, n, leaf, arg, no_leaf, &buf, &cap, NULL)) {
		free(buf);
		buf = NULL;
	}
	or_template_free(t);
	return buf;
}
