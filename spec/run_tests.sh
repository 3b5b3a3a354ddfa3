#!/usr/bin/env bash
# Runs every C unit test (build/tests/test_*) and the busted specs, then
# prints one summary line "N passed, N failed" over all of them (CI reads it).
#   spec/run_tests.sh cpu   busted without the specs tagged gpu (listed as skipped)
#   spec/run_tests.sh gpu   everything, the gpu-tagged specs included
# Logs of each suite go to build/test-logs/.
set -u
mode=${1:-cpu}
cd "$(dirname "$0")/.."
logs=build/test-logs
mkdir -p "$logs"
passed=0 failed=0 skipped=0

busted_args=(--lua=luajit -o TAP)
[ "$mode" = cpu ] && busted_args+=(--exclude-tags=gpu)
# busted runs in the background while the C test programs run (on the GPU
# machine the two halves take minutes each; CI reads the summary either way)
rm -f "$logs"/*.rc
( busted "${busted_args[@]}" >"$logs/busted.log" 2>&1; echo $? >"$logs/busted.rc" ) &
busted_pid=$!

# the C test programs run concurrently (one per CPU; each writes its own log
# and exit status), then are summarised in name order
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    while [ "$(jobs -rp | wc -l)" -ge $((jobs + 1)) ]; do wait -n; done
    ( "$t" >"$logs/$name.log" 2>&1; echo $? >"$logs/$name.rc" ) &
done
for p in $(jobs -rp); do [ "$p" = "$busted_pid" ] || wait "$p"; done
for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    rc=$(cat "$logs/$name.rc" 2>/dev/null || echo 1)
    p=$(grep -c '^ok ' "$logs/$name.log")
    f=$(grep -c '^not ok ' "$logs/$name.log")
    s=$(grep -c '^skip ' "$logs/$name.log")
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
        echo "not ok $name: exited with status $rc without a failing check" >>"$logs/$name.log"
    fi
    printf '%-28s %4d passed, %d failed, %d skipped\n' "c/$name" "$p" "$f" "$s"
    grep -E '^(not ok|skip) ' "$logs/$name.log" | sed 's/^/    /' | head -20
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
done

if [ "$mode" = cpu ]; then
    ngpu=$(busted --lua=luajit --tags=gpu --list 2>/dev/null | grep -c .)
    if [ "$ngpu" -gt 0 ]; then
        echo "busted: skipping $ngpu gpu-tagged specs (no GPU run; use make test-gpu on the GPU machine)"
        skipped=$((skipped + ngpu))
    fi
fi
wait "$busted_pid"
rc=$(cat "$logs/busted.rc" 2>/dev/null || echo 1)
p=$(grep -E '^ok [0-9]+ ' "$logs/busted.log" | grep -vc '# SKIP')
s=$(grep -E '^ok [0-9]+ ' "$logs/busted.log" | grep -c '# SKIP')
f=$(grep -cE '^not ok [0-9]+ ' "$logs/busted.log")
if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
    echo "busted exited with status $rc without a failing test" >>"$logs/busted.log"
fi
printf '%-28s %4d passed, %d failed, %d skipped\n' "busted" "$p" "$f" "$s"
if [ "$f" -gt 0 ]; then
    grep -A8 -E '^not ok [0-9]+ ' "$logs/busted.log" | sed 's/^/    /' | head -60
fi
passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))

echo "skipped: $skipped (each listed above or in $logs/)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
