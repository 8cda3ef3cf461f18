/* The signals of `llmq worker`. SIGTERM, SIGINT and SIGHUP ask it to stop (the first: gracefully,
 * a second: at once); SIGUSR1, SIGUSR2, SIGALRM and SIGPIPE are ignored, so that a stray one
 * (a log rotation script, an alarm left by a library, a closed socket) does not kill the worker
 * with its jobs in its processing list. docs/WORKER.md "Stopping" describes it for users. */
#pragma once
#include <signal.h>

/* Installs the handlers. Call it first thing, before any set-up: a stop asked for while the
 * worker starts is kept (wk_signals_count) and honoured once it can be. Calling it again is
 * harmless and keeps the count. */
void wk_signals_catch(void);

/* Blocks the stop signals and the ignored ones (they stay pending, nothing is lost). The llmq
 * program calls it before any library's initializer runs (worker/cli/main.c), so a signal that
 * arrives while the CUDA libraries load waits for main to decide what it means. */
void wk_signals_hold(void);
/* Unblocks what wk_signals_hold blocked: a pending signal is delivered now, to the handlers if
 * wk_signals_catch installed them, else with its default action. */
void wk_signals_release(void);

/* Stop signals received so far. */
int wk_signals_count(void);
/* The counter itself, for waits that poll it (rq_connect_wait). */
const volatile sig_atomic_t *wk_signals_counter(void);
/* "SIGTERM", "SIGINT" or "SIGHUP": the last stop signal ("a signal" before any). */
const char *wk_signals_last(void);
