/* SPDX-License-Identifier: ISC */
/*
 * pktbuf.h -- building PostgreSQL v3 protocol messages.
 *
 * A pktbuf is a growable byte buffer. pkt_begin() starts a message with its
 * type byte and a length placeholder, pkt_end() patches the length. Whole
 * messages are then appended to a libevent evbuffer with pkt_send(): we send
 * whole messages, never piecemeal.
 *
 * The error helpers build ErrorResponse messages in PostgreSQL's shape:
 * severity, SQLSTATE, message, optional detail/hint.
 */
#ifndef LOKADB_PKTBUF_H
#define LOKADB_PKTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

struct pktbuf {
	uint8_t *data;
	size_t len;
	size_t cap;
	size_t msg_start;	/* offset of the open message's first byte */
	bool msg_typed;		/* the open message starts with a type byte */
	bool failed;		/* out of memory: everything after is dropped */
};

void pkt_init(struct pktbuf *pb);
void pkt_free(struct pktbuf *pb);	/* releases the memory; pb may be reused after pkt_init */
void pkt_reset(struct pktbuf *pb);	/* empties, keeps memory */

void pkt_begin(struct pktbuf *pb, char type);	/* type 0: startup-style message without type byte */
void pkt_end(struct pktbuf *pb);
void pkt_put_byte(struct pktbuf *pb, uint8_t v);
void pkt_put_int16(struct pktbuf *pb, int16_t v);
void pkt_put_int32(struct pktbuf *pb, int32_t v);
void pkt_put_bytes(struct pktbuf *pb, const void *p, size_t n);
void pkt_put_string(struct pktbuf *pb, const char *s);	/* with its NUL */

/* Append everything built so far to `out` and empty pb. false on OOM. */
bool pkt_send(struct pktbuf *pb, struct evbuffer *out);

/* Whole messages, appended to pb. */
void pkt_error(struct pktbuf *pb, const char *severity, const char *sqlstate, const char *msg, const char *detail);
void pkt_notice(struct pktbuf *pb, const char *sqlstate, const char *msg);
void pkt_ready(struct pktbuf *pb, char status);
void pkt_param_status(struct pktbuf *pb, const char *name, const char *value);
void pkt_auth_req(struct pktbuf *pb, int32_t code, const void *data, size_t len);
void pkt_command_complete(struct pktbuf *pb, const char *tag);
void pkt_query(struct pktbuf *pb, const char *sql);
void pkt_close(struct pktbuf *pb, char kind, const char *name);	/* Close of a statement (S) or portal (P) */
/* The pooler's own extended-protocol messages: no parameters, text results, every row. */
void pkt_parse(struct pktbuf *pb, const char *name, const char *sql);
void pkt_bind(struct pktbuf *pb, const char *portal, const char *stmt);
void pkt_execute(struct pktbuf *pb, const char *portal);
void pkt_sync(struct pktbuf *pb);

/* Admin result sets: RowDescription from a column list, DataRow of text values (NULL = SQL NULL). */
void pkt_row_description(struct pktbuf *pb, int ncols, const char *const *names);
void pkt_data_row(struct pktbuf *pb, int ncols, const char *const *values);

/* Send an ErrorResponse directly to an evbuffer (convenience). */
bool pkt_send_error(struct evbuffer *out, const char *severity, const char *sqlstate, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Big-endian reads from a byte array. */
static inline uint32_t pkt_get_u32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline uint16_t pkt_get_u16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}
/* ... and writes, in place. */
static inline void pkt_set_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}
static inline void pkt_set_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

/*
 * Eight bytes at a time (a word loaded with memcpy): the bytes of v that are
 * 0, each flagged by its high bit. The lowest flag is exact; a flag above it
 * may be a borrow's, to be checked byte by byte.
 */
static inline uint64_t pkt_zero_bytes(uint64_t v)
{
	return (v - 0x0101010101010101ull) & ~v & 0x8080808080808080ull;
}
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define PKT_WORD_SCAN 1		/* the word's first byte is its lowest: pkt_flag_byte() below holds */
/* The offset in the word of pkt_zero_bytes' lowest flag (z != 0). */
static inline unsigned pkt_flag_byte(uint64_t z)
{
	return (unsigned)__builtin_ctzll(z) >> 3;
}
#endif

#endif
