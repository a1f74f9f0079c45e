/* SPDX-License-Identifier: ISC */
/*
 * hba.c -- the rules of auth_hba_file (auth_type = hba): which connections
 * may log in, and how they must prove who they are.
 *
 * The format is PgBouncer's subset of pg_hba.conf. One rule per line:
 *
 *	local      DATABASE USER         METHOD
 *	host       DATABASE USER ADDRESS METHOD
 *	hostssl    DATABASE USER ADDRESS METHOD
 *	hostnossl  DATABASE USER ADDRESS METHOD
 *
 * DATABASE and USER are comma-separated lists of names, `all`, (database
 * only) `sameuser`, or `@FILE` for the names in FILE (relative to the rules
 * file's directory); a name in double quotes ("" for a quote) is taken
 * literally, so "all" names a database called all. ADDRESS is `all`, an
 * IPv4/IPv6 address with a /CIDR length, or an address followed by a mask
 * field. METHOD is trust, reject, md5, scram-sha-256, password, cert or peer.
 * `#` starts a comment.
 *
 * What PostgreSQL has and PgBouncer does not (replication, samerole,
 * samegroup, +role, samehost/samenet, host names, other methods,
 * NAME=VALUE options) is refused with the line number, so a file either
 * loads whole or not at all: a RELOAD with a bad file keeps the old rules.
 *
 * Owns: the rule lists it returns. No global state.
 *
 * INTERFACE ROUTINES
 *	hba_load, hba_parse	read rules from a file / a string
 *	hba_match		first rule for a connection
 *	hba_free		release rules
 */
#include "hba.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define HBA_REASON_LEN 256
#define HBA_FILE_MAX (16 * 1024 * 1024)	/* a larger file is surely a mistake */
#define HBA_READ_CHUNK 4096
#define HBA_INCLUDE_DEPTH 8			/* @file inside @file ... */

/* One lexical token of a line: a word (maybe quoted) or a comma. */
struct hba_tok {
	char *text;		/* unquoted text; NULL for a comma */
	bool quoted;
};

struct hba_line {
	struct hba_tok *t;
	int n, cap, pos;
	int lineno;
	const char *dir;	/* directory of the rules file: @file names are relative to it */
	int depth;		/* @file nesting */
	bool why_located;	/* why already names the name file and line at fault */
	char why[HBA_REASON_LEN];
};

static const struct {
	const char *name;
	enum hba_conn conn;
} conn_words[] = {
	{ "local", HBA_LOCAL }, { "host", HBA_HOST }, { "hostssl", HBA_HOSTSSL }, { "hostnossl", HBA_HOSTNOSSL },
	{ NULL, HBA_LOCAL }
};

static const struct {
	const char *name;
	enum hba_method method;
} method_words[] = {
	{ "trust", HBA_TRUST }, { "reject", HBA_REJECT }, { "md5", HBA_MD5 },
	{ "scram-sha-256", HBA_SCRAM }, { "password", HBA_PASSWORD }, { "cert", HBA_CERT },
	{ "peer", HBA_PEER }, { NULL, HBA_TRUST }
};

/* PostgreSQL methods PgBouncer (and so lokadb) does not offer. */
static const char *const pg_only_methods[] = {
	"ident", "gss", "sspi", "pam", "ldap", "radius", "bsd", NULL
};

static bool line_fail(struct hba_line *ln, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool line_fail(struct hba_line *ln, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(ln->why, sizeof(ln->why), fmt, ap);
	va_end(ap);
	return false;
}

const char *hba_method_name(enum hba_method m)
{
	for (int i = 0; method_words[i].name; i++) {
		if (method_words[i].method == m)
			return method_words[i].name;
	}
	return "?";
}

/*
 * The whole of a regular file as a NUL-terminated string (malloc'ed; the
 * caller frees it), or NULL with a reason in why. Devices and FIFOs are
 * refused (and opened without blocking), so that a name like /dev/stdin or a
 * FIFO cannot block the loader.
 */
static char *slurp(const char *path, char *why, size_t whylen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	char *text = NULL, *grown;
	size_t cap = 0, len = 0;
	struct stat st;
	ssize_t got;

	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		snprintf(why, whylen, "could not open \"%s\": %s", path, fd < 0 ? strerror(errno) : "not a regular file");
		goto fail;
	}
	for (;;) {
		if (len + HBA_READ_CHUNK + 1 > cap) {
			grown = cap < HBA_FILE_MAX ? realloc(text, cap ? cap * 2 : 2 * HBA_READ_CHUNK) : NULL;
			if (!grown) {
				snprintf(why, whylen, "\"%s\" is too large", path);
				goto fail;
			}
			text = grown;
			cap = cap ? cap * 2 : 2 * HBA_READ_CHUNK;
		}
		got = read(fd, text + len, HBA_READ_CHUNK);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			snprintf(why, whylen, "could not read \"%s\": %s", path, strerror(errno));
			goto fail;
		}
		if (got == 0)
			break;
		len += (size_t)got;
	}
	text[len] = '\0';
	if (strlen(text) != len) {
		snprintf(why, whylen, "\"%s\" contains a NUL byte", path);
		goto fail;
	}
	close(fd);
	return text;
