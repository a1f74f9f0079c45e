/* SPDX-License-Identifier: ISC */
/*
 * test_normalize.c -- unit tests of org_routing's normalized texts
 * (plugins/org_routing/normalize.c): which literals become $n, the values
 * the analysis reads for them, the forms left as written, and templates
 * (a rewrite of the normalized text filled with each message's literals).
 * The file is compiled in (it has no dependency but libpg_query).
 */
#include "unit.h"

#include <limits.h>
#include <stdlib.h>

#include "../../plugins/org_routing/normalize.c"

static bool norm_literals(void)
{
	struct or_norm n;
	bool ok = true;

	CHECK(or_normalize("SELECT a FROM documents WHERE organization_id = 17 AND id = 0042", &n));
	CHECK_STR(n.text, "SELECT a FROM documents WHERE organization_id = $1 AND id = $2");
	CHECK(n.n == 2);
	CHECK_STR(n.vals[0], "17");
	CHECK_STR(n.vals[1], "42");		/* as the parser prints an integer constant */
	CHECK_STR(n.toks[1], "0042");		/* ... and as written */
	or_norm_free(&n);
	CHECK(or_normalize("SELECT 1 FROM t WHERE o = '3' AND x <> 'it''s' LIMIT 20", &n));
	CHECK_STR(n.text, "SELECT $1 FROM t WHERE o = $2 AND x <> $3 LIMIT $4");
	CHECK_STR(n.vals[1], "3");
	CHECK_STR(n.vals[2], "it's");
	CHECK_STR(n.toks[2], "'it''s'");
end:
	or_norm_free(&n);
	return ok;
}

static bool norm_left_as_written(void)
{
	struct or_norm n;
	bool ok = true;

	CHECK(!or_normalize("SELECT a FROM t WHERE o = $1 AND id = 3", &n));	/* its own parameters */
	CHECK(!or_normalize("SELECT a FROM t", &n));				/* nothing to replace */
	CHECK(!or_normalize("SELECT a FROM t WHERE o = 'unterminated", &n));	/* scanner error */
	/* kept as written, the rest normalized */
	CHECK(or_normalize("SELECT E'a\\\\b', $$x$$, -5, 2.5, 'a\\\\b', 7 FROM t", &n));
	CHECK_STR(n.text, "SELECT E'a\\\\b', $$x$$, -5, 2.5, 'a\\\\b', $1 FROM t");
	CHECK(n.n == 1);
	or_norm_free(&n);
	CHECK(or_normalize("SELECT 'a'\n'b', 3000000000, 9", &n));			/* continuation, int8 */
	CHECK_STR(n.text, "SELECT 'a'\n'b', 3000000000, $1");
end:
	or_norm_free(&n);
	return ok;
}

/* Leaves of the test: documents_o<org>_1 for every organization, Projects_O5 for 5 only. */
static const char *leaf_named(void *arg, const char *schema, const char *table)
{
	static char buf[64];
	const char *org = arg;

	if (strcmp(schema, "public") == 0 && strcmp(table, "documents") == 0)
		snprintf(buf, sizeof(buf), "documents_o%s_1", org);
	else if (strcmp(schema, "My Schema") == 0 && strcmp(table, "Projects") == 0 && strcmp(org, "5") == 0)
		snprintf(buf, sizeof(buf), "Projects_O5");
	else
		return NULL;
	return buf;
}

static bool format_int(void)
{
	char buf[24];
	bool ok = true;

	CHECK(or_format_int(0, buf) == 1);
	CHECK_STR(buf, "0");
	CHECK(or_format_int(-42, buf) == 3);
	CHECK_STR(buf, "-42");
	CHECK(or_format_int(2147483647, buf) == 10);
	CHECK_STR(buf, "2147483647");
	CHECK(or_format_int(LLONG_MIN, buf) == 20);
	CHECK_STR(buf, "-9223372036854775808");
end:
	return ok;
}

