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


TRACES = {"serving": serving_trace, "training": training_trace}


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
    ap.add_argument("--quick", action="store_true", help="fewer steps, a narrower search")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    steps = {"serving": 12 if args.quick else 48, "training": 2 if args.quick else 3}
    bounds = {"serving": (16, 1024), "training": (1, 64)}
    rows = []
    t_all = time.perf_counter()
    for trace in args.traces.split(","):
        lo, hi = bounds[trace]
        common = dict(hbm_size=str(HBM), timeout=3600)
        caching, = stratacl.spawn(run_allocator, 1, args=(trace, steps[trace], args.seed, lo, hi, None),
                                  registration="pool", allocator="caching", **common)
        expandable, = stratacl.spawn(run_allocator, 1, args=(trace, steps[trace], args.seed, lo, hi,
                                                             caching[0]["max_batch"]),
                                     registration="roa", allocator="expandable", **common)
        for name, measured in (("caching (pool)", caching), ("expandable (roa)", expandable)):
            for r in measured:
                rows.append({"trace": trace, "allocator": name, "peak_allocated": r["peak_allocated"],
                             "peak_reserved": r["peak_reserved"],
                             "fragmentation_bytes": r["peak_reserved"] - r["peak_allocated"],
                             "max_batch": r["max_batch"], "batch": r["batch"], "peak_requested": r["peak_requested"],
                             "num_alloc_retries": r["num_alloc_retries"], "hbm_bytes": HBM, "steps": steps[trace],
                             "seed": args.seed, "larger_batches_that_fit": r["larger_that_fit"]})
    print(f"### Fragmentation and largest batch in {HBM // GiB} GiB of HBM (DeepSeek-V3 shapes, one die)\n")
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
