#!/usr/bin/env bash
# test_pdl_rule.sh — lint of the programmatic-dependent-launch rule
# (cuda/launch.cuh): every __global__ function in cuda/*.cu and cuda/*.cuh
# begins with  lucid_pdl_wait(); lucid_pdl_launch_dependents();  and no
# <<<>>> launch remains (kernels go through lucid_launch). The checker is
# spec/c/pdl_rule.lua; this script runs it over the tree and over two
# fixtures (spec/fixtures/pdl/): good.cu must pass, bad.cu must fail at
# exactly its lines marked "// BAD" (the negative control).
#
# make installs it as build/tests/test_pdl_rule, so spec/run_tests.sh counts
# its lines like those of the C tests (spec/c/test.h):
#   ok pdl_rule <file> (K kernels, L lucid_launch)
#   not ok pdl_rule <file>:<line>: <what is wrong>
# It can also be run directly: spec/c/test_pdl_rule.sh
set -u
cd "$(dirname "$0")/../.." || exit 1   # spec/c/ or build/tests/ -> repository root
checker=spec/c/pdl_rule.lua
fix=spec/fixtures/pdl
failed=0

if ! command -v luajit >/dev/null 2>&1; then
    echo "not ok pdl_rule: luajit not found (the checker is $checker)"
    exit 1
fi

# 1. the tree
out=$(luajit "$checker" cuda/*.cu cuda/*.cuh)
rc=$?
printf '%s\n' "$out"
[ $rc -eq 0 ] || failed=1
# kernels seen: those of the passing files plus the failing ones (guards
# against a checker that silently matches nothing)
nk=$(printf '%s\n' "$out" | awk '/^ok pdl_rule .* kernels/ { sub(/.*\(/, ""); n += $1 }
                                 /^not ok pdl_rule .* __global__ / { n++ }
                                 END { print n + 0 }')
if [ "$nk" -gt 0 ]; then
    echo "ok pdl_rule the checker saw $nk kernels in cuda/"
else
    echo "not ok pdl_rule the checker saw no kernel in cuda/ (pattern broken?)"
    failed=1
fi

# 2. positive control: a fixture with every accepted form passes
out=$(luajit "$checker" "$fix/good.cu")
rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^ok pdl_rule .*good.cu (4 kernels, 5 lucid_launch)$'; then
    echo "ok pdl_rule control: $fix/good.cu passes (4 kernels, 5 lucid_launch)"
else
    echo "not ok pdl_rule control: $fix/good.cu should pass with 4 kernels, 5 lucid_launch (status $rc)"
    printf '%s\n' "$out" | sed 's/^/#   /'
    failed=1
fi

# 3. negative control: a fixture with violations fails, naming each line
out=$(luajit "$checker" "$fix/bad.cu")
rc=$?
want=$(grep -n '// BAD' "$fix/bad.cu" | cut -d: -f1 | paste -sd' ')
got=$(printf '%s\n' "$out" | sed -n "s|^not ok pdl_rule $fix/bad.cu:\([0-9]*\):.*|\1|p" | paste -sd' ')
if [ $rc -eq 1 ] && [ -n "$want" ] && [ "$got" = "$want" ]; then
    echo "ok pdl_rule control: $fix/bad.cu fails at exactly its marked lines ($want)"
else
    echo "not ok pdl_rule control: $fix/bad.cu should fail (status 1) at lines '$want'; status $rc, lines '$got'"
    failed=1
fi

exit $failed
