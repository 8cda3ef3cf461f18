/* The Jinja lexer: template text, {{ }}, {% %}, {# #} and {% raw %}, with the whitespace rules of
 * Hugging Face's environment (trim_blocks: a block or comment tag eats one newline after it;
 * lstrip_blocks: spaces and tabs before a block or comment tag at the start of a line go; `-` at
 * either side of a tag strips all whitespace on that side, `+` keeps it). See jinja_int.h. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja_int.h"

struct lexer {
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting; /* the last tag's match ended in a newline (or nothing was read yet) */
    struct jarena *a;
    struct jfail *f;
    struct jtoken *tok;
    size_t ntok, cap;
};

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool at(const struct lexer *L, size_t p, const char *lit)
{
    size_t k = strlen(lit);
    return p + k <= L->n && memcmp(L->s + p, lit, k) == 0;
}

static struct jtoken *emit(struct lexer *L, enum jtk k, const char *s, size_t n)
{
    if (L->ntok == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        struct jtoken *t = jalloc(L->a, cap * sizeof *t);
        if (L->ntok)
            memcpy(t, L->tok, L->ntok * sizeof *t);
        L->tok = t;
        L->cap = cap;
    }
    struct jtoken *t = &L->tok[L->ntok++];
    *t = (struct jtoken){.k = k, .line = L->line, .s = s ? jstrndup(L->a, s, n) : "", .n = n};
    return t;
}

static void count_lines(struct lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        L->line += L->s[i] == '\n';
}

/* Emits text [from, to) as data, stripped by the sign of the tag that follows (`lstrip` tells
 * whether lstrip_blocks applies to that tag at all). */
