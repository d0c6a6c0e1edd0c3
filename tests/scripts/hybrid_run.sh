#!/usr/bin/env bash
# `tandem run --hybrid-emulate`: the same greedy text as the CPU path at 0%,
# ~50% (with the demo profile) and 100% of the experts cached, with the
# adaptive policy and with the experts copied to huge-page memory; the stats
# line; the ledger's refusal and bad options.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
T="$BUILD/tandem"
[ -x "$T" ] || { echo "hybrid_run: $T is missing (run make)"; exit 1; }
M=models/demo/demo-Q4_K_M.gguf
[ -f "$M" ] || { echo "hybrid_run: $M missing"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() { timeout 120 "$T" run --device cpu -m "$M" -p "Once upon a time" -n 16 --temp 0 --ctx 256 "$@"; }
run >"$tmp/ref.txt" 2>/dev/null
fail=0
for opts in "--cache-experts 0" "--cache-experts 96 --profile profiles/demo.profile.json" "--cache-experts 192" \
            "--cache-experts 40 --policy adaptive --threads 2" "--gpu-mem 64M" "--cache-experts 0 --expert-memory copy"; do
    # shellcheck disable=SC2086
    run --hybrid-emulate $opts --stats >"$tmp/out.txt" 2>"$tmp/err.txt"
    if ! cmp -s "$tmp/ref.txt" "$tmp/out.txt"; then echo "FAIL text differs: $opts"; fail=1; fi
    if ! grep -q "^hybrid (emulated): .* hit rate" "$tmp/err.txt"; then echo "FAIL no stats line: $opts"; fail=1; fi
done
grep -q "hit rate 100.0%" <(run --hybrid-emulate --cache-experts 192 --stats 2>&1 >/dev/null) ||
    { echo "FAIL 192 slots is not 100%"; fail=1; }
# adaptation swaps experts in (slots split per layer without a profile) and
# --profile-save writes what the run routed, which --profile then reads
run --hybrid-emulate --cache-experts 40 --policy adaptive --adapt-every 2 --adapt-swaps 4 --adapt-decay 0.9 \
    --profile-save "$tmp/learned.json" --stats >"$tmp/out.txt" 2>"$tmp/err.txt"
cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL adaptive text differs"; fail=1; }
grep -Eq "swaps [1-9]" "$tmp/err.txt" || { echo "FAIL adaptive made no swap: $(cat "$tmp/err.txt")"; fail=1; }
grep -q "tokens written to" "$tmp/err.txt" || { echo "FAIL --profile-save said nothing"; fail=1; }
run --hybrid-emulate --cache-experts 96 --profile "$tmp/learned.json" >"$tmp/out.txt" 2>/dev/null ||
    { echo "FAIL the saved profile is not readable"; fail=1; }
cmp -s "$tmp/ref.txt" "$tmp/out.txt" || { echo "FAIL text differs with the saved profile"; fail=1; }
for small in 1M 0.001; do # a bare number is GiB: 0.001 GiB is 1 MiB
    if run --hybrid-emulate --gpu-mem $small >/dev/null 2>"$tmp/err.txt"; then echo "FAIL $small accepted"; fail=1; fi
    grep -q "needed before any expert slot" "$tmp/err.txt" || { echo "FAIL refusal message: $(cat "$tmp/err.txt")"; fail=1; }
done
grep -q "gpu-mem 0.00 GiB (1073741 bytes)" "$tmp/err.txt" || { echo "FAIL 0.001 not read as GiB: $(cat "$tmp/err.txt")"; fail=1; }
for bad in "--hybrid-emulate" "--cache-experts 5" "--hybrid-emulate --cache-experts x" \
           "--hybrid-emulate --gpu-mem 12Q" "--hybrid-emulate --cache-experts 4 --policy nope" \
           "--hybrid-emulate --cache-experts 4 --adapt-decay 2" "--profile-save /nonexistent/dir/p.json --hybrid-emulate --cache-experts 4" \
           "--expert-memory huge" "--hybrid-emulate --cache-experts 4 --stream-min x" \
           "--hybrid-emulate --cache-experts 4 --stream-min -2" "--hybrid-emulate --gpu-mem 0"; do
    # shellcheck disable=SC2086
    if run $bad >/dev/null 2>&1; then echo "FAIL accepted: $bad"; fail=1; fi
done
# serve takes the same group of options (checked before anything loads)
if timeout 20 "$T" serve --device cpu --cache-experts 4 >/dev/null 2>"$tmp/err.txt"; then echo "FAIL serve accepted"; fail=1; fi
grep -q "need the GPU" "$tmp/err.txt" || { echo "FAIL serve message: $(cat "$tmp/err.txt")"; fail=1; }
if timeout 20 "$T" serve --threads 0 >/dev/null 2>&1; then echo "FAIL serve --threads 0 accepted"; fail=1; fi
[ $fail = 0 ] && echo "hybrid_run: ok"
exit $fail
