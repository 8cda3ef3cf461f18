/* Kernel timeline for any CUDA program, without changing it: the CUDA driver loads this library when
 * CUDA_INJECTION64_PATH names it, and CUPTI's activity API records every kernel (graph nodes included)
 * with its device start and end times, grid and block. At exit the records go to the CSV file named by
 * LLMQ_KTRACE (default ktrace.csv), with demangled names:
 *
 *   start_ns,end_ns,grid,block,regs,graph_node,name
 *
 * contrib/lab/ktrace/ktrace_summary.py turns it into a per-step and per-layer table (docs/KERNELS.md,
 * "Kernel timeline"). Tracing costs a little per kernel; compare timelines with timelines, not with
 * bench numbers taken without it. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

// libstdc++'s demangler (the records carry mangled names)
char *__cxa_demangle(const char *mangled, char *out, size_t *len, int *status);

// name as one CSV field: quoted, a quote inside doubled
static void put_field(FILE *f, const char *name)
{
    fputc('"', f);
    for (const char *c = name; *c; c++) {
        if (*c == '"')
            fputc('"', f);
        fputc(*c, f);
    }
    fputc('"', f);
}

static FILE *out;

static void warn_cupti(const char *what, CUptiResult r)
{
    const char *msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "ktrace: %s: %s\n", what, msg);
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = 16u << 20;
    *buf = aligned_alloc(8, *size);
    if (!*buf)
        *size = 0; // CUPTI then drops records (and says how many)
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    CUpti_Activity *rec = NULL;
    (void)ctx, (void)stream, (void)size;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        if (!out)
            continue;
        int status = -1;
        char *dm = k->name ? __cxa_demangle(k->name, NULL, NULL, &status) : NULL;
        fprintf(out, "%llu,%llu,%d,%d,%u,%llu,", (unsigned long long)k->start, (unsigned long long)k->end,
                k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                (unsigned)k->registersPerThread, (unsigned long long)k->graphNodeId);
        put_field(out, status == 0 && dm ? dm : k->name ? k->name : "?");
        fputc('\n', out);
        free(dm);
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
    free(buf);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    if (out) {
        fclose(out);
        out = NULL;
    }
}

int InitializeInjection(void)
{
    const char *path = getenv("LLMQ_KTRACE");
    if (!path || !*path)
        path = "ktrace.csv";
    out = fopen(path, "w");
    if (!out) {
        perror(path);
        return 0;
    }
    fprintf(out, "start_ns,end_ns,grid,block,regs,graph_node,name\n");
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS)
        r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
        warn_cupti("cannot enable kernel records", r);
        return 0;
    }
    atexit(finish);
    return 1;
}
