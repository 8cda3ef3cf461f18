/* Monotonic clock readings for durations and deadlines.
 *
 *   double t0 = llmq_mono_s();  ...  elapsed = llmq_mono_s() - t0;
 *
 * CLOCK_MONOTONIC never steps back with wall-clock changes; seconds as a double keep nanoseconds for
 * about a hundred days of uptime, plenty for timing a step or a run. */
#pragma once

#include <time.h>

static inline double llmq_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The same in milliseconds (timings printed in ms). */
static inline double llmq_mono_ms(void)
{
    return 1e3 * llmq_mono_s();
}
