/* SPDX-License-Identifier: ISC */
/*
 * tls.c -- TLS with clients and servers (OpenSSL 3 on the connection's socket).
 *
 * The SSL_CTX is built from the client_tls_* settings at start and on every
 * RELOAD/SET that touches them (check-then-apply: a key or certificate that
 * does not load leaves the running context in place and fails the reload).
 * Connections that already run TLS keep the context they started with
 * (OpenSSL reference-counts it).
 *
 * A client that sends SSLRequest while client_tls_sslmode is not disable
 * gets 'S', then OpenSSL takes over its socket inside the same fast path
 * (util.c conn_start_tls(): handshake, SSL_read, SSL_write); everything
 * after that is the same code.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

static SSL_CTX *client_ctx;

static void ssl_error_text(char *buf, size_t len)
{
	unsigned long e = ERR_get_error();
	if (!e) {
		snprintf(buf, len, "unknown TLS error");
		return;
	}
	ERR_error_string_n(e, buf, len);
	ERR_clear_error();
}

/* "secure", "all", or a comma/space list of tlsv1.2 / tlsv1.3. */
static bool protocol_range(const char *side, const char *spec, int *min, int *max, char *err, size_t errlen)
{
	char *copy, *save = NULL, *tok;
	bool ok = true;

	*min = 0;
	*max = 0;
	if (!spec || !*spec || strcasecmp(spec, "secure") == 0) {
		*min = TLS1_2_VERSION;
		*max = TLS1_3_VERSION;
		return true;
	}
	if (strcasecmp(spec, "all") == 0 || strcasecmp(spec, "legacy") == 0) {
		*min = TLS1_VERSION;
		*max = TLS1_3_VERSION;
		return true;
	}
	copy = xstrdup(spec);
	for (tok = strtok_r(copy, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
		int v;
		if (strcasecmp(tok, "tlsv1.2") == 0)
			v = TLS1_2_VERSION;
		else if (strcasecmp(tok, "tlsv1.3") == 0)
			v = TLS1_3_VERSION;
		else if (strcasecmp(tok, "tlsv1.1") == 0)
			v = TLS1_1_VERSION;
		else if (strcasecmp(tok, "tlsv1") == 0 || strcasecmp(tok, "tlsv1.0") == 0)
			v = TLS1_VERSION;
		else {
			snprintf(err, errlen, "%s_tls_protocols: unknown protocol \"%s\" (use secure, all, tlsv1.2, tlsv1.3)", side, tok);
			ok = false;
			break;
		}
		if (!*min || v < *min)
			*min = v;
		if (!*max || v > *max)
			*max = v;
	}
	free(copy);
	return ok;
}

static bool load_file(SSL_CTX *ctx, const struct lk_config *cf, const char *side, const char *file, int kind,
		      char *err, size_t errlen)
{
	char *path = config_file_path(cf, file), ssl_err[256];
	int rc;

	if (!path) {
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if (kind == 0)
		rc = SSL_CTX_use_certificate_chain_file(ctx, path);
	else if (kind == 1)
		rc = SSL_CTX_use_PrivateKey_file(ctx, path, SSL_FILETYPE_PEM);
	else
		rc = SSL_CTX_load_verify_locations(ctx, path, NULL);
	if (rc != 1) {
		ssl_error_text(ssl_err, sizeof(ssl_err));
		snprintf(err, errlen, "%s_tls_%s: cannot load %s: %s", side,
			 kind == 0 ? "cert_file" : kind == 1 ? "key_file" : "ca_file", path, ssl_err);
		free(path);
		return false;
	}
	free(path);
	return true;
}

struct tls_side {
	const char *side;		/* "client" or "server": the settings' prefix */
	int mode;
	const char *key, *cert, *ca, *protocols, *ciphers;
};

#define TLS_CLIENT_RECORD_MAX 8192

static SSL_CTX *build_ctx(const struct lk_config *cf, const struct tls_side *t, bool accept, char *err, size_t errlen)
{
	SSL_CTX *ctx;
	int min, max;
	char ssl_err[256];

	if (!protocol_range(t->side, t->protocols, &min, &max, err, errlen))
		return NULL;
	ctx = SSL_CTX_new(accept ? TLS_server_method() : TLS_client_method());
	if (!ctx) {
		ssl_error_text(ssl_err, sizeof(ssl_err));
		snprintf(err, errlen, "cannot create a TLS context: %s", ssl_err);
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, min);
	SSL_CTX_set_max_proto_version(ctx, max);
	SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
			    (accept ? SSL_OP_CIPHER_SERVER_PREFERENCE : 0));
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/*
	 * Records of at most 8 KB to clients, as PostgreSQL sends them: libpq
	 * reads one record per PQconsumeInput into at least 8 KB of free buffer,
	 * so a bigger record can leave its tail inside the client's OpenSSL,
	 * where a client waiting on its socket (psycopg does) never
	 * looks: the end of a reply would never arrive.
	 */
	if (accept)
		SSL_CTX_set_max_send_fragment(ctx, TLS_CLIENT_RECORD_MAX);
	if (t->ciphers && *t->ciphers && strcasecmp(t->ciphers, "default") != 0 &&
	    SSL_CTX_set_cipher_list(ctx, strcasecmp(t->ciphers, "secure") == 0 ? "HIGH:!aNULL:!MD5" : t->ciphers) != 1) {
		ssl_error_text(ssl_err, sizeof(ssl_err));
		snprintf(err, errlen, "%s_tls_ciphers: %s", t->side, ssl_err);
		goto fail;
	}
	if (t->cert || t->key) {
		if (!t->cert || !t->key) {
			snprintf(err, errlen, "%s_tls_key_file and %s_tls_cert_file must be set together", t->side, t->side);
			goto fail;
		}
		if (!load_file(ctx, cf, t->side, t->cert, 0, err, errlen) ||
		    !load_file(ctx, cf, t->side, t->key, 1, err, errlen))
			goto fail;
		if (SSL_CTX_check_private_key(ctx) != 1) {
			snprintf(err, errlen, "%s_tls_key_file does not match %s_tls_cert_file", t->side, t->side);
			goto fail;
		}
	}
	if (t->ca) {
		if (!load_file(ctx, cf, t->side, t->ca, 2, err, errlen))
			goto fail;
		if (t->mode >= SSL_VERIFY_CA)
			SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | (accept ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
	}
	return ctx;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

/*
 * Build the client context of `cf` into *out (NULL when TLS is off).
 * Returns false with a reason, changing nothing.
 */
bool tls_client_check(const struct lk_config *cf, void **out, char *err, size_t errlen)
{
	struct tls_side t = { "client", cf->client_tls_sslmode, cf->client_tls_key_file, cf->client_tls_cert_file,
			      cf->client_tls_ca_file, cf->client_tls_protocols, cf->client_tls_ciphers };

	*out = NULL;
	if (cf->client_tls_sslmode == SSL_DISABLE)
		return true;
	if (!cf->client_tls_cert_file || !cf->client_tls_key_file) {
		snprintf(err, errlen, "client_tls_sslmode is %s but client_tls_key_file and client_tls_cert_file are not both set",
			 cf->client_tls_sslmode == SSL_ALLOW ? "allow" : cf->client_tls_sslmode == SSL_PREFER ? "prefer" :
			 cf->client_tls_sslmode == SSL_REQUIRE ? "require" : "verify-ca/verify-full");
		return false;
	}
	if (cf->client_tls_sslmode >= SSL_VERIFY_CA && !cf->client_tls_ca_file) {
		snprintf(err, errlen, "client_tls_sslmode verify-ca/verify-full needs client_tls_ca_file");
		return false;
	}
	*out = build_ctx(cf, &t, true, err, errlen);
	return *out != NULL;
}

/* The context for connections to PostgreSQL (NULL when server_tls_sslmode is disable). */
bool tls_server_check(const struct lk_config *cf, void **out, char *err, size_t errlen)
{
	struct tls_side t = { "server", cf->server_tls_sslmode, cf->server_tls_key_file, cf->server_tls_cert_file,
			      cf->server_tls_ca_file, cf->server_tls_protocols, cf->server_tls_ciphers };

	*out = NULL;
	if (cf->server_tls_sslmode == SSL_DISABLE)
		return true;
	if (cf->server_tls_sslmode >= SSL_VERIFY_CA && !cf->server_tls_ca_file) {
		snprintf(err, errlen, "server_tls_sslmode verify-ca/verify-full needs server_tls_ca_file");
		return false;
	}
	*out = build_ctx(cf, &t, false, err, errlen);
	return *out != NULL;
}

static SSL_CTX *server_ctx;

void tls_server_apply(void *ctx)
{
	if (server_ctx)
		SSL_CTX_free(server_ctx);
	server_ctx = ctx;
}

/* A new client-side SSL object for a server connection to `host`, or NULL. */
SSL *tls_server_new(const char *host)
{
	SSL *ssl;

	if (!server_ctx)
		return NULL;
	ssl = SSL_new(server_ctx);
	if (!ssl)
		return NULL;
	if (host && *host && host[0] != '/') {
		struct in6_addr a6;
		struct in_addr a4;
		bool is_ip = inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
		if (!is_ip)
			SSL_set_tlsext_host_name(ssl, host);
		if (rt->cf->server_tls_sslmode == SSL_VERIFY_FULL) {
			if (is_ip)
				X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host);
			else
				SSL_set1_host(ssl, host);
		}
	}
	return ssl;
}

/* Make a context from tls_client_check() the one new clients get. */
void tls_client_apply(void *ctx)
{
	if (client_ctx)
		SSL_CTX_free(client_ctx);
	client_ctx = ctx;
}

void tls_client_discard(void *ctx)
{
	if (ctx)
		SSL_CTX_free(ctx);
}

bool tls_client_enabled(void)
{
	return client_ctx != NULL && rt->cf->client_tls_sslmode != SSL_DISABLE;
}

/* A new server-side SSL object for an accepted client, or NULL. */
SSL *tls_client_new(void)
{
	return client_ctx ? SSL_new(client_ctx) : NULL;
}

/* "TLSv1.3/TLS_AES_256_GCM_SHA384" for SHOW CLIENTS (empty when plain). */
const char *tls_describe(const struct conn_io *io, char *buf, size_t len)
{
	SSL *ssl = io->ssl;

	buf[0] = 0;
	if (ssl)
		snprintf(buf, len, "%s/%s", SSL_get_version(ssl), SSL_get_cipher_name(ssl));
	return buf;
}

/* Has the TLS handshake of this connection completed? */
bool tls_handshake_done(const struct conn_io *io)
{
	return io->ssl && io->hs_done;
}

/*
 * The common name of the client certificate of a TLS connection into buf:
 * false when there is none or it was not verified against client_tls_ca_file
 * (client_tls_sslmode verify-ca / verify-full).
 */
bool tls_peer_cn(const struct conn_io *io, char *buf, size_t len)
{
	SSL *ssl = io->ssl;
	X509 *cert;

	buf[0] = 0;
	if (!ssl || SSL_get_verify_result(ssl) != X509_V_OK)
		return false;
	cert = SSL_get0_peer_certificate(ssl);
	if (!cert)
		return false;
	return X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, buf, (int)len) > 0;
}

/* The OpenSSL error that ended a TLS connection, for a log line. */
const char *tls_error(const struct conn_io *io, char *buf, size_t len)
{
	unsigned long e = io->ssl_err;

	if (!e || ERR_GET_LIB(e) == 0) {
		snprintf(buf, len, "connection lost during TLS");
		return buf;
	}
	ERR_error_string_n(e, buf, len);
	return buf;
}

void tls_free_all(void)
{
	tls_client_apply(NULL);
	tls_server_apply(NULL);
}
