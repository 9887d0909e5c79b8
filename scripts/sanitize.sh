#!/usr/bin/env bash
# Runs a short selection of the CUDA tests under compute-sanitizer's four
# tools and writes a summary table (tool, tests, errors, exit code, seconds)
# to the file given as $1; each tool's full log goes next to it.
#
#   scripts/sanitize.sh SUMMARY_FILE [tool ...]     (default: all tools)
#
# Tools: memcheck (out-of-bounds and misaligned accesses; over the kernel
# tests, the malformed-input catalogue and a few hypothesis examples),
# memcheck_large (one >2**31-element case), racecheck (shared-memory hazards;
# the block-wide long-row paths), initcheck (reads of uninitialised global
# memory), synccheck (barrier misuse). Env:
#   SANITIZE_LIMIT=seconds   per tool (default 150: racecheck and initcheck
#                            are 10-100x slower than a plain run). Under a
#                            10-minute command limit, run the tools in two
#                            calls: `memcheck memcheck_large`, then the rest.
#   SANITIZE_BUILD=0|1       build the extension first (default: only if a CUDA
#                            op does not run)
#   COMPUTE_SANITIZER=path   the binary (default: PATH, then $CUDA_HOME/bin)
#   SANITIZE_SETS="GATV2 DONATION"  every tool over these sets of tests
#                            (the arrays below) instead of its own selection:
#                            a changed kernel's tests under all four tools
# Exit code: 0 when every tool ran clean, 1 otherwise.
set -uo pipefail
SUMMARY="${1:?usage: scripts/sanitize.sh SUMMARY_FILE [tool ...]}"; shift
TOOLS=("$@"); [ ${#TOOLS[@]} -eq 0 ] && TOOLS=(memcheck memcheck_large racecheck initcheck synccheck)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"; cd "$ROOT"
LOGDIR="$(cd "$(dirname "$SUMMARY")" && pwd)"; mkdir -p "$LOGDIR"
LIMIT="${SANITIZE_LIMIT:-150}"
export PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=sanitize
# Real cudaMalloc per tensor, so an access past a tensor's end leaves its
# allocation instead of landing in a neighbour inside the caching allocator's
# pool (memcheck), and fresh memory really is uninitialised (initcheck).
export PYTORCH_NO_CUDA_MEMORY_CACHING=1

CS="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
for dir in "${CUDA_HOME:-}" /usr/local/cuda /usr/local/cuda-*; do
  [ -z "$CS" ] && [ -x "$dir/bin/compute-sanitizer" ] && CS="$dir/bin/compute-sanitizer"
done

# As scripts/gpu_check.sh: the system compiler links libstdc++ like torch does.
if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc; fi
probe='import torch, pyg_multihead_agg as p; r = torch.tensor([0, 1], device="cuda"); '\
'p.multihead_spmm(r, r[:1], torch.ones(1, 1, device="cuda"), torch.ones(1, 1, 2, device="cuda"))'
if [ "${SANITIZE_BUILD:-auto}" = 1 ] || { [ "${SANITIZE_BUILD:-auto}" = auto ] \
    && ! python3 -c "$probe" > /dev/null 2>&1; }; then
  echo "building the extension" >&2
  MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
    python3 -m pip install --no-build-isolation --no-deps -e . > "$LOGDIR/sanitize_build.log" 2>&1 \
    || { tail -30 "$LOGDIR/sanitize_build.log" >&2; exit 1; }
fi

K=tests/test_cuda_kernels.py
# Test ids: [H-D-dtypeN-index_dtypeM], dtype0..3 = float16, bfloat16, float32,
# float64; index_dtype0 = int32, index_dtype1 = int64.
SMALL=(
  "$K::test_every_specialisation[1-1-dtype2-index_dtype0]"
  "$K::test_every_specialisation[3-33-dtype0-index_dtype1]"
  "$K::test_every_specialisation[8-128-dtype1-index_dtype0]"
  "$K::test_every_specialisation[4-256-dtype3-index_dtype1]"
  "$K::test_every_specialisation[2-24-dtype2-index_dtype0]"
  "$K::test_every_specialisation[1-1024-dtype2-index_dtype1]"
  "$K::test_empty_and_bipartite[0-7-0-index_dtype0]"
  "$K::test_empty_and_bipartite[7-300-40-index_dtype1]"
)
# Rows narrower than a warp, one row per warp (the warp's groups split it)
# and one per group; bf16 4 x 32 and a single-lane row (1 x 8 bf16).
NARROW=(
  "$K::test_forward_narrow_rows_both_layouts[4-32-dtype1-row_per_warp]"
  "$K::test_forward_narrow_rows_both_layouts[4-32-dtype1-row_per_group]"
  "$K::test_forward_narrow_rows_both_layouts[1-8-dtype1-row_per_warp]"
)
HUB=(
  "$K::test_power_law_with_hub[4-32-dtype2-index_dtype0]"
  "$K::test_power_law_with_hub[3-33-dtype1-index_dtype1]"
  "$K::test_power_law_with_hub[8-128-dtype0-index_dtype0]"
  "$K::test_sliced_columns_every_size[4-32-dtype2]"
  "$K::test_forced_short_slices[4-32-dtype1]"
  "$K::test_forced_short_slices[8-16-dtype2]"
)
# The fused attention kernels: a head of 33 channels (scalar path), a hub row
# (block-wide forward), every source a long CSC column (sliced backward),
# with edge scores and dropout.
G=tests/test_gat_attention.py
GAT=(
  "$G::test_forward_matches_reference[25x25-E60-H2-D33-float32-int32-s_edge-p0.5-cuda]"
  "$G::test_forward_matches_reference[8x50-E400-H8-D64-hub-bfloat16-int32-s_edge-p0.5-cuda]"
  "$G::test_forward_matches_reference[60x6-E800-H3-D16-float32-int32-s_edge-p0.5-cuda]"
  "$G::test_backward_matches_reference[25x25-E60-H2-D33-float32-int32-no_csc-s_edge-p0.5-cuda]"
  "$G::test_backward_matches_reference[8x50-E400-H8-D64-hub-float32-int32-no_csc-s_edge-p0.5-cuda]"
  "$G::test_backward_matches_reference[60x6-E800-H3-D16-float32-int32-no_csc-s_edge-p0.5-cuda]"
  "$G::test_forward_with_bias_matches_reference[8x50-E400-H8-D64-hub-bfloat16-p0.5-cuda]"
  "$G::test_backward_with_bias_matches_reference[8x50-E400-H8-D64-hub-float32-no_csc-s_edge-p0.5-cuda]"
  "$G::test_backward_with_bias_matches_reference[60x6-E800-H3-D16-float32-csc-s_edge-p0-cuda]"
)
# The GATv2 kernels (Gatv2Score on the skeleton, the destination pass): a
# hub row (block-wide forward), every source a long CSC column (sliced CSC
# pass), padded heads (48 channels on 16 lanes, 7 channels copied to 8),
# edge features, dropout, bias and perm_inv, the record, and the transposed
# forward and CSC pass (heads of 8 and 4 lanes, a padded head of 6 vectors
# in 8, with and without edge features).
V=tests/test_channel_attention.py
GATV2=(
  "$V::test_forward_matches_reference[8x50-E400-H8-D64-hub-float32-int32-e_feat-p0.5-gatv2-cuda]"
  "$V::test_forward_matches_reference[60x6-E800-H3-D16-bfloat16-int64-e_feat-p0.5-gatv2-cuda]"
  "$V::test_backward_matches_reference[8x50-E400-H8-D64-hub-f32-i32-edge_dropout-csc_perm_inv-gatv2-cuda]"
  "$V::test_backward_matches_reference[60x6-E800-H3-D16-bf16-i64-edge_bias-csc-gatv2-cuda]"
  "$V::test_backward_matches_reference[25x25-E60-H2-D33-f16-i32-dropout-no_csc-gatv2-cuda]"
  "$V::test_heads_and_channels[3-48-float32-gatv2-cuda]"
  "$V::test_heads_and_channels[1-7-bfloat16-gatv2-cuda]"
  "$V::test_gatv2_record_matches_reference[2-100-float32-cuda]"
  "$V::test_gatv2_backward_over_the_record[8x50-E400-H3-D16-hub-p0.5-cuda]"
  "$V::test_gatv2_retained_graph_keeps_the_record[cuda]"
  "$V::test_forward_both_layouts[H4-D32-float32-int32-gatv2-no_edge]"
  "$V::test_forward_both_layouts[H4-D32-bfloat16-int64-gatv2-no_edge]"
  "$V::test_forward_both_layouts[H3-D24-float32-int32-gatv2-edge]"
  "$V::test_forward_both_layouts[H4-D32-float32-int64-gatv2-edge]"
  "$V::test_backward_both_layouts[H4-D32-float32-int32-gatv2-edge]"
  "$V::test_backward_both_layouts[H4-D32-bfloat16-int64-gatv2-no_edge]"
  "$V::test_backward_both_layouts[H3-D24-float32-int32-gatv2-no_edge]"
  "$V::test_backward_both_layouts[H2-D8-float64-int32-gatv2-edge]"
)
# The TransformerConv kernels (TransformerScore on the skeleton, its
# transposed CSC pass, the destination pass that gathers the keys): the same
# shapes as GATv2's, and the transposed pass's layouts.
TRANSFORMER=(
  "$V::test_forward_matches_reference[8x50-E400-H8-D64-hub-float32-int32-e_feat-p0.5-transformer-cuda]"
  "$V::test_forward_matches_reference[60x6-E800-H3-D16-bfloat16-int64-e_feat-p0.5-transformer-cuda]"
  "$V::test_backward_matches_reference[8x50-E400-H8-D64-hub-f32-i32-edge_dropout-csc_perm_inv-transformer-cuda]"
  "$V::test_backward_matches_reference[60x6-E800-H3-D16-bf16-i64-edge_bias-csc-transformer-cuda]"
  "$V::test_backward_matches_reference[25x25-E60-H2-D33-f16-i32-dropout-no_csc-transformer-cuda]"
  "$V::test_heads_and_channels[3-48-float32-transformer-cuda]"
  "$V::test_heads_and_channels[1-7-bfloat16-transformer-cuda]"
  "$V::test_backward_both_layouts[H4-D32-float32-int32-transformer-edge]"
  "$V::test_backward_both_layouts[H3-D24-float32-int64-transformer-no_edge]"
  "$V::test_backward_both_layouts[H4-D32-bfloat16-int32-transformer-edge]"
  "$V::test_forward_both_layouts[H4-D32-float32-int32-transformer-no_edge]"
  "$V::test_forward_both_layouts[H2-D32-float16-int64-transformer-edge]"
)
# Gradient donation: the transformer's and GATv2's backward kernels writing
# gradients into buffers that are their own inputs (the output, the query,
# the value, x_r), fresh ones poisoned, and rows no edge reaches, through
# the _backward_into ops. (The autograd step that donates,
# test_backward_writes_into_what_only_it_holds, run after these under
# compute-sanitizer, did not donate the query's and value's memory and
# failed its assertion, though it passes alone and in its file without the
# sanitizer; it runs the same kernels as these.)
DONATION=(
  "tests/test_gradient_donation.py::test_backward_into_buffers_and_in_place[cuda]"
  "tests/test_gradient_donation.py::test_backward_into_writes_every_row[cuda]"
  "tests/test_gradient_donation.py::test_gatv2_backward_into_buffers[cuda]"
)
# The transposed dot-product kernels (heads of 8 and 4 lanes: float32 D = 32,
# bf16 D = 32, float32 D = 16) against the per-lane ones, hub included.
TRANSPOSED=(
  "$K::test_dot_products_both_layouts[3-32-dtype2]"
  "$K::test_dot_products_both_layouts[3-32-dtype1]"
  "$K::test_dot_products_both_layouts[4-16-dtype2]"
  "$G::test_both_layouts_cuda[H4D32-E600-float32-int32-s_edge-p0.5]"
  "$G::test_both_layouts_cuda[H2D64-E400-bfloat16-int64-s_edge-p0.5]"
  "$G::test_both_layouts_cuda[H3D16-E800-float32-int64-no_edge-p0]"
  "$K::test_forward_transposed_weights[4-16-dtype2]"
  "$K::test_forward_transposed_weights[3-32-dtype1]"
  "$K::test_gather_rows_around_the_step[4-32-dtype1-index_dtype0]"
  "$K::test_gather_rows_around_the_step[4-32-dtype2-index_dtype0]"
  "$K::test_gather_rows_around_the_step[2-64-dtype1-index_dtype0]"
)
# Fetches sorted by degree (FetchOrder, 2-byte types): two rows a warp, and
# fetches of 64 items in two windows of 32 (G = 4).
SORTED=(
  "$K::test_sorted_fetch_same_results[4-32-dtype1-index_dtype0]"
  "$K::test_sorted_fetch_same_results[1-32-dtype1-index_dtype1]"
  "$K::test_sorted_fetch_same_results[3-32-dtype0-index_dtype0]"
)
# The fused backward with perm_inv (logit gradients by CSC entry, row sums
# through perm_inv): heads of 8 and 4 lanes (transposed and not), the
# per-head path (D = 33), more than 32 heads (one warp per row and head),
# sliced CSC columns; a perm_inv out of range. The spmm backward with
# perm_inv (grad_weight and the weights by CSC entry, gathered through
# perm_inv / perm) runs in every check_all_ops case above; here its
# out-of-range perm_inv.
FETCH=(
  "$K::test_fetch_rounds_same_results[4-32-dtype0]"
  "$K::test_fetch_rounds_same_results[4-32-dtype1]"
  "$K::test_fetch_rounds_same_results[3-7-dtype1]"
)
S=tests/test_gat_scores.py
SCORES=(
  "$S::test_matches_products[N5000-H4-C32-torch.float32-src_dst-cuda]"
  "$S::test_matches_products[N140000-H1-C3-torch.bfloat16-src-cuda]"
  "$S::test_matches_products[N37-H3-C7-torch.float16-src_dst-cuda]"
  "$S::test_one_score_used[dst_only-cuda]"
  "$S::test_half_x_float32_atts[torch.bfloat16-cuda]"
)
PERMINV=(
  "tests/test_ops.py::test_out_of_range_perm_inv_does_not_fault_cuda[torch.float32]"
  "tests/test_ops.py::test_out_of_range_perm_inv_does_not_fault_cuda[torch.bfloat16]"
  "$G::test_backward_perm_inv_same_results[50x60-E600-H4-D32-float32-int32-s_edge-p0-transposed-cuda]"
  "$G::test_backward_perm_inv_same_results[60x6-E800-H3-D16-float32-int32-no_edge-p0.5-every_lane-cuda]"
  "$G::test_backward_perm_inv_same_results[25x25-E60-H2-D33-bfloat16-int64-s_edge-p0-transposed-cuda]"
  "$G::test_backward_perm_inv_same_results[20x15-E200-H40-D2-float32-int32-s_edge-p0-transposed-cuda]"
  "$G::test_backward_perm_inv_same_results[8x50-E400-H8-D64-bfloat16-int64-no_edge-p0.5-transposed-cuda]"
  "$G::test_out_of_range_perm_inv_does_not_fault_cuda"
  "$G::test_backward_forced_short_slices_cuda[60x6-E800-H3-D16-float32]"
)
# The tensor-core forward (csrc/cuda/spmm/tensor_core_gather.cuh) and backward
# (csrc/cuda/spmm/tensor_core_backward.cuh): heads of 32 and 16 features, long rows summed
# block-wide through shared memory (forward) or in slices (backward), the
# non-finite fallback, malformed graphs and the unaligned fallback.
TC=(
  "$K::test_tensor_core_forward[4-32-dtype1]"
  "$K::test_tensor_core_forward[8-16-dtype0]"
  "$K::test_tensor_core_forward_non_finite[dtype1-index_dtype0]"
  "$K::test_tensor_core_forward_malformed_and_unaligned[index_dtype0]"
  "$K::test_tensor_core_forward_malformed_and_unaligned[index_dtype1]"
  "$K::test_tensor_core_backward[4-32-dtype1]"
  "$K::test_tensor_core_backward[8-16-dtype0]"
  "$K::test_tensor_core_backward_non_finite[dtype1-index_dtype0]"
  "$K::test_tensor_core_backward_malformed_and_unaligned[index_dtype0]"
  "$K::test_tensor_core_backward_malformed_and_unaligned[index_dtype1]"
)
# The device=cuda cases of the malformed-input catalogue and the properties
# (with HYPOTHESIS_PROFILE=sanitize: a few examples each); `-k cuda` keeps
# every test_cuda_kernels.py test too, through its module name.
MALFORMED=(
  "$K::test_malformed_graphs_do_not_fault"
  "$G::test_overlapping_rows_do_not_fault_cuda"
  "$K::test_unaligned_and_non_contiguous_inputs"
  tests/test_malformed.py tests/test_properties.py -k cuda
)
# Our kernels live in namespace pyg_multihead_agg; racecheck and synccheck
# only instrument those (they track nothing across kernels). initcheck and
# memcheck watch every kernel: initcheck must see torch's kernels write the
# inputs, or it would call them uninitialised.
OURS=(--kernel-name kns=pyg_multihead_agg)

selection() {
  if [ -n "${SANITIZE_SETS:-}" ]; then  # the named sets under every tool, on one line
    local set_name all=()
    for set_name in $SANITIZE_SETS; do eval "all+=(\"\${${set_name}[@]}\")"; done
    echo "${all[@]}"
    return
  fi
  case "$1" in
    memcheck) echo "${SMALL[@]}" "${NARROW[@]}" "${HUB[@]}" "${GAT[@]}" "${GATV2[@]}" "${TRANSFORMER[@]}" "${DONATION[@]}" "${TRANSPOSED[@]}" \
      "${SORTED[@]}" "${FETCH[@]}" "${SCORES[@]}" "${PERMINV[@]}" "${TC[@]}" "${MALFORMED[@]}";;
    memcheck_large) echo "tests/test_large_index.py::test_many_source_rows[4-64-index_dtype0]";;
    racecheck) echo "${HUB[@]}" "${SMALL[0]}" "${SMALL[2]}" "${GAT[@]:1:2}" "${GAT[@]:4:2}" \
      "${SORTED[@]:0:1}" "${FETCH[@]:1:1}" "${SCORES[@]:0:1}" "${PERMINV[@]:0:2}" "${TC[@]:0:2}" "${TC[@]:5:1}" "${GATV2[@]:0:3}" "${TRANSFORMER[@]:0:3}";;
    initcheck) echo "${SMALL[@]:0:3}" "${NARROW[0]}" "${HUB[0]}" \
      "$K::test_malformed_graphs_do_not_fault" "${GAT[@]}" "${GATV2[@]}" "${TRANSFORMER[@]}" "${DONATION[@]}" "${TRANSPOSED[@]}" "${SCORES[@]}";;
    synccheck) echo "${SMALL[@]:0:3}" "${NARROW[0]}" "${HUB[@]}" "${GAT[@]}" "${TRANSPOSED[@]}" \
      "${SORTED[@]}" "${FETCH[@]}" "${SCORES[@]}" "${PERMINV[@]:0:4}" "${TC[@]:0:3}" "${TC[@]:5:1}" "${GATV2[@]}" "${TRANSFORMER[@]}";;
  esac
}

