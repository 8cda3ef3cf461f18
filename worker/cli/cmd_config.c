/* `llmq config`: prints the effective configuration with where each value came from, lists the
 * keys, checks a file. */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/cli/cli.h"
#include "worker/config/config.h"

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: llmq config [-c FILE] [--set SECTION.KEY=VALUE ...] [--keys | --check | --get KEY]\n"
            "                   [--show-secrets]\n"
            "\n"
            "Prints the effective configuration as YAML, each value followed by a comment saying where\n"
            "it came from: default, FILE:LINE, env VARIABLE or flag. Later sources override earlier ones:\n"
            "\n"
            "  defaults < the file (-c) < environment LLMQ_<SECTION>_<KEY> < command-line flags\n"
            "\n"
            "e.g. LLMQ_ENGINE_BLOCK_SIZE=16 overrides engine.block_size from the file, and\n"
            "--set engine.block_size=64 overrides both.\n"
            "\n"
            "Options:\n"
            "  -c, --config FILE     the YAML file (default: $LLMQ_CONFIG; none: defaults + environment)\n"
            "  --set KEY=VALUE       set one key, as a command-line flag would (repeatable);\n"
            "                        KEY is section.key, or templates.NAME for a prompt template\n"
            "  --keys                list every key: type, default, bounds, environment variable, meaning\n"
            "                        (a Markdown table, as in docs/CONFIG.md)\n"
            "  --check               validate only: print \"ok\", or the error and exit 1\n"
            "  --get KEY             print one key's effective value, unquoted (for scripts)\n"
            "  --show-secrets        print redis.password and the password in redis.url (hidden: ****)\n"
            "  -h, --help            this text\n"
            "\n"
            "Errors name the file, line and key, e.g.\n"
            "  conf/x.yaml:12: engine.block_size: 48 is not a power of two between 8 and 256\n"
            "Exit status: 0 ok, 1 the configuration is invalid, 2 the command line is wrong.\n");
}

/* Markdown: '|' inside a cell must be escaped */
static void cell(const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            putchar('\\');
        putchar(*s);
    }
}

static void print_keys(void)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    printf("| key | type | default | bounds | environment | meaning |\n");
    printf("| --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < n; i++) {
        const struct cfg_key *k = &keys[i];
        char env[96], bounds[160];
        cfg_key_env_name(k, env, sizeof env);
        cfg_key_bounds(k, bounds, sizeof bounds);
        printf("| `%s.%s` | %s | ", k->section, k->name, cfg_type_name(k->type));
        if (k->type == CFG_T_MAP)
            printf("(none)");
        else if (k->type == CFG_T_STRING)
            printf("`\"%s\"`", k->def);
        else
            printf("`%s`", k->def);
        printf(" | ");
        cell(bounds);
        printf(" | %s%s%s | ", *env ? "`" : "", *env ? env : "(none)", *env ? "`" : "");
        cell(k->help);
        printf(" |\n");
    }
}

/* Warns about LLMQ_<SECTION>_* variables that name no key (a typo would otherwise be ignored). */
static void warn_unknown_env(void)
{
    size_t n;
    const struct cfg_key *keys = cfg_keys(&n);
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "LLMQ_", 5) || !eq)
            continue;
        char var[128];
        snprintf(var, sizeof var, "%.*s", (int)(eq - *e), *e);
        const char *sec = NULL;
        bool known = false;
        for (size_t i = 0; i < n; i++) {
            char name[96], pre[64];
            cfg_key_env_name(&keys[i], name, sizeof name);
            if (*name && !strcmp(name, var))
                known = true;
            snprintf(pre, sizeof pre, "LLMQ_%s_", keys[i].section);
            for (char *p = pre; *p; p++)
                *p = (char)toupper((unsigned char)*p);
            if (!strncmp(var, pre, strlen(pre)) && keys[i].type != CFG_T_MAP)
                sec = keys[i].section;
        }
        if (known || !sec)
            continue;
        char dotted[160];
        snprintf(dotted, sizeof dotted, "%s.%s", sec, var + 5 + strlen(sec) + 1);
        for (char *p = dotted; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        const struct cfg_key *s = cfg_key_suggest(dotted);
        char hint[128] = "";
        if (s) {
            cfg_key_env_name(s, hint, sizeof hint);
        }
        fprintf(stderr, "llmq config: warning: %s is not a configuration variable%s%s%s\n", var,
                *hint ? " (did you mean " : "", hint, *hint ? "?)" : "");
    }
}

