// trainer/parallel/codec.cpp: the gradients' wire format.
#include "trainer/parallel/codec.h"

#include "core/bfloat16_convert.h"
#include "core/check.h"

namespace dpt::trainer {

GradCodec::GradCodec(DType dtype, int world, StreamHandle stream) : dtype_(dtype), world_(world), stream_(stream) {
  DPT_CHECK(dtype == DType::F32 || dtype == DType::BF16,
            "gradients are reduced in float32 or bfloat16, not {}", dtype_name(dtype));
}

Tensor GradCodec::wire_buffer(size_t count, Device device) const {
  if (!compressed() || world_ == 1) return {};
  return Tensor::empty({static_cast<int64_t>(count)}, DType::BF16, device);
}

void GradCodec::encode(const Tensor& grads, Tensor& wire) const {
  if (compressed()) to_bfloat16(grads, wire, static_cast<float>(world_), stream_);
}

void GradCodec::decode(const Tensor& wire, Tensor& grads) const {
  if (compressed()) from_bfloat16(wire, grads, stream_);
}

comm::AllreduceOptions GradCodec::options(std::string what, bool persistent) const {
  return {.op = compressed() ? comm::ReduceOp::Sum : comm::ReduceOp::Avg, .stream = stream_, .persistent = persistent,
          .what = std::move(what)};
}

}  // namespace dpt::trainer
