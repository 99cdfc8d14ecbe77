#!/bin/sh
# manpage.sh BIN VERSION - prints agentkv(1), a troff man page made from the
# binary's own help: `BIN --help` for the synopsis and the list of commands,
# and `BIN COMMAND --help` for each command's flags, as written (no second
# copy of the flags to keep in step). Run by `make install` (scripts/lib.mk).
set -eu
bin=$1 version=$2

# Escapes help text for troff: backslashes, then lines that would read as
# requests (a leading '.' or '\''), then hyphens, which troff may otherwise
# print as typographic dashes.
esc() {
    sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/" -e 's/-/\\-/g'
}

help=$("$bin" --help)
commands=$(printf '%s\n' "$help" | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p')

cat <<EOF
.TH AGENTKV 1 "" "agentkv $version" "User Commands"
.SH NAME
agentkv \\- LLM inference engine, command line and OpenAI-compatible server with durable per-agent KV memory
.SH SYNOPSIS
.B agentkv
.I COMMAND
[\\fIflags\\fR]
.br
.B agentkv
\\-\\-version
.SH DESCRIPTION
agentkv runs GGUF models on the CPU. Each named agent's KV cache is a durable
memory: quantized, saved to a memory directory (or Redis) and restored
straight into attention, so that a later turn, or a later process, computes
only what the agent has not seen. \\fBagentkv serve\\fR is an OpenAI-compatible
HTTP server; the other commands run, inspect and benchmark models and caches.
.SH COMMANDS
.nf
EOF
printf '%s\n' "$help" | sed -n '/^commands:/,$p' | sed '1d' | esc
echo ".fi"
for c in $commands; do
    echo ".SS $c"
    echo ".nf"
    "$bin" "$c" --help 2>&1 | esc
    echo ".fi"
done
cat <<EOF
.SH EXIT STATUS
0 on success, 1 when a command fails, 2 for a usage error.
.SH LIBRARY
The engine is also a C library: \\fI<agentkv.h>\\fR, linked with
\\fBpkg-config \\-\\-cflags \\-\\-libs agentkv\\fR.
.SH SEE ALSO
The project's README.md and docs/ (docs/cli.md, docs/server.md, docs/library.md).
EOF
