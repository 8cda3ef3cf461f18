// The launchers' error channel (kernels/kernels.h): one thread-local message per host thread, so a
// failing launcher on one thread never overwrites what another thread is about to print.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

static thread_local char k_err[512];

// "/home/x/llmq/kernels/rope.cu" -> "kernels/rope.cu": the last two path components are enough to
// find the line and keep messages short and independent of the build machine.
static const char *short_path(const char *file)
{
    const char *last = strrchr(file, '/');
    if (!last)
        return file;
    const char *p = last;
    while (p > file && p[-1] != '/')
        p--;
    return p > file ? p : file;
}

extern "C" const char *k_last_error(void)
{
    return k_err;
}

extern "C" int k_fail(const char *file, int line, const char *what, cudaError_t e)
{
    snprintf(k_err, sizeof k_err, "%s:%d: %s: %s (%s)", short_path(file), line, what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return -1;
}

extern "C" int k_failf(const char *file, int line, const char *fmt, ...)
{
    int n = snprintf(k_err, sizeof k_err, "%s:%d: ", short_path(file), line);
    if (n < 0 || (size_t)n >= sizeof k_err)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k_err + n, sizeof k_err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}
