#!/usr/bin/env bash
# Makes a certificate authority and certificates signed by it for Conveyor's
# mutual TLS (docs/security.md walks through the same commands).
#
#   scripts/make-certs.sh DIR                    # DIR/ca.key, DIR/ca.crt (an existing CA is kept)
#   scripts/make-certs.sh DIR NAME [HOST ...]    # also DIR/NAME.key, DIR/NAME.crt, signed by that CA
#
# Each HOST (a DNS name or an IP address) becomes a subjectAltName: a server's
# certificate must name every host its clients dial. A certificate serves both
# ends of a connection (serverAuth and clientAuth), as stage servers and the
# coordinator both serve and call; one for the CLI alone needs no HOST.
# DAYS (default 365) sets the validity. Keys are EC P-256, readable by the
# owner only.
set -euo pipefail
if [ $# -lt 1 ]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
dir=$1
name=${2:-}
shift $(($# < 2 ? $# : 2))
days=${DAYS:-365}
mkdir -p "$dir"
umask 077

if [ ! -s "$dir/ca.crt" ] || [ ! -s "$dir/ca.key" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=conveyor-ca" -days "$days" -out "$dir/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi
[ -z "$name" ] && exit 0

sans=""
for h in "$@"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then sans+="${sans:+,}IP:$h"; else sans+="${sans:+,}DNS:$h"; fi
done
ext=$(mktemp "$dir/.ext.XXXXXX")
trap 'rm -f "$ext" "$dir/$name.csr"' EXIT
{
  echo "basicConstraints=critical,CA:FALSE"
  echo "keyUsage=critical,digitalSignature,keyEncipherment"
  echo "extendedKeyUsage=serverAuth,clientAuth"
  if [ -n "$sans" ]; then echo "subjectAltName=$sans"; fi
} >"$ext"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key"
openssl req -new -key "$dir/$name.key" -subj "/CN=$name" -out "$dir/$name.csr"
openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
  -days "$days" -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
chmod 644 "$dir/ca.crt" "$dir/$name.crt"
