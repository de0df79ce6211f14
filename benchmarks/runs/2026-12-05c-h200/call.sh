#!/bin/bash
# Call C: the sixteenth session's GEMV A/B (without the suite), memcheck of the GEMV paths,
# memcheck / racecheck of the wgmma latent kernel, ncu source counters of the wgmma kernel.
set -u
source .gpu-host/env.sh
R=$OUT/c; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv > $R/gpu.txt 2>&1
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -2 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
timeout 120 compute-sanitizer --tool memcheck $T/quant_gemv_test --gtest_filter='*EveryPath*:*RowLooped*:*Grouped*' > $R/memcheck_gemv.txt 2>&1
echo "memcheck gemv rc=$? $(( $(date +%s) - start )) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/memcheck_gemv.txt | head -5
timeout 90 compute-sanitizer --tool memcheck $T/cuda_latent_bf16_test --gtest_filter='*Wgmma*' > $R/memcheck_wgmma.txt 2>&1
echo "memcheck wgmma rc=$? $(( $(date +%s) - start )) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $R/memcheck_wgmma.txt | head -5
timeout 120 compute-sanitizer --tool racecheck $T/cuda_latent_bf16_test --gtest_filter='*Wgmma*' > $R/racecheck_wgmma.txt 2>&1
echo "racecheck wgmma rc=$? $(( $(date +%s) - start )) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $R/racecheck_wgmma.txt | head -5
for v in generic default 3blocks bulk; do
  EAGLE3_QUANT_GEMV_TILED_KERNEL=$v EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $B/quant_gemv_benchmark \
    --benchmark_filter='BM_QuantGemv/shape:(0|2|5|6|21|22|23|24|25|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$v.txt 2>&1
  echo "gemv $v rc=$? $(( $(date +%s) - start )) s"
  EAGLE3_QUANT_GEMV_TILED_KERNEL=$v timeout 60 $B/quant_moe_benchmark --benchmark_filter=BM_QuantMoe \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$v.txt 2>&1
  echo "moe $v rc=$? $(( $(date +%s) - start )) s"
done
for kib in 48 112; do
  EAGLE3_QUANT_GEMV_SHARED_KIB=$kib timeout 60 $B/quantized_gemm_benchmark \
    --benchmark_filter='BM_QuantizedGemm/shape:[0-6]/m:(17|24|32|48|64)/path:0/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemm_smem$kib.txt 2>&1
  echo "gemm smem $kib rc=$? $(( $(date +%s) - start )) s"
done
EAGLE3_LATENT_TREE_KERNEL=wgmma timeout 120 ncu --kernel-name regex:LatentWgmmaKernel --launch-skip 2 --launch-count 1 \
  --set full --import-source yes -o $R/wgmma32x8 \
  $B/mla_decode_benchmark --benchmark_filter='BM_BatchedLatentAttention/heads:16/context:4096/batch:32/qtokens:8/cache_bits:16/' \
  --benchmark_repetitions=1 --benchmark_min_time=0.05s > $R/ncu_wgmma_log.txt 2>&1
echo "ncu full rc=$? $(( $(date +%s) - start )) s"
ncu --import $R/wgmma32x8.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $R/wgmma32x8.sass.csv.gz
ncu --import $R/wgmma32x8.ncu-rep --page details > $R/wgmma32x8.details.txt 2>&1
grep -E "Duration|Stall|Eligible|Issued Warp|Warp Cycles Per|Registers|Achieved Occ" $R/wgmma32x8.details.txt | head -20
tar czf $OUT/c.tgz --exclude="*.ncu-rep" -C $OUT c; echo "done $(( $(date +%s) - start )) s"
