#include "eagle3/detail/quantized_weights.h"

#include <algorithm>
#include <regex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"

namespace eagle3 {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::string_view kWeightSuffix = ".weight";

// The nn.Linear weights of the schema: every *_proj matrix (kv_a_proj_with_mqa included) and
// lm_head. The embedding is an nn.Embedding, the router (mlp.gate) a plain parameter, norms and the
// correction bias vectors.
// `name` is the text model's spelling (TextModelTensorName).
bool IsLinear(const WeightSpec& spec, std::string_view name) {
  return spec.shape.rank() == 2 &&
         (EndsWith(name, "_proj.weight") || EndsWith(name, "_proj_with_mqa.weight") || name == "lm_head.weight");
}

// An MTP module's eh_proj (model.layers.<k>.eh_proj.weight) is stored unquantized in every format:
// vLLM and SGLang build it as a plain nn.Linear and TensorRT-LLM with the model dtype and no quant
// config, so none of them would load a weight_scale_inv beside it (vLLM's loader fails on the
// unknown parameter), while the MTP decoder layer's Linears follow the target's quantization.
bool IsMtpProjection(std::string_view name) { return EndsWith(name, ".eh_proj.weight"); }

std::string ModuleName(std::string_view weight) {
  return std::string(EndsWith(weight, kWeightSuffix) ? weight.substr(0, weight.size() - kWeightSuffix.size()) : weight);
}

// compressed-tensors' ignore entries: "re:<pattern>" matches when the pattern matches a prefix of
// the module name (Python's re.match), anything else is an exact module name (utils/match.py,
// _match_name). Patterns were compiled once when the config was parsed, so they are valid here.
class IgnoreList {
 public:
  explicit IgnoreList(const std::vector<std::string>& entries) {
    for (const std::string& entry : entries) {
      if (entry.rfind("re:", 0) == 0) {
        patterns_.emplace_back(entry.substr(3), std::regex::ECMAScript | std::regex::optimize);
      } else {
        names_.push_back(entry);
      }
    }
  }
  bool Matches(const std::string& module) const {
    for (const std::string& name : names_) {
      if (name == module) return true;
    }
    for (const std::regex& pattern : patterns_) {
      if (std::regex_search(module, pattern, std::regex_constants::match_continuous)) return true;
    }
    return false;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::regex> patterns_;
};

bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// "checkpoint '<dir>' has no tensor '<name>', <why>".
absl::Status Missing(const Checkpoint& checkpoint, const std::string& name, std::string_view why) {
  return absl::NotFoundError(absl::StrCat("checkpoint '", checkpoint.dir(), "' has no tensor '", name, "', ", Sv(why)));
}

// InvalidArgument "tensor '<name>' in '<file>' is <dtype>; expected <expected> (<why>)".
absl::Status CheckDtype(const Checkpoint& checkpoint, const std::string& name, const TensorInfo& info, bool ok,
                        std::string_view expected, std::string_view why) {
  if (ok) return absl::OkStatus();
  const absl::StatusOr<std::string> file = checkpoint.FileOf(name);
  return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in '", file.ok() ? *file : std::string("?"),
                                                 "' is ", Sv(SafetensorsDTypeName(info.dtype)), "; expected ",
                                                 Sv(expected), " (", Sv(why), ")"));
}

absl::Status CheckFp8(const Checkpoint& checkpoint, const WeightSpec& spec, const QuantizationConfig& q) {
  const std::string why = absl::StrCat("quantization_config: ", q.Describe());
  const std::string scale = Fp8ScaleName(spec.name);
  if (!checkpoint.Has(spec.name)) {
    return Missing(checkpoint, spec.name,
                   absl::StrCat("which its config.json requires (F8_E4M3, shape ", spec.shape.ToString(), ")"));
  }
  if (!checkpoint.Has(scale)) {
    return Missing(checkpoint, scale, absl::StrCat("the block scales of '", spec.name, "', which ", why, " requires"));
  }
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo weight, checkpoint.Info(spec.name));
  EAGLE3_RETURN_IF_ERROR(CheckDtype(checkpoint, spec.name, weight, weight.dtype == DType::kF8E4M3, "F8_E4M3", why));
  EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape(spec.name, spec.shape));
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(scale));
  EAGLE3_RETURN_IF_ERROR(CheckDtype(checkpoint, scale, info, IsFloat(info.dtype), "F32", why));
  return checkpoint.ExpectShape(scale, Shape{CeilDiv(spec.shape[0], q.block_out), CeilDiv(spec.shape[1], q.block_in)});
}