static bool templates(void)
{
	struct or_norm n;
	char *tpl = NULL, *out = NULL;
	bool ok = true, no_leaf;

	CHECK(or_normalize("SELECT id FROM documents WHERE organization_id = 5 AND title = 'x''y' LIMIT 3", &n));
	tpl = or_template_encode("SELECT id FROM public.documents_o5_1 documents WHERE organization_id = $1 "
				 "AND title = $2 LIMIT $3", n.n);
	CHECK(tpl != NULL);
	out = or_template_fill(tpl, &n, NULL, NULL, &no_leaf);
	CHECK_STR(out, "SELECT id FROM public.documents_o5_1 documents WHERE organization_id = 5 "
		       "AND title = 'x''y' LIMIT 3");
	free(tpl);
	/* every placeholder exactly once, and only those */
	CHECK((tpl = or_template_encode("SELECT $1, $2", 3)) == NULL);
	CHECK((tpl = or_template_encode("SELECT $1, $1, $2, $3", 3)) == NULL);
	CHECK((tpl = or_template_encode("SELECT $1, $2, $3, $4", 3)) == NULL);
	/* a '$1' inside a string is not a placeholder */
	CHECK((tpl = or_template_encode("SELECT '$1', $2, $3", 3)) == NULL);
	/* leaf markers: each becomes the organization's leaf, written as the deparser writes names */
	free(out);
	out = NULL;
	CHECK((tpl = or_template_encode("SELECT d.id FROM public.\"\x03public\x05" "documents\x04\" d JOIN "
					"\"My Schema\".\"\x03My Schema\x05Projects\x04\" \"Projects\" ON $2 = $1 LIMIT $3",
					n.n)) != NULL);
	out = or_template_fill(tpl, &n, leaf_named, "5", &no_leaf);
	CHECK_STR(out, "SELECT d.id FROM public.documents_o5_1 d JOIN \"My Schema\".\"Projects_O5\" \"Projects\" "
		       "ON 'x''y' = 5 LIMIT 3");
	CHECK(!no_leaf);
	free(out);
	out = or_template_fill(tpl, &n, leaf_named, "6", &no_leaf);	/* organization 6 has no leaf of Projects */
	CHECK(out == NULL && no_leaf);
end:
	free(tpl);
	free(out);
	or_norm_free(&n);
	return ok;
}

/* A compiled template (or_template_compile/run, what org_routing uses per
 * message) fills exactly as the template's own walk (or_template_fill_buf):
 * same text, same failures, the same no_leaf; the buffer kept between calls. */
