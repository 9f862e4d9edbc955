// trainer/torch_file.cpp: torch.save's zip format through libzip, and the restricted unpickler of its data.pkl
// (trainer/torch_file.h).
#include "trainer/torch_file.h"

#include <zip.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "core/check.h"

namespace dpt::trainer {

namespace {

// torch.XStorage: the element type of a storage, and what dptrain keeps it as.
struct StorageType {
  const char* name;
  int bytes;
  DType out;
};
constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", 4, DType::F32}, {"DoubleStorage", 8, DType::F64}, {"HalfStorage", 2, DType::F32},
    {"BFloat16Storage", 2, DType::BF16}, {"LongStorage", 8, DType::I64}, {"IntStorage", 4, DType::I32},
    {"ShortStorage", 2, DType::I32}, {"CharStorage", 1, DType::I32}, {"ByteStorage", 1, DType::U8},
    {"BoolStorage", 1, DType::U8},
};
constexpr int kOrderedDict = 100, kRebuildTensorV2 = 101, kRebuildParameter = 102;

// The globals a state dict's pickle names: the storage types (their index above) and three callables.
int allowed_global(std::string_view module, std::string_view name) {
  if (module == "collections" && name == "OrderedDict") return kOrderedDict;
  if (module == "torch._utils" && name == "_rebuild_tensor_v2") return kRebuildTensorV2;
  if (module == "torch._utils" && name == "_rebuild_parameter") return kRebuildParameter;
  if (module == "torch")
    for (int i = 0; i < static_cast<int>(std::size(kStorageTypes)); ++i)
      if (name == kStorageTypes[i].name) return i;
  return -1;
}

// A global that is a model's class (torch.nn's, torchvision's, transformers', or the script's own __main__): the file
// is torch.save(model), the whole module pickled. What to save instead.
std::string whole_module_hint(std::string_view module) {
  for (std::string_view m : {"__main__", "torch.nn.", "torchvision.", "transformers.", "timm."})
    if (module == m || module.starts_with(m))
      return "; it looks like a whole model saved with torch.save(model): save its weights with "
             "torch.save(model.state_dict(), PATH)";
  return "";
}

struct Obj {
  enum class Kind { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Storage, Tensor };
  Kind kind = Kind::None;
  int64_t i = 0;  // Bool, Int; Global: allowed_global's code; Storage: its kStorageTypes index
  double f = 0;
  std::string s;  // Str, Bytes; Global: "module.name"; Storage: its key
  std::vector<Obj*> items;                    // Tuple, List
  std::vector<std::pair<Obj*, Obj*>> dict;    // Dict, in insertion order
  std::unordered_map<std::string, size_t> index;  // Dict: position of each string key
  const std::vector<uint8_t>* bytes = nullptr;    // Storage
  int64_t numel = 0;                              // Storage: elements
  Tensor tensor;
};
using Kind = Obj::Kind;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "a bool";
    case Kind::Int: return "an int";
    case Kind::Float: return "a float";
    case Kind::Str: return "a string";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "a tuple";
    case Kind::List: return "a list";
    case Kind::Dict: return "a dict";
    case Kind::Global: return "a global";
    case Kind::Storage: return "a storage";
    case Kind::Tensor: return "a tensor";
  }
  return "?";
}

// Opcodes a state dict does not use, named in the refusal.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'P': return "PERSID";
    case 0x82: case 0x83: case 0x84: return "EXT";
    case 'S': case 'T': case 'U': return "STRING";
    case 'V': return "UNICODE";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 0x8b: return "LONG4";
    case 'F': return "FLOAT";
    case 'd': return "DICT";
    case 'l': return "LIST";
    case 'g': return "GET";
    case 'p': return "PUT";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return "unknown";
  }
}

constexpr size_t kMaxStack = size_t{1} << 20;
constexpr size_t kMaxDims = 32;
// A state dict's pickle is small (some 15 objects and 200 bytes a tensor): these bound what a hostile one can make
// the reader allocate, far above any real one's needs.
constexpr size_t kMaxObjects = size_t{1} << 21;
constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;

class Unpickler {
 public:
  Unpickler(const uint8_t* p, size_t n, const StorageBytes& storage, const std::string& where)
      : p_(p), n_(n), storage_(storage), where_(where) {}

