/* SPDX-License-Identifier: ISC */
/*
 * scram.c -- PostgreSQL password authentication crypto: md5 secrets and
 * answers, and the two roles of a SCRAM-SHA-256 exchange (RFC 5802, RFC 7677).
 *
 * This module only computes and parses; it does no I/O and knows nothing of
 * connections.  The caller wraps the messages in the protocol's
 * Authentication / SASL packets and maps failures to ErrorResponses.
 *
 * It owns: the per-exchange states (struct scram_server, struct scram_client)
 * and every key derived inside them.  Keys, salted passwords and the client's
 * password copy are cleared with OPENSSL_cleanse before being freed or going
 * out of scope.
 *
 * Invariants callers rely on:
 *  - All crypto is OpenSSL's (EVP digests, HMAC, PKCS5_PBKDF2_HMAC,
 *    EVP_EncodeBlock/EVP_DecodeBlock, RAND_bytes).  Nothing here is
 *    hand-rolled except hex and the strict base64 *validation* that
 *    EVP_DecodeBlock lacks (it skips whitespace and ignores padding).
 *  - Proofs and signatures are compared with CRYPTO_memcmp.
 *  - An exchange state moves START -> FIRST -> FINAL (client only) -> DONE;
 *    any failure moves it to FAILED for good, so a state can never be
 *    replayed or probed twice.
 *  - Secrets are classified as PostgreSQL does (get_password_type): "md5" +
 *    32 lowercase hex is md5, a string that parses as a SCRAM secret is
 *    SCRAM, anything else is a plain password.
 *
 * Do not: add SASLprep here without also changing the secrets (passwords are
 * used as-is), or accept "y" once LokaDB advertises SCRAM-SHA-256-PLUS.
 *
 * INTERFACE ROUTINES
 *	scram_md5_secret, scram_md5_answer, scram_is_md5_secret
 *	scram_is_scram_secret, scram_make_secret
 *	scram_server_new / _first / _final / _free
 *	scram_client_new / _first / _final / _verify / _free
 *	scram_client_set_nonce, scram_server_set_nonce, scram_client_set_user
 */
#include "scram.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define SCRAM_KEY_LEN		32	/* SHA-256 output */
#define SCRAM_NONCE_RAW_LEN	18	/* random bytes in a nonce, base64'd */
#define SCRAM_MAX_MESSAGE	65535	/* PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH */
#define SCRAM_MAX_ITER_DIGITS	10	/* INT_MAX has 10 digits */
#define SCRAM_PREFIX		"SCRAM-SHA-256$"
#define MD5_PREFIX		"md5"
#define MD5_PREFIX_LEN		3
#define MD5_LEN			16
#define MD5_HEX_LEN		32
#define GS2_N			"n,,"
#define GS2_N_B64		"biws"	/* base64("n,,") */
#define GS2_Y_B64		"eSws"	/* base64("y,,") */

#define ERR_MALFORMED	"malformed SCRAM message"
#define ERR_SEQUENCE	"unexpected SCRAM message"
#define ERR_NOMEM	"out of memory"
#define ERR_CRYPTO	"SCRAM computation failed"
#define ERR_NONCE	"could not generate nonce"
#define ERR_CBIND	"channel binding not supported"
#define ERR_CBIND_ECHO	"channel binding mismatch"
#define ERR_AUTHZID	"authorization identity not supported"
#define ERR_EXTENSION	"unsupported SCRAM extension"
#define ERR_NONCE_ECHO	"nonce mismatch"
#define ERR_ITER	"invalid SCRAM iteration count"
#define ERR_AUTH	"password authentication failed"
#define ERR_SIGNATURE	"server signature mismatch"

enum scram_phase {
	SCRAM_START,	/* nothing exchanged yet */
	SCRAM_FIRST,	/* first messages exchanged */
	SCRAM_FINAL,	/* client only: client-final sent, awaiting server-final */
	SCRAM_DONE,
	SCRAM_FAILED,
};

/* A non-terminated piece of a message. */
struct span {
	const char *s;
	size_t len;
};

/* What a SCRAM secret holds; salt is malloc'd. */
struct scram_keys {
	int iterations;
	uint8_t *salt;
	size_t saltlen;
	uint8_t stored_key[SCRAM_KEY_LEN];
	uint8_t server_key[SCRAM_KEY_LEN];
};

struct scram_server {
	enum scram_phase phase;
	struct scram_keys keys;
	char cbind;		/* gs2 flag of the client-first-message: 'n' or 'y' */
	char *fixed_nonce;	/* test hook: own nonce part, or NULL */
	char *nonce;		/* client nonce + own part */
	char *client_first_bare;
	char *server_first;
	uint8_t client_key[SCRAM_KEY_LEN];	/* recovered from a verified proof */
	bool have_client_key;
};

