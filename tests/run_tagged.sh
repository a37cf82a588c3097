#!/usr/bin/env bash
# Runs the test cases of one Catch2 binary that carry a tag; passes when the binary has none.
bin=$1; tag=$2
if [ -z "$("$bin" "$tag" --list-test-names-only 2>/dev/null | grep -v '^$' | grep -v 'matching test cases')" ]; then
  echo "no $tag test cases in $(basename "$bin")"; exit 0
fi
exec "$bin" "$tag"
