/* SPDX-License-Identifier: ISC */
/*
 * scram.h -- PostgreSQL password authentication crypto: md5 secrets and
 * challenge answers, and SCRAM-SHA-256 (RFC 5802 / RFC 7677) in both roles.
 *
 * Server role: LokaDB verifies a connecting client.  Create a state from the
 * stored secret with scram_server_new(), feed it the SASLInitialResponse data
 * with scram_server_first() (send *out as AuthenticationSASLContinue), then
 * the SASLResponse data with scram_server_final() (send *out as
 * AuthenticationSASLFinal, then AuthenticationOk).
 *
 * Client role: LokaDB logs into PostgreSQL.  scram_client_new(password),
 * scram_client_first() gives the SASLInitialResponse data,
 * scram_client_final() turns AuthenticationSASLContinue data into the
 * SASLResponse data, and scram_client_verify() checks AuthenticationSASLFinal.
 *
 * Usage notes:
 *  - Every state is single-use and must be called in that order; a call out
 *    of order, or any call after a failure, fails with "unexpected SCRAM
 *    message".
 *  - Messages are taken as (bytes, length) and need not be NUL-terminated;
 *    a message containing a NUL byte is malformed.  Returned messages are
 *    NUL-terminated, malloc'd, and freed by the caller with free().
 *  - Error reasons written to `err` are short lowercase texts without a
 *    period, fit for an ErrorResponse primary message (SQLSTATE 28P01 for
 *    "password authentication failed", 08P01 for the rest).
 *  - Passwords are used as-is: there is no SASLprep.  ASCII passwords behave
 *    exactly as in PostgreSQL; non-ASCII ones match PostgreSQL only when
 *    SASLprep would leave them unchanged.
 *  - Channel binding is not supported: LokaDB only advertises SCRAM-SHA-256
 *    (never -PLUS), so the gs2 flags "n" and "y" are accepted and "p=" is
 *    refused.  Advertising -PLUS would require refusing "y".
 *  - Key derivation (PBKDF2, `iterations` rounds) is CPU work done inline:
 *    about a millisecond at the default 4096.  scram_server_new() with a
 *    plain password and scram_client_final() pay it.
 */
#ifndef LOKADB_SCRAM_H
#define LOKADB_SCRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SCRAM_MD5_SECRET_LEN	35	/* "md5" + 32 hex, without the NUL */
#define SCRAM_DEFAULT_ITERATIONS 4096	/* as PostgreSQL's scram_iterations */
#define SCRAM_DEFAULT_SALT_LEN	16	/* as PostgreSQL */

/* ---- md5 ---- */

/*
 * The md5 secret of pg_authid: "md5" + hex(md5(password || user)).  `out`
 * receives 35 characters and a NUL.  On an OpenSSL failure out is "".
 */
void scram_md5_secret(const char *user, const char *password, char out[36]);

/*
 * The answer to AuthenticationMD5Password: "md5" +
 * hex(md5(hex32 of secret || salt)).  `secret` must satisfy
 * scram_is_md5_secret(); otherwise (or on an OpenSSL failure) out is "".
 */
void scram_md5_answer(const char *secret, const uint8_t salt[4], char out[36]);

/* true if `s` is "md5" followed by exactly 32 lowercase hex digits */
bool scram_is_md5_secret(const char *s);

/*
 * true if `s` is a well-formed
 * "SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>" secret
 * (iterations >= 1, non-empty salt, 32-byte keys, strict base64).
 */
bool scram_is_scram_secret(const char *s);

/*
 * A SCRAM secret for `password` with the given salt and iteration count, in
 * the format PostgreSQL stores.  Returns NULL if saltlen is 0, iterations < 1,
 * or on allocation/OpenSSL failure.  Caller frees with free().
 */
char *scram_make_secret(const char *password, const uint8_t *salt, size_t saltlen, int iterations);

/* ---- server role: LokaDB verifies a connecting client ---- */

struct scram_server;

/*
 * A server exchange for a user whose stored secret is `secret`: a SCRAM
 * secret, or a plain password (then a random 16-byte salt and 4096
 * iterations are used).  As in PostgreSQL, a string that does not parse as a
 * SCRAM secret (scram_is_scram_secret) is taken as a plain password.  An md5
 * secret cannot do SCRAM: returns NULL, as on allocation/OpenSSL failure.
 * Caller frees with scram_server_free().
 */