  // The machine: one opcode at a time until STOP, whose object is the result.
  Obj* run() {
    for (;;) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: {  // PROTO
          const uint8_t v = u8();
          if (v < 2 || v > 5) bad(fmt::format("pickle protocol {} (torch.save writes 2)", v));
          break;
        }
        case 0x95: le<uint64_t>(); break;  // FRAME: its length only groups the opcodes
        case '.': {                         // STOP
          Obj* result = pop();
          if (!stack_.empty() || !marks_.empty()) bad("STOP with more on the stack");
          return result;
        }
        default:
          if (!literal(op) && !container(op) && !reference(op))
            bad(fmt::format("opcode 0x{:02x} ({}), which torch.save of a state dict does not write: refused", op,
                            opcode_name(op)));
      }
    }
  }

 private:
  // Scalars and strings pushed as they are; false: not such an opcode.
  bool literal(uint8_t op) {
    switch (op) {
      case 'N': push(make(Kind::None)); break;
      case 0x88: push(make_int(Kind::Bool, 1)); break;
      case 0x89: push(make_int(Kind::Bool, 0)); break;
      case 'J': push(make_int(Kind::Int, le<int32_t>())); break;
      case 'K': push(make_int(Kind::Int, u8())); break;
      case 'M': push(make_int(Kind::Int, le<uint16_t>())); break;
      case 0x8a: push(make_int(Kind::Int, long1())); break;
      case 'G': {  // BINFLOAT: big-endian
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | u8();
        Obj* o = make(Kind::Float);
        std::memcpy(&o->f, &bits, 8);
        push(o);
        break;
      }
      case 'X': push(make_str(Kind::Str, le<uint32_t>())); break;
      case 0x8c: push(make_str(Kind::Str, u8())); break;
      case 0x8d: push(make_str(Kind::Str, le<uint64_t>())); break;
      case 'B': push(make_str(Kind::Bytes, le<uint32_t>())); break;
      case 'C': push(make_str(Kind::Bytes, u8())); break;
      default: return false;
    }
    return true;
  }

  // Tuples, lists, dicts and the marks that delimit their items; false: not such an opcode.
  bool container(uint8_t op) {
    switch (op) {
      case ')': push(make(Kind::Tuple)); break;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        Obj* t = make(Kind::Tuple);
        t->items.resize(op - 0x84);
        for (size_t k = t->items.size(); k-- > 0;) t->items[k] = pop();
        push(t);
        break;
      }
      case 't': {
        Obj* t = make(Kind::Tuple);
        t->items = pop_mark();
        push(t);
        break;
      }
      case ']': push(make(Kind::List)); break;
      case '}': push(make(Kind::Dict)); break;
      case '(':
        if (marks_.size() >= kMaxStack) bad("too many marks");
        marks_.push_back(stack_.size());
        break;
      case 'a': {  // APPEND
        Obj* v = pop();
        expect(top(), Kind::List, "APPEND")->items.push_back(v);
        break;
      }
      case 'e': {  // APPENDS
        std::vector<Obj*> vs = pop_mark();
        Obj* list = expect(top(), Kind::List, "APPENDS");
        list->items.insert(list->items.end(), vs.begin(), vs.end());
        break;
      }
      case 's': {  // SETITEM
        Obj* v = pop();
        Obj* k = pop();
        set_item(expect(top(), Kind::Dict, "SETITEM"), k, v);
        break;
      }
      case 'u': {  // SETITEMS
        std::vector<Obj*> kv = pop_mark();
        if (kv.size() % 2) bad("SETITEMS with an odd number of items");
        Obj* d = expect(top(), Kind::Dict, "SETITEMS");
        for (size_t k = 0; k < kv.size(); k += 2) set_item(d, kv[k], kv[k + 1]);
        break;
      }
      default: return false;
    }
    return true;
  }

  // The memo, the allowed globals, storages (persistent ids) and the calls that make dicts and tensors; false: not
  // such an opcode.
  bool reference(uint8_t op) {
    switch (op) {
      case 'q': memo_put(u8()); break;
      case 'r': memo_put(le<uint32_t>()); break;
      case 0x94: memo_put(static_cast<uint32_t>(memo_.size())); break;
      case 'h': memo_get(u8()); break;
      case 'j': memo_get(le<uint32_t>()); break;
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = line(), name = line();
        push(make_global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        Obj* name = expect(pop(), Kind::Str, "STACK_GLOBAL's name");
        Obj* module = expect(pop(), Kind::Str, "STACK_GLOBAL's module");
        push(make_global(module->s, name->s));
        break;
      }
      case 'Q': push(persistent(pop())); break;  // BINPERSID
      case 'R': {                                 // REDUCE
        Obj* args = expect(pop(), Kind::Tuple, "REDUCE's arguments");
        Obj* fn = expect(pop(), Kind::Global, "REDUCE's callable");
        push(reduce(fn, args->items));
        break;
      }
      case 'b': {  // BUILD: an OrderedDict's attributes (state_dict's _metadata) or a tensor's: nothing to set
        Obj* state = pop();
        const Kind target = top()->kind;
        if ((target != Kind::Dict && target != Kind::Tensor) || (state->kind != Kind::Dict && state->kind != Kind::None &&
                                                                 state->kind != Kind::Tuple))
          bad(fmt::format("BUILD of {} with {}", kind_name(target), kind_name(state->kind)));
        break;
      }
      default: return false;
    }
    return true;
  }

  [[noreturn]] void bad(const std::string& why) const {
    DPT_THROW(CheckpointError, "{}: data.pkl: {} (at byte {})", where_, why, pos_ ? pos_ - 1 : 0);
  }
  uint8_t u8() {
    if (pos_ >= n_) bad("ends without STOP");
    return p_[pos_++];
  }
  template <class T>
  T le() {
    if (n_ - pos_ < sizeof(T)) bad("ends in the middle of an opcode");
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  int64_t long1() {
    const uint8_t n = u8();
    if (n > 8) bad(fmt::format("an integer of {} bytes (at most 8)", n));
    if (n_ - pos_ < n) bad("ends in the middle of an integer");
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | p_[pos_ + k];
    if (n > 0 && n < 8 && (p_[pos_ + n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    pos_ += n;
    return static_cast<int64_t>(v);
  }
  std::string line() {
    std::string s;
    for (;;) {
      const char c = static_cast<char>(u8());
      if (c == '\n') return s;
      if (s.size() >= 256) bad("a GLOBAL name longer than 256 bytes");
      s += c;
    }
  }
  Obj* make(Kind k) {
    if (arena_.size() >= kMaxObjects) bad("more than 2^21 objects: not a state dict");
    arena_.push_back(std::make_unique<Obj>());
    arena_.back()->kind = k;
    return arena_.back().get();
  }
  Obj* make_int(Kind k, int64_t v) {
    Obj* o = make(k);
    o->i = v;
    return o;
  }
  Obj* make_str(Kind k, uint64_t len) {
    if (len > n_ - pos_) bad(fmt::format("a string of {} bytes past the end", len));
    Obj* o = make(k);
    o->s.assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return o;
  }
  Obj* make_global(const std::string& module, const std::string& name) {
    const int code = allowed_global(module, name);
    if (code < 0)
      bad(fmt::format("it names the global {}.{}, which a state dict saved by torch.save does not use: refused (no "
                      "code from the file runs; dptrain reads tensors, OrderedDict and the storage types only){}",
                      module, name, whole_module_hint(module)));
    Obj* o = make_int(Kind::Global, code);
    o->s = module + "." + name;
    return o;
  }
  void push(Obj* o) {
    if (stack_.size() >= kMaxStack) bad("stack deeper than 2^20");
    stack_.push_back(o);
  }
  Obj* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) bad("pop from an empty stack");
    Obj* o = stack_.back();
    stack_.pop_back();
    return o;
  }
  Obj* top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) bad("an empty stack");
    return stack_.back();
  }
  std::vector<Obj*> pop_mark() {
    if (marks_.empty()) bad("no MARK to pop to");
    const size_t at = marks_.back();
    marks_.pop_back();
    std::vector<Obj*> items(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return items;
  }
  Obj* expect(Obj* o, Kind k, const char* what) const {
    if (o->kind != k) bad(fmt::format("{} is {}, expected {}", what, kind_name(o->kind), kind_name(k)));
    return o;
  }
  void memo_put(uint32_t idx) {
    if (memo_.size() >= kMaxStack && !memo_.count(idx)) bad("more than 2^20 memo entries");
    memo_[idx] = top();
  }
  void memo_get(uint32_t idx) {
    auto it = memo_.find(idx);
    if (it == memo_.end()) bad(fmt::format("memo entry {} was never stored", idx));
    push(it->second);
  }
  void set_item(Obj* d, Obj* k, Obj* v) {
    if (k->kind != Kind::Str) {  // a state dict's keys are names; a non-string key can only be appended
      d->dict.emplace_back(k, v);
      return;
    }
    auto [it, fresh] = d->index.emplace(k->s, d->dict.size());
    if (fresh)
      d->dict.emplace_back(k, v);
    else
      d->dict[it->second].second = v;  // as Python: the last value for a key
  }

  // ('storage', torch.FloatStorage, KEY, LOCATION, NUMEL): the bytes of ARCHIVE/data/KEY, read once per key.
  Obj* persistent(Obj* pid) {
    if (pid->kind != Kind::Tuple || pid->items.size() != 5 || pid->items[0]->kind != Kind::Str ||
        pid->items[0]->s != "storage")
      bad("a persistent id that is not ('storage', type, key, location, numel)");
    Obj* type = expect(pid->items[1], Kind::Global, "a storage's type");
    if (type->i < 0 || type->i >= static_cast<int64_t>(std::size(kStorageTypes)))
      bad(fmt::format("a storage of type {}", type->s));
    const std::string& key = expect(pid->items[2], Kind::Str, "a storage's key")->s;
    expect(pid->items[3], Kind::Str, "a storage's location");
    const int64_t numel = expect(pid->items[4], Kind::Int, "a storage's size")->i;
    auto it = storages_.find(key);
    if (it != storages_.end()) {
      if (it->second->i != type->i || it->second->numel != numel)
        bad(fmt::format("storage {} named twice with different types or sizes", key));
      return it->second;
    }
    const std::vector<uint8_t>* bytes = storage_(key);
    if (!bytes) bad(fmt::format("storage {} is not in the archive (data/{})", key, key));
    const auto elem = static_cast<uint64_t>(kStorageTypes[type->i].bytes);
    if (numel < 0 || static_cast<uint64_t>(numel) > bytes->size() / elem)
      bad(fmt::format("storage {} of {} {} elements holds only {} bytes", key, numel, kStorageTypes[type->i].name,
                      bytes->size()));
    storage_bytes_ += static_cast<uint64_t>(numel) * dtype_size(kStorageTypes[type->i].out);
    Obj* s = make_int(Kind::Storage, type->i);
    s->s = key;
    s->numel = numel;
    s->bytes = bytes;
    storages_[key] = s;
    return s;
  }

  Obj* reduce(Obj* fn, const std::vector<Obj*>& args) {
    switch (fn->i) {
      case kOrderedDict:
        if (!args.empty()) bad("OrderedDict called with arguments");
        return make(Kind::Dict);
      case kRebuildParameter:  // (tensor, requires_grad, backward_hooks)
        if (args.size() != 3) bad("_rebuild_parameter with other than 3 arguments");
        return expect(args[0], Kind::Tensor, "_rebuild_parameter's data");
      case kRebuildTensorV2:  // (storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
        if (args.size() != 6 && args.size() != 7) bad("_rebuild_tensor_v2 with other than 6 or 7 arguments");
        return rebuild_tensor(expect(args[0], Kind::Storage, "_rebuild_tensor_v2's storage"),
                              expect(args[1], Kind::Int, "a tensor's storage offset")->i, ints(args[2], "size"),
                              ints(args[3], "stride"));
      default: bad(fmt::format("{} called: it is a storage type, not a function", fn->s));
    }
  }
  std::vector<int64_t> ints(Obj* t, const char* what) const {
    expect(t, Kind::Tuple, what);
    if (t->items.size() > kMaxDims) bad(fmt::format("a tensor of {} dimensions", t->items.size()));
    std::vector<int64_t> v;
    for (Obj* o : t->items) {
      const int64_t x = expect(o, Kind::Int, what)->i;
      if (x < 0) bad(fmt::format("a negative {} ({})", what, x));
      v.push_back(x);
    }
    return v;
  }

  // The tensor a storage, offset, size and stride describe, gathered into a contiguous tensor of dptrain's dtype.
  Obj* rebuild_tensor(const Obj* st, int64_t offset, const std::vector<int64_t>& size,
                      const std::vector<int64_t>& stride) {
    if (size.size() != stride.size()) bad(fmt::format("a tensor with {} sizes and {} strides", size.size(), stride.size()));
    if (offset < 0) bad("a negative storage offset");
    uint64_t numel = 1, last = static_cast<uint64_t>(offset);
    for (size_t d = 0; d < size.size(); ++d) {
      const auto sz = static_cast<uint64_t>(size[d]), sd = static_cast<uint64_t>(stride[d]);
      if (sz != 0 && numel > std::numeric_limits<uint64_t>::max() / sz) bad("a tensor whose element count overflows");
      numel *= sz;
      if (sz > 0 && sd > 0 && (sz - 1) > (std::numeric_limits<uint64_t>::max() - last) / sd)
        bad("a tensor reaching past 2^64");
      if (sz > 0) last += (sz - 1) * sd;
    }
    const auto storage_numel = static_cast<uint64_t>(st->numel);
    if (numel > 0 && last >= storage_numel)
      bad(fmt::format("a tensor of shape [{}] (offset {}, strides [{}]) reaching element {} of storage {}, which has {}",
                      fmt::join(size, ", "), offset, fmt::join(stride, ", "), last, st->s, storage_numel));
    if (numel > storage_numel && numel > 1)
      bad(fmt::format("a tensor of {} elements from storage {} of {} (an expanded view): save it contiguous", numel,
                      st->s, storage_numel));
    const StorageType& type = kStorageTypes[st->i];
    // Each tensor is its own copy: views of one storage cost their elements each. A state dict's views (a tied
    // head, a transposed weight) are few; a file whose copies outgrow four times its storages is refused.
    out_bytes_ += numel * dtype_size(type.out);
    if (out_bytes_ > 4 * storage_bytes_ + (uint64_t{1} << 20))
      bad(fmt::format("its tensors would take {} bytes, more than 4 times its storages' {}: views of one storage "
                      "copied over and over", out_bytes_, storage_bytes_));
    Obj* o = make(Kind::Tensor);
    o->tensor = Tensor::empty(size, type.out);
    uint8_t* out = static_cast<uint8_t*>(o->tensor.raw());
    const uint8_t* in = st->bytes->data();
    const size_t out_bytes = dtype_size(type.out);
    std::vector<int64_t> idx(size.size(), 0);
    uint64_t src = static_cast<uint64_t>(offset);
    for (uint64_t k = 0; k < numel; ++k) {
      convert(type, in + src * static_cast<uint64_t>(type.bytes), out + k * out_bytes);
      for (size_t d = size.size(); d-- > 0;) {  // the next index, odometer-wise; src follows by the strides
        src += static_cast<uint64_t>(stride[d]);
        if (++idx[d] < size[d]) break;
        src -= static_cast<uint64_t>(stride[d]) * static_cast<uint64_t>(size[d]);
        idx[d] = 0;
      }
    }
    return o;
  }
  static void convert(const StorageType& type, const uint8_t* in, uint8_t* out) {
    const std::string_view name = type.name;
    if (name == "HalfStorage") {
      uint16_t h;
      std::memcpy(&h, in, 2);
      const float f = half_to_float(h);
      std::memcpy(out, &f, 4);
    } else if (name == "ShortStorage") {
      int16_t v;
      std::memcpy(&v, in, 2);
      const int32_t w = v;
      std::memcpy(out, &w, 4);
    } else if (name == "CharStorage") {
      const int32_t w = static_cast<int8_t>(in[0]);
      std::memcpy(out, &w, 4);
    } else if (name == "BoolStorage") {
      out[0] = in[0] != 0;
    } else {
      std::memcpy(out, in, static_cast<size_t>(type.bytes));
    }
  }

  const uint8_t* p_;
  size_t n_, pos_ = 0;
  const StorageBytes& storage_;
  const std::string& where_;
  std::vector<std::unique_ptr<Obj>> arena_;
  std::vector<Obj*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Obj*> memo_;
  std::map<std::string, Obj*> storages_;
  uint64_t storage_bytes_ = 0, out_bytes_ = 0;  // the storages' elements, and the tensors', in dptrain's dtypes
};

