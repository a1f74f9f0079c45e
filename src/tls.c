/* SPDX-License-Identifier: ISC */
/*
 * tls.c -- TLS with clients (OpenSSL 3 through libevent's bufferevent_openssl).
 *
 * The SSL_CTX is built from the client_tls_* settings at start and on every
 * RELOAD/SET that touches them (check-then-apply: a key or certificate that
 * does not load leaves the running context in place and fails the reload).
 * Connections that already run TLS keep the context they started with
 * (OpenSSL reference-counts it).
 *
 * A client that sends SSLRequest while client_tls_sslmode is not disable
 * gets 'S', then its socket moves from the plain fast path to a
 * bufferevent_openssl (util.c conn_start_tls()); everything after that is
 * the same code.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <event2/bufferevent_ssl.h>

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
static bool protocol_range(const char *spec, int *min, int *max, char *err, size_t errlen)
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
			snprintf(err, errlen, "client_tls_protocols: unknown protocol \"%s\" (use secure, all, tlsv1.2, tlsv1.3)", tok);
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

static bool load_file(SSL_CTX *ctx, const struct lk_config *cf, const char *file, int kind, char *err, size_t errlen)
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
		snprintf(err, errlen, "%s: cannot load %s: %s",
			 kind == 0 ? "client_tls_cert_file" : kind == 1 ? "client_tls_key_file" : "client_tls_ca_file",
			 path, ssl_err);
		free(path);
		return false;
	}
	free(path);
	return true;
}

/*
 * Build the client context of `cf` into *out (NULL when TLS is off).
 * Returns false with a reason, changing nothing.
 */
bool tls_client_check(const struct lk_config *cf, void **out, char *err, size_t errlen)
{
	SSL_CTX *ctx;
	int min, max;
	char ssl_err[256];

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
	if (!protocol_range(cf->client_tls_protocols, &min, &max, err, errlen))
		return false;
	ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx) {
		ssl_error_text(ssl_err, sizeof(ssl_err));
		snprintf(err, errlen, "cannot create a TLS context: %s", ssl_err);
		return false;
	}
	SSL_CTX_set_min_proto_version(ctx, min);
	SSL_CTX_set_max_proto_version(ctx, max);
	SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	if (cf->client_tls_ciphers && *cf->client_tls_ciphers && strcasecmp(cf->client_tls_ciphers, "default") != 0 &&
	    SSL_CTX_set_cipher_list(ctx, strcasecmp(cf->client_tls_ciphers, "secure") == 0 ? "HIGH:!aNULL:!MD5" :
				   cf->client_tls_ciphers) != 1) {
		ssl_error_text(ssl_err, sizeof(ssl_err));
		snprintf(err, errlen, "client_tls_ciphers: %s", ssl_err);
		SSL_CTX_free(ctx);
		return false;
	}
	if (!load_file(ctx, cf, cf->client_tls_cert_file, 0, err, errlen) ||
	    !load_file(ctx, cf, cf->client_tls_key_file, 1, err, errlen))
		goto fail;
	if (SSL_CTX_check_private_key(ctx) != 1) {
		snprintf(err, errlen, "client_tls_key_file does not match client_tls_cert_file");
		goto fail;
	}
	if (cf->client_tls_ca_file) {
		if (!load_file(ctx, cf, cf->client_tls_ca_file, 2, err, errlen))
			goto fail;
		if (cf->client_tls_sslmode >= SSL_VERIFY_CA)
			SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	}
	*out = ctx;
	return true;
fail:
	SSL_CTX_free(ctx);
	return false;
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
const char *tls_describe(struct bufferevent *bev, char *buf, size_t len)
{
	SSL *ssl = bev ? bufferevent_openssl_get_ssl(bev) : NULL;

	buf[0] = 0;
	if (ssl)
		snprintf(buf, len, "%s/%s", SSL_get_version(ssl), SSL_get_cipher_name(ssl));
	return buf;
}

/* Has the TLS handshake of this bufferevent completed? */
bool tls_handshake_done(struct bufferevent *bev)
{
	SSL *ssl = bev ? bufferevent_openssl_get_ssl(bev) : NULL;
	return ssl && SSL_is_init_finished(ssl);
}

/* The last OpenSSL error of a TLS bufferevent, for a log line. */
const char *tls_error(struct bufferevent *bev, char *buf, size_t len)
{
	unsigned long e = bev ? bufferevent_get_openssl_error(bev) : 0;

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
}
