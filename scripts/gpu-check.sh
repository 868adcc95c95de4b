#!/usr/bin/env bash
# Everything the GPU machine is for, in one device call (its time is short): the wheels it lacks,
# every kernel family, the GPU tests, then ninfer-bench on the 27B and 35B-A3B shapes. Results
# land in $OUT (gpu-tests.txt, bench27.json, bench35.json, and records.md: the runs as markdown
# for docs/performance.md; past the 8 files a call brings back, the JSON files go into
# json.tar.gz). BENCH=0 skips the bench. LONG=1 adds one 131,072-token prompt on the 27B shape,
# timed by part (long27.json). SPEC=1 adds speculative rounds on the 27B shape (--spec mtp, lanes
# 1-8, K 1..5, spec27.json; about 3 more minutes, so with SKIP_TESTS=1 when one device call must
# hold it all). LOGPROBS=1 adds what log-probabilities (top 5) cost a 27B decode step and prefill
# (benchmarks/logprobs_bench.py, logprobs27.json), with the kernels of 16 scored and plain decode
# steps. SERVE=1 adds the server on the 27B shape: the agent workload with the prefix cache on
# and off (agent27.json) and its first two turns on the engine alone under a kernel trace
# (benchmarks/agent_steps.py, agent_trace27.txt: each prompt-reading step's kernels and idle
# time; agent_trace27_each.txt the same with a packed step's attention lane by lane), about
# 3 minutes; SERVE=full also n=4 samples of one prompt (samples27.json), the
# conversations step by step (agent_steps27.txt) and under cProfile (agent_host27.txt: the
# host's time by function), about 7 minutes in all, so with SKIP_TESTS=1.
# OFFLOAD=1 adds the 35B-A3B with --vram-budget 8GiB, 1 and 8 lanes, with what the host computed,
# read and streamed beside each row (offload35.json), its decode with every host expert streamed
# instead (--expert-stream-decode all, offload35_streamed.json), the host's expert products by
# cores per expert at one row and eight (benchmarks/expert_offload_host_bench.py,
# offload_host.txt), a cProfile of its budgeted prefill (offload_prefill.txt), then its decode
# with no budget and with 64GiB, which every expert fits (budget35.json, budget35_64GiB.json);
# OFFLOAD=decode the first run (the default: decode reads the host experts in place), its
# decode again with the host's products as host nodes of captured steps
# (NINFER_CUDA_HOST_NODES=1 --expert-stream-decode off, offload35_nodes.json) and eagerly
# (--expert-stream-decode off, offload35_host.json), and the host's products alone;
# OFFLOAD=1 has the nodes' run too. IMAGES=1 writes the 27B with a full-size
# vision tower and times an image chat's first token (benchmarks/image_bench.py, 1024x1024,
# image27.json). PREFILL_HOST=1 adds a cProfile of one 2,048-token prefill chunk of each shape
# (prefill_host<shape>.txt: the host's issue time by function). PREFILL_SWEEP="2048 4096"
# adds the prefill at each of those chunk sizes with the delta rule's prefill by ours and by
# fla (prefill_<shape>_<chunk>_<provider>.json). FLASH=1 adds Qwen4Exp
# (qwen3_8_flash_next, 3 layers at full width, n-gram tables at 1/16 of their rows) with its
# tables resident, then streamed (flash_*.json; with TRACE=1 the resident step's kernels at
# 1 lane too); GLM=1 adds GLM5Next (glm5next, 3 layers) with --vram-budget 139GiB for the
# whole model (glm.json; GLM_CONTEXTS its decode contexts, default 1024: 16384 too reads the
# tokens each row chose, gathered; with TRACE=1 its step's ops and kernels at 1 lane; GLM_OURS=1
# its decode again with the KDA decode step on ours, glm_ours.json). OPS=1 times every
# CUDA provider of the op families beside each other (benchmarks/delta_rule_bench.py, delta_rule.json;
# prefill_attention_bench.py --library, attention_providers.txt; matmul_bench.py, matmul.txt). GGUF=1 adds the GGUF-block mixes
# (gguf_q4_k_m on both shapes, gguf_iq2_xxs on the 27B: benchgguf_*.json) and the kernel table of
# the main GGUF types (gpubench_gguf.txt); GGUF_RUNS picks those mixes (geometry:mix, as in the
# loop below). SHAPES picks the bench's shapes (default "qwen3_6_27b:27 qwen3_6_35b_a3b:35";
# empty: none). TESTS picks the test files (default tests/gpu; TESTS_TIMEOUT their limit in
# seconds, default 300; TESTS_PART=k/n every n-th file from the k-th; TESTS_WORKERS the
# processes sharing the GPU that run the files, default 4, 0 for one: the compilers' CPU time
# is most of the suite's, which took 311 s on an H100 in 4 with fla's kernels compiled cold);
# DECODE="--lanes 1 --contexts 1024" narrows the decode table; RUN=0 skips it, for the
# shape's other benchmarks alone; TRACE=1 adds its kernel trace (kernels per step,
# idle gaps); BF16_DECODE=1 runs the decode table again with NINFER_CUDA_DECODE=bf16
# (bench<shape>_bf16.json). TP=2 adds the decode table over two GPUs beside one (on an
# nvidia-h200-x2 machine); EP=1 with it holds each routed expert whole on one rank
# (--expert-parallel). SAVE_KCACHE=1 writes the warmed kernel cache to $OUT/kcache.tar.gz.part-*
# (15 MB pieces: a call brings back files of at most 16 MiB, and Triton's kernels make the cache
# larger); copied here into .kcache-carry/ (the pieces, or them joined as kcache.tar.gz) and
# carried, it saves a fresh machine most of its warm-up (minutes of NVRTC: the cache is keyed by
# source, options and NVRTC version, so a stale entry is never used, only missed; Triton's cache
# is kept with it). Without a GPU, `scripts/check_kernels.py --cache` builds the same cache here
# (NVRTC_LIB pointing at the NVRTC the GPU machine's warm-up prints). The copy of the tree on the
# GPU machine has no git history, so pass the commit:
#   run (carry .whl, and .kcache-carry if there): COMMIT=<short hash> bash scripts/gpu-check.sh
set -u
source scripts/gpu-prelude.sh
export NINFER_KERNEL_CACHE=$PWD/.kcache
# Triton's compiled kernels (fla-core's) live beside ours, so SAVE_KCACHE keeps them too
export TRITON_CACHE_DIR=$PWD/.kcache/triton
OUT=${OUT:-/tmp/ninfer-gpu-check}
mkdir -p "$OUT"
if [ -f .kcache-carry/kcache.tar.gz ]; then
  mkdir -p .kcache && tar xzf .kcache-carry/kcache.tar.gz -C .kcache
