#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds a user project against it with
# find_package(ps CONFIG) (and nothing else: no C++ standard of its own), runs it, runs the
# README's KVStore example as a job of the installed launcher and binaries, and checks that
# every tool README.md's table lists is installed and the shared libraries carry versions.
set -euo pipefail
build_dir=$1
source_dir=$2
repo=$(cd "$source_dir/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "install test: FAILED: $*" >&2
  exit 1
}

cmake --install "$build_dir" --prefix "$work/prefix" > "$work/install.log"
prefix=$work/prefix

# The consumer project, plus the README's example exactly as README.md shows it.
cp -r "$source_dir/consumer" "$work/src"
python3 - "$repo/README.md" "$work/src/readme_example.cc" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text[text.index("## The KVStore API"):]
match = re.search(r"```cpp\n(.*?)```", section, re.S)
if not match:
    sys.exit("README.md: no ```cpp block under '## The KVStore API'")
open(sys.argv[2], "w", encoding="utf-8").write(match.group(1))
PY
cmake -S "$work/src" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" ||
  { cat "$work/configure.log"; fail "configuring the consumer"; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; fail "building the consumer (README example included)"; }

"$work/consumer/consumer" | tee "$work/run.log"
grep -q "consumer: value=0 rank=0 workers=1" "$work/run.log"

# The README example: without a cluster it fails with its one-line error...
if env -u DMLC_ROLE -u DMLC_PS_ROOT_URI -u DMLC_PS_ROOT_PORT "$work/consumer/readme_example" \
  > "$work/alone.log" 2>&1; then
  fail "the README example ran without a cluster"
fi
grep -q "^error: DMLC_ROLE is not set" "$work/alone.log" ||
  { cat "$work/alone.log"; fail "the README example's error"; }
# ...and as a job of the installed launch.py, ps-scheduler and ps-server it computes one SGD
# step of the two workers' summed gradients. PS_VERBOSE=1 makes the library log in a program
# that never set up glog: no "Logging before InitGoogleLogging()" banner may appear.
env -u PS_BIN_DIR PS_VERBOSE=1 timeout 120 python3 "$prefix/bin/launch.py" -n 2 -s 1 \
  "$work/consumer/readme_example" > "$work/job.log" 2>&1 ||
  { cat "$work/job.log"; fail "the README example as a job of the installed launcher"; }
for rank in 0 1; do
  grep -q "^\[worker $rank\] worker $rank of 2: w\[0\] = -0.2$" "$work/job.log" ||
    { cat "$work/job.log"; fail "worker $rank's result"; }
done
grep -q "registered as worker" "$work/job.log" || { cat "$work/job.log"; fail "no PS_VERBOSE log"; }
if grep -q "Logging before InitGoogleLogging" "$work/job.log"; then
  cat "$work/job.log"
  fail "a worker printed glog's 'Logging before InitGoogleLogging()' banner"
fi

"$prefix/bin/ps-scheduler" --version | grep -q "version"
"$prefix/bin/ps-server" --version | grep -q "version"
python3 "$prefix/bin/launch.py" --help > /dev/null

# Every tool in README.md's "What you get" table is installed.
tools=$(python3 - "$repo/README.md" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
table = text[text.index("## What you get"):]
table = table[:table.index("\n\n", table.index("|"))]
for line in table.splitlines():
    m = re.match(r"^\|[^|]*\| `([^`]+)` \|", line)
    if m:
        print(m.group(1).split("/")[-1])
PY
)
[[ -n $tools ]] || fail "no tools found in README.md's table"
for tool in $tools; do
  [[ -x $prefix/bin/$tool ]] || fail "README.md lists $tool, but the install has no bin/$tool"
done
# README: "The ps-* programs take --help and --version".
for program in "$prefix"/bin/ps-*; do
  name=${program##*/}
  [[ $name == *.py ]] && continue
  "$program" --version | grep -q "^$name version [0-9]" || fail "$name --version"
  "$program" --help > /dev/null || fail "$name --help"
done

# The documentation --help points at, and every setting its environment-only list names is
# in README.md's table of settings.
[[ -f $prefix/share/doc/ps/README.md && -f $prefix/share/doc/ps/docs/kvstore.md ]] ||
  fail "README.md and docs/ are not installed under share/doc/ps (ps-server --help names them)"
for variable in $("$prefix/bin/ps-server" --help | sed -n '/^Settings with no flag/,$p' |
                  grep -o '[A-Z][A-Z_]*_[A-Z_]*'); do
  grep -q "^| \`$variable\` |" "$repo/README.md" ||
    fail "ps-server --help names $variable, which README.md's table of settings lacks"
done

# Every shared library is versioned alike: libX.so -> libX.so.MAJOR -> libX.so.MAJOR.MINOR.PATCH.
for lib in ps ps_scheduler ps_kvstore; do
  found=$(find "$prefix" -name "lib$lib.so.[0-9]*.[0-9]*.[0-9]*" | head -1)
  [[ -n $found ]] || fail "lib$lib.so has no VERSION suffix in the install"
  soname=$(objdump -p "$found" | awk '/SONAME/ {print $2}')
  [[ $soname == lib$lib.so.[0-9]* ]] || fail "lib$lib: SONAME '$soname' has no major version"
  [[ -e $(dirname "$found")/$soname ]] || fail "lib$lib: no $soname link in the install"
done
echo "install test: ok"