static bool compiled_templates_fill_as_the_text(void)
{
	static const char *const tpls[] = {
		"SELECT 1",
		"",
		"\"",
		"SELECT \"a\"\"b\" FROM \"t\" WHERE x = \x01" "1\x02",
		"INSERT INTO \"\x03public\x05" "documents\x04\" AS documents (organization_id, id, title) VALUES "
		"(\x01" "1\x02, \x01" "2\x02, \x01" "3\x02)",
		"SELECT d.id FROM \"\x03public\x05" "documents\x04\" d JOIN \"\x03My Schema\x05Projects\x04\" p "
		"ON \x01" "2\x02 = \x01" "1\x02",
		"SELECT \x01" "4\x02",			/* beyond the text's literals */
		"SELECT \x01" "0\x02",			/* no literal 0 */
		"SELECT \x01\x02",			/* no number */
		"SELECT \x01" "1 FROM t",		/* not closed */
		"SELECT \"\x03public\x05" "documents\" x",	/* a marker not closed */
		"SELECT \"\x03public\x05" "documents\x04 x",
		"SELECT \"\x03" "abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij\x05t\x04\"",
		"SELECT \"\x03My Schema\x05Projects\x04\", \x01" "1\x02",	/* no leaf for 6, before a literal */
		"SELECT \x01" "1\x02, \"\x03My Schema\x05Projects\x04\"\"",
		"SELECT \x01" "999999999999\x02",
	};
	static const char *const orgs[] = { "5", "6" };
	struct or_norm n;
	char *b1 = NULL, *b2 = NULL;
	size_t c1 = 0, c2 = 0;
	bool ok = true;

	CHECK(or_normalize("SELECT id FROM documents WHERE organization_id = 5 AND title = 'x''y' LIMIT 3", &n));
	for (size_t i = 0; i < sizeof(tpls) / sizeof(tpls[0]); i++) {
		struct or_tpl *t = or_template_compile(tpls[i]);
		CHECK(t != NULL);
		for (int with_n = 0; with_n < 2; with_n++)
			for (int lf = 0; lf < 2; lf++)
				for (size_t o = 0; o < 2; o++) {
					bool nl1 = true, nl2 = true, r1, r2;
					const struct or_norm *np = with_n ? &n : NULL;
					or_leaf_fn leaf = lf ? leaf_named : NULL;
					r1 = or_template_fill_buf(tpls[i], np, leaf, (void *)orgs[o], &nl1, &b1, &c1);
					r2 = or_template_run(t, np, leaf, (void *)orgs[o], &nl2, &b2, &c2, NULL);
					if (r1 != r2 || nl1 != nl2 || (r1 && strcmp(b1, b2) != 0)) {
						fprintf(stderr, "template %zu (n %d, leaf %d, org %s): %d/%d %d/%d\n", i,
							with_n, lf, orgs[o], r1, r2, nl1, nl2);
						ok = false;
					}
				}
		or_template_free(t);
	}
	/* names as the deparser writes them: bare only with a digit and nothing but [a-z0-9_] */
	{
		static const char *const names[][2] = {
			{ "versions_o42_1", "versions_o42_1" }, { "_1", "_1" }, { "versions", "\"versions\"" },
			{ "Versions_o4_1", "\"Versions_o4_1\"" }, { "v-1", "\"v-1\"" }, { "1v", "\"1v\"" },
			{ "a\"b1", "\"a\"\"b1\"" }, { "", "\"\"" }, { "caf\xc3\xa9_1", "\"caf\xc3\xa9_1\"" },
		};
		for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
			char buf[2 * NAMEDATALEN_OR + 3];
			buf[put_ident(buf, names[i][0])] = 0;
			CHECK_STR(buf, names[i][1]);
		}
	}
	/* the insert template, filled */
	{
		struct or_tpl *t = or_template_compile(tpls[4]);
		bool nl;
		CHECK(t != NULL);
		CHECK(or_template_run(t, &n, leaf_named, "5", &nl, &b2, &c2, NULL));
		CHECK_STR(b2, "INSERT INTO documents_o5_1 AS documents (organization_id, id, title) VALUES (5, 'x''y', 3)");
		or_template_free(t);
	}
end:
	free(b1);
	free(b2);
	or_norm_free(&n);
	return ok;
}

/* Leaves that stay where they are (a span keeps the callback's pointer, as
 * org_routing's, meta_cache's catalog, does). */
static const char *leaf_kept(void *arg, const char *schema, const char *table)
{
	(void)arg;
	if (strcmp(schema, "public") == 0 && strcmp(table, "documents") == 0)
		return "documents_o5_1";
	return strcmp(table, "Projects") == 0 ? "Projects_O5" : NULL;
}

/*
 * A leaf template whose markers carry their spans (pre.post.client), filled
 * for a message with literals of other lengths: each span is where the
 * filled text differs from the message's own, and every other byte is the
 * message's, in order (what the core checks, textmap_build).
 */