absl::Status CheckInt4(const Checkpoint& checkpoint, const WeightSpec& spec, const QuantizationConfig& q) {
  const std::string why = absl::StrCat("quantization_config: ", q.Describe());
  const int64_t out = spec.shape[0];
  const int64_t in = spec.shape[1];
  const std::string packed = Int4PackedName(spec.name);
  const std::string scale = Int4ScaleName(spec.name);
  const std::string shape = Int4ShapeName(spec.name);
  for (const std::string& name : {packed, scale, shape}) {
    if (!checkpoint.Has(name)) {
      return Missing(checkpoint, name,
                     absl::StrCat("which '", spec.name, "' ", spec.shape.ToString(), " needs under ", why));
    }
  }
  if (in % q.group_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name, "' has ", in, " input columns, not a multiple of ",
                     "quantization_config's group_size ", q.group_size, " (checkpoint '", checkpoint.dir(), "')"));
  }
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo packed_info, checkpoint.Info(packed));
  EAGLE3_RETURN_IF_ERROR(CheckDtype(checkpoint, packed, packed_info, packed_info.dtype == DType::kI32, "I32", why));
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo scale_info, checkpoint.Info(scale));
  EAGLE3_RETURN_IF_ERROR(CheckDtype(checkpoint, scale, scale_info, IsFloat(scale_info.dtype), "BF16", why));
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo shape_info, checkpoint.Info(shape));
  EAGLE3_RETURN_IF_ERROR(CheckDtype(checkpoint, shape, shape_info,
                                    shape_info.dtype == DType::kI32 || shape_info.dtype == DType::kI64, "I32", why));
  EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape(shape, Shape{2}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, checkpoint.Read(shape, DType::kI64));
  const int64_t* v = values.data_as<int64_t>();
  if (v[0] != out || v[1] != in) {
    const absl::StatusOr<std::string> file = checkpoint.FileOf(shape);
    return absl::InvalidArgumentError(absl::StrCat("tensor '", shape, "' in '", file.ok() ? *file : std::string("?"),
                                                   "' holds [", v[0], ", ", v[1], "], but '", spec.name, "' is ",
                                                   spec.shape.ToString(), " for the model that config.json describes"));
  }
  EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape(packed, Shape{out, Int4PackedWords(in)}));
  return checkpoint.ExpectShape(scale, Shape{out, in / q.group_size});
}

// Where rank `shard.rank`'s block starts along the split dim of a tensor whose split dim is `n`.
int64_t ShardStart(const ShardSpec& shard, int64_t n) {
  return PaddedSize(n, shard.pad_to_multiple) / shard.tp_size * shard.rank;
}

// `f32` in `dtype`: itself for f32, else converted into memory of `allocator`.
absl::StatusOr<Tensor> ToDtype(Tensor f32, DType dtype, Allocator& allocator) {
  if (dtype == DType::kF32) return f32;
  EAGLE3_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(dtype, f32.shape(), allocator));
  EAGLE3_RETURN_IF_ERROR(ConvertTensor(f32, converted));
  return converted;
}

// The slice's rows and columns map to global ones through these offsets (one is 0).
struct SliceOrigin {
  int64_t row = 0, col = 0;
};

SliceOrigin Origin(const WeightSpec& spec, const ShardSpec& shard) {
  SliceOrigin o;
  if (shard.tp_size == 1) return o;
  (shard.dim == 0 ? o.row : o.col) = ShardStart(shard, spec.shape[shard.dim]);
  return o;
}

// Stored fp8 codes of the slice and the scale blocks it touches (padding blocks beyond the stored
// grid zero).
absl::StatusOr<QuantizedShard> ReadFp8(const Checkpoint& checkpoint, const WeightSpec& spec,
                                       const QuantizationConfig& q, const ShardSpec& shard, Allocator& allocator) {
  QuantizedShard out;
  EAGLE3_ASSIGN_OR_RETURN(out.codes, checkpoint.ReadShard(spec.name, shard, DType::kF8E4M3, allocator));
  EAGLE3_ASSIGN_OR_RETURN(Tensor all, checkpoint.Read(Fp8ScaleName(spec.name), DType::kF32));
  const SliceOrigin origin = Origin(spec, shard);
  const int64_t rows = out.codes.dim(0), cols = out.codes.dim(1);
  const int64_t row_begin = origin.row / q.block_out, col_begin = origin.col / q.block_in;
  const int64_t row_end = rows > 0 ? (origin.row + rows - 1) / q.block_out + 1 : row_begin;
  const int64_t col_end = cols > 0 ? (origin.col + cols - 1) / q.block_in + 1 : col_begin;
  absl::StatusOr<Tensor> scales = Tensor::Zeros(DType::kF32, Shape{row_end - row_begin, col_end - col_begin}, allocator);
  if (!scales.ok()) {
    return absl::Status(scales.status().code(),
                        absl::StrCat("reading tensor '", Fp8ScaleName(spec.name), "': ", scales.status().message()));
  }
  out.scales = std::move(*scales);
  const float* from = all.data_as<float>();
  float* to = out.scales.data_as<float>();
  for (int64_t i = row_begin; i < std::min(row_end, all.dim(0)); ++i) {
    for (int64_t j = col_begin; j < std::min(col_end, all.dim(1)); ++j) {
      to[(i - row_begin) * (col_end - col_begin) + j - col_begin] = from[i * all.dim(1) + j];
    }
  }
  out.view = QuantizedWeightView{.format = WeightFormat::kFp8Block,
                                 .codes = out.codes.view(),
                                 .scales = out.scales.view(),
                                 .k = cols,
                                 .row0 = origin.row,
                                 .col0 = origin.col,
                                 .scale_row0 = row_begin,
                                 .scale_col0 = col_begin,
                                 .block_rows = q.block_out,
                                 .block_cols = q.block_in};
  return out;
}

