#!/usr/bin/env bash
# bench/ab.sh on the CPU path with the embedded demo model: two variants alternated over two rounds
# (one with an extra bench argument) and one whose binary does not exist. The good runs write their
# JSON and logs, the summary pairs them round by round, the missing binary fails its runs and the
# exit status; bad command lines are refused with status 2 before anything runs.
# shellcheck source=tests/scripts/lib/suite.sh
. "$(dirname "$0")/lib/suite.sh"
T=$BUILD/tandem
[ -x "$T" ] || fail "$T not built"

bench/ab.sh -d cpu -p 16 -n 4 -t 1 -r 2 -o "$tmp/ab" A="$T" B="$T,--zipf,0" C="$tmp/none/tandem" > "$tmp/out.txt" 2>&1
rc=$?
[ $rc -eq 1 ] || { cat "$tmp/out.txt"; fail "status $rc with a missing binary (want 1)"; }
for v in A B; do
    for r in 1 2; do
        [ -s "$tmp/ab/${v}_g12_r$r.json" ] || fail "no JSON for $v round $r"
        grep -q "^command: $T bench --device cpu --threads 1 --prompt 16 --gen 4 --gpu-mem 12" "$tmp/ab/${v}_g12_r$r.log" ||
            fail "$v round $r: command line not in its log"
    done
    grep -q "ab: $v 12 GiB round 2: done" "$tmp/out.txt" || fail "no progress line for $v"
done
grep -q -- "--zipf 0 --json" "$tmp/ab/B_g12_r1.log" || fail "B's extra argument not passed"
[ ! -e "$tmp/ab/C_g12_r1.json" ] || fail "C wrote a JSON"
grep -q "ab: C 12 GiB round 1: FAILED" "$tmp/out.txt" || fail "C's failure not reported"
s=$tmp/ab/summary.txt
[ "$(grep -c '^[AB] ' "$s")" -eq 4 ] || { cat "$s"; fail "want 4 run lines for A and B"; }
grep -q "^12 GiB A  *decode mean [0-9.]* ([0-9.]*-[0-9.]*, 2 runs)$" "$s" || { cat "$s"; fail "A's mean line"; }
grep -q "^12 GiB B  *decode mean .*, 2 runs), against A [-+][0-9.]* tok/s per round (ahead in [0-2] of 2)$" "$s" ||
    { cat "$s"; fail "B's line against A"; }
grep -q "^12 GiB C  *no runs$" "$s" || { cat "$s"; fail "C's line"; }

for bad in "" "A" "A=$T A=$T" "-r 0 A=$T" "=x" "A="; do
    # shellcheck disable=SC2086 # each case is a word list
    bench/ab.sh -d cpu -o "$tmp/bad" $bad > "$tmp/bad.txt" 2>&1
    rc=$?
    [ $rc -eq 2 ] || fail "'$bad': status $rc (want 2)"
    [ ! -e "$tmp/bad/summary.txt" ] || fail "'$bad' ran"
done
echo "ab_bench: ok"
