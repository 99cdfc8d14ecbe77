#!/bin/sh
# deps.sh - installs the Debian packages agentkv builds against, when missing.
# Called by the Makefile; quiet when everything is present.
set -e
need=""
pkg-config --exists libpcre2-8 2>/dev/null || need="$need libpcre2-dev"
[ -f /usr/include/cjson/cJSON.h ] || need="$need libcjson-dev"
[ -f /usr/include/xxhash.h ] || need="$need libxxhash-dev"
[ -f /usr/include/sodium.h ] || need="$need libsodium-dev"
[ -f /usr/include/microhttpd.h ] || need="$need libmicrohttpd-dev"
# the Redis store backend (src/store/store_redis.c), and the server its tests start
[ -f /usr/include/hiredis/hiredis.h ] || need="$need libhiredis-dev"
command -v redis-server >/dev/null 2>&1 || need="$need redis-server"
command -v curl >/dev/null 2>&1 || need="$need curl"
# the server tests run the official openai npm client
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v python3 >/dev/null 2>&1 || need="$need python3"
# make fuzz (and the sanitizer build's float-cast-overflow check): clang, and
# libFuzzer's runtime, which is in compiler-rt (clang only recommends it);
# llvm-symbolizer turns sanitizer reports' addresses into file:line
if command -v clang >/dev/null 2>&1; then
    ls "$(clang -print-resource-dir)"/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || need="$need libclang-rt-dev"
else
    need="$need clang libclang-rt-dev"
fi
command -v llvm-symbolizer >/dev/null 2>&1 || need="$need llvm"
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
if [ -n "$need" ]; then
    echo "deps.sh: installing$need" >&2
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >&2
fi
# the console's browser test (tests/server/console_ui.mjs) drives Debian's
# headless chromium; it is the one package the build goes on without: that
# test then says SKIP
if ! command -v chromium >/dev/null 2>&1; then
    echo "deps.sh: installing chromium (for the console's browser test)" >&2
    { [ -n "$need" ] || $SUDO apt-get update -qq >&2; } &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >&2 ||
        echo "deps.sh: chromium could not be installed: the console's browser test will be skipped" >&2
fi
exit 0
