/* engine/safetensors.c: a round trip through the writer, and a hand-made broken file for every error
 * path of the header parser, the shard index and the checked lookup; each message is checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/safetensors.h"
#include "engine/util/scratch_dir.h"
#include "testutil.h"

static char tmpdir[256];

static void path_of(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
}

static void write_bytes(const char *name, const void *data, size_t n)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A safetensors file with a literal header (length computed) and n_data bytes of data 0, 1, 2, ... */
static size_t make_raw(uint8_t *buf, const char *header, size_t n_data)
{
    size_t h = strlen(header);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < n_data; i++)
        buf[8 + h + i] = (uint8_t)i;
    return 8 + h + n_data;
}

static void write_raw(const char *name, const char *header, size_t n_data)
{
    static uint8_t buf[1 << 16];
    write_bytes(name, buf, make_raw(buf, header, n_data));
}

static void expect_contains(const char *err, const char *needle)
{
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not contain \"%s\"", err, needle);
}

/* Parses a header from memory and expects an error containing each of the given fragments. */
static void expect_parse_error(const char *header, size_t n_data, const char *needle, const char *needle2)
{
    static uint8_t buf[1 << 16];
    size_t n = make_raw(buf, header, n_data);
    struct st_tensor *t = (void *)1;
    int count = -1;
    char err[512] = "";
    assert_int_equal(st_parse_header(buf, n, "x.safetensors", &t, &count, err, sizeof err), -1);
    assert_null(t);
    assert_int_equal(count, 0);
    expect_contains(err, "x.safetensors");
    expect_contains(err, needle);
    if (needle2)
        expect_contains(err, needle2);
}

static int setup(void **state)
{
    assert_int_equal(scratch_dir_make(getenv("TMPDIR"), "test-st", tmpdir, sizeof tmpdir), 0);
    return 0;
}

static int teardown(void **state)
{
    return test_remove_tree(tmpdir);
}

/* Removes every file of tmpdir between tests. */
static void clean(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*", tmpdir);
    assert_int_equal(system(cmd), 0);
}

static void test_round_trip(void **state)
{
    clean();
    uint16_t a[6] = {1, 2, 3, 4, 5, 6};
    float b[3] = {1.5f, -2.0f, 0.25f};
    uint8_t c[5] = {0x38, 0x40, 0x7e, 0xfe, 0};
    int64_t d[1] = {-7};
    struct st_write w[] = {
        {"w.a", DT_BF16, 2, {2, 3}, a},       {"w.b", DT_F32, 1, {3}, b},
        {"w.c", DT_F8_E4M3, 3, {1, 1, 5}, c}, {"scalar", DT_I64, 0, {0}, d},
        {"empty", DT_F16, 2, {0, 4}, NULL},
    };
    char p[512], err[512];
    path_of(p, sizeof p, "rt.safetensors");
    assert_int_equal(st_write_file(p, w, 5, err, sizeof err), 0);
    const char *paths[] = {p};
    struct st_set *s = st_open_files(paths, 1, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_int_equal(s->n_tensors, 5);
    assert_int_equal(s->files[0].n_tensors, 5);
    for (int i = 0; i < 5; i++) {
        const struct st_tensor *t = st_find(s, w[i].name);
        assert_non_null(t);
        assert_ptr_equal(t, &s->files[0].tensors[i]); /* header order kept */
        assert_string_equal(t->view.name, w[i].name);
        assert_int_equal(t->view.dtype, w[i].dtype);
        assert_int_equal(t->view.ndim, w[i].ndim);
        size_t bytes = dtype_size(w[i].dtype);
        for (int k = 0; k < w[i].ndim; k++) {
            assert_int_equal(t->view.shape[k], w[i].shape[k]);
            bytes *= (size_t)w[i].shape[k];
        }
        assert_int_equal(t->end - t->begin, bytes);
        if (bytes)
            assert_memory_equal(t->view.data, w[i].data, bytes);
        assert_null(t->view.scale_inv);
        assert_string_equal(st_file_name(s, t), "rt.safetensors");
    }
    assert_null(st_find(s, "w"));
    assert_null(st_find(s, "w.a "));
    /* the header is padded to 8 bytes and the data section starts right after it */
    const uint8_t *m = s->files[0].map;
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)m[i] << (8 * i);
    assert_int_equal(h % 8, 0);
    assert_int_equal(m[8], '{');
    assert_ptr_equal(st_find(s, "w.a")->view.data, m + 8 + h);
    assert_int_equal(s->files[0].size, 8 + h + 12 + 12 + 5 + 8);
    st_free(s);
    /* the same input gives the same bytes */
    char p2[512];
    path_of(p2, sizeof p2, "rt2.safetensors");
    assert_int_equal(st_write_file(p2, w, 5, err, sizeof err), 0);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", p, p2);
    assert_int_equal(system(cmd), 0);
    /* writing a name twice is refused */
    struct st_write twice[] = {{"x", DT_F32, 1, {3}, b}, {"x", DT_F32, 1, {3}, b}};
    assert_int_equal(st_write_file(p2, twice, 2, err, sizeof err), -1);
    expect_contains(err, "x written twice");
}

