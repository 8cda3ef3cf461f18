/* libFuzzer target: arbitrary bytes as a chat template through jinja_parse and, when it parses,
 * jinja_render over a small chat with tight limits. Built with clang -fsanitize=fuzzer,address,
 * undefined by tests/fuzz/CMakeLists.txt; any crash, leak, sanitizer report or result outside the
 * contract of engine/jinja.h fails the ctest `fuzz_jinja`. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jinja.h"

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "\"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nx\\n</think>\\n\\nHello\", \"tool_calls\": "
    "[{\"type\": "
    "\"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5, \"b\": [true, null]}}}]},"
    " {\"role\": \"tool\", \"content\": \"42\"}], \"tools\": null, \"add_generation_prompt\": true,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars && !(vars = json_loads(VARS, 0, NULL)))
        abort();
    char *src = malloc(size ? size : 1); /* exactly `size` bytes: a read past the end is caught */
    if (!src)
        return 0;
    memcpy(src, data, size);
    char err[256];
    struct jinja_template *t = jinja_parse(src, size, "fuzz", err, sizeof err);
    free(src); /* the parsed template owns copies of what it needs */
    if (!t) {
        if (strncmp(err, "fuzz line ", 10) != 0)
            abort();
        return 0;
    }
    struct jinja_options o = {.max_steps = 20000, .max_output = 1 << 16, .now = 1700000000};
    char *out = (char *)err;
    size_t len = 0;
    int rc = jinja_render(t, vars, &o, &out, &len, err, sizeof err);
    if (rc == JINJA_OK) {
        if (!out || out[len] != 0 || len > o.max_output)
            abort();
        free(out);
    } else if ((rc != JINJA_ERROR && rc != JINJA_RAISED) || out) {
        abort();
    }
    jinja_free(t);
    return 0;
}
