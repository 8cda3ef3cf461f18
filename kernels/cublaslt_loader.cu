// cuBLASLt through dlopen/dlsym (see cublaslt_loader.h).
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cublaslt_loader.h"
#include "llmq_cublaslt.h" // generated at configure time: LLMQ_CUBLASLT_SONAME, LLMQ_CUBLASLT_DIR

struct k_cublaslt_api k_lt;

static pthread_mutex_t lt_mu = PTHREAD_MUTEX_INITIALIZER;
static bool lt_loaded;     // k_lt is complete (written under lt_mu, before this is set)
static char lt_path[4096]; // the file k_lt came from
static size_t lt_version;  // its cublasLtGetVersion()

// Resolves every function of the table from handle h (opened from name) into *api; 0, or -1 with
// err naming the first symbol that is missing.
static int resolve(void *h, const char *name, struct k_cublaslt_api *api, char *err, size_t errlen)
{
#define K_CUBLASLT_RESOLVE(fn)                                                                               \
    do {                                                                                                     \
        (void)dlerror();                                                                                     \
        api->fn = reinterpret_cast<decltype(api->fn)>(dlsym(h, #fn));                                        \
        if (!api->fn) {                                                                                      \
            const char *why = dlerror();                                                                     \
            snprintf(err, errlen, "%s: no %s (%s)", name, #fn, why ? why : "NULL");                          \
            return -1;                                                                                       \
        }                                                                                                    \
    } while (0);
    K_CUBLASLT_FUNCTIONS(K_CUBLASLT_RESOLVE)
#undef K_CUBLASLT_RESOLVE
    return 0;
}

extern "C" int k_cublaslt_load_from(const char *const *names, int n, char *err, size_t errlen)
{
    pthread_mutex_lock(&lt_mu);
    if (lt_loaded) {
        pthread_mutex_unlock(&lt_mu);
        return 0;
    }
    // what each name gave, "name: reason; name: reason"
    char tried[2048] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        char why[1024];
        (void)dlerror();
        // RTLD_NOW: a library that cannot be relocated fails here, not at its first call
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        struct k_cublaslt_api api;
        if (!h) {
            const char *e = dlerror();
            snprintf(why, sizeof why, "%s", e ? e : "dlopen failed");
        } else if (resolve(h, names[i], &api, why, sizeof why)) {
            dlclose(h);
        } else {
            k_lt = api;
            Dl_info info;
            const char *file = dladdr(reinterpret_cast<void *>(api.cublasLtCreate), &info) && info.dli_fname
                                   ? info.dli_fname
                                   : names[i];
            snprintf(lt_path, sizeof lt_path, "%s", file);
            lt_version = api.cublasLtGetVersion();
            lt_loaded = true;
            pthread_mutex_unlock(&lt_mu);
            return 0;
        }
        // dlerror() names the file already; a missing symbol's message names it too
        int w = snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "", why);
        if (w > 0)
            used = (size_t)w < sizeof tried - used ? used + (size_t)w : sizeof tried - 1;
    }
    pthread_mutex_unlock(&lt_mu);
    snprintf(err, errlen, "cannot load cuBLASLt (%s, the CUDA backend's GEMMs): %s", LLMQ_CUBLASLT_SONAME,
             n ? tried : "no file to try");
    return -1;
}

extern "C" int k_cublaslt_load(char *err, size_t errlen)
{
    // the soname, as the dynamic loader finds it (LD_LIBRARY_PATH, ld.so.cache), then the file in
    // the directory of the toolkit the build used
    static const char *const names[] = {LLMQ_CUBLASLT_SONAME, LLMQ_CUBLASLT_DIR "/" LLMQ_CUBLASLT_SONAME};
    return k_cublaslt_load_from(names, 2, err, errlen);
}

extern "C" const char *k_cublaslt_path(void)
{
    pthread_mutex_lock(&lt_mu);
    const char *p = lt_loaded ? lt_path : NULL;
    pthread_mutex_unlock(&lt_mu);
    return p;
}

extern "C" size_t k_cublaslt_version(void)
{
    pthread_mutex_lock(&lt_mu);
    size_t v = lt_loaded ? lt_version : 0;
    pthread_mutex_unlock(&lt_mu);
    return v;
}
