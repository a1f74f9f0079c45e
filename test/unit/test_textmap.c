/* SPDX-License-Identifier: ISC */
/*
 * test_textmap.c -- unit tests of src/textmap.c: a rewritten text's spans
 * checked against the client's text, positions moved back, and the
 * relation names of analysis errors given back.
 */
#include "pktbuf.h"
#include "textmap.h"
#include "unit.h"

#include <stdlib.h>
#include <string.h>

static const char CLIENT[] = "SELECT d.id FROM documents d JOIN versions WHERE x = 1";
static const char SENT[] = "SELECT d.id FROM public.documents_o2_1 d JOIN public.versions_o2_1 versions WHERE x = 1";

/* The two spans of SENT: "public.documents_o2_1" for "documents", and
 * "public.versions_o2_1 versions" for "versions". */
static void spans_of_sent(lk_text_span *sp)
{
	memset(sp, 0, 2 * sizeof(*sp));
	sp[0].at = (uint32_t)(strstr(SENT, "public.documents") - SENT);
	sp[0].len = (uint32_t)strlen("public.documents_o2_1");
	sp[0].client_len = (uint32_t)strlen("documents");
	sp[0].name = "documents_o2_1";
	sp[0].client_name = "documents";
	sp[1].at = (uint32_t)(strstr(SENT, "public.versions") - SENT);
	sp[1].len = (uint32_t)strlen("public.versions_o2_1 versions");
	sp[1].client_len = (uint32_t)strlen("versions");
	sp[1].name = "versions_o2_1";
	sp[1].client_name = "versions";
}

/* The 1-based position of the first `what` after `after` in text. */
static long pos_of(const char *text, const char *after, const char *what)
{
	return strstr(strstr(text, after), what) - text + 1;
}

static bool test_positions_move_back_by_the_spans_before_them(void)
{
	lk_text_span sp[2];
	struct textmap *m;
	bool ok = true;

	spans_of_sent(sp);
	CHECK((m = textmap_build(CLIENT, SENT, sp, 2, true)) != NULL);
	CHECK(textmap_position(m, pos_of(SENT, "", "d.id")) == pos_of(CLIENT, "", "d.id"));	/* before any */
	CHECK(textmap_position(m, pos_of(SENT, "", " d JOIN")) == pos_of(CLIENT, "", " d JOIN"));
	CHECK(textmap_position(m, pos_of(SENT, "", "x = 1")) == pos_of(CLIENT, "", "x = 1"));	/* after both */
	/* inside a span: where the client's name starts */
	CHECK(textmap_position(m, pos_of(SENT, "", "documents_o2_1")) == pos_of(CLIENT, "", "documents"));
	CHECK(textmap_position(m, pos_of(SENT, "JOIN", " versions WHERE")) == pos_of(CLIENT, "", "versions"));
end:
	textmap_free(m);
	return ok;
}

static bool test_spans_that_do_not_match_the_client_text_give_no_map(void)
{
	lk_text_span sp[2], bad[2];
	bool ok = true;

	spans_of_sent(sp);
	memcpy(bad, sp, sizeof(bad));
	bad[0].client_len++;			/* the client's bytes after it no longer line up */
	CHECK(textmap_build(CLIENT, SENT, bad, 2, true) == NULL);
	memcpy(bad, sp, sizeof(bad));
	bad[1] = sp[0], bad[0] = sp[1];		/* out of order */
	CHECK(textmap_build(CLIENT, SENT, bad, 2, true) == NULL);
	memcpy(bad, sp, sizeof(bad));
	bad[1].len = 1000;			/* past the end */
	CHECK(textmap_build(CLIENT, SENT, bad, 2, true) == NULL);
	CHECK(textmap_build(CLIENT, "SELECT 1", sp, 2, true) == NULL);
	CHECK(textmap_build(CLIENT, SENT, sp, 1, true) == NULL);	/* a change outside the spans */
	CHECK(textmap_build(CLIENT, SENT, sp, 0, true) == NULL);
end:
	return ok;
}

