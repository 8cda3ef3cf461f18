/* See safetensors.h. */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/util/errfmt.h"
#include "engine/util/hash.h"

char *st_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t o = 0;
    o += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

/* ---- header parsing ---- */

/* A JSON integer >= 0 into *out; -1 if it is not one. */
static int json_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Checks one header entry and fills t (name excepted). */
static int parse_entry(const char *fname, const char *name, const json_t *v, const uint8_t *data,
                       uint64_t dlen, struct st_tensor *t, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return errfmt(err, errlen, "%s in %s: header entry is not an object", name, fname);
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
                 *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd))
        return errfmt(err, errlen, "%s in %s: \"dtype\" is missing or not a string", name, fname);
    if (dtype_parse(json_string_value(jd), &t->view.dtype) < 0)
        return errfmt(err, errlen, "%s in %s: unsupported dtype '%s'", name, fname, json_string_value(jd));
    if (!json_is_array(js))
        return errfmt(err, errlen, "%s in %s: \"shape\" is missing or not an array", name, fname);
    if (json_array_size(js) > ST_MAX_DIMS)
        return errfmt(err, errlen, "%s in %s: %zu dimensions, at most %d supported", name, fname,
                      json_array_size(js), ST_MAX_DIMS);
    t->view.ndim = (int)json_array_size(js);
    uint64_t numel = 1;
    for (int i = 0; i < t->view.ndim; i++) {
        uint64_t d;
        if (json_uint(json_array_get(js, (size_t)i), &d) < 0)
            return errfmt(err, errlen, "%s in %s: shape[%d] is not a non-negative integer", name, fname, i);
        t->view.shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(numel, d, &numel))
            return errfmt(err, errlen, "%s in %s: shape overflows", name, fname);
    }
    if (!json_is_array(jo) || json_array_size(jo) != 2 || json_uint(json_array_get(jo, 0), &t->begin) < 0 ||
        json_uint(json_array_get(jo, 1), &t->end) < 0)
        return errfmt(err, errlen,
                      "%s in %s: \"data_offsets\" must be [begin, end] with non-negative integers", name,
                      fname);
    if (t->begin > t->end)
        return errfmt(err, errlen, "%s in %s: data_offsets [%llu, %llu] end before they begin", name, fname,
                      (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > dlen)
        return errfmt(
            err, errlen,
            "%s in %s: data_offsets [%llu, %llu] beyond the data section (%llu bytes; file truncated?)", name,
            fname, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)dlen);
    uint64_t bytes;
    char sh[128];
    if (__builtin_mul_overflow(numel, (uint64_t)dtype_size(t->view.dtype), &bytes) ||
        bytes != t->end - t->begin)
        return errfmt(err, errlen, "%s in %s: shape %s of %s needs %llu bytes, data_offsets span %llu", name,
                      fname, st_shape_str(t->view.ndim, t->view.shape, sh, sizeof sh),
                      dtype_name(t->view.dtype), (unsigned long long)numel * dtype_size(t->view.dtype),
                      (unsigned long long)(t->end - t->begin));
    t->view.data = data + t->begin;
    t->view.scale_inv = NULL;
    t->view.block[0] = t->view.block[1] = 0;
    return 0;
}

void st_tensors_free(struct st_tensor *tensors, int n)
{
    if (!tensors)
        return;
    for (int i = 0; i < n; i++)
        free((char *)tensors[i].view.name);
    free(tensors);
}