struct scram_client {
	enum scram_phase phase;
	bool use_keys;		/* log in with client_key/server_key, not a password */
	uint8_t client_key[SCRAM_KEY_LEN];
	uint8_t server_key[SCRAM_KEY_LEN];
	char *password;
	char *user;		/* saslname-escaped, "" by default */
	char *fixed_nonce;	/* test hook, or NULL */
	char *nonce;
	char *client_first_bare;
	uint8_t server_signature[SCRAM_KEY_LEN];	/* expected in "v=" */
};

/* The contents of a server-first-message; salt is malloc'd. */
struct server_first {
	struct span nonce;
	uint8_t *salt;
	size_t saltlen;
	int iterations;
};

/* The contents of a client-final-message. */
struct client_final {
	struct span cbind;
	struct span nonce;
	uint8_t proof[SCRAM_KEY_LEN];
};

/* ---------------------------------------------------------------- */
/* Small helpers                                                     */
/* ---------------------------------------------------------------- */

static bool fail(char *err, size_t errlen, const char *reason)
{
	if (err && errlen > 0)
		snprintf(err, errlen, "%s", reason);
	return false;
}

/* Ends a step: the state advances to `next`, or fails for good. */
static bool step_done(enum scram_phase *phase, enum scram_phase next,
		      const char *reason, char *err, size_t errlen)
{
	*phase = reason ? SCRAM_FAILED : next;
	return reason ? fail(err, errlen, reason) : true;
}

__attribute__((format(printf, 1, 2)))
static char *strfmt(const char *fmt, ...)
{
	va_list ap;
	char *buf;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return NULL;
	buf = malloc((size_t)n + 1);
	if (!buf)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(buf, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return buf;
}

static void free_cleansed(char *s)
{
	if (!s)
		return;
	OPENSSL_cleanse(s, strlen(s));
	free(s);
}

static bool span_eq(struct span v, const char *s)
{
	return v.len == strlen(s) && memcmp(v.s, s, v.len) == 0;
}

/* RFC 5802 "printable": %x21-7E except ','. Nonces must be non-empty. */
static bool is_nonce(struct span v)
{
	if (v.len == 0)
		return false;
	for (size_t i = 0; i < v.len; i++) {
		unsigned char c = (unsigned char)v.s[i];
		if (c < 0x21 || c > 0x7e || c == ',')
			return false;
	}
	return true;
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static void hex_encode(const uint8_t *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 0xf];
	}
	out[2 * len] = '\0';
}

/* ---------------------------------------------------------------- */
/* Base64 (OpenSSL's, with strict validation in front)              */
/* ---------------------------------------------------------------- */

/* malloc'd, NUL-terminated base64 of `in`; NULL on allocation failure. */
static char *b64_encode(const uint8_t *in, size_t len)
{
	char *out;

	if (len > INT_MAX / 2)
		return NULL;
	out = malloc(4 * ((len + 2) / 3) + 1);
	if (out)
		EVP_EncodeBlock((unsigned char *)out, in, (int)len);
	return out;
}

