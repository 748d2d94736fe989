#!/bin/bash
# s14-18 req-3 (issue 18): the MXFP4 tensor-core experts with form 2 (8 warps, K halves split) beside forms 1 and 0:
# float64 checks, bit-exact invariance per form, model-level hook; timing of every form vs the CUDA-core path.
set -u
cd "$DI_SOURCE_DIR"
s=$SECONDS
timeout 75 "$BIN/test_cuda_mx_tc" --time > "$LOG/mx_tc.log" 2>&1; rc=$?
echo "---- summary: test_cuda_mx_tc --time rc $rc ($((SECONDS - s)) s)"
grep -hE "FAIL|passed, .* failed|forms 0, 2" "$LOG/mx_tc.log" | cut -c1-160 | head -8
grep -E "^time mx" "$LOG/mx_tc.log" | sed 's/time mx experts //; s/ experts touched//' | awk '{print "E",$2,"T",$5,"cuda-core",$10,"form1",$13,"form0",$25,"form2",$29,"roof",$33}'
