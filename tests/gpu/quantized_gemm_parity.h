// The fixture of the CudaBackend::QuantizedGemm tests (cuda_quantized_gemm_test.cc,
// cuda_fp8_w8a8_test.cc): quantized views copied to the device as LoadLinearWeight lays them out,
// and one call of a product run on the GPU and on the CPU reference, plain or with alpha, beta and
// a bias. Skipped where no CUDA device is visible (parity::ParityTest).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"
#include "parity_util.h"
#include "quantized_view_util.h"

namespace eagle3 {

inline Tensor Clone(const Tensor& t) {
  Tensor out = *Tensor::Empty(t.dtype(), t.shape());
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

class QuantizedGemmParityTest : public parity::ParityTest {
 protected:
  // A host view's codes and scales copied to the device as LoadLinearWeight lays them out: each in
  // its own (256-byte aligned) allocation, so a slice starting inside a 16-byte chunk of the whole
  // matrix's rows still starts on one.
  struct DeviceView {
    Tensor codes, scales;
    QuantizedWeightView view;
  };
  DeviceView ToDevice(const QuantizedWeightView& host) {
    DeviceView d;
    d.codes = Upload(Contiguous(host.codes));
    d.scales = Upload(Contiguous(host.scales));
    d.view = host;
    d.view.codes = d.codes.view();
    d.view.scales = d.scales.view();
    return d;
  }
  Tensor Contiguous(const TensorView& host) {
    Tensor t = *Tensor::Empty(host.dtype(), host.shape());
    EXPECT_TRUE(cpu_.Copy(host, t).ok());
    return t;
  }

  // One call: QuantizedGemm of the device view on the GPU (a = d_a, c starting as c0) and of the
  // host view on the CPU reference. With `epilogue`, alpha 0.5, beta -1.25 and the bias (host and
  // device copies); else a plain product. `options` is what the CPU ran, for a model product.
  struct Call {
    std::string what;
    GemmOptions options;
    Tensor got, exact;
  };
  Call RunCall(const Tensor& a, const Tensor& d_a, const QuantizedWeightView& host, const QuantizedWeightView& device,
               const Tensor& c0, bool epilogue, const Tensor& bias, const Tensor& d_bias, const Slice& s) {
    Call call;
    call.what = ::testing::PrintToString(s) + " M " + std::to_string(a.dim(0)) + (epilogue ? " alpha, beta, bias" : "");
    call.options = kWeightsGemm;
    GemmOptions d_options = kWeightsGemm;
    if (epilogue) {
      call.options = GemmOptions{.alpha = 0.5f, .beta = -1.25f, .bias = &bias.view(), .b_is_weights = true};
      d_options = call.options;
      d_options.bias = &d_bias.view();
    }
    Tensor d_c = Upload(c0);
    const absl::Status status = gpu_->QuantizedGemm(d_a, device, d_c, d_options);
    EXPECT_TRUE(status.ok()) << call.what << ": " << status;
    call.got = Download(d_c);
    call.exact = Clone(c0);
    EXPECT_TRUE(cpu_.QuantizedGemm(a, host, call.exact, call.options).ok()) << call.what;
    return call;
  }
};

}  // namespace eagle3
