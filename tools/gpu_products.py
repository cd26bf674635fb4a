"""The CUDA runtime's matrix product on its own, on a real GPU: each way `runtime.py` has of
computing a block's weight rows (a warp per node and four rows, reading the inputs directly or
staging them through shared memory; the fused kernel's choice of the two; and for weights of
few rows, groups of four rows whose nodes the blocks share: MV-RNN's 64 × 128 at
`--rows 64 --columns 128`), over a grid of one block per multiprocessor as the fused kernel
launches it, against cuBLAS (through PyTorch) on the same shapes. Checked against NumPy first;
timed with CUDA events, median of many launches.

    python tools/gpu_products.py [--rows 768] [--columns 256] [--nodes 1,4,16,64,256,1024]
                                 [--tile-nodes 32]"""
import argparse

import numpy as np
from numba import cuda

from recjit.codegen_cuda import device, runtime


def product_kernel(block_product, threads, tile_nodes, columns):
    """A launch of `threads` threads a block that computes y = x Wᵀ the way a fused kernel's
    batch does, each block its share (`block_product`), the weight read from global memory
    (L2), with a shared tile of `tile_nodes` × `columns` to stage x through."""
    @cuda.jit(**({} if device.simulated() else {"launch_bounds": threads}))
    def product(weight, x, y, rows):
        tile = cuda.shared.array((tile_nodes, columns), np.float32)
        block_product(weight, x, y, rows, tile)
    return product


def owning_rows(multiply):
    """A block's share as `matmul_rows` splits it, its own rows of W for every node, computed
    by `multiply` (`runtime.multiply` or one of its two ways)."""
    @cuda.jit(device=True, **runtime.INLINED)
    def block_product(weight, x, y, rows, tile):
        begin, owned = runtime.owned_rows(weight.shape[0])
        multiply(weight, (owned, 0, begin), (owned, 0, begin), owned, x, y, rows, tile, 0)
    return block_product


def direct(weight, weight_rows, y_rows, held, x, y, rows, tile, turn):
    runtime.multiply_direct(weight, weight_rows, y_rows, held, x, y, rows, turn)


@cuda.jit(device=True, **runtime.INLINED)
def in_row_groups(weight, x, y, rows, tile):
    runtime.matmul_row_groups(weight, weight.shape[0], x, y, rows, tile, 0)


VARIANTS = {"direct": owning_rows(cuda.jit(device=True, **runtime.INLINED)(direct)),
            "staged": owning_rows(runtime.multiply_staged),
            "fused kernel's choice": owning_rows(runtime.multiply)}
# Only for weights whose rows fit the rule (`runtime.fits_row_groups`).
ROW_GROUPS = {"row groups": in_row_groups}


def events_ms(launch, repeats):
    start, stop = cuda.event(), cuda.event()
    launch()
    times = []
    for _ in range(repeats):
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def cublas_ms(weight, x, repeats):
    """torch.matmul on the same float32 operands, or None without PyTorch's CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    w, xs = torch.from_numpy(weight).cuda(), torch.from_numpy(x).cuda()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.matmul(xs, w.T)
    times = []
    for _ in range(repeats):
        start.record()
        torch.matmul(xs, w.T)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def rate(flop, ms):
    """GFLOP/s; the simulator's events time nothing."""
    return f"{flop / ms / 1e6:.0f}" if ms else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=768)
    parser.add_argument("--columns", type=int, default=256)
    parser.add_argument("--nodes", default="1,4,16,64,256,1024")
    parser.add_argument("--threads", type=int, default=device.threads_per_block())
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--tile-nodes", type=int, default=32)
    args = parser.parse_args()
    blocks = device.multiprocessors()
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(args.rows, args.columns)).astype(np.float32)
    on_device = cuda.to_device(weight)
    variants = {**VARIANTS,
                **(ROW_GROUPS if runtime.fits_row_groups(args.rows, blocks) else {})}
    kernels = {name: product_kernel(block_product, args.threads, args.tile_nodes, args.columns)
               for name, block_product in variants.items()}
    print(f"W {args.rows}×{args.columns} float32 over {blocks} blocks × {args.threads} threads; "
          "ms per product (median of CUDA events), GFLOP/s in brackets")
    for nodes in map(int, args.nodes.split(",")):
        x = rng.normal(size=(nodes, args.columns)).astype(np.float32)
        x_device, y = cuda.to_device(x), cuda.device_array((nodes, args.rows), np.float32)
        flop = 2 * nodes * args.rows * args.columns
        cells = []
        for name, kernel in kernels.items():
            y.copy_to_device(np.full((nodes, args.rows), np.nan, np.float32))
            kernel[blocks, args.threads](on_device, x_device, y, nodes)
            np.testing.assert_allclose(y.copy_to_host(), x @ weight.T, rtol=1e-3, atol=1e-3,
                                       err_msg=name)
            launch = kernel[blocks, args.threads]
            operands = (on_device, x_device, y, nodes)
            ms = events_ms(lambda: launch(*operands), args.repeats)  # noqa: B023 (called here)
            cells.append(f"{name} {ms:.4f} ({rate(flop, ms)})")
        reference = cublas_ms(weight, x, args.repeats)
        if reference is not None:
            cells.append(f"cuBLAS {reference:.4f} ({rate(flop, reference)})")
        print(f"{nodes:>5} nodes: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
