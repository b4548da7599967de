"""Serving (examples/moe_serving.py), training (examples/train_step.py) and DLRM
(examples/dlrm.py) at the paper's model width and rank counts, in modeled time.

    python benchmarks/paper_size.py [--workload serve|train|dlrm] [--configs staged,roa,balanced,auto,pool]
                                    [--ranks 4,8] [--hidden 32,64,128] [--target 7168] [--scale 16,32]
                                    [--json FILE] [--verify H] [-- more arguments for the example]

``--workload serve`` (the default) is described first, ``--workload train`` and ``--workload
dlrm`` after it.

For every configuration (benchmarks/e2e.py's CONFIGS; launched by its ``_launch``) the example
runs on the host at each rank count of ``--ranks`` and each hidden size of ``--hidden``, with
``--trace`` and ``--timeline``, and the workload below (every other dimension fixed):

    --per-rank --requests 11 --warmup 11 --max-batch 11 --layers 2 --rate 0   (e2e.py's serving load)
    --topk 8                 top-8 routing (paper section 8.1, DeepEP's setting)
    --ffn 2048               each expert's intermediate size (DeepSeek-V3's moe_intermediate_size)
    --routing seeded         experts drawn by stratacl.ep.routing, the same at every hidden size:
                             a gate routing by the activations sends other rows at every hidden
                             size, and extrapolate_dimension refuses it
    --weight-bytes 1         the kernels read 1-byte weights, as a model served in FP8 (DeepSeek-V3's
                             published weights) or INT8; the host still computes in float32
    --rows float16           2-byte rows through dispatch and combine (the paper's bf16: 14 KiB at
                             7168), 2-byte activations and KV cache in the modeled kernels
    --attention-weights 3.64 the attention's projection weights charged per layer and micro-batch:
                             DeepSeek-V3's MLA, 187.1M at hidden 7168 = 3.64 x 7168^2, scaled as H^2

Then, per rank count, ``ub.extrapolate_dimension`` fits the traces in hidden (quadratic through
the three recordings) to ``--target`` (7168: the paper's hidden size, 14 KiB bf16 rows; here
float32, 28 KiB), and ``ub.extrapolate`` takes those to each N of ``--scale`` (16: the decode
instances' EP, 32: the prefill instances', paper section 8.2); ``ub.replay`` times them and
e2e.py's ``serving_metrics`` reads throughput, P99 TTFT and P99 TPOT off the replay's clocks at
the reads the timeline names. No rank runs at the target width or at N.

Rows (``--json``): e2e.py's row format, "scale": "paper-size", plus "dims" (every dimension and
where it came from); rows at the recorded rank counts are the width-extrapolated traces replayed
there. ``--verify H``: instead, one configuration at the recorded rank counts, the fit from
``--hidden`` to H against a real run at H (H small enough to run), and at each N of ``--scale``
the fit extrapolated in N against a real run at N ranks and H: every metric's relative error.

``--workload train``: examples/train_step.py in the paper's layout at every N (TP groups of 4,
FSDP over the N/4 replicas, EP groups of N/8 ranks, so 8 replicas of each expert whose
gradients are all-reduced over them: FSDP 128 / TP 4 / EP 64 at 512 dies; see its docstring)
runs with ``--trace`` at each rank count of ``--ranks`` (default 16, 32, 64, EP 2, 4, 8: three,
so that the FSDP shards' 1 / N is fitted, as e2e.py's ``--scale-from 4,8,16`` does) and each
hidden size H of ``--hidden`` (default 56, 112, 224), the load TRAIN
below, the dense block's width 2 H and each expert's 2 H / 7 (so that both are fitted with
hidden: the expert's is 2048 at 7168), and ``--routing seeded``. Every number of a step is then
a polynomial of degree <= 2 in H (matmuls' FLOPs and weights ~ H^2, rows ~ H), and the fit
through three recordings is exact. ``ub.extrapolate_dimension`` takes each rank count's traces
to ``--target``, ``ub.extrapolate`` those to each N of ``--scale`` (default 128, 512: the
groups' sizes N/4 and N/8 and the replicas' stride N/8 scale with N, TP stays 4), and the
step time is the second step's, read off the replay's clocks (the example reads
``comm.clock()`` at each step's start and end; the slowest rank's, as it prints). ``--verify
H``: as for serving, the fit to H (a multiple of 7) against a real run at H, at each recorded N,
and at each N of ``--scale`` against a real run at N ranks and H.

``--tokens T1,T2`` (train): the replica's tokens as a second fitted dimension. At each rank count
the example runs at both token counts and at each hidden size (six recordings); at each token
count ``ub.extrapolate_dimension`` fits hidden to ``--target``, then fits those two in the tokens
(``moe="fit"``: the MoE calls' tokens and traffic and the experts' kernels are numbers fitted
like the rest; linear, as every number of the step is a + b T at one width) to
``--target-tokens`` (16384: the paper's global batch 512 x 4096 over FSDP 128), and
``ub.extrapolate`` takes those to each N. ``--iterations I1,I2,...``: the routing of iteration I
(examples/train_step.py ``--imbalance`` = ``imbalance(I)``, the decay written down in
docs/end-to-end.md), recorded and extrapolated for each I; the rows say which. ``--verify-tokens
T``: the fit in the tokens (from ``--tokens``, at the first of ``--hidden``) against a real run
at T tokens, at each recorded N.

``--workload dlrm``: examples/dlrm.py (tables sharded table-wise, one per die; MLPs data
parallel) runs with ``--trace`` at each rank count of ``--ranks`` (default 4, 8: every number
of its step is a + b N, the pooled-embedding exchanges' bytes and the top MLP's input width
growing with the tables, one per die) and each batch of ``--hidden`` (here the samples per die;
default 128, 256, 512), the load DLRM below (MLPerf's DLRM widths on Criteo Terabyte, embedding
dimension 128, one index per sparse feature). Every number of a step is then a + b x batch (the
exchanges' bytes, the MLPs' FLOPs and activations; the weights and their all_reduce do not
change), so the fit is exact. ``ub.extrapolate_dimension`` takes each rank count's traces to
``--target`` (default 1024: the paper's batch, per die), ``ub.extrapolate`` those to each N of
``--scale`` (default 128: the paper's dies), and the step is the second step's, read off the
replay's clocks as for training. The target batch is small enough to run: ``--verify 1024``
checks the fit against a real run at the paper's batch itself, at each recorded N, and at each
N of ``--scale`` against a real run at N ranks.

``--cache-gib G1,G2,...`` (dlrm): the paper's embedding cache (Fig. 12b), one set of rows per
size: ``dlrm_misses.per_die(G, --zipf)`` derives the steady state's misses a lookup at the
paper's table (7 TiB over 128 dies), and the example pays them (``--miss-rate``: its hot rows
pinned in HBM, the misses fetched from host memory and as many dirty rows written back, each
step). A step's misses are about m x N x batch a die's table (rounded a rank), linear in both
fitted dimensions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e import NOCOMM, WORKLOADS, _launch, _nocomm_topology, _row, serving_metrics

# the serving load of e2e.py's --scale runs, at the paper's routing and expert width
LOAD = ["--per-rank", "--requests", "11", "--warmup", "11", "--max-batch", "11", "--layers", "2", "--rate", "0"]
# the check against the job computed in one process costs N times the serving's compute on every
# rank; it is skipped in these recordings (--check keeps it) and made in tests/test_examples.py
# and, at these settings, by hand (docs/end-to-end.md, "Serving at the paper's width")
NO_CHECK = ["--no-check"]
PAPER = ["--topk", "8", "--ffn", "2048", "--routing", "seeded", "--weight-bytes", "1", "--rows", "float16",
         "--attention-weights", "3.64"]
SOURCES = {
    "hidden": "7168: the paper's Table 2 microbenchmark (section 8.1) and DeepSeek-V3's hidden_size, not DeepSeek "
              "V4 Flash's (4096 in transformers' DeepSeek V4 config; docs/end-to-end.md); extrapolated",
    "topk": "8: the paper's Table 2 microbenchmark (section 8.1, DeepEP's setting) and DeepSeek-V3's; DeepSeek V4 "
            "Flash routes top-6",
    "ffn": "DeepSeek-V3 config.json moe_intermediate_size 2048",
    "ranks": "paper section 8.2: decode EP 16, prefill EP 32; extrapolated from the recorded rank counts",
    "experts_per_rank": "the example's default (4); fixed across N, so experts = 4 N (paper: 256)",
    "layers": "e2e.py's serving load (2; DeepSeek-V3: 61)",
    "load": "e2e.py's serving load: --per-rank --requests 11 --warmup 11 --max-batch 11 --rate 0",
    "routing": "seeded uniform top-k (stratacl.ep.routing), as DeepEP's tests draw it; not a trained gate",
    "weight_bytes": "1: the kernels read FP8 weights (DeepSeek-V3's published weights are FP8, its config.json "
                    "quantization_config; INT8 W8A8 is as wide); the host computes in float32",
    "rows": "float16: 2-byte rows on the wire (the paper's bf16, 14 KiB at 7168) and 2-byte activations and KV "
            "cache in the kernels; the experts compute in float32 on the rows cast back",
    "attention_weights": "3.64 H^2 per layer: DeepSeek-V3's MLA projections (q_a 7168x1536, q_b 1536x128x192, "
                         "kv_a 7168x576, kv_b 512x128x256, o 128x128x7168: 187.1M) at hidden 7168, scaled as "
                         "H^2; read once per micro-batch and layer, 2 FLOPs a weight and a token; no attention "
                         "scores beyond the token mixing's",
}


# the training load: two steps (the second is timed), two layers, 64 tokens per data-parallel
# replica (what the host computes at three widths and three rank counts in reasonable time;
# the paper's replica holds 4 sequences of 4096), top-8 of 4 experts per rank, TP 4, and EP
# groups of N / EXPERT_REPLICAS ranks (record() adds --ep at each N)
TRAIN = ["--steps", "2", "--layers", "2", "--tokens", "64", "--experts-per-rank", "4", "--topk", "8", "--tp", "4",
         "--routing", "seeded"]
EXPERT_REPLICAS = 8          # the paper's 512 dies over EP 64 (section 9.1)
TRAIN_SOURCES = {
    "hidden": "DeepSeek-V3 config.json hidden_size 7168 (DeepSeek-V3.2 keeps it; paper section 9.1 trains "
              "DeepSeek V3.2); float32 here; fitted from the recorded hidden sizes",
    "expert_ffn": "DeepSeek-V3 config.json moe_intermediate_size 2048; recorded at 2 H / 7 so that it is "
                  "fitted with hidden and is 2048 at 7168",
    "ffn": "assumed: the dense block stands in for MLA attention; 2 H (2 x 7168 x 14336 = 205.5M weights; "
           "DeepSeek-V3's attention, from config.json q_lora_rank 1536, kv_lora_rank 512, 128 heads, "
           "qk_nope 128 / qk_rope 64 / v 128 head dims, has 187.1M: +10%); no attention scores",
    "topk": "DeepSeek-V3 config.json num_experts_per_tok 8",
    "experts_per_rank": "4: DeepSeek-V3's 256 routed experts (n_routed_experts) over the paper's EP 64; "
                        "experts = 4 EP = N / 2 (256 at 512 dies)",
    "tp": "paper section 9.1: TP 4 (one TP group: the dies of two NPUs)",
    "fsdp": "N / TP (every TP group a data-parallel replica): paper section 9.1, FSDP 128 at 512",
    "ep": "N / 8: paper section 9.1, EP 64 at 512 dies; EP groups of consecutive ranks (TorchTitan's "
          "dp_shard_in_ep x tp, expert TP 1), each holding every expert",
    "expert_replicas": "N / EP = 8 at every N (the paper's 512 / 64): each expert FSDP-sharded over its 8 "
                       "replicas, gathered with its layer's dense weights and its gradients reduce-scattered "
                       "(TorchTitan's efsdp = dp_shard x tp / ep)",
    "tokens": "with --tokens: 16384 per replica (the paper's global batch 512 x sequence 4096 over FSDP 128), fitted "
              "from the recorded token counts; without: 64 (assumed, the host's limit at three widths)",
    "imbalance": "with --iterations: the experts' load max / mean at iteration I, 1.05 + 0.95 exp(-I / 1000) "
                 "(assumed shape; docs/end-to-end.md), a shared Zipf skew (ep.skew_for) drawn anew at N",
    "layers": "2 (DeepSeek-V3: 61, 3 of them dense)",
    "routing": "seeded top-8 (stratacl.ep.routing), uniform or, with --iterations, a shared skew; not a trained "
               "gate",
    "ranks": "recorded at the --ranks (16, 32, 64: EP 2, 4, 8; with --iterations 32, 48, 64), extrapolated to --scale (paper: 512 dies, "
             "section 9.1)",
}


# the DLRM load: two steps (the second is timed), one embedding table per die, MLPerf's DLRM
# on Criteo Terabyte (embedding dimension 128, bottom MLP 13-512-256-128, top MLP
# 1024-1024-512-256-1 over the interaction, one index per sparse feature)
DLRM = ["--steps", "2", "--tables-per-rank", "1", "--dim", "128", "--pooling", "1", "--dense", "13", "--rows", "4096",
        "--bottom-mlp", "512,256,128", "--top-mlp", "1024,1024,512,256"]
DLRM_SOURCES = {
    "batch": "paper section 9, Workloads (Criteo Terabyte drives embedding accesses with a batch size of 1024); read "
             "as per die: section 9's Fig. 12b discussion speaks of 'the per-worker batch size', and TorchRec's DLRM example's "
             "--batch_size is each trainer's (1024 global over 128 dies would be 8 samples per die); fitted from "
             "the recorded batches",
    "ranks": "paper section 9, Workloads: 128 NPU dies; extrapolated from the recorded rank counts",
    "dim": "MLPerf DLRM (Criteo Terabyte) embedding dimension 128 (facebookresearch/dlrm, MLPerf training reference: --arch-sparse-feature-size 128)",
    "bottom_mlp": "MLPerf DLRM (Criteo Terabyte) bottom MLP 13-512-256-128 (--arch-mlp-bot)",
    "top_mlp": "MLPerf DLRM (Criteo Terabyte) top MLP 1024-1024-512-256-1 (--arch-mlp-top)",
    "dense": "Criteo Terabyte: 13 integer (dense) features",
    "pooling": "Criteo Terabyte: each of the 26 categorical features holds one value per sample (one-hot), "
               "so one index per bag",
    "tables_per_rank": "1, derived from the paper: 7 TiB of tables sharded table-wise over 128 dies of 64 GiB "
                       "HBM needs at least 7 TiB / 64 GiB = 112 tables; one per die (T = 128 at 128 dies, "
                       "56 GiB each) is the fewest that spreads them over every die. MLPerf's Criteo model "
                       "has 26 tables (too few for 128 dies), capped at 40M rows each (--max-ind-range), at most 0.5 TB "
                       "at dimension 128, not 7 TiB",
    "tables": "T = N (one per die): 128 at 128 dies",
    "interaction": "concatenation of the bottom MLP's output with the T pooled embeddings (the example's; "
                   "MLPerf's DLRM uses dot products: at T = 128 its top MLP would take 129 x 128 / 2 + 128 "
                   "= 8384 inputs instead of 129 x 128 = 16512, about half the first layer's weights and FLOPs)",
    "rows": "4096 per table, assumed: the step's time depends on the rows only through the example's dense "
            "SGD over the whole owned table (a zero-filled gradient of R x D); TorchRec's fused optimizer "
            "updates the looked-up rows only, so the paper's 117M rows per table (56 GiB / 512 B) are not "
            "charged; at 4096 the dense term is 6 MB of HBM traffic per step",
    "precision": "float32 (the example's bit-exact check); the paper does not state it",
}


def imbalance(iteration: float) -> float:
    """The experts' load imbalance (max / mean) at a training iteration: 1.05 + 0.95 exp(-i / 1000),
    2 at a cold start, 1.83 at 200, 1.18 at 2000, 1.056 at 5000. The shape and its e-folding time are
    assumed (docs/end-to-end.md, "The paper's deployments": no public curve; 2 from DeepSeek's EPLB
    example, about 1.05 by the paper's last iteration)."""
    import math
    return 1.05 + 0.95 * math.exp(-iteration / 1000.0)


def skewed_routing(load_imbalance: float):
    """ub.extrapolate's routing generator for a shared skew of the given imbalance: the exponent
    found for each call's expert count (ep.skew_for), so the imbalance holds at every N."""
    from stratacl import ep

    def draw(tokens, experts, topk, nranks, skew, seed):
        s = ep.skew_for(load_imbalance, experts, topk) if load_imbalance != 1.0 else 0.0
        return ep.routing(tokens, experts, topk, nranks, s, seed, shared=s > 0)
    return draw


def _flag(args: list[str], name: str, default):
    # the last one given wins, as argparse takes it (arguments after -- follow the load's)
    return type(default)(args[len(args) - args[::-1].index(name)]) if name in args else default


def widths(hidden: int) -> list[str]:
    """The training example's widths at ``hidden``: the dense block 2 H, each expert 2 H / 7."""
    if hidden % 7:
        raise SystemExit(f"paper_size: --workload train needs hidden sizes that are multiples of 7 (each expert's "
                         f"width is 2 H / 7, 2048 at 7168), got {hidden}")
    return ["--hidden", str(hidden), "--ffn", str(2 * hidden), "--expert-ffn", str(2 * hidden // 7)]


def ep_size(n: int, replicas: int = EXPERT_REPLICAS) -> int:
    """The training example's EP group at ``n`` ranks: N / 8 (``replicas``), so each expert has 8 replicas."""
    if n % replicas or n // replicas < 2:
        raise SystemExit(f"paper_size: --workload train runs EP groups of N / {replicas} ranks (the paper's "
                         f"EP 64 on 512 dies: {EXPERT_REPLICAS} replicas) with at least 2 in each; {n} ranks do not "
                         f"make them")
    return n // replicas


def record(config: str, n: int, hidden: int, args: list[str], tmp: str, workload: str = "serve",
           replicas: int = EXPERT_REPLICAS, tag: str = "") -> tuple[list, dict]:
    """The example at ``n`` ranks and ``hidden``: its traces and its timeline (None for training,
    whose EP groups are of ``n / replicas`` ranks). ``tag`` keeps recordings of other settings apart."""
    from stratacl import ub

    d = os.path.join(tmp, f"{config}-{n}-{hidden}{tag}")
    if workload == "train":
        _launch(WORKLOADS["train"][0], n, config, widths(hidden) + ["--ep", str(ep_size(n, replicas))], args, trace=d)
    elif workload == "dlrm":
        _launch(WORKLOADS["dlrm"][0], n, config, ["--batch", str(hidden)], args, trace=d)
    else:
        _launch(WORKLOADS["serve"][0], n, config, ["--timeline", os.path.join(d, "timeline.json"),
                                                   "--hidden", str(hidden)], args, trace=d)
    traces = ub.load_traces(d)
    if config == NOCOMM:     # _launch's topology file is gone with its directory: the same one, kept here
        for t in traces:
            t["settings"]["topology"] = _nocomm_topology(tmp)
    if workload in ("train", "dlrm"):
        return traces, None
    with open(os.path.join(d, "timeline.json")) as f:
        return traces, json.load(f)


def train_metrics(replay) -> dict:
    """examples/train_step.py's last step, as it prints it, from a replay of its traces: each rank
    reads its clock at every step's start and end; the slowest rank's last step."""
    import numpy as np

    clocks = np.array(replay.clocks)
    return {"modeled_step_us": float(np.max(clocks[:, -1] - clocks[:, -2]))}


def at_width(config: str, n: int, hiddens: list[int], target: int, args: list[str], tmp: str,
             workload: str = "serve", tag: str = "") -> tuple[list, dict]:
    """Every rank's traces at ``n`` ranks and hidden ``target``, fitted from ``hiddens`` (for
    DLRM, the batch per die)."""
    from stratacl import ub

    got = [record(config, n, h, args, tmp, workload, tag=tag) for h in hiddens]
    timelines = [t for _, t in got]
    if any(t != timelines[0] for t in timelines):
        raise ub.ReplayError(f"{config} at N={n}: the timelines differ between hidden sizes {hiddens}")
    print(f"  {config}: recorded N={n} at {'batch' if workload == 'dlrm' else 'hidden'} {hiddens}{tag}", flush=True)
    return ub.extrapolate_dimension([r for r, _ in got], hiddens, target), timelines[0]


def at_tokens(config: str, n: int, hiddens: list[int], target: int, tokens: list[int], target_tokens: int,
              args: list[str], tmp: str, tag: str = "") -> list:
    """Every rank's training traces at ``n`` ranks, hidden ``target`` and ``target_tokens`` tokens
    per replica: fitted in hidden at each of ``tokens``, then in the tokens (moe="fit")."""
    from stratacl import ub

    wide = [at_width(config, n, hiddens, target, args + ["--tokens", str(t)], tmp, "train", f"{tag}-t{t}")[0]
            for t in tokens]
    return ub.extrapolate_dimension(wide, tokens, target_tokens, moe="fit")


def train_dims(args: list[str], hiddens: list[int], target: int, ranks: list[int], n: int) -> dict:
    lx, tp, ep = _flag(args, "--experts-per-rank", 2), _flag(args, "--tp", 2), n // EXPERT_REPLICAS
    return {"hidden": target, "recorded_hidden": hiddens, "recorded_ranks": ranks, "ranks": n,
            "ffn": 2 * target, "expert_ffn": 2 * target // 7, "topk": _flag(args, "--topk", 4),
            "experts_per_rank": lx, "experts": lx * ep, "tp": tp, "fsdp": n // tp, "ep": ep,
            "expert_replicas": n // ep,
            "tokens": _flag(args, "--tokens", 16), "layers": _flag(args, "--layers", 2),
            "routing": _flag(args, "--routing", "gate"), "dtype": "float32", "row_bytes": 4 * target,
            "sources": TRAIN_SOURCES}


def dlrm_dims(args: list[str], batches: list[int], target: int, ranks: list[int], n: int) -> dict:
    P, D = _flag(args, "--tables-per-rank", 2), _flag(args, "--dim", 16)
    return {"batch": target, "recorded_batch": batches, "recorded_ranks": ranks, "ranks": n, "dim": D,
            "bottom_mlp": f"{_flag(args, '--dense', 13)}-{_flag(args, '--bottom-mlp', str(D)).replace(',', '-')}",
            "top_mlp": f"{_flag(args, '--top-mlp', '32').replace(',', '-')}-1", "dense": _flag(args, "--dense", 13),
            "pooling": _flag(args, "--pooling", 4), "tables_per_rank": P, "tables": P * n,
            "top_mlp_inputs": int(_flag(args, "--bottom-mlp", str(D)).split(",")[-1]) + P * n * D,
            "interaction": "concatenation", "rows": _flag(args, "--rows", 512), "precision": "float32",
            "sources": DLRM_SOURCES}


def dims(args: list[str], hiddens: list[int], target: int, ranks: list[int], n: int) -> dict:
    lx = _flag(args, "--experts-per-rank", 4)
    return {"hidden": target, "recorded_hidden": hiddens, "recorded_ranks": ranks, "ranks": n,
            "topk": _flag(args, "--topk", 8), "ffn": _flag(args, "--ffn", 128), "experts_per_rank": lx,
            "experts": lx * n, "layers": _flag(args, "--layers", 4), "routing": _flag(args, "--routing", "gate"),
            "dtype": _flag(args, "--rows", "float32"),
            "row_bytes": (2 if _flag(args, "--rows", "float32") == "float16" else 4) * target,
            "weight_bytes": _flag(args, "--weight-bytes", 4),
            "attention_weights": _flag(args, "--attention-weights", 0.0),
            "sources": SOURCES}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("serve", "train", "dlrm"), default="serve")
    p.add_argument("--configs", default="staged,roa,balanced,auto,pool",
                   help=f"e2e.py's CONFIGS, or {NOCOMM}: the fabric free, what bounds any library's gain")
    p.add_argument("--ranks", default=None, help="the two or three rank counts recorded (serve: 4,8; train: "
                                                 "16,32,64)")
    p.add_argument("--hidden", default=None, help="the two or three hidden sizes recorded (serve: 32,64,128; "
                                                  "train: 56,112,224, multiples of 7); dlrm: the batches per "
                                                  "die (128,256,512)")
    p.add_argument("--target", type=int, default=None, help="the hidden size (batch for dlrm) fitted to "
                                                            "(serve, train: 7168; dlrm: 1024)")
    p.add_argument("--scale", default=None, help="rank counts to extrapolate to (serve: 16,32; train: 128,512; "
                                                 "dlrm: 128)")
    p.add_argument("--json", default=None)
    p.add_argument("--keep", default=None, help="train: also pickle each configuration's traces at the target "
                                                "width (one list per recorded N) into this directory, to "
                                                "extrapolate them to other N later")
    p.add_argument("--check", action="store_true", help="every run also checks its results against the job "
                                                        "computed in one process (N times the compute)")
    p.add_argument("--verify", type=int, default=None, help="one configuration: the fit to this hidden size "
                                                            "against a real run at it, at each recorded N")
    p.add_argument("--tokens", default=None, help="train: two token counts per replica recorded, fitted to "
                                                  "--target-tokens (a second fitted dimension)")
    p.add_argument("--target-tokens", type=int, default=16384, help="train, with --tokens: the replica's tokens "
                                                                    "fitted to (the paper's 512 x 4096 / 128)")
    p.add_argument("--iterations", default=None, help="train: the iterations whose routing skew (imbalance(I)) "
                                                      "is recorded, one set of rows each")
    p.add_argument("--verify-ranks", type=int, default=None, help="train, with --iterations: the extrapolation in "
                                                                  "N (skewed routing) from --ranks against a real "
                                                                  "run at this many ranks, at the first --hidden "
                                                                  "and --tokens")
    p.add_argument("--cache-gib", default=None, help="dlrm: the per-die cache sizes (GiB of the paper's 7 TiB "
                                                     "over 128 dies) whose steady-state misses (benchmarks/"
                                                     "dlrm_misses.py, Zipf --zipf) examples/dlrm.py pays "
                                                     "(--miss-rate), one set of rows each")
    p.add_argument("--zipf", type=float, default=1.05, help="dlrm, with --cache-gib: the access law's exponent "
                                                            "(assumed: docs/end-to-end.md)")
    p.add_argument("--verify-tokens", type=int, default=None, help="train, with --tokens: the fit in the tokens "
                                                                   "against a real run at this many, at each "
                                                                   "recorded N and the first --hidden")
    a = p.parse_args(argv)
    train = a.workload == "train"
    dlrm = a.workload == "dlrm"
    a.ranks = a.ranks or ("16,32,64" if train else "4,8")
    a.hidden = a.hidden or ("56,112,224" if train else "128,256,512" if dlrm else "32,64,128")
    a.scale = a.scale if a.scale is not None else ("128,512" if train else "128" if dlrm else "16,32")
    a.target = a.target or (1024 if dlrm else 7168)
    if train and (a.tokens or a.iterations or a.verify_ranks):
        return train_tokens_main(a, TRAIN + ([] if a.check else NO_CHECK) + extra)
    variants = [({}, [])]
    if dlrm and a.cache_gib:
        from dlrm_misses import per_die
        variants = []
        for g in (float(x) for x in a.cache_gib.split(",")):
            die = per_die(g, a.zipf)
            variants.append(({"cache_gib": g, "zipf": a.zipf, "miss_rate": die["miss_fraction"],
                              "cache_fraction": die["cache_fraction"]},
                             ["--miss-rate", repr(die["miss_fraction"])]))
    if train or dlrm:
        return train_main(a, (TRAIN if train else DLRM) + ([] if a.check else NO_CHECK) + extra, a.workload,
                          variants)
    from stratacl import ep, ub

    args = LOAD + PAPER + ([] if a.check else NO_CHECK) + extra
    configs = a.configs.split(",")
    ranks = [int(x) for x in a.ranks.split(",")]
    hiddens = [int(x) for x in a.hidden.split(",")]
    scales = [int(x) for x in a.scale.split(",")] if a.scale else []
    command = " ".join(["python", "benchmarks/paper_size.py", *sys.argv[1:]])
    rows = []
    with tempfile.TemporaryDirectory(prefix="stratacl-paper-size-") as tmp:
        if a.verify is not None:
            config, fitted = configs[0], []
            for n in ranks:
                traces, timeline = at_width(config, n, hiddens, a.verify, args, tmp)
                fitted.append(traces)
                real, real_timeline = record(config, n, a.verify, args, tmp)
                fit_m, real_m = serving_metrics(ub.replay(traces), timeline, n), \
                    serving_metrics(ub.replay(real), real_timeline, n)
                err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                print(f"{config} N={n} hidden {hiddens} -> {a.verify}: fitted {fit_m}\n  real {real_m}\n"
                      f"  relative error {err}", flush=True)
                rows.append({"config": config, "ranks": n, "hidden": a.verify, "recorded_hidden": hiddens,
                             "fitted": fit_m, "real": real_m, "relative_error": err})
            for n in scales:            # and in N, against a real run at n ranks and the target width
                fit_m = serving_metrics(ub.replay(ub.extrapolate(*fitted, n, routing=ep.routing)), timeline, n)
                real, real_timeline = record(config, n, a.verify, args, tmp)
                real_m = serving_metrics(ub.replay(real), real_timeline, n)
                err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                print(f"{config} N={ranks} -> {n}, hidden {hiddens} -> {a.verify}: fitted {fit_m}\n  real {real_m}\n"
                      f"  relative error {err}", flush=True)
                rows.append({"config": config, "ranks": n, "recorded_ranks": ranks, "hidden": a.verify,
                             "recorded_hidden": hiddens, "fitted": fit_m, "real": real_m, "relative_error": err})
            if a.json:
                with open(a.json, "w") as f:
                    json.dump({"command": command, "verify": rows}, f, indent=1)
            return 0
        print(f"{'config':<10}{'ranks':>6}{'throughput (tok/s)':>20}{'P99 TTFT (us)':>15}{'P99 TPOT (us)':>15}",
              flush=True)
        for config in configs:
            try:
                fitted = [at_width(config, n, hiddens, a.target, args, tmp) for n in ranks]
            except ub.ReplayError as e:
                print(f"{config:<10} not extrapolated: {e}", flush=True)
                continue
            timeline = fitted[-1][1]
            found = [(n, ub.replay(t)) for n, (t, _) in zip(ranks, fitted)]
            found += [(n, ub.replay(ub.extrapolate(*[t for t, _ in fitted], n, routing=ep.routing))) for n in scales]
            for n, rep in found:
                row = _row("serve", config, n, "paper-size", serving_metrics(rep, timeline, n), args)
                row["dims"] = dims(args, hiddens, a.target, ranks, n)
                rows.append(row)
                print(f"{config:<10}{n:>6}{row['throughput']:>20.1f}{row['p99_ttft_us']:>15.1f}"
                      f"{row['p99_tpot_us']:>15.1f}", flush=True)
            if a.json:            # after every configuration: a partial run keeps what it finished
                with open(a.json, "w") as f:
                    json.dump({"command": command, "rows": rows}, f, indent=1)
    return 0


def train_main(a, args: list[str], workload: str = "train", variants=(({}, []),)) -> int:
    """``--workload train`` or ``dlrm``: the training step's time at the target width (batch),
    at the recorded rank counts and at each N of ``--scale``; or, with ``--verify H``, the fit
    against real runs. ``variants``: (fields, arguments) pairs, each run with its arguments
    added and its fields written into its rows (dlrm's cache sizes)."""
    from stratacl import ep, ub

    configs = a.configs.split(",")
    ranks = [int(x) for x in a.ranks.split(",")]
    hiddens = [int(x) for x in a.hidden.split(",")]
    scales = [int(x) for x in a.scale.split(",")] if a.scale else []
    command = " ".join(["python", "benchmarks/paper_size.py", *sys.argv[1:]])
    rows = []
    what = "batch" if workload == "dlrm" else "hidden"

    def save(key):
        if a.json:            # after every configuration: a partial run keeps what it finished
            with open(a.json, "w") as f:
                json.dump({"command": command, key: rows}, f, indent=1)

    with tempfile.TemporaryDirectory(prefix="stratacl-paper-size-") as tmp:
        base = args
        for fields, more in variants:
            run = base + more
            tag = "".join(f"-{k}{v:g}" for k, v in fields.items() if k == "cache_gib")
            if a.verify is not None:
                config, fitted = configs[0], []
                for n in ranks:
                    traces, _ = at_width(config, n, hiddens, a.verify, run, tmp, workload, tag)
                    fitted.append(traces)
                    fit_m = train_metrics(ub.replay(traces))
                    real_m = train_metrics(ub.replay(record(config, n, a.verify, run, tmp, workload, tag=tag + "-real")[0]))
                    err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                    print(f"{config} N={n} {what} {hiddens} -> {a.verify}: fitted {fit_m}, real {real_m}, "
                          f"relative error {err}", flush=True)
                    rows.append({"config": config, "ranks": n, what: a.verify, f"recorded_{what}": hiddens,
                                 "fitted": fit_m, "real": real_m, "relative_error": err, **fields})
                    save("verify")
                for n in scales:            # and in N, against a real run at n ranks and the verified width
                    fit_m = train_metrics(ub.replay(ub.extrapolate(*fitted, n, routing=ep.routing)))
                    real_m = train_metrics(ub.replay(record(config, n, a.verify, run, tmp, workload, tag=tag + "-real")[0]))
                    err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                    print(f"{config} N={ranks} -> {n}, {what} {hiddens} -> {a.verify}: fitted {fit_m}, real {real_m}, "
                          f"relative error {err}", flush=True)
                    rows.append({"config": config, "ranks": n, "recorded_ranks": ranks, what: a.verify,
                                 f"recorded_{what}": hiddens, "fitted": fit_m, "real": real_m, "relative_error": err,
                                 **fields})
                    save("verify")
                continue
            print(f"{'config':<10}{'ranks':>6}{'modeled step (us)':>20}  {tag[1:]}", flush=True)
            for config in configs:
                try:
                    fitted = [at_width(config, n, hiddens, a.target, run, tmp, workload, tag)[0] for n in ranks]
                except ub.ReplayError as e:
                    print(f"{config:<10} not extrapolated: {e}", flush=True)
                    continue
                if a.keep:
                    import pickle
                    os.makedirs(a.keep, exist_ok=True)
                    with open(os.path.join(a.keep, f"{config}{tag}.pkl"), "wb") as f:
                        pickle.dump({"ranks": ranks, "hidden": a.target, "traces": fitted}, f)
                found = [(n, t) for n, t in zip(ranks, fitted)]
                found += [(n, None) for n in scales]
                for n, traces in found:
                    if traces is None:
                        traces = ub.extrapolate(*fitted, n, routing=ep.routing)
                    row = _row(workload, config, n, "paper-size", train_metrics(ub.replay(traces)), run + ["--batch", str(a.target)])
                    row["dims"] = (train_dims if workload == "train" else dlrm_dims)(run, hiddens, a.target, ranks, n)
                    row.update(fields)
                    rows.append(row)
                    print(f"{config:<10}{n:>6}{row['modeled_step_us']:>20.1f}", flush=True)
                    save("rows")
    return 0


def train_tokens_main(a, args: list[str]) -> int:
    """``--workload train`` with ``--tokens`` and/or ``--iterations``: per configuration and
    iteration, the step at the target width and tokens, at the recorded rank counts and at each N
    of ``--scale``; or, with ``--verify-tokens T``, the fit in the tokens against real runs."""
    from stratacl import ub

    configs = a.configs.split(",")
    ranks = [int(x) for x in a.ranks.split(",")]
    hiddens = [int(x) for x in a.hidden.split(",")]
    scales = [int(x) for x in a.scale.split(",")] if a.scale else []
    tokens = [int(x) for x in a.tokens.split(",")] if a.tokens else [_flag(args, "--tokens", 64)]
    target_tokens = a.target_tokens if a.tokens else tokens[0]
    iterations = [int(x) for x in a.iterations.split(",")] if a.iterations else [None]
    command = " ".join(["python", "benchmarks/paper_size.py", *sys.argv[1:]])
    rows = []

    def save(key):
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"command": command, key: rows}, f, indent=1)

    def skew_args(it):
        return [] if it is None else ["--imbalance", f"{imbalance(it):.6f}"]

    with tempfile.TemporaryDirectory(prefix="stratacl-paper-size-") as tmp:
        if a.verify_ranks is not None:
            config, h, t = configs[0], hiddens[0], tokens[0]
            for it in iterations:
                run = args + skew_args(it) + ["--tokens", str(t)]
                load = 1.0 if it is None else imbalance(it)
                got = [record(config, n, h, run, tmp, "train", tag=f"-i{it}")[0] for n in ranks]
                fit_m = train_metrics(ub.replay(ub.extrapolate(*got, a.verify_ranks, routing=skewed_routing(load))))
                real_m = train_metrics(ub.replay(record(config, a.verify_ranks, h, run, tmp, "train",
                                                        tag=f"-i{it}-real")[0]))
                err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                print(f"{config} N={ranks} -> {a.verify_ranks}, hidden {h}, {t} tokens, iteration {it}: fitted {fit_m}, "
                      f"real {real_m}, relative error {err}", flush=True)
                rows.append({"config": config, "ranks": a.verify_ranks, "recorded_ranks": ranks, "hidden": h,
                             "tokens": t, "iteration": it, "imbalance": load, "fitted": fit_m, "real": real_m,
                             "relative_error": err})
                save("verify")
            return 0
        if a.verify_tokens is not None:
            config, h = configs[0], hiddens[0]
            for it in iterations:
                run = args + skew_args(it)
                for n in ranks:
                    got = [record(config, n, h, run + ["--tokens", str(t)], tmp, "train", tag=f"-i{it}-t{t}")[0]
                           for t in tokens]
                    fit_m = train_metrics(ub.replay(ub.extrapolate_dimension(got, tokens, a.verify_tokens,
                                                                             moe="fit")))
                    real_m = train_metrics(ub.replay(record(config, n, h, run + ["--tokens", str(a.verify_tokens)],
                                                            tmp, "train", tag=f"-i{it}-real")[0]))
                    err = {k: fit_m[k] / real_m[k] - 1 for k in fit_m}
                    print(f"{config} N={n} hidden {h} iteration {it}: tokens {tokens} -> {a.verify_tokens}: fitted "
                          f"{fit_m}, real {real_m}, relative error {err}", flush=True)
                    rows.append({"config": config, "ranks": n, "hidden": h, "iteration": it,
                                 "imbalance": None if it is None else imbalance(it), "tokens": a.verify_tokens,
                                 "recorded_tokens": tokens, "fitted": fit_m, "real": real_m, "relative_error": err})
                    save("verify")
            return 0
        print(f"{'config':<10}{'iteration':>10}{'ranks':>6}{'modeled step (us)':>20}", flush=True)
        for config in configs:
            for it in iterations:
                run = args + skew_args(it)
                load = 1.0 if it is None else imbalance(it)
                try:
                    fitted = [at_tokens(config, n, hiddens, a.target, tokens, target_tokens, run, tmp, f"-i{it}")
                              if a.tokens else at_width(config, n, hiddens, a.target, run, tmp, "train", f"-i{it}")[0]
                              for n in ranks]
                except ub.ReplayError as e:
                    print(f"{config:<10} not extrapolated: {e}", flush=True)
                    continue
                if a.keep:           # for train_breakdown.py --iteration: the traces and the skew they extrapolate with
                    import pickle
                    os.makedirs(a.keep, exist_ok=True)
                    with open(os.path.join(a.keep, f"{config}-i{it}.pkl"), "wb") as f:
                        pickle.dump({"ranks": ranks, "hidden": a.target, "tokens": target_tokens, "iteration": it,
                                     "imbalance": load, "traces": fitted}, f)
                for n, traces in [(n, t) for n, t in zip(ranks, fitted)] + [(n, None) for n in scales]:
                    if traces is None:
                        traces = ub.extrapolate(*fitted, n, routing=skewed_routing(load))
                    row = _row("train", config, n, "paper-size", train_metrics(ub.replay(traces)),
                               run + ["--batch", str(a.target)])
                    row["dims"] = train_dims(run + ["--tokens", str(target_tokens)], hiddens, a.target, ranks, n)
                    row["dims"]["recorded_tokens"] = tokens
                    row["iteration"], row["imbalance"] = it, load
                    rows.append(row)
                    print(f"{config:<10}{str(it):>10}{n:>6}{row['modeled_step_us']:>20.1f}", flush=True)
                    save("rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
