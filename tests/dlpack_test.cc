#include "eagle3/dlpack.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "counting_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// gmock prints Debian abseil's string_view char by char; match on std::string instead.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

struct DTypeCase {
  DType dtype;
  uint8_t code;
  uint8_t bits;
};

constexpr DTypeCase kCases[] = {
    {DType::kF32, kDLFloat, 32}, {DType::kF16, kDLFloat, 16}, {DType::kBF16, kDLBfloat, 16},
    {DType::kI32, kDLInt, 32},   {DType::kI64, kDLInt, 64},   {DType::kU8, kDLUInt, 8},
};

void ExpectSameView(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.data(), b.data());
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.strides(), b.strides());
  EXPECT_EQ(a.device(), b.device());
}

TEST(DLPackTest, OwningRoundTripEveryDTypeFreesOnce) {
  for (const DTypeCase& c : kCases) {
    SCOPED_TRACE(std::string(DTypeName(c.dtype)));
    CountingAllocator allocator;
    auto tensor = Tensor::Empty(c.dtype, Shape{3, 5, 2}, allocator);
    ASSERT_TRUE(tensor.ok());
    std::memset(tensor->data(), 0x5a, tensor->nbytes());
    void* data = tensor->data();

    auto managed = ToDLPack(std::move(tensor).value());
    ASSERT_TRUE(managed.ok()) << managed.status();
    const DLTensor& dl = (*managed)->dl_tensor;
    EXPECT_EQ(dl.data, data);
    EXPECT_EQ(dl.device.device_type, kDLCPU);
    EXPECT_EQ(dl.ndim, 3);
    EXPECT_EQ(dl.dtype.code, c.code);
    EXPECT_EQ(dl.dtype.bits, c.bits);
    EXPECT_EQ(dl.dtype.lanes, 1);
    EXPECT_EQ(std::vector<int64_t>(dl.shape, dl.shape + 3), (std::vector<int64_t>{3, 5, 2}));
    EXPECT_EQ(std::vector<int64_t>(dl.strides, dl.strides + 3), (std::vector<int64_t>{10, 2, 1}));
    EXPECT_EQ(dl.byte_offset, 0u);

    auto view = FromDLPack(dl);
    ASSERT_TRUE(view.ok()) << view.status();
    ExpectSameView(*view, TensorView(data, c.dtype, Shape{3, 5, 2}));
    EXPECT_EQ(static_cast<uint8_t*>(view->data())[0], 0x5a);

    EXPECT_EQ(allocator.deallocations, 0);  // the DLManagedTensor owns the memory now
    (*managed)->deleter(*managed);
    EXPECT_EQ(allocator.allocations, 1);
    EXPECT_EQ(allocator.deallocations, 1);
  }
}

TEST(DLPackTest, ViewExportKeepsStridesAndFreesNoData) {
  CountingAllocator allocator;
  auto tensor = Tensor::Empty(DType::kF32, Shape{4, 6, 3}, allocator);
  ASSERT_TRUE(tensor.ok());
  const TensorView window = tensor->view().Narrow(1, 2, 3).Narrow(0, 1, 2);
  auto managed = ToDLPackView(window);
  ASSERT_TRUE(managed.ok()) << managed.status();
  const DLTensor& dl = (*managed)->dl_tensor;
  EXPECT_EQ(std::vector<int64_t>(dl.strides, dl.strides + 3), (std::vector<int64_t>{18, 3, 1}));
  auto back = FromDLPack(dl);
  ASSERT_TRUE(back.ok());
  ExpectSameView(*back, window);
  (*managed)->deleter(*managed);
  EXPECT_EQ(allocator.deallocations, 0);  // still owned by `tensor`
  tensor = Tensor();
  EXPECT_EQ(allocator.deallocations, 1);
}

TEST(DLPackTest, ScalarAndCudaViewsExport) {
  float x = 1.0f;
  auto scalar = ToDLPackView(TensorView(&x, DType::kF32, Shape{}));
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ((*scalar)->dl_tensor.ndim, 0);
  auto back = FromDLPack((*scalar)->dl_tensor);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->numel(), 1);
  (*scalar)->deleter(*scalar);

  // A device pointer is never dereferenced by the export, so any aligned address will do.
  alignas(16) static char device_memory[64];
  auto cuda = ToDLPackView(
      TensorView(device_memory, DType::kBF16, Shape{2, 8}, Shape{8, 1}, Device::Cuda(3)));
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ((*cuda)->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ((*cuda)->dl_tensor.device.device_id, 3);
  auto cuda_back = FromDLPack((*cuda)->dl_tensor);
  ASSERT_TRUE(cuda_back.ok());
  EXPECT_EQ(cuda_back->device(), Device::Cuda(3));
  (*cuda)->deleter(*cuda);
}

// A DLTensor over caller-owned storage for import tests.
struct Import {
  std::vector<int64_t> storage = std::vector<int64_t>(64);
  int64_t shape[7] = {2, 3, 4, 1, 1, 1, 1};
  int64_t strides[7] = {24, 4, 1, 1, 1, 1, 1};
  DLTensor dl{};