elif ls .kcache-carry/kcache.tar.gz.part-* >/dev/null 2>&1; then
  mkdir -p .kcache && cat .kcache-carry/kcache.tar.gz.part-* | tar xzf - -C .kcache
fi
python3 scripts/warm_kernels.py
if [ "${SAVE_KCACHE:-0}" = 1 ]; then
  save_kcache() {  # the pieces made aside, then swapped in: a call cut inside keeps the last
    rm -rf /tmp/kcache-pieces && mkdir -p /tmp/kcache-pieces &&
      tar czf - -C .kcache . | split -b 15M - /tmp/kcache-pieces/kcache.tar.gz.part- &&
      rm -f "$OUT"/kcache.tar.gz.part-* && mv /tmp/kcache-pieces/* "$OUT"/ &&
      ls -l "$OUT"/kcache.tar.gz.part-*
  }
  save_kcache
  trap save_kcache EXIT  # again at the end, with the Triton kernels the run compiled
fi
if [ -n "${TESTS_PART:-}" ]; then  # k/n: every n-th test file from the k-th
  TESTS=$(ls tests/gpu/test_*.py | awk -v k="${TESTS_PART%/*}" -v n="${TESTS_PART#*/}" \
    'NR % n == k % n' | tr '\n' ' ')
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # SIGINT at the limit: pytest stops and still prints its summary and slowest tests
  timeout -s INT -k 30 ${TESTS_TIMEOUT:-300} python3 -m pytest -q ${TESTS:-tests/gpu} -p no:cacheprovider $([ "${TESTS_WORKERS:-4}" -gt 0 ] && echo "-n ${TESTS_WORKERS:-4} --dist loadfile") --tb=short --durations=20 >"$OUT/gpu-tests.txt" 2>&1
  grep -E "passed|failed|FAILED|^E " "$OUT/gpu-tests.txt" | tail -30
