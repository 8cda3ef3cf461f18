/* The `llmq` command line: one entry per subcommand, and helpers every subcommand shares.
 *
 * A subcommand is `int cmd_<name>(int argc, char **argv)`: argv[0] is the subcommand's name,
 * options are parsed with getopt_long (opterr = 0; cli_bad_option reports a bad one). It returns the
 * process exit status: 0 ok, 1 the work failed, 2 the command line was wrong (cli_usage_error
 * prints why); docs/CLI.md has the conventions every subcommand follows. */
#pragma once
#include <stdbool.h>

/* The exit status of every command when Redis cannot be reached (sysexits' EX_UNAVAILABLE; the
 * worker's WK_EXIT_UNREACHABLE); docs/CLI.md lists the others. */
enum { CLI_EXIT_UNREACHABLE = 69 };

struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary; /* one line for `llmq help` */
};

/* The table in worker/cli/main.c, terminated by a zeroed entry. */
extern const struct cli_command cli_commands[];

/* Prints "llmq <cmd>: <message>" and a hint to run --help on stderr; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct option;

/* For getopt_long's '?' (or ':') return, with opterr = 0: reports on stderr the option as typed in
 * argv and what is wrong with it: "unknown option --limt (did you mean --limit?)", "option --lim
 * is ambiguous (--limit, --lines)", "--limit needs a value", "--drain takes no value". longopts and
 * shortopts are the tables given to getopt_long. Returns 2. */
int cli_bad_option(const char *cmd, int argc, char **argv, const struct option *longopts,
                   const char *shortopts);

/* Lines of the regular file at path, for a progress bar's total: every line, or with skip_blank
 * only those holding something besides spaces, tabs and '\r'; a last line without '\n' counts.
 * 0 when it cannot tell (path "-", not a regular file, unreadable). */
long cli_count_lines(const char *path, bool skip_blank);

/* From now on SIGINT and SIGTERM set the flag cli_interrupted() reads instead of ending the
 * process, so a long loop (status --watch, wait) can stop cleanly; clears the flag. */
void cli_catch_interrupts(void);
/* Whether SIGINT or SIGTERM came since cli_catch_interrupts(). */
bool cli_interrupted(void);

/* Subcommands (one worker/cli/cmd_<name>.c each). */
int cmd_config(int argc, char **argv);
int cmd_make_tiny_model(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_worker(int argc, char **argv);
int cmd_enqueue(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_results(int argc, char **argv);
int cmd_collect(int argc, char **argv);
int cmd_wait(int argc, char **argv);
int cmd_cancel(int argc, char **argv);
int cmd_requeue_dead(int argc, char **argv);
int cmd_dead(int argc, char **argv);
int cmd_purge(int argc, char **argv);
int cmd_requeue(int argc, char **argv);
int cmd_batch(int argc, char **argv);
/* `llmq batch wait` (worker/cli/cmd_batch_wait.c), dispatched by cmd_batch. */
int cmd_batch_wait(int argc, char **argv);