static bool template_spans(void)
{
	static const char msg[] = "SELECT d.id FROM documents d JOIN \"My Schema\".\"Projects\" ON d.title = 'a much longer "
				  "literal' WHERE documents_x = 12345";
	struct or_norm n = { 0 };
	struct or_tpl *t = NULL;
	struct or_spans sp;
	char *tpl = NULL, *buf = NULL, mark1[64], mark2[64], text[512];
	size_t cap = 0, s = 0, c = 0;
	bool ok = true, nl;

	CHECK(or_normalize(msg, &n) && n.n == 2);
	/* documents (9 bytes) -> public.<leaf>; "My Schema"."Projects" (22 bytes) -> "My Schema".<leaf> "Projects" */
	snprintf(mark1, sizeof(mark1), "\"\x03public\x05" "documents\x06" "7.0.9\x04\"");
	snprintf(mark2, sizeof(mark2), "\"\x03My Schema\x05Projects\x06" "12.11.22\x04\"");
	snprintf(text, sizeof(text), "SELECT d.id FROM public.%s d JOIN \"My Schema\".%s \"Projects\" ON d.title = $1 "
		 "WHERE documents_x = $2", mark1, mark2);
	CHECK((tpl = or_template_encode(text, n.n)) != NULL);
	CHECK((t = or_template_compile(tpl)) != NULL);
	CHECK(or_template_run(t, &n, leaf_kept, NULL, &nl, &buf, &cap, &sp));
	CHECK_STR(buf, "SELECT d.id FROM public.documents_o5_1 d JOIN \"My Schema\".\"Projects_O5\" \"Projects\" ON "
		       "d.title = 'a much longer literal' WHERE documents_x = 12345");
	CHECK(!sp.bad && sp.n == 2);
	CHECK_STR(sp.s[0].name, "documents_o5_1");
	CHECK_STR(sp.s[0].client_name, "documents");
	CHECK_STR(sp.s[1].name, "Projects_O5");
	CHECK_STR(sp.s[1].client_name, "Projects");
	for (int i = 0; i < sp.n; i++) {
		size_t seg = sp.s[i].at - s;
		CHECK(sp.s[i].at >= s && memcmp(buf + s, msg + c, seg) == 0);
		s = sp.s[i].at + sp.s[i].len;
		c += seg + sp.s[i].client_len;
	}
	CHECK_STR(buf + s, msg + c);
	CHECK(strncmp(buf + sp.s[0].at, "public.documents_o5_1", sp.s[0].len) == 0);
	CHECK(strncmp(buf + sp.s[1].at, "\"My Schema\".\"Projects_O5\" \"Projects\"", sp.s[1].len) == 0 &&
	      sp.s[1].len == 36 && sp.s[1].client_len == 22);
	/* a marker without its numbers: no spans */
	or_template_free(t);
	free(tpl);
	snprintf(text, sizeof(text), "SELECT 1 FROM public.\"\x03public\x05" "documents\x04\" WHERE a = $1 AND b = $2");
	CHECK((tpl = or_template_encode(text, n.n)) != NULL);
	CHECK((t = or_template_compile(tpl)) != NULL);
	CHECK(or_template_run(t, &n, leaf_kept, NULL, &nl, &buf, &cap, &sp));
	CHECK(sp.bad);
end:
	or_template_free(t);
	free(tpl);
	free(buf);
	or_norm_free(&n);
	return ok;
}

/* Normalize `sql` twice: through the shape of an earlier text (if any),
 * then with the shapes forgotten (the scanner): both results must be equal. */
static bool same_both_ways(const char *sql, bool *normalized)
{
	struct or_norm a, b, k;
	bool ra, rb, rk, ok = true;

	memset(&b, 0, sizeof(b));
	rk = or_normalize_known(sql, &k);	/* the last shape first, then by skeleton */
	ra = or_normalize(sql, &a);
	if (rk) {
		CHECK(ra);
		CHECK_STR(k.text, a.text);
		CHECK(k.n == a.n);
		for (int i = 0; i < a.n && i < k.n; i++) {
			CHECK_STR(k.vals[i], a.vals[i]);
			CHECK_STR(k.toks[i], a.toks[i]);
			CHECK(k.lens[i] == a.lens[i]);
		}
	}
	or_shapes_free();
	rb = or_normalize(sql, &b);
	*normalized = ra;
	CHECK(ra == rb);
	if (ra) {
		CHECK_STR(a.text, b.text);
		CHECK(a.n == b.n);
		for (int i = 0; i < a.n && i < b.n; i++) {
			CHECK_STR(a.vals[i], b.vals[i]);
			CHECK_STR(a.toks[i], b.toks[i]);
			CHECK(a.lens[i] == strlen(a.toks[i]) && b.lens[i] == strlen(b.toks[i]));
		}
	}
end:
	if (!ok)
		fprintf(stderr, "  text: %s\n", sql);
	or_norm_free(&k);
	or_norm_free(&a);
	or_norm_free(&b);
	return ok;
}

