"""The pool's memory tax: allocation traces of an LLM serving loop and of an FSDP training step,
replayed through the caching allocator (what a pre-registered pool forces) and through the
expandable one with registration-on-allocation. A benchmark, not a test: it prints markdown
tables (progress on stderr). See docs/memory.md for a recorded run and how to read it.

    python benchmarks/fragmentation.py                  # both traces, per-die scale (~5 min)
    python benchmarks/fragmentation.py --quick          # fewer steps, smaller search (~1 min)
    python benchmarks/fragmentation.py --json rows.json

The model is DeepSeek-V3 as its public configuration gives it
(https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json; DeepSeek-V3.2, the
paper's training model, has the same shapes), on one die with 64 GiB of HBM, the paper's
CM384 die. Each trace is a list of allocations and frees of the tensors one die holds, built
from the configuration and a deployment (below), with a batch size as its parameter:

- ``serving``: a decode instance (EP=32, attention data-parallel, int8 weights, bf16
  activations and MLA latent KV cache). Requests (prompt and output lengths drawn with the
  8:1 ratio of the paper's Splitwise conversation trace) occupy up to ``batch`` slots; a
  finished request's slot is refilled a few steps later, so the batch varies. The KV cache
  grows in pages of 256 tokens (all layers) as requests generate. Each step runs two
  micro-batches with two-batch overlap (TBO): one micro-batch's buffers stay alive while the
  other's phase runs. MTP doubles the decode tokens; MoE dispatch and combine buffers follow
  the routing, which varies by layer and step.
- ``training``: one die of the paper's FSDP=128, TP=4, EP=64 deployment, sequences of 4096
  tokens (sequence-parallel: 1024 tokens per sequence per die). Parameters, gradients, fp32
  master weights and Adam states are sharded and persistent (the optimizer states appear at
  the first step); each layer's parameters are all-gathered (the next layer's prefetched)
  forward and backward; layer inputs are checkpointed; MoE buffers follow the routing;
  unsharded gradients live until they are reduce-scattered. ``batch`` is sequences per die.

Each trace is replayed, nothing touched (HBM is sparse: the host backs only touched pages, so
the full per-die scale fits this host), in a one-rank job for each allocator:
``caching`` under ``registration=pool`` (the pool pre-registers all HBM, so the allocator
cannot remap) and ``expandable`` under ``registration=roa``. Reported per trace and allocator:
the largest batch that replays without OutOfMemory in 64 GiB (binary search), and, at the
caching allocator's largest batch (the workload both can run), the peak bytes allocated and
reserved and their difference, the fragmentation.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

import stratacl

GiB, MiB = 1024**3, 1024**2

# deepseek-ai/DeepSeek-V3 config.json
CONFIG = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
              first_k_dense_replace=3, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
              num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
              qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280, num_nextn_predict_layers=1)
HBM = 64 * GiB


def _shapes(c: dict) -> dict:
    """Parameter counts of one layer's parts."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attn = dict(q_a=h * c["q_lora_rank"], q_b=c["q_lora_rank"] * heads * qk,
                kv_a=h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]),
                kv_b=c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]),
                o=heads * c["v_head_dim"] * h)
    return dict(attn=attn, attn_total=sum(attn.values()), expert=3 * h * c["moe_intermediate_size"],
                dense=3 * h * c["intermediate_size"], embed=c["vocab_size"] * h)


class Trace:
    """Allocations and frees, by key: ("a", key, nbytes) and ("f", key)."""

    def __init__(self):
        self.ops: list[tuple] = []
        self._next = 0

    def alloc(self, nbytes: int) -> int:
        self._next += 1
        self.ops.append(("a", self._next, int(nbytes)))
        return self._next

    def free(self, *keys: int) -> None:
        for k in keys:
            self.ops.append(("f", k))


# --- serving ------------------------------------------------------------------------------------
SERVE = dict(ep=32, dp=32, page_tokens=256, mtp_accept=0.7, prompt_mean=1024, output_mean=128,
             refill_steps=3, route_sigma=0.25)


