/* See tokenize_lines.h. */
#include "worker/cli/tokenize_lines.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/chat_template.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"
#include "worker/cli/text_line.h"

#define BATCH_BYTES 65536 /* input read per batch (more when one line is longer) */

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(ids[i])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The tokenizer and, loaded on the first line with messages, the chat template; shared by the
 * threads (the template is loaded under mu, and immutable once loaded). */
struct tk {
    const struct tok *tok;
    const char *tpl_dir;  /* the folder of tokenizer_config.json */
    const char *tpl_file; /* --chat-template, or NULL */
    pthread_mutex_t mu;
    struct chat_template *chat;
    bool chat_tried;
    char chat_err[1024];
    bool skip_special;
};

enum { ANSWER_OK = 0, ANSWER_BAD = -1, ANSWER_RAISED = -2 };

/* {"messages", ...}: the rendered prompt and its ids into *out. */
static int answer_chat(struct tk *t, json_t *in, json_t **out, char *err, size_t errlen)
{
    json_t *msgs = json_object_get(in, "messages"), *tools = json_object_get(in, "tools"),
           *docs = json_object_get(in, "documents"), *agp = json_object_get(in, "add_generation_prompt"),
           *kwargs = json_object_get(in, "chat_template_kwargs"),
           *think = json_object_get(in, "enable_thinking");
    if (!json_is_array(msgs))
        return errfmt(err, errlen, "\"messages\": expected an array");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return errfmt(err, errlen, "\"tools\": expected an array");
    if (docs && !json_is_null(docs) && !json_is_array(docs))
        return errfmt(err, errlen, "\"documents\": expected an array");
    if (agp && !json_is_boolean(agp))
        return errfmt(err, errlen, "\"add_generation_prompt\": expected true or false");
    if (kwargs && !json_is_object(kwargs))
        return errfmt(err, errlen, "\"chat_template_kwargs\": expected an object");
    if (think && !json_is_boolean(think))
        return errfmt(err, errlen, "\"enable_thinking\": expected true or false");
    pthread_mutex_lock(&t->mu);
    if (!t->chat_tried) {
        t->chat_tried = true;
        t->chat = chat_template_load(t->tpl_dir, t->tpl_file, t->chat_err, sizeof t->chat_err);
    }
    pthread_mutex_unlock(&t->mu);
    if (!t->chat)
        return errfmt(err, errlen, "%s", t->chat_err);
    json_t *kw = kwargs ? json_copy(kwargs) : json_object();
    if (!kw)
        return errfmt(err, errlen, "out of memory");
    if (think && !json_object_get(kw, "enable_thinking"))
        json_object_set(kw, "enable_thinking", think);
    struct chat_input ci = {.messages = msgs,
                            .tools = json_is_array(tools) ? tools : NULL,
                            .documents = json_is_array(docs) ? docs : NULL,
                            .kwargs = kw,
                            .add_generation_prompt = agp ? json_is_true(agp) : true};
    char *prompt = NULL;
    size_t len = 0;
    int rc = chat_template_render(t->chat, &ci, &prompt, &len, err, errlen);
    json_decref(kw);
    if (rc == CHAT_RAISED)
        return ANSWER_RAISED;
    if (rc)
        return ANSWER_BAD;
    int32_t *v = NULL;
    size_t n = 0;
    if (tok_encode_ex(t->tok, prompt, len, false, &v, &n, err, errlen) != 0) {
        free(prompt);
        return ANSWER_BAD;
    }
    *out = json_pack("{s:s%,s:o}", "text", prompt, len, "ids", ids_json(v, n));
    free(prompt);
    free(v);
    return ANSWER_OK;
}

/* Answers one input line: a new JSON object in *out, or an error in err (ANSWER_RAISED: err is
 * the template's own message). */