int st_parse_header(const void *buf, size_t len, const char *fname, struct st_tensor **tensors, int *n,
                    char *err, size_t errlen)
{
    const uint8_t *p = buf;
    *tensors = NULL;
    *n = 0;
    if (len < 8)
        return errfmt(err, errlen, "%s: %zu bytes, too short for the 8-byte header length (truncated?)",
                      fname, len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)p[i] << (8 * i);
    if (hlen > ST_MAX_HEADER)
        return errfmt(err, errlen, "%s: header length %llu is over the limit of %u bytes", fname,
                      (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > len - 8)
        return errfmt(err, errlen,
                      "%s: header length %llu is beyond the end of the file (%zu bytes; truncated?)", fname,
                      (unsigned long long)hlen, len);
    json_error_t je;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (!strncmp(je.text, "duplicate object key", 20))
            return errfmt(err, errlen, "%s: duplicate tensor name in the header (%s)", fname, je.text);
        return errfmt(err, errlen, "%s: header is not valid JSON: %s (at byte %d of the header)", fname,
                      je.text, je.position);
    }
    int rc = 0;
    struct st_tensor *ts = NULL;
    int count = 0;
    if (!json_is_object(root)) {
        rc = errfmt(err, errlen, "%s: header is not a JSON object", fname);
        goto out;
    }
    ts = calloc(json_object_size(root) + 1, sizeof *ts);
    if (!ts) {
        rc = errfmt(err, errlen, "%s: out of memory", fname);
        goto out;
    }
    const uint8_t *data = p + 8 + hlen;
    uint64_t dlen = len - 8 - hlen;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        struct st_tensor *t = &ts[count];
        if (parse_entry(fname, key, val, data, dlen, t, err, errlen) < 0) {
            rc = -1;
            goto out;
        }
        t->view.name = strdup(key);
        if (!t->view.name) {
            rc = errfmt(err, errlen, "%s: out of memory", fname);
            goto out;
        }
        count++;
    }
out:
    json_decref(root);
    if (rc < 0) {
        st_tensors_free(ts, count);
        return rc;
    }
    *tensors = ts;
    *n = count;
    return 0;
}

/* ---- files and sets ---- */

static uint64_t hash_name(const char *s)
{
    return fnv1a_str(FNV1A_INIT, s);
}

static struct st_tensor **slot_of(const struct st_set *s, const char *name)
{
    size_t mask = s->n_slots - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask)
        if (!s->slots[i] || !strcmp(s->slots[i]->view.name, name))
            return &s->slots[i];
}

const struct st_tensor *st_find(const struct st_set *s, const char *name)
{
    if (!s->slots)
        return NULL;
    return *slot_of(s, name);
}

const char *st_file_name(const struct st_set *s, const struct st_tensor *t)
{
    return s->files[t->file].name;
}

