/* SPDX-License-Identifier: ISC */
/*
 * harness.h -- what the libFuzzer targets share: a pooler runtime without
 * listen sockets, and one client connection per input over a socketpair.
 *
 * The targets drive the real client code. For each input:
 *   1. client_accept() takes one end of a fresh socketpair, as accept_cb does;
 *   2. the bytes are written into the other end, whole or in chunks, with a
 *      turn of the event loop after each chunk, and our write side is shut;
 *   3. the loop is turned and whatever the pooler answered is read and
 *      dropped; then our end is closed;
 *   4. the loop is turned until the client (and any server it caused) has
 *      been freed through the runtime's own justfree event.
 * A connection still alive H_STUCK_USEC after step 3 is reported as a crash
 * (abort), so the input that hangs a client is kept.
 *
 * Nothing is reached over the network: the only database points at
 * 127.0.0.1 port 1, where connecting is refused at once.
 *
 * After each input the runtime is put back as it was (shutdown and pause
 * flags, databases and pools, and on request the whole config), so an
 * input's behaviour does not depend on the inputs before it and memory stays
 * bounded. At exit runtime_teardown() frees everything, so LeakSanitizer sees
 * a clean process.
 *
 * Set LOKADB_FUZZ_LOG=1 to see the pooler's log on stderr.
 *
 * Included by exactly one fuzz_*.c each (it defines functions).
 */
#ifndef LOKADB_FUZZ_HARNESS_H
#define LOKADB_FUZZ_HARNESS_H

#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define H_SETTLE_TURNS 64		/* loop turns after our write side is shut */
#define H_SPIN_TURNS 1000		/* then turns without sleeping ... */
#define H_STUCK_USEC (2 * USEC)		/* ... and with, until a client counts as stuck */
#define H_NAP_USEC 200
#define H_STALL_TURNS 10000		/* turns with a full socket before we stop writing */
#define H_READ_CHUNK 65536

/* Chunk sizes the first input byte chooses from (0 = all in one write). */
static const size_t h_chunks[8] = { 0, 1, 2, 3, 7, 16, 64, 512 };

static struct {
	char dir[64];
	char ini[PATH_MAX];
	bool made;
} h;

/* UBSan reports are crashes, not log lines the fuzzer walks past. */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

static void h_die(const char *what)
{
	fprintf(stderr, "fuzz harness: %s\n", what);
	abort();
}

static void h_write_file(const char *name, const char *text)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", h.dir, name);
	f = fopen(path, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		h_die("could not write the config files");
}

static int h_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path);
}

static struct lk_config *h_load_config(void)
{
	char err[1024];
	struct lk_config *cf = config_load(h.ini, err, sizeof(err));

	if (!cf) {
		fprintf(stderr, "fuzz harness: %s\n", err);
		abort();
	}
	return cf;
}

static void h_exit(void)
{
	runtime_teardown();
	config_free(rt->cf);
	rt->cf = NULL;
	log_close();
	if (h.made)
		nftw(h.dir, h_rm, 8, FTW_DEPTH | FTW_PHYS);
}

/*
 * The runtime of main.c without listen sockets: config from a temp ini (and
 * userlist), then runtime_setup_events() for the event base, DNS and the
 * justfree event with runtime.c's own callback. The janitor, stats timer and
 * signal events are taken off the loop: timers make runs depend on the
 * clock, and signal events would take SIGINT/SIGTERM away from libFuzzer
 * (event_del restores libFuzzer's handlers).
 */
static void h_setup(const char *ini_text, const char *userlist)
{
	snprintf(h.dir, sizeof(h.dir), "/tmp/lokadb-fuzz-XXXXXX");
	if (!mkdtemp(h.dir))
		h_die("mkdtemp failed");
	h.made = true;
	snprintf(h.ini, sizeof(h.ini), "%s/lokadb.ini", h.dir);
	h_write_file("lokadb.ini", ini_text);
	if (userlist)
		h_write_file("userlist.txt", userlist);

	runtime_init();
	rt->quiet = getenv("LOKADB_FUZZ_LOG") == NULL;
	rt->config_path = h.ini;
	rt->cf = h_load_config();
	runtime_apply_log_settings();
	if (!runtime_setup_events())
		h_die("runtime_setup_events failed");
	event_del(rt->janitor);
	event_del(rt->stats_timer);
	event_del(rt->sig_hup);
	event_del(rt->sig_term);
	event_del(rt->sig_int);
	event_del(rt->sig_quit);
	event_del(rt->sig_usr1);
	event_del(rt->sig_usr2);
	pool_apply_config(NULL);
	atexit(h_exit);
}