static int answer(struct tk *t, const char *line, size_t len, json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    json_error_t je;
    json_t *in = json_loadb(line, len, JSON_ALLOW_NUL, &je);
    if (!in)
        return errfmt(err, errlen, "not valid JSON: %s (column %d)", je.text, je.column);
    const json_t *text = json_object_get(in, "text"), *msgs = json_object_get(in, "messages"),
                 *ids = json_object_get(in, "ids");
    const char *key;
    json_t *val;
    int rc = ANSWER_BAD;
    if (!json_is_object(in)) {
        snprintf(err, errlen, "expected a JSON object");
        goto done;
    }
    static const char *const chat_keys[] = {
        "tools", "documents", "add_generation_prompt", "chat_template_kwargs", "enable_thinking", NULL};
    json_object_foreach(in, key, val)
    {
        bool chat_key = false;
        for (const char *const *k = chat_keys; *k; k++)
            chat_key = chat_key || !strcmp(*k, key);
        if (chat_key && !msgs) {
            snprintf(err, errlen, "\"%s\" goes with \"messages\"", key);
            goto done;
        }
        if (!chat_key && strcmp(key, "text") && strcmp(key, "messages") && strcmp(key, "ids")) {
            snprintf(err, errlen, "unknown key '%s' (expected \"text\", \"messages\" or \"ids\")", key);
            goto done;
        }
    }
    if (!!text + !!msgs + !!ids != 1) {
        snprintf(err, errlen, "expected exactly one of \"text\", \"messages\", \"ids\"");
        goto done;
    }
    int32_t *v = NULL;
    size_t n = 0;
    if (text) {
        if (!json_is_string(text)) {
            snprintf(err, errlen, "\"text\": expected a string");
            goto done;
        }
        if (tok_encode(t->tok, json_string_value(text), json_string_length(text), &v, &n, err, errlen) != 0)
            goto done;
        *out = json_pack("{s:o}", "ids", ids_json(v, n));
        free(v);
    } else if (msgs) {
        rc = answer_chat(t, in, out, err, errlen);
        if (rc != ANSWER_OK)
            goto done;
    } else {
        if (!json_is_array(ids)) {
            snprintf(err, errlen, "\"ids\": expected an array of token ids");
            goto done;
        }
        n = json_array_size(ids);
        v = malloc((n ? n : 1) * sizeof *v);
        if (!v) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(ids, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) >= tok_vocab_size(t->tok)) {
                if (json_is_integer(x))
                    snprintf(err, errlen, "ids[%zu]: %lld is not a token id (vocabulary size %d)", i,
                             (long long)json_integer_value(x), tok_vocab_size(t->tok));
                else
                    snprintf(err, errlen, "ids[%zu]: expected an integer", i);
                free(v);
                goto done;
            }
            v[i] = (int32_t)json_integer_value(x);
        }
        char *s = NULL;
        size_t slen;
        int drc = tok_decode(t->tok, v, n, t->skip_special, &s, &slen, err, errlen);
        free(v);
        if (drc != 0)
            goto done;
        *out = json_pack("{s:s%}", "text", s, slen);
        free(s);
    }
    rc = ANSWER_OK;
    if (!*out) {
        snprintf(err, errlen, "out of memory");
        rc = ANSWER_BAD;
    }
done:
    json_decref(in);
    return rc;
}

/* ---- one line */

/* `{"ids":[...]}` as json_dumps(JSON_COMPACT) writes it, without the JSON tree. */
static void put_ids(struct buf *b, const int32_t *ids, size_t n)
{
    if (buf_reserve(b, 10 + n * 12))
        return;
    char *p = b->p + b->len;
    memcpy(p, "{\"ids\":[", 8);
    p += 8;
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        int64_t v = ids[i];
        if (v < 0) {
            *p++ = '-';
            v = -v;
        }
        char d[12];
        int k = 0;
        do
            d[k++] = (char)('0' + v % 10);
        while ((v /= 10) > 0);
        while (k)
            *p++ = d[--k];
    }
    memcpy(p, "]}\n", 3);
    p += 3;
    b->len = (size_t)(p - b->p);
    b->p[b->len] = 0;
}

