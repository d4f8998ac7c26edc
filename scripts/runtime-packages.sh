#!/usr/bin/env bash
# Prints the packages (dpkg's names, one a line, sorted) that own the shared
# libraries the given binaries load: what a runtime image built from them must
# install (deploy/Dockerfile, deploy/Dockerfile.cuda). Libraries that no
# package owns (a PyTorch wheel's, in site-packages) are left out: the image
# must carry them otherwise. Fails naming a library that does not resolve.
#
#   scripts/runtime-packages.sh build/bin/stage_server build/bin/coordinator build/bin/conveyor
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
libs=$(ldd "$@" | awk '/ => not found/ {print "NOTFOUND " $1} / => \// {print $3}' | sort -u)
if grep -q '^NOTFOUND' <<< "$libs"; then
  echo "runtime-packages: libraries that do not resolve: $(grep '^NOTFOUND' <<< "$libs" | cut -d' ' -f2 | tr '\n' ' ')" >&2
  exit 1
fi
# dpkg knows a file by the path its package installed; with merged /usr that
# may be /lib/... or /usr/lib/..., whichever ldd did not print. One line per
# library and name: "LIBRARY PATH".
mapfile -t libs_arr <<< "$libs"
mapfile -t reals < <(readlink -f "${libs_arr[@]}")
names=$(for i in "${!libs_arr[@]}"; do
  for p in "${libs_arr[$i]}" "${reals[$i]}"; do
    echo "${libs_arr[$i]} $p"
    case "$p" in /usr/*) echo "${libs_arr[$i]} ${p#/usr}" ;; *) echo "${libs_arr[$i]} /usr$p" ;; esac
  done
done | sort -u)
owners=$(dpkg -S $(cut -d' ' -f2 <<< "$names") 2>/dev/null || true)
# A library none of whose names a package owns.
awk 'NR == FNR { split($0, a, ": "); owned[a[2]] = 1; next }
     { lib = $1; if (owned[$2]) found[lib] = 1; seen[lib] = 1 }
     END { for (l in seen) if (!found[l]) print "runtime-packages: no package owns " l "; the image must carry it otherwise" }' \
  <(echo "$owners") <(echo "$names") >&2
cut -d: -f1 <<< "$owners" | tr ', ' '\n\n' | sed '/^$/d' | sort -u