static bool b64_char(char c)
{
	return is_alpha(c) || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

/*
 * EVP_DecodeBlock skips surrounding whitespace and decodes padding as zero
 * bytes, so check the text first: non-empty, a multiple of 4, the alphabet,
 * and at most two '=' at the end.  *pad receives the number of '='.
 */
static bool b64_valid(struct span v, size_t *pad)
{
	size_t p = 0;

	if (v.len == 0 || v.len % 4 != 0 || v.len > INT_MAX)
		return false;
	if (v.s[v.len - 1] == '=')
		p++;
	if (p && v.s[v.len - 2] == '=')
		p++;
	for (size_t i = 0; i < v.len - p; i++) {
		if (!b64_char(v.s[i]))
			return false;
	}
	*pad = p;
	return true;
}

/* Decodes strict base64 into a malloc'd buffer (never empty); NULL if invalid. */
static uint8_t *b64_decode(struct span v, size_t *outlen)
{
	size_t pad;
	uint8_t *out;
	int n;

	if (!b64_valid(v, &pad))
		return NULL;
	out = malloc(v.len / 4 * 3);
	if (!out)
		return NULL;
	n = EVP_DecodeBlock(out, (const unsigned char *)v.s, (int)v.len);
	if (n < 0 || (size_t)n <= pad) {
		free(out);
		return NULL;
	}
	*outlen = (size_t)n - pad;
	return out;
}

/* Decodes base64 that must hold exactly one 32-byte key. */
static bool b64_decode_key(struct span v, uint8_t out[SCRAM_KEY_LEN])
{
	uint8_t buf[(SCRAM_KEY_LEN + 2) / 3 * 3];
	size_t pad;
	bool ok;

	if (!b64_valid(v, &pad) || v.len != sizeof(buf) / 3 * 4)
		return false;
	ok = EVP_DecodeBlock(buf, (const unsigned char *)v.s, (int)v.len) == (int)sizeof(buf)
		&& sizeof(buf) - pad == SCRAM_KEY_LEN;
	if (ok)
		memcpy(out, buf, SCRAM_KEY_LEN);
	OPENSSL_cleanse(buf, sizeof(buf));
	return ok;
}

/* ---------------------------------------------------------------- */
/* Digests and key derivation                                        */
/* ---------------------------------------------------------------- */

static bool hmac(const uint8_t key[SCRAM_KEY_LEN], const void *data, size_t len,
		 uint8_t out[SCRAM_KEY_LEN])
{
	unsigned int n = 0;

	return HMAC(EVP_sha256(), key, SCRAM_KEY_LEN, data, len, out, &n) != NULL
		&& n == SCRAM_KEY_LEN;
}

static bool sha256(const uint8_t in[SCRAM_KEY_LEN], uint8_t out[SCRAM_KEY_LEN])
{
	unsigned int n = 0;

	return EVP_Digest(in, SCRAM_KEY_LEN, out, &n, EVP_sha256(), NULL) == 1
		&& n == SCRAM_KEY_LEN;
}

static void xor_key(const uint8_t a[SCRAM_KEY_LEN], const uint8_t b[SCRAM_KEY_LEN],
		    uint8_t out[SCRAM_KEY_LEN])
{
	for (size_t i = 0; i < SCRAM_KEY_LEN; i++)
		out[i] = a[i] ^ b[i];
}

/*
 * From the password and k's salt and iterations: SaltedPassword by PBKDF2,
 * then ClientKey, StoredKey = H(ClientKey) and ServerKey (RFC 5802 §3).
 */
static bool derive_keys(const char *password, struct scram_keys *k,
			uint8_t client_key[SCRAM_KEY_LEN])
{
	static const char client_label[] = "Client Key", server_label[] = "Server Key";
	uint8_t salted[SCRAM_KEY_LEN];
	size_t pwlen = strlen(password);
	bool ok;

	if (pwlen > INT_MAX || k->saltlen > INT_MAX || k->iterations < 1)
		return false;
	ok = PKCS5_PBKDF2_HMAC(password, (int)pwlen, k->salt, (int)k->saltlen,
			       k->iterations, EVP_sha256(), SCRAM_KEY_LEN, salted) == 1
		&& hmac(salted, client_label, strlen(client_label), client_key)
		&& sha256(client_key, k->stored_key)
		&& hmac(salted, server_label, strlen(server_label), k->server_key);
	OPENSSL_cleanse(salted, sizeof(salted));
	return ok;
}

static void keys_clear(struct scram_keys *k)
{
	free(k->salt);
	OPENSSL_cleanse(k, sizeof(*k));
}

/* A fixed nonce copied, or 18 random bytes in base64.  NULL on failure. */
static char *make_nonce(const char *fixed)
{
	uint8_t raw[SCRAM_NONCE_RAW_LEN];

	if (fixed) {
		struct span v = { fixed, strlen(fixed) };
		return is_nonce(v) ? strdup(fixed) : NULL;
	}
	if (RAND_bytes(raw, sizeof(raw)) != 1)
		return NULL;
	return b64_encode(raw, sizeof(raw));
}

static char *auth_message(const char *client_first_bare, const char *server_first,
			  const char *client_final_without_proof)
{
	return strfmt("%s,%s,%s", client_first_bare, server_first,
		      client_final_without_proof);
}

/* ---------------------------------------------------------------- */
/* md5                                                               */
/* ---------------------------------------------------------------- */

/* "md5" + hex(md5(a || b)) into out[36]; "" on failure. */
static void md5_secret2(const void *a, size_t alen, const void *b, size_t blen, char out[36])
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	uint8_t digest[EVP_MAX_MD_SIZE];
	unsigned int n = 0;
	bool ok;

	ok = ctx && EVP_DigestInit_ex(ctx, EVP_md5(), NULL) == 1
		&& EVP_DigestUpdate(ctx, a, alen) == 1
		&& EVP_DigestUpdate(ctx, b, blen) == 1
		&& EVP_DigestFinal_ex(ctx, digest, &n) == 1 && n == MD5_LEN;
	EVP_MD_CTX_free(ctx);
	out[0] = '\0';
	if (!ok)
		return;
	memcpy(out, MD5_PREFIX, MD5_PREFIX_LEN);
	hex_encode(digest, MD5_LEN, out + MD5_PREFIX_LEN);
}

