#!/usr/bin/env bash
# The public API of each library crate, listed by .ci/public_api.py from
# rustdoc's JSON (nightly only), compared with the checked-in api/<crate>.txt.
#   .ci/api.sh          check: prints the diff and fails on a difference
#   .ci/api.sh --bless  rewrite api/*.txt after an intended API change
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/api}
status=0
for crate in s2mmu-stats s2mmu s2mmu-memory s2mmu-vm s2mmu-kvm s2mmu-el2 s2mmu-migrate s2mmu-arm64 s2mmu-arm64-migrate s2mmu-plot s2mmu-bench; do
  # The listing needs rustdoc's JSON only: no EL2 image is built or run,
  # so the nightly toolchain need not have the aarch64-unknown-none target.
  env -u S2MMU_REQUIRE_ARM64 cargo +nightly rustdoc -q -p "$crate" --lib --all-features -- \
    -Z unstable-options --output-format json
  json="$CARGO_TARGET_DIR/doc/${crate//-/_}.json"
  if [ "${1:-}" = "--bless" ]; then
    python3 .ci/public_api.py "$json" > "api/$crate.txt"
  elif ! python3 .ci/public_api.py "$json" | diff -u "api/$crate.txt" - ; then
    echo "public API of $crate differs from api/$crate.txt (above; - listed, + now)." >&2
    echo "If the change is intended: .ci/api.sh --bless, and a line in CHANGELOG.md." >&2
    status=1
  fi
done
exit $status
