/* SPDX-License-Identifier: ISC */
/*
 * test_peers.c -- cancel keys of a peer group (peers.c): the peer_id and the
 * hop count in the first two bytes, which keys are this process's, and
 * which are dropped instead of forwarded. Forwarding itself needs other
 * processes and is tested in test/integration/test_scale.py.
 */
#include "core.h"
#include "unit.h"

#include <stdlib.h>

static int key_id(const uint8_t *k)
{
	return ((k[0] & 0x3f) << 8) | k[1];
}

static bool rt_up(int peer_id)
{
	rt->quiet = true;
	rt->rand_pos = sizeof(rt->rand_pool);	/* as runtime_init(): random_bytes() fills it first */
	rt->cf = config_defaults();
	if (!rt->cf)
		return false;
	rt->cf->peer_id = peer_id;
	return true;
}

static void rt_down(void)
{
	peers_free_all();
	config_free(rt->cf);
	rt->cf = NULL;
}

/* A [peers] entry for rt->cf (the test owns the strings' lifetime through config_free). */
static bool add_peer(int id, const char *host)
{
	struct peer_conf *p = realloc(rt->cf->peers, sizeof(*p) * (size_t)(rt->cf->n_peers + 1));

	if (!p)
		return false;
	rt->cf->peers = p;
	p = &p[rt->cf->n_peers++];
	memset(p, 0, sizeof(*p));
	p->id = id;
	p->name = xstrdup("x");
	p->host = host ? xstrdup(host) : NULL;
	p->port = 6432;
	p->pool_size = -1;
	return true;
}

static bool test_without_peer_id_keys_are_random_and_local(void)
{
	uint8_t a[8], b[8], local[8];
	bool ok = true;

	CHECK(rt_up(0));
	peers_new_cancel_key(a);
	peers_new_cancel_key(b);
	CHECK(memcmp(a, b, 8) != 0);
	CHECK(peers_cancel_local(a, local));
	CHECK(memcmp(a, local, 8) == 0);
end:
	rt_down();
	return ok;
}

static bool test_a_key_carries_the_peer_id_and_one_hop(void)
{
	static const int ids[] = { 1, 255, 256, 5000, PEER_ID_MAX };
	bool ok = true;

	CHECK(rt_up(1));
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		uint8_t k[8], local[8];
		rt->cf->peer_id = ids[i];
		peers_new_cancel_key(k);
		CHECK(key_id(k) == ids[i]);
		CHECK(k[0] >> 6 == 1);
		CHECK(peers_cancel_local(k, local));
		CHECK(memcmp(k, local, 8) == 0);
		k[0] &= 0x3f;			/* as a peer forwards it: no hop left */
		CHECK(peers_cancel_local(k, local));
		CHECK(local[0] >> 6 == 1 && key_id(local) == ids[i]);
		CHECK(memcmp(k + 2, local + 2, 6) == 0);
	}
end:
	rt_down();
	return ok;
}

static bool test_other_peers_keys_are_not_local(void)
{
	uint8_t k[8], local[8];
	uint64_t fwd, dropped;
	bool ok = true;

	CHECK(rt_up(5));
	CHECK(add_peer(5, "/run/l5") && add_peer(7, "/run/l7"));
	peers_apply();
	rt->cf->peer_id = 9;		/* a key of peer 9, unknown to the group */
	peers_new_cancel_key(k);
	rt->cf->peer_id = 5;
	CHECK(!peers_cancel_local(k, local));
	peers_counters(&fwd, &dropped);
	CHECK(fwd == 0 && dropped == 1);
	rt->cf->peer_id = 7;		/* peer 7's key that was already forwarded once */
	peers_new_cancel_key(k);
	rt->cf->peer_id = 5;
	k[0] &= 0x3f;
	CHECK(!peers_cancel_local(k, local));
	peers_counters(&fwd, &dropped);
	CHECK(fwd == 0 && dropped == 2);
end:
	rt_down();
	return ok;
}

static void collect(void *arg, const struct peer_pool_counts *n)
{
	int *ids = arg;
	ids[ids[0]++ + 1] = n->peer_id;
}

static bool test_the_group_leaves_out_the_own_entry_and_follows_reload(void)
{
	int ids[8] = { 0 };
	bool ok = true;

	CHECK(rt_up(2));
	CHECK(add_peer(1, NULL) && add_peer(2, "/run/l2") && add_peer(3, "10.0.0.3"));
	peers_apply();
	peers_walk(collect, ids);
	CHECK(ids[0] == 2 && ids[1] == 1 && ids[2] == 3);
	rt->cf->n_peers = 2;		/* RELOAD without peer 3 (the entry is freed below) */
	peers_apply();
	rt->cf->n_peers = 3;
	memset(ids, 0, sizeof(ids));
	peers_walk(collect, ids);
	CHECK(ids[0] == 1 && ids[1] == 1);
end:
	rt_down();
	return ok;
}

static const struct unit_case cases[] = {
	{ "without peer_id keys are random and local", test_without_peer_id_keys_are_random_and_local },
	{ "a key carries the peer_id and one hop", test_a_key_carries_the_peer_id_and_one_hop },
	{ "other peers' keys are not local", test_other_peers_keys_are_not_local },
	{ "the group leaves out its own entry and follows reload", test_the_group_leaves_out_the_own_entry_and_follows_reload },
	{ NULL, NULL }
};

UNIT_MAIN("peers", cases)
