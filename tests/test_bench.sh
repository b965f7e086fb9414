#!/bin/sh
# The benchmark runs end to end and writes its files. It asserts nothing
# about time: these machines are noisy, and speed is the bench's to report.
set -eu
BENCH=$1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BENCH" --iterations 3 --throughput-seconds 0.3 --throughput-rounds 1 --out "$OUT" >"$OUT/stdout"
grep -q "print(1)" "$OUT/stdout"
grep -q "throughput" "$OUT/summary.txt"
grep -q "x floor" "$OUT/summary.txt"
# 3 iterations x 7 snippets for pysbx and for the floor at least
[ "$(grep -c '^pysbx,' "$OUT/samples.csv")" -eq 21 ]
[ "$(grep -c '^floor,' "$OUT/samples.csv")" -eq 21 ]
! grep -q ',0$' "$OUT/samples.csv"
# one round: the floor with 1 and one loop per core, pysbx with 1, 2, 8 callers,
# each with its CPU per run
[ "$(grep -c ',floor,' "$OUT/throughput.csv")" -eq 2 ]
[ "$(grep -c ',pysbx,' "$OUT/throughput.csv")" -eq 3 ]
! grep -qE ',0\.0+$' "$OUT/throughput.csv"
# The host tools' round trip (bench/tools.py), one short run per transport.
/usr/bin/python3 "$(dirname "$0")/../bench/tools.py" "$(dirname "$BENCH")/pysbx" --runs 1 \
    --calls 20 --out "$OUT" >/dev/null
grep -q "^tool call, socket" "$OUT/tools.txt"
grep -q "^tool call, http" "$OUT/tools.txt"
# Hibernation through the server (bench/hibernate.py), one round.
/usr/bin/python3 "$(dirname "$0")/../bench/hibernate.py" "$(dirname "$BENCH")/pysbx" --rounds 1 \
    --out "$OUT" >/dev/null
grep -q "^first cell after, 100 MB" "$OUT/hibernate.txt"
echo "bench smoke test passed"
