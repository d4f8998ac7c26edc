#!/usr/bin/env bash
# How fast is the link between the GPUs? Conveyor's transport_bench over NCCL against PyTorch's NCCL
# send/recv at the same sizes, after bench/gpu/build.sh; two GPUs or more. Under a minute a part, but
# pairs (six pairs of four GPUs): about 3 minutes. NCCL_* variables set on the command line reach every
# run (NCCL_PROTO=LL bench/gpu/link.sh nccl).
#
#   bench/gpu/link.sh            the default: nccl and sendrecv
#   bench/gpu/link.sh nccl       transport_bench over NCCL at 1 MB and 64 MB, 5 rounds      $out/transport.txt
#   bench/gpu/link.sh sendrecv   PyTorch's NCCL send/recv at 1 MB and 64 MB, as transport_bench measures
#                                                                                         $out/sendrecv.csv
#   bench/gpu/link.sh sockets    transport_bench over NCCL through sockets only (NCCL_P2P_DISABLE,
#                                NCCL_SHM_DISABLE), as between two hosts              $out/transport-sockets.txt
#   bench/gpu/link.sh pairs      NCCL and the gRPC stream between every pair of four GPUs, 1, 16 and 64 MB
#                                                                                 $out/transport-0-1.csv, ...
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

nccl_frames() {  # nccl_frames FILE [VAR=VALUE...]: transport_bench over NCCL at 1 MB and 64 MB under VARs
  local file=$1
  shift
  env "$@" timeout 60 "$bin/transport_bench" --transports nccl --sizes 1M,64M --rounds 5 --nccl-ctas 0 | tee "$file"
}

part_nccl() {
  nccl_frames "$out/transport.txt"
}

part_sockets() {
  nccl_frames "$out/transport-sockets.txt" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
}

part_sendrecv() {
  timeout 120 python3 bench/transport/torch_sendrecv.py --sizes 1M,64M --rounds 5 --csv "$out/sendrecv.csv"
}

part_pairs() {
  local pair
  for pair in 0,1 0,2 0,3 1,2 1,3 2,3; do
    timeout 90 "$bin/transport_bench" --gpus "$pair" --transports grpc,nccl --sizes 1M,16M,64M \
      --rounds 3 --nccl-ctas 0 --csv "$out/transport-${pair/,/-}.csv" | tail -6 | sed "s/^/$pair: /"
  done
}

part_default() { part_nccl; part_sendrecv; }

run_parts default "$@"
