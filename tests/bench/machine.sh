# Sourced by the benchmark scripts. `machine_lines` prints the two header lines every figure of
# BENCHMARKS.md carries (when, how many cores, which CPU, and the instruction sets the kernels
# choose from), so a table says which machine of this kind it was measured on.
machine_lines() {
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
  echo "# CPU flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx_vnni|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|amx_tile)$' | xargs)"
}

# `default_model TPS`: fetches the default model with the tpslab binary TPS if needed, and
# prints its path in the library.
default_model() {
  "$1" generate --model default --prompt x --max-tokens 1 --json >/dev/null
  echo "${TPSLAB_HOME:-$HOME/.local/share/tpslab}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
}
