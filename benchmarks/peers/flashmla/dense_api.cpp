// Minimal Python binding of FlashMLA's sm90 dense decode, for the eagle3 peer benchmark (issue 18).
//
// FlashMLA's own csrc/api/api.cpp binds every kernel family (sparse decode / prefill, sm100 dense
// prefill and backward), so compiling it would need all their sources. This file binds only the
// dense decode entry point, unchanged (csrc/api/dense_decode.h: scheduling metadata when none is
// given, the sm90 split-KV kernel, the combine kernel), plus the scheduling-metadata kernel alone so
// the benchmark can time it separately. Built only with:
//   csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
//   csrc/smxx/decode/combine/combine.cu
//   csrc/sm90/decode/dense/instantiations/bf16.cu
// and -DFLASH_MLA_DISABLE_FP16 (fp16.cu is not compiled).
#include <pybind11/pybind11.h>

#include "dense_decode.h"

// The scheduling metadata alone: the same num_sm_parts formula and the same kernel call (block size
// 64, fixed overhead 5 blocks, dense) as dense_attn_decode_interface makes when it is given none.
// Returns (tile_scheduler_metadata [num_sm_parts, 8] int32, num_splits [batch + 1] int32), which
// dense_decode_fwd then accepts as its last two arguments.
static std::tuple<at::Tensor, at::Tensor> get_decoding_sched_meta(const at::Tensor &seqlens_k, int64_t seqlen_q,
                                                                  int64_t num_heads_q, int64_t num_heads_k) {
    KU_CHECK_DEVICE(seqlens_k);
    KU_CHECK_CONTIGUOUS(seqlens_k);
    TORCH_CHECK(seqlens_k.dtype() == torch::kInt32, "seqlens_k must have dtype int32");
    TORCH_CHECK(num_heads_k > 0 && num_heads_q % num_heads_k == 0, "num_heads_k must divide num_heads_q");
    at::cuda::CUDAGuard device_guard{(char)seqlens_k.get_device()};
    Arch arch = Arch();
    const int b = static_cast<int>(seqlens_k.size(0));
    const int s_q = static_cast<int>(seqlen_q), h_q = static_cast<int>(num_heads_q), h_k = static_cast<int>(num_heads_k);
    const int num_sm_parts = std::max(arch.num_sms / h_k / cutlass::ceil_div(s_q * h_q / h_k, 64), 1);
    auto opts = seqlens_k.options();
    at::Tensor meta = torch::empty({num_sm_parts, static_cast<int64_t>(sizeof(DecodingSchedMeta) / 4)}, opts.dtype(torch::kInt32));
    at::Tensor num_splits = torch::empty({b + 1}, opts.dtype(torch::kInt32));
    GetDecodeSchedMetaParams params = {
        b, s_q,
        64,
        5,
        -1, -1,
        nullptr, nullptr,
        seqlens_k.data_ptr<int>(),
        (DecodingSchedMeta*)meta.data_ptr(),
        num_splits.data_ptr<int>(),
        num_sm_parts,
        at::cuda::getCurrentCUDAStream().stream()
    };
    smxx::decode::run_get_decoding_sched_meta_kernel(params);
    return {meta, num_splits};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashMLA sm90 dense decode only (eagle3 peer build)";
    m.def("dense_decode_fwd", &dense_attn_decode_interface);
    m.def("get_decoding_sched_meta", &get_decoding_sched_meta);
}