fail:
	if (fd >= 0)
		close(fd);
	free(text);
	return NULL;
}

/* ---------------------------------------------------------------------------
 * Lexer
 * ------------------------------------------------------------------------- */

static bool tok_push(struct hba_line *ln, char *text, bool quoted)
{
	if (ln->n == ln->cap) {
		int cap = ln->cap ? ln->cap * 2 : 16;
		struct hba_tok *t = realloc(ln->t, (size_t)cap * sizeof(*t));
		if (!t) {
			free(text);
			return line_fail(ln, "out of memory");
		}
		ln->t = t;
		ln->cap = cap;
	}
	ln->t[ln->n].text = text;
	ln->t[ln->n].quoted = quoted;
	ln->n++;
	return true;
}

static bool is_blank(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' || ch == '\f' || ch == '\v';
}

/* One word at *pp: up to a blank, comma or '#' outside quotes. */
static bool lex_word(struct hba_line *ln, const char **pp)
{
	const char *p = *pp;
	char *out = malloc(strlen(p) + 1), *o = out;
	bool quoted = false, inq = false;

	if (!out)
		return line_fail(ln, "out of memory");
	for (; *p; p++) {
		if (*p == '"') {
			quoted = true;
			if (inq && p[1] == '"') {
				*o++ = *++p;
				continue;
			}
			inq = !inq;
			continue;
		}
		if (!inq && (is_blank(*p) || *p == ',' || *p == '#'))
			break;
		*o++ = *p;
	}
	*o = '\0';
	if (inq) {
		free(out);
		return line_fail(ln, "unterminated quoted string");
	}
	*pp = p;
	return tok_push(ln, out, quoted);
}

static bool lex_line(struct hba_line *ln, const char *p)
{
	for (;;) {
		while (is_blank(*p))
			p++;
		if (!*p || *p == '#')
			return true;
		if (*p == ',') {
			p++;
			if (!tok_push(ln, NULL, false))
				return false;
			continue;
		}
		if (!lex_word(ln, &p))
			return false;
	}
}

static void line_clear(struct hba_line *ln)
{
	for (int i = 0; i < ln->n; i++)
		free(ln->t[i].text);
	ln->n = ln->pos = 0;
	ln->why[0] = '\0';
	ln->why_located = false;
}

/* ---------------------------------------------------------------------------
 * Parser
 * ------------------------------------------------------------------------- */

static const struct hba_tok *next_word(struct hba_line *ln, const char *what)
{
	const struct hba_tok *t;

	if (ln->pos >= ln->n) {
		line_fail(ln, "end of line before the %s field", what);
		return NULL;
	}
	t = &ln->t[ln->pos++];
	if (!t->text) {
		line_fail(ln, "unexpected \",\" before the %s field", what);
		return NULL;
	}
	return t;
}

static bool next_is_comma(struct hba_line *ln)
{
	if (ln->pos < ln->n && !ln->t[ln->pos].text) {
		ln->pos++;
		return true;
	}
	return false;
}

static bool kw(const struct hba_tok *t, const char *word)
{
	return !t->quoted && strcmp(t->text, word) == 0;
}

static bool names_add(struct hba_line *ln, struct hba_names *hn, const char *name)
{
	char **v = realloc(hn->names, (size_t)(hn->n + 1) * sizeof(*v));

	if (!v)
		return line_fail(ln, "out of memory");
	hn->names = v;
	v[hn->n] = strdup(name);
	if (!v[hn->n])
		return line_fail(ln, "out of memory");
	hn->n++;
	return true;
}

