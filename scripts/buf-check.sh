#!/usr/bin/env bash
# Contract hygiene for proto/, with buf (installed by scripts/install-buf.sh):
#
# 1. `buf lint` with the checked-in buf.yaml (STANDARD minus SERVICE_SUFFIX).
# 2. `buf breaking` of the working tree against proto/ of the previous commit.
#    The rule: once a package version (taskmesh.v1) is released, its wire and
#    JSON shapes never change in a way that breaks an existing client (buf's
#    WIRE_JSON category, configured in buf.yaml): no field renumbered, retyped
#    or removed without reserving it, no enum value removed, and so on. A
#    change that must break goes into a new package version (taskmesh.v2,
#    in proto/taskmesh/v2/), which WIRE_JSON accepts, so the gate fails
#    "unless the package version changes".
#    The baseline is HEAD~1, which in CI (a fresh clone of main) is the
#    previous commit on main. Set TASKMESH_BUF_AGAINST to another git ref to
#    compare with that instead (e.g. `main` from a feature branch). A missing
#    baseline (first commit, shallow clone, no proto/ yet) is reported and
#    skipped, never faked as a pass.
# 3. Two self-checks that the gate bites: a field retyped in place must fail,
#    the same change under a new package version must pass.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
buf="$(bash scripts/install-buf.sh)"
passed=0
failed=0
pass() { echo "PASS buf $1"; passed=$((passed + 1)); }
fail() { echo "FAIL buf $1"; failed=$((failed + 1)); }

if "$buf" lint; then pass "lint"; else fail "lint"; fi

against="${TASKMESH_BUF_AGAINST:-HEAD~1}"
if ! commit="$(git rev-parse --verify --quiet "$against^{commit}")"; then
  echo "SKIP buf breaking: $against does not exist here (first commit or shallow clone)"
elif ! git cat-file -e "$commit:proto" 2>/dev/null; then
  echo "SKIP buf breaking: $against ($(git rev-parse --short "$commit")) has no proto/"
elif "$buf" breaking --against ".git#ref=$commit,subdir=proto"; then
  pass "breaking: no wire/JSON break against $against ($(git rev-parse --short "$commit"))"
else
  fail "breaking: proto/ breaks clients of $against ($(git rev-parse --short "$commit")); add a new package version instead"
fi

# The self-checks work on copies, never on proto/ itself: a baseline copy and
# a changed copy of today's contract.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/base" "$tmp/new"
cp -r proto "$tmp/base/"
cp -r proto buf.yaml "$tmp/new/"
target="$tmp/new/proto/taskmesh/v1/dispatcher.proto"
sed -i 's/^  uint32 capacity = 4;$/  string capacity = 4;/' "$target"
if cmp -s "$target" "$tmp/base/proto/taskmesh/v1/dispatcher.proto"; then
  fail "self-check: could not plant a breaking change (WorkerRegistration.capacity moved?)"
elif (cd "$tmp/new" && "$buf" breaking --against "$tmp/base/proto" >/dev/null); then
  fail "self-check: retyping WorkerRegistration.capacity in taskmesh.v1 was not caught"
else
  pass "self-check: retyping a field in taskmesh.v1 is refused"
fi
mv "$tmp/new/proto/taskmesh/v1" "$tmp/new/proto/taskmesh/v2"
sed -i 's/taskmesh\.v1/taskmesh.v2/g; s#taskmesh/v1/#taskmesh/v2/#g' "$tmp"/new/proto/taskmesh/v2/*.proto
if (cd "$tmp/new" && "$buf" lint && "$buf" breaking --against "$tmp/base/proto"); then
  pass "self-check: the same change as a new package taskmesh.v2 is accepted"
else
  fail "self-check: a new package version taskmesh.v2 was refused"
fi

echo "buf: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
