/* See gemm_tuning.h. */
#include "engine/gemm_tuning.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util/array.h"
#include "engine/util/atomic_file.h"

#define MAGIC "llmq-gemm-tuning"
#define VERSION 1
#define FIELDS 12 /* kind, the 8 key ints, timed_M, path, algo */

static bool kind_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n >= sizeof((struct gemm_tuning_entry *)0)->kind)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') || k[i] == '_' || k[i] == '-'))
            return false;
    return true;
}

static int find_index(const struct gemm_tuning *t, const char *kind, const int key[GEMM_TUNING_KEY_INTS])
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->e[i].kind, kind) && !memcmp(t->e[i].key, key, sizeof t->e[i].key))
            return i;
    return -1;
}

const struct gemm_tuning_entry *gemm_tuning_find(const struct gemm_tuning *t, const char *kind,
                                                 const int key[GEMM_TUNING_KEY_INTS])
{
    int i = find_index(t, kind, key);
    return i < 0 ? NULL : &t->e[i];
}

int gemm_tuning_put(struct gemm_tuning *t, const struct gemm_tuning_entry *e)
{
    if (!kind_ok(e->kind))
        return -1;
    int i = find_index(t, e->kind, e->key);
    if (i < 0) {
        if (array_reserve(&t->e, &t->cap, (size_t)t->n + 1, sizeof *t->e, 64))
            return -1;
        i = t->n++;
    }
    t->e[i] = *e;
    return 0;
}

void gemm_tuning_free(struct gemm_tuning *t)
{
    if (!t)
        return;
    free(t->e);
    t->e = NULL, t->n = t->cap = 0;
}

/* ---- reading */