/* One input line's answer, its newline included, appended to out; false when it is an error. */
static bool answer_line(struct tk *t, struct buf *text, const char *line, size_t len, long lineno,
                        struct buf *out)
{
    char err[1024];
    int fast = text_line_read(line, len, text);
    if (fast == 1) { /* the common line, {"text": ...}, without a JSON tree either way */
        int32_t *v = NULL;
        size_t n = 0;
        if (tok_encode(t->tok, text->p ? text->p : "", text->len, &v, &n, err, sizeof err) == 0) {
            put_ids(out, v, n);
            free(v);
            return true;
        }
    }
    if (fast < 0)
        buf_free(text);
    json_t *o = NULL;
    int rc = fast == 1 ? ANSWER_BAD : answer(t, line, len, &o, err, sizeof err);
    if (rc == ANSWER_RAISED) {
        o = json_pack("{s:s}", "error", err);
    } else if (rc != ANSWER_OK) {
        char msg[1100];
        snprintf(msg, sizeof msg, "line %ld: %s", lineno, err);
        o = json_pack("{s:s}", "error", msg);
    }
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    bool ok = rc == ANSWER_OK && s;
    if (s)
        buf_printf(out, "%s\n", s);
    else
        buf_printf(out, "{\"error\": \"line %ld: out of memory\"}\n", lineno);
    free(s);
    json_decref(o);
    return ok;
}

/* ---- the batches: a ring of slots, filled in order by the reader, answered by the workers in
 * any order, written in order by the caller's thread */

enum { SLOT_FREE, SLOT_FILLED, SLOT_TAKEN, SLOT_DONE };

struct slot {
    int state;
    struct buf in; /* whole lines, each with its newline but perhaps the input's last */
    long first_line;
    struct buf out;
    bool failed;
};

struct pool {
    struct tk tk;
    int in_fd;
    pthread_mutex_t mu;
    pthread_cond_t changed; /* any slot's state, or eof */
    struct slot *slots;
    long n_slots;
    long next_fill, next_work, next_write; /* batch numbers; slot = number % n_slots */
    bool eof;                              /* the reader has filled its last batch */
};

static void *reader(void *arg)
{
    struct pool *p = arg;
    struct buf carry = {0}; /* the start of a line the last read cut off */
    long lineno = 0;
    bool eof = false;
    while (!eof) {
        pthread_mutex_lock(&p->mu);
        while (p->next_fill - p->next_write >= p->n_slots)
            pthread_cond_wait(&p->changed, &p->mu);
        struct slot *s = &p->slots[p->next_fill % p->n_slots];
        pthread_mutex_unlock(&p->mu);
        s->in.len = 0;
        if (carry.len)
            buf_append(&s->in, carry.p, carry.len);
        carry.len = 0;
        /* one read (a terminal or a pipe gives what it has), more until a whole line is there */
        size_t start = s->in.len;
        do {
            if (buf_reserve(&s->in, BATCH_BYTES)) {
                eof = true;
                break;
            }
            ssize_t k = read(p->in_fd, s->in.p + s->in.len, BATCH_BYTES);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                eof = true;
                break;
            }
            s->in.len += (size_t)k;
            s->in.p[s->in.len] = 0;
        } while (!memchr(s->in.p + start, '\n', s->in.len - start) && (start = s->in.len, true));
        size_t whole = s->in.len;
        if (!eof) { /* the bytes after the last newline wait for the next batch */
            while (whole && s->in.p[whole - 1] != '\n')
                whole--;
            buf_append(&carry, s->in.p + whole, s->in.len - whole);
            s->in.len = whole;
        }
        s->first_line = lineno + 1;
        for (size_t i = 0; i < s->in.len; i++)
            lineno += s->in.p[i] == '\n';
        if (s->in.len && s->in.p[s->in.len - 1] != '\n')
            lineno++;
        pthread_mutex_lock(&p->mu);
        if (s->in.len) {
            s->state = SLOT_FILLED;
            p->next_fill++;
        }
        p->eof = eof;
        pthread_cond_broadcast(&p->changed);
        pthread_mutex_unlock(&p->mu);
    }
    buf_free(&carry);
    return NULL;
}

