// The per-process switches of kernels/launch.cuh: the device's compute capability and whether
// kernels are launched with programmatic dependent launch.
#include <stdlib.h>
#include <string.h>

#include "kernels/launch.cuh"

// Both are decided on first use and never change; a race between two first calls computes the same value.
static int cc_major = -1, pdl = -1;

int k_cc_major(void)
{
    if (cc_major < 0) {
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            cudaGetLastError(); // no device: not a sticky error for the caller
            major = 0;
        }
        cc_major = major;
    }
    return cc_major;
}

bool k_pdl_on(void)
{
    if (pdl < 0) {
        const char *e = getenv("LLMQ_PDL");
        pdl = k_cc_major() >= 9 && !(e && !strcmp(e, "0"));
    }
    return pdl != 0;
}
