/* SPDX-License-Identifier: ISC */
/*
 * main.c -- the lokadb command line: options, pidfile, daemon mode, and the
 * run of the event loop (runtime.c).
 *
 *   lokadb [-d] [-v] [-q] [-V] [-h] FILE.ini
 *
 * Listen sockets are opened before daemonizing so that a busy port is
 * reported on the terminal; the event base is created after the fork.
 */
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- pidfile / daemon ---- */

static bool check_pidfile(const char *path)
{
	FILE *f = fopen(path, "r");
	long pid = 0;
	if (!f)
		return true;
	if (fscanf(f, "%ld", &pid) == 1 && pid > 0 && kill((pid_t)pid, 0) == 0) {
		fclose(f);
		fprintf(stderr, "lokadb: pidfile %s exists and process %ld is running\n", path, pid);
		return false;
	}
	fclose(f);
	unlink(path);
	return true;
}

static bool write_pidfile(const char *path)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		log_error("could not write pidfile %s: %s", path, strerror(errno));
		return false;
	}
	fprintf(f, "%d\n", (int)getpid());
	fclose(f);
	return true;
}

static bool daemonize(void)
{
	pid_t pid = fork();
	int fd;

	if (pid < 0)
		return false;
	if (pid > 0)
		_exit(0);
	setsid();
	pid = fork();
	if (pid < 0)
		return false;
	if (pid > 0)
		_exit(0);
	fd = open("/dev/null", O_RDWR);
	if (fd >= 0) {
		dup2(fd, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
	}
	return true;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: lokadb [-d] [-v] [-q] [-V] [-h] FILE.ini\n"
		   "  -d  run in the background (needs pidfile)\n"
		   "  -v  more verbose (repeat for more)\n"
		   "  -q  no log output on stderr\n"
		   "  -V  print the version and exit\n"
		   "  --describe-config  print doc/config.md and exit\n");
}

/* A setting or plugin that keeps lokadb from starting: the log goes to
 * stderr unless -q/-d, then say it there too. */
static int start_failed(const char *err)
{
	log_fatal("%s", err);
	if (rt->quiet || rt->daemon)
		fprintf(stderr, "lokadb: %s\n", err);
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "describe-config", no_argument, NULL, 'D' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "daemon", no_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	char err[1024];
	int opt;

	while ((opt = getopt_long(argc, argv, "dvqVh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'd': rt->daemon = true; break;
		case 'v': rt->verbose++; break;
		case 'q': rt->quiet = true; break;
		case 'V':
			printf("lokadb %s (libevent %s, %s)\n", LOKADB_VERSION, event_get_version(), "OpenSSL 3");
			return 0;
		case 'D':
			config_write_markdown(stdout);
			return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 1;
		}
	}
	if (optind != argc - 1) {
		usage(stderr);
		return 1;
	}
	rt->config_path = argv[optind];
	rt->cf = config_load(rt->config_path, err, sizeof(err));
	if (!rt->cf) {
		fprintf(stderr, "lokadb: %s\n", err);
		return 1;
	}
	runtime_init();
	if (rt->daemon && !rt->cf->pidfile) {
		fprintf(stderr, "lokadb: -d needs pidfile to be set\n");
		return 1;
	}
	if (rt->cf->pidfile && !check_pidfile(rt->cf->pidfile))
		return 1;
	runtime_apply_log_settings();
	{
		void *ctx;
		if (!tls_client_check(rt->cf, &ctx, err, sizeof(err)))
			return start_failed(err);
		tls_client_apply(ctx);
		if (!tls_server_check(rt->cf, &ctx, err, sizeof(err)))
			return start_failed(err);
		tls_server_apply(ctx);
		if (!plugins_load(rt->cf, err, sizeof(err)) || !plugins_check(rt->cf, false, err, sizeof(err)))
			return start_failed(err);
	}
	if (!runtime_open_listeners())
		return 1;
	if (rt->daemon && !daemonize())
		return 1;
	runtime_apply_log_settings();
	if (rt->cf->pidfile && !write_pidfile(rt->cf->pidfile))
		return 1;
	runtime_raise_nofile();
	rt->start_time = rt->now = now_mono();
	if (!runtime_setup_events()) {
		log_fatal("could not set up the event loop");
		return 1;
	}
	if (!metrics_start(err, sizeof(err)))
		return start_failed(err);
	plugins_apply(false);
	pool_apply_config(NULL);
	peers_apply();
	log_info("lokadb %s started", LOKADB_VERSION);
	event_base_dispatch(rt->base);
	runtime_teardown();
	if (rt->cf->pidfile)
		unlink(rt->cf->pidfile);
	log_info("lokadb stopped");
	config_free(rt->cf);
	log_close();
	return 0;
}