static int open_file(const char *path, struct st_file *f, char *err, size_t errlen)
{
    f->path = strdup(path);
    if (!f->path)
        return errfmt(err, errlen, "out of memory");
    const char *slash = strrchr(f->path, '/');
    f->name = slash ? slash + 1 : f->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errfmt(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return errfmt(err, errlen, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return errfmt(err, errlen, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return errfmt(err, errlen, "%s: %lld bytes, too short for the 8-byte header length (truncated?)",
                      f->name, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return errfmt(err, errlen, "%s: mmap: %s", path, strerror(e));
    f->map = map;
    f->size = (size_t)st.st_size;
    return st_parse_header(map, f->size, f->name, &f->tensors, &f->n_tensors, err, errlen);
}

void st_free(struct st_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_files; i++) {
        struct st_file *f = &s->files[i];
        st_tensors_free(f->tensors, f->n_tensors);
        if (f->map)
            munmap(f->map, f->size);
        free(f->path);
    }
    free(s->files);
    free(s->slots);
    free(s->dir);
    free(s);
}

/* st_open_files; when listed_in is set, a file that cannot be opened is said to be a shard listed there. */
static struct st_set *open_set(const char *const *paths, int n, const char *listed_in, char *err,
                               size_t errlen)
{
    struct st_set *s = calloc(1, sizeof *s);
    if (!s || !(s->files = calloc((size_t)n + 1, sizeof *s->files))) {
        free(s);
        errfmt(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        s->n_files = i + 1;
        if (open_file(paths[i], &s->files[i], err, errlen) < 0) {
            size_t l = strlen(err);
            if (listed_in && l < errlen)
                snprintf(err + l, errlen - l, " (a shard listed in %s)", listed_in);
            goto fail;
        }
        for (int j = 0; j < s->files[i].n_tensors; j++)
            s->files[i].tensors[j].file = i;
        s->n_tensors += s->files[i].n_tensors;
    }
    s->n_slots = 16;
    while (s->n_slots < 2 * (size_t)s->n_tensors)
        s->n_slots *= 2;
    s->slots = calloc(s->n_slots, sizeof *s->slots);
    if (!s->slots) {
        errfmt(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < s->n_files; i++)
        for (int j = 0; j < s->files[i].n_tensors; j++) {
            struct st_tensor *t = &s->files[i].tensors[j];
            struct st_tensor **slot = slot_of(s, t->view.name);
            if (*slot) {
                errfmt(err, errlen, "%s is in both %s and %s", t->view.name, s->files[(*slot)->file].name,
                       s->files[i].name);
                goto fail;
            }
            *slot = t;
        }
    return s;
fail:
    st_free(s);
    return NULL;
}

struct st_set *st_open_files(const char *const *paths, int n, char *err, size_t errlen)
{
    return open_set(paths, n, NULL, err, errlen);
}

static const char INDEX_NAME[] = "model.safetensors.index.json";
static const char SINGLE_NAME[] = "model.safetensors";

static bool plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* The shards of an index, then checks every weight_map entry against them. */
static struct st_set *open_index(const char *dir, const char *index_path, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line > 0)
            errfmt(err, errlen, "%s: %s (line %d)", index_path, je.text, je.line);
        else /* the file could not be read: jansson's text names it */
            errfmt(err, errlen, "%s", je.text);
        return NULL;
    }
    struct st_set *s = NULL;
    char **paths = NULL;
    int n_paths = 0;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        errfmt(err, errlen, "%s: \"weight_map\" is missing, empty or not an object", INDEX_NAME);
        goto out;
    }
    paths = calloc(json_object_size(map), sizeof *paths);
    if (!paths) {
        errfmt(err, errlen, "out of memory");
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v)
    {
        const char *file = json_string_value(v);
        if (!file || !plain_file_name(file)) {
            errfmt(err, errlen, "%s: weight_map[\"%s\"] must be the file name of a shard in the same folder",
                   INDEX_NAME, name);
            goto out;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        int k = 0;
        while (k < n_paths && strcmp(paths[k], path))
            k++;
        if (k == n_paths && !(paths[n_paths++] = strdup(path))) {
            errfmt(err, errlen, "out of memory");
            goto out;
        }
    }
    s = open_set((const char *const *)paths, n_paths, INDEX_NAME, err, errlen);
    if (!s)
        goto out;
    json_object_foreach(map, name, v)
    {
        const struct st_tensor *t = st_find(s, name);
        const char *file = json_string_value(v);
        if (!t || strcmp(st_file_name(s, t), file)) {
            if (t)
                errfmt(err, errlen, "%s: %s is mapped to %s, but it is in %s", INDEX_NAME, name, file,
                       st_file_name(s, t));
            else
                errfmt(err, errlen, "%s: %s is mapped to %s, which has no such tensor", INDEX_NAME, name,
                       file);
            st_free(s);
            s = NULL;
            goto out;
        }
    }
out:
    for (int i = 0; i < n_paths; i++)
        free(paths[i]);
    free(paths);
    json_decref(root);
    return s;
}

struct st_set *st_open_dir(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    struct st_set *s = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, SINGLE_NAME);
    if (stat(path, &st) == 0) {
        const char *p = path;
        s = st_open_files(&p, 1, err, errlen);
        if (s)
            s->source = SINGLE_NAME;
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
        if (stat(path, &st) != 0) {
            errfmt(err, errlen, "%s: no %s or %s", dir, SINGLE_NAME, INDEX_NAME);
            return NULL;
        }
        s = open_index(dir, path, err, errlen);
        if (s)
            s->source = INDEX_NAME;
    }
    if (s && !(s->dir = strdup(dir))) {
        st_free(s);
        errfmt(err, errlen, "out of memory");
        return NULL;
    }
    return s;
}

/* ---- checked lookup ---- */

static char *mask_str(unsigned mask, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int t = 0; t < 32 && o < len; t++)
        if ((mask & DT_MASK(t)) && dtype_name((enum dtype)t))
            o += (size_t)snprintf(buf + o, len - o, "%s%s", o ? "|" : "", dtype_name((enum dtype)t));
    return buf;
}

int st_get(const struct st_set *s, const char *name, unsigned dtype_mask, int ndim, const int64_t *shape,
           struct tensor_view *out, char *err, size_t errlen)
{
    const struct st_tensor *t = st_find(s, name);
    if (!t) {
        if (s->source)
            return errfmt(err, errlen, "%s: missing (not in %s)", name, s->source);
        return errfmt(err, errlen, "%s: missing (not in %s%s)", name,
                      s->n_files ? s->files[0].name : "no files",
                      s->n_files > 1 ? " or the other files" : "");
    }
    const char *file = st_file_name(s, t);
    if (!(dtype_mask & DT_MASK(t->view.dtype))) {
        char want[128];
        return errfmt(err, errlen, "%s in %s: dtype %s, expected %s", name, file, dtype_name(t->view.dtype),
                      mask_str(dtype_mask, want, sizeof want));
    }
    bool ok = t->view.ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] < 0 || shape[i] == t->view.shape[i];
    if (!ok) {
        char got[128], want[128];
        int64_t w[ST_MAX_DIMS];
        int wn = ndim < ST_MAX_DIMS ? ndim : ST_MAX_DIMS;
        for (int i = 0; i < wn; i++)
            w[i] = shape[i];
        return errfmt(err, errlen, "%s in %s: shape %s, expected %s", name, file,
                      st_shape_str(t->view.ndim, t->view.shape, got, sizeof got),
                      st_shape_str(wn, w, want, sizeof want));
    }
    if (out)
        *out = t->view;
    return 0;
}