// A packed word of eight zero values: what padding rows hold, so that they dequantize to +0 (a
// zero word would be eight -8s, times a zero scale -0).
constexpr int32_t Int4ZeroWord() {
  uint32_t word = 0;
  for (int j = 0; j < kInt4PerWord; ++j) word |= uint32_t{kInt4Offset} << (4 * j);
  return static_cast<int32_t>(word);
}

absl::StatusOr<QuantizedShard> ReadInt4(const Checkpoint& checkpoint, const WeightSpec& spec,
                                        const QuantizationConfig& q, const ShardSpec& shard, Allocator& allocator) {
  const std::string packed_name = Int4PackedName(spec.name);
  const std::string scale_name = Int4ScaleName(spec.name);
  const int64_t out_dim = spec.shape[0], in_dim = spec.shape[1];
  QuantizedShard out;
  out.view.format = WeightFormat::kInt4Group;
  out.view.k = in_dim;
  out.view.block_rows = 1;  // one scale row per weight row
  out.view.block_cols = q.group_size;
  if (shard.tp_size == 1 || shard.dim == 0) {
    // Rows split (or none): the packed rows and scale rows of the slice, read as the plain tensor's.
    EAGLE3_ASSIGN_OR_RETURN(out.codes, checkpoint.ReadShard(packed_name, shard, DType::kI32, allocator));
    EAGLE3_ASSIGN_OR_RETURN(out.scales, checkpoint.ReadShard(scale_name, shard, DType::kF32, allocator));
    const SliceOrigin origin = Origin(spec, shard);  // ReadShard validated the split
    out.view.row0 = out.view.scale_row0 = origin.row;
    const int64_t real_rows = std::clamp<int64_t>(out_dim - origin.row, 0, out.codes.dim(0));
    std::fill(out.codes.data_as<int32_t>() + real_rows * out.codes.dim(1),
              out.codes.data_as<int32_t>() + out.codes.numel(), Int4ZeroWord());
  } else {
    // Columns split: the words and group scales that hold the slice's columns, row by row (a slice
    // may start inside a word or a group).
    const int64_t padded = PaddedSize(in_dim, shard.pad_to_multiple);
    if (shard.pad_to_multiple < 1 || shard.rank < 0 || shard.rank >= shard.tp_size || padded % shard.tp_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' dim 1 = ", in_dim,
                                                     " cannot be split for rank ", shard.rank, " of tp_size ",
                                                     shard.tp_size));
    }
    const SliceOrigin origin = Origin(spec, shard);
    const int64_t cols = padded / shard.tp_size;
    if (origin.col + cols > in_dim) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "': int4 column slices of rank ",
                                                     shard.rank, " of tp_size ", shard.tp_size,
                                                     " would reach into padding columns (pad_to_multiple ",
                                                     shard.pad_to_multiple, "), which packed weights do not have"));
    }
    const int64_t word_begin = origin.col / kInt4PerWord, group_begin = origin.col / q.group_size;
    const int64_t word_end = cols > 0 ? (origin.col + cols + kInt4PerWord - 1) / kInt4PerWord : word_begin;
    const int64_t group_end = cols > 0 ? (origin.col + cols + q.group_size - 1) / q.group_size : group_begin;
    EAGLE3_ASSIGN_OR_RETURN(out.codes,
                            checkpoint.ReadColumns(packed_name, word_begin, word_end, DType::kI32, allocator));
    EAGLE3_ASSIGN_OR_RETURN(out.scales,
                            checkpoint.ReadColumns(scale_name, group_begin, group_end, DType::kF32, allocator));
    out.view.k = cols;
    out.view.col0 = origin.col;
    out.view.scale_col0 = group_begin;
  }
  out.view.codes = out.codes.view();
  out.view.scales = out.scales.view();
  return out;
}

}  // namespace

