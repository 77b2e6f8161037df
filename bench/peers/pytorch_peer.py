#!/usr/bin/python3
"""PyTorch as a benchmark peer of Tandem (never a dependency of the library).

Times training steps of Tandem's AlexNet-like default (1x28x28, 10 classes), of Caffe's
cifar10_quick (3x32x32, 10 classes) or of Caffe's AlexNet (3x227x227, 1000 classes), built layer for
layer as engine/models/*.ts build them, on synthetic data (normal images, uniform labels), softmax
cross-entropy, SGD momentum 0.9 weight decay 5e-4, lr 0.01 (0.001 for cifar-quick, as Caffe's
cifar10_quick solver), with Caffe's multipliers (weights lr x1 decay x1, biases lr x2 decay x0 as
engine/nn/layers.ts, decay x1 for cifar-quick, whose prototxt leaves Caffe's default).

One process (--world 1), or DistributedDataParallel over gloo with default buckets: world size and
rank from --world/--rank, else from Open MPI's OMPI_COMM_WORLD_SIZE/OMPI_COMM_WORLD_RANK (mpirun);
rendezvous at --master ADDR:PORT (tcp://). --batch is the global batch: each rank takes batch/world.

A step is zero_grad + forward + loss + backward (DDP's gradient allreduce included) + optimizer step
+ reading the loss back; ranks meet at a barrier before each step (outside the timed span), so rank
0's time is the whole synchronised step. Rank 0 prints one JSON line on stdout; an error prints one
line on stderr and exits non-zero.

Use /usr/bin/python3 (Debian's python3-torch). Example:
  /usr/bin/python3 bench/peers/pytorch_peer.py --net alexnet-like --batch 64 --threads 2
"""

