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
 * for the analysis errors of class 42, the relation names of the text sent
 * replaced by the client's. Replies carry no text, so nothing else needs it.
 */
#include "textmap.h"
#include "pktbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TM_MAX_SPANS 64

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

struct textmap *textmap_build(const char *client, const char *sent, const lk_text_span *sp, int n, bool utf8)
{
	size_t slen = strlen(sent), clen = strlen(client), names = 0, s = 0, c = 0;
	uint32_t sch = 0, cch = 0;
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
	if (!(m = malloc(sizeof(*m) + (size_t)n * sizeof(m->s[0]) + names)))
		return NULL;
	m->n = (uint32_t)n;
	np = (char *)&m->s[n];
	for (int i = 0; i < n; i++) {
		size_t at = sp[i].at, len = sp[i].len, cl = sp[i].client_len, seg = at - s;
		struct tm_span *t = &m->s[i];
		if (at < s || at > slen || len > slen - at || cl > clen - c || seg > clen - c - cl ||
		    memcmp(sent + s, client + c, seg) != 0)
			goto bad;
		sch += chars(sent + s, seg, utf8);
		cch += chars(sent + s, seg, utf8);
		t->at = sch;
		t->cat = cch;
		sch += chars(sent + at, len, utf8);
		cch += chars(client + c + seg, cl, utf8);
		t->end = sch;
		t->cend = cch;
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
	return m;
bad:
	free(m);
	return NULL;
}

void textmap_free(struct textmap *m)
{
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

/* Does str name one of the map's relations (quoted, or all of it when whole)? */
static bool names_one(const struct textmap *m, const char *str, bool whole)
{
	for (uint32_t i = 0; i < m->n; i++) {
		const char *name = m->s[i].name;
		if (!name)
			continue;
		if (whole ? strcmp(str, name) == 0 : strstr(str, name) != NULL)
			return true;
	}
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
			if ((*p == 'M' || *p == 'D' || *p == 'H') ? names_one(m, p + 1, false) :
			    *p == 't' && names_one(m, p + 1, true))
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
			const char *str = p + 1;
			for (uint32_t i = 0; i < m->n; i++)
				if (m->s[i].name && strcmp(str, m->s[i].name) == 0) {
					str = m->s[i].client_name;
					break;
				}
			pkt_put_string(pb, str);
		} else {
			pkt_put_string(pb, p + 1);
		}
	}
	pkt_put_byte(pb, 0);
	pkt_end(pb);
	return true;
}
