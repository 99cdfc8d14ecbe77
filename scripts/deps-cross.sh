#!/bin/sh
# deps-cross.sh - what `make test-arm` needs beyond scripts/deps.sh: Debian's
# AArch64 cross compiler, qemu-user, and the arm64 builds of the libraries
# agentkv links (multiarch: dpkg's foreign architecture arm64). Called by the
# test-arm target only; the normal build never needs any of it. Quiet when
# everything is present.
set -e
need=""
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need="$need gcc-aarch64-linux-gnu"
command -v qemu-aarch64 >/dev/null 2>&1 || need="$need qemu-user"
# the arm64 libraries (and their headers, the same files as amd64's)
lib=/usr/lib/aarch64-linux-gnu
[ -e $lib/libpcre2-8.so ] || need="$need libpcre2-dev:arm64"
[ -e $lib/libcjson.so ] || need="$need libcjson-dev:arm64"
[ -e $lib/libxxhash.so ] || need="$need libxxhash-dev:arm64"
[ -e $lib/libsodium.so ] || need="$need libsodium-dev:arm64"
[ -e $lib/libmicrohttpd.so ] || need="$need libmicrohttpd-dev:arm64"
[ -e $lib/libhiredis.so ] || need="$need libhiredis-dev:arm64"
[ -z "$need" ] && exit 0
echo "deps-cross.sh: installing$need" >&2
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
case "$need" in
*:arm64*) dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64 ;;
esac
$SUDO apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need >&2