/* ---- writing ---- */

int st_write_file(const char *path, const struct st_write *t, int n, char *err, size_t errlen)
{
    json_t *root = json_object(), *meta = json_object();
    if (!root || !meta || json_object_set_new(meta, "format", json_string("pt")) ||
        json_object_set_new(root, "__metadata__", meta)) {
        json_decref(root);
        return errfmt(err, errlen, "%s: out of memory", path);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        json_t *shape = json_array(), *offs = json_array(), *e = json_object();
        for (int d = 0; d < t[i].ndim; d++) {
            numel *= (uint64_t)t[i].shape[d];
            json_array_append_new(shape, json_integer(t[i].shape[d]));
        }
        uint64_t bytes = numel * dtype_size(t[i].dtype);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
        off += bytes;
        json_object_set_new(e, "dtype", json_string(dtype_name(t[i].dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_get(root, t[i].name)) {
            json_decref(e);
            json_decref(root);
            return errfmt(err, errlen, "%s: tensor %s written twice", path, t[i].name);
        }
        json_object_set_new(root, t[i].name, e);
    }
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr)
        return errfmt(err, errlen, "%s: out of memory", path);
    size_t hlen = strlen(hdr), padded = (hlen + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return errfmt(err, errlen, "%s: %s", path, strerror(errno));
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', f) != EOF;
    free(hdr);
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = (size_t)dtype_size(t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            bytes *= (size_t)t[i].shape[d];
        ok = bytes == 0 || fwrite(t[i].data, 1, bytes, f) == bytes;
    }
    int e = errno;
    if (fclose(f) != 0 && ok) {
        e = errno;
        ok = false;
    }
    if (!ok)
        return errfmt(err, errlen, "%s: write failed: %s", path, strerror(e));
    return 0;
}