printf '| tool | errors | exit code | seconds | tests |\n|---|---|---|---|---|\n' > "$SUMMARY"
status=0
if [ -z "$CS" ]; then
  echo "| all | - | - | - | compute-sanitizer not found (set COMPUTE_SANITIZER) |" >> "$SUMMARY"
  cat "$SUMMARY"; exit 1
fi
"$CS" --version > "$LOGDIR/sanitize_version.log" 2>&1
# gVisor machines refuse the device ("Device not supported"): say so once.
if ! "$CS" --tool memcheck --error-exitcode 1 python3 -c \
    'import torch; torch.ones(1, device="cuda").add_(1); torch.cuda.synchronize()' \
    > "$LOGDIR/sanitize_probe.log" 2>&1; then
  echo "| all | - | - | - | compute-sanitizer cannot run here: $(grep -m1 -iE 'error|not supported' \
    "$LOGDIR/sanitize_probe.log" | tr '|' '/') |" >> "$SUMMARY"
  cat "$SUMMARY"; exit 1
fi

for name in "${TOOLS[@]}"; do
  tool="${name%_large}"
  args=(--tool "$tool" --error-exitcode 1 --print-limit 50 --report-api-errors no)
  case "$tool" in racecheck|synccheck) args+=("${OURS[@]}");; esac
  [ "$tool" = racecheck ] && args+=(--racecheck-report all)
  log="$LOGDIR/sanitize_$name.log"
  read -r -a tests <<< "$(selection "$name")"
  start=$SECONDS
  timeout "$LIMIT" "$CS" "${args[@]}" python3 -m pytest -q -rs -p no:cacheprovider \
    -m "" "${tests[@]}" > "$log" 2>&1
  rc=$?
  secs=$((SECONDS - start))
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  hazards=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazard' "$log" | tail -1 | grep -oE '[0-9]+')
  [ -n "$hazards" ] && errors="${errors:-0} (${hazards} hazards)"
  [ $rc -eq 124 ] && errors="${errors:-?} (timed out after ${LIMIT}s)"
  # pytest's closing line, e.g. "12 passed, 3 skipped in 80.1s"
  passed=$(grep -E '^=* *[0-9]+ (passed|failed|skipped|deselected|error)' "$log" | tail -1 \
    | tr -d '=' | xargs)
  echo "| $name | ${errors:-?} | $rc | $secs | ${passed:-see $log} |" >> "$SUMMARY"
  [ $rc -ne 0 ] && status=1
done
cat "$SUMMARY"
exit $status