int cmd_config(int argc, char **argv)
{
    enum { OPT_SET = 256, OPT_KEYS, OPT_CHECK, OPT_GET, OPT_SECRETS };
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},  {"set", required_argument, NULL, OPT_SET},
        {"keys", no_argument, NULL, OPT_KEYS},     {"check", no_argument, NULL, OPT_CHECK},
        {"get", required_argument, NULL, OPT_GET}, {"show-secrets", no_argument, NULL, OPT_SECRETS},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *path = cfg_default_path(), *get = NULL;
    bool keys = false, check = false, secrets = false;
    char **sets = calloc((size_t)argc + 1, sizeof *sets);
    int nsets = 0, opt;
    if (!sets) {
        fprintf(stderr, "llmq config: out of memory\n");
        return 1;
    }
    static const char shortopts[] = ":c:h";
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, shortopts, opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            path = optarg;
            break;
        case OPT_SET:
            if (!strchr(optarg, '=') || optarg[0] == '=') {
                free(sets);
                return cli_usage_error("config", "--set wants SECTION.KEY=VALUE, got '%s'", optarg);
            }
            sets[nsets++] = optarg;
            break;
        case OPT_KEYS:
            keys = true;
            break;
        case OPT_CHECK:
            check = true;
            break;
        case OPT_GET:
            get = optarg;
            break;
        case OPT_SECRETS:
            secrets = true;
            break;
        case 'h':
            usage(stdout);
            free(sets);
            return 0;
        default:
            free(sets);
            return cli_bad_option("config", argc, argv, opts, shortopts);
        }
    }
    if (optind < argc) {
        free(sets);
        return cli_usage_error("config", "unexpected argument '%s'", argv[optind]);
    }
    if (keys + check + (get != NULL) > 1) {
        free(sets);
        return cli_usage_error("config", "--keys, --check and --get go alone");
    }
    if (keys) {
        free(sets);
        print_keys();
        return 0;
    }

    struct cfg c;
    char err[1024];
    int rc = 0;
    cfg_defaults(&c);
    if ((path && cfg_load_file(&c, path, err, sizeof err)) || cfg_load_env(&c, err, sizeof err))
        rc = -1;
    for (int i = 0; i < nsets && !rc; i++) {
        char key[160], origin[200];
        const char *eq = strchr(sets[i], '=');
        snprintf(key, sizeof key, "%.*s", (int)(eq - sets[i]), sets[i]);
        snprintf(origin, sizeof origin, "--set %s", key);
        rc = cfg_set(&c, key, eq + 1, origin, err, sizeof err);
    }
    if (!rc)
        rc = cfg_validate(&c, err, sizeof err);
    free(sets);
    if (rc) {
        fprintf(stderr, "llmq config: %s\n", err);
        cfg_free(&c);
        return 1;
    }
    if (check) {
        warn_unknown_env();
        printf("ok\n");
    } else if (get) {
        const struct cfg_key *k = cfg_key_find(get);
        const char *t = NULL;
        if (k && k->type == CFG_T_MAP && !(t = cfg_template_find(&c, strchr(get, '.') + 1))) {
            fprintf(stderr, "llmq config: no template '%s'\n", strchr(get, '.') + 1);
            rc = 1;
        } else if (k && k->type == CFG_T_MAP) {
            printf("%s\n", t);
        } else if (k) {
            char val[4096];
            cfg_format_value(&c, k, val, sizeof val);
            if (k->type == CFG_T_STRING)
                printf("%s\n", *(char *const *)((const char *)&c + k->offset));
            else
                printf("%s\n", val);
        } else {
            const struct cfg_key *s = cfg_key_suggest(get);
            fprintf(stderr, "llmq config: unknown key '%s'", get);
            if (s)
                fprintf(stderr, " (did you mean '%s.%s'?)", s->section, s->name);
            fprintf(stderr, "\n");
            rc = 1;
        }
    } else {
        printf("# llmq effective configuration; file: %s\n",
               c.path ? c.path : "none (defaults + environment)");
        printf("# each comment says where the value came from (default, FILE:LINE, env VAR, flag)\n");
        cfg_write_yaml(&c, stdout, CFG_YAML_ORIGIN | (secrets ? 0 : CFG_YAML_REDACT));
    }
    cfg_free(&c);
    return rc ? 1 : 0;
}
