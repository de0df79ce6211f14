#include "eagle3/dlpack.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

struct DTypeCode {
  DType dtype;
  uint8_t code;
  uint8_t bits;
};

// The one table both directions use. bool and f8_e4m3 have no DLPack 0.6 code.
constexpr std::array<DTypeCode, 6> kDTypeCodes = {{
    {DType::kF32, kDLFloat, 32},
    {DType::kF16, kDLFloat, 16},
    {DType::kBF16, kDLBfloat, 16},
    {DType::kI32, kDLInt, 32},
    {DType::kI64, kDLInt, 64},
    {DType::kU8, kDLUInt, 8},
}};

std::string DeviceTypeName(int type) {
  switch (type) {
    case kDLCPU:
      return "kDLCPU (1)";
    case kDLCUDA:
      return "kDLCUDA (2)";
    case kDLCUDAHost:
      return "kDLCUDAHost (3)";
    case kDLOpenCL:
      return "kDLOpenCL (4)";
    case kDLVulkan:
      return "kDLVulkan (7)";
    case kDLMetal:
      return "kDLMetal (8)";
    case kDLVPI:
      return "kDLVPI (9)";
    case kDLROCM:
      return "kDLROCM (10)";
    case kDLROCMHost:
      return "kDLROCMHost (11)";
    case kDLExtDev:
      return "kDLExtDev (12)";
    case kDLCUDAManaged:
      return "kDLCUDAManaged (13)";
    default:
      return absl::StrCat("unknown (", type, ")");
  }
}

std::string DescribeDType(const DLDataType& t) {
  return absl::StrCat("code ", static_cast<int>(t.code), ", bits ", static_cast<int>(t.bits),
                      ", lanes ", static_cast<int>(t.lanes));
}

absl::StatusOr<DType> ToDType(const DLDataType& t) {
  if (t.lanes != 1) {
    return absl::UnimplementedError(absl::StrCat("FromDLPack: vector dtypes are not supported (",
                                                 DescribeDType(t), "; expected lanes 1)"));
  }
  for (const DTypeCode& entry : kDTypeCodes) {
    if (entry.code == t.code && entry.bits == t.bits) return entry.dtype;
  }
  return absl::UnimplementedError(
      absl::StrCat("FromDLPack: unsupported dtype (", DescribeDType(t),
                   "); supported: float 32/16, bfloat 16, int 32/64, uint 8"));
}

absl::StatusOr<Device> ToDevice(const DLDevice& d) {
  // Read the raw value: producers built against newer DLPack send types this enum lacks, and
  // loading those through the enum type is undefined behaviour.
  static_assert(sizeof(DLDeviceType) == sizeof(int32_t));
  int32_t type;
  std::memcpy(&type, &d.device_type, sizeof(type));
  switch (type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: addressable by host code
      return Device::Cpu();
    case kDLCUDA:
      if (d.device_id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("FromDLPack: kDLCUDA tensor has negative device_id ", d.device_id));
      }
      return Device::Cuda(d.device_id);
    default:
      return absl::UnimplementedError(
          absl::StrCat("FromDLPack: device type ", DeviceTypeName(type),
                       " is not supported (kDLCPU, kDLCUDA, kDLCUDAHost)"));
  }
}

// Owns everything a DLManagedTensor points at; `managed.manager_ctx` points back here, so the
// deleter frees the lot in one delete. `tensor` stays empty for non-owning exports.
struct ExportContext {
  DLManagedTensor managed{};
  Tensor tensor;
  int64_t shape[Shape::kMaxRank] = {};
  int64_t strides[Shape::kMaxRank] = {};
};

void DeleteExportContext(DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
}

absl::StatusOr<DLManagedTensor*> Export(const TensorView& view, Tensor owned, const char* op) {
  std::optional<DTypeCode> code;
  for (const DTypeCode& entry : kDTypeCodes) {
    if (entry.dtype == view.dtype()) code = entry;
  }
  if (!code) {
    return absl::UnimplementedError(absl::StrCat(op, ": ", view.ToString(), " has dtype ",
                                                 std::string(DTypeName(view.dtype())),
                                                 ", which DLPack 0.6 has no type code for"));
  }
  if (view.data() == nullptr && view.numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", view.ToString(), " has no data"));
  }
  auto* ctx = new (std::nothrow) ExportContext();
  if (ctx == nullptr) return absl::ResourceExhaustedError(absl::StrCat(op, ": out of host memory"));
  ctx->tensor = std::move(owned);
  for (int i = 0; i < view.rank(); ++i) {
    ctx->shape[i] = view.dim(i);
    ctx->strides[i] = view.stride(i);
  }
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = view.data();
  t.device = view.device().is_cuda() ? DLDevice{kDLCUDA, view.device().index} : DLDevice{kDLCPU, 0};
  t.ndim = view.rank();
  t.dtype = DLDataType{code->code, code->bits, 1};
  t.shape = ctx->shape;
  t.strides = ctx->strides;
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteExportContext;
  return &ctx->managed;
}

}  // namespace

absl::StatusOr<TensorView> FromDLPack(const DLTensor& tensor) {
  EAGLE3_ASSIGN_OR_RETURN(const Device device, ToDevice(tensor.device));
  EAGLE3_ASSIGN_OR_RETURN(const DType dtype, ToDType(tensor.dtype));
  if (tensor.ndim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("FromDLPack: negative ndim ", tensor.ndim));
  }
  if (tensor.ndim > Shape::kMaxRank) {
    return absl::UnimplementedError(absl::StrCat(
        "FromDLPack: ndim ", tensor.ndim, " exceeds eagle3's maximum rank ", Shape::kMaxRank));
  }
  if (tensor.ndim > 0 && tensor.shape == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromDLPack: ndim is ", tensor.ndim, " but shape is null"));
  }
  Shape shape;
  Shape::FromSpan({tensor.shape, static_cast<size_t>(tensor.ndim)}, &shape);
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FromDLPack: shape ", shape.ToString(), " has negative dim ", i));
    }
  }
  Shape strides = ContiguousStrides(shape);
  if (tensor.strides != nullptr) {
    Shape::FromSpan({tensor.strides, static_cast<size_t>(tensor.ndim)}, &strides);
    for (int i = 0; i < strides.rank(); ++i) {
      if (strides[i] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("FromDLPack: strides ", strides.ToString(), " of shape ", shape.ToString(),
                         " are negative in dim ", i, " (eagle3 views need non-negative strides)"));
      }
    }
  }
  if (tensor.data == nullptr && shape.numel() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromDLPack: data is null for shape ", shape.ToString()));
  }
  char* data =
      tensor.data == nullptr ? nullptr : static_cast<char*>(tensor.data) + tensor.byte_offset;
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(dtype) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FromDLPack: data + byte_offset (", tensor.byte_offset, ") is not aligned to ",
                     DTypeSize(dtype), "-byte ", std::string(DTypeName(dtype)), " elements"));
  }
  return TensorView(data, dtype, shape, strides, device);
}

absl::StatusOr<DLManagedTensor*> ToDLPack(Tensor tensor) {
  const TensorView view = tensor.view();
  return Export(view, std::move(tensor), "ToDLPack");
}

absl::StatusOr<DLManagedTensor*> ToDLPackView(const TensorView& view) {
  return Export(view, Tensor(), "ToDLPackView");
}

}  // namespace eagle3
