#!/usr/bin/env bash
# make demo: runs the wordcount example (two Rust operators) on its bundled
# input with bin/streamd, shows where the output is and the top 10 words, and
# checks the output against the expected file. `make demo` builds bin/streamd
# and the wasm modules first.
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMD=${STREAMD:-bin/streamd}
JOB=examples/wasm/wordcount/wordcount.yaml
DIR=$(dirname "$JOB")
OUT=$DIR/out

for f in "$STREAMD" "$DIR/split.wasm" "$DIR/count.wasm"; do
	if [[ ! -e $f ]]; then
		echo "demo: $f is missing; run 'make demo' (it builds bin/streamd and the wasm modules)" >&2
		exit 1
	fi
done

echo "== streamd run $JOB"
"$STREAMD" run "$JOB"

echo
echo "== output: $(cd "$OUT" && pwd)/ ($(ls "$OUT" | paste -sd " " -))"
echo "== top 10 words (word count):"
# Each output line is "word count".
cat "$OUT"/part-* | sort -k2,2nr -k1,1 | head -n 10 | sed 's/^/   /'

echo
if diff <(cat "$OUT"/part-* | LC_ALL=C sort) <(LC_ALL=C sort "$DIR/expected.txt") >/dev/null; then
	echo "OK: output matches $DIR/expected.txt ($(cat "$OUT"/part-* | wc -l | tr -d ' ') words)"
else
	echo "FAIL: output differs from $DIR/expected.txt:" >&2
	diff <(cat "$OUT"/part-* | LC_ALL=C sort) <(LC_ALL=C sort "$DIR/expected.txt") | head -n 20 >&2
	exit 1
fi
