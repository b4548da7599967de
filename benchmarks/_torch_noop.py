"""A torch.distributed backend in C++ that does nothing: backend "noop" (benchmarks only).

Its collectives return a completed Work and touch no tensor, so what a ``dist.<op>`` call
on it costs is torch's own layer alone (the Python ``dist.*`` wrapper, the C++ dispatcher,
the Work), the least any backend reached through torch.distributed can cost. torch's own
"fake" backend (torch.testing._internal.distributed.fake_pg) is not that floor in torch 2.13:
its all_gather, reduce_scatter and all_to_all copy the input into the output.

Built on first use with ``torch.utils.cpp_extension.load_inline`` (a minute or two; cached
in torch's extension directory, ``TORCH_EXTENSIONS_DIR``).
"""
from __future__ import annotations

_SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace {

class NoopWork : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
    f->markCompleted();
    return f;
  }
};

class NoopBackend : public c10d::Backend {
 public:
  NoopBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "noop"; }
  c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<NoopWork>(); }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor&, at::Tensor&, const c10d::ReduceScatterOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&, const c10d::AllToAllOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return done(); }
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>&, int rank, int size) {
  return c10::make_intrusive<NoopBackend>(rank, size);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("create", &create);
}
"""

_module = None


def load():
    """The extension module (``create(store, rank, size)``), built once."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import load_inline
        _module = load_inline("stratacl_bench_noop_pg", cpp_sources=_SOURCE, extra_cflags=["-O2"], verbose=False)
    return _module


def register() -> None:
    """Register backend "noop" (devices: cpu) with torch.distributed."""
    import torch.distributed as dist
    if "noop" in dist.Backend.backend_list:
        return
    mod = load()
    dist.Backend.register_backend("noop", lambda store, rank, size, timeout: mod.create(store, rank, size),
                                  devices=["cpu"])
