/* SPDX-License-Identifier: ISC */
/*
 * log.c -- log lines to stderr, the logfile and syslog.
 *
 * Owns the open logfile. The verbosity is -v count (or the `verbose`
 * setting): 0 logs up to info, 1 debug, 2 noise. Repeated identical lines
 * are not suppressed here; callers rate-limit what can repeat per packet.
 * The process id and the time stamp down to the second are kept between
 * lines (route_log writes a line per statement): the pid is read again by
 * log_setup, which main calls again after daemonizing, the stamp when the
 * second changes.
 */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

static struct {
	FILE *file;
	bool to_stderr;
	bool use_syslog;
	int verbose;
	int pid;
	time_t stamp_sec;		/* the second `stamp` shows (0: none yet) */
	char stamp[32];
} lg = { NULL, true, false, 0, 0, 0, "" };

static const char *const level_names[] = { "FATAL", "ERROR", "WARNING", "LOG", "DEBUG", "NOISE" };
static const int level_syslog[] = { LOG_CRIT, LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG, LOG_DEBUG };

static int facility_code(const char *name)
{
	static const struct { const char *name; int code; } map[] = {
		{ "daemon", LOG_DAEMON }, { "user", LOG_USER }, { "local0", LOG_LOCAL0 },
		{ "local1", LOG_LOCAL1 }, { "local2", LOG_LOCAL2 }, { "local3", LOG_LOCAL3 },
		{ "local4", LOG_LOCAL4 }, { "local5", LOG_LOCAL5 }, { "local6", LOG_LOCAL6 },
		{ "local7", LOG_LOCAL7 },
	};
	for (size_t i = 0; name && i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(map[i].name, name) == 0)
			return map[i].code;
	return LOG_DAEMON;
}

int log_max_level = LOG_LVL_INFO;

bool log_setup(const char *file, bool to_stderr, bool use_syslog, const char *ident, const char *facility, int verbose)
{
	FILE *f = NULL;

	lg.pid = (int)getpid();
	if (file && *file) {
		f = fopen(file, "a");
		if (!f)
			return false;
		setvbuf(f, NULL, _IOLBF, 0);
	}
	if (lg.file)
		fclose(lg.file);
	lg.file = f;
	lg.to_stderr = to_stderr;
	lg.verbose = verbose;
	log_max_level = LOG_LVL_INFO + verbose;
	if (use_syslog && !lg.use_syslog)
		openlog(ident ? ident : "lokadb", LOG_PID, facility_code(facility));
	else if (!use_syslog && lg.use_syslog)
		closelog();
	lg.use_syslog = use_syslog;
	return true;
}

void log_close(void)
{
	if (lg.file)
		fclose(lg.file);
	lg.file = NULL;
	if (lg.use_syslog)
		closelog();
	lg.use_syslog = false;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	char msg[2048];
	struct timeval tv;
	struct tm tm;
	va_list ap;
	int saved = errno;

	if ((int)lvl > LOG_LVL_INFO + lg.verbose)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	gettimeofday(&tv, NULL);
	if (tv.tv_sec != lg.stamp_sec) {
		gmtime_r(&tv.tv_sec, &tm);
		strftime(lg.stamp, sizeof(lg.stamp), "%Y-%m-%d %H:%M:%S", &tm);
		lg.stamp_sec = tv.tv_sec;
	}
	if (!lg.pid)
		lg.pid = (int)getpid();
	if (lg.to_stderr)
		fprintf(stderr, "%s.%03d UTC [%d] %s %s\n", lg.stamp, (int)(tv.tv_usec / 1000), lg.pid, level_names[lvl], msg);
	if (lg.file)
		fprintf(lg.file, "%s.%03d UTC [%d] %s %s\n", lg.stamp, (int)(tv.tv_usec / 1000), lg.pid, level_names[lvl], msg);
	if (lg.use_syslog)
		syslog(level_syslog[lvl], "%s %s", level_names[lvl], msg);
	errno = saved;
}