static void emit_data(struct lexer *L, size_t from, size_t to, char sign, bool lstrip)
{
    size_t end = to;
    if (sign == '-') {
        while (end > from && is_ws(L->s[end - 1]))
            end--;
    } else if (sign != '+' && lstrip) {
        size_t l = end;
        while (l > from && L->s[l - 1] != '\n')
            l--;
        bool only_ws = l < end;
        for (size_t i = l; i < end && only_ws; i++)
            only_ws = is_ws(L->s[i]);
        if ((l > from || L->line_starting) && only_ws)
            end = l;
    }
    int line = L->line;
    if (end > from)
        emit(L, TK_DATA, L->s + from, end - from);
    L->line = line;
    count_lines(L, from, to);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A string literal at L->pos (its quote), unescaped as Python's unicode-escape does. */
static void lex_string(struct lexer *L)
{
    char q = L->s[L->pos];
    size_t p = L->pos + 1;
    struct jbuf b = {.a = L->a};
    jbuf_put(&b, "", 0);
    for (;; p++) {
        if (p >= L->n)
            jfail(L->f, "unexpected end of string");
        char c = L->s[p];
        if (c == q)
            break;
        if (c != '\\') {
            jbuf_putc(&b, c);
            continue;
        }
        if (++p >= L->n)
            jfail(L->f, "unexpected end of string");
        c = L->s[p];
        const char *simple = c ? strchr("\\'\"abfnrtv\n", c) : NULL;
        if (simple) {
            static const char out[] = "\\'\"\a\b\f\n\r\t\v";
            if (c != '\n')
                jbuf_putc(&b, out[simple - "\\'\"abfnrtv\n"]);
        } else if (c >= '0' && c <= '7') {
            int v = 0, k = 0;
            while (k < 3 && p < L->n && L->s[p] >= '0' && L->s[p] <= '7')
                v = v * 8 + (L->s[p++] - '0'), k++;
            p--;
            jutf8_enc(&b, v);
        } else if (c == 'x' || c == 'u' || c == 'U') {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            uint32_t v = 0; /* 8 hex digits fit; over U+10FFFF is refused below */
            for (int k = 0; k < digits; k++) {
                int h = p + 1 < L->n ? hexval(L->s[p + 1]) : -1;
                if (h < 0)
                    jfail(L->f, "truncated \\%c escape in a string", c);
                v = v * 16 + (uint32_t)h;
                p++;
            }
            if (v > 0x10FFFF)
                jfail(L->f, "illegal Unicode character in a string");
            jutf8_enc(&b, (int32_t)v);
        } else if (c == 'N') {
            jfail(L->f, "unsupported \\N{...} escape in a string");
        } else {
            jbuf_putc(&b, '\\');
            jbuf_putc(&b, c);
        }
    }
    struct jtoken *t = emit(L, TK_STRING, NULL, 0);
    t->s = b.p;
    t->n = b.n;
    count_lines(L, L->pos, p);
    L->pos = p + 1;
}

static void lex_number(struct lexer *L)
{
    size_t p = L->pos;
    struct jbuf b = {.a = L->a};
    bool is_float = false;
    while (p < L->n && (isdigit((unsigned char)L->s[p]) ||
                        (L->s[p] == '_' && p + 1 < L->n && isdigit((unsigned char)L->s[p + 1])))) {
        if (L->s[p] != '_')
            jbuf_putc(&b, L->s[p]);
        p++;
    }
    if (p + 1 < L->n && L->s[p] == '.' && isdigit((unsigned char)L->s[p + 1]) &&
        !(L->pos > 0 && L->s[L->pos - 1] == '.')) {
        is_float = true;
        jbuf_putc(&b, '.');
        p++;
        while (p < L->n && (isdigit((unsigned char)L->s[p]) || L->s[p] == '_')) {
            if (L->s[p] != '_')
                jbuf_putc(&b, L->s[p]);
            p++;
        }
    }
    if (p < L->n && (L->s[p] == 'e' || L->s[p] == 'E')) {
        size_t q = p + 1;
        if (q < L->n && (L->s[q] == '+' || L->s[q] == '-'))
            q++;
        if (q < L->n && isdigit((unsigned char)L->s[q])) {
            is_float = true;
            jbuf_put(&b, L->s + p, q - p);
            p = q;
            while (p < L->n && isdigit((unsigned char)L->s[p]))
                jbuf_putc(&b, L->s[p++]);
        }
    }
    struct jtoken *t = emit(L, is_float ? TK_FLOAT : TK_INT, b.p, b.n);
    errno = 0;
    if (is_float) {
        t->f = strtod(b.p, NULL);
    } else {
        t->i = strtoll(b.p, NULL, 10);
        if (errno == ERANGE)
            jfail(L->f, "integer literal %s is too large", b.p);
    }
    L->pos = p;
}

/* The tokens inside {{ }} or {% %}, up to and including the end tag. */
static void lex_tag(struct lexer *L, bool block)
{
    char balance[64];
    int depth = 0;
    const char *close = block ? "%}" : "}}";
    for (;;) {
        if (L->pos >= L->n)
            jfail(L->f, "unexpected end of template, expected '%s'", close);
        if (depth == 0) {
            size_t p = L->pos, end = 0;
            bool trim_after = false, trim_nl = false;
            if (at(L, p, "-") && at(L, p + 1, close))
                end = p + 3, trim_after = true;
            else if (block && at(L, p, "+") && at(L, p + 1, close))
                end = p + 3;
            else if (at(L, p, close))
                end = p + 2, trim_nl = block;
            if (end) {
                emit(L, block ? TK_BLOCK_END : TK_VAR_END, NULL, 0);
                if (trim_after)
                    while (end < L->n && is_ws(L->s[end]))
                        end++;
                else if (trim_nl && end < L->n && L->s[end] == '\n')
                    end++;
                count_lines(L, L->pos, end);
                L->line_starting = L->s[end - 1] == '\n';
                L->pos = end;
                return;
            }
        }
        char c = L->s[L->pos];
        if (is_ws(c)) {
            L->line += c == '\n';
            L->pos++;
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t p = L->pos;
            while (p < L->n && (isalnum((unsigned char)L->s[p]) || L->s[p] == '_'))
                p++;
            emit(L, TK_NAME, L->s + L->pos, p - L->pos);
            L->pos = p;
        } else if (c == '\'' || c == '"') {
            lex_string(L);
        } else if (isdigit((unsigned char)c)) {
            lex_number(L);
        } else {
            static const char *two[] = {"//", "**", "==", "!=", "<=", ">=", NULL};
            size_t k = 1;
            for (int i = 0; two[i]; i++)
                if (at(L, L->pos, two[i]))
                    k = 2;
            if (k == 1 && (!c || !strchr("+-/*%~[](){}<>=.:|,;", c)))
                jfail(L->f, "unexpected char '%c'", c);
            if (k == 1 && strchr("([{", c)) {
                if (depth == (int)sizeof balance)
                    jfail(L->f, "brackets nested too deep");
                balance[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
            } else if (k == 1 && strchr(")]}", c)) {
                if (depth == 0)
                    jfail(L->f, "unexpected '%c'", c);
                if (balance[--depth] != c)
                    jfail(L->f, "unexpected '%c', expected '%c'", c, balance[depth]);
            }
            emit(L, TK_OP, L->s + L->pos, k);
            L->pos += k;
        }
    }
}

/* Skips a comment whose `{#` ends at L->pos. */
static void lex_comment(struct lexer *L)
{
    size_t p = L->pos;
    for (;; p++) {
        if (p >= L->n)
            jfail(L->f, "missing end of comment tag");
        if ((L->s[p] == '+' || L->s[p] == '-') && at(L, p + 1, "#}"))
            break;
        if (at(L, p, "#}"))
            break;
    }
    size_t end = p + 2;
    if (L->s[p] == '+') {
        end = p + 3;
    } else if (L->s[p] == '-') {
        end = p + 3;
        while (end < L->n && is_ws(L->s[end]))
            end++;
    } else if (end < L->n && L->s[end] == '\n') {
        end++;
    }
    count_lines(L, L->pos, end);
    L->line_starting = L->s[end - 1] == '\n';
    L->pos = end;
}

/* At `{%`: the length of a `{% raw %}` tag there, or 0. */
static size_t raw_tag(const struct lexer *L, size_t p, const char *word, char *sign)
{
    size_t q = p + 2;
    *sign = 0;
    if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
        *sign = L->s[q++];
    while (q < L->n && is_ws(L->s[q]))
        q++;
    if (!at(L, q, word))
        return 0;
    q += strlen(word);
    while (q < L->n && is_ws(L->s[q]))
        q++;
    if (at(L, q, "-%}") || at(L, q, "+%}"))
        return q + 3 - p;
    if (at(L, q, "%}"))
        return q + 2 - p;
    return 0;
}

/* The body of a raw block starting at L->pos, through its `{% endraw %}`. */
static void lex_raw(struct lexer *L)
{
    for (size_t p = L->pos; p < L->n; p++) {
        char sign;
        size_t k;
        if (!at(L, p, "{%") || !(k = raw_tag(L, p, "endraw", &sign)))
            continue;
        emit_data(L, L->pos, p, sign, true);
        size_t end = p + k;
        if (L->s[end - 3] == '-') {
            while (end < L->n && is_ws(L->s[end]))
                end++;
        } else if (L->s[end - 3] != '+' && end < L->n && L->s[end] == '\n') {
            end++;
        }
        count_lines(L, p, end);
        L->line_starting = L->s[end - 1] == '\n';
        L->pos = end;
        return;
    }
    jfail(L->f, "missing end of raw directive");
}

/* Python's str.splitlines-and-join normalisation: \r\n and \r become \n, one final \n goes. */
static char *normalize(struct jarena *a, const char *src, size_t len, size_t *n)
{
    char *s = jalloc(a, len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k > 0 && s[k - 1] == '\n')
        k--;
    s[k] = 0;
    *n = k;
    return s;
}

struct jtoken *jlex(const char *src, size_t len, struct jarena *a, struct jfail *f, size_t *ntok)
{
    struct lexer L = {.a = a, .f = f, .line = 1, .line_starting = true};
    L.s = normalize(a, src, len, &L.n);
    while (L.pos < L.n) {
        f->line = L.line;
        size_t p = L.pos;
        while (p < L.n && !(L.s[p] == '{' && p + 1 < L.n && L.s[p + 1] && strchr("{%#", L.s[p + 1])))
            p++;
        if (p >= L.n) {
            emit_data(&L, L.pos, L.n, 0, false);
            break;
        }
        char kind = L.s[p + 1], sign = 0;
        size_t open = 2, rawlen = 0;
        if (kind == '%')
            rawlen = raw_tag(&L, p, "raw", &sign);
        if (!rawlen && p + 2 < L.n && (L.s[p + 2] == '-' || L.s[p + 2] == '+'))
            sign = L.s[p + 2], open = 3;
        emit_data(&L, L.pos, p, sign, kind != '{');
        f->line = L.line;
        if (rawlen) {
            size_t end = p + rawlen;
            if (L.s[end - 3] == '-')
                while (end < L.n && is_ws(L.s[end]))
                    end++;
            count_lines(&L, p, end);
            L.line_starting = L.s[end - 1] == '\n';
            L.pos = end;
            lex_raw(&L);
            continue;
        }
        L.pos = p + open;
        if (kind == '#') {
            lex_comment(&L);
        } else {
            emit(&L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, NULL, 0);
            lex_tag(&L, kind == '%');
        }
    }
    f->line = L.line;
    emit(&L, TK_EOF, NULL, 0);
    *ntok = L.ntok;
    return L.tok;
}
