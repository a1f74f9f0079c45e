/* SPDX-License-Identifier: ISC */
/*
 * fuzz_hba.c -- libFuzzer target for the auth_hba_file parser and matcher
 * (src/hba.c): any text is either refused with "NAME:LINE: reason" or gives
 * rules that hba_match() can walk for unix, IPv4, IPv4-mapped IPv6 and IPv6
 * clients, with and without TLS.
 *
 * Input: the file's text (a NUL ends it, as it would end a C string).
 * Corpus: test/fuzz/corpus/fuzz_hba/ (hand-written rule files).
 */
#include "hba.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR_LEN 512

static void client(struct sockaddr_storage *ss, const char *text)
{
	memset(ss, 0, sizeof(*ss));
	if (!text) {
		ss->ss_family = AF_UNIX;
	} else if (strchr(text, ':')) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
		in6->sin6_family = AF_INET6;
		inet_pton(AF_INET6, text, &in6->sin6_addr);
	} else {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		inet_pton(AF_INET, text, &in->sin_addr);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const addrs[] = { NULL, "127.0.0.1", "10.1.2.3", "::1", "::ffff:10.1.2.3", "2001:db8::7" };
	static const char *const names[] = { "all", "app", "alice", "" };
	char *text = malloc(size + 1), err[ERR_LEN];
	struct hba *h;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	err[0] = '\0';
	h = hba_parse(text, "fuzz", err, sizeof(err));
	if (!h && strncmp(err, "fuzz", 4) != 0)
		abort();	/* a refusal always names the file */
	for (size_t a = 0; h && a < sizeof(addrs) / sizeof(addrs[0]); a++) {
		struct sockaddr_storage ss;
		client(&ss, addrs[a]);
		for (int tls = 0; tls < 2; tls++) {
			for (size_t n = 0; n < sizeof(names) / sizeof(names[0]); n++) {
				const struct hba_rule *r = hba_match(h, &ss, tls, names[n], names[(n + 1) % 4]);
				if (r && (r < h->rules || r >= h->rules + h->n))
					abort();
				if (r)
					(void)hba_method_name(r->method);
			}
		}
	}
	hba_free(h);
	free(text);
	return 0;
}
