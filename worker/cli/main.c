/* llmq: one binary, subcommands. `llmq help` lists them; `llmq <cmd> --help` explains one. */
#include <stdio.h>
#include <string.h>

#include "engine/gpu.h"
#include "llmq_version.h"
#include "worker/cli/cli.h"
#include "worker/loop/signals.h"

/* Before any shared library's initializer (ELF .preinit_array; the CUDA build links no cuBLAS, whose
 * initializer took tens of milliseconds: the backend opens cuBLASLt with dlopen), the stop signals
 * are held; main releases them once `llmq worker` has its handlers, so a SIGTERM that early is a
 * clean stop too. Every other command gets them back at once, with their default action. */
static void hold_signals(int argc, char **argv, char **envp)
{
    (void)argc;
    (void)argv;
    (void)envp;
    wk_signals_hold();
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit_hold)(int, char **,
                                                                                   char **) = hold_signals;

const struct cli_command cli_commands[] = {
    {"config", cmd_config, "print the effective configuration, list its keys, check a file"},
    {"make-tiny-model", cmd_make_tiny_model,
     "write a random checkpoint in Hugging Face layout (tests, demos)"},
    {"tokenize", cmd_tokenize, "text <-> token ids and chat prompts as JSON lines; tokenizer benchmark"},
    {"run", cmd_run, "run a JSONL file of jobs through the engine offline, results in input order"},
    {"bench", cmd_bench,
     "a fixed workload through the engine: throughput, latency, roofline as one JSON line"},
    {"worker", cmd_worker, "take jobs from the Redis queues, run them, write results into SQLite"},
    {"enqueue", cmd_enqueue, "validate a JSONL file of jobs and push them onto a Redis queue"},
    {"batch", cmd_batch, "batches of jobs: list, status, wait for one, cancel one"},
    {"status", cmd_status, "queue depths, retry and dead counts, live workers, running jobs"},
    {"results", cmd_results, "export results from SQLite: JSON lines, CSV or an OpenAI Batch output file"},
    {"collect", cmd_collect, "one central database: collect the result streams, or merge worker databases"},
    {"wait", cmd_wait, "block until jobs finish and print their results"},
    {"cancel", cmd_cancel, "cancel queued or running jobs by id"},
    {"requeue", cmd_requeue, "run a batch's failed or cancelled jobs again from their stored requests"},
    {"requeue-dead", cmd_requeue_dead, "put dead-lettered jobs back on their queue"},
    {"dead", cmd_dead, "list dead-lettered jobs with their errors"},
    {"purge", cmd_purge, "remove the jobs of a queue, the retry set or the dead list, hashes too"},
    {NULL, NULL, NULL},
};

static void print_help(FILE *f)
{
    fprintf(f,
            "llmq %s: a job-queue batch worker for LLM generation\n\n"
            "Usage: llmq <command> [options]     (llmq <command> --help for its options)\n\n"
            "Commands:\n",
            LLMQ_VERSION);
    for (const struct cli_command *c = cli_commands; c->name; c++)
        fprintf(f, "  %-16s %s\n", c->name, c->summary);
    fprintf(f, "  %-16s %s\n", "help", "this list");
    fprintf(f, "\nOptions: --version (with the CUDA build and GPU, if any), --help\n");
}

static void print_version(void)
{
    char gpu[256];
    printf("llmq %s\n", LLMQ_VERSION);
    printf("cuda backend: %s\n", gpu_backend_built() ? "built" : "not built");
    if (gpu_backend_built())
        printf("gpu: %s%s\n", gpu_describe(gpu, sizeof gpu) == 0 ? "" : "none usable: ", gpu);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "worker"))
        wk_signals_catch(); /* a signal held since the start goes to these handlers */
    wk_signals_release();
    if (argc < 2) {
        print_help(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "help") || !strcmp(name, "--help") || !strcmp(name, "-h")) {
        if (argc > 2) { /* llmq help <cmd> == llmq <cmd> --help */
            for (const struct cli_command *c = cli_commands; c->name; c++)
                if (!strcmp(c->name, argv[2])) {
                    char *sub[] = {argv[2], "--help", NULL};
                    return c->run(2, sub);
                }
            fprintf(stderr, "llmq: unknown command '%s'. Run 'llmq help' for the list.\n", argv[2]);
            return 2;
        }
        print_help(stdout);
        return 0;
    }
    if (!strcmp(name, "--version") || !strcmp(name, "version")) {
        print_version();
        return 0;
    }
    for (const struct cli_command *c = cli_commands; c->name; c++)
        if (!strcmp(c->name, name)) {
            for (int i = 2; i < argc && strcmp(argv[i], "--"); i++)
                if (!strcmp(argv[i], "--version")) { /* every subcommand takes it (docs/CLI.md) */
                    print_version();
                    return 0;
                }
            return c->run(argc - 1, argv + 1);
        }
    fprintf(stderr, "llmq: unknown command '%s'. Run 'llmq help' for the list.\n", name);
    return 2;
}
