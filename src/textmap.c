/* SPDX-License-Identifier: ISC */
/*
 * textmap.c -- a rewritten text's errors told about the client's text (see
 * textmap.h).
 *
 * A plugin that rewrote a Query or Parse gives the spans where the text
 * sent differs (api->query_text_spans); the core checks that every other
 * byte is the client's and keeps the spans, in characters, with the reply
 * queue's item of the message. An ErrorResponse or NoticeResponse of that
 * item then gets its position (P) moved back into the client's text, and,
 * for the errors of class 42 (analysis, privileges), the relation names
 * of the text sent replaced by the client's. Replies carry no text, so nothing else needs it.
 */
#include "textmap.h"
#include "pktbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TM_MAX_SPANS 64
#define TM_SPARE_MAX 1024		/* a map up to this size is kept for the next */

static struct textmap *spare;		/* (one event loop per process: no lock) */

/* Characters in p[0, n): UTF-8 lead bytes, or bytes. */
static uint32_t chars(const char *p, size_t n, bool utf8)
{
	uint32_t k = 0;

	if (!utf8)
		return (uint32_t)n;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)p[i] & 0xC0) != 0x80;
	return k;
}

/* No byte of p[0, n) above 0x7f (eight at a time): characters are bytes. */
static bool all_ascii(const char *p, size_t n)
{
	uint64_t acc = 0, w;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		memcpy(&w, p + i, 8);
		acc |= w;
	}
	for (; i < n; i++)
		acc |= (unsigned char)p[i];
	return (acc & 0x8080808080808080ull) == 0;
}

struct textmap *textmap_build(const char *client, const char *sent, const lk_text_span *sp, int n, bool utf8)
{
	size_t slen = strlen(sent), clen = strlen(client), names = 0, s = 0, c = 0, need;
	bool ascii = true;
	struct textmap *m;
	char *np;

	if (n <= 0 || n > TM_MAX_SPANS || slen >= UINT32_MAX || clen >= UINT32_MAX)
		return NULL;
	for (int i = 0; i < n; i++) {
		if (!sp[i].name != !sp[i].client_name)
			return NULL;
		if (sp[i].name)
			names += strlen(sp[i].name) + strlen(sp[i].client_name) + 2;
	}
	need = sizeof(*m) + (size_t)n * sizeof(m->s[0]) + names;
	if (spare && spare->cap >= need) {	/* the last one freed: one per rewritten statement */
		m = spare;
		spare = NULL;
	} else if (need > UINT32_MAX || !(m = malloc(need))) {
		return NULL;
	} else {
		m->cap = (uint32_t)need;
	}
	m->n = (uint32_t)n;
	np = (char *)&m->s[n];
	/* the spans in bytes, every byte between them checked */
	for (int i = 0; i < n; i++) {
		size_t at = sp[i].at, len = sp[i].len, cl = sp[i].client_len, seg = at - s;
		struct tm_span *t = &m->s[i];
		if (at < s || at > slen || len > slen - at || cl > clen - c || seg > clen - c - cl ||
		    memcmp(sent + s, client + c, seg) != 0)
			goto bad;
		t->at = (uint32_t)at;
		t->end = (uint32_t)(at + len);
		t->cat = (uint32_t)(c + seg);
		t->cend = (uint32_t)(c + seg + cl);
		if (utf8)
			ascii = ascii && all_ascii(client + c + seg, cl);
		s = at + len;
		c += seg + cl;
		t->name = t->client_name = NULL;
		if (sp[i].name) {
			size_t a = strlen(sp[i].name) + 1, b = strlen(sp[i].client_name) + 1;
			memcpy(np, sp[i].name, a);
			memcpy(np + a, sp[i].client_name, b);
			t->name = np;
			t->client_name = np + a;
			np += a + b;
		}
	}
	if (slen - s != clen - c || memcmp(sent + s, client + c, slen - s) != 0)
		goto bad;
	/* in characters: only when a byte up to the last span is not ASCII (the
	 * client's bytes between the spans are the text sent's) */
	if (utf8 && !(ascii && all_ascii(sent, s))) {
		for (uint32_t i = 0; i < m->n; i++) {
			struct tm_span *t = &m->s[i];
			uint32_t cend = chars(client, t->cend, true);
			t->cat = chars(client, t->cat, true);
			t->cend = cend;
			t->end = chars(sent, t->end, true);
			t->at = chars(sent, t->at, true);
		}
	}
	return m;
bad:
	textmap_free(m);
	return NULL;
}

