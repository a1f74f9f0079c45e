/* SPDX-License-Identifier: ISC */
/*
 * pktbuf.c -- building PostgreSQL v3 protocol messages (see pktbuf.h).
 *
 * Owns nothing but its own growable buffer. On allocation failure the
 * buffer is marked failed and pkt_send() refuses it, so callers check one
 * result per batch instead of one per field.
 */
#include "pktbuf.h"

#include <event2/buffer.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PKT_INITIAL 512

void pkt_init(struct pktbuf *pb)
{
	memset(pb, 0, sizeof(*pb));
}

void pkt_free(struct pktbuf *pb)
{
	free(pb->data);
	pkt_init(pb);
}

void pkt_reset(struct pktbuf *pb)
{
	pb->len = 0;
	pb->msg_start = 0;
	pb->failed = false;
}

static bool pkt_reserve(struct pktbuf *pb, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (pb->failed)
		return false;
	if (pb->len + n <= pb->cap)
		return true;
	cap = pb->cap ? pb->cap : PKT_INITIAL;
	while (cap < pb->len + n)
		cap *= 2;
	p = realloc(pb->data, cap);
	if (!p) {
		pb->failed = true;
		return false;
	}
	pb->data = p;
	pb->cap = cap;
	return true;
}

void pkt_put_bytes(struct pktbuf *pb, const void *p, size_t n)
{
	if (!pkt_reserve(pb, n))
		return;
	if (n)
		memcpy(pb->data + pb->len, p, n);
	pb->len += n;
}

void pkt_put_byte(struct pktbuf *pb, uint8_t v)
{
	pkt_put_bytes(pb, &v, 1);
}

void pkt_put_int16(struct pktbuf *pb, int16_t v)
{
	uint8_t b[2] = { (uint8_t)((uint16_t)v >> 8), (uint8_t)v };
	pkt_put_bytes(pb, b, 2);
}

void pkt_put_int32(struct pktbuf *pb, int32_t v)
{
	uint32_t u = (uint32_t)v;
	uint8_t b[4] = { (uint8_t)(u >> 24), (uint8_t)(u >> 16), (uint8_t)(u >> 8), (uint8_t)u };
	pkt_put_bytes(pb, b, 4);
}

void pkt_put_string(struct pktbuf *pb, const char *s)
{
	pkt_put_bytes(pb, s, strlen(s) + 1);
}

void pkt_begin(struct pktbuf *pb, char type)
{
	pb->msg_start = pb->len;
	pb->msg_typed = type != 0;
	if (type)
		pkt_put_byte(pb, (uint8_t)type);
	pkt_put_int32(pb, 0);
}

void pkt_end(struct pktbuf *pb)
{
	size_t lenpos;
	uint32_t n;

	if (pb->failed)
		return;
	lenpos = pb->msg_start + (pb->msg_typed ? 1 : 0);
	n = (uint32_t)(pb->len - lenpos);
	pb->data[lenpos] = (uint8_t)(n >> 24);
	pb->data[lenpos + 1] = (uint8_t)(n >> 16);
	pb->data[lenpos + 2] = (uint8_t)(n >> 8);
	pb->data[lenpos + 3] = (uint8_t)n;
}

bool pkt_send(struct pktbuf *pb, struct evbuffer *out)
{
	bool ok = !pb->failed && evbuffer_add(out, pb->data, pb->len) == 0;
	pkt_reset(pb);
	return ok;
}

static void pkt_error_fields(struct pktbuf *pb, char type, const char *severity, const char *sqlstate,
			     const char *msg, const char *detail)
{
	pkt_begin(pb, type);
	pkt_put_byte(pb, 'S');
	pkt_put_string(pb, severity);
	pkt_put_byte(pb, 'V');
	pkt_put_string(pb, severity);
	pkt_put_byte(pb, 'C');
	pkt_put_string(pb, sqlstate);
	pkt_put_byte(pb, 'M');
	pkt_put_string(pb, msg);
	if (detail) {
		pkt_put_byte(pb, 'D');
		pkt_put_string(pb, detail);
	}
	pkt_put_byte(pb, 0);
	pkt_end(pb);
}

void pkt_error(struct pktbuf *pb, const char *severity, const char *sqlstate, const char *msg, const char *detail)
{
	pkt_error_fields(pb, 'E', severity, sqlstate, msg, detail);
}

void pkt_notice(struct pktbuf *pb, const char *sqlstate, const char *msg)
{
	pkt_error_fields(pb, 'N', "NOTICE", sqlstate, msg, NULL);
}

