/* libFuzzer target: arbitrary bytes as a whole safetensors file through st_parse_header. Built with
 * clang -fsanitize=fuzzer,address,undefined by tests/fuzz/CMakeLists.txt; any crash, leak, sanitizer
 * report or inconsistent result fails the ctest `fuzz_safetensors`. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a copy of exactly `size` bytes, so any read past the end is caught by ASan */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    struct st_tensor *t;
    int n;
    char err[512];
    if (st_parse_header(buf, size, "fuzz.safetensors", &t, &n, err, sizeof err) == 0) {
        /* every accepted tensor lies inside the buffer and has the byte size its shape implies */
        for (int i = 0; i < n; i++) {
            const uint8_t *p = t[i].view.data;
            size_t bytes = (size_t)(t[i].end - t[i].begin);
            if (p < buf || p + bytes > buf + size || t[i].view.ndim > ST_MAX_DIMS || !t[i].view.name)
                abort();
            uint64_t numel = 1;
            for (int d = 0; d < t[i].view.ndim; d++)
                numel *= (uint64_t)t[i].view.shape[d];
            if (numel * dtype_size(t[i].view.dtype) != bytes)
                abort();
            volatile uint8_t sink = 0;
            if (bytes)
                sink ^= p[0] ^ p[bytes - 1];
            (void)sink;
        }
        st_tensors_free(t, n);
    } else if (t || n || !err[0]) {
        abort();
    }
    free(buf);
    return 0;
}