// A dict of tensors, or nullptr; `why` says what is not a tensor.
const Obj* tensor_dict(const Obj* o, std::string* why) {
  if (o->kind != Kind::Dict) {
    *why = fmt::format("the file holds {}, not a dict of tensors", kind_name(o->kind));
    return nullptr;
  }
  for (const auto& [k, v] : o->dict) {
    if (k->kind != Kind::Str) {
      *why = fmt::format("a key is {}, not a name", kind_name(k->kind));
      return nullptr;
    }
    if (v->kind != Kind::Tensor) {
      *why = fmt::format("'{}' is {}, not a tensor", k->s, kind_name(v->kind));
      return nullptr;
    }
  }
  return o;
}

}  // namespace

SafetensorsFile unpickle_state_dict(const uint8_t* pkl, size_t size, const StorageBytes& storage,
                                    const std::string& where) {
  Unpickler vm(pkl, size, storage, where);
  const Obj* top = vm.run();
  std::string why;
  const Obj* dict = tensor_dict(top, &why);
  // A training checkpoint: {'model': state_dict, 'optimizer': ..., ...}, or as PyTorch's tutorial on saving a
  // general checkpoint writes it, {'epoch': ..., 'model_state_dict': ..., 'optimizer_state_dict': ..., 'loss': ...}.
  if (!dict && top->kind == Kind::Dict) {
    for (const char* inner : {"state_dict", "model", "model_state_dict"}) {
      auto it = top->index.find(inner);
      std::string ignored;
      if (it != top->index.end() && (dict = tensor_dict(top->dict[it->second].second, &ignored))) break;
    }
  }
  if (!dict)
    DPT_THROW(CheckpointError, "{}: {}: dptrain reads a state dict (torch.save(model.state_dict(), PATH)), or one "
              "under 'state_dict', 'model' or 'model_state_dict'", where, why);
  SafetensorsFile out;
  for (const auto& [k, v] : dict->dict) out.tensors.push_back({k->s, v->tensor});
  return out;
}