  Import() {
    dl.data = storage.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = 3;
    dl.dtype = DLDataType{kDLInt, 64, 1};
    dl.shape = shape;
    dl.strides = nullptr;
    dl.byte_offset = 0;
  }
};

TEST(DLPackTest, ImportAppliesStridesAndByteOffset) {
  Import in;
  in.dl.strides = in.strides;
  in.dl.byte_offset = 2 * sizeof(int64_t);
  auto view = FromDLPack(in.dl);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->data(), in.storage.data() + 2);
  EXPECT_EQ(view->strides(), (Shape{24, 4, 1}));
  EXPECT_EQ(view->shape(), (Shape{2, 3, 4}));

  in.dl.strides = nullptr;  // null strides: row-major
  in.dl.byte_offset = 0;
  in.shape[2] = 5;
  view = FromDLPack(in.dl);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->strides(), (Shape{15, 5, 1}));
  EXPECT_TRUE(view->is_contiguous());
}

TEST(DLPackTest, ImportMapsDevices) {
  Import in;
  in.dl.device = DLDevice{kDLCUDAHost, 0};
  auto pinned = FromDLPack(in.dl);
  ASSERT_TRUE(pinned.ok());
  EXPECT_TRUE(pinned->device().is_cpu());
  in.dl.device = DLDevice{kDLCUDA, 5};
  auto cuda = FromDLPack(in.dl);
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->device(), Device::Cuda(5));
}

void ExpectRejected(const DLTensor& dl, absl::StatusCode code,
                    const std::vector<std::string>& needles) {
  auto view = FromDLPack(dl);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), code) << view.status();
  for (const std::string& n : needles) EXPECT_THAT(Msg(view.status()), HasSubstr(n));
}

TEST(DLPackTest, ImportRejectsUnsupportedAndMalformed) {
  using absl::StatusCode;
  {
    Import in;
    in.dl.device = DLDevice{kDLOpenCL, 0};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"device type kDLOpenCL (4)"});
    in.dl.device = DLDevice{kDLCUDAManaged, 0};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"kDLCUDAManaged"});
    const int32_t future_type = 99;  // e.g. from a newer DLPack; not a value of this enum
    std::memcpy(&in.dl.device.device_type, &future_type, sizeof(future_type));
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"unknown (99)"});
    in.dl.device = DLDevice{kDLCUDA, -1};
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"negative device_id -1"});
  }
  {
    Import in;
    in.dl.dtype = DLDataType{kDLFloat, 64, 1};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"code 2, bits 64, lanes 1"});
    in.dl.dtype = DLDataType{kDLFloat, 32, 4};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"lanes 4"});
    in.dl.dtype = DLDataType{kDLComplex, 64, 1};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"code 5"});
    in.dl.dtype = DLDataType{kDLInt, 8, 1};
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"code 0, bits 8"});
  }
  {
    Import in;
    in.dl.ndim = 7;
    ExpectRejected(in.dl, StatusCode::kUnimplemented, {"ndim 7", "maximum rank 6"});
    in.dl.ndim = -1;
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"negative ndim -1"});
    in.dl.ndim = 2;
    in.dl.shape = nullptr;
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"shape is null"});
  }
  {
    Import in;
    in.shape[1] = -3;
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"[2, -3, 4]", "negative dim 1"});
  }
  {
    Import in;
    in.strides[0] = -24;
    in.dl.strides = in.strides;
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"[-24, 4, 1]", "negative in dim 0"});
  }
  {
    Import in;
    in.dl.byte_offset = 4;  // half an int64
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"byte_offset (4)", "not aligned", "i64"});
    in.dl.byte_offset = 0;
    in.dl.data = nullptr;
    ExpectRejected(in.dl, StatusCode::kInvalidArgument, {"data is null", "[2, 3, 4]"});
    in.shape[0] = 0;  // an empty tensor may have no data
    EXPECT_TRUE(FromDLPack(in.dl).ok());
  }
}

TEST(DLPackTest, ExportRefusesTypesWithoutDLPackCodes) {
  for (DType dtype : {DType::kBool, DType::kF8E4M3}) {
    CountingAllocator allocator;
    auto tensor = Tensor::Empty(dtype, Shape{4}, allocator);
    ASSERT_TRUE(tensor.ok());
    auto managed = ToDLPack(std::move(tensor).value());
    ASSERT_FALSE(managed.ok());
    EXPECT_EQ(managed.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(Msg(managed.status()),
                AllOf(HasSubstr("ToDLPack"), HasSubstr(std::string(DTypeName(dtype))),
                      HasSubstr("DLPack 0.6")));
    EXPECT_EQ(allocator.deallocations, 1);  // the refused tensor is released, not leaked

    uint8_t byte = 0;
    auto view = ToDLPackView(TensorView(&byte, dtype, Shape{1}));
    ASSERT_FALSE(view.ok());
    EXPECT_THAT(Msg(view.status()), HasSubstr("ToDLPackView"));
  }
  EXPECT_EQ(ToDLPack(Tensor()).status().code(), absl::StatusCode::kInvalidArgument);  // no data
}

}  // namespace
}  // namespace eagle3
