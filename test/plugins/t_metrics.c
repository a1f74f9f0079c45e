/* SPDX-License-Identifier: ISC */
/*
 * t_metrics -- test plugin for api->metric_register / metric_sample (ABI 1.4).
 *
 * Registers three metrics, shown on the Prometheus endpoint as:
 *   lokadb_t_metrics_logins{user="..."}   counter: CLIENT_STARTUP calls per user
 *   lokadb_t_metrics_odd_labels           gauge: one sample whose label value
 *                                         needs escaping (a"b\c, a newline),
 *                                         one with an invalid label name
 *                                         (must be left out), one without labels
 *   lokadb_t_metrics_empty                gauge with no samples
 * and checks at init that bad registrations are refused (bad name, bad
 * type, a name taken twice).
 */
#include <lokadb/plugin.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define T_USERS_MAX 16
#define T_NAME_MAX 64

struct t_user {
	char name[T_NAME_MAX];
	unsigned long logins;
};

/* per-plugin state, behind the handle (api->set_data) */
struct t_state {
	const lk_api *api;
	struct t_user users[T_USERS_MAX];
	int n_users;
};

static const lk_api *the_api;

static int t_client_startup(lk_plugin *self, lk_event *ev)
{
	struct t_state *s = the_api->get_data(self);
	const char *user = the_api->client_user(the_api->ev_client(ev));
	int i;

	for (i = 0; i < s->n_users && strcmp(s->users[i].name, user) != 0; i++)
		;
	if (i == s->n_users) {
		if (s->n_users == T_USERS_MAX)
			return LK_CONTINUE;
		snprintf(s->users[i].name, sizeof(s->users[i].name), "%s", user);
		s->n_users++;
	}
	s->users[i].logins++;
	return LK_CONTINUE;
}

static void t_logins(lk_plugin *self, lk_metrics *m, void *arg)
{
	struct t_state *s = arg;

	(void)self;
	for (int i = 0; i < s->n_users; i++) {
		const char *labels[] = { "user", s->users[i].name, NULL };
		s->api->metric_sample(m, labels, (double)s->users[i].logins);
	}
}

static void t_odd(lk_plugin *self, lk_metrics *m, void *arg)
{
	const struct t_state *s = arg;
	const char *escaped[] = { "v", "a\"b\\c\nd", "k2", "plain", NULL };
	const char *bad[] = { "1bad", "x", NULL };

	(void)self;
	s->api->metric_sample(m, escaped, 1.5);
	s->api->metric_sample(m, bad, 2);
	s->api->metric_sample(m, NULL, -3);
	{
		const char *nan_label[] = { "v", "nan", NULL };
		s->api->metric_sample(m, nan_label, NAN);
	}
}

static void t_empty(lk_plugin *self, lk_metrics *m, void *arg)
{
	(void)self;
	(void)m;
	(void)arg;
}

static int t_init(lk_plugin *self, const lk_api *api)
{
	static struct t_state state;

	if (!LK_API_HAS(api, metric_register)) {
		api->init_error(self, "this lokadb has no metric_register");
		return -1;
	}
	the_api = api;
	state.api = api;
	api->set_data(self, &state);
	if (api->hook(self, LK_HOOK_CLIENT_STARTUP, t_client_startup, 0) != 0 ||
	    api->metric_register(self, "logins", LK_METRIC_COUNTER, "Logins per user, seen by t_metrics.",
				 t_logins, &state) != 0 ||
	    api->metric_register(self, "odd_labels", LK_METRIC_GAUGE, "Label values that need escaping:\n\\ and \".",
				 t_odd, &state) != 0 ||
	    api->metric_register(self, "empty", LK_METRIC_GAUGE, "No samples.", t_empty, NULL) != 0) {
		api->init_error(self, "could not register");
		return -1;
	}
	if (api->metric_register(self, "logins", LK_METRIC_GAUGE, "taken", t_empty, NULL) != -1 ||
	    api->metric_register(self, "9lives", LK_METRIC_GAUGE, "bad name", t_empty, NULL) != -1 ||
	    api->metric_register(self, "has-dash", LK_METRIC_GAUGE, "bad name", t_empty, NULL) != -1 ||
	    api->metric_register(self, "typed", 7, "bad type", t_empty, NULL) != -1 ||
	    api->metric_register(self, "nofn", LK_METRIC_GAUGE, "no callback", NULL, NULL) != -1) {
		api->init_error(self, "a bad registration was accepted");
		return -1;
	}
	return 0;
}

LK_PLUGIN("t_metrics", "1.0", t_init, NULL)