fi
if [ "${OPS:-0}" = 1 ]; then
  timeout 240 python3 benchmarks/delta_rule_bench.py --json "$OUT/delta_rule.json" 2>&1 \
    | tee "$OUT/delta_rule.txt"
  timeout 240 python3 benchmarks/prefill_attention_bench.py --precisions bf16 --library 2>&1 \
    | tee "$OUT/attention_providers.txt"
  timeout 120 python3 benchmarks/matmul_bench.py --json "$OUT/matmul.json" 2>&1 \
    | tee "$OUT/matmul.txt"
fi
[ "${BENCH:-1}" = 1 ] || exit 0
for shape in ${SHAPES-qwen3_6_27b:27 qwen3_6_35b_a3b:35}; do
  geometry=${shape%%:*}
  name=${shape##*:}
  artifact=/tmp/bench$name.ninfer
  vision=
  [ "$name" = 27 ] && [ "${IMAGES:-0}" = 1 ] && vision=--vision
  timeout 120 python3 -m ninfer_runtime.bench.cli synth --geometry "$geometry" \
    --formats "$geometry" -o "$artifact" --force $vision | tail -1
  [ "${RUN:-1}" = 1 ] && timeout 150 python3 -m ninfer_runtime.bench.cli run "$artifact" ${DECODE:-} ${TP:+--tensor-parallel $TP} ${EP:+--expert-parallel} \
    --profile 1 --profile-prefill ${TRACE:+--kernel-trace} \
    --json "$OUT/bench$name.json" --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} \
    2>&1 | grep -v upload
  if [ "${RUN:-1}" = 1 ] && [ "${BF16_DECODE:-0}" = 1 ]; then
    NINFER_CUDA_DECODE=bf16 timeout 150 python3 -m ninfer_runtime.bench.cli run "$artifact" \
      ${DECODE:-} --prefill 0 --profile 1 --json "$OUT/bench${name}_bf16.json" \
      --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
  fi
  if [ "$name" = 27 ] && [ "${LONG:-0}" = 1 ]; then
    timeout 300 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1 --contexts 1024 \
      --steps 4 --prefill 0 --long-prefill 131072 --kv-dtype bfloat16 --json "$OUT/long$name.json" \
      --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
  fi
  # the prefill again at each chunk size of PREFILL_SWEEP (e.g. "2048 4096 8192"), with the
  # delta rule's prefill by each of ours and fla's (prefill_<shape>_<chunk>_<provider>.json)
  for chunk in ${PREFILL_SWEEP:-}; do
    for provider in nvrtc fla; do
      timeout 120 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1 --contexts 1024 \
        --steps 4 --chunk "$chunk" --provider "delta_rule.prefill=$provider" \
        --json "$OUT/prefill_${name}_${chunk}_$provider.json" --record "$OUT/records.md" \
        ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -E "^prefill|served by|Error"
    done
  done
  if [ "${PREFILL_HOST:-0}" = 1 ]; then
    timeout 180 python3 scripts/profile_prefill_parts.py "$artifact" --chunk-once \
      --host-profile >"$OUT/prefill_host$name.txt" 2>&1
    head -3 "$OUT/prefill_host$name.txt"
  fi
  if [ -n "$vision" ]; then
    timeout 240 python3 benchmarks/image_bench.py --model "$artifact" --backend cuda \
      --image-size 1024 --runs 3 --json "$OUT/image$name.json" 2>&1 | grep -v upload \
      | tee "$OUT/image$name.txt"
  fi
  if [ "$name" = 27 ] && [ "${LOGPROBS:-0}" = 1 ]; then
    timeout 240 python3 benchmarks/logprobs_bench.py "$artifact" --top 5 --lanes 1 --trace 16 \
      --json "$OUT/logprobs$name.json" 2>&1 | grep -v upload | tee "$OUT/logprobs$name.txt"
  fi
  if [ "$name" = 27 ] && [ "${SERVE:-0}" != 0 ]; then
    [ "$SERVE" = full ] && timeout 200 python3 benchmarks/samples_bench.py --model "$artifact" \
      --backend cuda --n 4 --json "$OUT/samples$name.json" 2>&1 | grep -v upload \
      | tee "$OUT/samples$name.txt"
    timeout 400 python3 benchmarks/serve_bench.py --workload agent --model "$artifact" \
      --backend cuda --system-tokens 4000 --clients 8 --turns 5 --output-len 32 \
      --json "$OUT/agent$name.json" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload \
      | grep -v " INFO " | tee "$OUT/agent$name.txt"
    # its first two turns on the engine alone under a kernel trace: each prompt-reading
    # step's device work
    timeout 200 python3 benchmarks/agent_steps.py --model "$artifact" --backend cuda \
      --system-tokens 4000 --clients 8 --turns 2 --output-len 32 --prefill-chunk 2048 \
      --trace 2>&1 | grep -v upload | grep -A40 "kernel trace" >"$OUT/agent_trace$name.txt"
    cat "$OUT/agent_trace$name.txt"
    # the same with a packed step's attention lane by lane (sdpa a lane), in the same run
    timeout 200 python3 benchmarks/agent_steps.py --model "$artifact" --backend cuda \
      --system-tokens 4000 --clients 8 --turns 2 --output-len 32 --prefill-chunk 2048 \
      --provider attention.prefill_lanes=each --trace 2>&1 | grep -v upload \
      | grep -A40 "kernel trace" >"$OUT/agent_trace${name}_each.txt"
    grep -E "^  step" "$OUT/agent_trace${name}_each.txt"
    if [ "$SERVE" = full ]; then
      # the same conversations, each step's wall time and reads (cache on)
      timeout 200 python3 benchmarks/agent_steps.py --model "$artifact" --backend cuda \
        --system-tokens 4000 --clients 8 --turns 3 --output-len 32 --prefill-chunk 2048 \
        --show c0t0,c1t0,c0t1 2>&1 | grep -v upload >"$OUT/agent_steps$name.txt"
      tail -8 "$OUT/agent_steps$name.txt"
      # and under cProfile: the host's time by function, where the packed steps idle the device
      timeout 200 python3 benchmarks/agent_steps.py --model "$artifact" --backend cuda \
        --system-tokens 4000 --clients 8 --turns 2 --output-len 32 --prefill-chunk 2048 \
        --host-profile 2>&1 | grep -v upload | grep -A200 "host time" >"$OUT/agent_host$name.txt"
    fi
  fi
  if [ "$name" = 35 ] && [ "${OFFLOAD:-0}" != 0 ]; then
    timeout 300 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 --contexts 1024 \
      --steps 8 --vram-budget 8GiB --json "$OUT/offload$name.json" --record "$OUT/records.md" \
      ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
    # the host's products as host nodes of captured steps
    NINFER_CUDA_HOST_NODES=1 timeout 200 python3 -m ninfer_runtime.bench.cli run "$artifact" \
      --lanes 1,8 --contexts 1024 --steps 8 --prefill 0 --vram-budget 8GiB \
      --expert-stream-decode off \
      --json "$OUT/offload${name}_nodes.json" --record "$OUT/records.md" \
      ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
    # and with the host's products (the default reads the host experts in place)
    timeout 200 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 \
      --contexts 1024 --steps 8 --prefill 0 --vram-budget 8GiB --expert-stream-decode off \
      --json "$OUT/offload${name}_host.json" --record "$OUT/records.md" \
      ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
    timeout 180 python3 benchmarks/expert_offload_host_bench.py --steps 10 --rounds 2 \
      --down-format q5_g64_fp16 --kernel-threads all,1,4 --rows 1,8 2>&1 \
      | tee "$OUT/offload_host.txt"
  fi
  if [ "$name" = 35 ] && [ "${OFFLOAD:-0}" = 1 ]; then
    # decode with every host expert a step routes to streamed instead (the link against the
    # host's int4 products)
    timeout 200 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 --contexts 1024 \
      --steps 8 --prefill 0 --vram-budget 8GiB --expert-stream-decode all \
      --json "$OUT/offload${name}_streamed.json" --record "$OUT/records.md" \
      ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
    # where the host's time goes in the budgeted prefill (the window's prepares and copies)
    timeout 180 python3 -m cProfile -o /tmp/offload_prefill.prof -m ninfer_runtime.bench.cli \
      run "$artifact" --lanes 1 --contexts 1024 --steps 2 --prefill 4096 --vram-budget 8GiB \
      2>&1 | grep -E "prefill|tok/s" | head -5
    python3 -c "import pstats, sys; s = pstats.Stats(sys.argv[1]); s.sort_stats('tottime').print_stats(40); s.sort_stats('cumulative').print_stats(40)" \
      /tmp/offload_prefill.prof >"$OUT/offload_prefill.txt" 2>&1
    # no budget, then a budget every expert fits (the bar: within 3%), one after the other
    for budget in "" "--vram-budget 64GiB"; do
      timeout 120 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 \
        --contexts 1024 --prefill 0 $budget --json "$OUT/budget$name${budget:+_64GiB}.json" \
        2>&1 | grep -v upload
    done
  fi
  if [ "$name" = 27 ] && [ "${SPEC:-0}" = 1 ]; then
    timeout 400 python3 -m ninfer_runtime.bench.cli run "$artifact" --spec mtp \
      --lanes 1,2,4,8 --contexts 1024 --prefill 0 --json "$OUT/spec$name.json" \
      --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
  fi
  rm -f "$artifact"*
