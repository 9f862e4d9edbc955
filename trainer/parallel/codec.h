// trainer/parallel/codec.h: the gradients' wire format (dist.grad_dtype), as c10d's communication hooks make it: a
// codec that every strategy runs around its collectives, so that the strategies know nothing of bfloat16.
//
// F32 (the default): the float32 gradients themselves go on the wire, reduced with Avg.
// BF16 (dist.grad_dtype = bf16, PyTorch DDP's bf16_compress_hook): the float32 gradients are divided by the world
// size and rounded to bfloat16 into a bfloat16 copy (the wire buffer), which is reduced with Sum (each addition in
// float32 rounded back to bfloat16), and the result widened back into the float32 gradients: half the bytes on the
// wire, at bfloat16's precision (a relative 2^-8 per rounding).
// encode, decode run on the compute stream (the CPU: at once); a collective's Work is block()ed on that stream
// between them.
#pragma once

#include <cstddef>
#include <string>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace dpt::trainer {

class GradCodec {
 public:
  // InternalError for a dtype other than F32 or BF16.
  GradCodec(DType dtype, int world, StreamHandle stream);
  bool compressed() const { return dtype_ == DType::BF16; }
  DType dtype() const { return dtype_; }
  // A wire buffer of `count` elements on `device`: bfloat16 when compressed, else undefined (the gradients go as
  // they are). One rank communicates nothing: no buffer then either.
  Tensor wire_buffer(size_t count, Device device) const;
  // What a collective sends for `grads`: the gradients themselves, or their wire buffer `wire`.
  Tensor& on_wire(Tensor& grads, Tensor& wire) const { return compressed() ? wire : grads; }
  // Before the collective: compressed, grads / world rounded into `wire`; else nothing.
  void encode(const Tensor& grads, Tensor& wire) const;
  // After it: compressed, `wire` widened back into `grads`; else nothing.
  void decode(const Tensor& wire, Tensor& grads) const;
  // The collective's options: Avg for float32; Sum for bfloat16 (the gradients were divided when rounded).
  comm::AllreduceOptions options(std::string what, bool persistent) const;

 private:
  DType dtype_;
  int world_;
  StreamHandle stream_;
};

}  // namespace dpt::trainer