void scram_md5_secret(const char *user, const char *password, char out[36])
{
	md5_secret2(password, strlen(password), user, strlen(user), out);
}

void scram_md5_answer(const char *secret, const uint8_t salt[4], char out[36])
{
	if (!scram_is_md5_secret(secret)) {
		out[0] = '\0';
		return;
	}
	md5_secret2(secret + MD5_PREFIX_LEN, MD5_HEX_LEN, salt, 4, out);
}

bool scram_is_md5_secret(const char *s)
{
	if (!s || strncmp(s, MD5_PREFIX, MD5_PREFIX_LEN) != 0)
		return false;
	s += MD5_PREFIX_LEN;
	for (int i = 0; i < MD5_HEX_LEN; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return s[MD5_HEX_LEN] == '\0';
}

/* ---------------------------------------------------------------- */
/* SCRAM secrets                                                     */
/* ---------------------------------------------------------------- */

/* Decimal iteration count, 1..INT_MAX, digits only. */
static bool parse_iterations(struct span v, int *out)
{
	long long n = 0;

	if (v.len == 0 || v.len > SCRAM_MAX_ITER_DIGITS)
		return false;
	for (size_t i = 0; i < v.len; i++) {
		if (v.s[i] < '0' || v.s[i] > '9')
			return false;
		n = n * 10 + (v.s[i] - '0');
	}
	if (n < 1 || n > INT_MAX)
		return false;
	*out = (int)n;
	return true;
}

/* The text from *p up to `sep` (which must occur); *p moves past sep. */
static bool cut(const char **p, char sep, struct span *v)
{
	const char *e = strchr(*p, sep);

	if (!e)
		return false;
	v->s = *p;
	v->len = (size_t)(e - *p);
	*p = e + 1;
	return true;
}

/* Parses "SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>" into k.
 * On failure k may hold a salt: the caller clears k either way. */
static bool parse_secret(const char *s, struct scram_keys *k)
{
	struct span iter, salt, stored, server;

	if (!s || strncmp(s, SCRAM_PREFIX, strlen(SCRAM_PREFIX)) != 0)
		return false;
	s += strlen(SCRAM_PREFIX);
	if (!cut(&s, ':', &iter) || !cut(&s, '$', &salt) || !cut(&s, ':', &stored))
		return false;
	server.s = s;
	server.len = strlen(s);
	if (!parse_iterations(iter, &k->iterations)
	    || !b64_decode_key(stored, k->stored_key)
	    || !b64_decode_key(server, k->server_key))
		return false;
	k->salt = b64_decode(salt, &k->saltlen);
	return k->salt != NULL;
}

bool scram_is_scram_secret(const char *s)
{
	struct scram_keys k = { 0 };
	bool ok = parse_secret(s, &k);

	keys_clear(&k);
	return ok;
}

static char *format_secret(const struct scram_keys *k)
{
	char *salt = b64_encode(k->salt, k->saltlen);
	char *stored = b64_encode(k->stored_key, SCRAM_KEY_LEN);
	char *server = b64_encode(k->server_key, SCRAM_KEY_LEN);
	char *secret = NULL;

	if (salt && stored && server)
		secret = strfmt(SCRAM_PREFIX "%d:%s$%s:%s", k->iterations, salt, stored, server);
	free(salt);
	free(stored);
	free(server);
	return secret;
}

char *scram_make_secret(const char *password, const uint8_t *salt, size_t saltlen, int iterations)
{
	struct scram_keys k = { .iterations = iterations, .saltlen = saltlen };
	uint8_t client_key[SCRAM_KEY_LEN];
	char *secret = NULL;

	if (!password || !salt || saltlen == 0 || iterations < 1)
		return NULL;
	k.salt = malloc(saltlen);
	if (!k.salt)
		return NULL;
	memcpy(k.salt, salt, saltlen);
	if (derive_keys(password, &k, client_key))
		secret = format_secret(&k);
	OPENSSL_cleanse(client_key, sizeof(client_key));
	keys_clear(&k);
	return secret;
}

/* ---------------------------------------------------------------- */
/* Message parsing                                                   */
/* ---------------------------------------------------------------- */

/* A NUL-terminated copy of a message; NULL with a reason if it has a NUL,
 * is too long, or memory runs out. */
static char *msg_dup(const char *msg, size_t len, const char **reason)
{
	char *buf;

	if (!msg || len > SCRAM_MAX_MESSAGE || memchr(msg, '\0', len)) {
		*reason = ERR_MALFORMED;
		return NULL;
	}
	buf = malloc(len + 1);
	if (!buf) {
		*reason = ERR_NOMEM;
		return NULL;
	}
	memcpy(buf, msg, len);
	buf[len] = '\0';
	return buf;
}

static bool is_attr(const char *p, char name)
{
	return p[0] == name && p[1] == '=';
}

/*
 * Reads attribute "name=value" at *p and moves *p past it and its ','.
 * Values never contain ','.  A ',' ending the message is malformed.
 */
static bool read_attr(const char **p, char name, struct span *v)
{
	const char *s = *p, *e;

	if (!is_attr(s, name))
		return false;
	s += 2;
	e = strchr(s, ',');
	if (e && e[1] == '\0')
		return false;
	v->s = s;
	v->len = e ? (size_t)(e - s) : strlen(s);
	*p = e ? e + 1 : s + v->len;
	return true;
}

/* Optional trailing extensions "x=value,..." up to the end. */
static bool skip_extensions(const char *p)
{
	struct span v;

	while (*p) {
		if (!is_alpha(*p) || !read_attr(&p, *p, &v))
			return false;
	}
	return true;
}

/* gs2-header "n,," or "y,,"; *bare then points at client-first-message-bare. */
static const char *parse_gs2(const char *msg, char *cbind, const char **bare)
{
	if (is_attr(msg, 'p'))
		return ERR_CBIND;
	if ((msg[0] != 'n' && msg[0] != 'y') || msg[1] != ',')
		return ERR_MALFORMED;
	*cbind = msg[0];
	if (is_attr(msg + 2, 'a'))
		return ERR_AUTHZID;
	if (msg[2] != ',')
		return ERR_MALFORMED;
	*bare = msg + 3;
	return NULL;
}

/* client-first-message-bare: "n=<user>,r=<nonce>[,ext...]"; user ignored. */
static const char *parse_client_first_bare(const char *p, struct span *nonce)
{
	struct span user;

	if (is_attr(p, 'm'))
		return ERR_EXTENSION;
	if (!read_attr(&p, 'n', &user) || !read_attr(&p, 'r', nonce))
		return ERR_MALFORMED;
	if (!is_nonce(*nonce) || !skip_extensions(p))
		return ERR_MALFORMED;
	return NULL;
}

/*
 * client-final-message: "c=<cbind>,r=<nonce>[,ext...],p=<proof>".  The proof
 * is always last; on success `msg` is cut there, leaving the
 * client-final-message-without-proof the AuthMessage needs.
 */
static const char *parse_client_final(char *msg, struct client_final *cf)
{
	char *last = strrchr(msg, ',');
	const char *p = msg, *q;
	struct span proof;

	if (!last)
		return ERR_MALFORMED;
	q = last + 1;
	if (!read_attr(&q, 'p', &proof) || !b64_decode_key(proof, cf->proof))
		return ERR_MALFORMED;
	*last = '\0';
	if (!read_attr(&p, 'c', &cf->cbind) || !read_attr(&p, 'r', &cf->nonce)
	    || !skip_extensions(p))
		return ERR_MALFORMED;
	return NULL;
}

/* server-first-message: "r=<nonce>,s=<salt>,i=<iterations>[,ext...]". */
static const char *parse_server_first(const char *p, struct server_first *sf)
{
	struct span salt, iter;

	if (is_attr(p, 'm'))
		return ERR_EXTENSION;
	if (!read_attr(&p, 'r', &sf->nonce) || !read_attr(&p, 's', &salt)
	    || !read_attr(&p, 'i', &iter) || !skip_extensions(p))
		return ERR_MALFORMED;
	if (!is_nonce(sf->nonce))
		return ERR_MALFORMED;
	if (!parse_iterations(iter, &sf->iterations))
		return ERR_ITER;
	sf->salt = b64_decode(salt, &sf->saltlen);
	return sf->salt ? NULL : ERR_MALFORMED;
}

/* ---------------------------------------------------------------- */
/* Server role                                                       */
/* ---------------------------------------------------------------- */

/* Keys for a plain password: random salt, default iterations. */
static bool keys_from_password(const char *password, struct scram_keys *k)
{
	uint8_t client_key[SCRAM_KEY_LEN];
	bool ok;

	k->iterations = SCRAM_DEFAULT_ITERATIONS;
	k->saltlen = SCRAM_DEFAULT_SALT_LEN;
	k->salt = malloc(k->saltlen);
	ok = k->salt && RAND_bytes(k->salt, (int)k->saltlen) == 1
		&& derive_keys(password, k, client_key);
	OPENSSL_cleanse(client_key, sizeof(client_key));
	return ok;
}

struct scram_server *scram_server_new(const char *secret)
{
	struct scram_server *st;
	bool ok;

	if (!secret || scram_is_md5_secret(secret))
		return NULL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return NULL;
	ok = parse_secret(secret, &st->keys);
	if (!ok) {
		keys_clear(&st->keys);
		ok = keys_from_password(secret, &st->keys);
	}
	if (!ok) {
		scram_server_free(st);
		return NULL;
	}
	return st;
}

void scram_server_free(struct scram_server *st)
{
	if (!st)
		return;
	keys_clear(&st->keys);
	free(st->fixed_nonce);
	free(st->nonce);
	free(st->client_first_bare);
	free(st->server_first);
	OPENSSL_cleanse(st->client_key, sizeof(st->client_key));
	free(st);
}

void scram_server_set_nonce(struct scram_server *st, const char *nonce)
{
	char *copy = nonce ? strdup(nonce) : NULL;

	free(st->fixed_nonce);
	st->fixed_nonce = copy;
}

/* Builds and remembers the server-first-message for client nonce `cnonce`. */
static const char *server_make_first(struct scram_server *st, const char *bare,
				     struct span cnonce)
{
	char *part = make_nonce(st->fixed_nonce);
	char *salt = b64_encode(st->keys.salt, st->keys.saltlen);
	const char *reason = NULL;

	if (!part) {
		reason = ERR_NONCE;
		goto end;
	}
	st->nonce = strfmt("%.*s%s", (int)cnonce.len, cnonce.s, part);
	st->client_first_bare = strdup(bare);
	if (salt && st->nonce)
		st->server_first = strfmt("r=%s,s=%s,i=%d", st->nonce, salt,
					  st->keys.iterations);
	if (!st->client_first_bare || !st->server_first)
		reason = ERR_NOMEM;
end:
	free(part);
	free(salt);
	return reason;
}

bool scram_server_first(struct scram_server *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen)
{
	const char *reason = NULL, *bare = NULL;
	struct span cnonce;
	char *buf;

	*out = NULL;
	if (!st || st->phase != SCRAM_START) {
		if (st)
			st->phase = SCRAM_FAILED;
		return fail(err, errlen, ERR_SEQUENCE);
	}
	buf = msg_dup(msg, len, &reason);
	if (buf)
		reason = parse_gs2(buf, &st->cbind, &bare);
	if (!reason)
		reason = parse_client_first_bare(bare, &cnonce);
	if (!reason)
		reason = server_make_first(st, bare, cnonce);
	if (!reason && !(*out = strdup(st->server_first)))
		reason = ERR_NOMEM;
	free(buf);
	return step_done(&st->phase, SCRAM_FIRST, reason, err, errlen);
}

/* The client must echo our gs2 header and our combined nonce. */
static const char *server_check_echo(const struct scram_server *st,
				     const struct client_final *cf)
{
	if (!span_eq(cf->cbind, st->cbind == 'y' ? GS2_Y_B64 : GS2_N_B64))
		return ERR_CBIND_ECHO;
	if (!span_eq(cf->nonce, st->nonce))
		return ERR_NONCE_ECHO;
	return NULL;
}

/* "v=" + base64(HMAC(ServerKey, AuthMessage)), malloc'd into *out. */
static const char *server_make_final(const struct scram_server *st, const char *authmsg,
				     char **out)
{
	uint8_t sig[SCRAM_KEY_LEN];
	char *sig64;

	if (!hmac(st->keys.server_key, authmsg, strlen(authmsg), sig))
		return ERR_CRYPTO;
	sig64 = b64_encode(sig, sizeof(sig));
	*out = sig64 ? strfmt("v=%s", sig64) : NULL;
	free(sig64);
	return *out ? NULL : ERR_NOMEM;
}

/*
 * ClientKey = proof XOR HMAC(StoredKey, AuthMessage); the client knows the
 * password iff H(ClientKey) == StoredKey.
 */
static const char *server_verify(struct scram_server *st, const char *without_proof,
				 const struct client_final *cf, char **out)
{
	uint8_t sig[SCRAM_KEY_LEN], client_key[SCRAM_KEY_LEN], stored[SCRAM_KEY_LEN];
	char *authmsg = auth_message(st->client_first_bare, st->server_first, without_proof);
	const char *reason;

	if (!authmsg)
		return ERR_NOMEM;
	if (!hmac(st->keys.stored_key, authmsg, strlen(authmsg), sig)) {
		reason = ERR_CRYPTO;
		goto end;
	}
	xor_key(cf->proof, sig, client_key);
	if (!sha256(client_key, stored))
		reason = ERR_CRYPTO;
	else if (CRYPTO_memcmp(stored, st->keys.stored_key, SCRAM_KEY_LEN) != 0)
		reason = ERR_AUTH;
	else
		reason = server_make_final(st, authmsg, out);
	if (!reason) {
		memcpy(st->client_key, client_key, SCRAM_KEY_LEN);
		st->have_client_key = true;
	}
end:
	OPENSSL_cleanse(client_key, sizeof(client_key));
	free(authmsg);
	return reason;
}

bool scram_server_final(struct scram_server *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen)
{
	const char *reason = NULL;
	struct client_final cf;
	char *buf;

	*out = NULL;
	if (!st || st->phase != SCRAM_FIRST) {
		if (st)
			st->phase = SCRAM_FAILED;
		return fail(err, errlen, ERR_SEQUENCE);
	}
	buf = msg_dup(msg, len, &reason);
	if (buf)
		reason = parse_client_final(buf, &cf);
	if (!reason)
		reason = server_check_echo(st, &cf);
	if (!reason)
		reason = server_verify(st, buf, &cf, out);
	free(buf);
	return step_done(&st->phase, SCRAM_DONE, reason, err, errlen);
}

bool scram_server_keys(const struct scram_server *st, uint8_t client_key[32], uint8_t server_key[32])
{
	if (!st || st->phase != SCRAM_DONE || !st->have_client_key)
		return false;
	memcpy(client_key, st->client_key, SCRAM_KEY_LEN);
	memcpy(server_key, st->keys.server_key, SCRAM_KEY_LEN);
	return true;
}

/* ---------------------------------------------------------------- */
/* Client role                                                       */
/* ---------------------------------------------------------------- */

struct scram_client *scram_client_new_keys(const uint8_t client_key[32], const uint8_t server_key[32])
{
	struct scram_client *st = scram_client_new(NULL);

	if (!st)
		return NULL;
	st->use_keys = true;
	memcpy(st->client_key, client_key, SCRAM_KEY_LEN);
	memcpy(st->server_key, server_key, SCRAM_KEY_LEN);
	return st;
}

struct scram_client *scram_client_new(const char *password)
{
	struct scram_client *st = calloc(1, sizeof(*st));

	if (!st)
		return NULL;
	st->password = strdup(password ? password : "");
	st->user = strdup("");
	if (!st->password || !st->user) {
		scram_client_free(st);
		return NULL;
	}
	return st;
}

void scram_client_free(struct scram_client *st)
{
	if (!st)
		return;
	free_cleansed(st->password);
	free(st->user);
	free(st->fixed_nonce);
	free(st->nonce);
	free(st->client_first_bare);
	OPENSSL_cleanse(st->server_signature, sizeof(st->server_signature));
	OPENSSL_cleanse(st->client_key, sizeof(st->client_key));
	OPENSSL_cleanse(st->server_key, sizeof(st->server_key));
	free(st);
}

void scram_client_set_nonce(struct scram_client *st, const char *nonce)
{
	char *copy = nonce ? strdup(nonce) : NULL;

	free(st->fixed_nonce);
	st->fixed_nonce = copy;
}

/* RFC 5802 saslname: ',' and '=' become "=2C" and "=3D". */
static char *saslname(const char *user)
{
	size_t n = 0;
	char *out, *o;

	for (const char *p = user; *p; p++)
		n += (*p == ',' || *p == '=') ? 3 : 1;
	out = malloc(n + 1);
	if (!out)
		return NULL;
	o = out;
	for (const char *p = user; *p; p++) {
		if (*p == ',' || *p == '=') {
			memcpy(o, *p == ',' ? "=2C" : "=3D", 3);
			o += 3;
		} else {
			*o++ = *p;
		}
	}
	*o = '\0';
	return out;
}

void scram_client_set_user(struct scram_client *st, const char *user)
{
	char *name = saslname(user ? user : "");

	if (!name)
		return;
	free(st->user);
	st->user = name;
}

char *scram_client_first(struct scram_client *st)
{
	char *msg = NULL;

	if (!st || st->phase != SCRAM_START) {
		if (st)
			st->phase = SCRAM_FAILED;
		return NULL;
	}
	st->nonce = make_nonce(st->fixed_nonce);
	if (st->nonce)
		st->client_first_bare = strfmt("n=%s,r=%s", st->user, st->nonce);
	if (st->client_first_bare)
		msg = strfmt(GS2_N "%s", st->client_first_bare);
	st->phase = msg ? SCRAM_FIRST : SCRAM_FAILED;
	return msg;
}

/* The server's nonce must extend ours with a part of its own. */
static const char *client_check_nonce(const struct scram_client *st, struct span nonce)
{
	size_t n = strlen(st->nonce);

	if (nonce.len <= n || memcmp(nonce.s, st->nonce, n) != 0)
		return ERR_NONCE_ECHO;
	return NULL;
}

/*
 * ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage); also remembers
 * the ServerSignature scram_client_verify() expects.
 */
static bool client_proof(struct scram_client *st, const struct server_first *sf,
			 const char *authmsg, uint8_t proof[SCRAM_KEY_LEN])
{
	struct scram_keys k = { .iterations = sf->iterations, .salt = sf->salt,
				.saltlen = sf->saltlen };
	uint8_t client_key[SCRAM_KEY_LEN], sig[SCRAM_KEY_LEN];
	size_t len = strlen(authmsg);
	bool ok;

	if (st->use_keys) {
		memcpy(client_key, st->client_key, SCRAM_KEY_LEN);
		memcpy(k.server_key, st->server_key, SCRAM_KEY_LEN);
		ok = sha256(client_key, k.stored_key);
	} else {
		ok = derive_keys(st->password, &k, client_key);
	}
	ok = ok && hmac(k.stored_key, authmsg, len, sig)
		&& hmac(k.server_key, authmsg, len, st->server_signature);
	if (ok)
		xor_key(client_key, sig, proof);
	OPENSSL_cleanse(client_key, sizeof(client_key));
	OPENSSL_cleanse(k.stored_key, sizeof(k.stored_key));
	OPENSSL_cleanse(k.server_key, sizeof(k.server_key));
	return ok;
}

/* Builds the client-final-message for a parsed server-first-message. */
static const char *client_make_final(struct scram_client *st, const char *server_first,
				     const struct server_first *sf, char **out)
{
	uint8_t proof[SCRAM_KEY_LEN];
	char *without, *authmsg = NULL, *proof64 = NULL;
	const char *reason = ERR_NOMEM;

	without = strfmt("c=" GS2_N_B64 ",r=%.*s", (int)sf->nonce.len, sf->nonce.s);
	if (without)
		authmsg = auth_message(st->client_first_bare, server_first, without);
	if (!authmsg)
		goto end;
	if (!client_proof(st, sf, authmsg, proof)) {
		reason = ERR_CRYPTO;
		goto end;
	}
	proof64 = b64_encode(proof, sizeof(proof));
	if (proof64)
		*out = strfmt("%s,p=%s", without, proof64);
	if (*out)
		reason = NULL;
end:
	free(without);
	free(authmsg);
	free(proof64);
	return reason;
}

bool scram_client_final(struct scram_client *st, const char *msg, size_t len,
			char **out, char *err, size_t errlen)
{
	struct server_first sf = { .salt = NULL };
	const char *reason = NULL;
	char *buf;

	*out = NULL;
	if (!st || st->phase != SCRAM_FIRST) {
		if (st)
			st->phase = SCRAM_FAILED;
		return fail(err, errlen, ERR_SEQUENCE);
	}
	buf = msg_dup(msg, len, &reason);
	if (buf)
		reason = parse_server_first(buf, &sf);
	if (!reason)
		reason = client_check_nonce(st, sf.nonce);
	if (!reason)
		reason = client_make_final(st, buf, &sf, out);
	free(sf.salt);
	free(buf);
	return step_done(&st->phase, SCRAM_FINAL, reason, err, errlen);
}

/* "e=<reason>" from the server: always a failure, with its reason. */
static bool client_server_error(const char *msg, char *err, size_t errlen)
{
	struct span v = { msg + 2, strcspn(msg + 2, ",") };

	if (err && errlen > 0)
		snprintf(err, errlen, "server error: %.*s", (int)v.len, v.s);
	return false;
}

/* "v=<ServerSignature>[,ext...]" must match what client_proof() expects. */
static const char *client_check_verifier(const struct scram_client *st, const char *p)
{
	uint8_t sig[SCRAM_KEY_LEN];
	struct span v;

	if (!read_attr(&p, 'v', &v) || !skip_extensions(p) || !b64_decode_key(v, sig))
		return ERR_MALFORMED;
	if (CRYPTO_memcmp(sig, st->server_signature, SCRAM_KEY_LEN) != 0)
		return ERR_SIGNATURE;
	return NULL;
}

bool scram_client_verify(struct scram_client *st, const char *msg, size_t len,
			 char *err, size_t errlen)
{
	const char *reason = NULL;
	bool ok;
	char *buf;

	if (!st || st->phase != SCRAM_FINAL) {
		if (st)
			st->phase = SCRAM_FAILED;
		return fail(err, errlen, ERR_SEQUENCE);
	}
	buf = msg_dup(msg, len, &reason);
	if (buf && is_attr(buf, 'e')) {
		ok = client_server_error(buf, err, errlen);
		st->phase = SCRAM_FAILED;
	} else {
		if (buf)
			reason = client_check_verifier(st, buf);
		ok = step_done(&st->phase, SCRAM_DONE, reason, err, errlen);
	}
	free(buf);
	return ok;
}
