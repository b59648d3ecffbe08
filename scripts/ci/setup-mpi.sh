#!/usr/bin/env bash
# Installs Open MPI's launcher and library (Debian's openmpi-bin: mpirun, libmpi.so.40) for the
# data-parallel training test (`mpirun -np 2 napkin train --shard ddp`). napkin's build needs
# no MPI: the library is opened at run time (core/src/distributed/open_mpi.rs). Safe to run
# repeatedly; does nothing when mpirun is already there.
set -euo pipefail

if command -v mpirun >/dev/null && ldconfig -p 2>/dev/null | grep -q 'libmpi\.so\.40'; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing openmpi-bin (Open MPI, for the data-parallel training test)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin >/dev/null
    exit 0
fi
cat >&2 <<MSG
error: Open MPI (mpirun and libmpi.so.40) was not found and could not be installed.
  Debian/Ubuntu: sudo apt-get install openmpi-bin
  Fedora:        sudo dnf install openmpi
MSG
exit 1
