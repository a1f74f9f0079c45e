/* SPDX-License-Identifier: ISC */
/*
 * tunnel_hello -- an agent's handshake by hand, for the tests of the relay.
 *
 *   tunnel_hello HOST PORT SITE TOKEN            one session: prints "accepted"
 *                                                 or "refused CODE"
 *   tunnel_hello HOST PORT SITE TOKEN replay     session A with its own proof,
 *                                                 then, while A stays open,
 *                                                 session B that sends A's proof
 *
 * TLS 1.3 with no certificate check (the relay is the system under test),
 * the proof as the agent makes it: HMAC-SHA256(SHA-256(token), TLS exporter
 * "EXPORTER-Channel-Binding"). Blocking sockets with a 5 s receive timeout:
 * a tool, not a plugin. Exit 0 when every session ended as the mode
 * expects (replay: A accepted, B refused UNAUTHORIZED), 1 otherwise.
 */
#include "mux.h"

#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define LABEL "EXPORTER-Channel-Binding"

struct conn {
	int fd;
	SSL *ssl;
	struct mux_session *s;
	int result;			/* 0 pending, 1 accepted, -1 refused */
	uint32_t code;
};

static void on_hello_ack(struct mux_session *s, const struct mux_hello *ack, void *ud)
{
	(void)s;
	(void)ack;
	((struct conn *)ud)->result = 1;
}

static void on_goaway(struct mux_session *s, uint32_t last, uint32_t code, uint32_t reconnect_ms,
		      const char *debug, size_t dlen, void *ud)
{
	struct conn *c = ud;

	(void)s;
	(void)last;
	(void)reconnect_ms;
	(void)debug;
	(void)dlen;
	c->result = -1;
	c->code = code;
}

static const struct mux_callbacks cbs = {
	.on_hello_ack = on_hello_ack,
	.on_goaway = on_goaway,
};

static uint64_t now_ms(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (uint64_t)tv.tv_sec * 1000u + (uint64_t)tv.tv_usec / 1000u;
}

static bool tls_connect(struct conn *c, SSL_CTX *ctx, const char *host, const char *port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	struct timeval tv = { 5, 0 };

	if (getaddrinfo(host, port, &hints, &ai) != 0)
		return false;
	c->fd = socket(ai->ai_family, SOCK_STREAM, 0);
	if (c->fd < 0 || connect(c->fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		freeaddrinfo(ai);
		return false;
	}
	freeaddrinfo(ai);
	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	c->ssl = SSL_new(ctx);
	SSL_set_fd(c->ssl, c->fd);
	return SSL_connect(c->ssl) == 1;
}

static void proof_of(struct conn *c, const char *token, uint8_t proof[32])
{
	uint8_t ekm[32], key[32];
	unsigned plen = 0;

	SSL_export_keying_material(c->ssl, ekm, sizeof(ekm), LABEL, strlen(LABEL), NULL, 0, 0);
	SHA256((const unsigned char *)token, strlen(token), key);
	HMAC(EVP_sha256(), key, sizeof(key), ekm, sizeof(ekm), proof, &plen);
}

/* Send HELLO with proof; read until HELLO_ACK, GOAWAY, EOF or the timeout. */
static void hello(struct conn *c, const char *site, const uint8_t proof[32])
{
	const uint8_t *p;
	size_t n;
	uint8_t buf[16384];
	struct mux_settings st;
	int r;

	mux_settings_default(&st);
	c->s = mux_session_new(MUX_ROLE_AGENT, &st, &cbs, c);
	if (!c->s || !mux_hello(c->s, site, proof, 32, now_ms()))
		return;
	while ((n = mux_pending(c->s, &p)) > 0) {
		if (SSL_write(c->ssl, p, (int)n) <= 0)
			return;
		mux_consumed(c->s, n);
	}
	while (c->result == 0 && (r = SSL_read(c->ssl, buf, sizeof(buf))) > 0)
		if (!mux_feed(c->s, buf, (size_t)r, now_ms()))
			break;
}

static void conn_close(struct conn *c)
{
	mux_session_free(c->s);
	if (c->ssl)
		SSL_free(c->ssl);
	if (c->fd >= 0)
		close(c->fd);
}

static void report(const char *name, const struct conn *c)
{
	if (c->result > 0)
		printf("%saccepted\n", name);
	else if (c->result < 0)
		printf("%srefused %s\n", name, mux_error_name(c->code));
	else
		printf("%sno answer\n", name);
}

/* One or two sessions as the mode says; 0 when they ended as expected. */
static int run(SSL_CTX *ctx, struct conn *a, struct conn *b, char **argv, bool replay)
{
	uint8_t proof[32];

	if (!tls_connect(a, ctx, argv[1], argv[2])) {
		printf("cannot connect\n");
		return 1;
	}
	proof_of(a, argv[4], proof);
	hello(a, argv[3], proof);
	report(replay ? "A: " : "", a);
	if (!replay)
		return a->result > 0 ? 0 : 1;
	if (!tls_connect(b, ctx, argv[1], argv[2])) {
		printf("B: cannot connect\n");
		return 1;
	}
	hello(b, argv[3], proof);	/* A's proof on B's connection */
	report("B: ", b);
	return a->result > 0 && b->result < 0 && b->code == MUX_E_UNAUTHORIZED ? 0 : 1;
}

int main(int argc, char **argv)
{
	SSL_CTX *ctx;
	struct conn a = { .fd = -1 }, b = { .fd = -1 };
	int rc;
	bool replay = argc == 6 && strcmp(argv[5], "replay") == 0;

	if (argc != 5 && !replay) {
		fprintf(stderr, "usage: %s HOST PORT SITE TOKEN [replay]\n", argv[0]);
		return 2;
	}
	ctx = SSL_CTX_new(TLS_client_method());
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
	rc = run(ctx, &a, &b, argv, replay);
	conn_close(&a);
	conn_close(&b);
	SSL_CTX_free(ctx);
	return rc;
}