static bool parse_name(struct hba_line *ln, struct hba_names *hn, const struct hba_tok *t, bool is_db);

/* "@FILE": every name in FILE, separated by blanks, commas or newlines; "#" comments. */
static bool include_names(struct hba_line *ln, struct hba_names *hn, const char *file, bool is_db)
{
	struct hba_line sub = { .dir = ln->dir, .depth = ln->depth + 1 };
	char path[4096], *text, *p, *nl;
	bool ok = true;

	if (!*file)
		return line_fail(ln, "missing file name after \"@\"");
	if (ln->depth >= HBA_INCLUDE_DEPTH)
		return line_fail(ln, "name files nested too deeply at \"@%s\"", file);
	snprintf(path, sizeof(path), "%s%s%s", file[0] == '/' || !ln->dir ? "" : ln->dir,
		 file[0] == '/' || !ln->dir ? "" : "/", file);
	text = slurp(path, ln->why, sizeof(ln->why));
	if (!text)
		return false;
	for (p = text; ok && p; p = nl ? nl + 1 : NULL) {
		nl = strchr(p, '\n');
		if (nl)
			*nl = '\0';
		line_clear(&sub);
		sub.lineno++;
		ok = lex_line(&sub, p);
		for (int i = 0; ok && i < sub.n; i++)
			ok = !sub.t[i].text || parse_name(&sub, hn, &sub.t[i], is_db);
	}
	if (!ok && sub.why_located)
		memcpy(ln->why, sub.why, sizeof(ln->why));	/* the innermost file and line only */
	else if (!ok)
		line_fail(ln, "%s:%d: %s", path, sub.lineno, sub.why);
	ln->why_located = !ok;
	line_clear(&sub);
	free(sub.t);
	free(text);
	return ok;
}

/* One item of a DATABASE or USER list. */
static bool parse_name(struct hba_line *ln, struct hba_names *hn, const struct hba_tok *t, bool is_db)
{
	static const char *const refused_db[] = { "replication", "samerole", "samegroup", NULL };

	if (kw(t, "all")) {
		hn->all = true;
		return true;
	}
	if (is_db && kw(t, "sameuser")) {
		hn->sameuser = true;
		return true;
	}
	for (int i = 0; is_db && refused_db[i]; i++) {
		if (kw(t, refused_db[i]))
			return line_fail(ln, "\"%s\" is not supported (as in PgBouncer)", t->text);
	}
	if (!t->quoted && t->text[0] == '+')
		return line_fail(ln, "role membership (\"%s\") is not supported", t->text);
	if (!t->quoted && t->text[0] == '@')
		return include_names(ln, hn, t->text + 1, is_db);
	if (!*t->text)
		return line_fail(ln, "empty %s name", is_db ? "database" : "user");
	return names_add(ln, hn, t->text);
}

static bool parse_names(struct hba_line *ln, struct hba_names *hn, bool is_db)
{
	const char *what = is_db ? "database" : "user";

	do {
		const struct hba_tok *t = next_word(ln, what);
		if (!t || !parse_name(ln, hn, t, is_db))
			return false;
	} while (next_is_comma(ln));
	return true;
}

/* A numeric address of either family (getaddrinfo with AI_NUMERICHOST). */
static bool parse_ip(const char *text, int *af, uint8_t out[16])
{
	struct addrinfo hints = { .ai_flags = AI_NUMERICHOST, .ai_family = AF_UNSPEC };
	struct addrinfo *res = NULL;
	bool ok = false;

	if (getaddrinfo(text, NULL, &hints, &res) != 0 || !res)
		return false;
	memset(out, 0, 16);
	if (res->ai_family == AF_INET) {
		memcpy(out, &((struct sockaddr_in *)res->ai_addr)->sin_addr, 4);
		ok = true;
	} else if (res->ai_family == AF_INET6) {
		memcpy(out, &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, 16);
		ok = true;
	}
	*af = res->ai_family;
	freeaddrinfo(res);
	return ok;
}

static bool parse_cidr(struct hba_line *ln, struct hba_rule *r, const char *bits_text)
{
	int max = r->af == AF_INET ? 32 : 128;
	char *end;
	long bits;

	errno = 0;
	bits = strtol(bits_text, &end, 10);
	if (errno || end == bits_text || *end || bits < 0 || bits > max)
		return line_fail(ln, "invalid CIDR mask \"/%s\": expected 0 .. %d", bits_text, max);
	memset(r->mask, 0, sizeof(r->mask));
	for (int i = 0; i < bits / 8; i++)
		r->mask[i] = 0xff;
	if (bits % 8)
		r->mask[bits / 8] = (uint8_t)(0xff << (8 - bits % 8));
	return true;
}