/* A whole decimal int in [lo, hi] into *v; false otherwise. */
static bool parse_int(const char *s, long lo, long hi, int *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return false;
    *v = (int)x;
    return true;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* 128 hex digits into algo[8] (16 a word, most significant first); false otherwise. */
static bool parse_algo(const char *s, uint64_t algo[8])
{
    if (strlen(s) != 128)
        return false;
    for (int w = 0; w < 8; w++) {
        uint64_t v = 0;
        for (int d = 0; d < 16; d++) {
            int h = hexval(s[16 * w + d]);
            if (h < 0)
                return false;
            v = v << 4 | (uint64_t)h;
        }
        algo[w] = v;
    }
    return true;
}

/* Parses one entry line (modified in place) into *e; false with what is wrong in why. */
static bool parse_entry(char *line, struct gemm_tuning_entry *e, char *why, size_t whylen)
{
    char *tok[FIELDS + 1];
    int n = 0;
    char *save = NULL;
    for (char *s = strtok_r(line, " \t", &save); s && n <= FIELDS; s = strtok_r(NULL, " \t", &save))
        tok[n++] = s;
    const char *bad = NULL;
    if (n != FIELDS)
        bad =
            n > FIELDS
                ? "more than 12 fields"
                : "fewer than 12 fields (kind, M N K y_f32 align_x align_w align_y rep, timed_M, path, algo)";
    else if (!kind_ok(tok[0]))
        bad = "the kind is not a name of [a-z0-9_-], 1 to 15 characters";
    if (bad) {
        snprintf(why, whylen, "%s", bad);
        return false;
    }
    memset(e, 0, sizeof *e);
    strcpy(e->kind, tok[0]);
    static const char *name[GEMM_TUNING_KEY_INTS] = {"M",       "N",       "K",       "y_f32",
                                                     "align_x", "align_w", "align_y", "rep"};
    static const long lo[GEMM_TUNING_KEY_INTS] = {1, 1, 1, 0, 1, 1, 1, 0};
    static const long hi[GEMM_TUNING_KEY_INTS] = {1 << 24, 1 << 24, 1 << 24, 1, 256, 256, 256, 1};
    for (int i = 0; i < GEMM_TUNING_KEY_INTS; i++)
        if (!parse_int(tok[1 + i], lo[i], hi[i], &e->key[i])) {
            snprintf(why, whylen, "%s is not an integer in %ld..%ld", name[i], lo[i], hi[i]);
            return false;
        }
    bad = !parse_int(tok[9], 0, 1 << 24, &e->timed_M) ? "timed_M is not an integer in 0..16777216"
          : !parse_int(tok[10], 0, 15, &e->path)      ? "path is not an integer in 0..15"
          : !parse_algo(tok[11], e->algo)             ? "algo is not 128 hex digits"
                                                      : NULL;
    if (bad)
        snprintf(why, whylen, "%s", bad);
    return !bad;
}

int gemm_tuning_load(struct gemm_tuning *t, const char *path, const char *identity, char *msg, size_t msglen)
{
    gemm_tuning_free(t);
    msg[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) {
            snprintf(msg, msglen, "%s: no such file yet", path);
            return GEMM_TUNING_NO_FILE;
        }
        snprintf(msg, msglen, "%s: %s", path, strerror(errno));
        return GEMM_TUNING_FOREIGN;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = GEMM_TUNING_LOADED;
    bool have_id = false;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (lineno == 1) {
            int v = 0;
            if (strncmp(line, MAGIC " ", sizeof MAGIC) || !parse_int(line + sizeof MAGIC, 1, 1000000, &v)) {
                snprintf(msg, msglen, "%s:1: not a GEMM tuning file (it does not begin with \"%s %d\")", path,
                         MAGIC, VERSION);
                rc = GEMM_TUNING_FOREIGN;
                break;
            }
            if (v != VERSION) {
                snprintf(msg, msglen, "%s:1: format version %d, this llmq reads %d", path, v, VERSION);
                rc = GEMM_TUNING_OTHER_ID;
                break;
            }
            continue;
        }
        if (lineno == 2) {
            if (strncmp(line, "identity ", 9)) {
                snprintf(msg, msglen, "%s:2: expected \"identity ...\"", path);
                rc = GEMM_TUNING_BAD;
                break;
            }
            if (strcmp(line + 9, identity)) {
                snprintf(msg, msglen, "%s:2: made for \"%s\", not for \"%s\"", path, line + 9, identity);
                rc = GEMM_TUNING_OTHER_ID;
                break;
            }
            have_id = true;
            continue;
        }
        if (len == 0 || line[0] == '#')
            continue;
        struct gemm_tuning_entry e;
        char why[128];
        if (!parse_entry(line, &e, why, sizeof why)) {
            snprintf(msg, msglen, "%s:%d: %s", path, lineno, why);
            rc = GEMM_TUNING_BAD;
            break;
        }
        if (gemm_tuning_put(t, &e)) {
            snprintf(msg, msglen, "%s:%d: out of memory", path, lineno);
            rc = GEMM_TUNING_BAD;
            break;
        }
    }
    if (rc == GEMM_TUNING_LOADED && ferror(f)) {
        snprintf(msg, msglen, "%s: %s", path, strerror(errno));
        rc = GEMM_TUNING_FOREIGN;
    }
    if (rc == GEMM_TUNING_LOADED && lineno == 0) {
        /* an empty file (made ready with touch, or by a tool that creates its files first) is no file
         * yet: it becomes the tuning file at the first save */
        snprintf(msg, msglen, "%s: empty, no choices yet", path);
        rc = GEMM_TUNING_NO_FILE;
    } else if (rc == GEMM_TUNING_LOADED && !have_id) {
        snprintf(msg, msglen, "%s:%d: the file ends before its identity line", path, lineno + 1);
        rc = GEMM_TUNING_BAD;
    }
    free(line);
    fclose(f);
    if (rc != GEMM_TUNING_LOADED)
        gemm_tuning_free(t);
    return rc;
}

/* ---- writing */

int gemm_tuning_save(const struct gemm_tuning *t, const char *path, const char *identity, char *msg,
                     size_t msglen)
{
    struct atomic_file a;
    if (atomic_file_open(&a, path, msg, msglen))
        return -1;
    FILE *f = a.f;
    fprintf(f, "%s %d\nidentity %s\n", MAGIC, VERSION, identity);
    fprintf(f, "# what llmq's GEMMs chose by timing (engine.gemm_tuning_file); delete the file to time "
               "again\n# kind M N K y_f32 align_x align_w align_y rep timed_M path algo\n");
    for (int i = 0; i < t->n; i++) {
        const struct gemm_tuning_entry *e = &t->e[i];
        fprintf(f, "%s", e->kind);
        for (int k = 0; k < GEMM_TUNING_KEY_INTS; k++)
            fprintf(f, " %d", e->key[k]);
        fprintf(f, " %d %d ", e->timed_M, e->path);
        for (int w = 0; w < 8; w++)
            fprintf(f, "%016" PRIx64, e->algo[w]);
        fputc('\n', f);
    }
    return atomic_file_commit(&a, msg, msglen);
}
