/* SPDX-License-Identifier: ISC */
/*
 * log.h -- log lines to stderr, the logfile and syslog.
 *
 * Every line is "TIME [PID] LEVEL message". Lines about a connection start
 * with its identity (see client_ident()/server_ident()), as PgBouncer's
 * slog_* do. Nothing is logged at info level per packet.
 */
#ifndef LOKADB_LOG_H
#define LOKADB_LOG_H

#include <stdbool.h>

enum log_level { LOG_LVL_FATAL, LOG_LVL_ERROR, LOG_LVL_WARNING, LOG_LVL_INFO, LOG_LVL_DEBUG, LOG_LVL_NOISE };

/* Open/replace the log targets; file may be NULL. Returns false if the file cannot be opened. */
bool log_setup(const char *file, bool to_stderr, bool use_syslog, const char *ident, const char *facility, int verbose);
void log_close(void);
void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_fatal(...)   log_msg(LOG_LVL_FATAL, __VA_ARGS__)
#define log_error(...)   log_msg(LOG_LVL_ERROR, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_LVL_WARNING, __VA_ARGS__)
#define log_info(...)    log_msg(LOG_LVL_INFO, __VA_ARGS__)
/* The most verbose level written (LOG_LVL_INFO + verbose): debug and noise lines are checked inline. */
extern int log_max_level;
#define log_debug(...)   do { if (log_max_level >= LOG_LVL_DEBUG) log_msg(LOG_LVL_DEBUG, __VA_ARGS__); } while (0)
#define log_noise(...)   do { if (log_max_level >= LOG_LVL_NOISE) log_msg(LOG_LVL_NOISE, __VA_ARGS__); } while (0)

#endif