done
# the full-width rows with fewer layers: Qwen4Exp with its n-gram tables resident, then
# streamed (the bar: streamed within 10%); GLM5Next with the H200's budget for the whole model
if [ "${FLASH:-0}" = 1 ]; then
  artifact=/tmp/flash.ninfer
  timeout 240 python3 -m ninfer_runtime.bench.cli synth --geometry qwen3_8_flash_next \
    --formats qwen3_8_flash_next --layers 3 --ple-rows-scale 0.0625 -o "$artifact" --force \
    | tail -3
  for ple in resident streamed; do
    # TRACE=1: the resident step's ops (ablation) and kernels at 1 lane, after its numbers
    trace=
    [ "$ple" = resident ] && [ -n "${TRACE:-}" ] && trace="--profile 1 --kernel-trace"
    timeout 240 python3 -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 \
      --contexts 1024 --ple-rows $ple $trace --json "$OUT/flash_$ple.json" \
      --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload \
      >"$OUT/flash_$ple.txt"
    tail -15 "$OUT/flash_$ple.txt"
  done
  rm -f "$artifact"*
fi
if [ "${GLM:-0}" = 1 ]; then
  artifact=/tmp/glm.ninfer
  timeout 240 python3 -m ninfer_runtime.bench.cli synth --geometry glm5next --formats glm5next \
    --layers 3 -o "$artifact" --force | tail -3
  # written as it goes: a run cut short by the call's limit still says how far it got; with
  # TRACE=1 the step's ops (ablation) and kernels at 1 lane too
  timeout 480 python3 -u -m ninfer_runtime.bench.cli run "$artifact" --lanes 1,8 --contexts "${GLM_CONTEXTS:-1024}" \
    --vram-budget 139GiB ${TRACE:+--profile 1 --kernel-trace} --json "$OUT/glm.json" \
    --record "$OUT/records.md" ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep --line-buffered -v upload | tee "$OUT/glm.txt"
  # GLM_OURS=1: its decode again with the KDA layers' decode step on ours (second in its
  # policy row until measured; the routed experts and the Sinkhorn on ours lead theirs)
  [ "${GLM_OURS:-0}" = 1 ] && timeout 300 python3 -u -m ninfer_runtime.bench.cli run "$artifact" \
    --lanes 1,8 --contexts 1024 --prefill 0 --vram-budget 139GiB \
    --provider delta_rule.kda_decode=nvrtc --json "$OUT/glm_ours.json" --record "$OUT/records.md" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep --line-buffered -v upload | tee "$OUT/glm_ours.txt"
  rm -f "$artifact"*