bool looks_like_zip(const uint8_t* data, size_t size) {
  return size >= 4 && data[0] == 'P' && data[1] == 'K' && data[2] == 3 && data[3] == 4;
}

// The legacy format's first pickle: PROTO 2, then its magic number as a LONG1 of 10 bytes. (A safetensors file may
// start 80 02 too: its header length, little-endian.)
bool looks_like_legacy_torch(const uint8_t* data, size_t size) {
  return size >= 4 && data[0] == 0x80 && data[1] == 0x02 && data[2] == 0x8a && data[3] == 0x0a;
}

SafetensorsFile read_torch_zip(const uint8_t* data, size_t size, const std::string& where) {
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_buffer_create(data, size, 0, &error);
  if (!source) DPT_THROW(CheckpointError, "{}: {}", where, zip_error_strerror(&error));
  zip_t* archive = zip_open_from_source(source, ZIP_RDONLY, &error);
  if (!archive) {
    const std::string why = zip_error_strerror(&error);
    // A zip's start (PK\3\4) without its end (the central directory, which torch.save writes last): cut short.
    const bool cut = zip_error_code_zip(&error) == ZIP_ER_NOZIP && looks_like_zip(data, size);
    zip_source_free(source);
    zip_error_fini(&error);
    DPT_THROW(CheckpointError, "{}: not a readable zip archive ({}){}", where, why,
              cut ? ": it starts as one but its end (the central directory) is missing: truncated (a copy or "
                    "download cut short?)"
                  : "");
  }
  std::unique_ptr<zip_t, void (*)(zip_t*)> closer(archive, [](zip_t* a) { zip_discard(a); });
  zip_error_fini(&error);
  // Entries are read whole: at most what the archive could hold uncompressed at zip's best ratio, so that a
  // lying header costs no memory.
  const uint64_t max_entry = static_cast<uint64_t>(size) * 1100 + (uint64_t{1} << 20);
  auto read_entry = [&](zip_int64_t index, const std::string& name, uint64_t limit = ~uint64_t{0}) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive, static_cast<zip_uint64_t>(index), 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
      DPT_THROW(CheckpointError, "{}: cannot read the size of {}", where, name);
    if (st.size > max_entry)
      DPT_THROW(CheckpointError, "{}: {} claims {} bytes, more than the archive can hold", where, name, st.size);
    if (st.size > limit)
      DPT_THROW(CheckpointError, "{}: {} is {} bytes, more than a state dict's (at most {})", where, name, st.size,
                limit);
    std::vector<uint8_t> bytes(st.size);
    zip_file_t* f = zip_fopen_index(archive, static_cast<zip_uint64_t>(index), 0);
    if (!f) DPT_THROW(CheckpointError, "{}: cannot open {}: {}", where, name, zip_strerror(archive));
    uint64_t got = 0;
    zip_int64_t n = 0;
    while (got < bytes.size() && (n = zip_fread(f, bytes.data() + got, bytes.size() - got)) > 0)
      got += static_cast<uint64_t>(n);
    // One read past the end: libzip checks the entry's CRC-32 when it reaches the end of the data.
    uint8_t extra = 0;
    if (got == bytes.size()) n = zip_fread(f, &extra, 1);
    const std::string why = n < 0 ? zip_file_strerror(f) : n > 0 ? "longer than its header says" : "";
    zip_fclose(f);
    if (got != bytes.size() || n != 0)
      DPT_THROW(CheckpointError, "{}: {} is truncated or corrupted ({} of {} bytes read{})", where, name, got,
                bytes.size(), why.empty() ? "" : ": " + why);
    return bytes;
  };
  // ARCHIVE/data.pkl, ARCHIVE/data/KEY, ARCHIVE/byteorder.
  const zip_int64_t count = zip_get_num_entries(archive, 0);
  std::string prefix;
  zip_int64_t pkl_index = -1;
  std::map<std::string, zip_int64_t> entries;
  for (zip_int64_t i = 0; i < count; ++i) {
    const char* raw = zip_get_name(archive, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    if (!raw) continue;
    const std::string name = raw;
    entries[name] = i;
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (pkl_index >= 0) DPT_THROW(CheckpointError, "{}: two data.pkl entries ({}data.pkl, {})", where, prefix, name);
      prefix = name.substr(0, slash + 1);
      pkl_index = i;
    }
  }
  if (pkl_index < 0)
    DPT_THROW(CheckpointError, "{}: a zip archive without ARCHIVE/data.pkl: not a file torch.save wrote", where);
  if (auto it = entries.find(prefix + "byteorder"); it != entries.end()) {
    const std::vector<uint8_t> order = read_entry(it->second, prefix + "byteorder");
    if (std::string(order.begin(), order.end()) != "little")
      DPT_THROW(CheckpointError, "{}: written on a {}-endian machine: dptrain reads little-endian files only", where,
                std::string(order.begin(), order.end()));
  }
  const std::vector<uint8_t> pkl = read_entry(pkl_index, prefix + "data.pkl", kMaxPickleBytes);
  std::map<std::string, std::vector<uint8_t>> loaded;
  const StorageBytes storage = [&](const std::string& key) -> const std::vector<uint8_t>* {
    auto it = entries.find(prefix + "data/" + key);
    if (it == entries.end()) return nullptr;
    auto [slot, fresh] = loaded.try_emplace(key);
    if (fresh) slot->second = read_entry(it->second, it->first);
    return &slot->second;
  };
  return unpickle_state_dict(pkl.data(), pkl.size(), storage, where);
}

