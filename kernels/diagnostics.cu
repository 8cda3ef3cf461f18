// The diagnostics (kernels/kernels.h, struct k_diag): the only environment variables llmq's kernels and
// engine read. Each is for a developer looking into the kernels, none is needed to run llmq, and none
// changes what a step computes:
//   LLMQ_PDL=0|1            1 (the default): kernels are launched with programmatic dependent launch
//                           (kernels/launch.cuh); 0: without it, for timing A/B runs and as an escape hatch
//   LLMQ_PDL_SKIP=name,...  the kernels whose mangled names contain one of the names launch without PDL:
//                           to find a kernel that breaks the PDL read rule (kernels/launch.cuh)
//   LLMQ_GEMM_LOG=0|1       1: one stderr line per cuBLASLt plan and per k_linear choice (kernels/gemm.cu)
// Read once per process, on first use. A value outside the accepted ones is kept as an error, which
// cuda_backend_open reports (the backend does not open); the values set are logged when it opens.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

// "0" or "1" into *v; otherwise the error naming the variable
static void read_bool(struct k_diag *d, const char *name, bool *v)
{
    const char *e = getenv(name);
    if (!e)
        return;
    if (!strcmp(e, "0") || !strcmp(e, "1")) {
        *v = e[0] == '1';
        size_t n = strlen(d->set);
        snprintf(d->set + n, sizeof d->set - n, "%s%s=%s", n ? ", " : "", name, e);
    } else if (!d->err[0]) {
        snprintf(d->err, sizeof d->err,
                 "%s=\"%.64s\": expected 0 or 1 (a diagnostic; unset it to run as usual)", name, e);
    }
}

static struct k_diag diag_read(void)
{
    struct k_diag d;
    memset(&d, 0, sizeof d);
    d.pdl = true;
    read_bool(&d, "LLMQ_PDL", &d.pdl);
    read_bool(&d, "LLMQ_GEMM_LOG", &d.gemm_log);
    const char *skip = getenv("LLMQ_PDL_SKIP");
    if (skip && *skip) {
        d.pdl_skip = skip;
        size_t n = strlen(d.set);
        snprintf(d.set + n, sizeof d.set - n, "%sLLMQ_PDL_SKIP=%.128s", n ? ", " : "", skip);
    }
    return d;
}

extern "C" const struct k_diag *k_diag(void)
{
    static const struct k_diag d = diag_read(); // once per process (a thread-safe static)
    return &d;
}