static void test_parse_ok_variants(void **state)
{
    static uint8_t buf[4096];
    /* metadata ignored; overlapping and unsorted offsets accepted; trailing spaces */
    size_t n = make_raw(buf,
                        "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"},"
                        "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"c\":{\"dtype\":\"I32\",\"shape\":[1,1,1,1],\"data_offsets\":[2,6]}}   ",
                        8);
    struct st_tensor *t;
    int count;
    char err[512];
    assert_int_equal(st_parse_header(buf, n, "ok.safetensors", &t, &count, err, sizeof err), 0);
    assert_int_equal(count, 3);
    assert_string_equal(t[0].view.name, "b");
    assert_int_equal(t[0].begin, 4);
    assert_string_equal(t[1].view.name, "a");
    assert_int_equal(t[2].view.ndim, 4);
    assert_ptr_equal(t[1].view.data, buf + n - 8);
    st_tensors_free(t, count);
    /* an empty header object is a file without tensors */
    n = make_raw(buf, "{}", 0);
    assert_int_equal(st_parse_header(buf, n, "e.safetensors", &t, &count, err, sizeof err), 0);
    assert_int_equal(count, 0);
    st_tensors_free(t, count);
}

static void test_parse_errors(void **state)
{
    static uint8_t buf[64];
    struct st_tensor *t;
    int count;
    char err[512];
    /* shorter than the length field */
    assert_int_equal(st_parse_header(buf, 5, "x.safetensors", &t, &count, err, sizeof err), -1);
    expect_contains(err, "x.safetensors: 5 bytes, too short");
    /* header length beyond the file */
    make_raw(buf, "{}", 0);
    buf[0] = 200;
    assert_int_equal(st_parse_header(buf, 10, "x.safetensors", &t, &count, err, sizeof err), -1);
    expect_contains(err, "x.safetensors: header length 200 is beyond the end of the file (10 bytes");
    /* header length over the format's limit */
    memset(buf, 0, 8);
    buf[3] = 0x10; /* 2^28 */
    assert_int_equal(st_parse_header(buf, 10, "x.safetensors", &t, &count, err, sizeof err), -1);
    expect_contains(err, "header length 268435456 is over the limit");
    buf[7] = 0x80; /* 2^63 + 2^28: no overflow in the checks */
    assert_int_equal(st_parse_header(buf, 10, "x.safetensors", &t, &count, err, sizeof err), -1);
    expect_contains(err, "over the limit");

    expect_parse_error("{\"a\": ", 0, "header is not valid JSON", NULL);
    expect_parse_error("", 0, "header is not valid JSON", NULL);
    expect_parse_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
                       "not valid JSON", NULL);
    expect_parse_error("[1, 2]", 0, "header is not a JSON object", NULL);
    expect_parse_error("{\"a\": 3}", 0, "a in x.safetensors: header entry is not an object", NULL);
    /* offsets out of the file (the data section has 8 bytes) */
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                       "w in x.safetensors: data_offsets [0, 16] beyond the data section (8 bytes", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                       "data_offsets [8, 4] end before they begin", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8,
                       "\"data_offsets\" must be", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8,
                       "\"data_offsets\" must be", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4]}}", 8,
                       "\"data_offsets\" must be", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 8, "\"data_offsets\" must be", NULL);
    /* element count times dtype size differs from the byte span */
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
                       "w in x.safetensors: shape [2, 3] of F32 needs 24 bytes, data_offsets span 20", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                       "w in x.safetensors: shape [1] of F32 needs 4 bytes, data_offsets span 8", NULL);
    expect_parse_error(
        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8,
        "shape overflows", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"BF16\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}",
                       8, "needs", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                       "w in x.safetensors: unsupported dtype 'F64'", NULL);
    expect_parse_error("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                       "\"dtype\" is missing", NULL);
    expect_parse_error("{\"w\":{\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "\"dtype\" is missing", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 8,
                       "w in x.safetensors: 5 dimensions, at most 4", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,-1],\"data_offsets\":[0,1]}}", 8,
                       "shape[1] is not a non-negative integer", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 8,
                       "shape[0] is not a non-negative integer", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 8,
                       "\"shape\" is missing or not an array", NULL);
    expect_parse_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                       "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                       8, "duplicate tensor name", "\"w\"");
}

