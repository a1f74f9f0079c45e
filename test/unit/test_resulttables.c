/* SPDX-License-Identifier: ISC */
/*
 * test_resulttables.c -- unit tests of src/resulttables.c: RowDescriptions
 * renamed in place by a plugin's tables, and a client's statement and
 * portal names that carry them.
 */
#include "resulttables.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A RowDescription body: columns (name, table OID, column number), type text. */
static size_t row_description(uint8_t *b, int n, const char *const *names, const uint32_t *oids, const int16_t *nums)
{
	size_t o = 2;

	b[0] = 0;
	b[1] = (uint8_t)n;
	for (int i = 0; i < n; i++) {
		size_t l = strlen(names[i]) + 1;
		memcpy(b + o, names[i], l);
		o += l;
		b[o++] = (uint8_t)(oids[i] >> 24);
		b[o++] = (uint8_t)(oids[i] >> 16);
		b[o++] = (uint8_t)(oids[i] >> 8);
		b[o++] = (uint8_t)oids[i];
		b[o++] = (uint8_t)((uint16_t)nums[i] >> 8);
		b[o++] = (uint8_t)nums[i];
		memcpy(b + o, "\0\0\0\x19\xff\xff\xff\xff\xff\xff\0\0", 12);	/* text, -1, -1, text format */
		o += 12;
	}
	return o;
}

static uint32_t oid_at(const uint8_t *b, const char *name)
{
	const uint8_t *f = (const uint8_t *)memmem(b, 400, name, strlen(name) + 1) + strlen(name) + 1;
	return (uint32_t)f[0] << 24 | (uint32_t)f[1] << 16 | (uint32_t)f[2] << 8 | f[3];
}

static int num_at(const uint8_t *b, const char *name)
{
	const uint8_t *f = (const uint8_t *)memmem(b, 400, name, strlen(name) + 1) + strlen(name) + 1;
	return f[4] << 8 | f[5];
}

static bool test_partition_columns_become_their_tables(void)
{
	bool ok = true;
	const lk_table_oid t[] = { { 7001, 500, NULL }, { 7002, 600, "6:7,7:8" } };
	const char *const names[] = { "id", "note", "body", "one", "title", "exactly8", "a_column_name_of_31_characters_", "" };
	const uint32_t oids[] = { 7001, 7002, 9000, 0, 7002, 7001, 7002, 7001 };
	const int16_t nums[] = { 2, 6, 3, 0, 2, 5, 7, 1 };
	uint8_t b[512], before[512];
	size_t n = row_description(b, 8, names, oids, nums);
	struct lk_tables *m = rt_tables_new(t, 2);

	CHECK(m != NULL);
	memcpy(before, b, n);
	CHECK(rt_fix_row_description(m, b, (uint32_t)n));
	CHECK(oid_at(b, "id") == 500 && num_at(b, "id") == 2);
	CHECK(oid_at(b, "note") == 600 && num_at(b, "note") == 7);	/* a number that differs */
	CHECK(oid_at(b, "title") == 600 && num_at(b, "title") == 2);	/* one that does not */
	CHECK(oid_at(b, "body") == 9000 && num_at(b, "body") == 3);	/* another relation's */
	CHECK(oid_at(b, "one") == 0);					/* no relation's */
	CHECK(oid_at(b, "exactly8") == 500 && num_at(b, "exactly8") == 5);
	CHECK(oid_at(b, "a_column_name_of_31_characters_") == 600 && num_at(b, "a_column_name_of_31_characters_") == 8);
	CHECK(b[n - 18] == 0 && b[n - 17] == 0 && b[n - 16] == 0x01 && b[n - 15] == 0xf4);	/* "": 500 */
	/* done twice: the same (a RowDescription waited for is looked at again) */
	CHECK(rt_fix_row_description(m, b, (uint32_t)n));
	CHECK(oid_at(b, "note") == 600 && num_at(b, "note") == 7);
	/* a cut one is refused, and nothing past its end is read or written */
	memcpy(b, before, n);
	b[n - 3] = 0x5a;
	CHECK(!rt_fix_row_description(m, b, (uint32_t)n - 3));
	CHECK(b[n - 3] == 0x5a);
	CHECK(!rt_fix_row_description(m, b, 1));
end:
	rt_tables_release(m);
	return ok;
}

static bool test_bad_attnums_give_no_tables(void)
{
	bool ok = true;
	const lk_table_oid bad[] = { { 7001, 500, "6-7" } }, zero[] = { { 0, 500, NULL } };
	struct lk_tables *m = rt_tables_new(bad, 1);

	CHECK(m == NULL);
	CHECK((m = rt_tables_new(zero, 1)) == NULL);
	CHECK((m = rt_tables_new(NULL, 0)) != NULL);
end:
	rt_tables_release(m);
	return ok;
}

static bool test_names_keep_a_reference_until_forgotten(void)
{
	bool ok = true;
	const lk_table_oid t[] = { { 7001, 500, NULL } };
	struct lk_tables *m = rt_tables_new(t, 1);
	struct rt_names r = { 0 };

	CHECK(m != NULL);
	CHECK(rt_names_set(&r, 'S', "s1", m) && rt_names_set(&r, 'S', "", m) && rt_names_set(&r, 'P', "s1", m));
	rt_tables_release(m);		/* the names hold it now */
	m = NULL;
	CHECK(r.n == 3);
	CHECK(rt_names_get(&r, 'S', "s1") != NULL && rt_names_get(&r, 'P', "s1") != NULL);
	CHECK(rt_names_get(&r, 'P', "") == NULL && rt_names_get(&r, 'S', "s2") == NULL);
	CHECK(rt_names_set(&r, 'S', "s1", NULL));	/* Close, or a Parse without tables */
	CHECK(rt_names_get(&r, 'S', "s1") == NULL && rt_names_get(&r, 'S', "") != NULL && r.n == 2);
	CHECK(rt_names_set(&r, 'S', "nothing", NULL) && r.n == 2);
	/* a driver that never Closes: the most recent names are kept */
	m = rt_tables_ref(rt_names_get(&r, 'S', ""));
	for (int i = 0; i < 3 * RT_NAMES_MAX; i++) {
		char name[16];
		snprintf(name, sizeof(name), "_pg3_%d", i);
		CHECK(rt_names_set(&r, 'S', name, m));
	}
	CHECK(r.n == RT_NAMES_MAX);
	CHECK(rt_names_get(&r, 'S', "_pg3_191") != NULL && rt_names_get(&r, 'S', "_pg3_128") != NULL);
	CHECK(rt_names_get(&r, 'S', "_pg3_127") == NULL && rt_names_get(&r, 'S', "") == NULL);
end:
	rt_names_free(&r);
	rt_tables_release(m);
	return ok;
}

static const struct unit_case cases[] = {
	{ "partition columns become their tables", test_partition_columns_become_their_tables },
	{ "bad attnums give no tables", test_bad_attnums_give_no_tables },
	{ "names keep a reference until forgotten", test_names_keep_a_reference_until_forgotten },
	{ NULL, NULL }
};

UNIT_MAIN("resulttables", cases)
