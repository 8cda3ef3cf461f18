/* See histogram.h. */
#include "worker/metrics/histogram.h"

#include <math.h>
#include <string.h>

const double HIST_TTFT_BOUNDS[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                   1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const int HIST_TTFT_N = (int)(sizeof HIST_TTFT_BOUNDS / sizeof HIST_TTFT_BOUNDS[0]);

const double HIST_ITL_BOUNDS[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                  0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const int HIST_ITL_N = (int)(sizeof HIST_ITL_BOUNDS / sizeof HIST_ITL_BOUNDS[0]);

const double HIST_LATENCY_BOUNDS[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const int HIST_LATENCY_N = (int)(sizeof HIST_LATENCY_BOUNDS / sizeof HIST_LATENCY_BOUNDS[0]);

const double HIST_QUEUE_BOUNDS[] = {0.3,   0.5,   0.8,   1.0,    1.5,    2.0,     2.5,     5.0,
                                    10.0,  15.0,  20.0,  30.0,   40.0,   50.0,    60.0,    120.0,
                                    240.0, 480.0, 960.0, 1920.0, 7680.0, 14400.0, 28800.0, 86400.0};
const int HIST_QUEUE_N = (int)(sizeof HIST_QUEUE_BOUNDS / sizeof HIST_QUEUE_BOUNDS[0]);

int hist_init(struct hist *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    if (!bounds || n < 1 || n > HIST_MAX_BOUNDS)
        return -1;
    for (int i = 0; i < n; i++)
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return -1;
    memcpy(h->bound, bounds, (size_t)n * sizeof *bounds);
    h->n = n;
    return 0;
}

void hist_observe_n(struct hist *h, double x, uint64_t times)
{
    if (isnan(x) || times == 0)
        return;
    /* the first bound >= x (binary search); n when x is above them all */
    int lo = 0, hi = h->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (x <= h->bound[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    h->bucket[lo] += times;
    h->count += times;
    h->sum += x * (double)times;
}

void hist_observe(struct hist *h, double x)
{
    hist_observe_n(h, x, 1);
}

uint64_t hist_cumulative(const struct hist *h, int i)
{
    if (i < 0)
        return 0;
    if (i >= h->n)
        return h->count;
    uint64_t c = 0;
    for (int k = 0; k <= i; k++)
        c += h->bucket[k];
    return c;
}

double hist_bound(const struct hist *h, int i)
{
    return i >= 0 && i < h->n ? h->bound[i] : INFINITY;
}