namespace {
std::vector<uint8_t> read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) DPT_THROW(CheckpointError, "cannot open {}: {}", path, std::strerror(errno));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}
}  // namespace

SafetensorsFile read_torch_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_whole(path);
  if (!looks_like_zip(bytes.data(), bytes.size())) {
    // torch.save before 1.6 (or with _use_new_zipfile_serialization=False): a pickle stream starting with its magic
    // number as a LONG1.
    if (looks_like_legacy_torch(bytes.data(), bytes.size()))
      DPT_THROW(CheckpointError, "{}: PyTorch's legacy format (torch.save before 1.6): dptrain reads the zip format; "
                "convert it with torch.save(torch.load(PATH), NEW_PATH) in PyTorch 1.6 or later", path);
    DPT_THROW(CheckpointError, "{}: neither safetensors nor a torch.save zip archive", path);
  }
  return read_torch_zip(bytes.data(), bytes.size(), path);
}

SafetensorsFile read_weights_file(const std::string& path) {
  uint8_t head[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) DPT_THROW(CheckpointError, "cannot open {}: {}", path, std::strerror(errno));
    f.read(reinterpret_cast<char*>(head), 4);
  }
  if (looks_like_zip(head, 4) || looks_like_legacy_torch(head, 4)) return read_torch_file(path);
  return read_safetensors(path);
}

}  // namespace dpt::trainer