static bool shapes_give_what_the_scanner_gives(void)
{
	static const char *const pairs[][2] = {
		{ "SELECT a FROM t WHERE o = 17 AND id = 42", "SELECT a FROM t WHERE o = 3 AND id = 900000" },
		{ "SELECT 'x''y', 5 FROM t", "SELECT 'it''s ''q''', 0007 FROM t" },
		{ "SELECT /* $1 */ 5, '$2'", "SELECT /* $1 */ 6, 'a $1'" },
		/* a literal left as written right after a placeholder (a too large integer) */
		{ "SELECT 'a'3000000000 x", "SELECT 'b' x" },
		{ "SELECT 'a'3000000000 x", "SELECT 'b'3000000000 x" },
		/* the same skeleton, other kinds or forms: scanned */
		{ "SELECT 5", "SELECT 3000000000" },
		{ "SELECT 'a'", "SELECT 'a\\b'" },
		{ "SELECT 'a'", "SELECT 'a'\n'b'" },
		{ "SELECT 'a' 'b'", "SELECT 'a''b'" },
		{ "SELECT 5 FROM t", "SELECT 5.5 FROM t" },
		{ "SELECT 1, 2", "SELECT 1, -2" },
		{ "SELECT 12 x", "SELECT 1 2 x" },
		{ "SELECT 'a', 1", "SELECT '', 1" },
		{ "SELECT 1", "SELECT 1; SELECT $1" },
		{ "SELECT 'a' -- x\n, 1", "SELECT 'b' -- x\n, 2" },
		/* integers around 10^9 and 2^31, zeros; strings empty, plain, with quotes */
		{ "SELECT 1, 'a'", "SELECT 999999999, ''" },
		{ "SELECT 1, 'a'", "SELECT 1000000000, 'x y'" },
		{ "SELECT 1, 'a'", "SELECT 2147483647, ''''" },
		{ "SELECT 1, 'a'", "SELECT 2147483648, 'a'" },
		{ "SELECT 1, 'a'", "SELECT 0, 'a''b'''" },
		{ "SELECT 1, 'a'", "SELECT 00, 'ab'" },
		{ "SELECT 1, 'a'", "SELECT 0123456789, '\"q\"'" },
		{ "SELECT 1, 'a'", "SELECT 00000000002147483647, 'q'" },
	};
	bool ok = true, normalized = false;

	for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
		struct or_norm n;
		or_shapes_free();
		if (or_normalize(pairs[i][0], &n))	/* its shape is remembered */
			or_norm_free(&n);
		CHECK(same_both_ways(pairs[i][1], &normalized));
	}
	/* a text of a known shape is normalized without the scanner, the same way */
	or_shapes_free();
	{
		struct or_norm n;
		CHECK(or_normalize("SELECT 1 FROM t WHERE o = '9'", &n));
		or_norm_free(&n);
		unsigned fl;
		size_t len;
		CHECK(shapes && shapes[skeleton("SELECT 2 FROM t WHERE o = '10'", &fl, &len) % SHAPES].norm);
		CHECK(fl == SK_LIT && len == strlen("SELECT 2 FROM t WHERE o = '10'"));
		CHECK(same_both_ways("SELECT 2 FROM t WHERE o = '10'", &normalized) && normalized);
	}
end:
	or_shapes_free();
	return ok;
}

/*
 * Literals of every kind, each text normalized by the scanner and then a
 * second text of the same shape (through the shape, checked against the
 * scanner): strings with quotes, E'' strings, dollar quotes, numbers,
 * negative numbers, casts, comments.
 */
