// Host side of kernels/tma.cuh: tensor maps through the driver's cuTensorMapEncodeTiled, found with
// cudaGetDriverEntryPointByVersion (the runtime is linked statically and libcuda is not linked).
#include <mutex>

#include "kernels/kernels.h"
#include "kernels/tma.cuh"

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn encode_fn(void)
{
    static std::once_flag once;
    static encode_tiled_fn fn = nullptr;
    std::call_once(once, [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)p;
        else
            (void)cudaGetLastError();
    });
    return fn;
}

int k_tma_map_rows(CUtensorMap *m, const void *base, uint64_t rows, int cols, size_t row_bytes, int box_rows)
{
    encode_tiled_fn fn = encode_fn();
    K_REQUIRE(fn, "k_tma_map_rows: the driver has no cuTensorMapEncodeTiled");
    K_REQUIRE(
        base && (uintptr_t)base % 16 == 0 && row_bytes % 16 == 0 && cols >= 64 && box_rows >= 1 &&
            box_rows <= 256,
        "k_tma_map_rows: base %p, %d columns, rows of %zu bytes, boxes of %d rows (want 16-byte aligned "
        "rows, >= 64 columns, 1..256 box rows)",
        base, cols, row_bytes, box_rows);
    const cuuint64_t dims[2] = {(cuuint64_t)cols, rows}, strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, elem[2] = {1, 1};
    const CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides,
                          box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    K_REQUIRE(r == CUDA_SUCCESS,
              "cuTensorMapEncodeTiled: error %d for %llu x %d bf16 at %p, boxes of %d rows", (int)r,
              (unsigned long long)rows, cols, base, box_rows);
    return 0;
}
