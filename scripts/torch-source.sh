#!/usr/bin/env bash
# Prints where LibTorch comes from: "pip" (a PyTorch wheel in python3) or
# "debian" (libtorch-dev). CONVEYOR_TORCH overrides.
if [ -n "${CONVEYOR_TORCH:-}" ]; then echo "$CONVEYOR_TORCH"; exit 0; fi
if ! apt-cache show libtorch-dev >/dev/null 2>&1 && \
   python3 -c 'import torch' >/dev/null 2>&1; then
  echo pip
elif dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed"; then
  echo debian
elif python3 -c 'import torch' >/dev/null 2>&1; then
  echo pip
else
  echo debian
fi
