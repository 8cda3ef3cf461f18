/* See signals.h. */
#include "worker/loop/signals.h"

#include <string.h>

static volatile sig_atomic_t g_count, g_last;

static void on_stop(int s)
{
    g_last = s;
    g_count++;
}

void wk_signals_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL);
}

static void held_set(sigset_t *set)
{
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGALRM};
    sigemptyset(set);
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        sigaddset(set, sigs[i]);
}

void wk_signals_hold(void)
{
    sigset_t set;
    held_set(&set);
    sigprocmask(SIG_BLOCK, &set, NULL);
}

void wk_signals_release(void)
{
    sigset_t set;
    held_set(&set);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

int wk_signals_count(void)
{
    return g_count;
}

const volatile sig_atomic_t *wk_signals_counter(void)
{
    return &g_count;
}

const char *wk_signals_last(void)
{
    switch (g_last) {
    case SIGTERM:
        return "SIGTERM";
    case SIGINT:
        return "SIGINT";
    case SIGHUP:
        return "SIGHUP";
    default:
        return "a signal";
    }
}
