#!/bin/bash
# Call N (twenty-first session): joined dense shared experts round as their own MLP does
# (ExpertWeights::bf16_activations): the MoE / bf16 / model tests, the V2-Lite step, BM_MoeDecode.
set -u
source .gpu-host/env.sh
R=$OUT/n; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/n.tgz --exclude="*.ncu-rep" -C $OUT n; }
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
timeout 200 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 180 \
  --only cuda_backend_moe_test,cuda_moe_grouped_test,cuda_bf16_weights_test,draft_kinds_gpu_test,model_gpu_test,speculative_step_gpu_test,target_graph_test,cuda_quantized_moe_test,draft_graph_test > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-160 $R/suite/summary.txt
grep -h "near-tie\|differs from plain\|flagged vs not" $R/suite/logs/*.log | cut -c1-220 | head -12
pack
SF='BM_DecodeStep/model:0/batch:1/context:1024/graph:1|BM_VerifyStep/model:0/batch:1/tokens:8/context:4096/graph:1'
env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 $B/decode_step_benchmark --benchmark_filter="$SF" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_new.json > $R/step_new.txt 2>&1
echo "step rc=$? $(( $(date +%s) - start )) s $(grep -E 'median' $R/step_new.txt | awk '{print $1, $2, $3}' | tr '\n' ' ')"
timeout 60 $B/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[23]/tokens:(1|4)/join' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/moe_new.json > $R/moe_new.txt 2>&1
echo "moe rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_new.txt | awk '{print $1, $2, $3}' | sed 's/\/iterations.*manual_time_median//'
timeout 100 compute-sanitizer --tool memcheck $T/cuda_backend_moe_test --gtest_filter='*Bf16Activations*:*Experts*Shapes*' > $R/san_memcheck.txt 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $R/san_memcheck.txt | tr '\n' ' ')"
pack
echo "done $(( $(date +%s) - start )) s"
