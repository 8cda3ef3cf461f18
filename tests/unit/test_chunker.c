/* worker/jobs/chunker with the real Qwen3 tokenizer (and Llama-3's and DeepSeek-V3's when fetched): generated
 * English and Chinese documents of 5 and 50 times a 512-token context, and hostile texts (one huge word, CJK
 * without punctuation, 4-byte characters, runs of spaces or newlines, random code points). Every split is
 * checked against the contract in chunker.h, independently of the chunker: each chunk re-encodes to n_tokens
 * <= chunk_tokens, every start and end is a character boundary and a token boundary of the whole encoding,
 * neighbours overlap by [M, M + M/2] tokens, the chunks cover the text in order, and full chunks hold at
 * least half a window. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chunk_docs.h"
#include "engine/tokenizer.h"
#include "engine/util/buf.h"
#include "testutil.h"
#include "worker/jobs/chunker.h"

static struct tok *qwen, *llama, *deepseek;

/* Appends code point cp to b in UTF-8. */
static void put_cp(struct buf *b, uint32_t cp)
{
    char u[4];
    size_t k;
    if (cp < 0x80)
        u[0] = (char)cp, k = 1;
    else if (cp < 0x800)
        u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3F)),
        u[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3F)),
        u[2] = (char)(0x80 | (cp >> 6 & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    assert_int_equal(buf_append(b, u, k), 0);
}

/* text[0..len) in NFC form into *out (malloc'd); returns its length. */
static long nfc(const char *text, size_t len, char **out)
{
    utf8proc_uint8_t *o;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &o,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    assert_true(n >= 0);
    *out = (char *)o;
    return (long)n;
}

/* A text and the form its tokens spell. */
struct norm {
    const char *text;
    size_t len;
    bool nfc;   /* the form is the NFC form, not the text */
    char *form; /* the text itself unless nfc */
    size_t flen;
};

/* Where byte p of the text falls in the form: p itself, or for an NFC form the length of the prefix's
 * NFC form, after checking that the prefix's and the rest's forms make the whole form (a cut there
 * splits nothing the normalizer joins). */
static size_t norm_pos(const struct norm *nf, size_t p)
{
    if (!nf->nfc)
        return p;
    char *a, *b;
    long la = nfc(nf->text, p, &a), lb = nfc(nf->text + p, nf->len - p, &b);
    if ((size_t)(la + lb) != nf->flen || memcmp(a, nf->form, (size_t)la) ||
        memcmp(b, nf->form + la, (size_t)lb))
        fail_msg("a cut at byte %zu splits what NFC joins", p);
    free(a);
    free(b);
    return (size_t)la;
}

struct expect {
    bool min_half;       /* every chunk but the last holds >= C/2 tokens of the whole encoding */
    int min_end_cut;     /* every end but the document's is at least this kind */
    bool start_at_break; /* every start but the first is at white space or CJK punctuation */
};

/* Checks chunks[0..n) of text against chunker.h's contract; returns the number of chunks. */
static int check_split(const struct tok *tok, const char *text, size_t len, int C, int M, struct expect ex)
{
    struct doc_chunk *ch;
    int n;
    char err[512];
    if (chunk_document(tok, text, len, C, M, &ch, &n, err, sizeof err) < 0)
        fail_msg("chunk_document: %s", err);
    /* the whole encoding's token index at each byte of the normalized text that starts a token, else
     * -1; the text the tokens spell is the text itself, or else its NFC form (Qwen3's normalizer;
     * utf8proc is the reference) */
    int32_t *ids;
    size_t nt;
    assert_int_equal(tok_encode_ex(tok, text, len, false, &ids, &nt, err, sizeof err), 0);
    struct norm nf = {.text = text, .len = len, .form = (char *)text, .flen = len};
    size_t pos = 0;
    for (size_t k = 0; k < nt && !nf.nfc; k++) {
        size_t bl;
        const char *b = tok_token_bytes(tok, ids[k], &bl);
        if (pos + bl > len || memcmp(text + pos, b, bl))
            nf.nfc = true;
        pos += bl;
    }
    if (nf.nfc)
        nf.flen = (size_t)nfc(text, len, &nf.form);
    long *tok_at = malloc((nf.flen + 1) * sizeof *tok_at);
    for (size_t i = 0; i <= nf.flen; i++)
        tok_at[i] = -1;
    pos = 0;
    for (size_t k = 0; k < nt; k++) {
        tok_at[pos] = (long)k;
        size_t bl;
        const char *b = tok_token_bytes(tok, ids[k], &bl);
        assert_true(pos + bl <= nf.flen && !memcmp(nf.form + pos, b, bl));
        pos += bl;
    }
    assert_int_equal(pos, nf.flen);
    tok_at[nf.flen] = (long)nt;
    free(ids);

    assert_true(n >= 1);
    assert_int_equal(ch[0].start, 0);
    assert_int_equal(ch[n - 1].end, len);
    for (int i = 0; i < n; i++) {
        const struct doc_chunk *c = &ch[i];
        assert_true(c->start < c->end && c->end <= len);
        for (size_t p = c->start; p <= c->end; p += c->end - c->start) { /* both edges */
            if (p < len && ((unsigned char)text[p] & 0xC0) == 0x80)
                fail_msg("chunk %d cuts inside a character at byte %zu", i, p);
            if (tok_at[norm_pos(&nf, p)] < 0)
                fail_msg("chunk %d cuts inside a token at byte %zu", i, p);
        }
        size_t got = count(tok, text + c->start, c->end - c->start);
        if ((int)got != c->n_tokens || got > (size_t)C)
            fail_msg("chunk %d [%zu, %zu): n_tokens %d, encodes to %zu, limit %d", i, c->start, c->end,
                     c->n_tokens, got, C);
        assert_int_equal(c->end_cut == 0, i == n - 1);
        if (i == n - 1)
            continue;
        const struct doc_chunk *d = &ch[i + 1];
        assert_true(d->start > c->start && d->end > c->end); /* order */
        assert_true(d->start <= c->end);                     /* coverage */
        long overlap = tok_at[norm_pos(&nf, c->end)] - tok_at[norm_pos(&nf, d->start)];
        if (overlap < M || overlap > M + M / 2)
            fail_msg("chunks %d and %d overlap by %ld tokens, not %d..%d", i, i + 1, overlap, M, M + M / 2);
        long held = tok_at[norm_pos(&nf, c->end)] - tok_at[norm_pos(&nf, c->start)];
        if (ex.min_half && held < C / 2)
            fail_msg("chunk %d holds %ld tokens, under half of %d", i, held, C);
        if (c->end_cut < ex.min_end_cut)
            fail_msg("chunk %d ends at a cut of kind %d at byte %zu", i, c->end_cut, c->end);
    }
    /* every start but the first follows white space or CJK punctuation, or precedes white space */
    if (ex.start_at_break) {
        for (int i = 1; i < n; i++) {
            size_t p = ch[i].start;
            bool ws_before = p > 0 && text[p - 1] && strchr(" \n\t", text[p - 1]);
            bool ws_after = p < len && text[p] && strchr(" \n\t", text[p]);
            bool cjk_punct = p >= 3 && (!memcmp(text + p - 3, "。", 3) || !memcmp(text + p - 3, "，", 3) ||
                                        !memcmp(text + p - 3, "！", 3) || !memcmp(text + p - 3, "？", 3) ||
                                        !memcmp(text + p - 3, "；", 3) || !memcmp(text + p - 3, "：", 3) ||
                                        !memcmp(text + p - 3, "、", 3) || !memcmp(text + p - 3, "”", 3));
            if (!ws_before && !ws_after && !cjk_punct)
                fail_msg("chunk %d starts at byte %zu, not at white space or punctuation: \"%.20s\"", i, p,
                         text + p);
        }
    }
    free(tok_at);
    if (nf.nfc)
        free(nf.form);
    free(ch);
    return n;
}

/* <name>-tokenizer from the fetched assets into *t, which stays NULL when it was not fetched (the
 * tests that need it skip). Returns 0, or -1 when it is there but does not load. */
static int load_optional(const char *name, struct tok **t)
{
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s-tokenizer/tokenizer.json", getenv("LLMQ_ASSETS"), name);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    fclose(f);
    *t = tok_load(path, NULL, err, sizeof err);
    if (!*t)
        fprintf(stderr, "tok_load: %s\n", err);
    return *t ? 0 : -1;
}

static int setup(void **state)
{
    char err[512];
    const char *j = test_asset("qwen3-tokenizer/tokenizer.json");
    char jp[4096];
    snprintf(jp, sizeof jp, "%s", j);
    qwen = tok_load(jp, NULL, err, sizeof err);
    if (!qwen) {
        fprintf(stderr, "tok_load: %s\n", err);
        return -1;
    }
    if (load_optional("llama3", &llama) < 0 || load_optional("deepseek_v3", &deepseek) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    tok_free(qwen);
    tok_free(llama);
    tok_free(deepseek);
    return 0;
}

static void split_docs(const struct tok *tok, const char *name)
{
    static const struct {
        bool zh;
        int times, C, M;
    } cases[] = {
        {false, 5, 512, 64}, {false, 50, 512, 64}, {true, 5, 512, 64}, {true, 50, 512, 64},
        {false, 5, 512, 0},  {true, 5, 100, 20},   {false, 5, 64, 31}, {true, 5, 16, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len;
        char *doc = make_doc(tok, cases[i].zh, (size_t)cases[i].times * 512, 0, 42 + i, &len);
        /* with windows of 512 tokens, the last half always holds a paragraph break */
        struct expect ex = {.min_half = true,
                            .min_end_cut = cases[i].C == 512 ? CHUNK_CUT_PARAGRAPH : CHUNK_CUT_TOKEN,
                            .start_at_break = cases[i].M >= 64 || (!cases[i].zh && cases[i].M >= 20)};
        int n = check_split(tok, doc, len, cases[i].C, cases[i].M, ex);
        printf("# %s %s %dx512 tokens (%zu bytes), C=%d M=%d: %d chunks\n", name, cases[i].zh ? "zh" : "en",
               cases[i].times, len, cases[i].C, cases[i].M, n);
        free(doc);
    }
}

static void test_documents_qwen3(void **state)
{
    split_docs(qwen, "qwen3");
}

static void test_documents_llama3(void **state)
{
    if (!llama)
        skip();
    split_docs(llama, "llama3");
}

/* Texts without good breaks: whatever they hold, the contract holds and the split ends. */
static void hostile(const struct tok *tok, const char *name)
{
    struct expect none = {0};
    for (int kind = 0; kind < 9; kind++) {
        struct buf b = {0};
        rng_state = 7 + (uint64_t)kind;
        const char *what = "";
        switch (kind) {
        case 0:
            what = "one 100 KB word";
            for (int i = 0; i < 100000; i++)
                put_cp(&b, 'a' + rnd(26));
            break;
        case 1:
            what = "100 KB of one letter";
            for (int i = 0; i < 100000; i++)
                put_cp(&b, 'a');
            break;
        case 2:
            what = "CJK without punctuation";
            for (int i = 0; i < 30000; i++)
                put_cp(&b, 0x4E00 + rnd(0x5000));
            break;
        case 3:
            what = "emoji and 4-byte CJK";
            for (int i = 0; i < 20000; i++)
                put_cp(&b, rnd(2) ? 0x1F300 + rnd(0x350) : 0x20000 + rnd(0xA000));
            break;
        case 4:
            what = "a word, 100 KB of spaces, a word";
            assert_int_equal(buf_append(&b, "start", 5), 0);
            for (int i = 0; i < 100000; i++)
                put_cp(&b, ' ');
            assert_int_equal(buf_append(&b, "end", 3), 0);
            break;
        case 5:
            what = "50 KB of newlines";
            for (int i = 0; i < 50000; i++)
                put_cp(&b, '\n');
            break;
        case 6:
            what = "random code points";
            for (int i = 0; i < 8000; i++) {
                uint32_t cp = rnd(4) == 0 ? rnd(0x80) : rnd(0x110000);
                if (cp >= 0xD800 && cp < 0xE000)
                    cp = ' ';
                put_cp(&b, cp);
            }
            break;
        case 8:
            what = "decomposed accents (not NFC)";
            for (int i = 0; i < 400; i++) {
                const char *s = rnd(3) ? "Cafe\xcc\x81 cre\xcc\x80me bru\xcc\x82le\xcc\x81"
                                         "e"
                                       : "n\xcc\x83o\xcc\x88";
                assert_int_equal(buf_append(&b, s, strlen(s)), 0);
                assert_int_equal(buf_append(&b, rnd(5) ? ". " : ".\n\n", rnd(5) ? 2 : 3), 0);
            }
            break;
        case 7:
            what = "one sentence";
            assert_int_equal(buf_append(&b, english[0], strlen(english[0])), 0);
            break;
        }
        int n = check_split(tok, b.p, b.len, 64, 8, none);
        if (kind == 7)
            assert_int_equal(n, 1);
        printf("# %s %s (%zu bytes): %d chunks\n", name, what, b.len, n);
        buf_free(&b);
    }
}

static void test_hostile_qwen3(void **state)
{
    hostile(qwen, "qwen3");
}

/* A chunk that starts at "'thing" after "。" re-encodes to one token more than its slice of the
 * whole encoding (alone, "'t" is taken as a contraction): with windows of every size, some chunks
 * must be shrunk to stay within chunk_tokens. */
static void test_reencoding_grows(void **state)
{
    struct buf b = {0};
    for (int i = 0; i < 200; i++)
        assert_int_equal(buf_puts(&b, i % 3 ? "\xe4\xb8\xad\xe6\x96\x87\xe3\x80\x82'thing"
                                            : "\xe6\x96\x87\xe3\x80\x82'thing-)"),
                         0);
    struct expect none = {0};
    for (int C = 16; C <= 48; C++)
        for (int M = 0; M <= 4; M += 4)
            check_split(qwen, b.p, b.len, C, M, none);
    buf_free(&b);
}

static void test_hostile_llama3(void **state)
{
    if (!llama)
        skip();
    hostile(llama, "llama3");
}

static void test_documents_deepseek_v3(void **state)
{
    if (!deepseek)
        skip();
    split_docs(deepseek, "deepseek_v3");
}

static void test_hostile_deepseek_v3(void **state)
{
    if (!deepseek)
        skip();
    hostile(deepseek, "deepseek_v3");
}

static void test_refusals(void **state)
{
    struct doc_chunk *ch = (void *)1;
    int n = -1;
    char err[512];
    const char *t = "Hello world.";
    assert_int_equal(chunk_document(qwen, t, strlen(t), 15, 0, &ch, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "chunk_tokens must be at least 16"));
    assert_int_equal(chunk_document(qwen, t, strlen(t), 64, 32, &ch, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "overlap_tokens"));
    assert_int_equal(chunk_document(qwen, t, strlen(t), 64, -1, &ch, &n, err, sizeof err), -1);
    assert_int_equal(chunk_document(qwen, "ab\xff", 3, 64, 8, &ch, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "byte 2"));
    assert_null(ch);
    assert_int_equal(n, 0);
    /* an empty text has no chunks */
    ch = (void *)1;
    assert_int_equal(chunk_document(qwen, "", 0, 64, 8, &ch, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_null(ch);
}

struct thread_arg {
    const char *doc;
    size_t len;
    struct doc_chunk *ch;
    int n;
};

static void *split_thread(void *p)
{
    struct thread_arg *a = p;
    char err[256];
    if (chunk_document(qwen, a->doc, a->len, 256, 32, &a->ch, &a->n, err, sizeof err) < 0)
        a->n = -1;
    return NULL;
}

/* Two threads on one tokenizer get what one thread gets. */
static void test_threads(void **state)
{
    size_t len;
    char *doc = make_doc(qwen, false, 20 * 512, 0, 99, &len);
    struct thread_arg a[3] = {{doc, len, NULL, 0}, {doc, len, NULL, 0}, {doc, len, NULL, 0}};
    split_thread(&a[2]);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, split_thread, &a[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_true(a[2].n > 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(a[i].n, a[2].n);
        assert_memory_equal(a[i].ch, a[2].ch, (size_t)a[2].n * sizeof *a[2].ch);
        free(a[i].ch);
    }
    free(a[2].ch);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_documents_qwen3),
        cmocka_unit_test(test_hostile_qwen3),
        cmocka_unit_test(test_reencoding_grows),
        cmocka_unit_test(test_documents_llama3),
        cmocka_unit_test(test_hostile_llama3),
        cmocka_unit_test(test_documents_deepseek_v3),
        cmocka_unit_test(test_hostile_deepseek_v3),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
