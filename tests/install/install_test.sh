#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds a user project against it with
# find_package(ps CONFIG), runs it, and runs the installed binaries.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
cmake -S "$source_dir/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
cmake --build "$work/consumer" > "$work/build.log"
"$work/consumer/consumer" | tee "$work/run.log"
grep -q "consumer: value=0 rank=0 workers=1" "$work/run.log"
"$work/prefix/bin/ps-scheduler" --version | grep -q "version"
"$work/prefix/bin/ps-server" --version | grep -q "version"
python3 "$work/prefix/bin/launch.py" --help > /dev/null
echo "install test: ok"
