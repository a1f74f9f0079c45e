/* SPDX-License-Identifier: ISC */
/*
 * fuzz_startup.c -- libFuzzer target for a client's first bytes: the startup
 * packet, SSLRequest/GSSENCRequest, CancelRequest, the startup parameters
 * and options, and the password/SASL messages of authentication.
 *
 * Input layout: one selector byte, then the bytes the client sends.
 *   bits 0-2  how the bytes are cut into writes (harness.h h_chunks[])
 *   bits 3-4  auth_type for this connection: trust, md5, scram-sha-256, plain
 * The rest is sent as it is, so a login that succeeds goes on into message
 * framing and, for the console database, the console.
 *
 * The config has one database, `db`, at 127.0.0.1 port 1 (a login there
 * launches a server whose connect is refused: 08001), an auth_file with a
 * plain, an md5 and a SCRAM secret, and console users `admin` and `stats`.
 * All passwords are "secret".
 *
 * Corpus: test/fuzz/corpus/fuzz_startup/, made by make_corpus.py.
 */
#include "harness.h"

static const char ini_text[] =
	"[lokadb]\n"
	"auth_type = trust\n"
	"admin_users = admin\n"
	"stats_users = stats\n"
	"unix_socket_dir =\n"
	"ignore_startup_parameters = extra_float_digits\n"
	"\n"
	"[databases]\n"
	"db = host=127.0.0.1 port=1\n";

static const char userlist[] =
	"\"alice\" \"secret\"\n"
	"\"admin\" \"secret\"\n"
	"\"stats\" \"secret\"\n"
	"\"md5user\" \"md52aea419619857e8a27f0f7aa641db0c6\"\n"
	"\"scramuser\" \"SCRAM-SHA-256$4096:bG9rYWRiLWZ1enotc2FsdA==$"
	"YbrWbIyCZ94BFYBjcJI+HzpIkh9Vhmmn0NSROvBSHb0=:2t2j1nHOxccHQ7UIs36+Mb0qDtlnrRfBMzHQ8K176es=\"\n";

static const int auth_types[4] = { AUTH_TRUST, AUTH_MD5, AUTH_SCRAM, AUTH_PLAIN };

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	h_setup(ini_text, userlist);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t sel = size ? data[0] : 0;
	int fd;

	rt->cf->auth_type = auth_types[(sel >> 3) & 3];
	fd = h_open();
	h_send(fd, size ? data + 1 : data, size ? size - 1 : 0, h_chunks[sel & 7]);
	h_close(fd);
	h_reset(true);	/* a console login may have run SET or RELOAD */
	return 0;
}