static bool every_kind_of_literal(void)
{
	static const struct {
		const char *sql, *same_shape, *norm;	/* norm NULL: not normalized */
		const char *vals[4], *toks[4];
	} t[] = {
		{ "SELECT * FROM t WHERE a = 'it''s' AND b = ''", "SELECT * FROM t WHERE a = 'x' AND b = '''q'''",
		  "SELECT * FROM t WHERE a = $1 AND b = $2", { "it's", "" }, { "'it''s'", "''" } },
		{ "SELECT E'a\\nb', 4", "SELECT E'a\\nb', 5", "SELECT E'a\\nb', $1", { "4" }, { "4" } },
		{ "SELECT $$a'b$$, 'c'", "SELECT $$a'b$$, 'dd'", "SELECT $$a'b$$, $1", { "c" }, { "'c'" } },
		{ "SELECT $q$x$q$ || 'y' FROM t WHERE o = 7", "SELECT $q$x$q$ || 'z' FROM t WHERE o = 8",
		  "SELECT $q$x$q$ || $1 FROM t WHERE o = $2", { "y", "7" }, { "'y'", "7" } },
		{ "SELECT 0012, 2147483647, 2147483648, 1.5, 1e3", "SELECT 9, 1, 2147483648, 1.5, 1e3",
		  "SELECT $1, $2, 2147483648, 1.5, 1e3", { "12", "2147483647" }, { "0012", "2147483647" } },
		{ "SELECT -5, - 6, +7, 8 - 9", "SELECT -5, - 6, +7, 4 - 9",
		  "SELECT -5, - 6, +7, $1 - 9", { "8" }, { "8" } },
		{ "SELECT '5'::int, 6::bigint, CAST('7' AS int)", "SELECT '1'::int, 2::bigint, CAST('3' AS int)",
		  "SELECT $1::int, $2::bigint, CAST($3 AS int)", { "5", "6", "7" }, { "'5'", "6", "'7'" } },
		{ "SELECT /* 'no' 1 */ 2 -- 3 'x'\n, 'y'", "SELECT /* 'no' 1 */ 4 -- 3 'x'\n, 'z'",
		  "SELECT /* 'no' 1 */ $1 -- 3 'x'\n, $2", { "2", "y" }, { "2", "'y'" } },
		{ "SELECT 'a\\b', U&'c', B'101', X'1f', E'e'", NULL, NULL, { NULL }, { NULL } },
		{ "SELECT 1 FROM t WHERE o = $1", NULL, NULL, { NULL }, { NULL } },
		{ "SELECT \"a1\", x2 FROM t3", NULL, NULL, { NULL }, { NULL } },
	};
	bool ok = true;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct or_norm n;
		bool normalized;
		or_shapes_free();
		if (!t[i].norm) {
			CHECK(!or_normalize(t[i].sql, &n));
			CHECK(n.n == 0 && n.text == NULL && n.mem == NULL);
			continue;
		}
		CHECK(or_normalize(t[i].sql, &n));
		CHECK_STR(n.text, t[i].norm);
		CHECK(n.n <= 4 && (n.n == 4 || t[i].vals[n.n] == NULL));
		for (int k = 0; k < n.n; k++) {
			CHECK(t[i].vals[k] && t[i].toks[k]);
			CHECK_STR(n.vals[k], t[i].vals[k]);
			CHECK_STR(n.toks[k], t[i].toks[k]);
			CHECK(n.lens[k] == strlen(t[i].toks[k]));
		}
		or_norm_free(&n);
		/* the second text, through the shape, gives what the scanner gives */
		CHECK(same_both_ways(t[i].same_shape, &normalized) && normalized);
	}
end:
	if (!ok)
		fprintf(stderr, "  every_kind_of_literal failed\n");
	or_shapes_free();
	return ok;
}

