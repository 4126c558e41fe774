#!/usr/bin/env bash
# Build llama.cpp's own llama-server and llama-bench from the llama.cpp that the pinned
# llama-cpp-python vendors (the yardsticks of the benchmarks, and the real server the remote
# tests chat with), once, into .cache/llama.cpp/ (ignored by git). Prints the server's path.
# A few minutes on two cores; later runs find it built.
# Usage: scripts/llama_server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | cut -d= -f3)
root=.cache/llama.cpp
bin="$root/build/bin/llama-server"
# A build of this version that another checkout on this machine made (a fresh clone, as CI's) is
# used where it is, through a link, when it runs; else it is built here as below.
shared=${LOCALFAB_LLAMA_CPP_SHARED:-$HOME/.cache/localfab-dev/llama.cpp-$version}
if [ ! -e "$root" ] && [ -x "$shared/build/bin/llama-server" ] &&
    "$shared/build/bin/llama-server" --version >/dev/null 2>&1; then
    mkdir -p .cache && ln -s "$shared" "$root"
fi
publish() {  # offer this checkout's build to the others (never replacing one that is there)
    if [ ! -L "$root" ] && [ ! -e "$shared" ] && mkdir -p "$(dirname "$shared")" 2>/dev/null; then
        ln -s "$PWD/$root" "$shared" 2>/dev/null || true
    fi
}
mkdir -p "$root"
# The source (kept: scripts/conformance.py runs the server tests it carries).
if [ "$(cat "$root/src/.version" 2>/dev/null)" != "$version" ]; then
    python=.venv/bin/python
    [ -x "$python" ] || python=python3
    [ -f "$root/llama_cpp_python-$version.tar.gz" ] ||
        "$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$root" >&2
    rm -rf "$root/src" && mkdir -p "$root/src"
    tar xzf "$root/llama_cpp_python-$version.tar.gz" -C "$root/src" --strip-components=1
    echo "$version" >"$root/src/.version"
fi
if [ -x "$bin" ] && [ "$(cat "$root/version" 2>/dev/null)" = "$version" ]; then
    publish
    echo "$PWD/$bin"
    exit 0
fi
echo "scripts/llama_server.sh: building llama-server of llama-cpp-python $version (a few minutes)" >&2
# Without AMX kernels, as scripts/test builds llama-cpp-python (they crash this llama.cpp).
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "$(uname -m)" = x86_64 ] && echo | ${CC:-cc} $no_amx -E - >/dev/null 2>&1; then
    export CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx"
fi
cmake -S "$root/src/vendor/llama.cpp" -B "$root/build" -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
    -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$root/build" --target llama-server llama-bench -j "$(nproc)" >&2
echo "$version" >"$root/version"
publish
echo "$PWD/$bin"
