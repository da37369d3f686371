#!/usr/bin/env bash
# Installs what the build needs beyond cargo, from Debian's packages, when it
# is missing: protoc (protobuf-compiler), which the crate
# prost-protovalidate-types runs at build time to compile buf/validate.
# Our own proto/ is compiled by protox and needs no protoc.
set -euo pipefail

if ! command -v protoc >/dev/null 2>&1; then
  echo "protoc: missing, installing Debian's protobuf-compiler"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler >/dev/null
fi
protoc --version >/dev/null
