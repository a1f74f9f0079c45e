/* SPDX-License-Identifier: ISC */
/*
 * harness.h -- what the libFuzzer targets share: a pooler runtime without
 * listen sockets, and one client connection per input over a socketpair.
 *
 * The targets drive the real client code. For each input:
 *   1. h_open(): client_accept() takes one end of a fresh socketpair, as
 *      runtime.c's accept_cb does;
 *   2. h_send(): the bytes are written into the other end, whole or in
 *      chunks, with a turn of the event loop after each chunk; then the loop
 *      is turned until quiet and the stall oracle runs (h_check_stall());
 *   3. h_close(): our write side is shut, the loop turned, whatever the pooler
 *      answered read and dropped, our end closed, and the loop turned until
 *      the client (and any server it caused) has been freed through the
 *      runtime's own justfree event.
 * Two oracles besides the sanitizers, both abort() so libFuzzer keeps the
 * input: a client that holds input it could act on while no event will run
 * it (a hang for a real peer; LOKADB_FUZZ_STALL=0 turns this off), and a
 * connection still not freed H_STUCK_USEC after our end was closed.
 *
 * Nothing is reached over the network: the only database points at
 * 127.0.0.1 port 1, where connecting is refused at once.
 *
 * After each input the runtime is put back as it was (shutdown, pause and
 * SUSPEND, databases and pools, and on request the whole config), so an
 * input's behaviour does not depend on the inputs before it and memory stays
 * bounded. At exit runtime_teardown() frees everything, so LeakSanitizer sees
 * a clean process.
 *
 * Set LOKADB_FUZZ_LOG=1 to see the pooler's log on stderr, LOKADB_FUZZ_DUMP=1
 * to see what it answered.
 *
 * Included by exactly one fuzz_*.c each (it defines functions).
 */
#ifndef LOKADB_FUZZ_HARNESS_H
#define LOKADB_FUZZ_HARNESS_H

#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define H_QUIET_TURNS 8			/* turns after the last write for the answers to flow */
#define H_SETTLE_TURNS 64		/* loop turns after our write side is shut */
#define H_SPIN_TURNS 1000		/* then turns without sleeping ... */
#define H_STUCK_USEC (2 * USEC)		/* ... and with, until a client counts as stuck */
#define H_NAP_USEC 200
#define H_STALL_TURNS 10000		/* turns with a full socket before we stop writing */
#define H_READ_CHUNK 65536

/* Chunk sizes the first input byte chooses from (0 = all in one write). */
static const size_t h_chunks[8] = { 0, 1, 2, 3, 7, 16, 64, 512 };

static struct {
	char ini[PATH_MAX];		/* /proc/self/fd/N of the ini's memfd */
	bool dump;
	bool stall_check;
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

/*
 * Config files live in memfds, not in the file system: nothing is left behind
 * when a crash ends the process, and the path (/proc/self/fd/N) stays valid
 * for RELOAD and h_reset().
 */
static int h_memfd(const char *name, const char *text)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	size_t len = strlen(text);

	if (fd < 0 || write(fd, text, len) != (ssize_t)len)
		h_die("could not write a config memfd");
	return fd;
}

static struct lk_config *h_load_config(void)
{
	char err[1024];
	struct lk_config *cf = config_load(h.ini, err, sizeof(err));

	if (!cf)
		h_die(err);
	return cf;
}

static void h_exit(void)
{
	runtime_teardown();
	config_free(rt->cf);
	rt->cf = NULL;
	log_close();
}

/*
 * The runtime of main.c without listen sockets: config from ini_text (and a
 * userlist, which becomes auth_file), then runtime_setup_events() for the
 * event base, DNS and the justfree and flush events with runtime.c's own
 * callbacks. The janitor, stats timer and signal events are taken off the
 * loop: timers make runs depend on the clock, and signal events would take
 * SIGINT/SIGTERM away from libFuzzer (event_del restores its handlers).
 */
static void h_setup(const char *ini_text, const char *userlist)
{
	char head[128] = "";
	char *ini;

	if (userlist)
		snprintf(head, sizeof(head), "[lokadb]\nauth_file = /proc/self/fd/%d\n",
			 h_memfd("userlist.txt", userlist));
	ini = malloc(strlen(head) + strlen(ini_text) + 1);
	if (!ini)
		h_die("out of memory");
	strcpy(ini, head);
	strcat(ini, ini_text);
	snprintf(h.ini, sizeof(h.ini), "/proc/self/fd/%d", h_memfd("lokadb.ini", ini));
	free(ini);

	runtime_init();
	rt->quiet = getenv("LOKADB_FUZZ_LOG") == NULL;
	h.dump = getenv("LOKADB_FUZZ_DUMP") != NULL;
	h.stall_check = !getenv("LOKADB_FUZZ_STALL") || strcmp(getenv("LOKADB_FUZZ_STALL"), "0") != 0;
	rt->config_path = h.ini;
	rt->cf = h_load_config();
	runtime_apply_log_settings();
	if (!runtime_setup_events())
		h_die("runtime_setup_events failed");
	runtime_stop_background_events();
	pool_apply_config(NULL);
	atexit(h_exit);
}

