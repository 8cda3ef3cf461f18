// llmq_handoff_probe: how long does a dependent kernel wait after the kernel before it has finished?
//
// At one sequence a decode step is a chain of ~320 dependent kernels, each of which waits in
// griddepcontrol.wait (programmatic dependent launch) for the one before to complete. This program
// measures that hand-off on the device's own clock (%globaltimer), inside a CUDA graph as the engine
// runs its steps: kernel A (G CTAs: each spins for a while, writes 1 KB, stamps its end) and kernel B
// (32 CTAs, launched with the PDL attribute, resident early because A triggers at its start), which
// stamps the moment it may read A's output. Three ways for B to learn that A is done:
//   pdl:   griddepcontrol.wait (what every engine kernel does);
//   flag:  A's CTAs fence and count themselves done in a global counter; B polls it (ld.acquire);
//   plain: B launched without the attribute (a full graph edge).
// Printed per way: the hand-off = B's stamp minus the last A CTA's end stamp (median, min, max over
// B's CTAs and the replays), and A's own spread (last end minus first end).
//
// usage: llmq_handoff_probe [--ctas G] [--spin-us S] [--reps R]   (defaults 264, 5, 200; --help)
// Exits 77 without a GPU of compute capability 9.0 or newer.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "contrib/lab/probe_check.h"
#include "kernels/launch.cuh" // pdl_wait, pdl_launch_dependents (empty below sm_90)

__device__ __forceinline__ uint64_t now_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A: trigger (so B becomes resident now), spin, write, stamp, (flag) count itself done
__global__ void kernel_a(uint64_t spin_ns, float *out, uint64_t *a_end, unsigned *done, int flag)
{
    pdl_launch_dependents();
    pdl_wait();
    const uint64_t t0 = now_ns();
    float v = threadIdx.x;
    while (now_ns() - t0 < spin_ns)
        v = v * 1.0001f + 1.f;
    out[blockIdx.x * 256 + threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        a_end[blockIdx.x] = now_ns();
        if (flag) {
            __threadfence();
            atomicAdd(done, 1u);
        }
    }
}

// B: stamp the moment A's output may be read (after the wait or the counter), then read it
__global__ void kernel_b(const float *out, int ga, uint64_t *b_go, unsigned *done, int flag, float *sink)
{
    if (flag) {
        if (threadIdx.x == 0) {
            unsigned v;
            do
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
            while (v < (unsigned)ga);
        }
        __syncthreads();
    } else {
        pdl_wait();
    }
    if (threadIdx.x == 0)
        b_go[blockIdx.x] = now_ns();
    float s = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ga * 256; i += blockDim.x * gridDim.x)
        s += out[i];
    if (s == 12345.f)
        *sink = s;
    pdl_wait(); // flag mode: completion still implies A's
}

__global__ void reset(unsigned *done)
{
    *done = 0;
}

int main(int argc, char **argv)
{
    int ga = 264, reps = 200;
    double spin_us = 5;
    const char *usage = "usage: llmq_handoff_probe [--ctas G] [--spin-us S] [--reps R]\n"
                        "  G CTAs of 256 threads in kernel A (1..100000, default 264), each spinning S us\n"
                        "  (0..10000, default 5); R graph replays per way (1..100000, default 200)\n";
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("%s", usage);
            return 0;
        }
        char *end = NULL;
        const double v = i + 1 < argc ? strtod(argv[i + 1], &end) : 0;
        const bool num = end && end != argv[i + 1] && *end == 0;
        if (!strcmp(argv[i], "--ctas") && num && v >= 1 && v <= 100000 && v == (int)v)
            ga = (int)v;
        else if (!strcmp(argv[i], "--spin-us") && num && v >= 0 && v <= 10000)
            spin_us = v;
        else if (!strcmp(argv[i], "--reps") && num && v >= 1 && v <= 100000 && v == (int)v)
            reps = (int)v;
        else {
            fprintf(stderr, "llmq_handoff_probe: bad argument '%s%s%s'\n%s", argv[i], i + 1 < argc ? " " : "",
                    i + 1 < argc ? argv[i + 1] : "", usage);
            return 2;
        }
    }
    int n = 0, major = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major < 9) {
        printf("skipped: no GPU of compute capability 9.0 or newer\n");
        return 77;
    }
    const int gb = 32;
    float *out, *sink;
    uint64_t *a_end, *b_go;
    unsigned *done;
    CK(cudaMalloc(&out, (size_t)ga * 256 * 4));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&a_end, ga * 8));
    CK(cudaMalloc(&b_go, gb * 8));
    CK(cudaMalloc(&done, 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const char *names[] = {"pdl (griddepcontrol.wait)", "flag (counter, ld.acquire)", "plain (graph edge)"};
    printf("A: %d CTAs x 256 threads spinning %.1f us; B: %d CTAs; %d graph replays each\n", ga, spin_us, gb,
           reps);
    for (int mode = 0; mode < 3; mode++) {
        const int flag = mode == 1;
        cudaGraph_t g;
        cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
        reset<<<1, 1, 0, st>>>(done);
        kernel_a<<<ga, 256, 0, st>>>((uint64_t)(spin_us * 1e3), out, a_end, done, flag);
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at.val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(gb);
        cfg.blockDim = dim3(256);
        cfg.stream = st;
        cfg.attrs = &at;
        cfg.numAttrs = mode == 2 ? 0 : 1;
        CK(cudaLaunchKernelEx(&cfg, kernel_b, (const float *)out, ga, b_go, done, flag, sink));
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ex, g, 0));
        std::vector<double> hand, spread;
        std::vector<uint64_t> ha(ga), hb(gb);
        for (int r = 0; r < reps + 5; r++) {
            CK(cudaGraphLaunch(ex, st));
            CK(cudaStreamSynchronize(st));
            if (r < 5)
                continue;
            CK(cudaMemcpy(ha.data(), a_end, ga * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hb.data(), b_go, gb * 8, cudaMemcpyDeviceToHost));
            const uint64_t last = *std::max_element(ha.begin(), ha.end()),
                           first = *std::min_element(ha.begin(), ha.end());
            spread.push_back((last - first) / 1e3);
            for (uint64_t b : hb)
                hand.push_back(((double)(int64_t)(b - last)) / 1e3);
        }
        std::sort(hand.begin(), hand.end());
        std::sort(spread.begin(), spread.end());
        printf("%-28s hand-off median %.3f us (min %.3f, p10 %.3f, p90 %.3f, max %.3f); A's spread median "
               "%.3f us\n",
               names[mode], hand[hand.size() / 2], hand.front(), hand[hand.size() / 10],
               hand[hand.size() * 9 / 10], hand.back(), spread[spread.size() / 2]);
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(g));
    }
    return 0;
}