static bool parse_mask_field(struct hba_line *ln, struct hba_rule *r)
{
	const struct hba_tok *t = next_word(ln, "netmask");
	int af;

	if (!t)
		return false;
	if (!parse_ip(t->text, &af, r->mask) || af != r->af)
		return line_fail(ln, "invalid netmask \"%s\"", t->text);
	return true;
}

static bool parse_address(struct hba_line *ln, struct hba_rule *r)
{
	const struct hba_tok *t = next_word(ln, "address");
	char buf[INET6_ADDRSTRLEN + 8], *slash;

	if (!t)
		return false;
	if (kw(t, "all")) {
		r->addr_all = true;
		return true;
	}
	if (kw(t, "samehost") || kw(t, "samenet"))
		return line_fail(ln, "\"%s\" is not supported", t->text);
	if (strlen(t->text) >= sizeof(buf))
		return line_fail(ln, "invalid IP address \"%s\"", t->text);
	strcpy(buf, t->text);
	slash = strchr(buf, '/');
	if (slash)
		*slash++ = '\0';
	if (!parse_ip(buf, &r->af, r->addr))
		return line_fail(ln, "invalid IP address \"%s\" (host names are not supported)", buf);
	return slash ? parse_cidr(ln, r, slash) : parse_mask_field(ln, r);
}

static bool parse_method(struct hba_line *ln, struct hba_rule *r)
{
	const struct hba_tok *t = next_word(ln, "authentication method");

	if (!t)
		return false;
	for (int i = 0; method_words[i].name; i++) {
		if (kw(t, method_words[i].name)) {
			r->method = method_words[i].method;
			goto found;
		}
	}
	for (int i = 0; pg_only_methods[i]; i++) {
		if (kw(t, pg_only_methods[i]))
			return line_fail(ln, "authentication method \"%s\" is not supported by this version of lokadb",
					 t->text);
	}
	return line_fail(ln, "invalid authentication method \"%s\"", t->text);
found:
	if (r->method == HBA_PEER && r->conn != HBA_LOCAL)
		return line_fail(ln, "peer authentication is only supported on local sockets");
	if (r->method == HBA_CERT && (r->conn == HBA_LOCAL || r->conn == HBA_HOSTNOSSL))
		return line_fail(ln, "cert authentication is only supported on host and hostssl connections");
	if (ln->pos < ln->n)
		return line_fail(ln, "authentication options (\"%s\") are not supported",
				 ln->t[ln->pos].text ? ln->t[ln->pos].text : ",");
	return true;
}

static void rule_clear(struct hba_rule *r)
{
	for (int i = 0; i < r->db.n; i++)
		free(r->db.names[i]);
	for (int i = 0; i < r->user.n; i++)
		free(r->user.names[i]);
	free(r->db.names);
	free(r->user.names);
}

/* The tokens of one line into *r; false with ln->why set. */
static bool parse_rule(struct hba_line *ln, struct hba_rule *r)
{
	const struct hba_tok *t = next_word(ln, "connection type");
	int i;

	if (!t)
		return false;
	for (i = 0; conn_words[i].name && !kw(t, conn_words[i].name); i++)
		;
	if (!conn_words[i].name)
		return line_fail(ln, "invalid connection type \"%s\"", t->text);
	r->conn = conn_words[i].conn;
	if (!parse_names(ln, &r->db, true) || !parse_names(ln, &r->user, false))
		return false;
	if (r->conn != HBA_LOCAL && !parse_address(ln, r))
		return false;
	return parse_method(ln, r);
}

static bool hba_add(struct hba *h, const struct hba_rule *r)
{
	struct hba_rule *v = realloc(h->rules, (size_t)(h->n + 1) * sizeof(*v));

	if (!v)
		return false;
	h->rules = v;
	v[h->n++] = *r;
	return true;
}

/* One physical line; false with ln->why set. */
static bool hba_line(struct hba *h, struct hba_line *ln, const char *text)
{
	struct hba_rule r = { .line = ln->lineno };

	line_clear(ln);
	if (!lex_line(ln, text))
		return false;
	if (ln->n == 0)
		return true;
	if (!parse_rule(ln, &r) || !hba_add(h, &r)) {
		if (!ln->why[0])
			line_fail(ln, "out of memory");
		rule_clear(&r);
		return false;
	}
	return true;
}