std::string Fp8ScaleName(std::string_view weight) { return absl::StrCat(Sv(weight), "_scale_inv"); }
std::string Int4PackedName(std::string_view weight) { return absl::StrCat(Sv(weight), "_packed"); }
std::string Int4ScaleName(std::string_view weight) { return absl::StrCat(Sv(weight), "_scale"); }
std::string Int4ShapeName(std::string_view weight) { return absl::StrCat(Sv(weight), "_shape"); }

std::vector<StoredForm> StoredForms(const DeepseekV2Config& config, const std::vector<WeightSpec>& specs) {
  const QuantizationConfig& q = config.quantization;
  std::vector<StoredForm> forms(specs.size(), StoredForm::kPlain);
  if (!q.quantized()) return forms;
  const IgnoreList ignore(q.ignore);
  for (size_t i = 0; i < specs.size(); ++i) {
    // Kimi-K2.5 stores the language model under a prefix; its ignore list names the text model's
    // modules ("lm_head", not "language_model.lm_head").
    const std::string_view name = TextModelTensorName(specs[i].name, config);
    if (!IsLinear(specs[i], name) || IsMtpProjection(name)) continue;
    if (q.format == WeightFormat::kFp8Block) {
      if (name != "lm_head.weight") forms[i] = StoredForm::kFp8Block;
    } else if (!ignore.Matches(ModuleName(name))) {
      forms[i] = StoredForm::kInt4Packed;
    }
  }
  return forms;
}

std::vector<std::string> StoredTensorNames(const WeightSpec& spec, StoredForm form) {
  switch (form) {
    case StoredForm::kPlain:
      return {spec.name};
    case StoredForm::kFp8Block:
      return {spec.name, Fp8ScaleName(spec.name)};
    case StoredForm::kInt4Packed:
      return {Int4PackedName(spec.name), Int4ScaleName(spec.name), Int4ShapeName(spec.name)};
  }
  return {};
}

absl::Status CheckStoredWeight(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                               const QuantizationConfig& quantization) {
  switch (form) {
    case StoredForm::kPlain:
      if (!checkpoint.Has(spec.name)) {
        return Missing(checkpoint, spec.name,
                       absl::StrCat("which its config.json requires (expected shape ", spec.shape.ToString(), ")"));
      }
      return checkpoint.ExpectShape(spec.name, spec.shape);
    case StoredForm::kFp8Block:
      return CheckFp8(checkpoint, spec, quantization);
    case StoredForm::kInt4Packed:
      return CheckInt4(checkpoint, spec, quantization);
  }
  return absl::InternalError("unknown stored form");
}

absl::StatusOr<Tensor> ReadWeightShard(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                                       const QuantizationConfig& quantization, const ShardSpec& shard, DType dtype,
                                       Allocator& allocator) {
  if (form == StoredForm::kPlain) return checkpoint.ReadShard(spec.name, shard, dtype, allocator);
  if (!IsFloat(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", spec.name, "' dequantizes to f32, f16 or bf16, not ", Sv(DTypeName(dtype))));
  }
  EAGLE3_ASSIGN_OR_RETURN(QuantizedShard stored, ReadQuantizedShard(checkpoint, spec, form, quantization, shard));
  // Dequantized into `allocator`'s memory when that is the result.
  EAGLE3_ASSIGN_OR_RETURN(Tensor f32, Tensor::Empty(DType::kF32, Shape{stored.view.rows(), stored.view.k},
                                                    dtype == DType::kF32 ? allocator : DefaultHostAllocator()));
  EAGLE3_RETURN_IF_ERROR(DequantizeWeight(stored.view, f32));
  return ToDtype(std::move(f32), dtype, allocator);
}

absl::StatusOr<QuantizedShard> ReadQuantizedShard(const Checkpoint& checkpoint, const WeightSpec& spec,
                                                  StoredForm form, const QuantizationConfig& quantization,
                                                  const ShardSpec& shard, Allocator& allocator) {
  switch (form) {
    case StoredForm::kFp8Block:
      return ReadFp8(checkpoint, spec, quantization, shard, allocator);
    case StoredForm::kInt4Packed:
      return ReadInt4(checkpoint, spec, quantization, shard, allocator);
    case StoredForm::kPlain:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' is not stored quantized"));
}

}  // namespace eagle3
