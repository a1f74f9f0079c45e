/* SPDX-License-Identifier: ISC */
/*
 * test_hba.c -- unit tests of src/hba.c: parsing auth_hba_file rules (and
 * refusing what PgBouncer refuses, with the line number) and the matching
 * of connections against them (first match wins, no match = NULL).
 */
#include "hba.h"
#include "unit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ERR_LEN 512

/* A client address: "unix", an IPv4 or an IPv6 literal. */
static struct sockaddr_storage addr_of(const char *text)
{
	struct sockaddr_storage ss;

	memset(&ss, 0, sizeof(ss));
	if (strcmp(text, "unix") == 0) {
		ss.ss_family = AF_UNIX;
	} else if (strchr(text, ':')) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		in6->sin6_family = AF_INET6;
		inet_pton(AF_INET6, text, &in6->sin6_addr);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		in->sin_family = AF_INET;
		inet_pton(AF_INET, text, &in->sin_addr);
	}
	return ss;
}

/* The method name of the rule matching, "none" when no rule does, plus its line. */
static const char *eval(const struct hba *h, const char *addr, bool tls, const char *db, const char *user, int *line)
{
	struct sockaddr_storage ss = addr_of(addr);
	const struct hba_rule *r = hba_match(h, &ss, tls, db, user);

	*line = r ? r->line : 0;
	return r ? hba_method_name(r->method) : "none";
}

static const char rules[] =
	"# comment line\n"
	"\n"
	"local   all        pgbouncer                    peer\n"
	"local   all        all                          trust\n"
	"host    app,\"all\"  alice,bob   10.0.0.0/8       md5   # trailing comment\n"
	"hostssl all        carol       0.0.0.0/0        cert\n"
	"hostnossl all      carol       0.0.0.0/0        reject\n"
	"host    sameuser   all         192.168.1.0 255.255.255.0 scram-sha-256\n"
	"host    all        dave        2001:db8::/32    password\n"
	"host    \"Odd \"\"db\"\"\" all    all              trust\n"
	"host    all        all         127.0.0.1/32     md5\n";

static bool test_match(void)
{
	char err[ERR_LEN] = "";
	struct hba *h = hba_parse(rules, "hba.conf", err, sizeof(err));
	int line;
	bool ok = true;

	CHECK(h);
	CHECK(h->n == 9);
	CHECK_STR(eval(h, "unix", false, "x", "pgbouncer", &line), "peer");
	CHECK(line == 3);
	CHECK_STR(eval(h, "unix", false, "x", "eve", &line), "trust");
	CHECK(line == 4);
	/* name lists; a quoted "all" is the database named all */
	CHECK_STR(eval(h, "10.1.2.3", false, "app", "bob", &line), "md5");
	CHECK(line == 5);
	CHECK_STR(eval(h, "10.1.2.3", false, "all", "alice", &line), "md5");
	CHECK_STR(eval(h, "10.1.2.3", false, "other", "alice", &line), "none");
	CHECK_STR(eval(h, "11.0.0.1", false, "app", "bob", &line), "none");
	CHECK_STR(eval(h, "11.0.0.1", false, "Odd \"db\"", "bob", &line), "trust");
	CHECK(line == 10);
	CHECK_STR(eval(h, "127.0.0.1", false, "Odd", "bob", &line), "md5");
	/* hostssl vs hostnossl */
	CHECK_STR(eval(h, "8.8.8.8", true, "db", "carol", &line), "cert");
	CHECK(line == 6);
	CHECK_STR(eval(h, "8.8.8.8", false, "db", "carol", &line), "reject");
	CHECK(line == 7);
	/* sameuser and a dotted netmask */
	CHECK_STR(eval(h, "192.168.1.77", false, "frank", "frank", &line), "scram-sha-256");
	CHECK(line == 8);
	/* IPv6 CIDR; IPv4-mapped IPv6 counts as IPv4 */
	CHECK_STR(eval(h, "2001:db8:1::5", false, "x", "dave", &line), "password");
	CHECK_STR(eval(h, "::ffff:192.168.1.5", false, "grace", "grace", &line), "scram-sha-256");
end:
	hba_free(h);
	return ok;
}