struct hba *hba_parse(const char *text, const char *name, char *err, size_t errlen)
{
	struct hba *h = calloc(1, sizeof(*h));
	struct hba_line ln = { .lineno = 0 };
	char *copy = strdup(text), *p = copy, *nl, *dir = strdup(name), *slash = dir ? strrchr(dir, '/') : NULL;
	bool ok = h && copy && dir;

	if (slash)
		*slash = '\0';
	ln.dir = slash ? (*dir ? dir : "/") : NULL;
	if (!ok)
		snprintf(err, errlen, "%s: out of memory", name);
	while (ok && p && *p) {
		nl = strchr(p, '\n');
		if (nl)
			*nl = '\0';
		ln.lineno++;
		ok = hba_line(h, &ln, p);
		if (!ok)
			snprintf(err, errlen, "%s:%d: %s", name, ln.lineno, ln.why);
		p = nl ? nl + 1 : NULL;
	}
	line_clear(&ln);
	free(ln.t);
	free(copy);
	free(dir);
	if (ok)
		return h;
	hba_free(h);
	return NULL;
}

struct hba *hba_load(const char *path, char *err, size_t errlen)
{
	char why[HBA_REASON_LEN];
	char *text = slurp(path, why, sizeof(why));
	struct hba *h;

	if (!text) {
		snprintf(err, errlen, "%s: auth_hba_file: %s", path, why);
		return NULL;
	}
	h = hba_parse(text, path, err, errlen);
	free(text);
	return h;
}

void hba_free(struct hba *h)
{
	if (!h)
		return;
	for (int i = 0; i < h->n; i++)
		rule_clear(&h->rules[i]);
	free(h->rules);
	free(h);
}

/* ---------------------------------------------------------------------------
 * Matching
 * ------------------------------------------------------------------------- */

static bool names_match(const struct hba_names *hn, const char *name, const char *other)
{
	if (hn->all || (hn->sameuser && strcmp(name, other) == 0))
		return true;
	for (int i = 0; i < hn->n; i++) {
		if (strcmp(hn->names[i], name) == 0)
			return true;
	}
	return false;
}

/* The client's address as (family, 16 bytes); IPv4-mapped IPv6 counts as IPv4. */
static int client_ip(const struct sockaddr_storage *ss, uint8_t out[16])
{
	memset(out, 0, 16);
	if (ss->ss_family == AF_INET) {
		memcpy(out, &((const struct sockaddr_in *)ss)->sin_addr, 4);
		return AF_INET;
	}
	if (ss->ss_family != AF_INET6)
		return ss->ss_family;
	{
		const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(a)) {
			memcpy(out, a->s6_addr + 12, 4);
			return AF_INET;
		}
		memcpy(out, a->s6_addr, 16);
	}
	return AF_INET6;
}

static bool addr_match(const struct hba_rule *r, int af, const uint8_t ip[16])
{
	if (r->addr_all)
		return true;
	if (af != r->af)
		return false;
	for (int i = 0; i < (af == AF_INET ? 4 : 16); i++) {
		if ((ip[i] ^ r->addr[i]) & r->mask[i])
			return false;
	}
	return true;
}

static bool conn_match(const struct hba_rule *r, int af, bool tls)
{
	if (af == AF_UNIX)
		return r->conn == HBA_LOCAL;
	if (r->conn == HBA_LOCAL)
		return false;
	if (r->conn == HBA_HOSTSSL && !tls)
		return false;
	return !(r->conn == HBA_HOSTNOSSL && tls);
}

const struct hba_rule *hba_match(const struct hba *h, const struct sockaddr_storage *addr, bool tls,
				 const char *db, const char *user)
{
	uint8_t ip[16];
	int af;

	if (!h || !addr || !db || !user)
		return NULL;
	af = client_ip(addr, ip);
	for (int i = 0; i < h->n; i++) {
		const struct hba_rule *r = &h->rules[i];
		if (!conn_match(r, af, tls) || (af != AF_UNIX && !addr_match(r, af, ip)))
			continue;
		if (names_match(&r->db, db, user) && names_match(&r->user, user, db))
			return r;
	}
	return NULL;
}