/* No client, no server, nothing waiting to be freed. */
static bool h_idle(void)
{
	struct pool *p;

	if (rt->n_clients || !TAILQ_EMPTY(&rt->login_clients) || !TAILQ_EMPTY(&rt->admin_clients) ||
	    !TAILQ_EMPTY(&rt->closing_clients) || !TAILQ_EMPTY(&rt->justfree_clients) ||
	    !TAILQ_EMPTY(&rt->justfree_servers) || !LIST_EMPTY(&rt->cancel_reqs))
		return false;
	TAILQ_FOREACH(p, &rt->pools, entry)
		if (p->n_active_cl + p->n_waiting_cl + p->n_login_cl ||
		    p->n_login_sv + p->n_idle_sv + p->n_active_sv + p->n_tested_sv)
			return false;
	return true;
}

/* LOKADB_FUZZ_DUMP=1: what the pooler answered, printable bytes as they are. */
static void h_dump(const char *buf, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)buf[i];
		if (ch >= 0x20 && ch < 0x7f)
			fputc(ch, stderr);
		else
			fprintf(stderr, "\\x%02x", ch);
	}
	fputc('\n', stderr);
}

/* Read and drop what the pooler sent; false once it closed its end. */
static bool h_drain(int fd)
{
	static char buf[H_READ_CHUNK];

	if (fd < 0)
		return false;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n > 0 && h.dump)
			h_dump(buf, (size_t)n);
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
	lokadb_suspend(false);	/* a SUSPEND outlives its console: the next input's login would not be read */
	pool_free_all();
	if (fresh_config) {
		config_free(rt->cf);
		rt->cf = h_load_config();
	}
	pool_apply_config(NULL);
}

/*
 * The oracle for hangs: once the loop has gone quiet, a live client must have
 * acted on all the input it can. If calling client_process() by hand now
 * consumes input, answers or closes, no event would ever have run it and the
 * peer would wait forever. Clients that wait on purpose are left alone:
 * client_process() itself returns at once for CL_WAITING_LOGIN/CL_WAITING,
 * and a throttled client is resumed by its server's write callback. (Whether
 * reading is switched on is not asked: src/ has its own read event in
 * struct conn_io and the bufferevent's EV_READ flag no longer tells.)
 */
static void h_check_stall(struct client *c)
{
	struct evbuffer *in, *out;
	size_t in_len, out_len;
	enum client_state st = c->state;

	if (!h.stall_check || c->closing || !c->bev || c->throttled)
		return;
	in = bufferevent_get_input(c->bev);
	out = bufferevent_get_output(c->bev);
	in_len = evbuffer_get_length(in);
	out_len = evbuffer_get_length(out);
	if (!in_len)
		return;
	client_process(c);
	if (!c->closing && c->bev && c->state == st && evbuffer_get_length(in) == in_len &&
	    evbuffer_get_length(out) == out_len)
		return;
	fprintf(stderr, "fuzz harness: client %llu stalled in state %d: it held %zu input bytes it could act on, "
		"but no event was going to run it (LOKADB_FUZZ_STALL=0 turns this check off)\n",
		(unsigned long long)c->id, (int)st, in_len);
	abort();
}

static void h_check_stalls(void)
{
	struct client *c;
	struct pool *p;

	TAILQ_FOREACH(c, &rt->login_clients, entry)
		h_check_stall(c);
	TAILQ_FOREACH(c, &rt->admin_clients, entry)
		h_check_stall(c);
	TAILQ_FOREACH(p, &rt->pools, entry)
		TAILQ_FOREACH(c, &p->active_clients, entry)
			h_check_stall(c);
}

/* Accept a new client on a socketpair; returns our end (non-blocking). */
static int h_open(void)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		h_die("socketpair failed");
	fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
	client_accept(sv[0], NULL, 0, true);
	return sv[1];
}

/* Send bytes in chunks, let the pooler answer, then look for a stalled client. */
static void h_send(int fd, const uint8_t *buf, size_t len, size_t chunk)
{
	if (!h_feed(fd, buf, len, chunk))
		return;
	for (int i = 0; i < H_QUIET_TURNS; i++)
		h_turn(fd);
	h_check_stalls();
}

/* Shut our write side, read the answers, close, and wait until all is freed. */
static void h_close(int fd)
{
	shutdown(fd, SHUT_WR);
	for (int i = 0; i < H_SETTLE_TURNS && !h_idle(); i++)
		h_turn(fd);
	h_drain(fd);
	close(fd);
	h_settle();
}

#endif