def serving_trace(batch: int, steps: int, seed: int, c: dict = CONFIG, d: dict = SERVE) -> Trace:
    rng = np.random.default_rng(seed)
    sh, t = _shapes(c), Trace()
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    local = c["n_routed_experts"] // d["ep"]
    # weights, int8, allocated once: per layer the attention matrices, then the layer's FFN
    for layer in range(layers + c["num_nextn_predict_layers"]):
        for n in sh["attn"].values():
            t.alloc(n)
        if layer < c["first_k_dense_replace"]:
            t.alloc(sh["dense"])
        else:
            t.alloc(local * sh["expert"])
            t.alloc(c["n_shared_experts"] * sh["expert"])
            t.alloc(c["n_routed_experts"] * h * 4)          # router, fp32
    t.alloc(sh["embed"])
    t.alloc(sh["embed"])
    page = d["page_tokens"] * layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2

    def new_request():
        p = max(16, int(rng.lognormal(math.log(d["prompt_mean"]) - 0.5, 1.0)))
        o = max(4, int(rng.lognormal(math.log(d["output_mean"]) - 0.5, 1.0)))
        return {"len": p, "left": o, "pages": [t.alloc(page) for _ in range(-(-p // d["page_tokens"]))]}

    slots: list = []
    for _ in range(batch):                   # steady state: requests part-way through
        r = new_request()
        slots.append(r)
    waiting = [0] * batch                    # steps until an empty slot is refilled
    for step in range(steps):
        for i in range(batch):
            if slots[i] is None:
                waiting[i] -= 1
                if waiting[i] <= 0:
                    slots[i] = new_request()
        active = [r for r in slots if r is not None]
        if not active:
            continue
        tokens = 2 * len(active)             # MTP: one draft token per request
        mbs = [tokens // 2, tokens - tokens // 2]
        _decode_step(t, rng, c, sh, d, local, mbs)
        for i, r in enumerate(slots):
            if r is None:
                continue
            gained = 1 + int(rng.random() < d["mtp_accept"])
            r["len"] += gained
            r["left"] -= gained
            while len(r["pages"]) * d["page_tokens"] < r["len"]:
                r["pages"].append(t.alloc(page))
            if r["left"] <= 0:
                t.free(*r["pages"])
                slots[i] = None
                waiting[i] = int(rng.integers(1, d["refill_steps"] + 1))
    return t


def _decode_step(t: Trace, rng, c: dict, sh: dict, d: dict, local: int, mbs: list[int]) -> None:
    """One decode step of two micro-batches under two-batch overlap: phases alternate between
    the micro-batches and a phase's buffers are freed only once the other micro-batch's next
    phase has allocated its own (they are in use concurrently)."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    lat = c["kv_lora_rank"]
    topk = c["num_experts_per_tok"]
    hidden = [t.alloc(n * h * 2) for n in mbs]
    pending: list[int] = []

    def attention(n: int) -> list[int]:
        bufs = [t.alloc(n * h * 2), t.alloc(n * c["q_lora_rank"] * 2),
                t.alloc(n * heads * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) * 2),
                t.alloc(n * heads * lat * 2), t.alloc(n * heads * lat * 2), t.alloc(n * heads * c["v_head_dim"] * 2)]
        return bufs

    def moe(n: int, dense: bool) -> list[int]:
        if dense:
            return [t.alloc(n * h * 2), t.alloc(n * 2 * c["intermediate_size"] * 2), t.alloc(n * h * 2)]
        # rows this die's experts receive: every DP rank's tokens routed to them, as the routing falls
        rows = max(1, int(n * topk * local / c["n_routed_experts"] * d["dp"] * rng.lognormal(0, d["route_sigma"])))
        inter = c["moe_intermediate_size"]
        return [t.alloc(n * c["n_routed_experts"] * 4), t.alloc(n * topk * 8), t.alloc(n * h),
                t.alloc(rows * h), t.alloc(rows * 2 * inter * 2), t.alloc(rows * h * 2),
                t.alloc(n * topk * h * 2), t.alloc(n * 2 * inter * 2)]

    for layer in range(layers + c["num_nextn_predict_layers"]):
        dense = layer < c["first_k_dense_replace"]
        for phase in (attention, moe):
            for m, n in enumerate(mbs):
                bufs = phase(n) if phase is attention else phase(n, dense)
                t.free(*pending)                      # the other micro-batch's phase is over
                out = t.alloc(n * h * 2)
                t.free(hidden[m])
                hidden[m] = out
                pending = bufs
    t.free(*pending)
    logits = [t.alloc(n * c["vocab_size"] * 4) for n in mbs]
    t.free(*logits, *hidden)


# --- serving DeepSeek V4 Flash as the paper deploys it (docs/end-to-end.md, "Serving as the paper deploys it")
def _deploy():
    """examples/serving_deployment.py: the deployment's numbers, one definition."""
    import os
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
    import serving_deployment
    return serving_deployment


V4_DECODE = dict(ep=16, page_tokens=256, rows=2, row_bytes=2)     # EP 16; MTP: 2 rows a request; bf16


def serving_v4_trace(batch: int, steps: int, seed: int, staged: bool = False, d: dict = V4_DECODE) -> Trace:
    """A decode die of a V4 Flash decode instance with ``batch`` requests a die: its weights
    (int8), each request's KV (the windows at admission, 256-token pages of compressed entries as
    it grows), each step's activations (MTP: two rows a request, in two micro-batches under
    TBO), the low-latency dispatch's receive buffer and the combine's input as
    examples/moe_serving.py allocates them ([local experts, ranks x tokens a rank, hidden],
    tokens a rank from the batch), the logits; ``staged``: also the communication buffers the
    runtime keeps for staged calls (the largest staged input and output, each rounded up to a
    power of two, runtime/pipeline/_buffers.buffer_size, never freed). Each slot starts part-way through
    a request (uniformly), so the peak is a steady state's."""
    from stratacl.runtime.pipeline import buffer_size

    v4 = _deploy()
    rng = np.random.default_rng(seed)
    t = Trace()
    h, e, local = v4.HIDDEN, v4.EXPERTS, v4.EXPERTS // d["ep"]
    layers = v4.LAYERS + v4.MTP_LAYERS
    shared, router = v4.EXPERT_WEIGHTS, e * h * 4
    for _ in range(layers):                   # int8 weights, allocated once
        t.alloc(int(v4.DENSE_PER_LAYER) - shared - router // 4)      # attention, indexer, compressors
        t.alloc(shared)
        t.alloc(router)                       # the router, fp32
        t.alloc(local * v4.EXPERT_WEIGHTS)    # the die's routed experts, one grouped weight
    t.alloc(v4.VOCAB * h)
    t.alloc(v4.VOCAB * h)
    page = d["page_tokens"] * v4.KV_TOKEN_BYTES
    cap = d["rows"] * ((batch + 1) // 2)      # tokens a rank a micro-batch (moe_serving's LL_CAP)
    ll = local * d["ep"] * cap * h * d["row_bytes"]    # [local experts, ranks x cap, hidden]
    if staged:                                # kept for good: the largest staged input and output
        t.alloc(buffer_size(ll))
        t.alloc(buffer_size(ll))

    def new_request(part_way: bool):
        ins, outs = v4.splitwise_lengths(rng, 1)
        done = int(rng.integers(0, outs[0])) if part_way else 0
        r = {"len": int(ins[0]) + done, "left": int(outs[0]) - done, "window": t.alloc(v4.KV_REQUEST_BYTES)}
        r["pages"] = [t.alloc(page) for _ in range(-(-r["len"] // d["page_tokens"]))]
        return r

    slots = [new_request(True) for _ in range(batch)]
    for _ in range(steps):
        for i in range(batch):
            if slots[i] is None:
                slots[i] = new_request(False)
        active = batch
        mbs = [d["rows"] * ((active + 1) // 2), d["rows"] * (active // 2)]
        _decode_step_v4(t, v4, mbs, local, d, ll)
        for i, r in enumerate(slots):
            gained = 1 + int(rng.random() < v4.MTP_ACCEPT)        # MTP: the draft kept or not
            r["len"] += gained
            r["left"] -= gained
            while len(r["pages"]) * d["page_tokens"] < r["len"]:
                r["pages"].append(t.alloc(page))
            if r["left"] <= 0:
                t.free(r["window"], *r["pages"])
                slots[i] = None
    return t


def _decode_step_v4(t: Trace, v4, mbs: list[int], local: int, d: dict, ll: int) -> None:
    """One decode step: per layer an attention phase and a MoE phase for each micro-batch, a
    phase's buffers freed once the other micro-batch's next phase has allocated its own (TBO)."""
    h, b = v4.HIDDEN, d["row_bytes"]
    hidden = [t.alloc(n * h * b) for n in mbs]
    pending: list[int] = []

    def attention(n: int) -> list[int]:
        return [t.alloc(n * h * b), t.alloc(n * 1024 * b), t.alloc(n * v4.HEADS * v4.HEAD_DIM * b),
                t.alloc(n * v4.INDEX_HEADS * v4.INDEX_DIM * b), t.alloc(n * v4.HEADS * v4.HEAD_DIM * b),
                t.alloc(n * 8 * 1024 * b)]

    def moe(n: int) -> list[int]:
        rows = n * v4.TOPK      # rows this die's experts compute, on average
        return [t.alloc(n * v4.EXPERTS * 4), t.alloc(n * v4.TOPK * 8), t.alloc(ll),
                t.alloc(rows * 2 * v4.EXPERT_FFN * b), t.alloc(ll), t.alloc(n * h * b)]

    for layer in range(v4.LAYERS + v4.MTP_LAYERS):
        scale = 2 if layer == v4.LAYERS else 1            # the MTP layer: one row a request
        for phase in (attention, moe):
            for m, n in enumerate(mbs):
                bufs = phase(max(1, n // scale))
                t.free(*pending)
                out = t.alloc(n * h * b)
                t.free(hidden[m])
                hidden[m] = out
                pending = bufs
    t.free(*pending)
    logits = [t.alloc(n * v4.VOCAB * 4) for n in mbs]
    t.free(*logits, *hidden)


# --- training -----------------------------------------------------------------------------------
TRAIN = dict(tp=4, ep=64, fsdp=128, dies=512, seq=4096, route_sigma=0.25)


def training_trace(batch: int, steps: int, seed: int, c: dict = CONFIG, d: dict = TRAIN) -> Trace:
    rng = np.random.default_rng(seed)
    sh, t = _shapes(c), Trace()
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    tp, local = d["tp"], c["n_routed_experts"] // d["ep"]
    tokens = batch * d["seq"] // tp                  # sequence-parallel share of the micro-batch
    nlayers = layers + c["num_nextn_predict_layers"]

    edp = d["dies"] // d["ep"]                       # the experts' data-parallel group

    def layer_units(layer: int) -> list[tuple[int, int]]:
        """The layer's FSDP units on this die: (unsharded parameters after the TP / EP split,
        how many dies shard them)."""
        attn = (sh["attn_total"] // tp, d["fsdp"])
        if layer < c["first_k_dense_replace"]:
            return [attn, (sh["dense"] // tp, d["fsdp"])]
        return [attn, (local * sh["expert"], edp), (c["n_shared_experts"] * sh["expert"] // tp, d["fsdp"])]

    unit_shards = [layer_units(i) for i in range(nlayers)]
    units = [[n for n, _ in u] for u in unit_shards]
    # the die's shard of every unit: bf16 parameters and fp32 gradients, persistent
    shard = [[max(1, n // k) for n, k in u] for u in unit_shards]
    for u in shard:
        for n in u:
            t.alloc(2 * n)
            t.alloc(4 * n)
    embed_shard = sh["embed"] // d["dies"]
    for _ in range(2):
        t.alloc(2 * embed_shard)
        t.alloc(4 * embed_shard)
    optimizer: list[int] = []
    for step in range(steps):
        gathered: dict[int, list[int]] = {}

        def gather(i: int) -> None:
            if 0 <= i < nlayers and i not in gathered:
                gathered[i] = [t.alloc(2 * n) for n in units[i]]

        embed_out = t.alloc(tokens * h * 2)
        checkpoints = []
        x = embed_out
        gather(0)
        for i in range(nlayers):
            gather(i + 1)                             # prefetch
            checkpoints.append(x)
            transient = _layer_transients(t, rng, c, d, tokens, i, local)
            x = t.alloc(tokens * h * 2)
            t.free(*transient, *gathered.pop(i))
        logits = t.alloc(tokens * c["vocab_size"] // tp * 4)
        grad = t.alloc(tokens * h * 2)
        t.free(logits, x)
        gather(nlayers - 1)
        for i in reversed(range(nlayers)):
            gather(i - 1)                             # prefetch
            recomputed = _layer_transients(t, rng, c, d, tokens, i, local)
            grad_in = t.alloc(tokens * h * 2)
            grads = [t.alloc(2 * n) for n in units[i]]          # unsharded, until reduce-scattered
            t.free(*recomputed)
            t.free(*grads, *gathered.pop(i), grad, checkpoints[i])
            grad = grad_in
        t.free(grad)
        if not optimizer:                             # Adam states and fp32 master weights, lazily
            for u in shard:
                for n in u:
                    optimizer += [t.alloc(4 * n), t.alloc(4 * n), t.alloc(4 * n)]
        for u in shard:                               # foreach update temporaries
            tmp = [t.alloc(4 * n) for n in u]
            t.free(*tmp)
    return t


def _layer_transients(t: Trace, rng, c: dict, d: dict, tokens: int, layer: int, local: int) -> list[int]:
    """The buffers one layer's forward (or its recomputation) allocates and frees."""
    h, tp = c["hidden_size"], d["tp"]
    heads = c["num_attention_heads"] // tp
    full = tokens * tp                                # attention sees the whole sequence
    bufs = [t.alloc(full * h * 2), t.alloc(full * heads * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) * 2),
            t.alloc(full * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]) * 2),
            t.alloc(full * heads * c["v_head_dim"] * 2), t.alloc(tokens * h * 2)]
    t.free(*bufs[:4])
    bufs = bufs[4:]
    if layer < c["first_k_dense_replace"]:
        bufs.append(t.alloc(tokens * 2 * c["intermediate_size"] // tp * 2))
        return bufs
    topk, inter = c["num_experts_per_tok"], c["moe_intermediate_size"]
    rows = max(1, int(tokens * topk * rng.lognormal(0, d["route_sigma"])))
    moe = [t.alloc(tokens * c["n_routed_experts"] * 4), t.alloc(rows * h * 2), t.alloc(rows * 2 * inter * 2),
           t.alloc(rows * h * 2), t.alloc(tokens * topk * h * 2)]
    t.free(*moe[:3])
    return bufs + moe[3:]


TRACES = {"serving": serving_trace, "training": training_trace, "serving-v4flash": serving_v4_trace,
          "serving-v4flash-staged": lambda batch, steps, seed: serving_v4_trace(batch, steps, seed, staged=True)}


# --- inside the one-rank job --------------------------------------------------------------------
def _replay(ops: list[tuple]) -> tuple[bool, dict]:
    arrays: dict[int, np.ndarray] = {}
    stratacl.reset_peak_memory_stats()
    stratacl.reset_accumulated_memory_stats()
    ok = True
    try:
        for op in ops:
            if op[0] == "a":
                arrays[op[1]] = stratacl.empty((op[2],), np.uint8)
            else:
                del arrays[op[1]]
    except stratacl.OutOfMemory:
        ok = False
    s = stratacl.memory_stats()
    arrays.clear()
    stratacl.empty_cache()
    return ok, {"peak_requested": s["requested_bytes.all.peak"], "peak_allocated": s["allocated_bytes.all.peak"],
                "peak_reserved": s["reserved_bytes.all.peak"], "num_alloc_retries": s["num_alloc_retries"]}


def run_allocator(comm, trace: str, steps: int, seed: int, lo: int, hi: int, measure_at: int | None) -> list[dict]:
    """The largest batch in [lo, hi] that replays (binary search), and the peaks at that batch
    and at ``measure_at``."""
    make = TRACES[trace]
    tried = {}

    def fits(b: int) -> bool:
        t0 = time.perf_counter()
        ok, peaks = _replay(make(b, steps, seed).ops)
        tried[b] = (ok, peaks)
        print(f"  {trace} {stratacl.config.registration}/{stratacl.runtime._world._RUNTIME.allocator.kind} "
              f"batch {b}: {'fits' if ok else 'OOM'} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        return ok

    if not fits(lo):
        best = 0
    else:
        best = lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = best = mid
            else:
                hi = mid - 1
    # the search assumes a batch that does not fit is followed by none that does: spot-check it
    above = [b for b in range(best + 1, best + 4) if b <= hi and (b in tried and tried[b][0] or b not in tried and fits(b))]
    out = []
    for at in sorted({best} | ({measure_at} if measure_at is not None else set())):
        ok, peaks = tried[at] if at in tried else _replay(make(at, steps, seed).ops)
        out.append({"max_batch": best, "batch": at, "fits": ok, "larger_that_fit": above, **peaks})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="serving,training")
    ap.add_argument("--model", choices=("v3", "v4flash"), default="v3",
                    help="v4flash: a decode die of the paper's V4 Flash deployment (EP 16), the largest batch under "
                         "the pool's caching allocator, the expandable one, and the expandable one with the staged "
                         "path's communication buffers (HCCL): the decode batch caps of docs/end-to-end.md")
    ap.add_argument("--quick", action="store_true", help="fewer steps, a narrower search")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    steps = {"serving": 12 if args.quick else 48, "training": 2 if args.quick else 3,
             "serving-v4flash": 8 if args.quick else 24}
    bounds = {"serving": (16, 1024), "training": (1, 64), "serving-v4flash": (16, 8192)}
    rows = []
    t_all = time.perf_counter()
    for trace in (["serving-v4flash"] if args.model == "v4flash" else args.traces.split(",")):
        lo, hi = bounds[trace]
        common = dict(hbm_size=str(HBM), timeout=3600)
        caching, = stratacl.spawn(run_allocator, 1, args=(trace, steps[trace], args.seed, lo, hi, None),
                                  registration="pool", allocator="caching", **common)
        expandable, = stratacl.spawn(run_allocator, 1, args=(trace, steps[trace], args.seed, lo, hi,
                                                             caching[0]["max_batch"]),
                                     registration="roa", allocator="expandable", **common)
        found = [("caching (pool)", caching), ("expandable (roa)", expandable)]
        if trace == "serving-v4flash":        # HCCL: the expandable allocator and the staged path's buffers
            staged, = stratacl.spawn(run_allocator, 1, args=(trace + "-staged", steps[trace], args.seed, lo, hi,
                                                             None), registration="roa", allocator="expandable",
                                     **common)
            found.append(("expandable, staged buffers (staged)", staged))
        for name, measured in found:
            for r in measured:
                rows.append({"trace": trace, "allocator": name, "peak_allocated": r["peak_allocated"],
                             "peak_reserved": r["peak_reserved"],
                             "fragmentation_bytes": r["peak_reserved"] - r["peak_allocated"],
                             "max_batch": r["max_batch"], "batch": r["batch"], "peak_requested": r["peak_requested"],
                             "num_alloc_retries": r["num_alloc_retries"], "hbm_bytes": HBM, "steps": steps[trace],
                             "seed": args.seed, "larger_batches_that_fit": r["larger_that_fit"]})
    shapes = "DeepSeek V4 Flash, a decode die at EP 16" if args.model == "v4flash" else "DeepSeek-V3 shapes, one die"
    print(f"### Fragmentation and largest batch in {HBM // GiB} GiB of HBM ({shapes})\n")
    print("| trace | allocator | batch | peak requested (GiB) | peak allocated (GiB) | peak reserved (GiB) | "
          "fragmentation = reserved - allocated (GiB) | OOM retries | largest batch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['trace']} | {r['allocator']} | {r['batch']} | {r['peak_requested'] / GiB:.2f} | "
              f"{r['peak_allocated'] / GiB:.2f} | {r['peak_reserved'] / GiB:.2f} | "
              f"{r['fragmentation_bytes'] / GiB:.2f} | {r['num_alloc_retries']} | {r['max_batch']} |")
    odd = [r for r in rows if r["larger_batches_that_fit"]]
    if odd:
        print(f"\nnot monotone: batches above the largest found also fit: "
              f"{[(r['trace'], r['allocator'], r['larger_batches_that_fit']) for r in odd]}")
    print(f"\n(paper, Fig. 5b and section 8.2: 1.6 GiB in inference, about 3 GiB in training; the serving "
          f"batch drops by 3)  total {time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