static void test_file_errors(void **state)
{
    clean();
    char p[512], err[512];
    const char *paths[] = {p};
    path_of(p, sizeof p, "missing.safetensors");
    assert_null(st_open_files(paths, 1, err, sizeof err));
    expect_contains(err, "missing.safetensors: No such file or directory");
    write_bytes("empty.safetensors", "", 0);
    path_of(p, sizeof p, "empty.safetensors");
    assert_null(st_open_files(paths, 1, err, sizeof err));
    expect_contains(err, "empty.safetensors: 0 bytes, too short");
    /* a file cut short inside its data section */
    write_raw("cut.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 10);
    path_of(p, sizeof p, "cut.safetensors");
    assert_null(st_open_files(paths, 1, err, sizeof err));
    expect_contains(
        err,
        "w in cut.safetensors: data_offsets [0, 16] beyond the data section (10 bytes; file truncated?)");
    /* a file cut inside its header */
    write_raw("cuthdr.safetensors", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "truncate -s 30 '%s/cuthdr.safetensors'", tmpdir);
    assert_int_equal(system(cmd), 0);
    path_of(p, sizeof p, "cuthdr.safetensors");
    assert_null(st_open_files(paths, 1, err, sizeof err));
    expect_contains(
        err, "cuthdr.safetensors: header length 55 is beyond the end of the file (30 bytes; truncated?)");
    /* a folder is not a file */
    snprintf(p, sizeof p, "%s", tmpdir);
    assert_null(st_open_files(paths, 1, err, sizeof err));
    expect_contains(err, "not a regular file");
}

static const char *const W1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}";
static const char *const W2 = "{\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}";

static void write_index(const char *body)
{
    write_bytes("model.safetensors.index.json", body, strlen(body));
}

