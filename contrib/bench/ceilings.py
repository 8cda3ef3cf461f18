#!/usr/bin/env python3
"""The ceilings of a GPU that `llmq bench`'s roofline is built on, measured with PyTorch: the
device-to-device copy bandwidth (bytes read + bytes written per second), the dense bf16 GEMM rate and
the fp8 (e4m3) GEMM rate at a large square shape. One JSON line.

`llmq bench` compiles in the H200's values (engine/bench.h: 4.2 TB/s, 776 and 1416 TFLOP/s);
docs/PERFORMANCE.md lists what this script measures per GPU. torch is imported only for a run, so
`--help` works without it.
"""
import argparse
import json
import sys


def parse_args(argv):
    """The command line; exits 2 (argparse's status) when it is wrong."""
    ap = argparse.ArgumentParser(
        prog="ceilings.py",
        description="Measures a GPU's device copy bandwidth and its dense bf16 and fp8 (e4m3) GEMM rates\n"
        "with PyTorch and prints one JSON line (copy_tb_s, bf16_tflops, fp8_tflops, the GPU, torch's\n"
        "version). Each figure is the median of --reps timed rounds after a warm-up.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="The copy counts the bytes read and the bytes written, as llmq bench's roofline does for a\n"
        "step's traffic. fp8 runs torch._scaled_mm with unit scales and a bf16 output; it is null, with\n"
        "the reason, on a GPU or torch without it.")
    ap.add_argument("--copy-gib", type=float, default=4.0, metavar="G",
                    help="size of the copied buffer in GiB (default 4)")
    ap.add_argument("--n", type=int, default=8192, metavar="N", help="GEMM shape N x N x N (default 8192)")
    ap.add_argument("--reps", type=int, default=20, metavar="R", help="timed rounds per figure (default 20)")
    ap.add_argument("--device", type=int, default=0, metavar="N", help="CUDA device index (default 0)")
    return ap.parse_args(argv)


def time_median(torch, fn, reps):
    """Median seconds of fn() over reps rounds, timed with CUDA events, after two untimed calls."""
    fn()
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def main(argv):
    """Measures the three ceilings on one device and prints them; the exit status."""
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"ceilings.py: needs torch ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("ceilings.py: no CUDA device (torch.cuda.is_available() is false)", file=sys.stderr)
        return 1
    dev = torch.device("cuda", a.device)
    nbytes = int(a.copy_gib * 2**30) // 2 * 2
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    copy_s = time_median(torch, lambda: dst.copy_(src), a.reps)
    del src, dst
    x = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    w = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    flops = 2.0 * a.n ** 3
    bf16_s = time_median(torch, lambda: torch.mm(x, w), a.reps)
    fp8, why = None, None
    try:
        x8 = x.to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants its second operand
        one = torch.ones((), device=dev, dtype=torch.float32)
        fp8_s = time_median(torch, lambda: torch._scaled_mm(x8, w8, scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16), a.reps)
        fp8 = round(flops / fp8_s / 1e12, 1)
    except (AttributeError, RuntimeError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(dev),
        "copy_tb_s": round(2 * nbytes / copy_s / 1e12, 3),
        "bf16_tflops": round(flops / bf16_s / 1e12, 1),
        "fp8_tflops": fp8,
        "fp8_error": why,
        "gemm_n": a.n,
        "copy_bytes": nbytes,
        "torch_version": torch.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
