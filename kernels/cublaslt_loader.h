/* cuBLASLt, loaded at run time instead of linked: the CUDA backend opens the library with dlopen
 * when it creates its GEMM handle (k_gemm_create), and calls the functions it uses through the table
 * k_lt, resolved with dlsym. The binary then names no cuBLAS library for the dynamic loader, whose
 * work before main (mapping and relocating 540 MB of cuBLASLt) a stop signal could not be held
 * through (docs/WORKER.md, "Stopping"); and cuBLASLt's own initializer runs inside the backend's open,
 * after the worker has installed its signal handling.
 *
 * The library is the toolkit's the build was made with: its soname (e.g. libcublasLt.so.13, found
 * the way the dynamic loader finds libraries), then the same name in the toolkit's library directory
 * (both fixed at configure time). Once loaded it stays loaded until the process exits.
 *
 * The C part (the functions below) is callable from C; the table is C++ (kernels/), typed by the
 * toolkit's own prototypes in cublasLt.h, so every call is checked by the compiler as a direct one. */
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads cuBLASLt and resolves every function of the table, once per process (thread-safe; later
 * calls return 0 at once). 0, or -1 with err naming each file tried and dlerror()'s reason. */
int k_cublaslt_load(char *err, size_t errlen);

/* k_cublaslt_load with the n file names to try, in order, instead of the built-in ones (the tests'
 * way to see a failure). Once a load has succeeded, returns 0 at once whatever the names. */
int k_cublaslt_load_from(const char *const *names, int n, char *err, size_t errlen);

/* The file the loaded library came from (a full path), or NULL before a successful load. */
const char *k_cublaslt_path(void);

/* cublasLtGetVersion() of the loaded library (e.g. 130100), or 0 before a successful load. */
size_t k_cublaslt_version(void);

#ifdef __cplusplus
}

#include <cublasLt.h>

/* Every cuBLASLt function the kernels call; X(name) once each. */
#define K_CUBLASLT_FUNCTIONS(X)                                                                              \
    X(cublasLtCreate)                                                                                        \
    X(cublasLtDestroy)                                                                                       \
    X(cublasLtGetStatusString)                                                                               \
    X(cublasLtGetVersion)                                                                                    \
    X(cublasLtMatmul)                                                                                        \
    X(cublasLtMatmulAlgoCheck)                                                                               \
    X(cublasLtMatmulAlgoConfigGetAttribute)                                                                  \
    X(cublasLtMatmulAlgoGetHeuristic)                                                                        \
    X(cublasLtMatmulDescCreate)                                                                              \
    X(cublasLtMatmulDescDestroy)                                                                             \
    X(cublasLtMatmulDescSetAttribute)                                                                        \
    X(cublasLtMatmulPreferenceCreate)                                                                        \
    X(cublasLtMatmulPreferenceDestroy)                                                                       \
    X(cublasLtMatmulPreferenceSetAttribute)                                                                  \
    X(cublasLtMatrixLayoutCreate)                                                                            \
    X(cublasLtMatrixLayoutDestroy)

/* The table: one pointer per function, of the prototype's own type, named as the function. */
struct k_cublaslt_api {
#define K_CUBLASLT_MEMBER(name) decltype(&::name) name;
    K_CUBLASLT_FUNCTIONS(K_CUBLASLT_MEMBER)
#undef K_CUBLASLT_MEMBER
};

/* Filled by a successful k_cublaslt_load (all members non-NULL); read-only afterwards. Call through it
 * only after k_cublaslt_load (or k_gemm_create) returned 0. */
extern struct k_cublaslt_api k_lt;
#endif
