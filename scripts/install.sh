#!/usr/bin/env bash
# `make install`: copies a built tree into PREFIX (staged under DESTDIR when
# set) with cmake --install (cmake/install.cmake lists what goes where).
# Usage: scripts/install.sh BUILD_DIR PREFIX [DESTDIR]
set -euo pipefail
build=${1:-} prefix=${2:-} destdir=${3:-}
fail() { echo "make install: $*" >&2; exit 2; }
[ -n "$prefix" ] || fail "PREFIX is empty (e.g. make install PREFIX=/usr/local)"
case "$prefix" in /*) ;; *) fail "PREFIX must be an absolute path, not '$prefix'" ;; esac
case "$destdir" in "" | /*) ;; *) fail "DESTDIR must be an absolute path, not '$destdir'" ;; esac
[ -f "$build/cmake_install.cmake" ] || fail "no build in $build (make app BUILD=$build first)"
# The nearest folder that exists must be one this user may write into.
target="$destdir$prefix"
dir="$target"
while [ ! -e "$dir" ]; do dir=$(dirname "$dir"); done
[ -d "$dir" ] || fail "$dir is not a folder (PREFIX=$prefix)"
[ -w "$dir" ] || fail "$dir is not writable by $(id -un): sudo make install, or a PREFIX of yours (PREFIX=\$HOME/.local)"
DESTDIR="$destdir" cmake --install "$build" --prefix "$prefix"
[ -z "$destdir" ] || exit 0
case "$prefix" in
  /usr | /usr/local) users="sudo systemd-sysusers" enable="sudo systemctl daemon-reload && sudo systemctl enable --now spillway" ;;
  # systemd and systemd-sysusers look only under /usr/local/lib and /usr/lib.
  *) users="sudo systemd-sysusers $prefix/lib/sysusers.d/spillway.conf"
     enable="sudo systemctl link $prefix/lib/systemd/system/spillway.service && sudo systemctl enable --now spillway" ;;
esac
cat <<NEXT

Installed into $prefix. To run it as a service (README "Install as a service"):
  $users    # the user spillway
  sudo mkdir -p /etc/spillway /var/lib/spillway/models   # and put GGUF models there
  sudo $prefix/bin/spillway init --models /var/lib/spillway/models -o /etc/spillway/spillway.toml
  $enable
NEXT
