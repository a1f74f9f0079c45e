/* SPDX-License-Identifier: ISC */
/*
 * unit.h -- the tiny C unit test framework of LokaDB.
 *
 * A test file defines cases as `static bool name(void)` returning true on
 * success, lists them in a table and ends with UNIT_MAIN(table):
 *
 *	static const struct unit_case cases[] = {
 *		{ "rfc7677 client proof", test_client_proof },
 *		{ NULL, NULL }
 *	};
 *	UNIT_MAIN("scram", cases)
 *
 * The binary prints one line per failing case and ends with
 * "GROUP: N passed, N failed"; its exit code is the number of failures.
 * CHECK(cond) logs the failing condition with file and line and makes the
 * case fail (it jumps to the case's `end:` label, so cleanup still runs).
 */
#ifndef LOKADB_UNIT_H
#define LOKADB_UNIT_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct unit_case {
	const char *name;
	bool (*fn)(void);
};

#define CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
		ok = false; goto end; \
	} \
} while (0)

#define CHECK_STR(a, b) do { \
	const char *_a = (a), *_b = (b); \
	if (!_a || !_b || strcmp(_a, _b) != 0) { \
		fprintf(stderr, "  %s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, \
			#a, _a ? _a : "(null)", _b ? _b : "(null)"); \
		ok = false; goto end; \
	} \
} while (0)

#define UNIT_MAIN(group, table) \
int main(void) \
{ \
	int passed = 0, failed = 0; \
	for (const struct unit_case *uc = (table); uc->name; uc++) { \
		if (uc->fn()) { \
			passed++; \
		} else { \
			failed++; \
			fprintf(stderr, "FAIL %s: %s\n", (group), uc->name); \
		} \
	} \
	printf("%s: %d passed, %d failed\n", (group), passed, failed); \
	return failed; \
}

#endif