static bool test_first_match_and_no_match(void)
{
	char err[ERR_LEN] = "";
	struct hba *h = hba_parse("host all alice 127.0.0.1/32 reject\n"
				  "host all all 127.0.0.0/8 trust\n"
				  "host p0 all ::1/128 md5\n", "t", err, sizeof(err));
	int line;
	bool ok = true;

	CHECK(h);
	CHECK_STR(eval(h, "127.0.0.1", false, "p0", "alice", &line), "reject");
	CHECK_STR(eval(h, "127.0.0.2", false, "p0", "alice", &line), "trust");
	CHECK_STR(eval(h, "::1", false, "p0", "bob", &line), "md5");
	CHECK_STR(eval(h, "::1", false, "p1", "bob", &line), "none");
	CHECK_STR(eval(h, "10.0.0.1", false, "p0", "bob", &line), "none");
	CHECK_STR(eval(h, "unix", false, "p0", "bob", &line), "none");		/* no local rule */
	CHECK(line == 0);
end:
	hba_free(h);
	return ok;
}

static bool test_address_all_and_host_bits(void)
{
	char err[ERR_LEN] = "";
	struct hba *h = hba_parse("host all all 10.1.2.3/8 md5\nhost all all all trust\n", "t", err, sizeof(err));
	int line;
	bool ok = true;

	CHECK(h);
	CHECK_STR(eval(h, "10.200.0.1", false, "d", "u", &line), "md5");	/* host bits of the rule ignored */
	CHECK_STR(eval(h, "fe80::1", false, "d", "u", &line), "trust");
	CHECK_STR(eval(h, "unix", false, "d", "u", &line), "none");
end:
	hba_free(h);
	return ok;
}

/* Each bad line is refused with its number and a reason. */
static bool test_errors(void)
{
	static const struct {
		const char *text, *want;
	} bad[] = {
		{ "hostgssenc all all all trust\n", "t:1: invalid connection type \"hostgssenc\"" },
		{ "\nlocal replication all peer\n", "t:2: \"replication\" is not supported" },
		{ "local samerole all trust\n", "t:1: \"samerole\" is not supported" },
		{ "local all +admins trust\n", "t:1: role membership (\"+admins\") is not supported" },
		{ "local all @/nonexistent/users.txt trust\n", "t:1: could not open \"/nonexistent/users.txt\"" },
		{ "local all @/dev/null trust\n", "t:1: could not open \"/dev/null\": not a regular file" },
		{ "local all @ trust\n", "t:1: missing file name after \"@\"" },
		{ "host all all db.example.com trust\n", "t:1: invalid IP address \"db.example.com\" (host names" },
		{ "host all all 10.0.0.0/33 trust\n", "t:1: invalid CIDR mask \"/33\"" },
		{ "host all all ::1/129 trust\n", "t:1: invalid CIDR mask \"/129\"" },
		{ "host all all 10.0.0.0 trust\n", "t:1: invalid netmask \"trust\"" },
		{ "host all all samenet trust\n", "t:1: \"samenet\" is not supported" },
		{ "local all all ident\n", "t:1: authentication method \"ident\" is not supported by this version of lokadb" },
		{ "local all all md6\n", "t:1: invalid authentication method \"md6\"" },
		{ "host all all all peer\n", "t:1: peer authentication is only supported on local sockets" },
		{ "local all all cert\n", "t:1: cert authentication is only supported" },
		{ "host all all all scram-sha-256 clientcert=verify-full\n",
		  "t:1: authentication options (\"clientcert=verify-full\") are not supported" },
		{ "local all\n", "t:1: end of line before the user field" },
		{ "local all,,x trust\n", "t:1: unexpected \",\" before the database field" },
		{ "local \"all trust\n", "t:1: unterminated quoted string" },
		{ "host all all\n", "t:1: end of line before the address field" },
		{ NULL, NULL }
	};
	bool ok = true;

	for (int i = 0; bad[i].text; i++) {
		char err[ERR_LEN] = "";
		struct hba *h = hba_parse(bad[i].text, "t", err, sizeof(err));
		if (h || strncmp(err, bad[i].want, strlen(bad[i].want)) != 0) {
			fprintf(stderr, "  case %d: got \"%s\", want \"%s...\"\n", i, err, bad[i].want);
			hba_free(h);
			ok = false;
		}
	}
	return ok;
}

