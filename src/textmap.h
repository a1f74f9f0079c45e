/* SPDX-License-Identifier: ISC */
/*
 * textmap.h -- how a text a plugin rewrote maps back to the client's text,
 * so that PostgreSQL's errors and notices about the text sent reach the
 * client about its own (plugin ABI 1.12, api->query_text_spans).
 */
#ifndef LOKADB_TEXTMAP_H
#define LOKADB_TEXTMAP_H

#include <stdbool.h>
#include <stdint.h>

#include <lokadb/plugin.h>

struct pktbuf;

/* One span, in characters (PostgreSQL's positions count characters). */
struct tm_span {
	uint32_t at, end;		/* the text sent: [at, end) */
	uint32_t cat, cend;		/* ... stands for the client's [cat, cend) */
	const char *name, *client_name;	/* a relation named instead (into the map), or NULL */
};

struct textmap {
	uint32_t n;
	uint32_t cap;			/* bytes allocated */
	struct tm_span s[];		/* then the names */
};

/*
 * The map of `sent` (the client's text `client` with the spans of `sp`
 * rewritten; lk_text_span), positions counted in UTF-8 characters when
 * utf8, else in bytes. NULL when the spans are not in order, leave the
 * text, or a byte outside them is not the client's (or out of memory).
 */
struct textmap *textmap_build(const char *client, const char *sent, const lk_text_span *sp, int n, bool utf8);
void textmap_free(struct textmap *m);

/* Position p (1-based, characters) in the text sent, in the client's text. */
long textmap_position(const struct textmap *m, long p);

/*
 * The ErrorResponse or NoticeResponse (type; its body of len bytes) of a
 * message that had `shift` characters put in front of its text and whose
 * text maps by m (may be NULL): into pb as the client must see it, its
 * position moved back into the client's text and, in errors of class 42,
 * the relations named by the text sent renamed. false: it
 * needs no change (pb untouched).
 */
bool textmap_error(struct pktbuf *pb, char type, const uint8_t *body, uint32_t len, uint32_t shift,
		   const struct textmap *m);

#endif
