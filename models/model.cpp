// models/model.cpp: the flat-buffer Model over a module tree, and the MLP builder.
#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/bfloat16_convert.h"
#include "models/kernels/factory.h"

namespace dpt::models {
namespace {

void collect(Module* m, const std::string& prefix, std::vector<Module*>& modules, std::vector<std::string>& prefixes) {
  modules.push_back(m);
  prefixes.push_back(prefix);
  for (const auto& [name, child] : m->children()) collect(child, prefix + name + ".", modules, prefixes);
}

}  // namespace

Model::Model(std::unique_ptr<Module> root, std::string name, Device device)
    : root_(std::move(root)), name_(std::move(name)) {
  DPT_CHECK(root_ != nullptr, "a model needs a root module");
  std::vector<Module*> modules;
  std::vector<std::string> prefixes;
  collect(root_.get(), "", modules, prefixes);
  size_t params = 0, buffers = 0;
  for (size_t i = 0; i < modules.size(); ++i) {
    Module* m = modules[i];
    const auto ps = m->param_specs();
    const auto bs = m->buffer_specs();
    const auto cs = m->counters();
    if (const Module* owner = m->uses_params_of()) tied_.emplace_back(m, owner);
    if (ps.empty() && bs.empty() && cs.empty()) continue;
    owners_.push_back({m, prefixes[i]});
    for (const auto& s : ps) params += numel_of(s.shape);
    for (const auto& s : bs) buffers += numel_of(s.shape);
    for (const auto& c : cs) counters_.emplace_back(prefixes[i] + c.name, c.value);
  }
  // Straight on the device (zeros, as a copy of host zeros would be): a model too large for the GPU fails there at
  // once with the device's out-of-memory error, never after filling the host with its zeros first.
  allocate(device, static_cast<int64_t>(params), static_cast<int64_t>(buffers));
}

void Model::allocate(Device device, int64_t total_params, int64_t total_buffers) {
  device_ = device;
  kernels_ = &kernels_for(device);
  params_ = Tensor::zeros({total_params}, DType::F32, device);
  params16_ = bf16_ ? Tensor::zeros({total_params}, DType::BF16, device) : Tensor();
  params_written();
  num_params_ = static_cast<size_t>(total_params);
  grads_ = Tensor::zeros({total_params}, DType::F32, device);
  buffers_ = Tensor::zeros({total_buffers}, DType::F32, device);
  named_.clear();
  hook_ranges_.clear();  // hook() lists them again below
  named_buffers_.clear();
  size_t offset = 0, boffset = 0;
  for (Owner& o : owners_) {
    o.first = named_.size();
    o.bfirst = named_buffers_.size();
    for (const auto& spec : o.module->param_specs()) {
      named_.push_back({o.prefix + spec.name, params_.view(offset, spec.shape), grads_.view(offset, spec.shape), offset});
      offset += numel_of(spec.shape);
    }
    for (const auto& spec : o.module->buffer_specs()) {
      named_buffers_.push_back({o.prefix + spec.name, buffers_.view(boffset, spec.shape)});
      boffset += numel_of(spec.shape);
    }
    o.end = named_.size();
    o.bend = named_buffers_.size();
    rebind(o);
    if (o.first == o.end) continue;
    const size_t first = o.first, end = o.end, index = static_cast<size_t>(&o - owners_.data());
    o.module->set_grads_ready_hook([this, first, end, index] {
      if (index < fresh_written_.size()) fresh_written_[index] = 1;
      if (grads_ready_ && *grads_ready_) (*grads_ready_)(first, end);
    });
    hook(o.module, first, end);
  }
  for (const auto& [user, owner] : tied_) {
    const auto it = std::find_if(owners_.begin(), owners_.end(), [&](const Owner& o) { return o.module == owner; });
    DPT_CHECK(it != owners_.end(), "{} uses the parameters of a module outside the model", user->kind());
    hook(user, it->first, it->end);
  }
}

void Model::hook(Module* m, size_t first, size_t end) {
  hook_ranges_.emplace_back(first, end);
  auto call = [this, first, end](auto member) {
    return [this, first, end, member] {
      if (hooks_.*member) (hooks_.*member)(first, end);
    };
  };
  m->set_hooks({.before_forward = call(&ParamHooks::before_forward), .after_forward = call(&ParamHooks::after_forward),
                .before_backward = call(&ParamHooks::before_backward),
                .after_backward = call(&ParamHooks::after_backward)});
}

void Model::rebind(const Owner& o) {
  std::vector<Tensor> p, g, b, p16;
  for (size_t i = o.first; i < o.end; ++i) {
    p.push_back(named_[i].param);
    g.push_back(named_[i].grad);
    if (params16_.defined()) p16.push_back(params16_.view(named_[i].offset, named_[i].param.shape()));
  }
  for (size_t i = o.bfirst; i < o.bend; ++i) b.push_back(named_buffers_[i].tensor);
  o.module->bind(std::move(p), std::move(g), std::move(b));
  o.module->bind_bf16(std::move(p16));
}

namespace {
[[noreturn]] void no_bf16_with_split_params() {
  DPT_THROW(UnsupportedError, "bf16 activations need the whole parameters on every rank (not ZeRO stage 3, whose "
            "parameters are gathered layer by layer)");
}
}  // namespace

void Model::set_bf16_activations(bool on) {
  if (on == bf16_) return;
  if (on) {
    if (!root_->supports_bf16_activations())
      DPT_THROW(UnsupportedError, "{}: bf16 activations (train.bf16_activations) are the transformer fast path; this "
                "model's layers run in float32 activations only", name_);
    if (params_split())
      no_bf16_with_split_params();
    params16_ = Tensor::zeros({static_cast<int64_t>(num_params_)}, DType::BF16, device_);
  } else {
    params16_ = Tensor();
  }
  bf16_ = on;
  params_written();
  root_->set_bf16_activations(on);
  for (const Owner& o : owners_) rebind(o);
}

std::vector<Tensor> Model::split(const std::vector<std::pair<size_t, size_t>>& ranges, Tensor NamedParam::*field,
                                 bool copy) {
  std::vector<int> covered(named_.size(), 0);
  for (const auto& [first, end] : ranges) {
    DPT_CHECK(first <= end && end <= named_.size(), "parameter range [{}, {}) of {}", first, end, named_.size());
    for (size_t i = first; i < end; ++i) {
      DPT_CHECK(i == first || named_[i].offset == named_[i - 1].offset + named_[i - 1].param.numel(),
                "parameter range [{}, {}) is not contiguous", first, end);
      ++covered[i];
    }
  }
  for (size_t i = 0; i < named_.size(); ++i)
    DPT_CHECK(covered[i] == 1, "parameter {} is in {} of the ranges, not one", named_[i].name, covered[i]);
  std::vector<Tensor> parts;
  for (const auto& [first, end] : ranges) {
    const size_t base = first < end ? named_[first].offset : 0;
    const size_t count = first < end ? named_[end - 1].offset + named_[end - 1].param.numel() - base : 0;
    Tensor part = Tensor::zeros({static_cast<int64_t>(count)}, DType::F32, device_);
    for (size_t i = first; i < end; ++i) {
      Tensor& view = named_[i].*field;
      Tensor moved = part.view(named_[i].offset - base, named_[i].param.shape());
      if (copy) moved.copy_from(view);
      view = std::move(moved);
    }
    parts.push_back(std::move(part));
  }
  for (const Owner& o : owners_) rebind(o);
  return parts;
}

std::vector<Tensor> Model::split_grads(const std::vector<std::pair<size_t, size_t>>& ranges) {
  DPT_CHECK(grad_parts_.empty(), "the gradients are split already");
  grad_parts_ = split(ranges, &NamedParam::grad, /*copy=*/false);
  grads_ = Tensor();  // the flat buffer is gone
  return grad_parts_;
}

std::vector<Tensor> Model::split_params(const std::vector<std::pair<size_t, size_t>>& ranges) {
  DPT_CHECK(param_parts_.empty(), "the parameters are split already");
  if (bf16_)
    no_bf16_with_split_params();
  const std::vector<Tensor> parts = split(ranges, &NamedParam::param, /*copy=*/true);
  // param_storage() lists them in offset order.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a].first < ranges[b].first; });
  for (size_t i : order) param_parts_.push_back(parts[i]);
  params_ = Tensor();
  return parts;
}

void Model::to(Device device) {
  if (device == device_) return;
  DPT_CHECK(grad_parts_.empty() && param_parts_.empty(), "a model with split buffers cannot move to {}", device.str());
  const Tensor old = params_, old_buffers = buffers_;
  allocate(device, static_cast<int64_t>(old.numel()), static_cast<int64_t>(old_buffers.numel()));
  if (precision_ != Precision::F32) kernels_->set_precision(precision_);  // the new device's set must take it
  kernels_->set_deterministic(deterministic_);
  params_.copy_from(old);
  if (old_buffers.numel()) buffers_.copy_from(old_buffers);
}

void Model::init(uint64_t seed) {
  // Initialisation draws on the host (the same numbers on every machine), then moves to the device.
  const Device device = device_;
  params_written();
  to(Device::cpu());
  std::mt19937_64 rng(seed);
  for (const Owner& o : owners_) o.module->init_params(rng);
  size_t boffset = 0;
  for (const Owner& o : owners_)
    for (const auto& spec : o.module->buffer_specs()) {
      const size_t n = numel_of(spec.shape);
      std::fill_n(buffers_.data<float>() + boffset, n, spec.init);
      boffset += n;
    }
  for (auto& [name, value] : counters_) *value = 0;
  to(device);
}

void Model::set_precision(Precision p) {
  kernels_->set_precision(p);  // throws if the kernel set cannot
  precision_ = p;
}

void Model::set_deterministic(bool on) {
  kernels_->set_deterministic(on);
  deterministic_ = on;
}

const Tensor& Model::forward(const Tensor& x) {
  kernels_->set_precision(precision_);
  kernels_->set_deterministic(deterministic_);
  // The fast path's matmuls read the bf16 copy: rounded afresh from the float32 masters the last update changed,
  // unless that update wrote it (params16_written).
  if (bf16_ && root_->training()) {
    if (!params16_current_) {
      to_bfloat16(params_, params16_, 1.0f, kernels_->stream());
      ++params16_roundings_;
    }
    params16_current_ = false;  // the update's copy serves this forward only
  }
  if (hooks_.forward_begin) hooks_.forward_begin();
  const Tensor& y = root_->forward(x, *kernels_);
  if (hooks_.forward_end) hooks_.forward_end();
  return y;
}

const Tensor& Model::backward(const Tensor& dlogits, const GradsReady& grads_ready) {
  grads_ready_ = &grads_ready;
  kernels_->set_precision(precision_);
  kernels_->set_deterministic(deterministic_);
  const bool fresh = fresh_pending_;  // zero_grad left the gradients to this backward
  fresh_pending_ = false;
  if (fresh) {
    root_->set_fresh_grads(true);
    fresh_written_.assign(owners_.size(), 0);  // the grads-ready hooks mark the owners whose backward ran
  }
  try {
    if (hooks_.backward_begin) hooks_.backward_begin();
    const Tensor& dx = root_->backward(dlogits, *kernels_);
    if (fresh) {
      // An owner whose backward did not run wrote nothing: its gradients are zero, as after zeroing them all (the
      // data-parallel reducer sends a bucket's whole range). Before backward_end: ZeRO's hooks see them whole.
      for (size_t i = 0; i < owners_.size(); ++i)
        if (!fresh_written_[i] && owners_[i].first < owners_[i].end) {
          const NamedParam& a = named_[owners_[i].first];
          const NamedParam& b = named_[owners_[i].end - 1];
          const auto n = static_cast<int64_t>(b.offset + b.param.numel() - a.offset);
          grads_.view(a.offset, {n}).zero_(kernels_->stream());
        }
      root_->set_fresh_grads(false);
      fresh_written_.clear();
    }
    if (hooks_.backward_end) hooks_.backward_end();
    grads_ready_ = nullptr;
    return dx;
  } catch (...) {
    grads_ready_ = nullptr;
    if (fresh) {  // partly written: the next backward writes them all again
      root_->set_fresh_grads(false);
      fresh_written_.clear();
      fresh_pending_ = true;
    }
    throw;
  }
}

void Model::set_kernels(Kernels& k) {
  DPT_CHECK(k.device() == device_, "a kernel set for {} given to a model on {}", k.device().str(), device_.str());
  kernels_ = &k;
  if (precision_ != Precision::F32) kernels_->set_precision(precision_);
  kernels_->set_deterministic(deterministic_);
}

void Model::zero_grad() {
  // The next backward writes every gradient itself (Module::set_fresh_grads) where every owner of parameters can.
  // The modules that use another's parameters (a tied head) must write first (=) too, and tell the owner.
  const auto writes_fresh = [](const Owner& o) {
    return o.module->param_specs().empty() || o.module->writes_fresh_grads();
  };
  const auto user_writes_fresh = [](const auto& tied) { return tied.first->writes_fresh_grads(); };
  fresh_pending_ = fresh_allowed_ && bf16_ && root_->training() && grad_parts_.empty() &&
                   std::ranges::all_of(owners_, writes_fresh) && std::ranges::all_of(tied_, user_writes_fresh);
  if (fresh_pending_) return;
  if (grad_parts_.empty()) grads_.zero_(kernels_->stream());
  for (Tensor& part : grad_parts_)
    if (part.storage().resident()) part.zero_(kernels_->stream());
}

size_t Model::set_batch_norm_sync(const BatchNorm2d::AllReduceSum& sum) {
  size_t n = 0;
  for (const Owner& o : owners_)
    if (auto* bn = dynamic_cast<BatchNorm2d*>(o.module)) {
      bn->set_sync(sum);
      ++n;
    }
  return n;
}

std::string Model::summary() const {
  std::string s = fmt::format("{}: {} parameters", name_, num_params());
  if (buffers_.numel()) s += fmt::format(", {} buffer values", buffers_.numel());
  return s;
}

std::vector<NamedTensor> Model::state() const {
  // state_dict order: each module's parameters, then its buffers, then its counters.
  std::vector<NamedTensor> out;
  size_t p = 0, b = 0, c = 0;
  for (const Owner& o : owners_) {
    for (size_t i = 0; i < o.module->param_specs().size(); ++i, ++p) out.push_back({named_[p].name, named_[p].param});
    for (size_t i = 0; i < o.module->buffer_specs().size(); ++i, ++b) out.push_back(named_buffers_[b]);
    for (size_t i = 0; i < o.module->counters().size(); ++i, ++c) {
      Tensor t = Tensor::empty({}, DType::I64);
      t.data<int64_t>()[0] = *counters_[c].second;
      out.push_back({counters_[c].first, t});
    }
  }
  return out;
}

namespace {
// A counter's value (BatchNorm's num_batches_tracked) from a one-element host tensor: an integer, or a float holding
// one (a float NaN or one past int64 was undefined to convert). CheckpointError naming it otherwise.
int64_t counter_value(const Tensor& host, const std::string& name, const std::string& source) {
  double v = 0;
  switch (host.dtype()) {
    case DType::I64: return host.data<int64_t>()[0];
    case DType::I32: return host.data<int32_t>()[0];
    case DType::F32: v = host.data<float>()[0]; break;
    case DType::F64: v = host.data<double>()[0]; break;
    default: DPT_THROW(CheckpointError, "{}: {} is {}, expected an integer", source, name, dtype_name(host.dtype()));
  }
  if (!(std::fabs(v) < 9.2e18) || v != std::floor(v))
    DPT_THROW(CheckpointError, "{}: {} is {}, expected a count (a whole number within int64)", source, name, v);
  return static_cast<int64_t>(v);
}
}  // namespace

void Model::load_state(const std::function<const Tensor*(const std::string&)>& find, const std::string& source,
                       const std::function<std::string(const std::string&)>& shown) {
  params_written();
  const auto name_of = [&](const std::string& name) { return shown ? shown(name) : name; };
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  std::map<std::string, int64_t> counts;  // the counters' values, read (and checked) before anything changes
  for (const NamedTensor& nt : state()) {
    const Tensor* src = find(nt.name);
    if (!src)
      DPT_THROW(CheckpointError, "{}: no tensor named {} (this model: {})", source, name_of(nt.name), summary());
    if (nt.tensor.dtype() == DType::I64) {  // a counter: any one-element integer or float tensor
      if (src->numel() != 1)  // a file's fault, not dptrain's: a CheckpointError, as the other checks here
        DPT_THROW(CheckpointError, "{}: {} has shape {}, expected one element", source, name_of(nt.name),
                  src->shape_str());
      counts[nt.name] = counter_value(src->to(Device::cpu()), name_of(nt.name), source);
      continue;
    }
    if (src->shape() != nt.tensor.shape() || src->dtype() != nt.tensor.dtype())
      DPT_THROW(CheckpointError, "{}: {} is {} {}, this model expects {} {}", source, name_of(nt.name),
                dtype_name(src->dtype()), src->shape_str(), dtype_name(nt.tensor.dtype()), nt.tensor.shape_str());
    copies.emplace_back(nt.tensor, src);
  }
  // Everything checked: only now change the model, so a failed load leaves it as it was.
  for (auto& [dst, src] : copies) dst.copy_from(*src);
  for (auto& [name, value] : counters_) *value = counts.at(name);
}

std::unique_ptr<Model> make_mlp(int64_t in_features, const std::vector<int64_t>& hidden, int64_t classes,
                                Device device) {
  auto layers = std::make_unique<Sequential>();
  int64_t in = in_features;
  std::vector<std::string> widths{std::to_string(in_features)};
  for (size_t i = 0; i <= hidden.size(); ++i) {
    const bool last = i == hidden.size();
    const int64_t out = last ? classes : hidden[i];
    // nn.Sequential(Linear, ReLU, Linear, ReLU, Linear): the Linear layers sit at indices 0, 2, 4, ...
    layers->append(std::make_unique<Linear>(in, out, /*relu=*/!last), std::to_string(2 * i));
    widths.push_back(std::to_string(out));
    in = out;
  }
  layers->set_needs_input_grad(false);
  auto root = std::make_unique<Sequential>();
  root->append(std::move(layers), "layers");
  root->set_needs_input_grad(false);
  return std::make_unique<Model>(std::move(root), fmt::format("mlp {}", fmt::join(widths, "-")), device);
}

}  // namespace dpt::models
