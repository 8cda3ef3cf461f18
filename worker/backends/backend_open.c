/* See backend_open.h. */
#include "worker/backends/backend_open.h"

#include <stdio.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda_backend.h"
#include "engine/gpu.h"
#include "engine/model.h"
#include "engine/util/log.h"

struct backend *backend_open(const char *name, const struct model *m, const struct backend_opts *o, char *err,
                             size_t errlen)
{
    /* YaRN by max_model_len: the backend sees a copy of the model whose config says so (backends
     * copy what they need of m at open, so the copy may end with this call) */
    struct model extended;
    char msg[512];
    if (m && o) {
        extended = *m;
        if (model_config_extend_rope(&extended.cfg, o->max_model_len, msg, sizeof msg)) {
            log_info("model: %s", msg);
            m = &extended;
        } else if (msg[0]) {
            log_warn("model: %s", msg);
        }
    }
    if (!name || !strcmp(name, "auto")) {
        char why[256] = "";
        if (gpu_backend_built() && gpu_describe(why, sizeof why) == 0) {
            log_info("backend auto: cuda on %s", why);
            return cuda_backend_open(m, o, err, errlen);
        }
        if (gpu_backend_built())
            log_info("backend auto: cpu (no usable GPU: %s)", why);
        else
            log_info("backend auto: cpu (built without the CUDA backend)");
        return cpu_backend_open(m, o, err, errlen);
    }
    if (!strcmp(name, "cpu"))
        return cpu_backend_open(m, o, err, errlen);
    if (!strcmp(name, "cuda"))
        return cuda_backend_open(m, o, err, errlen);
    snprintf(err, errlen, "unknown backend '%s' (expected auto, cpu or cuda)", name);
    return NULL;
}
