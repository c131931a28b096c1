#include "torch/process_group_ringx.hpp"

#include <c10/util/Exception.h>

#include <cstdlib>

#include "core/common/log.h"
#include "core/reduce/reduce.h"
#include "core/select/select.h"
#include "core/transport/ucx/ucx_transport.h"
#include "torch/store_adapter.h"
#include "torch/tensor_args.h"

namespace ringx {

namespace {

size_t envBytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (end == v || n == 0) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)},
                          std::string("ringx: ") + name + "='" + v + "' is not a positive integer");
  }
  return size_t(n);
}

std::chrono::microseconds spinFromEnv() {
  return std::chrono::microseconds(envBytes("RINGX_SPIN_US", 50));
}

std::string tlsFromEnv() {
  const char* v = std::getenv("RINGX_TLS");
  return v ? v : "";
}

}  // namespace

struct ProcessGroupRingx::Call {
  CallContext ctx;
  c10d::OpType type;
  std::chrono::milliseconds timeout;
  const char* profilingTitle;
};

ProcessGroupRingx::ProcessGroupRingx(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout) {
  C10dStoreAdapter adapter(store);
  // Each rank counts the ringx groups it has built on this store; ranks build
  // them in the same order, so the counts agree and name fresh keys.
  int64_t generation = adapter.add("ringx/generation/" + std::to_string(rank), 1);
  UcxOptions uopts;
  uopts.tls = tlsFromEnv();
  uopts.keyPrefix = "ringx/" + std::to_string(generation) + "/ucx";
  CommOptions copts;
  copts.timeout = timeout;
  copts.spin = spinFromEnv();
  try {
    comm_ = std::make_unique<Communicator>(makeUcxTransport(adapter, rank, size, uopts), copts);
  } catch (const Error& e) {
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)},
                                std::string("ringx: creating the communicator (rank ") + std::to_string(rank) +
                                    ") failed: " + e.what());
  }
  RINGX_LOG(Info, "ringx: rank " << rank << "/" << size << " up, timeout " << timeout.count() << " ms");
}

ProcessGroupRingx::~ProcessGroupRingx() = default;

void ProcessGroupRingx::abort() { comm_->abort("aborted"); }

void ProcessGroupRingx::shutdown() { comm_->shutdown(); }

c10d::ErrorType ProcessGroupRingx::getError() {
  auto err = comm_->error();
  if (!err) return c10d::ErrorType::SUCCESS;
  switch (err->kind()) {
    case ErrorKind::Timeout: return c10d::ErrorType::TIMEOUT;
    case ErrorKind::PeerClosed: return c10d::ErrorType::REMOTE_ERROR;
    default: return c10d::ErrorType::COMM_ERROR;
  }
}

std::chrono::milliseconds ProcessGroupRingx::timeoutFor(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_ : requested;
}

