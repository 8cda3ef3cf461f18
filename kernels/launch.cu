// The per-process switch of kernels/launch.cuh: whether kernels are launched with programmatic
// dependent launch.
#include <stdlib.h>
#include <string.h>

#include "kernels/launch.cuh"

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
        const char *e = getenv("LLMQ_PDL");
        pdl = major >= 9 && !(e && !strcmp(e, "0"));
    }
    return pdl != 0;
}