struct scram_server *scram_server_new(const char *secret);

/* Frees the state and clears its keys.  Accepts NULL. */
void scram_server_free(struct scram_server *st);

/*
 * Handles the client-first-message (SASLInitialResponse data).  On success
 * *out is the server-first-message "r=...,s=...,i=...".  On failure returns
 * false with a reason in err: "malformed SCRAM message",
 * "channel binding not supported", "authorization identity not supported",
 * "unsupported SCRAM extension", "could not generate nonce",
 * "out of memory", "unexpected SCRAM message".  The user name in the message
 * is ignored, as PostgreSQL does: the startup packet's user is the one.
 */
bool scram_server_first(struct scram_server *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen);

/*
 * Handles the client-final-message (SASLResponse data): checks the
 * channel-binding echo, the nonce and the proof.  On success *out is the
 * server-final-message "v=...".  On failure returns false with a reason:
 * "password authentication failed" (wrong proof), "malformed SCRAM message",
 * "channel binding mismatch", "nonce mismatch", "out of memory",
 * "SCRAM computation failed" (OpenSSL error), "unexpected SCRAM message".
 */
bool scram_server_final(struct scram_server *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen);

/* ---- client role: LokaDB logs into PostgreSQL ---- */

struct scram_client;

/* A client exchange with `password` (copied).  NULL on allocation failure.
 * Caller frees with scram_client_free(). */
struct scram_client *scram_client_new(const char *password);

/* Frees the state and clears the password and keys.  Accepts NULL. */
void scram_client_free(struct scram_client *st);

/*
 * The client-first-message "n,,n=,r=<nonce>" (the user name is empty, as
 * libpq sends it).  NULL on allocation/OpenSSL failure, on an invalid fixed
 * nonce, or when called twice.  Caller frees with free().
 */
char *scram_client_first(struct scram_client *st);

/*
 * Given the server-first-message, produces the client-final-message
 * "c=biws,r=...,p=...".  On failure returns false with a reason:
 * "malformed SCRAM message", "unsupported SCRAM extension",
 * "nonce mismatch", "invalid SCRAM iteration count",
 * "SCRAM computation failed" (OpenSSL error), "out of memory",
 * "unexpected SCRAM message".
 */
bool scram_client_final(struct scram_client *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen);

/*
 * Verifies the server-final-message "v=...".  On failure returns false with
 * "server error: <e= value>" when the server sent "e=...",
 * "server signature mismatch", "malformed SCRAM message" or
 * "unexpected SCRAM message".
 */
bool scram_client_verify(struct scram_client *st, const char *msg, size_t len,
			 char *err, size_t errlen);

/* ---- test hooks ---- */

/*
 * Fix the nonce the next scram_client_first() / scram_server_first() uses
 * instead of a random one (the server's is its own part, appended to the
 * client's).  `nonce` must be printable ASCII without ','; an invalid one
 * makes that call fail; NULL restores random nonces.  For tests only.
 */
void scram_client_set_nonce(struct scram_client *st, const char *nonce);
void scram_server_set_nonce(struct scram_server *st, const char *nonce);

/*
 * Set the user name the client-first-message carries (default empty, which
 * is what PostgreSQL expects: it ignores the name).  ',' and '=' are escaped
 * as RFC 5802 requires.  For tests reproducing RFC vectors.
 */
void scram_client_set_user(struct scram_client *st, const char *user);

/*
 * SCRAM pass-through (PgBouncer's way to log in to PostgreSQL with a SCRAM
 * secret and no password): after a successful exchange, the server role
 * hands out the ClientKey recovered from the client's proof and the
 * secret's ServerKey (both 32 bytes; false before success).
 * scram_client_new_keys() logs in with them instead of a password; it works
 * when PostgreSQL holds the same secret (same salt and iterations).
 */
bool scram_server_keys(const struct scram_server *st, uint8_t client_key[32], uint8_t server_key[32]);
struct scram_client *scram_client_new_keys(const uint8_t client_key[32], const uint8_t server_key[32]);

#endif
