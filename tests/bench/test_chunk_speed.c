/* What splitting a long document costs (worker/jobs/chunker.h): chunk_document over generated 1 MiB
 * English and Chinese documents (few distinct words, so the tokenizer's cache answers most of them)
 * and of random words (which it does not) with the Qwen3 tokenizer, in chunks of 512 tokens (64 shared) and
 * of 8192 (256 shared). Prints seconds per document and MB/s; asserts only that the split succeeds, never a
 * time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "chunk_docs.h"
#include "engine/util/mono.h"
#include "testutil.h"
#include "worker/jobs/chunker.h"

/* About bytes of random lowercase words of 1..12 letters in sentences and paragraphs. */
static char *random_words(size_t bytes, size_t *len)
{
    struct buf b = {0};
    rng_state = 11;
    while (b.len < bytes) {
        int letters = 1 + (int)rnd(12);
        for (int i = 0; i < letters; i++)
            assert_int_equal(buf_append(&b, &"abcdefghijklmnopqrstuvwxyz"[rnd(26)], 1), 0);
        static const char *after[] = {" ", " ", " ", " ", " ", " ", ", ", ". ", ".\n\n"};
        const char *a = after[rnd(sizeof after / sizeof *after)];
        assert_int_equal(buf_append(&b, a, strlen(a)), 0);
    }
    *len = b.len;
    return b.p;
}

static void test_speed(void **state)
{
    char err[512];
    struct tok *tok = tok_load(test_asset("qwen3-tokenizer/tokenizer.json"), NULL, err, sizeof err);
    if (!tok)
        fail_msg("tok_load: %s", err);
    static const int sizes[][2] = {{512, 64}, {8192, 256}};
    static const char *kinds[] = {"en", "zh", "random-words"};
    for (int kind = 0; kind < 3; kind++) {
        size_t len;
        char *doc = kind < 2 ? make_doc(NULL, kind == 1, 0, 1 << 20, 5, &len) : random_words(1 << 20, &len);
        for (int k = 0; k < 2; k++) {
            struct doc_chunk *ch;
            int n;
            double t0 = llmq_mono_s();
            if (chunk_document(tok, doc, len, sizes[k][0], sizes[k][1], &ch, &n, err, sizeof err) < 0)
                fail_msg("chunk_document: %s", err);
            double dt = llmq_mono_s() - t0;
            printf("bench-chunker qwen3 %s %zu bytes, chunks of %d (%d shared): %d chunks in %.3f s (%.1f "
                   "MB/s)\n",
                   kinds[kind], len, sizes[k][0], sizes[k][1], n, dt, (double)len / dt / 1e6);
            free(ch);
        }
        free(doc);
    }
    tok_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