void pkt_ready(struct pktbuf *pb, char status)
{
	pkt_begin(pb, 'Z');
	pkt_put_byte(pb, (uint8_t)status);
	pkt_end(pb);
}

/* One reserve and two copies: a login sends a dozen of these. */
void pkt_param_status(struct pktbuf *pb, const char *name, const char *value)
{
	size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
	uint32_t len = (uint32_t)(4 + nl + vl);
	uint8_t *d;

	if (!pkt_reserve(pb, 1 + (size_t)len))
		return;
	d = pb->data + pb->len;
	d[0] = 'S';
	d[1] = (uint8_t)(len >> 24);
	d[2] = (uint8_t)(len >> 16);
	d[3] = (uint8_t)(len >> 8);
	d[4] = (uint8_t)len;
	memcpy(d + 5, name, nl);
	memcpy(d + 5 + nl, value, vl);
	pb->msg_start = pb->len;
	pb->msg_typed = true;
	pb->len += 1 + (size_t)len;
}

void pkt_auth_req(struct pktbuf *pb, int32_t code, const void *data, size_t len)
{
	pkt_begin(pb, 'R');
	pkt_put_int32(pb, code);
	pkt_put_bytes(pb, data, len);
	pkt_end(pb);
}

void pkt_command_complete(struct pktbuf *pb, const char *tag)
{
	pkt_begin(pb, 'C');
	pkt_put_string(pb, tag);
	pkt_end(pb);
}

void pkt_close(struct pktbuf *pb, char kind, const char *name)
{
	pkt_begin(pb, 'C');
	pkt_put_byte(pb, (uint8_t)kind);
	pkt_put_string(pb, name);
	pkt_end(pb);
}

void pkt_parse(struct pktbuf *pb, const char *name, const char *sql)
{
	pkt_begin(pb, 'P');
	pkt_put_string(pb, name);
	pkt_put_string(pb, sql);
	pkt_put_int16(pb, 0);
	pkt_end(pb);
}

void pkt_bind(struct pktbuf *pb, const char *portal, const char *stmt)
{
	pkt_begin(pb, 'B');
	pkt_put_string(pb, portal);
	pkt_put_string(pb, stmt);
	pkt_put_int16(pb, 0);	/* parameter formats */
	pkt_put_int16(pb, 0);	/* parameters */
	pkt_put_int16(pb, 0);	/* result formats: text */
	pkt_end(pb);
}

void pkt_execute(struct pktbuf *pb, const char *portal)
{
	pkt_begin(pb, 'E');
	pkt_put_string(pb, portal);
	pkt_put_int32(pb, 0);	/* every row */
	pkt_end(pb);
}

void pkt_sync(struct pktbuf *pb)
{
	pkt_begin(pb, 'S');
	pkt_end(pb);
}

void pkt_query(struct pktbuf *pb, const char *sql)
{
	pkt_begin(pb, 'Q');
	pkt_put_string(pb, sql);
	pkt_end(pb);
}

void pkt_row_description(struct pktbuf *pb, int ncols, const char *const *names)
{
	pkt_begin(pb, 'T');
	pkt_put_int16(pb, (int16_t)ncols);
	for (int i = 0; i < ncols; i++) {
		pkt_put_string(pb, names[i]);
		pkt_put_int32(pb, 0);	/* table oid */
		pkt_put_int16(pb, 0);	/* column number */
		pkt_put_int32(pb, 25);	/* text */
		pkt_put_int16(pb, -1);
		pkt_put_int32(pb, -1);
		pkt_put_int16(pb, 0);	/* text format */
	}
	pkt_end(pb);
}

void pkt_data_row(struct pktbuf *pb, int ncols, const char *const *values)
{
	pkt_begin(pb, 'D');
	pkt_put_int16(pb, (int16_t)ncols);
	for (int i = 0; i < ncols; i++) {
		if (!values[i]) {
			pkt_put_int32(pb, -1);
			continue;
		}
		size_t n = strlen(values[i]);
		pkt_put_int32(pb, (int32_t)n);
		pkt_put_bytes(pb, values[i], n);
	}
	pkt_end(pb);
}

bool pkt_send_error(struct evbuffer *out, const char *severity, const char *sqlstate, const char *fmt, ...)
{
	struct pktbuf pb;
	char msg[1024];
	va_list ap;
	bool ok;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pkt_init(&pb);
	pkt_error(&pb, severity, sqlstate, msg, NULL);
	ok = pkt_send(&pb, out);
	pkt_free(&pb);
	return ok;
}