static bool test_positions_count_characters(void)
{
	static const char client[] = "SELECT 'héllo' FROM documents WHERE 'ü' = nosuch";
	static const char sent[] = "SELECT 'héllo' FROM public.documents_o2_1 AS documents WHERE 'ü' = nosuch";
	lk_text_span sp = { 0 };
	struct textmap *m = NULL, *b = NULL;
	long at_sent, at_client;
	bool ok = true;

	sp.at = (uint32_t)(strstr(sent, "public.") - sent);
	sp.len = (uint32_t)strlen("public.documents_o2_1 AS documents");
	sp.client_len = (uint32_t)strlen("documents");
	CHECK((m = textmap_build(client, sent, &sp, 1, true)) != NULL);
	/* PostgreSQL counts characters: é and ü are one each, two bytes each */
	at_sent = pos_of(sent, "", "nosuch") - 2;
	at_client = pos_of(client, "", "nosuch") - 2;
	CHECK(textmap_position(m, at_sent) == at_client);
	CHECK((b = textmap_build(client, sent, &sp, 1, false)) != NULL);	/* a one-byte encoding */
	CHECK(textmap_position(b, at_sent + 2) == at_client + 2);
end:
	textmap_free(m);
	textmap_free(b);
	return ok;
}

/* An ErrorResponse body: fields as "Xvalue" strings, then the terminator. */
static size_t error_body(uint8_t *buf, const char *const *fields)
{
	size_t o = 0;

	for (; *fields; fields++) {
		size_t n = strlen(*fields) + 1;
		memcpy(buf + o, *fields, n);
		o += n;
	}
	buf[o++] = 0;
	return o;
}

/* The value of field f in pb's message, or NULL. */
static const char *field(const struct pktbuf *pb, char f)
{
	const char *p = (const char *)pb->data + 5;

	for (; *p; p += strlen(p + 1) + 2)
		if (*p == f)
			return p + 1;
	return NULL;
}

static bool test_analysis_errors_name_the_client_relations(void)
{
	static const char *const e42703[] = { "SERROR", "C42703",
		"Mcolumn \"nosuch\" of relation \"versions_o2_1\" does not exist", "P60", "tversions_o2_1", NULL };
	static const char *const e42501[] = { "SERROR", "C42501", "Mpermission denied for table versions_o2_1", NULL };
	static const char *const e23505[] = { "SERROR", "C23505",
		"Mduplicate key value violates unique constraint \"versions_o2_1_pkey\"", "tversions_o2_1", NULL };
	lk_text_span sp[2];
	struct textmap *m;
	struct pktbuf pb;
	uint8_t body[512];
	size_t n;
	bool ok = true;
	char want[16];

	pkt_init(&pb);
	spans_of_sent(sp);
	CHECK((m = textmap_build(CLIENT, SENT, sp, 2, true)) != NULL);
	n = error_body(body, e42703);
	CHECK(textmap_error(&pb, 'E', body, (uint32_t)n, 0, m));
	CHECK_STR(field(&pb, 'M'), "column \"nosuch\" of relation \"versions\" does not exist");
	CHECK_STR(field(&pb, 't'), "versions");
	snprintf(want, sizeof(want), "%ld", textmap_position(m, 60));
	CHECK_STR(field(&pb, 'P'), want);
	CHECK_STR(field(&pb, 'C'), "42703");
	/* a privilege: the leaf has the parent's (org_routing keeps statements off a leaf that has not) */
	pkt_reset(&pb);
	n = error_body(body, e42501);
	CHECK(textmap_error(&pb, 'E', body, (uint32_t)n, 0, m));
	CHECK_STR(field(&pb, 'M'), "permission denied for table versions");
	/* executor errors are PostgreSQL's as they are (on the parent they name the partition too) */
	n = error_body(body, e23505);
	CHECK(!textmap_error(&pb, 'E', body, (uint32_t)n, 0, m));
	/* no map, only values in front: the position alone moves */
	pkt_reset(&pb);
	n = error_body(body, e42703);
	CHECK(textmap_error(&pb, 'N', body, (uint32_t)n, 20, NULL));
	CHECK_STR(field(&pb, 'P'), "40");
	CHECK_STR(field(&pb, 't'), "versions_o2_1");
end:
	pkt_free(&pb);
	textmap_free(m);
	return ok;
}

static const struct unit_case cases[] = {
	{ "positions move back by the spans before them", test_positions_move_back_by_the_spans_before_them },
	{ "spans that do not match the client text give no map", test_spans_that_do_not_match_the_client_text_give_no_map },
	{ "positions count characters", test_positions_count_characters },
	{ "analysis errors name the client relations", test_analysis_errors_name_the_client_relations },
	{ NULL, NULL }
};

UNIT_MAIN("textmap", cases)
