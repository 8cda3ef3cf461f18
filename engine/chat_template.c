/* A model's chat template: finding, parsing once, rendering; see chat_template.h. */
#include "engine/chat_template.h"

#include <errno.h>
#include <jansson.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/jinja.h"
#include "engine/util/buf.h"
#include "engine/util/errfmt.h"

#define MAX_TEMPLATES 16 /* named templates in tokenizer_config.json's list form */

struct named {
    char *name; /* NULL for the single template of the string form or a file */
    struct jinja_template *t;
    bool loops_content; /* the source loops over a message's content (takes lists of parts) */
};

struct chat_template {
    struct named tpl[MAX_TEMPLATES];
    int n;
    json_t *specials; /* bos_token, eos_token, ... as strings */
    char origin[4096];
};

/* ---- reading */

static char *read_all(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        errfmt(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    struct buf b = {0};
    char chunk[65536];
    size_t k;
    int rc = 0;
    while (rc == 0 && (k = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = buf_append(&b, chunk, k);
    bool bad = ferror(f) != 0;
    fclose(f);
    size_t n = b.len;
    char *s = buf_take(&b);
    if (rc || bad || !s) {
        free(s);
        errfmt(err, errlen, "cannot read %s: %s", path, bad ? "read error" : "out of memory");
        return NULL;
    }
    *len = n;
    return s;
}

/* Whether the template's source has a loop over a message's content ("for x in m.content",
 * "for x in m['content']"): such a template takes content as a list of parts. */
static bool loops_over_content(const char *src)
{
    static const char *const re_src =
        "for[[:space:]]+[A-Za-z_][A-Za-z0-9_]*[[:space:]]+in[[:space:]]+[A-Za-z_][A-Za-z0-9_]*"
        "(\\.content|\\[[[:space:]]*['\"]content['\"][[:space:]]*\\])";
    regex_t re;
    if (regcomp(&re, re_src, REG_EXTENDED | REG_NOSUB))
        return false;
    bool hit = regexec(&re, src, 0, NULL, 0) == 0;
    regfree(&re);
    return hit;
}

static int add_template(struct chat_template *ct, const char *name, const char *src, size_t len,
                        const char *label, char *err, size_t errlen)
{
    if (ct->n == MAX_TEMPLATES)
        return errfmt(err, errlen, "%s: more than %d chat templates", label, MAX_TEMPLATES);
    char msg[512] = "";
    struct jinja_template *t = jinja_parse(src, len, label, msg, sizeof msg);
    if (!t)
        return errfmt(err, errlen, "chat template: %s", msg[0] ? msg : "does not parse");
    struct named *nt = &ct->tpl[ct->n];
    nt->t = t;
    nt->loops_content = loops_over_content(src);
    nt->name = name ? strdup(name) : NULL;
    ct->n++;
    if (name && !nt->name)
        return errfmt(err, errlen, "out of memory");
    return 0;
}

/* A special token's text: a string, or an AddedToken object's "content"; NULL otherwise. */
static json_t *token_text(json_t *v)
{
    if (json_is_string(v))
        return v;
    json_t *c = json_is_object(v) ? json_object_get(v, "content") : NULL;
    return json_is_string(c) ? c : NULL;
}

/* transformers' special_tokens_map: each special token the config sets, as a string. */
static int read_specials(struct chat_template *ct, json_t *cfg)
{
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *s = token_text(json_object_get(cfg, keys[i]));
        if (s && json_object_set(ct->specials, keys[i], s))
            return -1;
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(extra) && json_array_size(extra) > 0) {
        json_t *list = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(extra, i, v)
        {
            json_t *s = token_text(v);
            if (s && json_array_append(list, s))
                break;
        }
        if (!list || json_object_set_new(ct->specials, "additional_special_tokens", list))
            return -1;
    }
    return 0;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* A template file; origin names it in logs. */
static int from_file(struct chat_template *ct, const char *path, const char *origin, char *err, size_t errlen)
{
    size_t len = 0;
    char *src = read_all(path, &len, err, errlen);
    if (!src)
        return -1;
    int rc = add_template(ct, NULL, src, len, path, err, errlen);
    free(src);
    snprintf(ct->origin, sizeof ct->origin, "%s", origin);
    return rc;
}

/* tokenizer_config.json's "chat_template": a string or a list of {"name", "template"}. */
static int from_config(struct chat_template *ct, json_t *v, const char *cfg_path, char *err, size_t errlen)
{
    snprintf(ct->origin, sizeof ct->origin, "tokenizer_config.json");
    if (json_is_string(v))
        return add_template(ct, NULL, json_string_value(v), json_string_length(v), "chat_template", err,
                            errlen);
    if (!json_is_array(v))
        return errfmt(err, errlen,
                      "%s: \"chat_template\": expected a string or a list of {\"name\", \"template\"}",
                      cfg_path);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        json_t *name = json_object_get(e, "name"), *text = json_object_get(e, "template");
        if (!json_is_string(name) || !json_is_string(text))
            return errfmt(err, errlen,
                          "%s: \"chat_template\"[%zu]: expected {\"name\": string, \"template\": string}",
                          cfg_path, i);
        char label[128];
        snprintf(label, sizeof label, "chat_template '%.64s'", json_string_value(name));
        if (add_template(ct, json_string_value(name), json_string_value(text), json_string_length(text),
                         label, err, errlen))
            return -1;
    }
    return 0;
}

struct chat_template *chat_template_load(const char *dir, const char *override_file, char *err, size_t errlen)
{
    struct chat_template *ct = calloc(1, sizeof *ct);
    if (!ct || !(ct->specials = json_object())) {
        free(ct);
        errfmt(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(ct->origin, sizeof ct->origin, "none");
    size_t dn = strlen(dir);
    char *cfg_path = malloc(dn + 32), *jinja_path = malloc(dn + 32);
    json_t *cfg = NULL;
    int rc = -1;
    if (!cfg_path || !jinja_path) {
        errfmt(err, errlen, "out of memory");
        goto out;
    }
    snprintf(cfg_path, dn + 32, "%s/tokenizer_config.json", dir);
    snprintf(jinja_path, dn + 32, "%s/chat_template.jinja", dir);
    if (exists(cfg_path)) {
        json_error_t je;
        /* numbers such as Llama-3's model_max_length overflow an integer */
        cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je);
        if (!json_is_object(cfg)) {
            errfmt(err, errlen, "%s: %s", cfg_path, cfg ? "expected a JSON object" : je.text);
            goto out;
        }
        if (read_specials(ct, cfg)) {
            errfmt(err, errlen, "out of memory");
            goto out;
        }
    }
    json_t *in_cfg = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (override_file && override_file[0])
        rc = from_file(ct, override_file, override_file, err, errlen);
    else if (exists(jinja_path))
        rc = from_file(ct, jinja_path, "chat_template.jinja", err, errlen);
    else if (in_cfg && !json_is_null(in_cfg))
        rc = from_config(ct, in_cfg, cfg_path, err, errlen);
    else
        rc = 0;
out:
    json_decref(cfg);
    free(cfg_path);
    free(jinja_path);
    if (rc) {
        chat_template_free(ct);
        return NULL;
    }
    return ct;
}

void chat_template_free(struct chat_template *ct)
{
    if (!ct)
        return;
    for (int i = 0; i < ct->n; i++) {
        free(ct->tpl[i].name);
        jinja_free(ct->tpl[i].t);
    }
    json_decref(ct->specials);
    free(ct);
}

bool chat_template_present(const struct chat_template *ct)
{
    return ct && ct->n > 0;
}

const char *chat_template_origin(const struct chat_template *ct)
{
    return ct ? ct->origin : "none";
}

/* ---- rendering */

static const struct named *pick(const struct chat_template *ct, bool tools, char *err, size_t errlen)
{
    if (ct->n == 1 && !ct->tpl[0].name)
        return &ct->tpl[0];
    const struct named *def = NULL, *tool_use = NULL;
    for (int i = 0; i < ct->n; i++) {
        if (!strcmp(ct->tpl[i].name, "default"))
            def = &ct->tpl[i];
        if (!strcmp(ct->tpl[i].name, "tool_use"))
            tool_use = &ct->tpl[i];
    }
    if (tools && tool_use)
        return tool_use;
    if (def)
        return def;
    struct buf names = {0};
    for (int i = 0; i < ct->n; i++) {
        if (i)
            buf_puts(&names, ", ");
        buf_puts(&names, ct->tpl[i].name);
    }
    char *s = buf_take(&names);
    errfmt(err, errlen, "the model's chat templates (%s) have none named \"default\"%s", s ? s : "?",
           tools ? " or \"tool_use\"" : "");
    free(s);
    return NULL;
}

/* A copy of messages in which each list of parts is one string: the parts' texts joined with "\n". */
static json_t *join_parts(const json_t *messages, char *err, size_t errlen)
{
    json_t *arr = (json_t *)messages; /* jansson's accessors take non-const pointers; nothing changes */
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(arr, i, m)
    {
        json_t *content = json_object_get(m, "content");
        if (!json_is_array(content)) {
            json_array_append(out, m);
            continue;
        }
        struct buf b = {0};
        size_t k;
        json_t *p;
        json_array_foreach(content, k, p)
        {
            json_t *text = json_object_get(p, "text");
            if (!json_is_string(text)) {
                buf_free(&b);
                json_decref(out);
                errfmt(err, errlen, "messages[%zu].content[%zu]: only text parts can be rendered", i, k);
                return NULL;
            }
            if (k)
                buf_append(&b, "\n", 1);
            buf_append(&b, json_string_value(text), json_string_length(text));
        }
        size_t n = b.len;
        char *s = buf_take(&b);
        json_t *copy = json_copy(m);
        if (!copy || json_object_set_new(copy, "content", json_stringn_nocheck(s ? s : "", s ? n : 0)) ||
            json_array_append_new(out, copy)) {
            free(s);
            json_decref(out);
            errfmt(err, errlen, "out of memory");
            return NULL;
        }
        free(s);
    }
    return out;
}

int chat_template_render(const struct chat_template *ct, const struct chat_input *in, char **out,
                         size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    if (!chat_template_present(ct))
        return errfmt_rc(err, errlen, CHAT_NONE,
                         "the model has no chat template (no chat_template in tokenizer_config.json, no "
                         "chat_template.jinja): send a prompt, or set model.chat_template");
    const struct named *nt = pick(ct, in->tools != NULL, err, errlen);
    if (!nt)
        return CHAT_ERROR;
    json_t *messages = (json_t *)in->messages;
    bool joined = false;
    if (!in->parts_as_given && !nt->loops_content) {
        size_t i;
        json_t *m;
        json_array_foreach(messages, i, m) joined = joined || json_is_array(json_object_get(m, "content"));
        if (joined && !(messages = join_parts(in->messages, err, errlen)))
            return CHAT_ERROR;
    }
    json_t *vars = json_copy(ct->specials);
    int rc = vars ? 0 : -1;
    if (rc == 0 && in->kwargs)
        rc = json_object_update(vars, (json_t *)in->kwargs);
    if (rc == 0)
        rc = json_object_set(vars, "messages", messages) ||
             json_object_set_new(vars, "tools", in->tools ? json_incref((json_t *)in->tools) : json_null()) ||
             json_object_set_new(vars, "documents",
                                 in->documents ? json_incref((json_t *)in->documents) : json_null()) ||
             json_object_set_new(vars, "add_generation_prompt", json_boolean(in->add_generation_prompt));
    if (joined)
        json_decref(messages);
    if (rc) {
        json_decref(vars);
        return errfmt_rc(err, errlen, CHAT_ERROR, "out of memory");
    }
    char msg[1024] = "";
    int jr = jinja_render(nt->t, vars, NULL, out, out_len, msg, sizeof msg);
    json_decref(vars);
    if (jr == JINJA_OK)
        return CHAT_OK;
    *out = NULL;
    *out_len = 0;
    return errfmt_rc(err, errlen, jr == JINJA_RAISED ? CHAT_RAISED : CHAT_ERROR, "%s", msg);
}