import argparse
import os
import sys


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    p = Parser(prog="pytorch_peer.py", description="PyTorch training-step peer of Tandem")
    p.add_argument("--net", choices=["alexnet-like", "cifar-quick", "alexnet"], default="alexnet-like")
    p.add_argument("--batch", type=int, default=64, help="global batch (split evenly over ranks)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="intra-op (OpenMP and OpenBLAS) threads per process")
    p.add_argument(
        "--blas-threads", type=int, default=None, help="OpenBLAS threads (default: --threads)"
    )
    p.add_argument("--world", type=int, default=None, help="processes (default: Open MPI's, else 1)")
    p.add_argument("--rank", type=int, default=None, help="this process's rank (default: Open MPI's, else 0)")
    p.add_argument("--master", default=None, help="rendezvous ADDR:PORT of rank 0 (needed when world > 1)")
    p.add_argument("--timeout", type=float, default=300, help="seconds a rendezvous or collective may take")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    env = os.environ
    if a.world is None:
        a.world = int(env["OMPI_COMM_WORLD_SIZE"]) if "OMPI_COMM_WORLD_SIZE" in env else 1
    if a.rank is None:
        a.rank = int(env["OMPI_COMM_WORLD_RANK"]) if "OMPI_COMM_WORLD_RANK" in env else 0
    if a.blas_threads is None:
        a.blas_threads = a.threads
    for name in ("batch", "steps", "threads", "blas_threads", "world"):
        if getattr(a, name) < 1:
            flag = name.replace("_", "-")
            raise UsageError(f"--{flag} must be a positive integer, got {getattr(a, name)}")
    if a.warmup < 0:
        raise UsageError(f"--warmup must be >= 0, got {a.warmup}")
    if not 0 <= a.rank < a.world:
        raise UsageError(f"rank {a.rank} is outside world size {a.world}")
    if a.batch % a.world:
        raise UsageError(f"global batch {a.batch} does not split evenly over {a.world} ranks")
    if a.world > 1:
        if a.master is None and "MASTER_ADDR" in env and "MASTER_PORT" in env:
            a.master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        if a.master is None or ":" not in a.master:
            raise UsageError("world > 1 needs --master ADDR:PORT")
    return a


def prepare_environment(threads, blas_threads):
    """Before torch loads OpenBLAS: this process's own environment only."""
    # OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set machine-wide for old OpenBLAS builds; unset, 0.3.21
    # detects the core itself.
    os.environ.pop("OPENBLAS_CORETYPE", None)
    os.environ.pop("OPENBLAS_L2_SIZE", None)
    # torch.set_num_threads sets OpenMP's count, not OpenBLAS's pthreads (which default to every core).
    os.environ["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


# Parameter counts of Tandem's nets (engine/models/*.ts docs).
EXPECTED_PARAMETERS = {"alexnet-like": 1_088_458, "cifar-quick": 145_578, "alexnet": 60_965_224}
INPUT_SHAPES = {"alexnet-like": (1, 28, 28), "cifar-quick": (3, 32, 32), "alexnet": (3, 227, 227)}
CLASSES = {"alexnet-like": 10, "cifar-quick": 10, "alexnet": 1000}
# Base learning rate and the biases' decay multiplier (their lr multiplier is 2 in every net).
LEARNING_RATES = {"alexnet-like": 0.01, "cifar-quick": 0.001, "alexnet": 0.01}
BIAS_DECAY_MULT = {"alexnet-like": 0.0, "cifar-quick": 1.0, "alexnet": 0.0}
# Spatial sizes after each pooling layer, as Caffe's ceil-mode rounding gives them.
POOLED_SIZES = {"alexnet-like": (14, 7, 3), "cifar-quick": (16, 8, 4), "alexnet": (27, 13, 6)}


def build(net, torch):
    """Tandem's layers, in its order and names (Caffe semantics: ceil-mode pooling, groups, LRN)."""
    from collections import OrderedDict

    nn = torch.nn
    init = nn.init

    def conv(cin, cout, k, weight, bias, **kw):
        layer = nn.Conv2d(cin, cout, k, **kw)
        weight(layer.weight)
        init.constant_(layer.bias, bias)
        return layer

    def linear(fin, fout, weight, bias):
        layer = nn.Linear(fin, fout)
        weight(layer.weight)
        init.constant_(layer.bias, bias)
        return layer

    def xavier(w):
        # Caffe's xavier: uniform in ±sqrt(3 / fan_in).
        fan_in = w[0].numel()
        init.uniform_(w, -((3 / fan_in) ** 0.5), (3 / fan_in) ** 0.5)

    def gaussian(std):
        return lambda w: init.normal_(w, 0, std)

    # Caffe's pooling rounds the output size up (and drops a window starting in the padding): ceil_mode.
    def pool():
        return nn.MaxPool2d(3, 2, ceil_mode=True)

    # Caffe's AVE pooling divides by the window clipped to the (padded) input: with no padding,
    # PyTorch's ceil-mode divisor is the same (count_include_pad only counts the padding).
    def avg_pool():
        return nn.AvgPool2d(3, 2, ceil_mode=True)

    # Caffe's LRN: x / (k + alpha/size * sum of x^2 over `size` channels centred on c)^beta. PyTorch's
    # pads size//2 before and (size-1)//2 after and averages with the padding counted, i.e. divides
    # the sum by size: the same formula for odd sizes, and k = 1 as Caffe.
    def lrn():
        return nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)

    if net == "alexnet-like":
        layers = [
            ("conv1", conv(1, 32, 5, xavier, 0, padding=2)),
            ("relu1", nn.ReLU()),
            ("pool1", pool()),
            ("conv2", conv(32, 64, 3, xavier, 0, padding=1, groups=2)),
            ("relu2", nn.ReLU()),
            ("pool2", pool()),
            ("conv3", conv(64, 64, 3, xavier, 0, padding=1)),
            ("relu3", nn.ReLU()),
            ("pool3", pool()),
            ("flatten", nn.Flatten()),  # Tandem's Linear flattens C×H×W itself
            ("fc6", linear(64 * 3 * 3, 768, xavier, 0)),
            ("relu6", nn.ReLU()),
            ("drop6", nn.Dropout(0.5)),
            ("fc7", linear(768, 768, xavier, 0)),
            ("relu7", nn.ReLU()),
            ("drop7", nn.Dropout(0.5)),
            ("fc8", linear(768, 10, gaussian(0.01), 0)),
        ]
    elif net == "cifar-quick":  # Caffe's examples/cifar10/cifar10_quick_train_test.prototxt
        layers = [
            ("conv1", conv(3, 32, 5, gaussian(1e-4), 0, padding=2)),
            ("pool1", pool()),
            ("relu1", nn.ReLU()),  # after pool1, as in the file
            ("conv2", conv(32, 32, 5, gaussian(0.01), 0, padding=2)),
            ("relu2", nn.ReLU()),
            ("pool2", avg_pool()),
            ("conv3", conv(32, 64, 5, gaussian(0.01), 0, padding=2)),
            ("relu3", nn.ReLU()),
            ("pool3", avg_pool()),
            ("flatten", nn.Flatten()),
            ("ip1", linear(64 * 4 * 4, 64, gaussian(0.1), 0)),
            ("ip2", linear(64, 10, gaussian(0.1), 0)),
        ]
    else:  # Caffe's bvlc_alexnet
        g01 = gaussian(0.01)
        layers = [
            ("conv1", conv(3, 96, 11, g01, 0, stride=4)),
            ("relu1", nn.ReLU()),
            ("norm1", lrn()),
            ("pool1", pool()),
            ("conv2", conv(96, 256, 5, g01, 0.1, padding=2, groups=2)),
            ("relu2", nn.ReLU()),
            ("norm2", lrn()),
            ("pool2", pool()),
            ("conv3", conv(256, 384, 3, g01, 0, padding=1)),
            ("relu3", nn.ReLU()),
            ("conv4", conv(384, 384, 3, g01, 0.1, padding=1, groups=2)),
            ("relu4", nn.ReLU()),
            ("conv5", conv(384, 256, 3, g01, 0.1, padding=1, groups=2)),
            ("relu5", nn.ReLU()),
            ("pool5", pool()),
            ("flatten", nn.Flatten()),
            ("fc6", linear(256 * 6 * 6, 4096, gaussian(0.005), 0.1)),
            ("relu6", nn.ReLU()),
            ("drop6", nn.Dropout(0.5)),
            ("fc7", linear(4096, 4096, gaussian(0.005), 0.1)),
            ("relu7", nn.ReLU()),
            ("drop7", nn.Dropout(0.5)),
            ("fc8", linear(4096, 1000, g01, 0)),
        ]
    return nn.Sequential(OrderedDict(layers))


def check_pooled_sizes(model, net, torch):
    """The spatial size after each pooling layer is Caffe's (ceil mode), e.g. 16, 8, 4 for cifar-quick."""
    sizes = []
    x = torch.zeros((1, *INPUT_SHAPES[net]))
    with torch.no_grad():
        for name, layer in model.named_children():
            if name == "flatten":
                break
            x = layer(x)
            if name.startswith("pool"):
                sizes.append(x.shape[-1])
    if tuple(sizes) != POOLED_SIZES[net]:
        raise RuntimeError(f"{net} pools to {tuple(sizes)}, Caffe's sizes are {POOLED_SIZES[net]}")


def blas_description(torch, blas_threads):
    """The BLAS torch loaded (OpenBLAS's core as it detected it) and the convolution library."""
    import ctypes
    import re

    parts = []
    libs = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "openblas" in os.path.basename(path) and ".so" in path and path not in libs:
                    libs.append(path)
    except OSError:
        pass
    described = False
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_set_num_threads(ctypes.c_int(blas_threads))
            config = lib.openblas_get_config().decode()
            core = lib.openblas_get_corename().decode()
            parts.append(f"{config.split(' NO_')[0]} (pthreads), core {core}, {lib.openblas_get_num_threads()} thread(s)")
            described = True
            break
        except (OSError, AttributeError):
            continue
    if not described:
        info = re.search(r"BLAS_INFO=([^,]+)", torch.__config__.show())
        parts.append(f"BLAS {info.group(1) if info else 'unknown'}")
    onednn = re.search(r"MKL-DNN (v[\d.]+)", torch.__config__.show())
    if torch.backends.mkldnn.is_available():
        parts.append(f"convolutions via oneDNN {onednn.group(1) if onednn else ''}".rstrip())
    parts.append(f"{torch.get_num_threads()} OpenMP thread(s)")
    return "; ".join(parts)


def run(a):
    prepare_environment(a.threads, a.blas_threads)
    import json
    import resource
    import time
    import warnings
    from datetime import timedelta

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    blas = blas_description(torch, a.blas_threads)

    dist = None
    if a.world > 1:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{a.master}",
            world_size=a.world,
            rank=a.rank,
            timeout=timedelta(seconds=a.timeout),
        )

    torch.manual_seed(a.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    model = build(a.net, torch)
    parameters = sum(p.numel() for p in model.parameters())
    if parameters != EXPECTED_PARAMETERS[a.net]:
        raise RuntimeError(
            f"{a.net} has {parameters} parameters, Tandem's has {EXPECTED_PARAMETERS[a.net]}"
        )
    check_pooled_sizes(model, a.net, torch)
    # Caffe's multipliers as Tandem's layers set them: weights lr x1 decay x1, biases lr x2 (decay x0,
    # or x1 where the prototxt leaves Caffe's default: cifar-quick).
    lr, decay = LEARNING_RATES[a.net], 5e-4
    weights = [p for n, p in model.named_parameters() if n.endswith(".weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    optimizer = torch.optim.SGD(
        [
            {"params": weights, "lr": lr, "weight_decay": decay},
            {"params": biases, "lr": 2 * lr, "weight_decay": decay * BIAS_DECAY_MULT[a.net]},
        ],
        lr=lr,
        momentum=0.9,
    )
    train = model
    if dist is not None:
        train = torch.nn.parallel.DistributedDataParallel(model)  # default buckets (25 MB)
    train.train()

    local = a.batch // a.world
    generator = torch.Generator().manual_seed(a.seed + 1)
    images = torch.randn((a.batch, *INPUT_SHAPES[a.net]), generator=generator)
    labels = torch.randint(0, CLASSES[a.net], (a.batch,), generator=generator)
    images = images[a.rank * local:(a.rank + 1) * local].contiguous()
    labels = labels[a.rank * local:(a.rank + 1) * local].contiguous()
    loss_fn = torch.nn.CrossEntropyLoss()  # mean over the rank's shard; DDP averages over ranks

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = loss_fn(train(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    times = []
    for i in range(a.warmup + a.steps):
        if dist is not None:
            dist.barrier()
        t0 = time.perf_counter()
        loss = step()
        dt = time.perf_counter() - t0
        if loss != loss:
            raise RuntimeError(f"loss is NaN at step {i}")
        if i >= a.warmup:
            times.append(dt * 1000)

    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()
    if a.rank == 0:
        ordered = sorted(times)
        median = ordered[len(ordered) // 2]  # as bench/report.ts: the upper median for even counts
        result = {
            "peer": "pytorch",
            "version": torch.__version__,
            "net": a.net,
            "world": a.world,
            "batch": a.batch,
            "perRankBatch": local,
            "threads": a.threads,
            "blasThreads": a.blas_threads,
            "parameters": parameters,
            "bestMs": round(ordered[0], 3),
            "medianMs": round(median, 3),
            "imagesPerSecond": round(a.batch / (median / 1000), 2),
            "stepsMs": [round(t, 3) for t in times],
            "warmup": a.warmup,
            "maxRssMB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "blas": blas,
        }
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def main(argv):
    try:
        run(parse_args(argv))
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("pytorch_peer: interrupted\n")
        return 130
    except BaseException as error:  # noqa: BLE001 - one line on stderr, whatever failed
        if isinstance(error, SystemExit) and not error.code:
            return 0
        message = " ".join(str(error).split()) or type(error).__name__
        kind = "usage" if isinstance(error, UsageError) else type(error).__name__
        sys.stderr.write(f"pytorch_peer: {kind}: {message}\n")
        return 2 if isinstance(error, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