static bool test_load_file(void)
{
	char path[] = "/tmp/lokadb-hba-XXXXXX", err[ERR_LEN] = "";
	int fd = mkstemp(path);
	struct hba *h = NULL;
	bool ok = true;

	CHECK(fd >= 0);
	CHECK(write(fd, "local all all trust\nhost all all 127.0.0.1/32 reject extra\n", 59) == 59);
	close(fd);
	h = hba_load(path, err, sizeof(err));
	CHECK(!h);
	CHECK(strstr(err, ":2: authentication options (\"extra\")") != NULL);
	CHECK(strncmp(err, path, strlen(path)) == 0);
	h = hba_load("/nonexistent/hba.conf", err, sizeof(err));
	CHECK(!h);
	CHECK(strstr(err, "auth_hba_file: could not open \"/nonexistent/hba.conf\"") != NULL);
end:
	hba_free(h);
	unlink(path);
	return ok;
}

static bool write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return false;
	fputs(text, f);
	return fclose(f) == 0;
}

/* @FILE: names from a file next to the rules file, nested, with its errors' file and line. */
static bool test_name_files(void)
{
	char dir[] = "/tmp/lokadb-hba-XXXXXX", path[256], err[ERR_LEN] = "";
	struct hba *h = NULL;
	int line;
	bool ok = true;

	CHECK(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/users", dir);
	CHECK(write_file(path, "# staff\nalice, bob\n\"carol x\" @more\n"));
	snprintf(path, sizeof(path), "%s/more", dir);
	CHECK(write_file(path, "dave\n"));
	snprintf(path, sizeof(path), "%s/hba.conf", dir);
	CHECK(write_file(path, "host all @users 127.0.0.1/32 md5\nhost all all 127.0.0.1/32 reject\n"));
	h = hba_load(path, err, sizeof(err));
	CHECK(h);
	CHECK_STR(eval(h, "127.0.0.1", false, "d", "bob", &line), "md5");
	CHECK_STR(eval(h, "127.0.0.1", false, "d", "carol x", &line), "md5");
	CHECK_STR(eval(h, "127.0.0.1", false, "d", "dave", &line), "md5");
	CHECK_STR(eval(h, "127.0.0.1", false, "d", "eve", &line), "reject");
	hba_free(h);
	h = NULL;
	snprintf(path, sizeof(path), "%s/more", dir);
	CHECK(write_file(path, "dave\n+admins\n"));
	snprintf(path, sizeof(path), "%s/hba.conf", dir);
	h = hba_load(path, err, sizeof(err));
	CHECK(!h);
	CHECK(strstr(err, "hba.conf:1: ") && strstr(err, "/more:2: role membership"));	/* the innermost place */
	snprintf(path, sizeof(path), "%s/more", dir);
	CHECK(write_file(path, "@more\n"));		/* includes itself */
	snprintf(path, sizeof(path), "%s/hba.conf", dir);
	h = hba_load(path, err, sizeof(err));
	CHECK(!h);
	if (!strstr(err, "name files nested too deeply"))
		fprintf(stderr, "  error was: %s\n", err);
	CHECK(strstr(err, "name files nested too deeply") != NULL);
end:
	hba_free(h);
	for (const char *const *f = (const char *const[]){ "users", "more", "hba.conf", NULL }; *f; f++) {
		snprintf(path, sizeof(path), "%s/%s", dir, *f);
		unlink(path);
	}
	rmdir(dir);
	return ok;
}

static const struct unit_case cases[] = {
	{ "name files", test_name_files },
	{ "matching", test_match },
	{ "first match wins, no match is none", test_first_match_and_no_match },
	{ "address all and host bits", test_address_all_and_host_bits },
	{ "errors with line numbers", test_errors },
	{ "load file", test_load_file },
	{ NULL, NULL }
};

UNIT_MAIN("hba", cases)
