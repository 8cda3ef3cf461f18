// The switches: whether kernels are launched with programmatic dependent launch (kernels/launch.cuh),
// whether the wgmma kernels can run (per process), the 16-bit element type of a thread's launches
// (k_set_f16, kernels.h) and the device's SM count.
#include <string.h>

#include <atomic>

#include "kernels/launch.cuh"

static thread_local int f16_mode;

extern "C" void k_set_f16(int on)
{
    f16_mode = on != 0;
}

extern "C" int k_f16(void)
{
    return f16_mode;
}

// Decided on first use and never changed; a race between two first calls computes the same value.
static int pdl = -1;

bool k_pdl_on(void)
{
    if (pdl < 0) {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            cudaGetLastError(); // no device: not a sticky error for the caller
            major = 0;
        }
        pdl = major >= 9 && k_diag()->pdl;
    }
    return pdl != 0;
}

bool k_pdl_skip(const void *kern)
{
    const char *skip = k_diag()->pdl_skip;
    if (!skip)
        return false;
    const char *name = NULL;
    if (cudaFuncGetName(&name, kern) != cudaSuccess || !name) {
        cudaGetLastError();
        return false;
    }
    for (const char *s = skip; *s;) {
        const char *e = strchr(s, ',');
        const size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n > 0) {
            for (const char *p = name; *p; p++)
                if (!strncmp(p, s, n))
                    return true;
        }
        s += n + (e ? 1 : 0);
    }
    return false;
}

int k_sm_count(void)
{
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return 132;
    int n = cache[dev].load(std::memory_order_relaxed);
    if (n == 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
            n = 132;
        cache[dev].store(n, std::memory_order_relaxed);
    }
    return n;
}

static int wgmma = -1;

bool k_wgmma_on(void)
{
#ifdef LLMQ_HAVE_SM90A
    if (wgmma < 0) {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            cudaGetLastError();
            major = 0;
        }
        wgmma = major == 9 && minor == 0;
    }
    return wgmma != 0;
#else
    return false;
#endif
}
