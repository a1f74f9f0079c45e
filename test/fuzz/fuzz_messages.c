/* SPDX-License-Identifier: ISC */
/*
 * fuzz_messages.c -- libFuzzer target for what a logged-in client sends:
 * message framing (type byte, length, max_message_bytes, messages cut across
 * reads) and the console's query parsing (tokenizer, SHOW, SET, PAUSE, KILL,
 * RELOAD, SHUTDOWN ...).
 *
 * Input layout: one selector byte, then the messages.
 *   bits 0-2  how the bytes are cut into writes (harness.h h_chunks[])
 *   bit 3     log in as the stats-only user `stats` instead of `admin`
 * The harness first sends a valid v3 startup packet for that user and the
 * console database `lokadb` (auth_type trust) in a write of its own and
 * checks the login, then the messages.
 *
 * Console commands change the runtime: SHUTDOWN sets rt->shutdown and breaks
 * the loop, PAUSE/KILL pause, SET and RELOAD change rt->cf. None of that ends
 * the process; h_reset() puts it all back after each input.
 *
 * Corpus: test/fuzz/corpus/fuzz_messages/, made by make_corpus.py.
 */
#include "harness.h"

static const char ini_text[] =
	"[lokadb]\n"
	"auth_type = trust\n"
	"admin_users = admin\n"
	"stats_users = stats\n"
	"unix_socket_dir =\n"
	"\n"
	"[databases]\n"
	"db = host=127.0.0.1 port=1\n";

#define STARTUP_BUF 128

static struct {
	uint8_t bytes[STARTUP_BUF];
	size_t len;
} startups[2];

/* A v3 StartupMessage: user, database=lokadb, application_name. */
static void make_startup(int i, const char *user)
{
	const char *const kv[] = { "user", user, "database", "lokadb", "application_name", "fuzz" };
	uint8_t *b = startups[i].bytes;
	size_t n = 8;

	for (size_t k = 0; k < sizeof(kv) / sizeof(kv[0]); k++) {
		size_t l = strlen(kv[k]) + 1;
		memcpy(b + n, kv[k], l);
		n += l;
	}
	b[n++] = 0;
	b[0] = (uint8_t)(n >> 24);
	b[1] = (uint8_t)(n >> 16);
	b[2] = (uint8_t)(n >> 8);
	b[3] = (uint8_t)n;
	b[4] = 0;
	b[5] = 3;
	b[6] = 0;
	b[7] = 0;
	startups[i].len = n;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	make_startup(0, "admin");
	make_startup(1, "stats");
	h_setup(ini_text, NULL);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t sel = size ? data[0] : 0;
	int who = (sel >> 3) & 1;
	int fd = h_open();

	h_send(fd, startups[who].bytes, startups[who].len, 0);
	if (TAILQ_EMPTY(&rt->admin_clients))
		h_die("the startup packet did not log in to the console");
	h_send(fd, size ? data + 1 : data, size ? size - 1 : 0, h_chunks[sel & 7]);
	h_close(fd);
	h_reset(true);
	return 0;
}