ProcessGroupRingx::Call ProcessGroupRingx::begin(const char* op, c10d::OpType type,
                                                 std::chrono::milliseconds timeout) {
  return Call{CallContext{op, rank_, size_, ++seq_}, type, timeoutFor(timeout), nullptr};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::submit(Call& call, const CollArgs& args,
                                                         std::vector<at::Tensor> inputs,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void()> publish) {
  const Algorithm* alg = nullptr;
  try {
    alg = &selectAlgorithm(args);
  } catch (const Error& e) {
    throw c10::ValueError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
  RINGX_LOG(Info, call.ctx.prefix() << "algorithm " << alg->name << ", " << args.bytes() << " bytes");
  const std::string title = "ringx:" + call.ctx.op;
  auto work = c10::make_intrusive<WorkRingx>(rank_, call.type, title.c_str(), inputs, outputs, call.ctx.seq);
  work->opName = call.ctx.op;
  work->publish = std::move(publish);
  auto op = std::make_unique<Op>(call.ctx.op, call.ctx.seq, alg->build(args));
  op->timeout = call.timeout;
  op->keepAlive = std::make_shared<std::vector<at::Tensor>>(std::move(inputs));
  op->onDone = [work](const Error* e) { work->markDone(e); };
  op->onCallbacks = [work](const Error* e) { work->completeFuture(e); };
  try {
    comm_->submit(std::move(op));
  } catch (const Error& e) {
    throw c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, e.what());
  }
  return work;
}

namespace {

// A contiguous tensor to run on, and how to hand the result back to `user`.
struct Staged {
  at::Tensor buf;
  std::function<void()> publish;
};

Staged stage(const at::Tensor& user, const at::Tensor& reducible) {
  if (reducible.is_contiguous()) return {reducible, nullptr};
  at::Tensor tmp = reducible.contiguous();
  at::Tensor target = reducible;
  return {tmp, [target, tmp]() mutable { target.copy_(tmp); }};
}

size_t segmentBytesFromEnv() {
  static const size_t bytes = envBytes("RINGX_CHUNK_BYTES", 256 * 1024);
  return bytes;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  Call call = begin("all_reduce", c10d::OpType::ALLREDUCE, opts.timeout);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  at::Tensor reducible = asReducible(call.ctx, t, opts.reduceOp.op_);
  DType dtype = toDType(call.ctx, reducible.scalar_type());
  ReduceOp op = toReduceOp(opts.reduceOp);
  if (!reduceSupported(dtype, op)) {
    throwTypeError(call.ctx, "reduce op " + std::string(reduceOpName(op)) + " is not supported for dtype " +
                                 std::string(dtypeName(dtype)) +
                                 (isFloating(dtype) ? " (bitwise ops need an integer or bool tensor)"
                                                    : " (AVG and PREMUL_SUM need a floating-point tensor)"));
  }
  Staged st = stage(t, reducible);
  CollArgs a{Collective::AllReduce, rank_, size_, call.ctx.seq};
  a.dtype = dtype;
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  a.segmentBytes = segmentBytesFromEnv();
  return submit(call, a, {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  Call call = begin("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, opts.timeout);
  if (tensors.empty()) throwValueError(call.ctx, "got an empty tensor list");
  for (const auto& t : tensors) {
    checkDevice(call.ctx, t);
    if (t.scalar_type() != tensors[0].scalar_type()) {
      throwTypeError(call.ctx, "all tensors must have one dtype; got " + std::string(c10::toString(t.scalar_type())) +
                                   " and " + std::string(c10::toString(tensors[0].scalar_type())));
    }
  }
  DType dtype = toDType(call.ctx, tensors[0].scalar_type());
  ReduceOp op = toReduceOp(opts.reduceOp);
  if (!reduceSupported(dtype, op)) {
    throwTypeError(call.ctx, "reduce op " + std::string(reduceOpName(op)) + " is not supported for dtype " +
                                 std::string(dtypeName(dtype)));
  }
  std::vector<at::Tensor> flats;
  for (const auto& t : tensors) flats.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flats);
  CollArgs a{Collective::AllReduce, rank_, size_, call.ctx.seq};
  a.dtype = dtype;
  a.op = op;
  a.premulFactor = premulFactor(call.ctx, opts.reduceOp);
  a.buf = flat.data_ptr();
  a.count = size_t(flat.numel());
  a.segmentBytes = segmentBytesFromEnv();
  std::vector<at::Tensor> users = tensors;
  auto publish = [users, flat]() mutable {
    int64_t off = 0;
    for (auto& t : users) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  };
  std::vector<at::Tensor> keep = tensors;
  keep.push_back(flat);
  return submit(call, a, keep, tensors, std::move(publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  Call call = begin("broadcast", c10d::OpType::BROADCAST, opts.timeout);
  const at::Tensor& t = singleTensor(call.ctx, tensors);
  checkRoot(call.ctx, opts.rootRank);
  if (opts.rootTensor != 0) throwValueError(call.ctx, "rootTensor must be 0 with one tensor per call");
  at::Tensor bytes = t.is_complex() ? at::view_as_real(t) : t;
  Staged st = stage(t, bytes);
  CollArgs a{Collective::Broadcast, rank_, size_, call.ctx.seq};
  a.dtype = toDType(call.ctx, bytes.scalar_type());
  a.buf = st.buf.data_ptr();
  a.count = size_t(st.buf.numel());
  a.root = int(opts.rootRank);
  a.segmentBytes = segmentBytesFromEnv();
  return submit(call, a, {t, st.buf}, {t}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather", c10d::OpType::ALLGATHER, opts.timeout);
  const at::Tensor& in = singleTensor(call.ctx, inputs);
  if (outputs.size() != 1) {
    throwValueError(call.ctx, "expects one output list per input tensor, got " + std::to_string(outputs.size()));
  }
  auto& outs = outputs[0];
  if (int(outs.size()) != size_) {
    throwValueError(call.ctx, "the output list has " + std::to_string(outs.size()) + " tensors, expected " +
                                  std::to_string(size_) + " (one per rank)");
  }
  for (size_t i = 0; i < outs.size(); ++i) checkSameType(call.ctx, in, outs[i], "output tensor " + std::to_string(i));
  at::Tensor src = (in.is_complex() ? at::view_as_real(in) : in).contiguous();
  at::Tensor flat = at::empty({int64_t(size_) * src.numel()}, src.options());
  CollArgs a{Collective::AllGather, rank_, size_, call.ctx.seq};
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.buf = flat.data_ptr();
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  a.segmentBytes = segmentBytesFromEnv();
  std::vector<at::Tensor> targets = outs;
  auto publish = [targets, flat, n = src.numel()]() mutable {
    for (size_t i = 0; i < targets.size(); ++i) {
      at::Tensor dst = targets[i].is_complex() ? at::view_as_real(targets[i]) : targets[i];
      dst.copy_(flat.narrow(0, int64_t(i) * n, n).view(dst.sizes()));
    }
  };
  std::vector<at::Tensor> keep = outs;
  keep.push_back(in);
  keep.push_back(src);
  keep.push_back(flat);
  return submit(call, a, keep, outs, std::move(publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  Call call = begin("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, opts.timeout);
  checkDevice(call.ctx, input);
  checkDevice(call.ctx, output);
  if (output.scalar_type() != input.scalar_type()) {
    throwTypeError(call.ctx, "output dtype " + std::string(c10::toString(output.scalar_type())) +
                                 " differs from input dtype " + std::string(c10::toString(input.scalar_type())));
  }
  if (output.numel() != input.numel() * size_) {
    throwValueError(call.ctx, "output has " + std::to_string(output.numel()) + " elements, expected " +
                                  std::to_string(input.numel() * size_) + " (world size x input elements)");
  }
  at::Tensor src = (input.is_complex() ? at::view_as_real(input) : input).contiguous();
  at::Tensor outView = output.is_complex() ? at::view_as_real(output) : output;
  Staged st = stage(output, outView);
  CollArgs a{Collective::AllGather, rank_, size_, call.ctx.seq};
  a.dtype = toDType(call.ctx, src.scalar_type());
  a.buf = st.buf.data_ptr();
  a.input = src.data_ptr();
  a.count = size_t(src.numel());
  a.segmentBytes = segmentBytesFromEnv();
  return submit(call, a, {input, src, output, st.buf}, {output}, std::move(st.publish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupRingx::barrier(const c10d::BarrierOptions& opts) {
  Call call = begin("barrier", c10d::OpType::BARRIER, opts.timeout);
  at::Tensor token = at::zeros({1}, at::kByte);
  CollArgs a{Collective::AllReduce, rank_, size_, call.ctx.seq};
  a.dtype = DType::U8;
  a.op = ReduceOp::Max;
  a.buf = token.data_ptr();
  a.count = 1;
  return submit(call, a, {token}, {token}, nullptr);
}

}  // namespace ringx