void textmap_free(struct textmap *m)
{
	if (m && !spare && m->cap <= TM_SPARE_MAX) {
		spare = m;
		return;
	}
	free(m);
}

long textmap_position(const struct textmap *m, long p)
{
	long delta = 0;

	for (uint32_t i = 0; i < m->n; i++) {
		const struct tm_span *t = &m->s[i];
		if (p - 1 < (long)t->at)
			break;
		if (p - 1 < (long)t->end)
			return (long)t->cat + 1;	/* inside: where the client's bytes start */
		delta = (long)t->cend - (long)t->end;
	}
	return p + delta;
}

static bool ident_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
	       ch == '$' || (unsigned char)ch >= 0x80;
}

/* The span whose `name` is the word at p (in quotes or not: PostgreSQL
 * writes "permission denied for table name"), or NULL. */
static const struct tm_span *name_at(const struct textmap *m, const char *str, const char *p)
{
	if (p > str && ident_char(p[-1]))
		return NULL;
	for (uint32_t i = 0; i < m->n; i++) {
		const char *name = m->s[i].name;
		size_t k;
		if (!name)
			continue;
		k = strlen(name);
		if (strncmp(p, name, k) == 0 && !ident_char(p[k]))
			return &m->s[i];
	}
	return NULL;
}

/* The span whose relation is named str, all of it (an error's table field), or NULL. */
static const struct tm_span *span_named(const struct textmap *m, const char *str)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (m->s[i].name && strcmp(str, m->s[i].name) == 0)
			return &m->s[i];
	return NULL;
}

/* Does str hold a name of the map's relations? (a first look: put_field_renamed() renames whole words only) */
static bool holds_name(const struct textmap *m, const char *str)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (m->s[i].name && strstr(str, m->s[i].name))
			return true;
	return false;
}

/* str into pb with each relation name of the map renamed. */
static void put_field_renamed(struct pktbuf *pb, const struct textmap *m, const char *str)
{
	const char *p = str;

	while (*p) {
		const struct tm_span *t = name_at(m, str, p);
		if (t) {
			pkt_put_bytes(pb, t->client_name, strlen(t->client_name));
			p += strlen(t->name);
		} else {
			pkt_put_byte(pb, (uint8_t)*p++);
		}
	}
	pkt_put_byte(pb, 0);
}

bool textmap_error(struct pktbuf *pb, char type, const uint8_t *body, uint32_t len, uint32_t shift,
		   const struct textmap *m)
{
	const char *p = (const char *)body, *end = (const char *)body + len, *pos = NULL, *code = NULL;
	bool rename = false, changed = false;
	long v = 0;

	while (p < end && *p) {
		size_t n = strnlen(p + 1, (size_t)(end - p - 1));
		if (n == (size_t)(end - p - 1))
			return false;	/* a field without its NUL: forwarded as it came */
		if (*p == 'P')
			pos = p + 1;
		else if (*p == 'C')
			code = p + 1;
		p += n + 2;
	}
	if (pos) {
		long was = strtol(pos, NULL, 10);
		v = was;
		if (was > (long)shift) {	/* (not in the values put in front: cannot be) */
			v = was - (long)shift;
			if (m)
				v = textmap_position(m, v);
		}
		changed = v != was;
	}
	if (m && type == 'E' && code && strncmp(code, "42", 2) == 0) {
		for (p = (const char *)body; *p; p += strlen(p + 1) + 2)
			if ((*p == 'M' || *p == 'D' || *p == 'H') ? holds_name(m, p + 1) :
			    *p == 't' && span_named(m, p + 1))
				rename = true;
	}
	if (!changed && !rename)
		return false;
	pkt_begin(pb, type);
	for (p = (const char *)body; *p; p += strlen(p + 1) + 2) {
		pkt_put_byte(pb, (uint8_t)*p);
		if (p + 1 == pos) {
			char num[24];
			snprintf(num, sizeof(num), "%ld", v);
			pkt_put_string(pb, num);
		} else if (rename && (*p == 'M' || *p == 'D' || *p == 'H')) {
			put_field_renamed(pb, m, p + 1);
		} else if (rename && *p == 't') {
			const struct tm_span *t = span_named(m, p + 1);
			pkt_put_string(pb, t ? t->client_name : p + 1);
		} else {
			pkt_put_string(pb, p + 1);
		}
	}
	pkt_put_byte(pb, 0);
	pkt_end(pb);
	return true;
}