fi
if [ "${GGUF:-0}" = 1 ]; then
  timeout 120 python3 benchmarks/gpu_bench.py --rows 1,2,4,8 \
    --formats gguf_q4_k,gguf_q5_k,gguf_q6_k,gguf_q8_0,gguf_iq2_xxs >"$OUT/gpubench_gguf.txt" 2>&1
  grep -E "M=(1|8)" "$OUT/gpubench_gguf.txt" | grep -v " simt \| tc "
  for run in ${GGUF_RUNS-qwen3_6_27b:gguf_q4_k_m qwen3_6_35b_a3b:gguf_q4_k_m qwen3_6_27b:gguf_iq2_xxs}; do
    geometry=${run%%:*}
    mix=${run##*:}
    artifact=/tmp/gguf.ninfer
    timeout 90 python3 -m ninfer_runtime.bench.cli synth --geometry "$geometry" \
      --formats "$mix" -o "$artifact" --force | tail -1
    [ "${RUN:-1}" = 1 ] && timeout 150 python3 -m ninfer_runtime.bench.cli run "$artifact" ${DECODE:-} --profile 1 \
      --json "$OUT/benchgguf_${geometry}_$mix.json" --record "$OUT/records.md" \
      ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep -v upload
    rm -f "$artifact"*
  done
fi
# a device call brings back at most 8 files: past that, the JSON rows travel as one archive
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ] && ls "$OUT"/*.json >/dev/null 2>&1; then
  (cd "$OUT" && tar czf json.tar.gz ./*.json && rm -f ./*.json)
fi
