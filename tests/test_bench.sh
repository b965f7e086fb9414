#!/bin/sh
# The benchmark runs end to end and writes its files. It asserts nothing
# about time: these machines are noisy, and speed is the bench's to report.
set -eu
BENCH=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BENCH" --iterations 3 --throughput-seconds 0.3 --out "$OUT" >"$OUT/stdout"
grep -q "print(1)" "$OUT/stdout"
grep -q "throughput" "$OUT/summary.txt"
# header plus 3 iterations x 6 snippets for pysbx at least
[ "$(grep -c '^pysbx,' "$OUT/samples.csv")" -eq 18 ]
! grep -q ',0$' "$OUT/samples.csv"
echo "bench smoke test passed"