/* No client, no server, nothing waiting to be freed. */
static bool h_idle(void)
{
	struct pool *p;

	if (rt->n_clients || !TAILQ_EMPTY(&rt->login_clients) || !TAILQ_EMPTY(&rt->admin_clients) ||
	    !TAILQ_EMPTY(&rt->justfree_clients) || !TAILQ_EMPTY(&rt->justfree_servers))
		return false;
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (p->n_active_cl + p->n_waiting_cl + p->n_login_cl ||
		    p->n_login_sv + p->n_idle_sv + p->n_active_sv + p->n_tested_sv)
			return false;
	return true;
}

/* Read and drop what the pooler sent; false once it closed its end. */
static bool h_drain(int fd)
{
	static char buf[H_READ_CHUNK];

	if (fd < 0)
		return false;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n > 0)
			continue;
		return n < 0 && (errno == EAGAIN || errno == EINTR);
	}
}

static void h_turn(int fd)
{
	event_base_loop(rt->base, EVLOOP_NONBLOCK);
	h_drain(fd);
}

/* Write all of buf, `chunk` bytes at a time (0 = at once). false if the pooler hung up. */
static bool h_feed(int fd, const uint8_t *buf, size_t len, size_t chunk)
{
	size_t off = 0;
	int stalled = 0;

	while (off < len) {
		size_t n = chunk && len - off > chunk ? chunk : len - off;
		ssize_t w = send(fd, buf + off, n, MSG_NOSIGNAL);
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			return false;	/* EPIPE/ECONNRESET: the pooler closed the connection */
		if (w > 0) {
			off += (size_t)w;
			stalled = 0;
		} else if (++stalled > H_STALL_TURNS) {
			return false;	/* not reading: h_settle() decides whether it hangs */
		}
		h_turn(fd);
	}
	return true;
}

static void h_report_stuck(void)
{
	struct client *c;

	fprintf(stderr, "fuzz harness: a connection was not freed after %lld ms\n",
		(long long)(H_STUCK_USEC / 1000));
	TAILQ_FOREACH(c, &rt->login_clients, entry)
		fprintf(stderr, "  login client %llu auth_step %d closing %d\n", (unsigned long long)c->id,
			c->auth_step, c->closing);
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		fprintf(stderr, "  console client %llu closing %d\n", (unsigned long long)c->id, c->closing);
	fprintf(stderr, "  n_clients %d\n", rt->n_clients);
	abort();
}

/* Turn the loop until nothing is left of the connection; abort if it hangs. */
static void h_settle(void)
{
	usec_t deadline = 0;

	for (int i = 0; !h_idle(); i++) {
		event_base_loop(rt->base, EVLOOP_NONBLOCK);
		if (i < H_SPIN_TURNS)
			continue;
		if (!deadline)
			deadline = now_mono() + H_STUCK_USEC;
		if (now_mono() > deadline)
			h_report_stuck();
		usleep(H_NAP_USEC);
	}
}

/*
 * Put back what a console command or a login may have changed. The config is
 * re-read only when asked (console SET and RELOAD change it).
 */
static void h_reset(bool fresh_config)
{
	rt->shutdown = SHUT_NONE;
	rt->paused = false;
	pool_free_all();
	if (fresh_config) {
		config_free(rt->cf);
		rt->cf = h_load_config();
	}
	pool_apply_config(NULL);
}

/* One connection: prefix then data through a socketpair; see the header comment. */
static void h_run(const uint8_t *prefix, size_t plen, const uint8_t *data, size_t size, size_t chunk)
{
	uint8_t *buf = malloc(plen + size + 1);
	int sv[2];

	if (!buf || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		h_die("out of memory or sockets");
	if (plen)
		memcpy(buf, prefix, plen);
	if (size)
		memcpy(buf + plen, data, size);
	fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);

	client_accept(sv[0], NULL, 0, true);
	h_feed(sv[1], buf, plen + size, chunk);
	shutdown(sv[1], SHUT_WR);
	for (int i = 0; i < H_SETTLE_TURNS && !h_idle(); i++)
		h_turn(sv[1]);
	h_drain(sv[1]);
	close(sv[1]);
	h_settle();
	free(buf);
}

#endif
