/* SPDX-License-Identifier: ISC */
/*
 * hba.h -- auth_hba_file: host-based access rules in PgBouncer's subset of
 * the pg_hba.conf format, used when auth_type = hba.
 *
 * Usage: hba_load() reads a file into a new rule list (config_load() does it,
 * so RELOAD re-reads the file and refuses a bad one as a whole); for each
 * client login hba_match() returns the first rule matching the connection,
 * or NULL (no rule: the login is refused). hba_free() releases the list.
 *
 * The rule list is immutable once loaded and owns every string in it.
 */
#ifndef LOKADB_HBA_H
#define LOKADB_HBA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* What a matching rule asks of the client. */
enum hba_method {
	HBA_TRUST,
	HBA_REJECT,
	HBA_MD5,		/* md5, or SCRAM when the user's secret is a SCRAM verifier (as PgBouncer) */
	HBA_SCRAM,
	HBA_PASSWORD,		/* cleartext password */
	HBA_CERT,		/* TLS client certificate whose CN is the user name */
	HBA_PEER,		/* local only: the socket's peer OS user is the user name */
};

enum hba_conn { HBA_LOCAL, HBA_HOST, HBA_HOSTSSL, HBA_HOSTNOSSL };

struct hba_names {
	bool all;
	bool sameuser;		/* database field: the database named like the user */
	char **names;
	int n;
};

struct hba_rule {
	int line;
	enum hba_conn conn;
	struct hba_names db, user;
	bool addr_all;
	int af;			/* AF_INET or AF_INET6 (host rules without addr_all) */
	uint8_t addr[16], mask[16];
	enum hba_method method;
};

struct hba {
	struct hba_rule *rules;
	int n;
};

/*
 * Read `path`. Returns a new rule list the caller frees with hba_free(), or
 * NULL with "PATH:LINE: reason" (or "PATH: reason") in err.
 */
struct hba *hba_load(const char *path, char *err, size_t errlen);

/* Parse rules from a string ("name" is used in messages); as hba_load(). */
struct hba *hba_parse(const char *text, const char *name, char *err, size_t errlen);

void hba_free(struct hba *h);	/* accepts NULL */

/*
 * The first rule matching a connection from `addr` (AF_UNIX for the unix
 * socket), over TLS or not, for database `db` and user `user`; NULL if none.
 */
const struct hba_rule *hba_match(const struct hba *h, const struct sockaddr_storage *addr, bool tls,
				 const char *db, const char *user);

const char *hba_method_name(enum hba_method m);

#endif
