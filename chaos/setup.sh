#!/usr/bin/env bash
# What the chaos suite needs beyond the virtualenv: Debian's faketime (libfaketime).
# Idempotent; fails loudly when it cannot install.
set -euo pipefail
lib=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
if [ -e "$lib" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chaos: libfaketime is missing and installing it needs root: apt-get install -y faketime" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y faketime || { apt-get update && apt-get install -y faketime; }
if [ ! -e "$lib" ]; then
    echo "chaos: faketime installed but $lib is absent" >&2
    exit 1
fi