static void test_dir_and_index(void **state)
{
    clean();
    char err[512];
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, ": no model.safetensors or model.safetensors.index.json");

    /* sharded */
    write_raw("model-00001-of-00002.safetensors", W1, 16);
    write_raw("model-00002-of-00002.safetensors", W2, 6);
    write_index(
        "{\"metadata\":{\"total_size\":22},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
        "\"c\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\"}}");
    struct st_set *s = st_open_dir(tmpdir, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_int_equal(s->n_files, 2);
    assert_int_equal(s->n_tensors, 3);
    assert_string_equal(s->source, "model.safetensors.index.json");
    assert_string_equal(st_file_name(s, st_find(s, "c")), "model-00002-of-00002.safetensors");
    assert_string_equal(st_file_name(s, st_find(s, "b")), "model-00001-of-00002.safetensors");
    struct tensor_view v;
    int64_t shape[2] = {2, 2};
    assert_int_equal(st_get(s, "b", DT_MASK(DT_BF16), 2, shape, &v, err, sizeof err), 0);
    assert_string_equal(v.name, "b");
    assert_int_equal(((const uint8_t *)v.data)[0], 8); /* data bytes count from the section's start */
    /* checked lookup errors */
    assert_int_equal(st_get(s, "zz", ST_FLOAT_MASK, 1, shape, &v, err, sizeof err), -1);
    assert_string_equal(err, "zz: missing (not in model.safetensors.index.json)");
    assert_int_equal(st_get(s, "b", DT_MASK(DT_F32) | DT_MASK(DT_F16), 2, shape, &v, err, sizeof err), -1);
    assert_string_equal(err, "b in model-00001-of-00002.safetensors: dtype BF16, expected F32|F16");
    int64_t wrong[2] = {4, 1};
    assert_int_equal(st_get(s, "b", ST_FLOAT_MASK, 2, wrong, &v, err, sizeof err), -1);
    assert_string_equal(err, "b in model-00001-of-00002.safetensors: shape [2, 2], expected [4, 1]");
    assert_int_equal(st_get(s, "b", ST_FLOAT_MASK, 1, wrong, &v, err, sizeof err), -1);
    assert_string_equal(err, "b in model-00001-of-00002.safetensors: shape [2, 2], expected [4]");
    int64_t any[2] = {-1, 2};
    assert_int_equal(st_get(s, "b", ST_FLOAT_MASK, 2, any, NULL, err, sizeof err), 0);
    st_free(s);

    /* model.safetensors wins over an index */
    write_raw("model.safetensors", W2, 6);
    s = st_open_dir(tmpdir, err, sizeof err);
    assert_non_null(s);
    assert_string_equal(s->source, "model.safetensors");
    assert_int_equal(s->n_tensors, 1);
    assert_int_equal(st_get(s, "a", ST_FLOAT_MASK, 1, shape, &v, err, sizeof err), -1);
    assert_string_equal(err, "a: missing (not in model.safetensors)");
    st_free(s);
    clean();

    /* a shard the index names is missing */
    write_raw("model-00001-of-00002.safetensors", W1, 16);
    write_index("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                "\"c\":\"model-00002-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "model-00002-of-00002.safetensors: No such file or directory (a shard listed in "
                         "model.safetensors.index.json)");
    /* the index maps a tensor to a shard that does not have it */
    write_raw("model-00002-of-00002.safetensors", W2, 6);
    write_index("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                "\"x\":\"model-00002-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    assert_string_equal(
        err, "model.safetensors.index.json: x is mapped to model-00002-of-00002.safetensors, which "
             "has no such tensor");
    write_index("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                "\"b\":\"model-00002-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    assert_string_equal(
        err, "model.safetensors.index.json: b is mapped to model-00002-of-00002.safetensors, but it "
             "is in model-00001-of-00002.safetensors");
    /* a tensor in two shards */
    write_raw("model-00002-of-00002.safetensors", W1, 16);
    write_index("{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                "\"b\":\"model-00002-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    assert_string_equal(err,
                        "a is in both model-00001-of-00002.safetensors and model-00002-of-00002.safetensors");
    /* shard names must stay in the folder */
    write_index("{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "weight_map[\"a\"] must be the file name of a shard");
    write_index("{\"weight_map\":{\"a\":7}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "weight_map[\"a\"] must be the file name of a shard");
    write_index("{\"weight_map\":{}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "\"weight_map\" is missing, empty or not an object");
    write_index("{\"metadata\":{}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "\"weight_map\" is missing");
    write_index("{\"weight_map\":");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err, "model.safetensors.index.json: ");
    /* a broken shard is reported with its name */
    write_raw("model-00002-of-00002.safetensors",
              "{\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 4);
    write_index("{\"weight_map\":{\"c\":\"model-00002-of-00002.safetensors\"}}");
    assert_null(st_open_dir(tmpdir, err, sizeof err));
    expect_contains(err,
                    "c in model-00002-of-00002.safetensors: data_offsets [0, 6] beyond the data section");
}

static void test_many_tensors(void **state)
{
    clean();
    enum { N = 3000 };
    static struct st_write w[N];
    static char names[N][32];
    static float vals[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.w", i);
        vals[i] = (float)i;
        w[i] = (struct st_write){names[i], DT_F32, 1, {1}, &vals[i]};
    }
    char p[512], err[512];
    path_of(p, sizeof p, "many.safetensors");
    assert_int_equal(st_write_file(p, w, N, err, sizeof err), 0);
    const char *paths[] = {p};
    struct st_set *s = st_open_files(paths, 1, err, sizeof err);
    assert_non_null(s);
    for (int i = 0; i < N; i++) {
        const struct st_tensor *t = st_find(s, names[i]);
        assert_non_null(t);
        float f;
        memcpy(&f, t->view.data, 4);
        assert_true(f == (float)i);
    }
    assert_null(st_find(s, "model.layers.3000.w"));
    st_free(s);
    st_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_parse_ok_variants),
        cmocka_unit_test(test_parse_errors),  cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_dir_and_index), cmocka_unit_test(test_many_tensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