/* The prefilter's memo of a shape: usable only where its answer decomposes. */
static bool shape_prefilter_memo(void)
{
	static const struct {
		const char *first, *second;
		bool usable;
	} t[] = {
		{ "SELECT a FROM t WHERE o = 1 AND s = 'x'", "SELECT a FROM t WHERE o = 2 AND s = 'lokadb'", true },
		{ "SELECT \"a\" FROM \"t\" WHERE o = 1", "SELECT \"a\" FROM \"t\" WHERE o = 22", true },
		/* a literal inside a quoted word of the prefilter (a double quote in a comment) */
		{ "SELECT a /* \" */, 'x' /* \" */ FROM t", "SELECT a /* \" */, 'y' /* \" */ FROM t", false },
		/* a literal right after a word byte: N'x' is read as the word n */
		{ "SELECT N'x' FROM t", "SELECT N'y' FROM t", false },
		/* a string literal with a double quote */
		{ "SELECT 'x' FROM t", "SELECT 'a\"b' FROM t", false },
	};
	bool ok = true;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct or_norm n;
		unsigned mm = 0;
		or_shapes_free();
		CHECK(!or_normalize_known(t[i].first, &n));	/* no shape yet */
		CHECK(or_normalize(t[i].first, &n));
		CHECK(n.shape != 0);
		or_shape_mm_put(&n, 1, 2, 5u);
		or_norm_free(&n);
		CHECK(or_normalize_known(t[i].second, &n));
		CHECK(or_shape_mm_usable(&n) == t[i].usable);
		CHECK(or_shape_mm_get(&n, 1, 2, &mm) && mm == 5u);
		CHECK(!or_shape_mm_get(&n, 1, 3, &mm) && !or_shape_mm_get(&n, 9, 2, &mm));
		or_norm_free(&n);
	}
	/* a shape replaced: its memo goes with it */
	{
		struct or_norm n, m;
		unsigned mm;
		or_shapes_free();
		CHECK(or_normalize("SELECT 1 FROM t", &n));
		or_shape_mm_put(&n, 1, 2, 5u);
		or_shapes_free();
		CHECK(!or_shape_mm_get(&n, 1, 2, &mm));
		CHECK(or_normalize("SELECT 1 FROM t", &m));
		CHECK(!or_shape_mm_get(&m, 1, 2, &mm));
		or_norm_free(&n);
		or_norm_free(&m);
	}
end:
	or_shapes_free();
	return ok;
}

/* Several shapes known: each text is tried on the shape matched last, then
 * found by its skeleton; either way it gets what the scanner gives, and a
 * text of no known shape is not normalized by or_normalize_known. */
static bool the_last_shape_first(void)
{
	static const char *const texts[] = {
		"INSERT INTO v (o, d, b) VALUES (5, 91, 'edited')",
		"SELECT a FROM t WHERE o = 7 AND id = 3",
		"INSERT INTO v (o, d, b) VALUES (6, 92, 'it''s')",
		"INSERT INTO v (o, d, b) VALUES (6, 92, 'x') RETURNING 1",
		"SELECT a FROM t WHERE o = 7 AND id = 3",
		"SELECT a FROM t WHERE o = 8 AND id = 4",
		"INSERT INTO v (o, d, b) VALUES (5, 91, 'edited')",
		"INSERT INTO v (o, d, b) VALUES ('5', 91, 'edited')",
		"INSERT INTO v (o, d, b) VALUES (5, 91, 'edited')",
	};
	bool ok = true, normalized;

	or_shapes_free();
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		struct or_norm n;
		bool known = or_normalize_known(texts[i], &n);
		or_norm_free(&n);
		/* known exactly when an earlier text had its shape (the scanner's) */
		CHECK(known == (i == 2 || i == 4 || i == 5 || i == 6 || i == 8));
		CHECK(same_both_ways(texts[i], &normalized) && normalized);
		/* same_both_ways forgot the shapes: learn every earlier one again */
		for (size_t j = 0; j <= i; j++)
			if (or_normalize(texts[j], &n))
				or_norm_free(&n);
	}
end:
	or_shapes_free();
	return ok;
}

static const struct unit_case cases[] = {
	{ "the prefilter memo of a shape", shape_prefilter_memo },
	{ "every kind of literal", every_kind_of_literal },
	{ "literals become $n", norm_literals },
	{ "forms left as written", norm_left_as_written },
	{ "integers written as PostgreSQL writes them", format_int },
	{ "templates", templates },
	{ "compiled templates fill as the text", compiled_templates_fill_as_the_text },
	{ "a template gives the spans where it differs", template_spans },
	{ "shapes give what the scanner gives", shapes_give_what_the_scanner_gives },
	{ "the last shape first", the_last_shape_first },
	{ NULL, NULL }
};
UNIT_MAIN("normalize", cases)