/* Answers a slot's lines into its output. */
static void answer_slot(struct tk *t, struct buf *text, struct slot *s)
{
    s->out.len = 0;
    s->failed = false;
    long lineno = s->first_line;
    for (size_t off = 0; off < s->in.len; lineno++) {
        const char *line = s->in.p + off, *nl = memchr(line, '\n', s->in.len - off);
        size_t len = nl ? (size_t)(nl - line) : s->in.len - off;
        off += len + (nl != NULL);
        if (!answer_line(t, text, line, len, lineno, &s->out))
            s->failed = true;
    }
}

static void *answerer(void *arg)
{
    struct pool *p = arg;
    struct buf text = {0};
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->next_work == p->next_fill && !p->eof)
            pthread_cond_wait(&p->changed, &p->mu);
        if (p->next_work == p->next_fill)
            break;
        struct slot *s = &p->slots[p->next_work++ % p->n_slots];
        s->state = SLOT_TAKEN;
        pthread_mutex_unlock(&p->mu);
        answer_slot(&p->tk, &text, s);
        pthread_mutex_lock(&p->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->mu);
    buf_free(&text);
    return NULL;
}

int tokenize_lines(int in_fd, FILE *out, const struct tokenize_lines_opts *o)
{
    struct pool p = {.in_fd = in_fd, .n_slots = 2L * o->threads + 2};
    p.tk = (struct tk){
        .tok = o->tok, .tpl_dir = o->tpl_dir, .tpl_file = o->tpl_file, .skip_special = o->skip_special};
    pthread_mutex_init(&p.tk.mu, NULL);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.changed, NULL);
    p.slots = calloc((size_t)p.n_slots, sizeof *p.slots);
    pthread_t *th = calloc((size_t)o->threads + 1, sizeof *th);
    int status = 0, n_answerers = 0; /* th[0] the reader, th[1..] the answerers */
    while (p.slots && th && n_answerers < o->threads &&
           pthread_create(&th[1 + n_answerers], NULL, answerer, &p) == 0)
        n_answerers++;
    bool reading = n_answerers > 0 && pthread_create(&th[0], NULL, reader, &p) == 0;
    if (!reading) {
        fprintf(stderr, "llmq tokenize: %s\n", p.slots && th ? "cannot start a thread" : "out of memory");
        pthread_mutex_lock(&p.mu);
        p.eof = true; /* the answerers end */
        pthread_cond_broadcast(&p.changed);
        pthread_mutex_unlock(&p.mu);
        status = 1;
    }
    pthread_mutex_lock(&p.mu);
    while (reading) { /* write the batches in order as they are done */
        while (!(p.next_write < p.next_fill && p.slots[p.next_write % p.n_slots].state == SLOT_DONE) &&
               !(p.eof && p.next_write == p.next_fill))
            pthread_cond_wait(&p.changed, &p.mu);
        if (p.next_write == p.next_fill)
            break;
        struct slot *s = &p.slots[p.next_write % p.n_slots];
        pthread_mutex_unlock(&p.mu);
        if (s->out.oom) {
            fprintf(out, "{\"error\": \"line %ld: out of memory\"}\n", s->first_line);
            s->failed = true;
        } else {
            fwrite(s->out.p, 1, s->out.len, out);
        }
        fflush(out);
        if (s->failed)
            status = 1;
        if (s->in.oom || s->out.oom) { /* a fresh start for the next batch in this slot */
            buf_free(&s->in);
            buf_free(&s->out);
        }
        pthread_mutex_lock(&p.mu);
        s->state = SLOT_FREE;
        p.next_write++;
        pthread_cond_broadcast(&p.changed);
    }
    pthread_mutex_unlock(&p.mu);
    if (reading)
        pthread_join(th[0], NULL);
    for (int i = 0; i < n_answerers; i++)
        pthread_join(th[1 + i], NULL);
    for (long i = 0; p.slots && i < p.n_slots; i++) {
        buf_free(&p.slots[i].in);
        buf_free(&p.slots[i].out);
    }
    free(p.slots);
    free(th);
    chat_template_free(p.tk.chat);
    pthread_cond_destroy(&p.changed);
    pthread_mutex_destroy(&p.mu);
    pthread_mutex_destroy(&p.tk.mu);
    return status;
}
